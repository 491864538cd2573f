//! What the chunkserver's structures promise each other, checked after every step by the
//! simulator (and the fuzzer); the cheapest also as assertions where it runs.

use super::{Chunkserver, Job};

impl Chunkserver {
    /// Checks every promise the server's structures make each other; the first broken
    /// one is the error. Linear in what the server holds: for tests, not every step in
    /// production.
    pub fn check_invariants(&self) -> Result<(), String> {
        let pushed: u64 = self.pushed.values().map(|b| b.total).sum();
        if pushed != self.pushed_bytes {
            return Err(format!(
                "pushed buffers hold {pushed} bytes but {} are counted",
                self.pushed_bytes
            ));
        }
        let used = self.used_bytes_summed();
        if used != self.used_bytes() {
            return Err(format!(
                "the chunks held are {used} bytes but {} are counted",
                self.used_bytes()
            ));
        }
        let queued = self
            .queues
            .values()
            .flatten()
            .filter(|j| matches!(j, Job::Request(..)))
            .count();
        if queued != self.queued_requests {
            return Err(format!(
                "{queued} requests queued but {} counted",
                self.queued_requests
            ));
        }
        if self.queued_requests > self.cfg.max_queued {
            return Err(format!(
                "{} requests queued, over the bound of {}",
                self.queued_requests, self.cfg.max_queued
            ));
        }
        for h in self.forwards.keys() {
            if !self.busy.contains(h) {
                return Err(format!(
                    "chunk {h} has a local write as primary but no job running"
                ));
            }
        }
        Ok(())
    }
}
