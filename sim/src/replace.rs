//! Replacing a master replica, as an operator does after losing one: the replica is
//! dead; an admin asks the leader to remove it; its machine comes back on a new disk
//! and joins under a new id (`--join`); an admin asks the leader to add it, and the
//! leader makes it a voter once it holds the log. Each admin request is made from a
//! client node with the client library (`Client::change_members`), asked again until
//! it is answered: a change made already is answered as done.

use std::sync::{Arc, Mutex};

use tessera_core::pb;

use crate::cluster::Cluster;

/// What one admin request came to, once it did: the leader's status.
type Outcome = Arc<Mutex<Option<Result<pb::ReplicaStatus, String>>>>;

pub struct Replacement {
    /// The replica's place in `Cluster::replicas`.
    pub i: usize,
    /// Its group id before, and the one it joins under.
    pub old: u64,
    pub new: u64,
    /// Removed already: now joining.
    adding: bool,
    /// The request in flight, if one is.
    asked: Option<Outcome>,
}

/// Where a replacement stands after a step.
pub enum Step {
    Waiting,
    /// Removed, and the replica started again on a new disk to join.
    Rejoined,
    /// Added as a learner; it is asked again until the leader has made it a voter.
    Learning,
    /// A voter: the group has its three voters up again.
    Done,
    /// A request failed (it is asked again at the next step).
    Failed(String),
}

impl Replacement {
    /// Replaces replica `i` (dead, not leading) with id `new`.
    pub fn new(cluster: &Cluster, i: usize, new: u64) -> Replacement {
        let old = cluster.replicas[i]
            .group_id
            .load(std::sync::atomic::Ordering::Relaxed);
        Replacement {
            i,
            old,
            new,
            adding: false,
            asked: None,
        }
    }

    /// Takes the answer to the request in flight, if it came, and asks the next one.
    pub fn step(&mut self, cluster: &mut Cluster) -> Step {
        let mut step = Step::Waiting;
        if let Some(o) = &self.asked {
            let Some(r) = o.lock().expect("outcome").take() else {
                return Step::Waiting;
            };
            self.asked = None;
            match r {
                Err(e) => step = Step::Failed(e),
                Ok(s) if self.adding && s.voters.contains(&self.new) => return Step::Done,
                Ok(_) if self.adding => step = Step::Learning,
                Ok(_) => {
                    cluster.rejoin_replica(self.i, self.new);
                    self.adding = true;
                    step = Step::Rejoined;
                }
            }
        }
        let req = if self.adding {
            pb::ChangeMembersRequest {
                add: self.new,
                address: cluster.replicas[self.i].addr.clone(),
                remove: 0,
            }
        } else {
            pb::ChangeMembersRequest {
                add: 0,
                address: String::new(),
                remove: self.old,
            }
        };
        let outcome: Outcome = Arc::default();
        let (o, client) = (outcome.clone(), cluster.admin(0));
        cluster.clients[0].0.spawn(async move {
            let r = client.change_members(req).await;
            *o.lock().expect("outcome") = Some(r.map_err(|e| e.to_string()));
        });
        self.asked = Some(outcome);
        step
    }
}

/// After healing: every replica of the group answers, and every one has applied the
/// same voters, which are all the replicas (each under its current id), with no
/// learner left and none still joining or removed. Ok for a single master.
pub async fn group_whole(cluster: &Cluster) -> Result<(), String> {
    use prost::Message;
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    use tessera_core::pb::{master_request::Req, master_response::Resp};
    use tessera_core::runtime::{Runtime, Transport};
    if cluster.replicas.is_empty() {
        return Ok(());
    }
    let mut want: Vec<u64> = cluster
        .replicas
        .iter()
        .map(|r| r.group_id.load(Ordering::Relaxed))
        .collect();
    want.sort_unstable();
    let addrs: Vec<String> = cluster.replicas.iter().map(|r| r.addr.clone()).collect();
    let client = cluster.client(0);
    let asked = cluster.clients[0].0.spawn(async move {
        let (rt, net, _) = client.parts();
        let mut out = Vec::new();
        for a in addrs {
            let req = pb::MasterRequest {
                req: Some(Req::ReplicaStatus(pb::Empty {})),
                ..Default::default()
            };
            let deadline = rt.now() + Duration::from_secs(2);
            let status = match net
                .call(
                    &a,
                    tessera_core::auth::ServerRole::Master,
                    req.encode_to_vec().into(),
                    deadline,
                )
                .await
            {
                Ok(b) => match pb::MasterResponse::decode(b) {
                    Ok(pb::MasterResponse {
                        resp: Some(Resp::ReplicaStatus(s)),
                        ..
                    }) => Ok(s),
                    other => Err(format!("{other:?}")),
                },
                Err(e) => Err(e.to_string()),
            };
            out.push((a, status));
        }
        out
    });
    let answers = asked
        .await
        .map_err(|e| format!("asking the replicas failed: {e}"))?;
    for (a, s) in answers {
        let s = s.map_err(|e| format!("{a}: {e}"))?;
        if s.voters != want
            || !s.learners.is_empty()
            || !matches!(s.role.as_str(), "leader" | "shadow")
        {
            return Err(format!(
                "{a} (id {}) is {} with voters {:?} and learners {:?}; the replicas are {want:?}",
                s.id, s.role, s.voters, s.learners
            ));
        }
    }
    Ok(())
}
