//! Re-replication (GFS §4.3): when a chunk has fewer live, up-to-date replicas than its
//! goal, the master tells a new server to clone it from a live one. Chunks with the
//! fewest replicas go first. Clone traffic is throttled: each server takes part in at
//! most `clones_per_server` clones at once, the cluster in `clones_cluster`.

use crate::types::HashMap;
use std::collections::BTreeSet;

use super::chunks::ServerIdx;
use super::{CallCtx, Master};
use crate::pb::{self, chunk_request::Req as CReq};
use crate::types::{ChunkHandle, Time, Version};

#[derive(Debug, Default)]
pub(super) struct Replication {
    /// Chunks whose replica count changed and may be below goal.
    suspects: BTreeSet<ChunkHandle>,
    /// Clones running, per chunk (their targets).
    pub(super) in_flight: HashMap<ChunkHandle, Vec<ServerIdx>>,
    running: u32,
    /// No clones before this time (see `Master::from_meta`).
    not_before: Time,
    /// Chunks with more live copies than their goal, found by the last queue pass.
    excess: Vec<ChunkHandle>,
    /// Chunks with no live copy at all, found by the last queue pass (`fallback.rs`).
    orphaned: Vec<ChunkHandle>,
}

impl Replication {
    pub fn starting(not_before: Time) -> Replication {
        Replication {
            not_before,
            ..Default::default()
        }
    }

    pub fn check(&mut self, h: ChunkHandle) {
        self.suspects.insert(h);
    }

    /// Clones running now.
    pub fn running(&self) -> u32 {
        self.running
    }

    pub fn forget(&mut self, h: ChunkHandle) {
        self.suspects.remove(&h);
    }
}

/// A chunk that needs copies, in repair order.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Need {
    pub live: usize,
    pub missing: std::cmp::Reverse<usize>,
    pub handle: ChunkHandle,
}

impl Master {
    pub(super) fn repl_not_before(&self) -> Time {
        self.repl.not_before
    }

    /// See `Leases::may_be_out`.
    pub(super) fn lease_may_be_out(&self, h: ChunkHandle) -> bool {
        self.leases.may_be_out(h, self.now, self.cfg.max_clock_skew)
    }

    /// Chunks below their goal, most urgent first: fewest live replicas, then furthest
    /// from goal. Chunks with no live replica are left out (nothing to copy from).
    pub fn replication_queue(&mut self) -> Vec<Need> {
        let mut needs = Vec::new();
        let mut settled = Vec::new();
        let mut whole = Vec::new();
        for &h in &self.repl.suspects {
            let Some(c) = self.meta.chunks.get(h) else {
                settled.push(h);
                continue;
            };
            if c.version == 0 {
                settled.push(h);
                continue;
            }
            let live = c
                .replicas
                .as_slice()
                .iter()
                .filter(|&&s| self.servers.is_alive(s))
                .count();
            let coming = self.repl.in_flight.get(&h).map_or(0, Vec::len);
            let goal = c.goal as usize;
            if live + coming >= goal {
                if coming == 0 && live > goal {
                    // Trimmed by `schedule_clones`, but never under a lease: the lease
                    // holder forwards writes to the copies it was given.
                    if !self.lease_may_be_out(h) {
                        self.repl.excess.push(h);
                    }
                } else if coming == 0 {
                    settled.push(h);
                }
                // Whole again: demoted copies are no longer worth keeping.
                if live >= goal {
                    whole.push(h);
                }
                continue;
            }
            // A chunk under a lease that may still be valid is not cloned: writes could
            // reach its replicas but not the copy, at the same version. Once the lease is
            // over, a write needs a new grant, which bumps the version, and a copy made at
            // the old version is refused when it completes.
            if live == 0 && coming == 0 {
                self.repl.orphaned.push(h);
            }
            if live == 0 || self.lease_may_be_out(h) {
                continue;
            }
            needs.push(Need {
                live,
                missing: std::cmp::Reverse(goal - live - coming),
                handle: h,
            });
        }
        for h in settled {
            self.repl.suspects.remove(&h);
        }
        for h in whole {
            self.whole_again(h);
        }
        needs.sort();
        needs
    }

    /// Before a new lease on a chunk below its goal: start a clone if one can run and
    /// none is, and say whether the grant must wait for it. Repair goes first: under a
    /// steady writer every grant bumps the version and voids the clone in flight, and the
    /// chunk would live on one copy indefinitely.
    pub(super) fn repair_before_grant(&mut self, h: ChunkHandle) -> bool {
        if self.repl.in_flight.contains_key(&h) {
            return true;
        }
        let Some(c) = self.meta.chunks.get(h) else {
            return false;
        };
        let holders: Vec<ServerIdx> = c.replicas.as_slice().to_vec();
        let live: Vec<ServerIdx> = holders
            .iter()
            .copied()
            .filter(|&s| self.servers.is_alive(s))
            .collect();
        if c.version == 0
            || live.is_empty()
            || live.len() >= usize::from(c.goal)
            || (self.repl.running + self.intended_clones(None) >= self.cfg.clones_cluster
                && !self.fallbacks.intends(h))
        {
            return false;
        }
        let version = c.version;
        let per_server = self.cfg.clones_per_server;
        let Some(source) = live
            .iter()
            .copied()
            .filter(|&s| self.servers.get(s).clones_in_flight < per_server)
            .min_by_key(|&s| (self.servers.get(s).clones_in_flight, s))
        else {
            return false;
        };
        if self.intended_clone(h, version, source).is_some() {
            return true;
        }
        let mut exclude = holders;
        exclude.extend(self.servers.iter().map(|(s, _)| s).filter(|&s| {
            self.servers.get(s).clones_in_flight >= per_server
                || self.gc.pending_deletes.is_ordered(s, h)
        }));
        let Some(target) = self.clone_target(h, &exclude) else {
            return false;
        };
        self.clone_to(h, version, source, target);
        true
    }

    pub(super) fn schedule_clones(&mut self) {
        // The queue is worked out every tick, so chunks at their goal leave the suspect
        // set even while clones may not start yet.
        self.repl.excess.clear();
        self.repl.orphaned.clear();
        let queue = self.replication_queue();
        if self.now < self.repl.not_before {
            return;
        }
        self.trim_excess();
        for h in std::mem::take(&mut self.repl.orphaned) {
            self.revive(h);
        }
        let per_server = self.cfg.clones_per_server;
        for need in queue {
            // A clone waiting for its holder record counts, and goes ahead when due.
            if self.repl.running + self.intended_clones(None) >= self.cfg.clones_cluster
                && !self.fallbacks.intends(need.handle)
            {
                continue;
            }
            let h = need.handle;
            if self.mending.contains(h) {
                continue; // its one copy serves nothing until mended
            }
            let c = self.meta.chunks.get(h).expect("queued chunks exist");
            let version = c.version;
            let holders: Vec<ServerIdx> = c.replicas.as_slice().to_vec();
            let source = holders
                .iter()
                .copied()
                .filter(|&s| {
                    self.servers.is_alive(s) && self.servers.get(s).clones_in_flight < per_server
                })
                .min_by_key(|&s| (self.servers.get(s).clones_in_flight, s));
            let Some(source) = source else { continue };
            if self.intended_clone(h, version, source).is_some() {
                continue;
            }
            let mut exclude = holders;
            exclude.extend(self.repl.in_flight.get(&h).into_iter().flatten());
            // Targets busy with clones (or about to be) are excluded too.
            let busy: Vec<ServerIdx> = self
                .servers
                .live()
                .filter(|&(i, s)| s.clones_in_flight + self.intended_clones(Some(i)) >= per_server)
                .map(|(i, _)| i)
                .collect();
            exclude.extend(busy);
            // Nor a server about to delete its copy of this chunk (or whose copy is
            // retired: `clone_target`).
            let ordered: Vec<ServerIdx> = self
                .servers
                .iter()
                .map(|(s, _)| s)
                .filter(|&s| self.gc.pending_deletes.is_ordered(s, h))
                .collect();
            exclude.extend(ordered);
            let Some(target) = self.clone_target(h, &exclude) else {
                continue;
            };
            self.clone_to(h, version, source, target);
        }
    }

    /// Removes copies beyond each chunk's goal (a server came back after its chunks were
    /// copied elsewhere, or a clone finished late): the copy whose loss keeps the most
    /// racks, then the one on the fullest server. The master forgets the copy at once and
    /// the server deletes it when its next heartbeat reports it. At most `clones_cluster`
    /// chunks a tick, so a returning server is not flooded with deletes.
    fn trim_excess(&mut self) {
        let excess = std::mem::take(&mut self.repl.excess);
        for h in excess.into_iter().take(self.cfg.clones_cluster as usize) {
            let Some(c) = self.meta.chunks.get(h) else {
                continue;
            };
            assert!(
                !self.lease_may_be_out(h),
                "trimming chunk {h} while a lease on it may be valid"
            );
            let version = c.version;
            let live = self.live_replicas(c);
            let mut extra = live.len().saturating_sub(usize::from(c.goal));
            let mut keep = live;
            while extra > 0 {
                let racks_without = |s: ServerIdx| {
                    keep.iter()
                        .filter(|&&o| o != s)
                        .map(|&o| self.servers.get(o).rack.as_str())
                        .collect::<crate::types::HashSet<_>>()
                        .len()
                };
                let Some(&victim) = keep.iter().max_by(|&&a, &&b| {
                    racks_without(a)
                        .cmp(&racks_without(b))
                        .then(
                            self.servers
                                .get(a)
                                .utilization()
                                .total_cmp(&self.servers.get(b).utilization()),
                        )
                        .then(a.cmp(&b))
                }) else {
                    break;
                };
                tracing::info!(chunk = h, server = %self.servers.get(victim).addr, "removing a copy beyond the goal");
                keep.retain(|&s| s != victim);
                self.drop_replica(h, victim);
                self.gc.pending_deletes.order(victim, h, version, self.now);
                extra -= 1;
            }
        }
    }

    pub(super) fn start_clone(
        &mut self,
        h: ChunkHandle,
        version: Version,
        source: ServerIdx,
        target: ServerIdx,
    ) {
        assert!(
            !self.lease_may_be_out(h),
            "cloning chunk {h} while a lease on it may be valid"
        );
        // The order would reach the server after the clone and delete the new copy.
        assert!(
            !self.gc.pending_deletes.is_ordered(target, h),
            "cloning chunk {h} to {}, which is ordered to delete its copy",
            self.servers.get(target).addr
        );
        tracing::info!(chunk = h, from = %self.servers.get(source).addr, to = %self.servers.get(target).addr, "re-replicating");
        self.fallbacks.forget_absence(h, target);
        self.servers.get_mut(source).clones_in_flight += 1;
        self.servers.get_mut(target).clones_in_flight += 1;
        self.servers
            .note_creation(target, self.now, self.cfg.creation_window);
        self.repl.in_flight.entry(h).or_default().push(target);
        self.repl.running += 1;
        let source_capability =
            self.peer_read_capability(h, version, source, target, self.cfg.clone_timeout);
        let req = CReq::Clone(pb::CloneChunkRequest {
            epoch: self.epoch,
            handle: h,
            version,
            source: self.servers.get(source).addr.clone(),
            cluster_id: self.meta.cluster_id,
            source_capability,
        });
        self.call(
            target,
            CallCtx::Clone {
                handle: h,
                source,
                target,
                version,
            },
            req,
        );
    }

    pub(super) fn on_clone_result(
        &mut self,
        h: ChunkHandle,
        source: ServerIdx,
        target: ServerIdx,
        version: Version,
        ok: bool,
        answered: bool,
    ) {
        self.fallbacks.forget_absence(h, target);
        self.servers.get_mut(source).clones_in_flight -= 1;
        self.servers.get_mut(target).clones_in_flight -= 1;
        self.repl.running -= 1;
        if let Some(v) = self.repl.in_flight.get_mut(&h) {
            v.retain(|&t| t != target);
            if v.is_empty() {
                self.repl.in_flight.remove(&h);
            }
        }
        self.repl.check(h);
        let current = self.meta.chunks.get(h).map(|c| c.version);
        if ok && current == Some(version) && !self.lease_may_be_out(h) {
            // The clone replaced whatever copy the target held: an order to delete that
            // one (a late report that it was corrupt) would delete this one.
            self.gc.pending_deletes.cancel(target, h);
            self.clone_made(h, target);
            // On a server counted dead meanwhile the copy is kept, not listed: its report
            // when the server is back lists it (as any copy of the current version).
            // Ordering it deleted could throw away the one copy left to mend or revive
            // the chunk from.
            if self.servers.is_alive(target) {
                self.add_replica(h, target);
            }
        } else if ok {
            // The copy is of an old version, or of a chunk now gone: collect it.
            self.gc.pending_deletes.order(target, h, version, self.now);
        }
        // A clone logged as making a holder (`fallback.rs`) that answered it failed made
        // none; one with no answer may have.
        self.clone_ended(h, target, answered && !ok);
    }
}
