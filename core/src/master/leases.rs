//! Chunk leases (GFS §3.1) and the write-target request that needs them.
//!
//! A grant first reserves the new version in the log (`ReserveVersion`), durably, so no
//! number is ever handed out twice, even across a master crash. Then it asks the
//! replicas to record the version durably (`SetVersion`); only when they answer is the
//! version logged as the chunk's, and only when that record (with the retirement of the
//! copies that did not answer) is durable is any client told. A replica that did not
//! answer keeps the old version and is stale from then on.
//!
//! Safety: a new lease is never granted while an old one may still be valid on its holder.
//! The holder counts its lease from when the `SetVersion` (or extension) *reached* it; the
//! master counts from when the answer came back, which is later, and then waits out
//! `max_clock_skew` more. After a restart the master does not know which leases are out,
//! so it grants none on existing chunks for one lease period plus the skew, plus an
//! order's lifetime: a grant the crashed master sent may still be on its way (a request
//! arrives within `MasterConfig::late_delivery` of its caller's deadline or never).
//!
//! A master group's new leader can often end that quiet period within a few heartbeats.
//! Before a master grants a server its first lease, it logs the server as a lease holder
//! with its term (`LeaseHolderOp`), so every server that may hold a lease from an older
//! term is in the new leader's log: the record was durable before that grant went out. A
//! chunkserver gives up every lease it holds as it stores a newer term, and takes no
//! order from an older one after (`chunkserver/epoch.rs`); each heartbeat carries the
//! term it has stored. Once every server logged in an older term has sent a heartbeat
//! of this leader's term or later, no lease from before is left anywhere, and the quiet
//! period is over. A holder that never reports (down for good) leaves the whole period
//! to run, as before. Once it is over either way, the leader logs that holders of older
//! terms are forgotten, so the list stays as short as the set of servers it grants to;
//! only a log with such a record (or no chunk at all) is known to name every holder, so
//! only then may a leader fence. Until the period would have ended by time, grants and
//! new copies go only to servers that have reported the term (`on_my_term`).
//! A master that runs alone fences the same way: each start takes an epoch one past every
//! epoch and term in its log (`Master::start_alone`), durably before it sends anything,
//! and uses it as a leader uses its term. A log from before holders were named leaves its
//! first run with an epoch to wait the period out, as above.

use crate::types::HashMap;

use super::chunks::ServerIdx;
use super::locks::{LockSet, Mode};
use super::placement::{self, Candidate};
use super::{CallCtx, Master, MasterConfig, RequestId, ok};
use crate::error::FsError;
use crate::pb::{self, chunk_request::Req as CReq, log_record::Op, master_response::Resp};
use crate::types::{ChunkHandle, LogSeq, Time, Version, millis};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub primary: ServerIdx,
    pub version: Version,
    /// On the master's clock; the holder's own view ends no later than this.
    pub expires: Time,
    /// True when the grant failed or was revoked without an answer: the holder may think
    /// it has a lease, but nobody is told it does.
    pub void: bool,
    /// The replicas that took `version` at the grant, primary included. Every write under
    /// this lease goes to all of them: a replica left out would miss writes yet keep the
    /// version, a stale copy nobody could tell from a good one.
    pub replicas: Vec<ServerIdx>,
    /// The chunk size of the chunk's file, as the grant told the primary.
    pub chunk_size: u64,
    /// The last log record of the grant (the version, and the retirement of the copies
    /// that did not take it). No client hears of the lease before it is durable: a master
    /// that crashed earlier would count a retired copy current again, though it misses
    /// every write made under this lease.
    pub durable: LogSeq,
}

#[derive(Debug)]
struct Grant {
    /// None: a revival of stale copies (`fallback.rs`), which carries no lease.
    primary: Option<ServerIdx>,
    targets: Vec<ServerIdx>,
    version: Version,
    create: bool,
    pending: usize,
    acked: Vec<ServerIdx>,
    /// Requests waiting for the grant, each with the log record it must also wait for.
    /// Write-target requests: (request, log record the reply also waits for, chunk index).
    waiters: Vec<(RequestId, LogSeq, u64)>,
    /// The `SetVersion` calls, held until the reservation is durable.
    unsent: Vec<(ServerIdx, CReq)>,
    /// The chunk size of the chunk's file.
    chunk_size: u64,
}

#[derive(Debug)]
pub struct Leases {
    held: HashMap<ChunkHandle, Lease>,
    granting: HashMap<ChunkHandle, Grant>,
    /// No lease on a chunk below `quiet_below` (those that existed at start-up) before
    /// this time (see the module comment).
    quiet_until: Time,
    /// Where the quiet period ends by time alone, however early fencing ended it.
    quiet_bound: Time,
    quiet_below: ChunkHandle,
    /// Grants waiting for their version reservation to be durable, by log record.
    unreserved: std::collections::BTreeMap<LogSeq, Vec<ChunkHandle>>,
    /// A group leader's quiet period: the servers logged as lease holders in an older
    /// term that have not yet shown they hold none from it (None: not fencing).
    holders_left: Option<std::collections::BTreeSet<(String, u64)>>,
    /// Whether the holders of older terms have been forgotten in the log.
    forgot: bool,
    /// Whether the quiet period ended before its time (every holder fenced).
    ended_early: bool,
}

impl Leases {
    pub fn starting(now: Time, cfg: &MasterConfig, next_handle: ChunkHandle) -> Leases {
        // A grant the last master sent may still arrive an order's lifetime from now (it
        // crashed at the latest now), and its lease run a period from then.
        let quiet = now + cfg.order_lifetime() + cfg.lease_duration + cfg.max_clock_skew;
        Leases {
            quiet_below: next_handle,
            held: HashMap::default(),
            granting: HashMap::default(),
            quiet_bound: quiet,
            quiet_until: quiet,
            unreserved: Default::default(),
            holders_left: None,
            forgot: false,
            ended_early: false,
        }
    }

    /// A group leader's start: the quiet period may end early once each of `holders`
    /// (those logged in an older term) has shown it holds no lease from one.
    pub fn fence(&mut self, now: Time, holders: std::collections::BTreeSet<(String, u64)>) {
        if holders.is_empty() {
            self.quiet_until = self.quiet_until.min(now);
            self.ended_early = true;
            tracing::info!("no server may hold a lease of an older term: no quiet period");
        }
        self.holders_left = Some(holders);
    }

    /// `server` (with id `id`) sent a heartbeat of this leader's term: it holds no older
    /// lease. Another server at the same address proves nothing of the one logged.
    pub fn fenced(&mut self, server: &str, id: u64, now: Time) {
        let Some(left) = &mut self.holders_left else {
            return;
        };
        if left.remove(&(server.to_string(), id)) && left.is_empty() && self.quiet_until > now {
            tracing::info!(
                server,
                early_ms = millis(self.quiet_until.saturating_sub(now)),
                "every server that may hold an older term's lease has given them up: the quiet period is over"
            );
            self.quiet_until = now;
            self.ended_early = true;
        }
    }

    /// A master alone that found its log lost runs (`Master::outrun`): the holders of
    /// their leases are not named, so the quiet period runs by time after all. Should it
    /// have ended early already, it holds again until its time: a lease a lost run
    /// granted ends by then, as that run stopped before this master started.
    pub fn unfence(&mut self) {
        self.holders_left = None;
        self.quiet_until = self.quiet_until.max(self.quiet_bound);
        self.ended_early = false;
    }

    /// Whether this leader's quiet period ended early (see the module comment).
    pub fn quiet_ended_early(&self) -> bool {
        self.ended_early
    }

    /// Where the quiet period would have ended by time alone.
    pub fn quiet_bound(&self) -> Time {
        self.quiet_bound
    }

    /// The first chunk handle made after this master started: the quiet period holds
    /// only the chunks below it.
    pub fn quiet_below(&self) -> ChunkHandle {
        self.quiet_below
    }

    /// Whether the quiet period is over, to be logged (once).
    fn forget_due(&mut self, now: Time) -> bool {
        if self.forgot || now < self.quiet_until {
            return false;
        }
        self.forgot = true;
        true
    }

    pub fn forget(&mut self, h: ChunkHandle) {
        self.held.remove(&h);
        self.granting.remove(&h);
    }

    /// Drops leases that can no longer be valid anywhere (expired, skew included): they
    /// constrain nothing, and keeping them would cost memory on every chunk ever written.
    pub fn purge(&mut self, now: Time, skew: std::time::Duration) {
        self.held.retain(|_, l| now < l.expires + skew);
        // A burst of writes can leave a large, mostly empty table behind.
        if self.held.capacity() > 64 && self.held.len() < self.held.capacity() / 4 {
            self.held.shrink_to_fit();
        }
    }

    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    pub fn is_granting(&self, h: ChunkHandle) -> bool {
        self.granting.contains_key(&h)
    }

    /// How long the restart's quiet period still holds `h` (zero when it does not): a
    /// chunk that existed when the master started may have a lease out that the master
    /// no longer knows of, since the lease table is not persisted.
    pub fn quiet_for(&self, h: ChunkHandle, now: Time) -> std::time::Duration {
        if h < self.quiet_below {
            self.quiet_until.saturating_sub(now)
        } else {
            std::time::Duration::ZERO
        }
    }

    /// Whether a lease on `h` may be valid on some chunkserver at `now`: one is being
    /// granted, or one is held (void or not: a holder that never heard of the revocation
    /// still believes in it) until its expiry plus the skew bound, or the chunk is inside
    /// the restart's quiet period. This is the one question every path that must not act
    /// under a lease asks (a clone, the trimming of a copy beyond the goal, a new grant):
    /// a lease's primary forwards writes to the replica set fixed at its grant, so a copy
    /// made meanwhile at the same version would silently miss them.
    pub fn may_be_out(&self, h: ChunkHandle, now: Time, skew: std::time::Duration) -> bool {
        self.granting.contains_key(&h)
            || self.held.get(&h).is_some_and(|l| now < l.expires + skew)
            || !self.quiet_for(h, now).is_zero()
    }

    pub fn get(&self, h: ChunkHandle) -> Option<&Lease> {
        self.held.get(&h)
    }

    /// Every lease the master still counts (void and expired ones included, until they
    /// are purged), for the checkers.
    pub fn held(&self) -> impl Iterator<Item = (ChunkHandle, &Lease)> {
        self.held.iter().map(|(h, l)| (*h, l))
    }

    /// Leases that are valid now, for invariant checks.
    pub fn valid(&self, now: Time) -> impl Iterator<Item = (ChunkHandle, &Lease)> {
        self.held
            .iter()
            .filter(move |(_, l)| !l.void && now < l.expires)
            .map(|(h, l)| (*h, l))
    }
}

impl Master {
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    pub(super) fn on_get_write_target(
        &mut self,
        id: RequestId,
        r: &pb::GetWriteTargetRequest,
        from: &crate::auth::Caller,
    ) -> Result<bool, FsError> {
        let path = crate::path::normalize(&r.path)?;
        self.check(from).write(&path)?;
        // A missing file is refused below, under its lock.
        let (have, chunk_size) = self
            .meta
            .ns
            .file(&path)
            .map(|f| (f.chunks.len() as u64, u64::from(f.chunk_size)))
            .unwrap_or((0, self.cfg.chunk_size));
        // An append targets the last chunk, unless the appender found that one full and
        // asks for the next.
        let index = if r.append {
            r.chunk_index.max(have.saturating_sub(1))
        } else {
            r.chunk_index
        };
        let allocate = index >= have;
        let max_chunks = u64::MAX / chunk_size;
        if index >= max_chunks {
            return Err(FsError::InvalidArgument(format!(
                "chunk index {index} too large"
            )));
        }
        // Every chunk up to the one asked for is allocated, so the request's cost is
        // bounded here, not by the index it names.
        if allocate && index - have >= self.cfg.max_new_chunks {
            return Err(FsError::InvalidArgument(format!(
                "{path}: chunk {index} is {} chunks past the file's end (chunk {have}); \
                 a write may start at most {} chunks past it",
                index - have,
                self.cfg.max_new_chunks
            )));
        }
        let set = LockSet::on(&path, if allocate { Mode::Write } else { Mode::Read })?;
        if !self.lock(&set) {
            return Ok(false);
        }
        let f = match self.meta.ns.file(&path) {
            Ok(f) => f,
            Err(e) => {
                self.locks.release(&set);
                return Err(e);
            }
        };
        let mut after = 0;
        if !allocate {
            let h = f.chunks[index as usize];
            self.locks.release(&set);
            self.write_target(id, h, after, index, chunk_size);
            return Ok(true);
        }
        // Allocate every chunk up to the one asked for (a write past the end leaves a
        // hole of chunks that read as empty until written).
        let mut last = None;
        for _ in have..=index {
            let handle = self.meta.next_handle;
            match self.log(Op::AddChunk(pb::AddChunkOp {
                path: path.clone(),
                handle,
            })) {
                Ok((seq, _)) => last = Some((seq, handle)),
                Err(e) => {
                    self.release_or_hold(last.map(|l| l.0), set);
                    return Err(e);
                }
            }
        }
        let (seq, h) = last.expect("at least one chunk allocated");
        after = seq;
        self.hold(seq, None, Some(set));
        self.write_target(id, h, after, index, chunk_size);
        Ok(true)
    }

    /// Replies with the lease holder of `h`, granting a lease first if none is valid.
    /// The reply also waits for log record `after`. `index` is the chunk's place in its
    /// file, echoed to the client; `chunk_size` is the file's, for the grant and the
    /// client.
    pub(super) fn write_target(
        &mut self,
        id: RequestId,
        h: ChunkHandle,
        after: LogSeq,
        index: u64,
        chunk_size: u64,
    ) {
        if after > self.synced_seq {
            // The chunk's allocation is not durable yet. No chunkserver may hear of the
            // handle before it is: a master that crashed now would hand it out again.
            self.deferred_targets
                .entry(after)
                .or_default()
                .push((id, h, index, chunk_size));
            return;
        }
        let now = self.now;
        if let Some(g) = self.leases.granting.get_mut(&h) {
            if g.primary.is_none() {
                // A revival (`fallback.rs`) carries no lease: ask again once it is done.
                self.reply_err(
                    id,
                    FsError::Unavailable(format!("chunk {h}: reviving its older copies")),
                );
                return;
            }
            assert_eq!(
                g.chunk_size, chunk_size,
                "chunk {h} changed its file's chunk size"
            );
            g.waiters.push((id, after, index));
            return;
        }
        if let Some(l) = self.leases.held.get(&h) {
            assert_eq!(
                l.chunk_size, chunk_size,
                "chunk {h} changed its file's chunk size"
            );
            if !l.void && now < l.expires && self.servers.is_alive(l.primary) {
                let c = self
                    .meta
                    .chunks
                    .get(h)
                    .expect("leased chunk is in the table");
                if l.replicas.iter().all(|&s| c.replicas.contains(s)) {
                    let reply = self.target_reply(h, l, index);
                    let durable = l.durable;
                    self.hold(after.max(durable), Some((id, reply)), None);
                    return;
                }
                // A replica of this lease is gone (dead, stale or corrupt). Writes to the
                // rest would leave it stale at the current version, so end the lease and
                // grant a new one, with a new version, among the replicas left.
                self.revoke_lease(h);
                self.reply_err(
                    id,
                    FsError::Unavailable(format!(
                        "chunk {h}: replica set changed; renewing the lease"
                    )),
                );
                return;
            }
            let free_at = l.expires + self.cfg.max_clock_skew;
            if now < free_at {
                let wait = millis(free_at.saturating_sub(now));
                let why = if self.servers.is_alive(l.primary) {
                    "the previous lease".to_string()
                } else {
                    // Most often what a user waits for: name the server that is missing.
                    format!(
                        "its primary {} stopped reporting; its lease",
                        self.servers.get(l.primary).addr
                    )
                };
                self.reply_err(
                    id,
                    FsError::Unavailable(format!(
                        "chunk {h}: {why} may still be valid for {wait} ms, and no new \
                         primary is chosen before it ends"
                    )),
                );
                return;
            }
            self.leases.held.remove(&h);
        }
        if let Err(e) = self.start_grant(h, chunk_size) {
            self.reply_err(id, e);
            return;
        }
        let g = self
            .leases
            .granting
            .get_mut(&h)
            .expect("grant just started");
        g.waiters.push((id, after, index));
    }

    fn target_reply(&self, h: ChunkHandle, lease: &Lease, index: u64) -> pb::MasterResponse {
        let c = self
            .meta
            .chunks
            .get(h)
            .expect("leased chunk is in the table");
        let primary = lease.primary;
        let expires = lease.expires;
        let others: Vec<ServerIdx> = lease
            .replicas
            .iter()
            .copied()
            .filter(|&s| s != primary)
            .collect();
        let addr = |s: ServerIdx| self.servers.get(s).addr.clone();
        let rack = |s: ServerIdx| self.servers.get(s).rack.clone();
        ok(Resp::WriteTarget(pb::WriteTarget {
            handle: h,
            version: c.version,
            primary: addr(primary),
            secondaries: others.iter().map(|&s| addr(s)).collect(),
            lease_expires_in_ms: millis(expires.saturating_sub(self.now)),
            chunk_size: lease.chunk_size,
            chunk_index: index,
            primary_rack: rack(primary),
            secondary_racks: others.iter().map(|&s| rack(s)).collect(),
            // Signed as the reply leaves, for the caller (`Master::sign_replies`).
            capabilities: Vec::new(),
        }))
    }

    /// Starts granting a lease on `h`, a chunk of a file with chunks of `chunk_size`.
    fn start_grant(&mut self, h: ChunkHandle, chunk_size: u64) -> Result<(), FsError> {
        if self.meta.chunks.get(h).is_none() {
            return Err(FsError::ChunkNotFound(format!("chunk {h}")));
        }
        // Every chunk that existed before a restart waits out the quiet period, even one
        // at version 0: its first grant may have reached a primary before the master
        // lost the record of it.
        let quiet = self.leases.quiet_for(h, self.now);
        if !quiet.is_zero() {
            return Err(FsError::Unavailable(format!(
                "master restarted: no leases for {} ms",
                millis(quiet)
            )));
        }
        if self.mending.contains(h) {
            return Err(FsError::Unavailable(format!(
                "chunk {h}: mending its last copy of the current version first"
            )));
        }
        if self.now >= self.repl_not_before() && self.repair_before_grant(h) {
            return Err(FsError::Unavailable(format!(
                "chunk {h}: restoring its replicas first"
            )));
        }
        let c = self.meta.chunks.get(h).expect("checked above");
        let create = c.version == 0;
        let goal = c.goal as usize;
        let version = (c.version + 1).max(self.meta.reserved.get(&h).map_or(0, |r| r + 1));
        let holders: Vec<ServerIdx> = c.replicas.as_slice().to_vec();
        let targets: Vec<ServerIdx> = if create {
            let chosen = self.place(goal, &[]);
            if chosen.is_empty() {
                return Err(self.no_placement());
            }
            for &s in &chosen {
                self.servers
                    .note_creation(s, self.now, self.cfg.creation_window);
            }
            chosen
        } else {
            let live: Vec<_> = holders
                .into_iter()
                .filter(|&s| self.servers.is_alive(s))
                .collect();
            if live.is_empty() {
                return Err(FsError::Unavailable(format!(
                    "chunk {h}: no live up-to-date replica"
                )));
            }
            // A replica still storing this leader's term would refuse the version (and
            // be demoted for it, or leave a void lease as primary): a heartbeat away.
            if let Some(&s) = live.iter().find(|&&s| !self.on_my_term(s)) {
                return Err(FsError::Unavailable(format!(
                    "chunk {h}: {} has not yet taken master term {}",
                    self.servers.get(s).addr,
                    self.epoch
                )));
            }
            live
        };
        let primary = targets[self.rng.below(targets.len() as u64) as usize];
        tracing::debug!(chunk = h, version, primary = %self.servers.get(primary).addr, "granting lease");
        self.begin_grant(h, version, targets, Some(primary), create, chunk_size)
    }

    /// Reserves `version` of `h` in the log and, once that is durable, asks `targets` to
    /// take it, with a lease for `primary` (none: a revival, `fallback.rs`).
    pub(super) fn begin_grant(
        &mut self,
        h: ChunkHandle,
        version: Version,
        targets: Vec<ServerIdx>,
        primary: Option<ServerIdx>,
        create: bool,
        chunk_size: u64,
    ) -> Result<(), FsError> {
        let lease_ms = millis(self.cfg.lease_duration);
        let unsent: Vec<(ServerIdx, CReq)> = targets
            .iter()
            .map(|&s| {
                let req = CReq::SetVersion(pb::SetVersionRequest {
                    epoch: self.epoch,
                    handle: h,
                    version,
                    create,
                    lease_ms: if Some(s) == primary { lease_ms } else { 0 },
                    valid_ms: lease_ms,
                    // The primary pads record appends to the file's chunk size.
                    chunk_size: if Some(s) == primary { chunk_size } else { 0 },
                    cluster_id: self.meta.cluster_id,
                    secondaries: match primary {
                        Some(p) if p == s => targets
                            .iter()
                            .filter(|&&t| t != p)
                            .map(|&t| self.servers.get(t).addr.clone())
                            .collect(),
                        _ => Vec::new(),
                    },
                    names_secondaries: Some(s) == primary,
                });
                (s, req)
            })
            .collect();
        if let Some(p) = primary {
            // Named before the grant can go out: a later leader must know to fence it.
            let s = self.servers.get(p);
            let key = (s.addr.clone(), s.id);
            if self.meta.lease_holders.get(&key) != Some(&self.epoch) {
                self.log(Op::LeaseHolder(pb::LeaseHolderOp {
                    address: key.0,
                    term: self.epoch,
                    forget_before: 0,
                    server_id: key.1,
                }))?;
            }
        }
        let (seq, _) = self.log(Op::ReserveVersion(pb::ReserveVersionOp {
            handle: h,
            version,
        }))?;
        self.leases.granting.insert(
            h,
            Grant {
                primary,
                pending: targets.len(),
                targets,
                version,
                create,
                acked: Vec::new(),
                waiters: Vec::new(),
                unsent,
                chunk_size,
            },
        );
        if seq <= self.synced_seq {
            self.send_grant(h);
        } else {
            self.leases.unreserved.entry(seq).or_default().push(h);
        }
        Ok(())
    }

    /// The grant's version is reserved durably: ask the replicas to take it.
    fn send_grant(&mut self, h: ChunkHandle) {
        let Some(g) = self.leases.granting.get_mut(&h) else {
            return;
        };
        let unsent = std::mem::take(&mut g.unsent);
        if self.authority.is_some_and(|until| self.now >= until) {
            // A group leader that cannot show it still leads sends no grant (its
            // reservation may have committed long before this master heard of it): the
            // grant fails as if nobody answered, and the version stays reserved.
            for (s, _) in unsent {
                self.on_set_version_result(h, s, false);
            }
            return;
        }
        for (s, req) in unsent {
            self.call(
                s,
                CallCtx::SetVersion {
                    handle: h,
                    server: s,
                },
                req,
            );
        }
    }

    /// Log records through `through` are durable: send the grants they reserved.
    pub(super) fn reservations_synced(&mut self, through: LogSeq) {
        let later = self.leases.unreserved.split_off(&(through + 1));
        let ready = std::mem::replace(&mut self.leases.unreserved, later);
        for h in ready.into_values().flatten() {
            self.send_grant(h);
        }
    }

    /// Picks `n` servers for new replicas, avoiding `exclude` and their racks.
    pub(super) fn place(&mut self, n: usize, exclude: &[ServerIdx]) -> Vec<ServerIdx> {
        let racks: Vec<&str> = exclude
            .iter()
            .map(|&s| self.servers.get(s).rack.as_str())
            .collect();
        let cands: Vec<Candidate<'_>> = self
            .servers
            .live()
            // New copies go only to servers that take this leader's orders already.
            .filter(|&(idx, _)| self.on_my_term(idx))
            .map(|(idx, s)| Candidate {
                idx,
                rack: &s.rack,
                utilization: s.utilization(),
                recent_creations: s.recent_creations,
                free: s.capacity.saturating_sub(s.used),
            })
            .collect();
        let rng = &mut self.rng;
        placement::choose(
            &cands,
            n,
            exclude,
            &racks,
            self.cfg.creation_limit,
            self.cfg.chunk_size,
            &mut || rng.next_u64(),
        )
    }

    pub(super) fn on_set_version_result(&mut self, h: ChunkHandle, server: ServerIdx, ok: bool) {
        let Some(g) = self.leases.granting.get_mut(&h) else {
            return;
        };
        g.pending -= 1;
        if ok {
            g.acked.push(server);
        }
        if g.pending == 0 {
            let g = self.leases.granting.remove(&h).expect("present above");
            self.finish_grant(h, g);
        }
    }

    fn finish_grant(&mut self, h: ChunkHandle, g: Grant) {
        let now = self.now;
        if self.meta.chunks.get(h).is_none() {
            // The file went away while the grant was out.
            for (id, _, _) in g.waiters {
                self.reply_err(id, FsError::NotFound(format!("chunk {h} was deleted")));
            }
            return;
        }
        let Some(primary) = g.primary else {
            self.finish_revival(h, g.version, &g.acked);
            return;
        };
        let primary_ok = g.acked.contains(&primary);
        // The holder may believe in its lease even if its answer was lost. One that
        // refused (or whose answer this master did not wait for) may still take the
        // order from a copy of the request delivered later, up to the order's lifetime
        // (its deadline, and a late delivery after), and count its lease from then: a
        // void lease lasts that much longer.
        let expires = if primary_ok {
            now + self.cfg.lease_duration
        } else {
            now + self.cfg.order_lifetime() + self.cfg.lease_duration
        };
        let mut lease = Lease {
            primary,
            version: g.version,
            expires,
            void: !primary_ok,
            replicas: g.acked.clone(),
            chunk_size: g.chunk_size,
            durable: self.last_seq,
        };
        self.leases.held.insert(h, lease.clone());
        if g.acked.is_empty() {
            // Nobody answered, yet some may apply the version later. No client wrote under
            // it, so such a copy is as good as the current one; the danger is only that
            // the next grant would use the same number for new writes. It will not: the
            // number is reserved in the log.
            for (id, _, _) in g.waiters {
                self.reply_err(
                    id,
                    FsError::Unavailable(format!("chunk {h}: no replica took the new version")),
                );
            }
            return;
        }
        let old_version = self.meta.chunks.get(h).map_or(0, |c| c.version);
        // Replicas that did not take the new version are stale now.
        let old: Vec<ServerIdx> = self
            .meta
            .chunks
            .get(h)
            .expect("checked")
            .replicas
            .as_slice()
            .to_vec();
        let dropped: Vec<ServerIdx> = old.into_iter().filter(|s| !g.acked.contains(s)).collect();
        // Those, and the grant's targets that did not answer (listed at the old version
        // when it began; one may have been declared dead since), hold every write
        // acknowledged up to the old version: demoted, logged with the version
        // (`fallback.rs`).
        let mut demoted = dropped.clone();
        for &s in &g.targets {
            if !g.acked.contains(&s) && !demoted.contains(&s) {
                demoted.push(s);
            }
        }
        let op = self.demote_at_grant(h, old_version, g.version, &demoted, &g.acked);
        if let Err(e) = self.log(Op::SetVersion(op)) {
            panic!("logging version {} of chunk {h} failed: {e}", g.version);
        }
        if primary_ok {
            self.retire_participants(h, &g);
        }
        // Replies under this lease wait for all of the grant's records.
        lease.durable = self.last_seq;
        if let Some(l) = self.leases.held.get_mut(&h) {
            l.durable = lease.durable;
        }
        for &s in &dropped {
            self.drop_replica(h, s);
        }
        for &s in &g.acked {
            self.add_replica(h, s);
        }
        if g.create {
            tracing::debug!(chunk = h, replicas = g.acked.len(), "chunk created");
        }
        self.repl.check(h);
        for (id, after, index) in g.waiters {
            if primary_ok {
                let reply = self.target_reply(h, &lease, index);
                self.hold(lease.durable.max(after), Some((id, reply)), None);
            } else {
                self.reply_err(
                    id,
                    FsError::Unavailable(format!("chunk {h}: primary did not answer")),
                );
            }
        }
    }

    /// A participant that did not answer may still apply the new version later, with none
    /// of the writes to come: a copy at a version that is (or will be) current but is not.
    /// Its copy is retired, in the log, so a restarted master refuses it too. Only under
    /// a lease: without one (the primary did not answer) nothing is written at this
    /// version, and a late copy is as good as those that answered.
    fn retire_participants(&mut self, h: ChunkHandle, g: &Grant) {
        for &s in &g.targets {
            if !g.acked.contains(&s) {
                let address = self.servers.get(s).addr.clone();
                let op = Op::RetireReplica(pb::RetireReplicaOp {
                    handle: h,
                    address,
                    version: g.version,
                    lift: false,
                });
                if let Err(e) = self.log(op) {
                    panic!("retiring a copy of chunk {h}: {e}");
                }
                self.retired_at.insert((h, s), self.now);
            }
        }
    }

    /// Why a new chunk has nowhere to go. `NoSpace` (final: a client that asks again
    /// only waits, until an operator frees space or adds a server) only when this master
    /// knows the whole cluster is full: it has heard from its servers since it started
    /// (past its learning period), and every server it knows of is live, takes its
    /// orders and reported itself full. Anything less (no server yet, one dead or not yet
    /// on this term that may have room, only busy ones) is a wait (`Unavailable`).
    fn no_placement(&self) -> FsError {
        let learned = self.now >= self.repl_not_before();
        let mut known = self.servers.iter().peekable();
        if learned
            && known.peek().is_some()
            && known.all(|(idx, s)| s.alive && self.on_my_term(idx) && s.utilization() >= 1.0)
        {
            return FsError::NoSpace(
                "every chunkserver is full: no room for a new chunk (free space, or add a \
                 chunkserver)"
                    .into(),
            );
        }
        FsError::Unavailable("no chunkserver with free space".into())
    }

    /// Whether `s` may be sent grants and new copies: it has said it stored this
    /// master's term (always, for a master alone). Only until the quiet period would
    /// have ended by time: a server that never reports the term (its identity write
    /// failing, a binary from before heartbeats carried it) then gets them as before,
    /// and refuses what it cannot take, rather than stall its chunks for good.
    pub(super) fn on_my_term(&self, s: ServerIdx) -> bool {
        // After an epoch taken mid-run (`outrun`), a heartbeat timeout for each server
        // to report it: a grant of the new epoch to a server still storing it would be
        // refused, and the copy taken for stale.
        self.epoch == 0
            || self.servers.get(s).epoch >= self.epoch
            || (self.now >= self.leases.quiet_bound()
                && self
                    .outrun_at
                    .is_none_or(|t| self.now >= t + self.cfg.heartbeat_timeout))
    }

    /// A group leader whose quiet period is over logs so, once: no lease of an older
    /// term is left, its holders are forgotten, and later leaders may fence.
    pub(super) fn forget_old_lease_holders(&mut self) {
        if self.epoch == 0
            || self.meta.leases_settled_in >= self.first_epoch
            || !self.leases.forget_due(self.now)
        {
            return;
        }
        // The period is the first epoch's: holders this master named in it (before a
        // newer one, `outrun`) may still hold its leases, and are kept.
        if let Err(e) = self.log(Op::LeaseHolder(pb::LeaseHolderOp {
            address: String::new(),
            term: self.epoch,
            forget_before: self.first_epoch,
            server_id: 0,
        })) {
            panic!("forgetting older lease holders: {e}");
        }
    }

    /// Extends the leases `server` holds among `handles`; returns those extended.
    pub(super) fn extend_leases(
        &mut self,
        server: ServerIdx,
        handles: &[ChunkHandle],
    ) -> Vec<ChunkHandle> {
        let now = self.now;
        let mut out = Vec::new();
        // A leader of a master group extends nothing once it cannot show it still
        // leads (see `crate::group::lease`): a newer leader's quiet period covers only
        // what an older one could extend before its followers might elect another.
        if self.authority.is_some_and(|until| now >= until) {
            return out;
        }
        for &h in handles {
            if let Some(l) = self.leases.held.get_mut(&h)
                && l.primary == server
                && !l.void
                && now < l.expires
            {
                l.expires = now + self.cfg.lease_duration;
                out.push(h);
            }
        }
        out
    }

    /// Asks the holder of `h`'s lease to give it up (snapshots need this). Until it
    /// answers the lease is void but still blocks a new grant until it expires.
    pub fn revoke_lease(&mut self, h: ChunkHandle) {
        let Some(l) = self.leases.held.get_mut(&h) else {
            return;
        };
        if l.void || self.now >= l.expires {
            return;
        }
        l.void = true;
        let (server, version) = (l.primary, l.version);
        self.call(
            server,
            CallCtx::Revoke { handle: h, server },
            CReq::RevokeLease(pb::RevokeLeaseRequest {
                epoch: self.epoch,
                handle: h,
                cluster_id: self.meta.cluster_id,
                version,
            }),
        );
    }

    pub(super) fn on_revoke_result(&mut self, h: ChunkHandle, server: ServerIdx, ok: bool) {
        if ok
            && self
                .leases
                .held
                .get(&h)
                .is_some_and(|l| l.primary == server && l.void)
        {
            // The holder has dropped it: nothing can still be valid.
            self.leases.held.remove(&h);
        }
    }
}
