//! No stale replica is listed: every live server the master names as a location of a
//! chunk holds it at the master's version or newer (as that server's own state says).

use tessera_core::master::Master;

use super::versions::Versions;

pub fn check(master: &Master, versions: &Versions) -> Option<String> {
    for (h, c) in master.meta().chunks.iter() {
        for &s in c.replicas.as_slice() {
            if !master.servers().is_alive(s) {
                continue;
            }
            let addr = &master.servers().get(s).addr;
            if let Some(v) = versions.server_version(addr, h)
                && v < c.version
            {
                return Some(format!(
                    "master lists {addr} for chunk {h} at version {}, but it holds version {v}",
                    c.version
                ));
            }
        }
    }
    None
}
