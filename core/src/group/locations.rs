//! Where chunks are, as a master replica knows it without running the master: every
//! chunkserver sends each replica a copy of its heartbeat (GFS's shadow masters poll the
//! chunkservers instead, §5.1.3), and a shadow names, for a chunk, the servers whose
//! latest report holds its newest copy. A shadow orders nothing: it only listens.
//!
//! The leader's master keeps its own table from the heartbeats it answers; this one is
//! kept on every replica, so a replica that stops leading still answers reads.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::master::{Chunk, Meta};
use crate::pb;
use crate::types::{ChunkHandle, HashMap, Time, Version};

/// A report older than this many liveness timeouts is forgotten.
const FORGET_AFTER: u32 = 10;

#[derive(Debug)]
pub struct Locations {
    servers: BTreeMap<String, Report>,
    /// The address each certificate name last reported from: one lookup, not a pass
    /// over every server, per heartbeat.
    by_cert: HashMap<String, String>,
    /// Servers reported at most (the master's registry bound,
    /// `MasterConfig::max_servers`): reports from more addresses are refused, so that
    /// a flood of forged ones cannot grow a replica without bound.
    max: usize,
    /// When reports were last swept for ones to forget.
    swept: Time,
}

#[derive(Debug)]
struct Report {
    id: u64,
    rack: String,
    at: Time,
    capacity: u64,
    used: u64,
    chunks: HashMap<ChunkHandle, Version>,
    /// Its run and capability keys, for a shadow's capabilities (`crate::capability`).
    keys: crate::capability::ServerKeys,
    /// The name in the certificate its report came with (empty: insecure), as the
    /// master's registry binds it (`master/servers.rs`).
    cert: String,
}

impl Locations {
    /// Holding reports of at most `max` servers.
    pub fn new(max: usize) -> Locations {
        Locations {
            servers: BTreeMap::new(),
            by_cert: HashMap::default(),
            max,
            swept: Time::ZERO,
        }
    }

    /// Takes in a heartbeat (a copy or not) that came with certificate name `cert`
    /// (empty: nobody is authenticated). Refused (returns false): a report without an
    /// address, of another cluster's server, of no cluster once this one has its id, of
    /// an address another server or another certificate holds (heard from within
    /// `timeout`), from a certificate that speaks for a server at another address
    /// (heard from within `timeout`: one certificate, one server), or of one address
    /// too many. So a chunkserver's certificate cannot have a shadow name it as the
    /// holder of chunks another server holds.
    pub fn record(
        &mut self,
        now: Time,
        r: &pb::HeartbeatRequest,
        cluster_id: u64,
        timeout: Duration,
        cert: &str,
    ) -> bool {
        if r.address.is_empty() || r.cluster_id != cluster_id {
            return false;
        }
        // Once a liveness timeout, not at every heartbeat: a pass over every server.
        if now >= self.swept + timeout {
            self.swept = now;
            let by_cert = &mut self.by_cert;
            self.servers.retain(|a, s| {
                let keep = now < s.at + timeout * FORGET_AFTER;
                if !keep && by_cert.get(&s.cert) == Some(a) {
                    by_cert.remove(&s.cert);
                }
                keep
            });
        }
        match self.servers.get(&r.address) {
            Some(s) if s.id != r.server_id && now < s.at + timeout => return false,
            Some(s) if s.cert != cert && now < s.at + timeout => return false,
            None if self.servers.len() >= self.max => return false,
            _ => {}
        }
        if !cert.is_empty()
            && let Some(a) = self.by_cert.get(cert)
            && *a != r.address
            && self
                .servers
                .get(a)
                .is_some_and(|s| s.cert == cert && now < s.at + timeout)
        {
            return false;
        }
        if !cert.is_empty() {
            self.by_cert.insert(cert.to_string(), r.address.clone());
        }
        let old = self.servers.insert(
            r.address.clone(),
            Report {
                id: r.server_id,
                rack: r.rack.clone(),
                at: now,
                capacity: r.capacity_bytes,
                used: r.used_bytes,
                chunks: r.chunks.iter().map(|c| (c.handle, c.version)).collect(),
                keys: crate::capability::ServerKeys::from_heartbeat(now, r),
                cert: cert.to_string(),
            },
        );
        // A certificate that spoke for this address before and no longer does.
        if let Some(old) = old
            && old.cert != cert
            && self.by_cert.get(&old.cert) == Some(&r.address)
        {
            self.by_cert.remove(&old.cert);
        }
        true
    }

    /// What the server at `addr` last reported of its capability keys.
    pub fn keys(&self, addr: &str) -> Option<&crate::capability::ServerKeys> {
        self.servers.get(addr).map(|s| &s.keys)
    }

    /// The servers, heard from within `timeout`, that hold chunk `h`'s newest copy: the
    /// highest version reported at or above the chunk's (one above it was granted after
    /// this replica's state; never one above what the log reserved, which no grant
    /// made), and not a copy the log retired at that version.
    pub fn replicas(
        &self,
        now: Time,
        timeout: Duration,
        meta: &Meta,
        h: ChunkHandle,
        c: &Chunk,
    ) -> Vec<String> {
        let held: Vec<(&String, Version)> = self
            .servers
            .iter()
            .filter(|(_, s)| now < s.at + timeout)
            .filter_map(|(a, s)| s.chunks.get(&h).map(|&v| (a, v)))
            .collect();
        newest(meta, h, c, &held)
    }

    /// The cluster as this replica knows it: the namespace's counts and the servers'
    /// latest reports.
    pub fn report(
        &self,
        now: Time,
        timeout: Duration,
        meta: &Meta,
        chunk_size: u64,
    ) -> pb::ClusterReport {
        // Each chunk's reported copies, gathered once (not a pass over every server per
        // chunk): (server, version).
        let mut copies: HashMap<ChunkHandle, Vec<(&String, Version)>> = HashMap::default();
        for (a, s) in self.servers.iter().filter(|(_, s)| now < s.at + timeout) {
            for (&h, &v) in &s.chunks {
                copies.entry(h).or_default().push((a, v));
            }
        }
        let mut r = pb::ClusterReport {
            files: meta.ns.file_count(),
            chunks: meta.chunks.len() as u64,
            chunk_size,
            cluster_id: meta.cluster_id,
            ..Default::default()
        };
        let mut missing = Vec::new();
        let mut under = Vec::new();
        for (h, c) in meta.chunks.iter() {
            if c.version == 0 {
                continue;
            }
            let live = newest(meta, h, c, copies.get(&h).map_or(&[][..], |v| &v[..])).len();
            if live == 0 {
                r.missing += 1;
                missing.push(h);
            } else if live < usize::from(c.goal) {
                r.under_replicated += 1;
                under.push(h);
            } else if live > usize::from(c.goal) {
                r.over_replicated += 1;
            }
        }
        r.troubled = missing
            .into_iter()
            .chain(under)
            .take(crate::master::TROUBLED_LISTED)
            .collect();
        for (addr, s) in &self.servers {
            r.servers.push(pb::ServerReport {
                address: addr.clone(),
                rack: s.rack.clone(),
                alive: now < s.at + timeout,
                capacity_bytes: s.capacity,
                used_bytes: s.used,
                chunks: s.chunks.len() as u64,
                last_heartbeat_ms_ago: now.saturating_sub(s.at).as_millis() as u64,
                clones_in_flight: 0,
                server_id: s.id,
            });
        }
        r
    }
}

/// Of the copies `held` of chunk `h`, the servers that hold its newest the log allows
/// (see `Locations::replicas`).
fn newest(meta: &Meta, h: ChunkHandle, c: &Chunk, held: &[(&String, Version)]) -> Vec<String> {
    let ceiling = meta
        .reserved
        .get(&h)
        .map_or(c.version, |&r| r.max(c.version));
    let ok: Vec<(&String, Version)> = held
        .iter()
        .copied()
        .filter(|&(_, v)| v >= c.version && v <= ceiling)
        .filter(|&(a, v)| meta.retired.get(&(h, a.clone())) != Some(&v))
        .collect();
    let top = ok.iter().map(|&(_, v)| v).max().unwrap_or(0);
    ok.into_iter()
        .filter(|&(_, v)| v == top)
        .map(|(a, _)| a.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::log_record::Op;

    fn rec(op: Op) -> pb::LogRecord {
        pb::LogRecord {
            op: Some(op),
            ..Default::default()
        }
    }

    fn heartbeat(addr: &str, chunks: &[(u64, u64)]) -> pb::HeartbeatRequest {
        pb::HeartbeatRequest {
            address: addr.into(),
            chunks: chunks
                .iter()
                .map(|&(handle, version)| pb::ChunkReport {
                    handle,
                    version,
                    length: 0,
                })
                .collect(),
            cluster_id: 9,
            server_id: addr.len() as u64,
            ..Default::default()
        }
    }

    /// A shadow names the servers that hold a chunk's newest copy the log allows, heard
    /// from lately: not older copies, not a version no grant reserved, not a copy the
    /// log retired, not a server gone quiet, not another cluster's.
    #[test]
    fn a_shadow_names_the_newest_copies_it_heard_of() {
        let mut meta = Meta::new(1024);
        for op in [
            Op::ClusterId(pb::ClusterIdOp {
                root: None,
                cluster_id: 9,
            }),
            Op::Create(pb::CreateOp {
                perms: None,
                path: "/f".into(),
                replication: 3,
                chunk_size: 1024,
            }),
            Op::AddChunk(pb::AddChunkOp {
                path: "/f".into(),
                handle: 1,
            }),
            Op::SetVersion(pb::SetVersionOp {
                handle: 1,
                version: 2,
                ..Default::default()
            }),
            Op::ReserveVersion(pb::ReserveVersionOp {
                handle: 1,
                version: 3,
            }),
            Op::RetireReplica(pb::RetireReplicaOp {
                handle: 1,
                address: "e".into(),
                version: 2,
                lift: false,
            }),
        ] {
            meta.apply(&rec(op)).unwrap();
        }
        let timeout = Duration::from_secs(3);
        let mut l = Locations::new(16_384);
        let t = Time(10_000);
        for (a, v) in [("a", 2), ("b", 2), ("c", 1), ("d", 7), ("e", 2)] {
            assert!(l.record(t, &heartbeat(a, &[(1, v)]), 9, timeout, ""));
        }
        let mut other = heartbeat("x", &[(1, 2)]);
        other.cluster_id = 8;
        assert!(
            !l.record(t, &other, 9, timeout, ""),
            "another cluster's server"
        );
        other.cluster_id = 0;
        assert!(
            !l.record(t, &other, 9, timeout, ""),
            "a server of no cluster"
        );
        let mut usurper = heartbeat("a", &[(1, 3)]);
        usurper.server_id = 77;
        assert!(
            !l.record(t, &usurper, 9, timeout, ""),
            "an address another server holds"
        );
        let c = meta.chunks.get(1).unwrap().clone();
        assert_eq!(l.replicas(t, timeout, &meta, 1, &c), ["a", "b"]);
        // A copy at the reserved version was granted after this state: it is the
        // newest, and the only one named.
        l.record(t, &heartbeat("b", &[(1, 3)]), 9, timeout, "");
        assert_eq!(l.replicas(t, timeout, &meta, 1, &c), ["b"]);
        // Quiet servers are not named; a server heard again is.
        let later = t + timeout;
        assert!(l.replicas(later, timeout, &meta, 1, &c).is_empty());
        l.record(later, &heartbeat("a", &[(1, 2)]), 9, timeout, "");
        assert_eq!(l.replicas(later, timeout, &meta, 1, &c), ["a"]);
        let r = l.report(later, timeout, &meta, 1024);
        assert_eq!(
            (r.files, r.chunks, r.under_replicated, r.cluster_id),
            (1, 1, 1, 9)
        );
        assert_eq!(r.servers.iter().filter(|s| s.alive).count(), 1);
    }

    /// A shadow binds a server's address to the certificate its reports came with, as
    /// the master does: another certificate cannot report chunks at that address while
    /// it is heard from, nor one certificate speak for two addresses at once.
    #[test]
    fn a_report_is_taken_only_from_the_certificate_that_holds_its_address() {
        let timeout = Duration::from_secs(3);
        let mut l = Locations::new(16_384);
        let t = Time(10_000);
        assert!(l.record(t, &heartbeat("a", &[(1, 2)]), 9, timeout, "host-a"));
        assert!(
            !l.record(t, &heartbeat("a", &[(2, 2)]), 9, timeout, "host-b"),
            "another certificate reported for a live server's address"
        );
        assert!(
            !l.record(t, &heartbeat("b", &[(1, 2)]), 9, timeout, "host-a"),
            "one certificate reported for a second address"
        );
        assert!(l.record(t, &heartbeat("b", &[(1, 2)]), 9, timeout, "host-b"));
        // Silent past the timeout, an address and a certificate are free again.
        let later = t + timeout;
        assert!(l.record(later, &heartbeat("a", &[(1, 2)]), 9, timeout, "host-c"));
        assert!(l.record(later, &heartbeat("c", &[(1, 2)]), 9, timeout, "host-b"));
        // The certificate whose address another took speaks for a new one at once.
        assert!(l.record(later, &heartbeat("z", &[(1, 2)]), 9, timeout, "host-a"));
        assert!(
            !l.record(later, &heartbeat("y", &[(1, 2)]), 9, timeout, "host-a"),
            "one certificate reported for a second address"
        );
    }

    /// A replica holds reports of no more servers than its bound; servers silent for
    /// long are forgotten, and make room.
    #[test]
    fn a_replica_holds_reports_of_few_enough_servers() {
        let timeout = Duration::from_secs(3);
        let mut l = Locations::new(3);
        let t = Time(10_000);
        for a in ["a", "b", "c"] {
            assert!(l.record(t, &heartbeat(a, &[(1, 2)]), 9, timeout, a));
        }
        assert!(
            !l.record(t, &heartbeat("d", &[(1, 2)]), 9, timeout, "d"),
            "a report past the bound"
        );
        assert!(l.record(t, &heartbeat("a", &[(1, 3)]), 9, timeout, "a"));
        let much_later = t + timeout * (FORGET_AFTER + 1);
        assert!(l.record(much_later, &heartbeat("d", &[(1, 2)]), 9, timeout, "d"));
        assert_eq!((l.servers.len(), l.by_cert.len()), (1, 1));
    }
}
