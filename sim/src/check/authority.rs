//! A master group's read authority, judged in true time (`core/src/group/lease.rs`).
//!
//! A leader answers a read (a listing, a stat, chunk locations) without `stale_ok` only
//! while no other replica can have been elected: past that, a successor may commit what
//! the deposed leader never sees, and its answers would miss operations already
//! acknowledged to some client. Two claims, checked at every replica step rather than
//! through a client's history (clients seldom ask a deposed leader at the moment a
//! successor commits something they then read):
//!
//! 1. The authority a leader of term T computes, turned into true time through its own
//!    clock (skewed and drifting within the bound the group assumes), ends no later than
//!    the moment a leader of any later term is first seen leading.
//! 2. A read answered Ok by a leader (not a shadow's answer) arrived while no leader of a
//!    later term had been elected: the state it answers from then missed nothing a
//!    successor committed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tessera_core::group::Effects;
use tessera_core::pb::{self, master_request::Req};

#[derive(Default)]
pub struct Authority {
    /// When each term's leader was first seen leading, in true ms, and which node.
    elected: BTreeMap<u64, (i64, String)>,
    /// The latest true ms each term's leader took its authority to last to.
    until: BTreeMap<u64, i64>,
    /// Reads without `stale_ok` a leader took, by node and request id: its term and the
    /// true ms they arrived.
    reads: HashMap<(String, u64), (u64, i64)>,
    /// (term, later term) pairs already reported, so a run reports each once.
    reported: BTreeSet<(u64, u64)>,
    /// Reads a leader answered Ok, each judged against the elections before it.
    pub reads_judged: u64,
    /// Leaders' authorities judged against a later election.
    pub authorities_judged: u64,
    /// Chunk locations a leader answered since last taken: when the read arrived (true
    /// ms), and each chunk's handle and version.
    pub located: Vec<(i64, Vec<(u64, u64)>)>,
    /// Chunks of those answers judged against the writes acknowledged before.
    pub located_judged: u64,
}

/// Whether `req` asks for a view of the namespace or of chunks, as a leader answers
/// only with authority.
fn is_read(req: &pb::MasterRequest) -> bool {
    !req.stale_ok
        && matches!(
            req.req,
            Some(Req::List(_) | Req::Stat(_) | Req::GetChunks(_))
        )
}

impl Authority {
    /// A step of replica `node` at true ms `t`: `leading` is its term while it leads,
    /// `authority` the end of its authority in true ms (None: none known).
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        node: &str,
        t: i64,
        term: u64,
        leading: bool,
        authority: Option<i64>,
        request: Option<(u64, &pb::MasterRequest)>,
        effects: &Effects,
    ) -> Vec<String> {
        let mut found = Vec::new();
        if leading && !self.elected.contains_key(&term) {
            self.elected.insert(term, (t, node.to_string()));
            // Every earlier leader's authority, against this election.
            let earlier: Vec<(u64, i64)> =
                self.until.range(..term).map(|(&o, &u)| (o, u)).collect();
            for (old, until) in earlier {
                self.judge(old, until, term, &mut found);
            }
        }
        if leading && let Some(a) = authority {
            let u = self.until.entry(term).or_insert(a);
            if a >= *u {
                *u = a;
                // This leader's authority, against every later election.
                let later: Vec<u64> = self.elected.range(term + 1..).map(|(&n, _)| n).collect();
                for new in later {
                    self.judge(term, a, new, &mut found);
                }
            }
        }
        if let Some((id, req)) = request {
            let key = (node.to_string(), id);
            // A request id is a node's own, and a restarted node counts from the start.
            self.reads.remove(&key);
            if leading && is_read(req) {
                self.reads.insert(key, (term, t));
            }
        }
        for (id, resp) in &effects.replies {
            let Some((term, arrived)) = self.reads.remove(&(node.to_string(), *id)) else {
                continue;
            };
            if resp.error.is_some() || resp.shadow.is_some() {
                continue;
            }
            self.reads_judged += 1;
            if let Some(pb::master_response::Resp::GetChunks(g)) = &resp.resp {
                let chunks = g.chunks.iter().map(|l| (l.handle, l.version)).collect();
                self.located.push((arrived, chunks));
            }
            let later = self
                .elected
                .range(term + 1..)
                .find(|(_, (at, _))| *at < arrived);
            if let Some((new, (at, who))) = later {
                found.push(format!(
                    "{node}, leader of term {term}, answered a read (request {id}) that arrived \
                     at {arrived} ms (true time), after {who} was seen leading term {new} at \
                     {at} ms: a read without stale_ok answered from a deposed leader's state"
                ));
            }
        }
        found
    }

    /// The authority of term `old`'s leader, to `until`, against term `new`'s election.
    fn judge(&mut self, old: u64, until: i64, new: u64, found: &mut Vec<String>) {
        let Some((at, who)) = self.elected.get(&new) else {
            return;
        };
        self.authorities_judged += 1;
        if until > *at && self.reported.insert((old, new)) {
            found.push(format!(
                "the leader of term {old} took its authority to last to {until} ms (true \
                 time), past {at} ms, when {who} was seen leading term {new}: it could \
                 answer reads from a state the new leader had moved past"
            ));
        }
    }
}
