//! No stale or missing replica is listed: every live server the master names as a
//! location of a chunk holds it at the master's version or newer (as that server's own
//! state says), and holds it at all, but for a grace period: a server that lost a copy
//! (a file its disk lost while it was down, a copy it dropped as corrupt) is listed until
//! its next report reaches the master, a heartbeat or two, more if one is lost; and the
//! last copy of a version the master ordered mended, until the mend ends.

use std::collections::HashMap;

use tessera_core::master::Master;
use tessera_core::types::ChunkHandle;

use super::versions::Versions;

/// Listed copies a live server was seen not to hold, since when (true ms).
#[derive(Default)]
pub struct Missing {
    since: HashMap<(String, ChunkHandle), i64>,
    /// How long a server may stay listed for a copy it does not hold (true ms): set
    /// from the run's heartbeat and RPC timings.
    pub grace_ms: i64,
}

impl Missing {
    /// Whether no listed copy is being timed as missing: then only a change of the master
    /// or of what servers hold can make [`check`] find something new.
    pub fn quiet(&self) -> bool {
        self.since.is_empty()
    }
}

pub fn check(
    master: &Master,
    versions: &Versions,
    missing: &mut Missing,
    t: i64,
) -> Option<String> {
    let mut found = None;
    let mut seen = HashMap::new();
    for (h, c) in master.meta().chunks.iter() {
        for &s in c.replicas.as_slice() {
            if !master.servers().is_alive(s) {
                continue;
            }
            let addr = &master.servers().get(s).addr;
            match versions.server_version(addr, h) {
                Some(v) if v < c.version => {
                    return Some(format!(
                        "master lists {addr} for chunk {h} at version {}, but it holds version {v}",
                        c.version
                    ));
                }
                // The last copy of a version, reported corrupt and ordered mended, stays
                // listed by design until the mend ends (`master::mend`); its answer may
                // be lost, and then the master waits out the order's deadline.
                None if master.is_mending(h, s) => {}
                None if versions.server_known(addr) && missing.grace_ms > 0 => {
                    let key = (addr.clone(), h);
                    let since = missing.since.get(&key).copied().unwrap_or(t);
                    if found.is_none() && t - since > missing.grace_ms {
                        found = Some(format!(
                            "master lists {addr} for chunk {h}, which it has not held for {} ms",
                            t - since
                        ));
                    }
                    seen.insert(key, since);
                }
                _ => {}
            }
        }
    }
    missing.since = seen;
    found
}
