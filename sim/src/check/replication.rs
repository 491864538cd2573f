//! For the liveness phase: how many chunks of live files have fewer live replicas than
//! their goal, as the master sees it, computed on its ticks.

use tessera_core::master::Master;

#[derive(Default, Clone, Debug)]
pub struct ReplicationReport {
    pub under_replicated: usize,
    pub missing: usize,
    pub chunks: usize,
    pub at_true_ms: i64,
    /// The first chunk short of its goal, described, for a failing run's output.
    pub example: Option<String>,
    pub example_handle: Option<u64>,
}

impl ReplicationReport {
    pub fn of(master: &Master, at_true_ms: i64) -> ReplicationReport {
        let mut r = ReplicationReport {
            at_true_ms,
            ..Default::default()
        };
        for (_h, c) in master.meta().chunks.iter() {
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
            } else {
                continue;
            }
            if r.example.is_none() {
                let h = _h;
                r.example_handle = Some(h);
                let servers: Vec<String> = c
                    .replicas
                    .as_slice()
                    .iter()
                    .map(|&s| {
                        format!(
                            "{}{}",
                            master.servers().get(s).addr,
                            if master.servers().is_alive(s) {
                                ""
                            } else {
                                "(dead)"
                            }
                        )
                    })
                    .collect();
                let retired: Vec<&String> = master
                    .meta()
                    .retired
                    .keys()
                    .filter(|(x, _)| *x == h)
                    .map(|(_, a)| a)
                    .collect();
                r.example = Some(format!(
                    "chunk {h} v{} goal {} replicas {servers:?} lease {:?} granting {} retired {retired:?}",
                    c.version,
                    c.goal,
                    master.leases().get(h),
                    master.leases().is_granting(h)
                ));
            }
        }
        r
    }
}
