//! Checkpoints built beside the replica, not inside its event loop.
//!
//! A checkpoint of the whole namespace takes time in proportion to its size, and a
//! replica that built one inside `handle` answered nothing meanwhile: no request, no
//! heartbeat, no vote. So the replica keeps a second copy of its committed state, the
//! checkpointer's, fed the same committed entries in the same order. When a checkpoint
//! is due, the replica asks the checkpointer for one as of the entry it has just
//! applied; a driver runs the checkpointer on a task of its own, and hands back what it
//! built as `Input::Checkpointed`. The replica then drops the log behind it
//! (`LogStore::compact`); entries it applied meanwhile stay in the log.
//!
//! The cost is a second copy of the state in memory and a second application of each
//! record (QFS's log compactor pays the same, as a separate process).
//!
//! A new leader's master starts from a copy of the committed state, made here too
//! (`Feed::Copy`): a copy takes time in proportion to the namespace, and a leader that
//! stopped to make one sent no heartbeat meanwhile: past an election timeout (a copy
//! of 300,000 files took 0.4 s here) its followers could elect another, which would
//! stop to copy in turn.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use prost::Message as _;
use raft::eraftpb as rp;

use super::shadow::Shadow;
use crate::driver::master::seal_pieces;
use crate::master::{MasterConfig, Meta};
use crate::pb;
use crate::types::LogSeq;

/// What the replica tells its checkpointer, in the order it happens.
#[derive(Clone, Debug)]
pub enum Feed {
    /// Committed entry `index` was applied: a normal entry's data (its records, or empty),
    /// or `None` for an entry that holds no records (a membership change).
    Apply { index: u64, data: Option<Bytes> },
    /// The state is now the one this snapshot holds (taken from a leader).
    Reset(rp::Snapshot),
    /// Build a checkpoint of the state through entry `index`, with the group's
    /// membership as of that entry.
    Take(Ask),
    /// Copy the state through entry `index`, for a new leader's master.
    Copy { index: u64 },
}

/// What the checkpointer built.
#[derive(Debug)]
pub enum Built {
    Checkpoint(Taken),
    Copy(Handover),
}

/// A copy of the committed state through entry `index` (record `seq`) for a new
/// leader's master, and the checkpoint it was made through (observers see what a master
/// started from). Handed over once: an input that carries it may be cloned (a driver
/// shows each input to its observers), and the clones share it; the replica takes it.
#[derive(Clone)]
pub struct Handover {
    pub index: u64,
    pub seq: LogSeq,
    copy: Arc<Mutex<Option<(pb::Checkpoint, Meta)>>>,
}

impl Handover {
    pub fn new(index: u64, seq: LogSeq, checkpoint: pb::Checkpoint, meta: Meta) -> Handover {
        Handover {
            index,
            seq,
            copy: Arc::new(Mutex::new(Some((checkpoint, meta)))),
        }
    }

    /// The checkpoint and the copy, the first time only.
    pub fn take(&self) -> Option<(pb::Checkpoint, Meta)> {
        // A poisoned lock means a panic elsewhere while it was held: the copy is whole
        // (nothing changes it in place), so it is still good to take.
        let mut g = self.copy.lock().unwrap_or_else(|e| e.into_inner());
        g.take()
    }
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Handover {{ index: {}, seq: {} }}", self.index, self.seq)
    }
}

/// A checkpoint asked for: the entry it is as of, and the group's membership then.
#[derive(Clone, Debug)]
pub struct Ask {
    pub index: u64,
    pub conf: rp::ConfState,
    pub members: std::collections::BTreeMap<u64, String>,
    pub retired: Vec<u64>,
}

/// A checkpoint built: what it was asked as, the last master record it holds, and the
/// sealed `Checkpoint`.
#[derive(Clone, Debug)]
pub struct Taken {
    pub ask: Ask,
    pub seq: LogSeq,
    pub data: Bytes,
}

pub struct Checkpointer {
    shadow: Shadow,
    cfg: MasterConfig,
}

impl Checkpointer {
    /// Starts on the state `snap` holds: the replica's own starting point.
    pub fn new(snap: &rp::Snapshot, cfg: &MasterConfig) -> Result<Checkpointer, String> {
        Ok(Checkpointer {
            shadow: Shadow::from_snapshot(snap, cfg)?,
            cfg: cfg.clone(),
        })
    }

    /// The last entry applied.
    pub fn applied(&self) -> u64 {
        self.shadow.applied
    }

    /// Takes one feed; a `Take` gives the checkpoint built, a `Copy` the copy.
    ///
    /// The replica checked every entry and snapshot before it applied them itself, and
    /// feeds them in its own order, so one that does not apply here is a bug: it panics
    /// as the replica would have.
    pub fn feed(&mut self, f: Feed) -> Option<Built> {
        match f {
            Feed::Apply { index, data } => {
                if index <= self.shadow.applied {
                    return None;
                }
                match data {
                    Some(d) if !d.is_empty() => {
                        let batch = pb::RaftRecords::decode(d)
                            .expect("the replica decoded this entry before feeding it");
                        self.shadow.apply(index, &batch);
                    }
                    _ => self.shadow.applied = index,
                }
                None
            }
            Feed::Reset(snap) => {
                self.shadow = Shadow::from_snapshot(&snap, &self.cfg)
                    .expect("the replica took this snapshot before feeding it");
                None
            }
            Feed::Take(ask) => {
                assert_eq!(
                    ask.index, self.shadow.applied,
                    "a checkpoint asked as of entry {} of a state through entry {}",
                    ask.index, self.shadow.applied
                );
                // Encoded piece by piece (`Meta::checkpoint_pieces`): the checkpoint is
                // never whole as a message beside its encoding.
                let members = pb::Checkpoint {
                    group_members: ask.members.clone().into_iter().collect(),
                    group_retired: ask.retired.clone(),
                    ..Default::default()
                };
                let pieces = self.shadow.meta.checkpoint_pieces(self.shadow.seq);
                Some(Built::Checkpoint(Taken {
                    seq: self.shadow.seq,
                    data: seal_pieces(pieces.chain(std::iter::once(members))),
                    ask,
                }))
            }
            Feed::Copy { index } => {
                assert_eq!(
                    index, self.shadow.applied,
                    "a copy asked as of entry {index} of a state through entry {}",
                    self.shadow.applied
                );
                let (cp, meta) = self.shadow.copy_meta(&self.cfg);
                Some(Built::Copy(Handover::new(index, self.shadow.seq, cp, meta)))
            }
        }
    }
}
