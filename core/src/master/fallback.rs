//! Stale copies as a last resort.
//!
//! A grant makes every copy that did not take its new version stale at once, though
//! nothing may ever have been written under that version: the calls to the other copies
//! only timed out (a slow disk, a cut link). If the copies that did take it are then
//! lost (a flipped bit found by the scrubber, a disk that comes back empty), the chunk
//! would be gone with every write acknowledged before the grant, while intact copies of
//! those writes sit on the stale servers, ordered deleted.
//!
//! So a stale copy is not ordered deleted while its chunk has fewer current copies than
//! its goal: it is kept, as a fallback, and deleted once the chunk is back at its goal.
//! When every current copy is known destroyed (reported corrupt, missing from its own
//! server's report, or on a replaced disk) and none may still be on a server that is
//! merely down, the master revives the newest kept copies: it grants them a new version
//! without a lease (`begin_grant` with no primary), and they become the chunk's current
//! copies, from which re-replication restores the goal. Writes made under the versions
//! between are lost, but they were on the destroyed copies only: nothing else held them.
//!
//! What the master knows here is learned from heartbeats and reports, not logged: a
//! master that restarts after the current copies were destroyed has no evidence of it,
//! and does not revive (the chunk stays unavailable, as it was before this rule).

use crate::types::HashMap;

use super::Master;
use super::chunks::ServerIdx;
use crate::types::{ChunkHandle, Version};

#[derive(Debug, Default)]
pub(super) struct Fallbacks {
    /// Stale copies kept because their chunk was below its goal: (server, version).
    kept: HashMap<ChunkHandle, Vec<(ServerIdx, Version)>>,
    /// Chunks a current copy of which was seen destroyed, with the version then current.
    lost: HashMap<ChunkHandle, Version>,
    /// Servers that were declared dead holding a chunk, with the version they held.
    dead: HashMap<ChunkHandle, Vec<(ServerIdx, Version)>>,
}

impl Fallbacks {
    pub fn forget(&mut self, h: ChunkHandle) {
        self.kept.remove(&h);
        self.lost.remove(&h);
        self.dead.remove(&h);
    }

    /// `server`'s kept copy of `h` is gone (reported corrupt).
    pub fn drop_kept(&mut self, h: ChunkHandle, server: ServerIdx) {
        if let Some(k) = self.kept.get_mut(&h) {
            k.retain(|&(s, _)| s != server);
            if k.is_empty() {
                self.kept.remove(&h);
            }
        }
    }

    /// `server` reported the chunks in `reported`: its kept copies of others are gone.
    pub fn unreported(&mut self, server: ServerIdx, reported: &crate::types::HashSet<ChunkHandle>) {
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

    /// A heartbeat reports `server`'s copy of `h` at `version`, older than the chunk's.
    /// Kept (true) while the chunk is below its goal; otherwise it is to be deleted.
    pub(super) fn keep_stale(
        &mut self,
        h: ChunkHandle,
        server: ServerIdx,
        version: Version,
    ) -> bool {
        let Some(c) = self.meta.chunks.get(h) else {
            return false;
        };
        let below_goal = self.live_replicas(c).len() < usize::from(c.goal);
        let kept = self.fallbacks.kept.entry(h).or_default();
        kept.retain(|&(s, _)| s != server);
        if below_goal {
            kept.push((server, version));
        } else if kept.is_empty() {
            self.fallbacks.kept.remove(&h);
        }
        below_goal
    }

    /// `server`'s current copy of `h` is destroyed (reported corrupt, missing from the
    /// server's own report, or on a replaced disk).
    pub(super) fn current_copy_destroyed(&mut self, h: ChunkHandle) {
        if let Some(c) = self.meta.chunks.get(h) {
            self.fallbacks.lost.insert(h, c.version);
        }
    }

    /// `server` was declared dead holding `h` at its current version: it may come back
    /// with it, so `h` is not revived from older copies meanwhile.
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
        self.fallbacks.dead.retain(|_, v| {
            v.retain(|&(s, _)| s != server);
            !v.is_empty()
        });
    }

    /// Revives `h` from its newest kept stale copies if every current copy is known
    /// destroyed (see the module comment). Returns whether a revival started.
    pub(super) fn revive(&mut self, h: ChunkHandle) -> bool {
        let Some(c) = self.meta.chunks.get(h) else {
            self.fallbacks.forget(h);
            return false;
        };
        let current = c.version;
        if current == 0
            || !self.live_replicas(c).is_empty()
            || self.fallbacks.lost.get(&h) != Some(&current)
            || self.lease_may_be_out(h)
        {
            return false;
        }
        let may_come_back = self.fallbacks.dead.get(&h).is_some_and(|d| {
            d.iter()
                .any(|&(s, v)| v == current && !self.servers.is_alive(s))
        });
        if may_come_back {
            return false;
        }
        let usable: Vec<(ServerIdx, Version)> = self
            .fallbacks
            .kept
            .get(&h)
            .into_iter()
            .flatten()
            .copied()
            .filter(|&(s, v)| {
                v < current && self.servers.is_alive(s) && !self.gc.pending_deletes.is_ordered(s, h)
            })
            .collect();
        let Some(best) = usable.iter().map(|&(_, v)| v).max() else {
            return false;
        };
        let targets: Vec<ServerIdx> = usable
            .iter()
            .filter(|&&(_, v)| v == best)
            .map(|&(s, _)| s)
            .collect();
        let version = (current + 1).max(self.meta.reserved.get(&h).map_or(0, |r| r + 1));
        tracing::warn!(
            chunk = h,
            lost = current,
            from = best,
            to = version,
            copies = targets.len(),
            "every current copy destroyed: reviving the newest stale copies"
        );
        // No lease: nothing is written under the revival's version, so a copy that takes
        // it late is as good as one that answered.
        self.begin_grant(h, version, targets, None, false, 0)
            .is_ok()
    }

    /// A revival's answers are in: the copies that took the version are current.
    pub(super) fn finish_revival(&mut self, h: ChunkHandle, version: Version, acked: &[ServerIdx]) {
        self.repl.check(h);
        if acked.is_empty() {
            return;
        }
        if let Err(e) = self.log(crate::pb::log_record::Op::SetVersion(
            crate::pb::SetVersionOp { handle: h, version },
        )) {
            panic!("logging revived version {version} of chunk {h} failed: {e}");
        }
        self.fallbacks.lost.remove(&h);
        if let Some(k) = self.fallbacks.kept.get_mut(&h) {
            k.retain(|(s, _)| !acked.contains(s));
        }
        for &s in acked {
            self.add_replica(h, s);
        }
    }
}
