//! Churn: servers a master declares dead and chunks it orders cloned. Under faults both
//! are how the cluster heals, and are counted (`declared_dead`, `clones_ordered` in the
//! run's faults); in a run without faults every server heartbeats and every chunk was
//! made whole, so either is a failure: a liveness timeout too short for the heartbeats,
//! or a replication count that takes healthy chunks for short, churns data for nothing
//! and passes every check of the data. The one exception is a chunk whose copy the run
//! itself damaged on purpose (the `scrub` scenario flips bits for the scrubber to find):
//! its clone is the repair, and is allowed exactly for that chunk.

use std::collections::{BTreeSet, HashMap};

use tessera_core::master::{Effects, Master};
use tessera_core::pb::{self, chunk_request::Req};

#[derive(Default)]
pub struct Churn {
    /// The run injects no fault.
    pub fault_free: bool,
    /// The servers each master node held live after its last step.
    live: HashMap<String, BTreeSet<String>>,
    pub declared_dead: u64,
    pub clones_ordered: u64,
}

impl Churn {
    /// A master's step: who it holds live now, and the clones it ordered.
    /// `damaged` says whether the run damaged a copy of a chunk on purpose.
    pub fn master_step(
        &mut self,
        node: &str,
        master: &Master,
        effects: &Effects,
        damaged: impl Fn(u64) -> bool,
    ) -> Vec<String> {
        let mut found = Vec::new();
        let now: BTreeSet<String> = master
            .servers()
            .live()
            .map(|(_, s)| s.addr.clone())
            .collect();
        let before = self.live.insert(node.to_string(), now.clone());
        for gone in before.iter().flat_map(|b| b.difference(&now)) {
            self.declared_dead += 1;
            if self.fault_free {
                found.push(format!(
                    "{node} declared {gone} dead in a run without faults: it heartbeats \
                     all along"
                ));
            }
        }
        for call in &effects.calls {
            if let pb::ChunkRequest {
                req: Some(Req::Clone(cl)),
            } = &call.req
            {
                self.clones_ordered += 1;
                if self.fault_free && !damaged(cl.handle) {
                    found.push(format!(
                        "{node} ordered chunk {} cloned to {} in a run without faults: \
                         every chunk was made whole",
                        cl.handle, call.to
                    ));
                }
            }
        }
        found
    }
}
