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

use bytes::Bytes;
use prost::Message as _;
use raft::eraftpb as rp;

use super::shadow::Shadow;
use crate::driver::master::seal;
use crate::master::MasterConfig;
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

    /// Takes one feed; a `Take` gives the checkpoint built.
    ///
    /// The replica checked every entry and snapshot before it applied them itself, and
    /// feeds them in its own order, so one that does not apply here is a bug: it panics
    /// as the replica would have.
    pub fn feed(&mut self, f: Feed) -> Option<Taken> {
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
                let mut cp = self.shadow.meta.checkpoint(self.shadow.seq);
                cp.group_members = ask.members.clone().into_iter().collect();
                cp.group_retired = ask.retired.clone();
                Some(Taken {
                    seq: self.shadow.seq,
                    data: seal(&cp),
                    ask,
                })
            }
        }
    }
}
