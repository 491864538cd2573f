//! A simulated chunkserver disk (`ChunkStore`). It keeps what was written apart from
//! what is durable and injects the disk faults of the fault model:
//! - `crash`: unsynced writes are lost, and the last one may be torn (a prefix of it
//!   reaches the durable data). The metadata is all-or-nothing, as the contract says.
//! - `flip_bit`: silent corruption of stored bytes.
//! - a capacity: a write that does not fit fails with `NoSpace` and changes nothing.
//! - a delay per operation (a slow disk).
//!
//! The disk lives outside the node, so a killed and restarted chunkserver finds it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tessera_core::error::StoreError;
use tessera_core::pb;
use tessera_core::runtime::ChunkStore;
use tessera_core::types::ChunkHandle;

#[derive(Clone, Default, Debug)]
struct Stored {
    data: Vec<u8>,
    meta: Option<pb::ChunkMeta>,
}

#[derive(Default, Debug)]
struct State {
    written: HashMap<ChunkHandle, Stored>,
    durable: HashMap<ChunkHandle, Stored>,
    /// The last unsynced data write per chunk, which a crash may tear.
    last_write: HashMap<ChunkHandle, (u64, Bytes)>,
    capacity: u64,
    delay: Duration,
    flips: u64,
}

#[derive(Clone, Debug)]
pub struct SimDisk(Arc<Mutex<State>>);

impl SimDisk {
    pub fn new(capacity: u64) -> SimDisk {
        SimDisk(Arc::new(Mutex::new(State {
            capacity,
            ..Default::default()
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().expect("disk lock")
    }

    pub fn set_delay(&self, d: Duration) {
        self.state().delay = d;
    }

    pub fn set_capacity(&self, bytes: u64) {
        self.state().capacity = bytes;
    }

    pub fn used(&self) -> u64 {
        self.state()
            .written
            .values()
            .map(|c| c.data.len() as u64)
            .sum()
    }

    /// Power loss: what was not synced is gone, except that the last unsynced write of a
    /// chunk may have partly reached the platter (`tear` picks how much, per chunk).
    pub fn crash(&self, mut tear: impl FnMut() -> Option<f64>) {
        let mut s = self.state();
        let mut written = s.durable.clone();
        let last: Vec<_> = s.last_write.drain().collect();
        for (h, (off, data)) in last {
            if let (Some(frac), Some(c)) = (tear(), written.get_mut(&h)) {
                let n = ((data.len() as f64) * frac) as usize;
                let end = off as usize + n;
                if c.data.len() < end {
                    c.data.resize(end, 0);
                }
                c.data[off as usize..end].copy_from_slice(&data[..n]);
                tracing::debug!(
                    chunk = h,
                    offset = off,
                    torn = n,
                    of = data.len(),
                    "crash tore a write"
                );
                // A torn write reached the platter: it is durable now, for better or worse.
            }
        }
        s.durable = written.clone();
        s.written = written;
    }

    /// Loses everything on the disk (a replaced drive).
    pub fn wipe(&self) {
        let mut s = self.state();
        s.written.clear();
        s.durable.clear();
        s.last_write.clear();
    }

    /// Flips one bit of a stored chunk (durably). Returns false if there is no such byte.
    pub fn flip_bit(&self, h: ChunkHandle, offset: usize, bit: u8) -> bool {
        let mut guard = self.state();
        let s = &mut *guard;
        let mut hit = false;
        for map in [&mut s.written, &mut s.durable] {
            if let Some(c) = map.get_mut(&h)
                && offset < c.data.len()
            {
                c.data[offset] ^= 1 << (bit % 8);
                hit = true;
            }
        }
        if hit {
            s.flips += 1;
        }
        hit
    }

    /// Chunks on this disk with their data length (written view).
    pub fn chunks(&self) -> Vec<(ChunkHandle, usize)> {
        let mut v: Vec<_> = self
            .state()
            .written
            .iter()
            .map(|(h, c)| (*h, c.data.len()))
            .collect();
        v.sort_unstable();
        v
    }

    fn delay(&self) -> Duration {
        self.state().delay
    }
}

async fn after<T>(d: Duration, v: T) -> T {
    if !d.is_zero() {
        madsim::time::sleep(d).await;
    }
    v
}

impl ChunkStore for SimDisk {
    fn read(
        &mut self,
        h: ChunkHandle,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Bytes, StoreError>> + Send {
        let r = match self.state().written.get(&h) {
            None => Err(StoreError::NotFound),
            Some(c) => {
                let s = (offset as usize).min(c.data.len());
                let e = (offset.saturating_add(len) as usize).min(c.data.len());
                Ok(Bytes::copy_from_slice(&c.data[s..e]))
            }
        };
        after(self.delay(), r)
    }

    fn write(
        &mut self,
        h: ChunkHandle,
        offset: u64,
        data: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let d = self.delay();
        let mut s = self.state();
        let old = s.written.get(&h).map_or(0, |c| c.data.len() as u64);
        let end = offset + data.len() as u64;
        let used: u64 = s.written.values().map(|c| c.data.len() as u64).sum();
        let r = if used - old + end.max(old) > s.capacity {
            Err(StoreError::NoSpace)
        } else {
            let c = s.written.entry(h).or_default();
            if (c.data.len() as u64) < end {
                c.data.resize(end as usize, 0);
            }
            c.data[offset as usize..end as usize].copy_from_slice(&data);
            s.last_write.insert(h, (offset, data));
            Ok(())
        };
        drop(s);
        after(d, r)
    }

    fn write_meta(
        &mut self,
        meta: pb::ChunkMeta,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let h = meta.handle;
        self.state().written.entry(h).or_default().meta = Some(meta);
        after(self.delay(), Ok(()))
    }

    fn replace(
        &mut self,
        meta: pb::ChunkMeta,
        data: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let d = self.delay();
        let mut s = self.state();
        let h = meta.handle;
        let old = s.written.get(&h).map_or(0, |c| c.data.len() as u64);
        let used: u64 = s.written.values().map(|c| c.data.len() as u64).sum();
        let r = if used - old + data.len() as u64 > s.capacity {
            Err(StoreError::NoSpace)
        } else {
            // All-or-nothing across a crash: made durable at once (a rename, on real disks).
            let stored = Stored {
                data: data.to_vec(),
                meta: Some(meta),
            };
            s.written.insert(h, stored.clone());
            s.durable.insert(h, stored);
            s.last_write.remove(&h);
            Ok(())
        };
        drop(s);
        after(d, r)
    }

    fn sync(&mut self, h: ChunkHandle) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut s = self.state();
        match s.written.get(&h).cloned() {
            Some(c) => s.durable.insert(h, c),
            None => s.durable.remove(&h),
        };
        s.last_write.remove(&h);
        drop(s);
        after(self.delay(), Ok(()))
    }

    fn delete(&mut self, h: ChunkHandle) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut s = self.state();
        // Durable at once, as the contract says (an unlink and a directory sync).
        s.written.remove(&h);
        s.durable.remove(&h);
        s.last_write.remove(&h);
        drop(s);
        after(self.delay(), Ok(()))
    }

    fn load(&mut self) -> impl Future<Output = Result<Vec<pb::ChunkMeta>, StoreError>> + Send {
        let mut metas: Vec<_> = self
            .state()
            .written
            .values()
            .filter_map(|c| c.meta.clone())
            .collect();
        metas.sort_by_key(|m| m.handle);
        async { Ok(metas) }
    }
}
