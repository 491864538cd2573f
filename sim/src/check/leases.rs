//! At most one chunkserver believes it is primary for a chunk at any true moment, and no
//! holder's lease outlasts the master's record of it.
//!
//! Each chunkserver's leases are read from its state after every step, converted from its
//! own clock to true time, and compared with every other server's. A dead server's beliefs
//! die with it.
//!
//! The first rule catches a lease run long only when the master happens to grant the next
//! one inside the overlap. The second catches it at once: the master grants the chunk to
//! another server only after the lease it recorded has expired on its clock plus the skew
//! bound, so a holder whose lease ends later than that (in true time) is a second primary
//! waiting to happen, whether or not the next grant comes in time to meet it.

use std::collections::HashMap;

use tessera_core::types::ChunkHandle;

#[derive(Default)]
pub struct LeaseBoard {
    /// Per server: chunk -> lease end in true milliseconds.
    held: HashMap<String, HashMap<ChunkHandle, i64>>,
    /// The master's leases as of its last step, on chunks it is not granting: chunk ->
    /// (primary, the true time the master may next grant it: expiry plus skew bound).
    master: HashMap<ChunkHandle, (String, i64)>,
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
        for (h, until) in &leases {
            if *until > now
                && let Some((primary, free_at)) = self.master.get(h)
                && primary == server
                && until > free_at
            {
                found = Some(format!(
                    "lease on chunk {h} at {server} runs to {until}ms, past the master's \
                     record of it ({free_at}ms with the skew bound)"
                ));
            }
        }
        self.held.insert(server.to_string(), leases);
        found
    }

    /// Records the master's leases after one of its steps: chunk -> (primary, the true
    /// time from which the master would grant the chunk again). Chunks being granted are
    /// left out: the holder may have taken the new lease before the master counts it.
    pub fn master_saw(&mut self, leases: HashMap<ChunkHandle, (String, i64)>) {
        self.master = leases;
    }

    /// Every lease some live server believes valid at `now` (true time), on a chunk
    /// below `below`: (server, chunk, end).
    pub fn valid_below(&self, now: i64, below: ChunkHandle) -> Vec<(String, ChunkHandle, i64)> {
        let mut out: Vec<(String, ChunkHandle, i64)> = self
            .held
            .iter()
            .flat_map(|(s, ls)| {
                ls.iter()
                    .filter(|&(&h, &until)| until > now && h < below)
                    .map(|(&h, &until)| (s.clone(), h, until))
            })
            .collect();
        out.sort();
        out
    }

    pub fn forget(&mut self, server: &str) {
        self.held.remove(server);
    }
}
