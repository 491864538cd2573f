//! At most one chunkserver believes it is primary for a chunk at any true moment.
//!
//! Each chunkserver's leases are read from its state after every step, converted from its
//! own clock to true time, and compared with every other server's. A dead server's beliefs
//! die with it.

use std::collections::HashMap;

use tessera_core::types::ChunkHandle;

#[derive(Default)]
pub struct LeaseBoard {
    /// Per server: chunk -> lease end in true milliseconds.
    held: HashMap<String, HashMap<ChunkHandle, i64>>,
}

impl LeaseBoard {
    /// Records `server`'s current leases; returns a violation if another live server
    /// holds one of the same chunks at `now` (true time).
    pub fn update(
        &mut self,
        server: &str,
        now: i64,
        leases: HashMap<ChunkHandle, i64>,
    ) -> Option<String> {
        let mut found = None;
        for (h, until) in &leases {
            if *until <= now {
                continue;
            }
            for (other, theirs) in &self.held {
                if other != server
                    && let Some(t) = theirs.get(h)
                    && *t > now
                {
                    found = Some(format!(
                        "two primaries for chunk {h}: {server} until {until}ms and {other} until {t}ms"
                    ));
                }
            }
        }
        self.held.insert(server.to_string(), leases);
        found
    }

    pub fn forget(&mut self, server: &str) {
        self.held.remove(server);
    }
}
