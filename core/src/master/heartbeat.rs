//! Chunkserver heartbeats and liveness (GFS §2.6.2, §4.4.2, §4.5).
//!
//! A heartbeat registers the server, reports every chunk it holds with its version, and
//! asks for lease extensions. The reply lists the replicas the master does not want:
//! chunks it does not know (orphans), older versions (stale) and copies reported corrupt.
//! A version newer than the master's means a grant was logged on the replicas but not on
//! the master before a crash: the master adopts it (GFS §4.5), even over version 0. The
//! next grant then moves past every leftover, so no version number is ever reused for
//! different contents. A version above every one the master ever reserved was never
//! granted: it is refused and the copy ordered deleted, whatever it claims.

use crate::types::{HashMap, HashSet};

use super::chunks::ServerIdx;
use super::mend::Mend;
use super::servers::{Arrival, Refused};
use super::{Master, RequestId, ok};
use crate::auth::Caller;
use crate::error::FsError;
use crate::pb::{self, log_record::Op, master_response::Resp};
use crate::types::{ChunkHandle, Time, Version, millis};

/// Copies each server has been told to delete, with the chunk's version and the time of
/// the order. An order stands until the chunk's version moves on or the chunk goes, or
/// until the server has shown it no longer holds the chunk at least a lease period after
/// the order (by then no late grant can still arrive): neither a lost heartbeat reply nor
/// a late grant may bring the copy back meanwhile.
#[derive(Debug, Default)]
pub(super) struct PendingDeletes(HashMap<ServerIdx, HashMap<ChunkHandle, (Version, Time)>>);

impl PendingDeletes {
    pub(super) fn order(&mut self, server: ServerIdx, h: ChunkHandle, version: Version, now: Time) {
        self.0.entry(server).or_default().insert(h, (version, now));
    }

    /// Withdraws the order against `server`'s copy of `h`: the copy it was about is gone,
    /// replaced by a good one (a clone).
    pub(super) fn cancel(&mut self, server: ServerIdx, h: ChunkHandle) {
        if let Some(hs) = self.0.get_mut(&server) {
            hs.remove(&h);
        }
    }

    pub(super) fn is_ordered(&self, server: ServerIdx, h: ChunkHandle) -> bool {
        self.0.get(&server).is_some_and(|hs| hs.contains_key(&h))
    }
}

/// The longest address or rack name a heartbeat may give (a host name is at most 253
/// bytes, a port 6 more).
pub const MAX_ADDRESS_BYTES: usize = 260;

impl Master {
    pub(super) fn on_heartbeat(&mut self, id: RequestId, r: &pb::HeartbeatRequest, from: &Caller) {
        if r.address.is_empty() {
            self.reply_err(
                id,
                crate::error::FsError::InvalidArgument("heartbeat without an address".into()),
            );
            return;
        }
        // Kept for as long as the server is known, and sent to every client that reads
        // from it: a peer's word is bounded before it is stored.
        if r.address.len() > MAX_ADDRESS_BYTES || r.rack.len() > MAX_ADDRESS_BYTES {
            self.reply_err(
                id,
                FsError::InvalidArgument(format!(
                    "heartbeat with an address of {} bytes and a rack name of {}: at most \
                     {MAX_ADDRESS_BYTES} each",
                    r.address.len(),
                    r.rack.len()
                )),
            );
            return;
        }
        // A server of another cluster (pointed at this master by mistake) is no member:
        // its copies belong to its own cluster's files, and believing its report would
        // have this master re-replicate from it and order its copies deleted.
        if r.cluster_id != 0 && r.cluster_id != self.meta.cluster_id {
            tracing::error!(
                server = %r.address,
                theirs = r.cluster_id,
                ours = self.meta.cluster_id,
                "refusing a heartbeat from a server of another cluster"
            );
            self.reply_err(
                id,
                crate::error::FsError::InvalidArgument(format!(
                    "wrong cluster: {} belongs to cluster {:016x}, this master's is {:016x}",
                    r.address, r.cluster_id, self.meta.cluster_id
                )),
            );
            return;
        }
        let (idx, arrival) = match self.servers.heartbeat(
            self.now,
            r.server_id,
            &r.address,
            &r.rack,
            r.capacity_bytes,
            r.used_bytes,
            cert_name(from),
        ) {
            Ok(joined) => joined,
            Err(refused) => {
                let e = match refused {
                    Refused::AddressInUse { registered } => FsError::InvalidArgument(format!(
                        "address in use by another server: {} is server {registered:016x}, \
                         not {:016x}",
                        r.address, r.server_id
                    )),
                    Refused::CertInUse { addr } => FsError::PermissionDenied(format!(
                        "{from} speaks for the live server at {addr} already: one \
                         certificate, one server (a heartbeat for {} refused)",
                        r.address
                    )),
                    Refused::OtherCert { id: other, cert } => FsError::PermissionDenied(format!(
                        "server {other:016x} (at {}) belongs to certificate \
                             chunkserver:{cert}, not {from}",
                        r.address
                    )),
                    Refused::Full { held, dead } => FsError::InvalidArgument(format!(
                        "the master holds {held} chunkservers, its most (--max-servers), \
                         {dead} of them dead: a new one at {} is refused until the master \
                         restarts (which forgets the dead) or the limit is raised",
                        r.address
                    )),
                };
                tracing::error!(server = %r.address, id = r.server_id, error = %e, "refusing a heartbeat");
                self.reply_err(id, e);
                return;
            }
        };
        // Answers are counted within one run of the server.
        let seen = self.answered.entry(idx).or_default();
        if seen.0 != r.boot {
            *seen = (r.boot, 0);
        }
        // The term of the very server registered there; a reordered report lowers nothing.
        let s = self.servers.get_mut(idx);
        s.keys = crate::capability::ServerKeys::from_heartbeat(self.now, r);
        if r.server_id == s.id {
            s.epoch = s.epoch.max(r.epoch);
            // A master alone's epoch reaches a server only in this master's answers: one
            // reported before any (at this address or, the server moved, another), or a
            // newer one, was taken by a run this log lost.
            let answered = s.answered
                || (r.server_id != 0
                    && self
                        .servers
                        .iter()
                        .any(|(_, o)| o.id == r.server_id && o.answered));
            if self.alone && (r.epoch > self.epoch || (r.epoch == self.epoch && !answered)) {
                self.outrun(r.epoch);
            }
        }
        if self.epoch > 0 && r.epoch >= self.epoch {
            // It holds no lease from an older term (`leases.rs`).
            self.leases.fenced(&r.address, r.server_id, self.now);
        }
        match arrival {
            Arrival::Known => {}
            Arrival::Revived => {
                tracing::info!(server = %r.address, rack = %r.rack, "chunkserver up");
                self.server_back(idx);
            }
            Arrival::Replaced => {
                tracing::warn!(server = %r.address, id = r.server_id, "another server at a dead server's address; forgetting the old one's copies");
                self.server_back(idx);
                self.forget_server(idx);
            }
        }
        // Orders still standing: repeat those the server has not carried out yet.
        let reported: HashSet<ChunkHandle> = r.chunks.iter().map(|c| c.handle).collect();
        self.unreported(idx, &reported);
        let chunks = &self.meta.chunks;
        let doomed: HashSet<ChunkHandle> = match self.gc.pending_deletes.0.get_mut(&idx) {
            Some(hs) => {
                let (now, settle) = (self.now, self.cfg.lease_duration);
                hs.retain(|h, (v, at)| {
                    chunks.get(*h).is_some_and(|c| c.version == *v)
                        && (reported.contains(h) || now < *at + settle)
                });
                hs.keys().copied().collect()
            }
            None => HashSet::default(),
        };
        let mut delete: Vec<ChunkHandle> = doomed
            .iter()
            .copied()
            .filter(|h| reported.contains(h))
            .collect();
        // Retired copies (from the log): refused while reported; the order is lifted once
        // the server shows it neither holds one nor is making one durable, two lease
        // periods and an order's lifetime after the order.
        let retired: Vec<(ChunkHandle, u64)> = self
            .meta
            .retired
            .iter()
            .filter(|((_, a), _)| *a == r.address)
            .map(|((h, _), v)| (*h, *v))
            .filter(|&(h, _)| self.is_retired(h, idx))
            .collect();
        let versions: HashMap<ChunkHandle, u64> =
            r.chunks.iter().map(|c| (c.handle, c.version)).collect();
        self.holders_reported(idx, &versions, &r.changing);
        let mut doomed = doomed;
        let mut kept = HashSet::default();
        for (h, v) in retired {
            let at = *self.retired_at.entry((h, idx)).or_insert(self.now);
            let held = versions.get(&h).copied();
            if held == Some(v) && self.kept_late(h, idx, v) {
                // A demoted copy that took the grant late: a fallback still.
                kept.insert(h);
            } else if held == Some(v) {
                // Only a copy at the retired version is suspect; an older one simply did
                // not take part, and is judged by its version like any other.
                doomed.insert(h);
                delete.push(h);
            } else if held.is_none_or(|held| held < v)
                && self.now >= at + self.cfg.lease_duration * 2 + self.cfg.order_lifetime()
                && !r.changing.contains(&h)
            {
                // A grant arrives within an order's lifetime of when it was sent (before
                // `at`: a refusal may come back early, and a copy of the order still
                // arrive), and is valid for one lease period after it arrives
                // (`valid_ms`), so by then no late one can still start; one started in
                // time may still be on its way to a stuck disk, and the server says so.
                // A copy older than the retired version (kept as a fallback while the
                // chunk is below its goal, `fallback.rs`) can no longer become one, and
                // must not keep the server from taking a fresh copy.
                self.lift_retirement(h, idx);
            }
        }
        delete.sort_unstable();
        delete.dedup();
        let mut matched = 0u64;
        for rep in &r.chunks {
            let h = rep.handle;
            if doomed.contains(&h) || kept.contains(&h) {
                continue; // told to delete it in this very reply, or kept as a fallback
            }
            let Some(c) = self.meta.chunks.get(h) else {
                delete.push(h);
                continue;
            };
            if self.leases.is_granting(h) {
                // Versions are moving; judge this chunk on a later heartbeat.
                matched += u64::from(c.replicas.contains(idx));
                continue;
            }
            // A copy found corrupt is reported at version 0 (its report to the master
            // may have been lost): the last one of the current version is mended, as
            // on that report, and stays listed meanwhile.
            let current = c.version;
            if rep.version == 0 && current > 0 && self.try_mend(h, idx) != Mend::No {
                let listed = self
                    .meta
                    .chunks
                    .get(h)
                    .is_some_and(|c| c.replicas.contains(idx));
                matched += u64::from(listed);
                continue;
            }
            let c = self.meta.chunks.get(h).expect("looked up above");
            debug_assert_eq!(c.version, current);
            if rep.version < c.version {
                if c.replicas.contains(idx) {
                    if rep.version == 0 {
                        // Found corrupt, its report lost (or its metadata at start-up).
                        self.found_corrupt_copy(h, idx);
                    }
                    self.drop_replica(h, idx);
                }
                // Below its goal, the chunk keeps it as a fallback (`fallback.rs`).
                if !self.keep_stale(h, idx, rep.version) {
                    delete.push(h);
                }
                continue;
            }
            if rep.version > c.version {
                // No grant ever went above the highest version reserved in the log, and a
                // reservation is durable before any replica hears of it: a copy above that
                // was never made by this master (a forged or corrupt report, a server of
                // another cluster). Adopting it would make every real copy stale.
                let ceiling = self
                    .meta
                    .reserved
                    .get(&h)
                    .map_or(c.version, |&r| r.max(c.version));
                if rep.version > ceiling {
                    tracing::error!(
                        chunk = h,
                        server = %r.address,
                        reported = rep.version,
                        highest = ceiling,
                        "refusing a copy at a version never granted"
                    );
                    if c.replicas.contains(idx) {
                        self.drop_replica(h, idx);
                    }
                    delete.push(h);
                    continue;
                }
                tracing::info!(
                    chunk = h,
                    from = c.version,
                    to = rep.version,
                    "adopting newer version"
                );
                // Nothing was written under the version adopted (its grant never
                // finished, or had no lease): the copies current at the old one hold
                // every acknowledged write, and are demoted (`fallback.rs`), this server
                // the one holder of the new version. Those listed now by name; a
                // restarted master may not have heard from every server yet: any copy at
                // the old version reported later is demoted too (`demote_at_grant`).
                let old_version = c.version;
                let old: Vec<_> = c.replicas.as_slice().to_vec();
                let demoted: Vec<ServerIdx> = old.iter().copied().filter(|&s| s != idx).collect();
                let op = self.demote_at_grant(h, old_version, rep.version, &demoted, &[idx]);
                if let Err(e) = self.log(Op::SetVersion(op)) {
                    panic!("adopting version of chunk {h}: {e}");
                }
                for s in old {
                    self.drop_replica(h, s);
                }
                self.repl.check(h);
            }
            self.add_replica(h, idx);
            matched += 1;
        }
        if matched < self.servers.get(idx).replicas {
            // The master lists this server for chunks it no longer reports; but one listed
            // on an answer it gave after composing this report is simply not in it yet.
            let unseen: HashSet<ChunkHandle> = self
                .listed_on_answer
                .iter()
                .filter(|&(&(_, s), &(boot, step))| {
                    s == idx && boot == r.boot && r.report_seq < step
                })
                .map(|(&(h, _), _)| h)
                .collect();
            let dropped =
                self.drop_replicas_where(idx, |h| !reported.contains(&h) && !unseen.contains(&h));
            if !dropped.is_empty() {
                tracing::info!(server = %r.address, chunks = ?dropped, "copies listed but not reported; no longer listed");
            }
        }
        // Copies listed on answers this report was composed after: shown by it, or gone.
        self.listed_on_answer.retain(|&(_, s), &mut (boot, step)| {
            s != idx || (boot == r.boot && r.report_seq < step)
        });
        let ordered = !delete.is_empty();
        if delete.is_empty() {
            self.gc.deleting.remove(&idx);
        } else {
            self.gc.deleting.insert(idx, delete.clone());
        }
        let extended_leases = self.extend_leases(idx, &r.lease_extensions);
        let reply = super::ok(Resp::Heartbeat(pb::HeartbeatResponse {
            epoch: self.epoch,
            // Each order covers the copy as reported, no newer: one that took a grant
            // after sending this report is kept.
            delete_chunks: delete
                .into_iter()
                .map(|handle| pb::ChunkVersion {
                    handle,
                    version: versions.get(&handle).copied().unwrap_or(u64::MAX),
                })
                .collect(),
            extended_leases,
            lease_duration_ms: millis(self.cfg.lease_duration),
            cluster_id: self.meta.cluster_id,
            // Only a server with an identity checks capabilities (`crate::capability`).
            capability_key: match from {
                Caller::Insecure => None,
                _ => self
                    .servers
                    .get_mut(idx)
                    .keys
                    .next_key(&self.meta.capability_secret, self.now),
            },
        }));
        // The reply names the cluster id, which the server stores for good: it waits until
        // the id is durable here too (at once, unless this master just made it), and so
        // for this run's epoch, which the server stores as well (`start_alone`). Delete
        // orders wait for everything logged so far: they follow from the state as it is
        // now, and a record not yet durable (in a group, not committed) that drops a
        // chunk may be lost in a crash or a change of leader, the chunk then still in use.
        let seq = if ordered {
            self.cluster_id_seq.max(self.last_seq())
        } else {
            self.cluster_id_seq.max(self.start_seq)
        };
        self.hold(seq, Some((id, reply)), None);
        self.servers.get_mut(idx).answered = true;
    }

    /// A server's disk was replaced (another id at its address): nothing the master knew
    /// of the old one's copies holds, and the new one reports what it has afresh. The
    /// orders against the old copies go, or one would delete a copy the new disk took
    /// since (a clone) at the same version; so do replicas listed on it since it was
    /// declared dead (a clone to it that finished after).
    fn forget_server(&mut self, idx: ServerIdx) {
        self.gc.pending_deletes.0.remove(&idx);
        self.gc.deleting.remove(&idx);
        self.retired_at.retain(|&(_, s), _| s != idx);
        // Its corrupt copies went with it.
        self.found_corrupt
            .values_mut()
            .for_each(|found| found.retain(|&s| s != idx));
        self.drop_replicas_where(idx, |_| true);
    }

    /// `server`'s listed copy of `h` failed its checksums and is dropped: counted in
    /// [`Master::corrupt_copies`] until the server holds a good copy again.
    fn found_corrupt_copy(&mut self, h: ChunkHandle, server: ServerIdx) {
        if !self
            .meta
            .chunks
            .get(h)
            .is_some_and(|c| c.replicas.contains(server))
        {
            return; // an old or demoted copy: it was no copy of the chunk's data now
        }
        let found = self.found_corrupt.entry(h).or_default();
        if !found.contains(&server) {
            found.push(server);
        }
    }

    pub(super) fn on_report_corrupt(
        &mut self,
        id: RequestId,
        r: &pb::ReportCorruptRequest,
        from: &Caller,
    ) {
        // Only a member's word counts: the server registered at the address, of this
        // cluster (0s from servers from before ids match any), and only about its own
        // copies: the certificate must be the one that server's heartbeats come with.
        let cert = cert_name(from);
        let member = |idx: ServerIdx| {
            let s = self.servers.get(idx);
            (r.cluster_id == 0 || r.cluster_id == self.meta.cluster_id)
                && (r.server_id == 0 || s.id == 0 || r.server_id == s.id)
                && s.cert == cert
        };
        if let Some(idx) = self.servers.find(&r.address)
            && member(idx)
            && self.meta.chunks.get(r.handle).is_some()
        {
            let current = self.meta.chunks.get(r.handle).map_or(0, |c| c.version);
            tracing::warn!(chunk = r.handle, server = %r.address, version = r.version, "corrupt replica reported");
            if r.version != 0
                && r.version < current
                && self
                    .meta
                    .chunks
                    .get(r.handle)
                    .is_some_and(|c| c.replicas.contains(idx))
            {
                // About a copy the server held before the one listed now (a report
                // delayed, or sent twice): the listed copy is not the one found corrupt.
            } else if self.try_mend(r.handle, idx) == Mend::No {
                self.discard_corrupt(r.handle, idx);
            }
        }
        self.out.replies.push((id, ok(Resp::Empty(pb::Empty {}))));
    }

    /// `server`'s copy of `h` is corrupt and will not be mended: it stops counting and
    /// is ordered deleted.
    pub(super) fn discard_corrupt(&mut self, h: ChunkHandle, server: ServerIdx) {
        self.found_corrupt_copy(h, server);
        self.copy_corrupt(h, server);
        self.drop_replica(h, server);
        let v = self.meta.chunks.get(h).map_or(0, |c| c.version);
        self.gc.pending_deletes.order(server, h, v, self.now);
    }

    /// Declares silent servers dead: their replicas stop counting.
    pub(super) fn check_liveness(&mut self) {
        for idx in self.servers.expire(self.now, self.cfg.heartbeat_timeout) {
            tracing::warn!(server = %self.servers.get(idx).addr, "chunkserver down");
            self.gc.deleting.remove(&idx);
            self.listed_on_answer.retain(|&(_, s), _| s != idx);
            for h in self.drop_replicas_where(idx, |_| true) {
                self.holder_died(h, idx);
            }
        }
    }

    /// Removes `server` from the replicas of every chunk for which `pred` holds. A full
    /// scan of the chunk table: it happens when a server dies or lost chunks, not per op.
    /// Returns the chunks it was removed from.
    fn drop_replicas_where(
        &mut self,
        server: ServerIdx,
        pred: impl Fn(ChunkHandle) -> bool,
    ) -> Vec<ChunkHandle> {
        let mut dropped = Vec::new();
        for (h, c) in self.meta.chunks.iter_mut() {
            if pred(h) && c.replicas.remove(server) {
                dropped.push(h);
            }
        }
        let s = self.servers.get_mut(server);
        s.replicas -= dropped.len() as u64;
        for &h in &dropped {
            self.repl.check(h);
        }
        dropped
    }

    pub(super) fn add_replica(&mut self, h: ChunkHandle, s: ServerIdx) {
        let c = self
            .meta
            .chunks
            .get_mut(h)
            .expect("adding a replica of a known chunk");
        if c.replicas.insert(s) {
            // Listed on its word: a report it composed before that word lacks the copy.
            if let Some(&seen) = self.answered.get(&s)
                && seen.1 > 0
            {
                self.listed_on_answer.insert((h, s), seen);
            }
            if let Some(found) = self.found_corrupt.get_mut(&h) {
                found.retain(|&x| x != s);
            }
            self.listed_holder(h, s);
            self.servers.get_mut(s).replicas += 1;
            // It may now have more copies than its goal (a server came back after its
            // chunks were copied elsewhere).
            self.repl.check(h);
        }
    }

    pub(super) fn drop_replica(&mut self, h: ChunkHandle, s: ServerIdx) {
        let c = self
            .meta
            .chunks
            .get_mut(h)
            .expect("dropping a replica of a known chunk");
        if c.replicas.remove(s) {
            self.servers.get_mut(s).replicas -= 1;
            self.repl.check(h);
        }
    }
}

/// The name a chunkserver's certificate gives it; empty for an unauthenticated peer (an
/// insecure cluster). `crate::auth` lets no other role send a heartbeat or a report.
pub(crate) fn cert_name(from: &Caller) -> &str {
    match from {
        Caller::Chunkserver { name } => name,
        _ => "",
    }
}
