//! What the master's structures promise each other, checked after every step by the
//! simulator (and the fuzzer); the cheapest also as assertions in `Master::handle`.

use super::Master;
use super::namespace::Node;

impl Master {
    /// Checks every promise the master's structures make each other; the first broken
    /// one is the error. Linear in the namespace and chunk table: for tests, not every
    /// step in production.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.check_queues()?;
        self.check_tables()
    }

    /// The promises of the log position, held replies and queued requests: cheap.
    pub fn check_queues(&self) -> Result<(), String> {
        if self.synced_seq > self.last_seq {
            return Err(format!(
                "log synced through {} but written only through {}",
                self.synced_seq, self.last_seq
            ));
        }
        if let Some(&seq) = self.held.keys().next()
            && seq <= self.synced_seq
        {
            return Err(format!(
                "replies held for record {seq}, which is durable (through {})",
                self.synced_seq
            ));
        }
        if self.queued.len() > self.cfg.max_queued {
            return Err(format!(
                "{} requests queued, over the bound of {}",
                self.queued.len(),
                self.cfg.max_queued
            ));
        }
        Ok(())
    }

    /// The promises of the namespace, chunk table and leases to each other: linear in
    /// their size.
    pub fn check_tables(&self) -> Result<(), String> {
        let meta = &self.meta;
        for (path, node) in meta.ns.walk() {
            if let Node::File(f) = node {
                for &h in f.chunks.iter() {
                    if meta.chunks.get(h).is_none() {
                        return Err(format!("{path} names chunk {h}, which is not in the table"));
                    }
                }
            }
        }
        for (h, l) in self.leases.valid(self.now) {
            let Some(c) = meta.chunks.get(h) else {
                continue;
            };
            if l.version > c.version {
                return Err(format!(
                    "lease on chunk {h} at version {} above the chunk's {}",
                    l.version, c.version
                ));
            }
            if !l.replicas.contains(&l.primary) {
                return Err(format!(
                    "lease on chunk {h}: its primary is not among its replicas"
                ));
            }
            // A server named twice holds one copy where the lease counts two: every write
            // would be acknowledged on fewer copies than the goal.
            for (i, s) in l.replicas.iter().enumerate() {
                if l.replicas[..i].contains(s) {
                    return Err(format!("lease on chunk {h} names server {s} twice"));
                }
            }
        }
        for (h, c) in meta.chunks.iter() {
            let r = c.replicas.as_slice();
            for (i, s) in r.iter().enumerate() {
                if r[..i].contains(s) {
                    return Err(format!("chunk {h} lists server {s} twice"));
                }
            }
        }
        self.check_fallbacks()
    }
}
