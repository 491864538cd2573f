//! Group commit of the master's op log, sans-IO: the records of every step since the
//! last sync (and a checkpoint, if one was built meanwhile) go to the store as one
//! batch, one sync covers them all, and only then does the master hear `LogSynced`. The
//! real driver and the in-process fuzzing world (`tessera-sim`'s `world`) build their
//! batches here, so both commit the same way.

use bytes::Bytes;

use super::checkpoint::Sealed;
use super::master::{LOG_PREFIX, log_key, seal};
use crate::master::Effects;
use crate::types::LogSeq;

/// What the next sync writes.
#[derive(Debug, Default)]
pub struct LogBatch {
    writes: Vec<(Vec<u8>, Option<Bytes>)>,
    last: Option<LogSeq>,
    checkpoint: Option<Sealed>,
}

/// What a batch must know of the store it goes to: the lowest log record left in it,
/// and how many parts its checkpoint lies in (`driver::checkpoint`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub low_seq: LogSeq,
    pub checkpoint_parts: u32,
}

/// A batch ready for the store: its writes in order, the last record in it (the
/// master hears `LogSynced` through it once the batch is durable), and the checkpoint
/// it writes, if any.
pub struct Commit {
    pub writes: Vec<(Vec<u8>, Option<Bytes>)>,
    pub through: Option<LogSeq>,
    pub checkpoint: Option<Sealed>,
}

impl LogBatch {
    /// Takes a step's log records into the batch, sealed (they stay in `effects`, for a
    /// checkpointer to take; the rest is for the caller to dispatch).
    pub fn add(&mut self, effects: &Effects) {
        for (seq, rec) in &effects.log {
            self.writes.push((log_key(*seq), Some(seal(rec))));
            self.last = Some(*seq);
        }
    }

    /// Takes a checkpoint built beside the master (`master::checkpointer`) into the
    /// batch: every record it covers was logged before, in this batch or an earlier one.
    pub fn checkpoint(&mut self, cp: Sealed) {
        if let Some(old) = &self.checkpoint {
            assert!(
                old.through_seq < cp.through_seq,
                "checkpoints built out of order"
            );
        }
        self.checkpoint = Some(cp);
    }

    /// Deletes records a checkpoint already covers (see `driver::master::Durable::stale`).
    pub fn delete(&mut self, seqs: impl IntoIterator<Item = LogSeq>) {
        self.writes
            .extend(seqs.into_iter().map(|seq| (log_key(seq), None)));
    }

    /// How many writes the batch holds so far.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.checkpoint.is_none()
    }

    /// The batch to write and sync. A checkpoint and the removal of the records it
    /// covers (and of the earlier checkpoint's parts it does not overwrite) form one
    /// atomic batch; records it covers that were about to be written are not written.
    /// `held` is brought up to what the store holds once the batch is written.
    pub fn commit(self, held: &mut Held) -> Commit {
        let LogBatch {
            mut writes,
            last,
            checkpoint,
        } = self;
        if let Some(cp) = &checkpoint {
            let through = cp.through_seq;
            let covered = log_key(through);
            writes.retain(|(k, _)| !(k.starts_with(LOG_PREFIX) && k.as_slice() <= &covered[..]));
            cp.writes(&mut held.checkpoint_parts, &mut writes);
            writes.extend((held.low_seq..=through).map(|seq| (log_key(seq), None)));
            held.low_seq = through + 1;
        }
        Commit {
            writes,
            through: last,
            checkpoint,
        }
    }
}
