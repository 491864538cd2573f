//! A replica's committed state: the namespace and chunk table as of the last log entry
//! the group committed, built by the same `Meta::apply` as everywhere else. A follower
//! (a shadow master, GFS §5.1.3) keeps only this; a leader keeps it beside its master,
//! whose state runs ahead by what it has proposed and the group has not yet committed.
//! A new leader's master, and every snapshot, is made from it.

use super::store;
use crate::master::{MasterConfig, Meta};
use crate::pb;
use crate::types::LogSeq;

pub struct Shadow {
    pub meta: Meta,
    /// The last master log record applied.
    pub seq: LogSeq,
    /// The last raft entry applied.
    pub applied: u64,
}

impl Shadow {
    /// The state a snapshot holds (a fresh group's: empty).
    pub fn from_snapshot(
        snap: &raft::eraftpb::Snapshot,
        cfg: &MasterConfig,
    ) -> Result<Shadow, String> {
        let applied = snap.get_metadata().index;
        match store::checkpoint_of(snap)? {
            None => Ok(Shadow {
                meta: Meta::new(cfg.chunk_size),
                seq: 0,
                applied,
            }),
            Some(cp) => Ok(Shadow {
                meta: Meta::restore(&cp, cfg.chunk_size).map_err(|e| e.to_string())?,
                seq: cp.through_seq,
                applied,
            }),
        }
    }

    /// Applies the records of committed entry `index`. They follow the last one applied,
    /// and they apply: the leader applied each before proposing it, and every replica's
    /// `Meta::apply` is the same function of the same records.
    pub fn apply(&mut self, index: u64, batch: &pb::RaftRecords) {
        assert!(
            index > self.applied,
            "entry {index} applied after entry {}",
            self.applied
        );
        assert_eq!(
            batch.first_seq,
            self.seq + 1,
            "committed entry {index} starts at record {} after record {}",
            batch.first_seq,
            self.seq
        );
        for rec in &batch.records {
            if let Err(e) = self.meta.apply(rec) {
                panic!(
                    "committed record {} (entry {index}) does not apply: {e}",
                    self.seq + 1
                );
            }
            self.seq += 1;
        }
        self.applied = index;
    }

    /// A copy of the state, for a new leader's master, made through a checkpoint (the
    /// same code that restores one from disk): the checkpoint, and the copy.
    pub fn copy_meta(&self, cfg: &MasterConfig) -> (pb::Checkpoint, Meta) {
        let cp = self.meta.checkpoint(self.seq);
        let meta =
            Meta::restore(&cp, cfg.chunk_size).expect("a checkpoint of a live state restores");
        (cp, meta)
    }
}
