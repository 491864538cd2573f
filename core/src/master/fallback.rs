//! Demoted copies as a last resort.
//!
//! A grant makes every current copy that did not take its new version stale at once,
//! though nothing may ever have been written under that version: the calls to them only
//! timed out (a slow disk, a cut link). If the copies that did take it are then found
//! corrupt, the chunk would be gone with every write acknowledged before the grant,
//! while intact copies of those writes sit on the demoted servers, ordered deleted.
//!
//! So the master remembers, at each grant, the copies it demotes: servers it listed as
//! current at the old version that did not take the new one. Each was a replica of the
//! old version's lease (or copied while none was out), so it holds every write
//! acknowledged up to that version. While the chunk is below its goal such a copy is
//! kept, not ordered deleted, when its server reports it at that very version (a copy
//! at any other version is judged as before: one that took the new version late is
//! retired, and missed its writes). Once the goal is met again they are deleted.
//!
//! When every current copy is known destroyed, the master revives the newest demoted
//! copies: a grant with no primary and no lease gives them a new version, and
//! re-replication restores the goal from them. Writes under the versions between were
//! on the destroyed copies only. "Known destroyed" is narrow on purpose, since reviving
//! while a current copy still exists somewhere would throw away its writes:
//! - a current copy left the replicas only by a corruption report (the scrubber or a
//!   reader found it bad), never by a missing report or a dead server;
//! - no server that died listed as holding the current version may come back with it;
//! - no clone of the current version has an unknown outcome (no answer, or a copy made
//!   but not listed): its target may hold the version;
//! - no lease may be out, and no demoted copy newer than those revived is on a server
//!   that is down;
//! - a revival nobody answered waits a lease period before the next try.
//!
//! All of this is learned from grants, reports and heartbeats, not logged: a master
//! that restarts forgets it, keeps nothing, and revives nothing (the chunk stays
//! missing, as it was before this rule).

use crate::types::{HashMap, HashSet, Time};

use super::Master;
use super::chunks::ServerIdx;
use crate::types::{ChunkHandle, Version};

#[derive(Debug, Default)]
pub(super) struct Fallbacks {
    /// Copies demoted by a grant: (server, the version it was current at).
    kept: HashMap<ChunkHandle, Vec<(ServerIdx, Version)>>,
    /// Chunks a current copy of which was reported corrupt, with the version then.
    lost: HashMap<ChunkHandle, Version>,
    /// Servers declared dead while listed as holding a chunk that has demoted copies,
    /// with the version they held.
    dead: HashMap<ChunkHandle, Vec<(ServerIdx, Version)>>,
    /// Chunks a clone of which, at this version, may have made a copy nobody lists.
    unsure: HashMap<ChunkHandle, Version>,
    /// Revivals under way (the version revived from), and when a failed one may retry.
    reviving: HashMap<ChunkHandle, Version>,
    retry_at: HashMap<ChunkHandle, Time>,
}

impl Fallbacks {
    pub fn forget(&mut self, h: ChunkHandle) {
        self.kept.remove(&h);
        self.lost.remove(&h);
        self.dead.remove(&h);
        self.unsure.remove(&h);
        self.reviving.remove(&h);
        self.retry_at.remove(&h);
    }

    /// `server`'s copy of `h` is gone (reported corrupt, or not reported).
    pub fn drop_kept(&mut self, h: ChunkHandle, server: ServerIdx) {
        if let Some(k) = self.kept.get_mut(&h) {
            k.retain(|&(s, _)| s != server);
            if k.is_empty() {
                self.kept.remove(&h);
            }
        }
    }

    /// `server` reported the chunks in `reported`: its kept copies of others are gone.
    pub fn unreported(&mut self, server: ServerIdx, reported: &HashSet<ChunkHandle>) {
        if self.kept.is_empty() {
            return;
        }
        self.kept.retain(|h, k| {
            if !reported.contains(h) {
                k.retain(|&(s, _)| s != server);
            }
            !k.is_empty()
        });
    }
}

impl Master {
    /// A kept copy is older than its chunk and not one of its replicas.
    pub(super) fn check_fallbacks(&self) -> Result<(), String> {
        for (&h, kept) in &self.fallbacks.kept {
            let Some(c) = self.meta.chunks.get(h) else {
                continue;
            };
            for &(s, v) in kept {
                if v >= c.version || c.replicas.contains(s) {
                    return Err(format!(
                        "chunk {h} at version {} keeps server {s}'s copy at version {v} as \
                         stale (replicas {:?})",
                        c.version,
                        c.replicas.as_slice()
                    ));
                }
            }
        }
        Ok(())
    }

    /// A grant moved `h` from `old` to a new version without `demoted`, which were
    /// current at `old`, nor the servers that died listed with `h` at `old`.
    pub(super) fn demoted(&mut self, h: ChunkHandle, old: Version, demoted: &[ServerIdx]) {
        let mut demoted = demoted.to_vec();
        for &(s, v) in self.fallbacks.dead.get(&h).into_iter().flatten() {
            if v == old && !self.servers.is_alive(s) && !demoted.contains(&s) {
                demoted.push(s);
            }
        }
        if demoted.is_empty() || old == 0 {
            return;
        }
        let kept = self.fallbacks.kept.entry(h).or_default();
        for s in demoted {
            kept.retain(|&(k, _)| k != s);
            kept.push((s, old));
        }
    }

    /// A heartbeat reports `server`'s copy of `h` at `version`, older than the chunk's.
    /// Kept (true) if it is a demoted copy at the version it was demoted from and the
    /// chunk is below its goal; otherwise it is to be deleted.
    pub(super) fn keep_stale(
        &mut self,
        h: ChunkHandle,
        server: ServerIdx,
        version: Version,
    ) -> bool {
        let Some(c) = self.meta.chunks.get(h) else {
            return false;
        };
        if self.live_replicas(c).len() >= usize::from(c.goal) {
            // Whole again: no fallback is needed any more.
            self.fallbacks.forget(h);
            return false;
        }
        self.fallbacks
            .kept
            .get(&h)
            .is_some_and(|k| k.contains(&(server, version)))
    }

    /// `server`'s copy of `h`, listed as current, was reported corrupt.
    pub(super) fn current_copy_corrupt(&mut self, h: ChunkHandle) {
        if let Some(c) = self.meta.chunks.get(h) {
            self.fallbacks.lost.insert(h, c.version);
        }
    }

    /// `server` was declared dead listed as holding `h`: it may come back with it, so
    /// `h` is not revived from older copies meanwhile; and if a grant moves `h` on
    /// while it is down, its copy is demoted. (Kept until the server is back or the
    /// chunk at its goal again: bounded by the chunks below their goal.)
    pub(super) fn holder_died(&mut self, h: ChunkHandle, server: ServerIdx) {
        if let Some(c) = self.meta.chunks.get(h) {
            let v = c.version;
            let dead = self.fallbacks.dead.entry(h).or_default();
            dead.retain(|&(s, _)| s != server);
            dead.push((server, v));
        }
    }

    /// `server` is heard from again: what it holds, its heartbeat says.
    pub(super) fn server_back(&mut self, server: ServerIdx) {
        if self.fallbacks.dead.is_empty() {
            return;
        }
        self.fallbacks.dead.retain(|_, v| {
            v.retain(|&(s, _)| s != server);
            !v.is_empty()
        });
    }

    /// Whether some chunk has every current copy reported corrupt and demoted copies to
    /// revive it from: the master has repair work pending (a revival may wait for a
    /// lease to run out). For harnesses deciding when a cluster has healed.
    pub fn awaiting_revival(&self) -> bool {
        self.fallbacks.lost.iter().any(|(&h, &v)| {
            self.meta.chunks.get(h).is_some_and(|c| {
                c.version == v
                    && self.live_replicas(c).is_empty()
                    && self.fallbacks.kept.get(&h).is_some_and(|k| !k.is_empty())
            })
        })
    }

    /// A clone of `h` at `version` may have left a copy the master does not list.
    pub(super) fn clone_unsure(&mut self, h: ChunkHandle, version: Version) {
        self.fallbacks.unsure.insert(h, version);
    }

    /// Revives `h` from its newest demoted copies if every current copy is known
    /// destroyed (see the module comment). Returns whether a revival started.
    pub(super) fn revive(&mut self, h: ChunkHandle) -> bool {
        let Some(c) = self.meta.chunks.get(h) else {
            self.fallbacks.forget(h);
            return false;
        };
        let current = c.version;
        let f = &self.fallbacks;
        if current == 0
            || !self.live_replicas(c).is_empty()
            || f.lost.get(&h) != Some(&current)
            || f.unsure.get(&h) == Some(&current)
            || f.retry_at.get(&h).is_some_and(|&t| self.now < t)
            || self.lease_may_be_out(h)
        {
            return false;
        }
        let alive = |s: ServerIdx| self.servers.is_alive(s);
        let may_come_back = f
            .dead
            .get(&h)
            .is_some_and(|d| d.iter().any(|&(s, v)| v == current && !alive(s)));
        if may_come_back {
            return false;
        }
        let kept: Vec<(ServerIdx, Version)> = f
            .kept
            .get(&h)
            .into_iter()
            .flatten()
            .copied()
            .filter(|&(s, v)| v < current && !self.gc.pending_deletes.is_ordered(s, h))
            .collect();
        // The newest demoted copies, wherever they are: if none of those is on a live
        // server, wait for one rather than revive older data.
        let Some(best) = kept.iter().map(|&(_, v)| v).max() else {
            return false;
        };
        let targets: Vec<ServerIdx> = kept
            .iter()
            .filter(|&&(s, v)| v == best && alive(s))
            .map(|&(s, _)| s)
            .collect();
        if targets.is_empty() {
            return false;
        }
        let version = (current + 1).max(self.meta.reserved.get(&h).map_or(0, |r| r + 1));
        tracing::warn!(
            chunk = h,
            lost = current,
            from = best,
            to = version,
            copies = targets.len(),
            "every current copy reported corrupt: reviving the newest demoted copies"
        );
        // No lease: nothing is written under the revival's version, so a copy that takes
        // it late is as good as one that answered.
        if self
            .begin_grant(h, version, targets, None, false, 0)
            .is_err()
        {
            return false;
        }
        self.fallbacks.reviving.insert(h, best);
        true
    }

    /// A revival's answers are in: the copies that took the version, still kept at the
    /// version revived from and alive, are current.
    pub(super) fn finish_revival(&mut self, h: ChunkHandle, version: Version, acked: &[ServerIdx]) {
        self.repl.check(h);
        let from = self.fallbacks.reviving.remove(&h);
        let good: Vec<ServerIdx> = acked
            .iter()
            .copied()
            .filter(|&s| {
                self.servers.is_alive(s)
                    && from.is_some_and(|v| {
                        self.fallbacks
                            .kept
                            .get(&h)
                            .is_some_and(|k| k.contains(&(s, v)))
                    })
            })
            .collect();
        if good.is_empty() {
            // Nobody took it (a copy refused, or calls timed out): try again later, not
            // at every tick. A copy that takes the version late is adopted by its
            // report (the version is reserved).
            let at = self.now + self.cfg.lease_duration;
            self.fallbacks.retry_at.insert(h, at);
            return;
        }
        if let Err(e) = self.log(crate::pb::log_record::Op::SetVersion(
            crate::pb::SetVersionOp { handle: h, version },
        )) {
            panic!("logging revived version {version} of chunk {h} failed: {e}");
        }
        self.fallbacks.lost.remove(&h);
        self.fallbacks.retry_at.remove(&h);
        for &s in &good {
            self.add_replica(h, s);
        }
    }
}
