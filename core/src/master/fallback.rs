//! Demoted copies as a last resort.
//!
//! A grant makes every current copy that did not take its new version stale at once,
//! though nothing may ever have been written under that version: the calls to them only
//! timed out (a slow disk, a cut link). If the copies that did take it are then found
//! corrupt, the chunk would be gone with every write acknowledged before the grant,
//! while intact copies of those writes sit on the demoted servers, ordered deleted.
//!
//! So each grant logs, with the new version, the copies it demotes: servers current at
//! the old version that did not take the new one (listed, targets of the grant that did
//! not answer, or declared dead while listed at it). Each holds every write acknowledged
//! up to that version. While the chunk is below its goal such a copy is kept, not
//! ordered deleted, when its server reports it at that very version (a copy at any other
//! version is judged as before: one that took the new version late is retired, and
//! missed its writes). Once the goal is met again a record forgets them, and they are
//! deleted.
//!
//! When every copy of the current version is known destroyed, the master revives the
//! newest demoted copies: a grant with no primary and no lease gives them a new version,
//! and re-replication restores the goal from them. Writes under the versions between
//! were on the destroyed copies only. Reviving while a current copy still exists
//! somewhere would throw away its writes, so the log also keeps, for such a chunk, every
//! server that may hold its current version (its *holders*):
//! - those that took the version at its grant (or revival, or were found holding it);
//! - each clone target, logged before the clone is sent (the clone waits for the record
//!   to be durable), so a master that crashed mid-clone still counts it (a demoted copy
//!   on the target stays demoted until the clone replaces it);
//! - a holder leaves only when its copy is known destroyed: reported corrupt, or its
//!   clone answered that it failed or was never sent. Never for a missing report or a
//!   dead server: it may come back with the copy.
//!
//! A revival needs no holder left, no clone under way, no lease that may be out, and
//! the newest demoted copies on live servers (none newer on a server that is down); one
//! nobody answered waits a lease period before the next try. All of this is in the log
//! and the checkpoint, so a restarted master keeps and revives as the one before it.

use crate::pb::{self, log_record::Op};
use crate::types::{HashMap, HashSet, LogSeq, Time};

use super::Master;
use super::chunks::ServerIdx;
use crate::types::{ChunkHandle, Version};

#[derive(Debug, Default)]
pub(super) struct Fallbacks {
    /// Servers declared dead while listed as holding a chunk, with the version they held:
    /// a grant that moves the chunk on while one is down demotes its copy too. (Until
    /// the server is back or the chunk at its goal again.)
    dead: HashMap<ChunkHandle, Vec<(ServerIdx, Version)>>,
    /// Revivals under way (the version revived from), and when a failed one may retry.
    reviving: HashMap<ChunkHandle, Version>,
    retry_at: HashMap<ChunkHandle, Time>,
    /// Clones waiting for their target's holder record to be durable.
    intents: HashMap<ChunkHandle, Intent>,
    /// Clones sent to a target logged as a holder for them.
    cloning: HashSet<(ChunkHandle, ServerIdx)>,
    /// From when no clone a previous master sent can still be running: a holder that
    /// reports no copy of the current version is then known to hold none.
    settled: Time,
    /// Holders whose reports lack the chunk's current version, since when (this
    /// master's clock): only a report that arrives an order's lifetime later (a call's
    /// deadline and a late delivery) was surely sent after, so one that still lacks it
    /// shows no copy (a report can be late, or come twice). At the chunk's version then; a clone to the server starts the count
    /// afresh.
    absent: HashMap<(ChunkHandle, ServerIdx), (Time, Version)>,
}

#[derive(Clone, Copy, Debug)]
struct Intent {
    target: ServerIdx,
    version: Version,
    seq: LogSeq,
}

impl Fallbacks {
    /// A master starting; clones the one before it sent may run until `settled`.
    pub fn starting(settled: Time) -> Fallbacks {
        Fallbacks {
            settled,
            ..Default::default()
        }
    }

    /// A clone of `h` to `target` starts or ends: any absence of its copy counts afresh.
    pub fn forget_absence(&mut self, h: ChunkHandle, target: ServerIdx) {
        self.absent.remove(&(h, target));
    }

    /// Whether a clone of `h` waits for its holder record.
    pub fn intends(&self, h: ChunkHandle) -> bool {
        self.intents.contains_key(&h)
    }

    pub fn forget(&mut self, h: ChunkHandle) {
        self.dead.remove(&h);
        self.reviving.remove(&h);
        self.retry_at.remove(&h);
        self.intents.remove(&h);
        self.cloning.retain(|&(c, _)| c != h);
        self.absent.retain(|&(c, _), _| c != h);
    }
}

impl Master {
    /// Logs a change to `h`'s fallbacks; returns its sequence number.
    fn log_fallback(&mut self, h: ChunkHandle, address: String, kind: pb::Fallback) -> LogSeq {
        let op = Op::Fallback(pb::FallbackOp {
            handle: h,
            address,
            kind: kind as i32,
            version: 0,
        });
        match self.log(op) {
            Ok((seq, _)) => seq,
            Err(e) => panic!("logging a fallback record of chunk {h}: {e}"),
        }
    }

    /// For each chunk with fallbacks: its demoted copies are older than it and on none
    /// of its replicas, and every replica is a holder of its version.
    pub(super) fn check_fallbacks(&self) -> Result<(), String> {
        for (&h, f) in &self.meta.fallbacks {
            let Some(c) = self.meta.chunks.get(h) else {
                return Err(format!("fallbacks of chunk {h}, which is gone"));
            };
            if let Some((v, l)) = f
                .any_at
                .iter()
                .find(|(v, l)| l.until <= **v || l.until > c.version)
            {
                return Err(format!(
                    "chunk {h} at version {} keeps copies from {v} below {} as demoted",
                    c.version, l.until
                ));
            }
            let any = f.any_at.keys().map(|v| ("any copy", v));
            if let Some((a, v)) = f
                .demoted
                .iter()
                .map(|(a, v)| (a.as_str(), v))
                .chain(any)
                .find(|&(_, &v)| v >= c.version)
            {
                return Err(format!(
                    "chunk {h} at version {} keeps {a}'s copy at version {v} as demoted",
                    c.version
                ));
            }
            for &s in c.replicas.as_slice() {
                let a = &self.servers.get(s).addr;
                if !f.holders.contains(a) || f.demoted.contains_key(a) {
                    return Err(format!(
                        "chunk {h} lists {a} as a replica, not as a holder of version {} \
                         ({f:?})",
                        c.version
                    ));
                }
            }
        }
        Ok(())
    }

    /// What a grant (or an adopted version) moving `h` from `old` to a new version,
    /// taken by `acked`, demotes, as its `SetVersionOp` logs it: `demoted` (current at
    /// `old`, not among `acked`), the servers that died listed with it at `old`, the
    /// holders of `old` the log knows of, by name; and, while the chunk is left below
    /// its goal, every other copy at `old` its server reports later (a server down, or
    /// not heard from since the master started), but those retired at `old` (they took
    /// it late, without its writes). Logged only where the chunk has fallbacks after.
    pub(super) fn demote_at_grant(
        &self,
        h: ChunkHandle,
        old: Version,
        version: Version,
        demoted: &[ServerIdx],
        acked: &[ServerIdx],
    ) -> pb::SetVersionOp {
        let mut op = pb::SetVersionOp {
            handle: h,
            version,
            ..Default::default()
        };
        let goal = self.meta.chunks.get(h).map_or(0, |c| usize::from(c.goal));
        if old == 0 {
            return op;
        }
        let mut out: Vec<String> = demoted
            .iter()
            .map(|&s| self.servers.get(s).addr.clone())
            .collect();
        for &(s, v) in self.fallbacks.dead.get(&h).into_iter().flatten() {
            if v == old && !self.servers.is_alive(s) && !acked.contains(&s) {
                out.push(self.servers.get(s).addr.clone());
            }
        }
        let holders: Vec<String> = acked
            .iter()
            .map(|&s| self.servers.get(s).addr.clone())
            .collect();
        if let Some(f) = self.meta.fallbacks.get(&h) {
            // A holder whose copy is retired at `old` (a clone's target, its copy one that
            // took `old` late, the clone not known to have run) may hold none of `old`'s
            // writes: it keeps the level it was demoted at before, if any.
            out.extend(
                f.holders
                    .iter()
                    .filter(|a| {
                        !holders.contains(a)
                            && self.meta.retired.get(&(h, (*a).clone())) != Some(&old)
                    })
                    .cloned(),
            );
        }
        out.sort();
        out.dedup();
        if out.is_empty() && !self.meta.fallbacks.contains_key(&h) && acked.len() >= goal {
            return op;
        }
        op.demoted = out
            .into_iter()
            .map(|address| pb::DemotedCopy {
                address,
                version: old,
            })
            .collect();
        op.holders = holders;
        op.demoted_any = old;
        op.not_demoted = self
            .meta
            .retired
            .iter()
            .filter(|((c, _), v)| *c == h && **v == old)
            .map(|((_, a), _)| a.clone())
            .collect();
        op
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
            self.whole_again(h);
            return false;
        }
        let addr = self.servers.get(server).addr.clone();
        let Some(f) = self.meta.fallbacks.get(&h) else {
            return false;
        };
        // At the version it was demoted from; or later, having taken a grant late (with
        // none of that version's writes, but every one before: see `kept_late`).
        if f.demoted.get(&addr).is_some_and(|&dv| dv <= version) {
            return true;
        }
        // Of a version a grant left below the goal, or of one reserved after it and lost
        // in a crash (no write was acknowledged under it): every copy at it is demoted as
        // its server reports it, but those retired at it, and a holder's (its report may
        // be older than the version it took).
        // Logged at the level's own version: a copy at a version reserved after it holds
        // the same writes, and must not outrank the copies at it in a revival.
        let level = f
            .any_at
            .range(..=version)
            .next_back()
            .filter(|(_, l)| version < l.until && !l.not.contains(&addr))
            .map(|(&v, _)| v);
        let any = !f.holders.contains(&addr) && level.is_some();
        if let (true, Some(level)) = (any, level) {
            let op = Op::Fallback(pb::FallbackOp {
                handle: h,
                address: addr,
                kind: pb::Fallback::Demoted as i32,
                version: level,
            });
            if let Err(e) = self.log(op) {
                panic!("logging a demoted copy of chunk {h}: {e}");
            }
        }
        any
    }

    /// Whether `server`'s copy of `h`, reported at `version`, is a demoted copy that took
    /// a later grant late (retired at it): it holds every write acknowledged up to the
    /// version it was demoted from, like any demoted copy, and is kept with them while
    /// the chunk is below its goal rather than deleted as a retired copy. Its server
    /// stays a clone target (`blocks_clone`): a clone replaces the copy.
    pub(super) fn kept_late(&self, h: ChunkHandle, server: ServerIdx, version: Version) -> bool {
        let Some(c) = self.meta.chunks.get(h) else {
            return false;
        };
        let addr = &self.servers.get(server).addr;
        self.live_replicas(c).len() < usize::from(c.goal)
            && self
                .meta
                .fallbacks
                .get(&h)
                .and_then(|f| f.demoted.get(addr))
                .is_some_and(|&dv| dv < version)
    }

    /// Whether `server` may not take a clone of `h`: its copy is retired at the chunk's
    /// version and would be deleted as one, unless it is a demoted copy kept as a
    /// fallback (a clone replaces it, and lifts the retirement: `clone_made`).
    pub(super) fn blocks_clone(&self, h: ChunkHandle, server: ServerIdx) -> bool {
        self.is_retired(h, server)
            && !self
                .meta
                .fallbacks
                .get(&h)
                .is_some_and(|f| f.demoted.contains_key(&self.servers.get(server).addr))
    }

    /// A target for a clone of `h`, none of `exclude` nor a server whose copy is retired
    /// at the chunk's version; failing that, one whose retired copy is a demoted copy
    /// kept as a fallback (`kept_late`): the clone replaces it, the only way back to the
    /// goal when no other server is left (and the copy stays until the clone is done).
    pub(super) fn clone_target(
        &mut self,
        h: ChunkHandle,
        exclude: &[ServerIdx],
    ) -> Option<ServerIdx> {
        let retired: Vec<ServerIdx> = self
            .servers
            .iter()
            .map(|(s, _)| s)
            .filter(|&s| self.is_retired(h, s))
            .collect();
        let mut all = exclude.to_vec();
        all.extend(&retired);
        if let Some(&t) = self.place(1, &all).first() {
            return Some(t);
        }
        if retired.is_empty() {
            return None;
        }
        let mut all = exclude.to_vec();
        all.extend(retired.into_iter().filter(|&s| self.blocks_clone(h, s)));
        self.place(1, &all).first().copied()
    }

    /// A clone made `server`'s copy of `h` current: a retirement of its copy at this
    /// version (a copy kept as a fallback, replaced by the clone) no longer holds.
    pub(super) fn clone_made(&mut self, h: ChunkHandle, server: ServerIdx) {
        if self.is_retired(h, server) {
            self.lift_retirement(h, server);
        }
    }

    /// Lifts the retirement of `server`'s copy of `h`, in the log.
    pub(super) fn lift_retirement(&mut self, h: ChunkHandle, server: ServerIdx) {
        let version = self.meta.chunks.get(h).map_or(0, |c| c.version);
        let op = Op::RetireReplica(pb::RetireReplicaOp {
            handle: h,
            address: self.servers.get(server).addr.clone(),
            version,
            lift: true,
        });
        if let Err(e) = self.log(op) {
            panic!("lifting a retired copy of chunk {h}: {e}");
        }
        self.retired_at.remove(&(h, server));
    }

    /// `h` is at its goal again: its demoted copies are not needed any more.
    pub(super) fn whole_again(&mut self, h: ChunkHandle) {
        self.fallbacks.forget(h);
        if self.meta.fallbacks.contains_key(&h) {
            self.log_fallback(h, String::new(), pb::Fallback::Forget);
        }
    }

    /// `server`'s copy of `h` was reported corrupt: as a holder's, the current version
    /// has one copy fewer; as a demoted copy, it is gone.
    pub(super) fn copy_corrupt(&mut self, h: ChunkHandle, server: ServerIdx) {
        let addr = self.servers.get(server).addr.clone();
        let Some(f) = self.meta.fallbacks.get(&h) else {
            return;
        };
        if f.holders.contains(&addr) {
            self.log_fallback(h, addr, pb::Fallback::NotHolder);
        } else if f.demoted.contains_key(&addr) {
            self.log_fallback(h, addr, pb::Fallback::Gone);
        }
    }

    /// `server` reported the chunks in `reported`: its demoted copies of others are gone.
    pub(super) fn unreported(&mut self, server: ServerIdx, reported: &HashSet<ChunkHandle>) {
        if self.meta.fallbacks.is_empty() {
            return;
        }
        let addr = self.servers.get(server).addr.clone();
        let gone: Vec<ChunkHandle> = self
            .meta
            .fallbacks
            .iter()
            .filter(|(h, f)| !reported.contains(h) && f.demoted.contains_key(&addr))
            .map(|(&h, _)| h)
            .collect();
        for h in gone {
            self.log_fallback(h, addr.clone(), pb::Fallback::Gone);
        }
    }

    /// `server` reported its chunks (`versions`; in `changing` those it is still making
    /// durable or cloning, or has a clone of queued): a holder of a chunk's current
    /// version that reports no copy of it, with no clone to it under way (from this
    /// master, or still possibly from the one before it), in reports that arrive over an
    /// order's lifetime (so the last was sent after the first arrived: reports can be late),
    /// holds none: a clone logged before it was sent that never ran, or failed unheard,
    /// or a copy lost. Without this, such a holder would keep the chunk from a revival
    /// for good.
    pub(super) fn holders_reported(
        &mut self,
        server: ServerIdx,
        versions: &HashMap<ChunkHandle, Version>,
        changing: &[ChunkHandle],
    ) {
        if self.meta.fallbacks.is_empty() || self.now < self.fallbacks.settled {
            return;
        }
        let addr = self.servers.get(server).addr.clone();
        let lacking: Vec<ChunkHandle> = self
            .meta
            .fallbacks
            .iter()
            .filter(|(h, f)| {
                let h = **h;
                // A listed copy leaves the replicas first (corrupt, stale or unreported),
                // and none is judged while versions move.
                f.holders.contains(&addr)
                    && !self.leases.is_granting(h)
                    && self.meta.chunks.get(h).is_some_and(|c| {
                        !c.replicas.contains(server)
                            && versions.get(&h).is_none_or(|&v| v < c.version)
                    })
                    && !changing.contains(&h)
                    && !self.fallbacks.cloning.contains(&(h, server))
                    && self
                        .fallbacks
                        .intents
                        .get(&h)
                        .is_none_or(|i| i.target != server)
                    && self
                        .repl
                        .in_flight
                        .get(&h)
                        .is_none_or(|t| !t.contains(&server))
            })
            .map(|(&h, _)| h)
            .collect();
        self.fallbacks
            .absent
            .retain(|&(h, s), _| s != server || lacking.contains(&h));
        let (now, wait) = (self.now, self.cfg.order_lifetime());
        for h in lacking {
            let version = self.meta.chunks.get(h).map_or(0, |c| c.version);
            let since = self
                .fallbacks
                .absent
                .entry((h, server))
                .or_insert((now, version));
            if since.1 != version {
                *since = (now, version);
            }
            if now >= since.0 + wait {
                self.fallbacks.absent.remove(&(h, server));
                self.log_fallback(h, addr.clone(), pb::Fallback::NotHolder);
            }
        }
    }

    /// `server` is now listed as holding `h`'s current version: a holder, and its
    /// demoted copy, if it had one, is gone (replaced by the current one).
    pub(super) fn listed_holder(&mut self, h: ChunkHandle, server: ServerIdx) {
        let addr = self.servers.get(server).addr.clone();
        let Some(f) = self.meta.fallbacks.get(&h) else {
            return;
        };
        let (holder, demoted) = (f.holders.contains(&addr), f.demoted.contains_key(&addr));
        if !holder {
            self.log_fallback(h, addr.clone(), pb::Fallback::Holder);
        }
        if demoted {
            self.log_fallback(h, addr, pb::Fallback::Gone);
        }
    }

    /// `server` was declared dead listed as holding `h`: if a grant moves `h` on while it
    /// is down, its copy is demoted.
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

    /// Clones waiting for their holder record, counted with those running against the
    /// cluster's and each target's limits.
    pub(super) fn intended_clones(&self, target: Option<ServerIdx>) -> u32 {
        self.fallbacks
            .intents
            .values()
            .filter(|i| target.is_none_or(|t| i.target == t))
            .count() as u32
    }

    /// Starts a clone of `h` at `version` from `source` to `target`; or, if `h` has
    /// fallbacks and `target` is not a holder of `version` yet, logs it as one and leaves
    /// the clone to [`Master::intended_clone`] once that record is durable.
    pub(super) fn clone_to(
        &mut self,
        h: ChunkHandle,
        version: Version,
        source: ServerIdx,
        target: ServerIdx,
    ) {
        let addr = &self.servers.get(target).addr;
        if let Some(f) = self.meta.fallbacks.get(&h)
            && !f.holders.contains(addr)
        {
            let addr = addr.clone();
            let seq = self.log_fallback(h, addr, pb::Fallback::Holder);
            self.fallbacks.intents.insert(
                h,
                Intent {
                    target,
                    version,
                    seq,
                },
            );
            return;
        }
        self.start_clone(h, version, source, target);
    }

    /// A clone of `h` logged by [`Master::clone_to`]: `Some(true)` if it starts now,
    /// `Some(false)` while its record is not durable yet, `None` if there is none (any
    /// more: a target that can no longer take it is logged as holding nothing).
    pub(super) fn intended_clone(
        &mut self,
        h: ChunkHandle,
        version: Version,
        source: ServerIdx,
    ) -> Option<bool> {
        let i = *self.fallbacks.intents.get(&h)?;
        if i.seq > self.synced_seq {
            return Some(false);
        }
        self.fallbacks.intents.remove(&h);
        if i.version != version {
            // A grant since named the new version's holders.
            return None;
        }
        let t = i.target;
        let usable = self.servers.is_alive(t)
            && t != source
            && self
                .meta
                .chunks
                .get(h)
                .is_some_and(|c| !c.replicas.contains(t))
            && !self.gc.pending_deletes.is_ordered(t, h)
            && !self.blocks_clone(h, t)
            && self.servers.get(t).clones_in_flight < self.cfg.clones_per_server;
        if usable {
            self.start_clone(h, version, source, t);
            self.fallbacks.cloning.insert((h, t));
            return Some(true);
        }
        // Never sent: the target holds nothing of this version, unless it is listed
        // (found holding it since).
        let addr = self.servers.get(t).addr.clone();
        let listed = self
            .meta
            .chunks
            .get(h)
            .is_some_and(|c| c.replicas.contains(t));
        if !listed
            && self
                .meta
                .fallbacks
                .get(&h)
                .is_some_and(|f| f.holders.contains(&addr))
        {
            self.log_fallback(h, addr, pb::Fallback::NotHolder);
        }
        None
    }

    /// A clone of `h` to `target` ended. If it was logged as making a holder and answered
    /// that it failed, the target holds nothing of the version.
    pub(super) fn clone_ended(&mut self, h: ChunkHandle, target: ServerIdx, failed: bool) {
        if !self.fallbacks.cloning.remove(&(h, target)) || !failed {
            return;
        }
        let listed = self
            .meta
            .chunks
            .get(h)
            .is_some_and(|c| c.replicas.contains(target));
        let addr = self.servers.get(target).addr.clone();
        if !listed
            && self
                .meta
                .fallbacks
                .get(&h)
                .is_some_and(|f| f.holders.contains(&addr))
        {
            self.log_fallback(h, addr, pb::Fallback::NotHolder);
        }
    }

    /// Whether some chunk has no live copy of its current version but demoted copies to
    /// revive it from: the master has repair work pending (a revival may wait for a
    /// lease to run out, or to learn that a holder holds nothing). For harnesses
    /// deciding when a cluster has healed.
    pub fn awaiting_revival(&self) -> bool {
        self.meta.fallbacks.iter().any(|(&h, f)| {
            !f.demoted.is_empty()
                && self
                    .meta
                    .chunks
                    .get(h)
                    .is_some_and(|c| self.live_replicas(c).is_empty())
        })
    }

    /// Revives `h` from its newest demoted copies if no copy of its current version may
    /// be left (see the module comment). Returns whether a revival started.
    pub(super) fn revive(&mut self, h: ChunkHandle) -> bool {
        if let Some(i) = self.fallbacks.intents.remove(&h) {
            // A clone waiting to be sent, with no copy left to send it from: it never
            // will be, and its target holds nothing of the version.
            let addr = self.servers.get(i.target).addr.clone();
            if self
                .meta
                .fallbacks
                .get(&h)
                .is_some_and(|f| f.holders.contains(&addr))
                && self
                    .meta
                    .chunks
                    .get(h)
                    .is_some_and(|c| c.version == i.version)
            {
                self.log_fallback(h, addr, pb::Fallback::NotHolder);
            }
        }
        let (Some(c), Some(f)) = (self.meta.chunks.get(h), self.meta.fallbacks.get(&h)) else {
            return false;
        };
        let current = c.version;
        if current == 0
            || !f.holders.is_empty()
            || !self.live_replicas(c).is_empty()
            || self.repl.in_flight.contains_key(&h)
            || self.fallbacks.intents.contains_key(&h)
            || self.fallbacks.reviving.contains_key(&h)
            || self
                .fallbacks
                .retry_at
                .get(&h)
                .is_some_and(|&t| self.now < t)
            || self.lease_may_be_out(h)
        {
            return false;
        }
        // The newest demoted copies, wherever they are: if none of those is on a live
        // server, wait for one rather than revive older data.
        let Some(best) = f.demoted.values().copied().max() else {
            return false;
        };
        let targets: Vec<ServerIdx> = f
            .demoted
            .iter()
            .filter(|&(_, &v)| v == best)
            .filter_map(|(a, _)| self.servers.find(a))
            .filter(|&s| self.servers.is_alive(s) && !self.gc.pending_deletes.is_ordered(s, h))
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
            "every current copy destroyed: reviving the newest demoted copies"
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

    /// A revival's answers are in: the copies that took the version, still demoted at
    /// the version revived from and alive, are current.
    pub(super) fn finish_revival(&mut self, h: ChunkHandle, version: Version, acked: &[ServerIdx]) {
        self.repl.check(h);
        let from = self.fallbacks.reviving.remove(&h);
        let good: Vec<ServerIdx> = acked
            .iter()
            .copied()
            .filter(|&s| {
                let addr = &self.servers.get(s).addr;
                self.servers.is_alive(s)
                    && from.is_some_and(|v| {
                        self.meta
                            .fallbacks
                            .get(&h)
                            .is_some_and(|f| f.demoted.get(addr) == Some(&v))
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
        let holders = good
            .iter()
            .map(|&s| self.servers.get(s).addr.clone())
            .collect();
        if let Err(e) = self.log(Op::SetVersion(pb::SetVersionOp {
            handle: h,
            version,
            holders,
            ..Default::default()
        })) {
            panic!("logging revived version {version} of chunk {h} failed: {e}");
        }
        self.fallbacks.retry_at.remove(&h);
        for &s in &good {
            self.add_replica(h, s);
        }
    }
}
