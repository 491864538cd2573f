//! A simulated metadata store (`MetaStore`) with the contract's durability: batches are
//! atomic; `sync` makes every earlier batch durable; a crash keeps the durable state plus
//! some prefix of the unsynced batches (whole batches, in order) and loses the rest.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tessera_core::error::StoreError;
use tessera_core::runtime::MetaStore;

type Batch = Vec<(Vec<u8>, Option<Bytes>)>;

#[derive(Default)]
struct State {
    durable: BTreeMap<Vec<u8>, Bytes>,
    unsynced: Vec<Batch>,
    written: BTreeMap<Vec<u8>, Bytes>,
    /// Added to every sync (a slow disk): a crash then finds batches in flight often.
    delay: std::time::Duration,
}

fn apply(map: &mut BTreeMap<Vec<u8>, Bytes>, batch: &Batch) {
    for (k, v) in batch {
        match v {
            Some(v) => map.insert(k.clone(), v.clone()),
            None => map.remove(k),
        };
    }
}

#[derive(Clone, Default)]
pub struct SimMetaStore(Arc<Mutex<State>>);

impl SimMetaStore {
    /// Makes every sync take `d` longer (a slow disk under the log).
    pub fn set_delay(&self, d: std::time::Duration) {
        self.0.lock().expect("meta lock").delay = d;
    }

    /// The durable values under `prefix` (for checks of what a driver wrote).
    pub fn durable_under(&self, prefix: &[u8]) -> Vec<(Vec<u8>, Bytes)> {
        tessera_core::runtime::scan_prefix(&self.0.lock().expect("meta lock").durable, prefix)
    }

    /// Nothing written and kept (a new node's store, or one whose every write was lost).
    pub fn is_empty(&self) -> bool {
        self.0.lock().expect("meta lock").written.is_empty()
    }

    /// The disk replaced: nothing written is left.
    pub fn wipe(&self) {
        let mut s = self.0.lock().expect("meta lock");
        s.durable.clear();
        s.unsynced.clear();
        s.written.clear();
    }

    /// Power loss: `keep` of the unsynced batches survive (the caller picks, by seed).
    /// Returns how many batches were lost.
    pub fn crash(&self, keep: impl FnOnce(usize) -> usize) -> usize {
        let mut s = self.0.lock().expect("meta lock");
        let k = keep(s.unsynced.len()).min(s.unsynced.len());
        let lost = s.unsynced.len() - k;
        let kept: Vec<Batch> = s.unsynced.drain(..).take(k).collect();
        for b in &kept {
            let mut durable = std::mem::take(&mut s.durable);
            apply(&mut durable, b);
            s.durable = durable;
        }
        s.written = s.durable.clone();
        lost
    }
}

/// A durable value damaged by [`SimMetaStore::damage`]: its key, what it held, what it
/// holds now, and how it was damaged.
#[derive(Clone, Debug)]
pub struct Damage {
    pub key: Vec<u8>,
    pub was: Bytes,
    pub now: Bytes,
    pub what: String,
}

impl SimMetaStore {
    /// Damages one durable value as a failing disk under the store might: a bit
    /// flipped (three times in four) or the value cut short. `r` picks which and where.
    /// Nothing if the store holds nothing.
    pub fn damage(&self, r: u64) -> Option<Damage> {
        let mut s = self.0.lock().expect("meta lock");
        let n = s.durable.len() as u64;
        let (key, was) = s
            .durable
            .iter()
            .nth((r % n.max(1)) as usize)
            .map(|(k, v)| (k.clone(), v.clone()))?;
        let at = (r >> 20) as usize;
        let mut now = was.to_vec();
        let what = if (r >> 16).is_multiple_of(4) && !now.is_empty() {
            now.truncate(at % now.len());
            format!("cut to {} of {} bytes", now.len(), was.len())
        } else if now.is_empty() {
            return None;
        } else {
            let bit = at % (now.len() * 8);
            now[bit / 8] ^= 1 << (bit % 8);
            format!("bit {bit} of {} bytes flipped", was.len())
        };
        let now = Bytes::from(now);
        s.durable.insert(key.clone(), now.clone());
        s.written.insert(key.clone(), now.clone());
        Some(Damage {
            key,
            was,
            now,
            what,
        })
    }

    /// Puts back what `d` damaged (an operator restoring the log), if the value is still
    /// the damaged one.
    pub fn restore(&self, d: &Damage) {
        let mut s = self.0.lock().expect("meta lock");
        if s.durable.get(&d.key) == Some(&d.now) {
            s.durable.insert(d.key.clone(), d.was.clone());
            s.written.insert(d.key.clone(), d.was.clone());
        }
    }
}

impl MetaStore for SimMetaStore {
    fn write(&mut self, batch: Batch) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut s = self.0.lock().expect("meta lock");
        apply(&mut s.written, &batch);
        s.unsynced.push(batch);
        crate::disk::after(std::time::Duration::ZERO, Ok(()))
    }

    fn sync(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send {
        // The batches become durable when the sync completes, after its pause (half the
        // syncs take up to 2 ms, as a flush does): a crash during the pause loses what a
        // real store may lose before fsync returns.
        let this = self.0.clone();
        let r: u64 = madsim::rand::random();
        let flush = if r.is_multiple_of(2) {
            std::time::Duration::from_micros((r >> 8) % 2_000)
        } else {
            std::time::Duration::ZERO
        };
        let delay = self.0.lock().expect("meta lock").delay;
        async move {
            crate::disk::after(delay + flush, ()).await;
            let mut s = this.lock().expect("meta lock");
            s.durable = s.written.clone();
            s.unsynced.clear();
            Ok(())
        }
    }

    fn scan(
        &mut self,
        prefix: &[u8],
    ) -> impl Future<Output = Result<Vec<(Vec<u8>, Bytes)>, StoreError>> + Send {
        let out =
            tessera_core::runtime::scan_prefix(&self.0.lock().expect("meta lock").written, prefix);
        async { Ok(out) }
    }
}
