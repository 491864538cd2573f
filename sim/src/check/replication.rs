//! For the liveness phase: how many chunks of live files have fewer live replicas than
//! their goal, as the master sees it, computed on its ticks.

use tessera_core::master::Master;

#[derive(Default, Clone, Copy, Debug)]
pub struct ReplicationReport {
    pub under_replicated: usize,
    pub missing: usize,
    pub chunks: usize,
    pub at_true_ms: i64,
}

impl ReplicationReport {
    pub fn of(master: &Master, at_true_ms: i64) -> ReplicationReport {
        let mut r = ReplicationReport {
            at_true_ms,
            ..Default::default()
        };
        for (_, c) in master.meta().chunks.iter() {
            if c.version == 0 {
                continue; // allocated, never written
            }
            r.chunks += 1;
            let live = c
                .replicas
                .as_slice()
                .iter()
                .filter(|&&s| master.servers().is_alive(s))
                .count();
            if live == 0 {
                r.missing += 1;
            } else if live < usize::from(c.goal) {
                r.under_replicated += 1;
            }
        }
        r
    }
}
