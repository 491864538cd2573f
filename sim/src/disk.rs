//! A simulated chunkserver disk (`ChunkStore`). It keeps what was written apart from
//! what is durable and injects the disk faults of the fault model:
//! - `crash`: unsynced writes are lost, and the last one may be torn (a prefix of it
//!   reaches the durable data). A chunk's metadata record is all-or-nothing, as the
//!   contract says, but an unsynced one may survive while the data it describes does not:
//!   on real disks every chunk's metadata shares one log, which another chunk's sync (or
//!   the store's own writeback) makes durable at any time.
//! - a pause before each operation completes, seeded and usually zero, so a crash can
//!   land between a write and its sync in every run, not only on slow disks.
//! - `flip_bit`: silent corruption of stored bytes.
//! - a capacity: a write that does not fit fails with `NoSpace` and changes nothing.
//! - a delay per operation (a slow disk), or a disk that stops answering for a while
//!   (`stick`): every operation waits until it answers again.
//! - `misdirect`: the next data writes land in another block of the same chunk, leaving
//!   the block they were meant for as it was.
//! - `flip_checksum`: silent corruption of a chunk's metadata (a stored checksum).
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

use crate::check::Shared;

use tessera_core::chunkserver::IDENTITY_HANDLE;

#[derive(Clone, Default, Debug)]
struct Stored {
    data: Vec<u8>,
    meta: Option<pb::ChunkMeta>,
}

#[derive(Default)]
struct State {
    written: HashMap<ChunkHandle, Stored>,
    durable: HashMap<ChunkHandle, Stored>,
    /// The last unsynced data write per chunk, which a crash may tear.
    last_write: HashMap<ChunkHandle, (u64, Bytes)>,
    capacity: u64,
    delay: Duration,
    flips: u64,
    /// Until when the disk answers nothing.
    stuck_until: Option<madsim::time::Instant>,
    /// Whether an operation waited on the disk being stuck since it was last stuck.
    stuck_felt: bool,
    /// Data writes still to land in the wrong place.
    misdirect: u32,
    /// Each sync takes 30 ms more (a crash is to land while a write is in flight).
    slow_flush: bool,
    /// Where the disk reports damage it did by itself (a misdirected write, a stuck
    /// disk that held an operation): the run's checks, and the server's address.
    report: Option<(Shared, String)>,
}

/// What a crash did to a disk, counted only where it changed what was stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashDamage {
    /// Writes cut short: part of the last unsynced write reached the platter.
    pub torn: u64,
    /// Chunks whose unsynced data was lost (in part or whole).
    pub lost: u64,
    /// Chunks left with an unsynced metadata record over data it does not describe.
    pub stale_meta: u64,
}

#[derive(Clone)]
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

    /// Slows every sync by 30 ms, or no longer (a crash ends it too).
    pub fn slow_flush(&self, on: bool) {
        self.state().slow_flush = on;
    }

    /// Whether a data write is on the disk and not yet synced: a crash now may tear it.
    pub fn writing(&self) -> bool {
        !self.state().last_write.is_empty()
    }

    /// Names the checks and server this disk reports the damage it does by itself to.
    pub fn report_to(&self, checks: Shared, server: String) {
        self.state().report = Some((checks, server));
    }

    /// The disk answers nothing for `d` (zero: answers again now); operations wait.
    pub fn stick(&self, d: Duration) {
        let mut s = self.state();
        s.stuck_until = (!d.is_zero()).then(|| madsim::time::Instant::now() + d);
        s.stuck_felt = false;
    }

    /// The next `n` data writes land in another block of their chunk.
    pub fn misdirect(&self, n: u32) {
        self.state().misdirect = n;
    }

    /// Flips one bit of one stored checksum of chunk `h` (durably). Returns false if the
    /// chunk has no checksums.
    pub fn flip_checksum(&self, h: ChunkHandle, pick: u64) -> bool {
        let mut guard = self.state();
        let s = &mut *guard;
        let Some(n) = s
            .durable
            .get(&h)
            .and_then(|c| c.meta.as_ref())
            .map(|m| m.checksums.len())
            .filter(|&n| n > 0)
        else {
            return false;
        };
        let (i, bit) = ((pick % n as u64) as usize, (pick >> 32) % 32);
        for map in [&mut s.written, &mut s.durable] {
            if let Some(m) = map.get_mut(&h).and_then(|c| c.meta.as_mut())
                && let Some(c) = m.checksums.get_mut(i)
            {
                *c ^= 1 << bit;
            }
        }
        s.flips += 1;
        true
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
    /// chunk may have partly reached the platter (`tear` picks how much, per chunk), and
    /// an unsynced metadata record may have been made durable by another chunk's sync
    /// (`keep_meta` says, per chunk).
    pub fn crash(
        &self,
        mut tear: impl FnMut() -> Option<f64>,
        mut keep_meta: impl FnMut() -> bool,
    ) -> CrashDamage {
        let mut damage = CrashDamage::default();
        let mut s = self.state();
        let mut after = s.durable.clone();
        let mut handles: Vec<ChunkHandle> = s.written.keys().copied().collect();
        handles.sort_unstable();
        for h in handles {
            let w = &s.written[&h];
            let d = s.durable.get(&h);
            if d.map(|d| &d.data) != Some(&w.data) {
                damage.lost += 1;
            }
            if d.and_then(|d| d.meta.as_ref()) != w.meta.as_ref() && w.meta.is_some() && keep_meta()
            {
                let c = after.entry(h).or_default();
                c.meta = w.meta.clone();
                damage.stale_meta += u64::from(c.data != w.data);
            }
        }
        let mut last: Vec<_> = s.last_write.drain().collect();
        last.sort_unstable_by_key(|(h, _)| *h);
        for (h, (off, data)) in last {
            if let (Some(frac), Some(c)) = (tear(), after.get_mut(&h)) {
                let n = ((data.len() as f64) * frac) as usize;
                let end = off as usize + n;
                if c.data.len() < end {
                    c.data.resize(end, 0);
                }
                let before = c.data[off as usize..end].to_vec();
                c.data[off as usize..end].copy_from_slice(&data[..n]);
                if before != data[..n] {
                    damage.torn += 1;
                }
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
        s.durable = after.clone();
        s.written = after;
        s.slow_flush = false;
        damage
    }

    /// Loses everything on the disk (a replaced drive).
    pub fn wipe(&self) {
        let mut s = self.state();
        s.written.clear();
        s.durable.clear();
        s.last_write.clear();
    }

    /// Loses every trace of chunk `h`, data and metadata (a file the disk or its file
    /// system lost while the server was down). Returns false if there was none.
    pub fn lose_chunk(&self, h: ChunkHandle) -> bool {
        let mut s = self.state();
        let had = s.written.remove(&h).is_some() | s.durable.remove(&h).is_some();
        s.last_write.remove(&h);
        had
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

    /// The bytes of chunk `h` that survive a crash (the durable view), if it has any.
    pub fn durable_data(&self, h: ChunkHandle) -> Option<Vec<u8>> {
        self.state().durable.get(&h).map(|c| c.data.clone())
    }

    /// Chunk `h`'s metadata record as written (the identity record for
    /// `IDENTITY_HANDLE`: cluster id, server id, master term): what an adversary learns
    /// from `admin fsck --list`, `admin report` and probing.
    pub fn meta(&self, h: ChunkHandle) -> Option<pb::ChunkMeta> {
        self.state().written.get(&h).and_then(|c| c.meta.clone())
    }

    /// The bytes of chunk `h` as written (what the server reads back, before a crash).
    pub fn written_data(&self, h: ChunkHandle) -> Option<Vec<u8>> {
        self.state().written.get(&h).map(|c| c.data.clone())
    }

    /// Chunks on this disk with their data length (written view); not the server's
    /// identity record.
    pub fn chunks(&self) -> Vec<(ChunkHandle, usize)> {
        let mut v: Vec<_> = self
            .state()
            .written
            .iter()
            .filter(|(h, _)| **h != IDENTITY_HANDLE)
            .map(|(h, c)| (*h, c.data.len()))
            .collect();
        v.sort_unstable();
        v
    }

    /// How long the next operation takes beyond the usual: the disk's delay, or what is
    /// left of its being stuck (counted once per time it is stuck, when felt).
    fn delay(&self) -> Duration {
        let mut s = self.state();
        let now = madsim::time::Instant::now();
        match s.stuck_until {
            Some(until) if until > now => {
                if !s.stuck_felt {
                    s.stuck_felt = true;
                    if let Some((checks, _)) = &s.report {
                        checks.lock().expect("checks").fault("stuck_disk", 1);
                    }
                }
                s.delay.max(until - now)
            }
            _ => s.delay,
        }
    }
}

/// Completes a storage operation after the disk's delay, plus, one time in eight, a
/// pause of up to 3 ms: long enough for a crash to land between a write and its sync,
/// rare enough to leave the run's pace alone.
pub(crate) async fn after<T>(d: Duration, v: T) -> T {
    let r: u64 = madsim::rand::random();
    let pause = if r.is_multiple_of(8) {
        Duration::from_micros((r >> 8) % 3_000)
    } else {
        Duration::ZERO
    };
    if !(d + pause).is_zero() {
        madsim::time::sleep(d + pause).await;
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
            // A misdirected write lands a few blocks before (or after) where it was
            // meant to, within what the chunk already holds; the blocks it was meant for
            // keep what they had (zeros, past the old end).
            let n = data.len() as u64;
            let shift = 512 * (1 + madsim::rand::random::<u64>() % 256);
            // Only where another intact copy remains: the budget is per chunk.
            let spare = || {
                s.report.as_ref().is_none_or(|(checks, server)| {
                    checks.lock().expect("checks").spare_copy(server, h)
                })
            };
            let target = if s.misdirect == 0 || n == 0 || h == IDENTITY_HANDLE || !spare() {
                offset
            } else if offset >= shift {
                offset - shift
            } else if offset + shift + n <= old {
                offset + shift
            } else {
                offset
            };
            let c = s.written.entry(h).or_default();
            if (c.data.len() as u64) < end {
                c.data.resize(end as usize, 0);
            }
            let (t, o) = (target as usize, offset as usize);
            // It did damage if it changed the blocks it hit, or the ones it missed
            // did not already hold its bytes.
            let landed =
                c.data[t..t + n as usize] != data[..] || c.data[o..o + n as usize] != data[..];
            c.data[t..t + n as usize].copy_from_slice(&data);
            if target != offset {
                s.misdirect -= 1;
                if landed && let Some((checks, server)) = &s.report {
                    let mut c = checks.lock().expect("checks");
                    c.fault("misdirected_write", 1);
                    c.corrupted.insert((server.clone(), h));
                }
                tracing::debug!(chunk = h, offset, target, len = n, "misdirected write");
            }
            s.last_write.insert(h, (target, data));
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
        // A sync is where a real disk spends its time (flushing its cache), so here the
        // pause comes first, often, and what was written becomes durable only at its end:
        // a crash meanwhile finds the write and its metadata in flight.
        let this = self.clone();
        let r: u64 = madsim::rand::random();
        let flush = if r.is_multiple_of(2) {
            Duration::from_micros((r >> 8) % 2_000)
        } else {
            Duration::ZERO
        };
        let flush = flush
            + if self.state().slow_flush {
                Duration::from_millis(30)
            } else {
                Duration::ZERO
            };
        async move {
            after(this.delay() + flush, ()).await;
            let mut s = this.state();
            match s.written.get(&h).cloned() {
                Some(c) => s.durable.insert(h, c),
                None => s.durable.remove(&h),
            };
            s.last_write.remove(&h);
            Ok(())
        }
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
