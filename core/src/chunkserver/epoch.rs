//! The master's term: a chunkserver follows only the newest leader of a master group.
//!
//! Every master→chunkserver message (heartbeat reply, `SetVersion`, `Clone`,
//! `RevokeLease`) carries the sender's term as its group's leader (0: a master that runs
//! alone). A server keeps the highest term it has seen, durably in its identity record
//! (`ChunkMeta::master_epoch` of handle 0), and refuses anything from an older term: a
//! deposed leader that is still running, and does not know it yet, can change no
//! version, start no clone, revoke no lease and delete no copy.
//!
//! A newer term is stored before anything from it is acted on: were the server to act
//! and then crash before the term was on disk, the deposed leader could give it orders
//! again after the restart. Until the write is done, calls of the new term are refused
//! as unavailable (the master tries again later) and a heartbeat reply's orders are
//! ignored (the next reply brings them again).
//!
//! A term is believed only so far: one more than [`MAX_EPOCH_JUMP`] past the stored
//! one is refused as forged or damaged (a real group moves its term by one an election,
//! a master alone by one a start). Believed, a term that high would fence the real
//! master out for good: its orders would all be "deposed" from then on, through
//! restarts. And a term has one leader: the first master replica whose order of the
//! stored term arrives is that term's, and orders of the same term from another
//! replica are refused (two replicas leading one term is a forgery or a broken group).
//!
//! Once a newer term is stored, the server gives up every lease it holds: a deposed
//! leader granted them. Its heartbeats carry the term stored, so a new leader that has
//! heard one of its own term from every server that may hold a lease knows no old lease
//! is left, and grants again without waiting out a lease period.

use super::{Chunkserver, IDENTITY_HANDLE, Pending, StoreOp};
use crate::auth::Caller;
use crate::error::FsError;
use crate::master::MAX_EPOCH_JUMP;
use crate::pb;

impl Chunkserver {
    /// The highest master term this server has stored.
    pub fn master_epoch(&self) -> u64 {
        self.epoch
    }

    /// Why a message from a master of term `theirs` must not be acted on (yet), if it
    /// must not. A newer term starts being stored. `from` is the replica that sent an
    /// order (`None`: a heartbeat reply, which came from the leader the runtime found).
    pub(super) fn stale_master(&mut self, theirs: u64, from: Option<&Caller>) -> Option<FsError> {
        let known = self.epoch.max(self.storing_epoch);
        if theirs > known.saturating_add(MAX_EPOCH_JUMP) {
            tracing::error!(
                server = %self.cfg.address,
                ours = self.epoch,
                theirs,
                ?from,
                "refusing a master term far past any this server has seen (forged, or damaged)"
            );
            return Some(FsError::InvalidArgument(format!(
                "master term {theirs} is more than {MAX_EPOCH_JUMP} past {known}, the newest \
                 {} has seen: refused as forged or damaged",
                self.cfg.address
            )));
        }
        if theirs < self.epoch {
            tracing::warn!(
                server = %self.cfg.address,
                ours = self.epoch,
                theirs,
                "refusing a deposed master leader"
            );
            return Some(FsError::NotLeader(String::new()));
        }
        if theirs > self.epoch {
            self.learn_epoch(theirs);
            return Some(FsError::Unavailable(format!(
                "{} is storing master term {theirs}",
                self.cfg.address
            )));
        }
        if let Some(&Caller::Master { replica }) = from {
            match self.term_leader {
                Some((term, leader)) if term == theirs && leader != replica => {
                    self.refused += 1;
                    tracing::error!(
                        server = %self.cfg.address,
                        term,
                        leader,
                        replica,
                        "refusing an order from a second leader of one master term"
                    );
                    return Some(FsError::PermissionDenied(format!(
                        "master term {term} is led by replica {leader}: replica {replica} \
                         may give no orders in it"
                    )));
                }
                Some((term, _)) if term == theirs => {}
                _ => self.term_leader = Some((theirs, replica)),
            }
        }
        None
    }

    /// The identity record as it stands, with `epoch`.
    pub(super) fn identity(&self, cluster_id: u64, epoch: u64) -> pb::ChunkMeta {
        pb::ChunkMeta {
            handle: IDENTITY_HANDLE,
            server_id: self.server_id,
            cluster_id,
            master_epoch: epoch,
            ..Default::default()
        }
    }

    fn learn_epoch(&mut self, theirs: u64) {
        if self.storing_epoch >= theirs {
            return;
        }
        tracing::info!(server = %self.cfg.address, epoch = theirs, "a newer master term (a new group leader, or a restarted master)");
        self.storing_epoch = theirs;
        let meta = self.identity(self.cluster_id, theirs);
        self.store(
            Pending::Epoch { epoch: theirs },
            StoreOp::WriteMeta {
                handle: IDENTITY_HANDLE,
                meta,
            },
        );
    }

    pub(super) fn epoch_stored(&mut self, epoch: u64, ok: bool) {
        if ok {
            if epoch > self.epoch {
                // Every lease held now came from a deposed leader (the new one's grants
                // wait for this write): they end here, so that a heartbeat carrying the
                // new term shows the new leader no older lease is left on this server,
                // and it need not wait out a whole lease period (`master/leases.rs`).
                let mut dropped = 0;
                for c in self.chunks.values_mut() {
                    dropped += usize::from(c.lease_until.take().is_some());
                }
                if dropped > 0 {
                    tracing::info!(server = %self.cfg.address, epoch, dropped, "leases of a deposed master leader given up");
                }
                self.epoch = epoch;
                // Said at once: the master grants this server nothing until it has
                // heard the term from it, nor ends its quiet period before every holder
                // of an older lease has said so.
                self.heartbeat();
            }
        } else if self.storing_epoch == epoch {
            // The next message of that term tries again.
            self.storing_epoch = self.epoch;
        }
    }
}
