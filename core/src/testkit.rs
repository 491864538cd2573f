//! An in-memory world for this crate's tests, benchmarks and fuzz targets: a
//! single-threaded executor with virtual time, a network of mailboxes, and stores that
//! keep written and durable state apart. It is deterministic (one thread, timers in order,
//! randomness from a seed) but it injects no faults beyond a node going away and a crash
//! dropping unsynced state; the simulator (`sim/`) is where faults live.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::{mpsc, oneshot};
use futures::executor::LocalPool;
use futures::future::{BoxFuture, Either, select};
use futures::task::SpawnExt;

use crate::error::{RpcError, StoreError};
use crate::pb;
use crate::rng::Rng;
use crate::runtime::{ChunkStore, Incoming, MetaStore, Parts, Runtime, Transport};
use crate::types::{ChunkHandle, Time};

struct World {
    now: Time,
    timers: BTreeMap<(Time, u64), Waker>,
    next_timer: u64,
    spawned: Vec<BoxFuture<'static, ()>>,
    rng: Rng,
}

/// The runtime handle: clock, timers, spawning and randomness of the one test world.
#[derive(Clone)]
pub struct TestRuntime(Arc<Mutex<World>>);

impl TestRuntime {
    pub fn new(seed: u64) -> TestRuntime {
        TestRuntime(Arc::new(Mutex::new(World {
            now: Time(0),
            timers: BTreeMap::new(),
            next_timer: 0,
            spawned: Vec::new(),
            rng: Rng::new(seed),
        })))
    }

    fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.0.lock().expect("world lock")
    }

    /// Runs `main` and every task spawned, advancing virtual time whenever all are idle,
    /// until `main` finishes. Panics if everything is idle with no timer left (a hang).
    pub fn block_on<T: Send + 'static>(&self, main: impl Future<Output = T> + Send + 'static) -> T {
        let mut pool = LocalPool::new();
        let result = Arc::new(Mutex::new(None));
        let r2 = result.clone();
        pool.spawner()
            .spawn(async move {
                let v = main.await;
                *r2.lock().expect("result lock") = Some(v);
            })
            .expect("spawn main");
        loop {
            let spawned = std::mem::take(&mut self.world().spawned);
            for f in spawned {
                pool.spawner().spawn(f).expect("spawn");
            }
            pool.run_until_stalled();
            if let Some(v) = result.lock().expect("result lock").take() {
                return v;
            }
            if !self.world().spawned.is_empty() {
                continue;
            }
            let next = self.world().timers.pop_first();
            match next {
                Some(((t, _), waker)) => {
                    let mut w = self.world();
                    w.now = w.now.max(t);
                    drop(w);
                    waker.wake();
                }
                None => panic!("every task is idle and no timer is set: the test hangs"),
            }
        }
    }
}

struct Sleep {
    rt: TestRuntime,
    until: Time,
}

impl Future for Sleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut w = self.rt.world();
        if w.now >= self.until {
            return Poll::Ready(());
        }
        let id = w.next_timer;
        w.next_timer += 1;
        w.timers.insert((self.until, id), cx.waker().clone());
        Poll::Pending
    }
}

impl Runtime for TestRuntime {
    fn now(&self) -> Time {
        self.world().now
    }

    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send {
        let until = self.now() + d;
        Sleep {
            rt: self.clone(),
            until,
        }
    }

    fn spawn<F>(&self, f: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.world().spawned.push(Box::pin(f));
    }

    fn random_u64(&self) -> u64 {
        self.world().rng.next_u64()
    }
}

/// A network of mailboxes: each `listen` registers an address; a call to an address with
/// no listener (or one taken down by `kill`) fails as unreachable. Every message takes
/// `latency` of virtual time.
#[derive(Clone)]
pub struct MemNet {
    rt: TestRuntime,
    nodes: Arc<Mutex<HashMap<String, mpsc::Sender<Incoming>>>>,
    latency: Duration,
}

impl MemNet {
    pub fn new(rt: TestRuntime) -> MemNet {
        MemNet {
            rt,
            nodes: Arc::default(),
            latency: Duration::from_millis(1),
        }
    }

    /// Stops delivering to `addr`: calls to it fail as unreachable.
    pub fn kill(&self, addr: &str) {
        self.nodes.lock().expect("net lock").remove(addr);
    }
}

impl Transport for MemNet {
    fn call_parts(
        &self,
        to: &str,
        _server: crate::auth::ServerRole,
        body: Parts,
        deadline: Time,
    ) -> impl Future<Output = Result<Parts, RpcError>> + Send {
        let target = self.nodes.lock().expect("net lock").get(to).cloned();
        let (rt, latency, to) = (self.rt.clone(), self.latency, to.to_string());
        async move {
            rt.sleep(latency).await;
            let Some(mut tx) = target else {
                return Err(RpcError::Unreachable(to));
            };
            let (reply, rx) = oneshot::channel();
            let arrived = rt.now();
            if tx
                .try_send(Incoming {
                    body,
                    arrived,
                    peer: String::new(),
                    // The test kit's network authenticates nobody: every peer may ask
                    // anything, as on an insecure cluster.
                    from: crate::auth::Caller::Insecure,
                    reply,
                })
                .is_err()
            {
                return Err(RpcError::Unreachable(to));
            }
            let timeout = rt.sleep(deadline.saturating_sub(rt.now()));
            match select(rx, Box::pin(timeout)).await {
                Either::Left((Ok(b), _)) => {
                    rt.sleep(latency).await;
                    Ok(b)
                }
                Either::Left((Err(_), _)) => Err(RpcError::Unreachable(to)),
                Either::Right(_) => Err(RpcError::Deadline(to)),
            }
        }
    }

    fn listen(
        &self,
        addr: &str,
    ) -> impl Future<Output = Result<mpsc::Receiver<Incoming>, RpcError>> + Send {
        let (tx, rx) = mpsc::channel(1024);
        self.nodes
            .lock()
            .expect("net lock")
            .insert(addr.to_string(), tx);
        async move { Ok(rx) }
    }
}

#[derive(Default)]
struct Kv {
    written: BTreeMap<Vec<u8>, Bytes>,
    durable: BTreeMap<Vec<u8>, Bytes>,
    /// Syncs wait until released (a slow disk), but for `passes` more of them.
    stalled: bool,
    passes: usize,
    waiting: Vec<std::task::Waker>,
}

/// A `MetaStore` in memory. Clones share the same data, so a restarted server finds it;
/// `crash` drops what was written but not synced.
#[derive(Clone, Default)]
pub struct MemMetaStore(Arc<Mutex<Kv>>);

impl MemMetaStore {
    pub fn crash(&self) {
        let mut kv = self.0.lock().expect("kv lock");
        kv.written = kv.durable.clone();
    }

    /// From now on a sync waits until [`MemMetaStore::release`] (a disk slow to sync).
    pub fn stall(&self) {
        let mut kv = self.0.lock().expect("kv lock");
        kv.stalled = true;
        kv.passes = 0;
    }

    /// Lets the syncs finish: each makes durable what was written when it ends.
    pub fn release(&self) {
        let mut kv = self.0.lock().expect("kv lock");
        kv.stalled = false;
        for w in kv.waiting.drain(..) {
            w.wake();
        }
    }

    /// Lets one more sync finish while the others stay stalled.
    pub fn release_one(&self) {
        let mut kv = self.0.lock().expect("kv lock");
        kv.passes += 1;
        for w in kv.waiting.drain(..) {
            w.wake();
        }
    }
}

impl MetaStore for MemMetaStore {
    fn write(
        &mut self,
        batch: Vec<(Vec<u8>, Option<Bytes>)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut kv = self.0.lock().expect("kv lock");
        for (k, v) in batch {
            match v {
                Some(v) => kv.written.insert(k, v),
                None => kv.written.remove(&k),
            };
        }
        async { Ok(()) }
    }

    fn sync(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send {
        let kv = self.0.clone();
        async move {
            futures::future::poll_fn(|cx| {
                let mut kv = kv.lock().expect("kv lock");
                if kv.stalled && kv.passes == 0 {
                    if !kv.waiting.iter().any(|w| w.will_wake(cx.waker())) {
                        kv.waiting.push(cx.waker().clone());
                    }
                    std::task::Poll::Pending
                } else {
                    if kv.stalled {
                        kv.passes -= 1;
                    }
                    kv.durable = kv.written.clone();
                    std::task::Poll::Ready(Ok(()))
                }
            })
            .await
        }
    }

    fn scan(
        &mut self,
        prefix: &[u8],
    ) -> impl Future<Output = Result<Vec<(Vec<u8>, Bytes)>, StoreError>> + Send {
        let out = crate::runtime::scan_prefix(&self.0.lock().expect("kv lock").written, prefix);
        async { Ok(out) }
    }
}

#[derive(Default, Clone)]
struct Stored {
    data: Vec<u8>,
    meta: Option<pb::ChunkMeta>,
}

#[derive(Default)]
struct Disk {
    written: HashMap<ChunkHandle, Stored>,
    durable: HashMap<ChunkHandle, Stored>,
    /// Chunks whose syncs wait (a disk stuck on them), and the syncs waiting.
    stalled: std::collections::HashSet<ChunkHandle>,
    waiting: Vec<std::task::Waker>,
}

/// A `ChunkStore` in memory, shared by clones like `MemMetaStore`; `crash` drops unsynced
/// writes, and `corrupt` flips a stored bit.
#[derive(Clone, Default)]
pub struct MemChunkStore(Arc<Mutex<Disk>>);

impl MemChunkStore {
    pub fn crash(&self) {
        let mut d = self.0.lock().expect("disk lock");
        d.written = d.durable.clone();
    }

    /// Flips one bit of chunk `h` at `offset`, in written and durable state alike.
    pub fn corrupt(&self, h: ChunkHandle, offset: usize) {
        let mut guard = self.0.lock().expect("disk lock");
        let d = &mut *guard;
        for s in [&mut d.written, &mut d.durable] {
            if let Some(c) = s.get_mut(&h)
                && offset < c.data.len()
            {
                c.data[offset] ^= 1;
            }
        }
    }

    /// The chunk's current (written) bytes.
    pub fn data(&self, h: ChunkHandle) -> Option<Vec<u8>> {
        self.0
            .lock()
            .expect("disk lock")
            .written
            .get(&h)
            .map(|c| c.data.clone())
    }

    /// From now on a sync of chunk `h` waits until [`MemChunkStore::release`] (a disk
    /// stuck on one file).
    pub fn stall(&self, h: ChunkHandle) {
        self.0.lock().expect("disk lock").stalled.insert(h);
    }

    /// Lets the syncs of chunk `h` finish.
    pub fn release(&self, h: ChunkHandle) {
        let mut d = self.0.lock().expect("disk lock");
        d.stalled.remove(&h);
        for w in d.waiting.drain(..) {
            w.wake();
        }
    }

    /// The chunks on the disk (not the server's identity record).
    pub fn handles(&self) -> Vec<ChunkHandle> {
        let mut v: Vec<_> = self
            .0
            .lock()
            .expect("disk lock")
            .written
            .keys()
            .copied()
            .filter(|&h| h != crate::chunkserver::IDENTITY_HANDLE)
            .collect();
        v.sort_unstable();
        v
    }
}

impl ChunkStore for MemChunkStore {
    fn read(
        &mut self,
        h: ChunkHandle,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Bytes, StoreError>> + Send {
        let d = self.0.lock().expect("disk lock");
        let r = match d.written.get(&h) {
            None => Err(StoreError::NotFound),
            Some(c) => {
                let s = (offset as usize).min(c.data.len());
                let e = (offset.saturating_add(len) as usize).min(c.data.len());
                Ok(Bytes::copy_from_slice(&c.data[s..e]))
            }
        };
        async { r }
    }

    fn write(
        &mut self,
        h: ChunkHandle,
        offset: u64,
        data: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut d = self.0.lock().expect("disk lock");
        let c = d.written.entry(h).or_default();
        let end = offset as usize + data.len();
        if c.data.len() < end {
            c.data.resize(end, 0);
        }
        c.data[offset as usize..end].copy_from_slice(&data);
        async { Ok(()) }
    }

    fn write_meta(
        &mut self,
        meta: pb::ChunkMeta,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut d = self.0.lock().expect("disk lock");
        let h = meta.handle;
        d.written.entry(h).or_default().meta = Some(meta);
        async { Ok(()) }
    }

    fn replace(
        &mut self,
        meta: pb::ChunkMeta,
        data: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut d = self.0.lock().expect("disk lock");
        d.written.insert(
            meta.handle,
            Stored {
                data: data.to_vec(),
                meta: Some(meta),
            },
        );
        async { Ok(()) }
    }

    fn sync(&mut self, h: ChunkHandle) -> impl Future<Output = Result<(), StoreError>> + Send {
        let disk = self.0.clone();
        async move {
            futures::future::poll_fn(|cx| {
                let mut d = disk.lock().expect("disk lock");
                if d.stalled.contains(&h) {
                    d.waiting.push(cx.waker().clone());
                    std::task::Poll::Pending
                } else {
                    std::task::Poll::Ready(())
                }
            })
            .await;
            let mut d = disk.lock().expect("disk lock");
            match d.written.get(&h).cloned() {
                Some(c) => d.durable.insert(h, c),
                None => d.durable.remove(&h),
            };
            Ok(())
        }
    }

    fn delete(&mut self, h: ChunkHandle) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut d = self.0.lock().expect("disk lock");
        d.written.remove(&h);
        d.durable.remove(&h);
        async { Ok(()) }
    }

    fn load(&mut self) -> impl Future<Output = Result<Vec<pb::ChunkMeta>, StoreError>> + Send {
        let d = self.0.lock().expect("disk lock");
        let mut metas: Vec<_> = d.written.values().filter_map(|c| c.meta.clone()).collect();
        metas.sort_by_key(|m| m.handle);
        async { Ok(metas) }
    }
}
