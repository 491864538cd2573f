//! Group commit of the master's op log, sans-IO: the records (and a checkpoint) of every
//! step since the last sync go to the store as one batch, one sync covers them all, and
//! only then does the master hear `LogSynced`. The real driver and the in-process
//! fuzzing world (`tessera-sim`'s `world`) build their batches here, so both commit the
//! same way.

use bytes::Bytes;

use super::master::{CHECKPOINT_KEY, LOG_PREFIX, log_key, seal};
use crate::master::Effects;
use crate::pb;
use crate::types::LogSeq;

/// What the next sync writes.
#[derive(Debug, Default)]
pub struct LogBatch {
    writes: Vec<(Vec<u8>, Option<Bytes>)>,
    last: Option<LogSeq>,
    checkpoint: Option<pb::Checkpoint>,
}

/// A batch ready for the store: its writes in order, and the last record in it (the
/// master hears `LogSynced` through it once the batch is durable).
pub struct Commit {
    pub writes: Vec<(Vec<u8>, Option<Bytes>)>,
    pub through: Option<LogSeq>,
}

impl LogBatch {
    /// Takes a step's log records and checkpoint into the batch (the rest of `effects`
    /// is for the caller to dispatch).
    pub fn add(&mut self, effects: &mut Effects) {
        for (seq, rec) in effects.log.drain(..) {
            self.writes.push((log_key(seq), Some(seal(&rec))));
            self.last = Some(seq);
        }
        if let Some(cp) = effects.checkpoint.take() {
            self.checkpoint = Some(cp);
        }
    }

    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.checkpoint.is_none()
    }

    /// The batch to write and sync. A checkpoint and the removal of the records it
    /// covers form one atomic batch; records it covers that were about to be written are
    /// not written. `low_seq` is the lowest record left in the store, moved past the
    /// checkpoint.
    pub fn commit(self, low_seq: &mut LogSeq) -> Commit {
        let LogBatch {
            mut writes,
            last,
            checkpoint,
        } = self;
        if let Some(cp) = checkpoint {
            let through = cp.through_seq;
            let covered = log_key(through);
            writes.retain(|(k, _)| !(k.starts_with(LOG_PREFIX) && k.as_slice() <= &covered[..]));
            writes.push((CHECKPOINT_KEY.to_vec(), Some(seal(&cp))));
            writes.extend((*low_seq..=through).map(|seq| (log_key(seq), None)));
            *low_seq = through + 1;
        }
        Commit {
            writes,
            through: last,
        }
    }
}
