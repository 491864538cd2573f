//! Who is in the master group, as Tessera keeps it beside raft-rs's `ConfState`: each
//! member's address, and the ids that have left for good.
//!
//! A membership change is one raft entry (raft-rs's `ConfChange`, one replica at a
//! time, so the old and new majorities always overlap). A replica joins as a learner:
//! it takes the log, and counts for no majority, until the leader sees it hold
//! everything committed and makes it a voter with a second change. A replica that leaves
//! is retired: its id never joins again, since a replica that comes back under an old id
//! may lack what it once acknowledged or voted for.
//!
//! Each change's entry carries the address of the replica it adds, so every replica
//! (and every snapshot, through the checkpoint's `group_members`) learns addresses from
//! the log itself, not from its command line.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use raft::eraftpb as rp;

use crate::error::FsError;
use crate::master::{self, RequestId};
use crate::pb::{self, master_response::Resp};
use raft::StateRole;

/// The longest address a change may carry.
const MAX_ADDRESS: usize = 256;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    /// Every voter's and learner's address.
    pub addresses: BTreeMap<u64, String>,
    /// Ids that have left the group.
    pub retired: BTreeSet<u64>,
}

/// One membership change, as an entry's data says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Joins as a learner, at this address.
    AddLearner(u64, String),
    /// A learner becomes a voter.
    Promote(u64, String),
    Remove(u64),
}

impl Change {
    pub fn id(&self) -> u64 {
        match self {
            Change::AddLearner(id, _) | Change::Promote(id, _) | Change::Remove(id) => *id,
        }
    }

    /// raft-rs's form, to propose or apply.
    pub fn to_raft(&self) -> rp::ConfChange {
        let (t, id, addr) = match self {
            Change::AddLearner(id, a) => (rp::ConfChangeType::AddLearnerNode, *id, a.as_str()),
            Change::Promote(id, a) => (rp::ConfChangeType::AddNode, *id, a.as_str()),
            Change::Remove(id) => (rp::ConfChangeType::RemoveNode, *id, ""),
        };
        rp::ConfChange {
            change_type: t,
            node_id: id,
            context: bytes::Bytes::copy_from_slice(addr.as_bytes()),
            ..Default::default()
        }
    }

    /// The change a membership entry's data holds (raft-rs writes it with its own
    /// protobuf code; Tessera reads it through its own mirror, and checks it).
    pub fn decode(data: &[u8]) -> Result<Change, String> {
        let cc = pb::RaftConfChange::decode(data)
            .map_err(|e| format!("a membership change does not decode: {e}"))?;
        if cc.node_id == 0 {
            return Err("a membership change names replica 0".into());
        }
        let address = || -> Result<String, String> {
            let a = std::str::from_utf8(&cc.context)
                .map_err(|_| "a replica's address is not UTF-8".to_string())?;
            check_address(a)?;
            Ok(a.to_string())
        };
        match cc.change_type {
            0 => Ok(Change::Promote(cc.node_id, address()?)),
            1 if cc.context.is_empty() => Ok(Change::Remove(cc.node_id)),
            2 => Ok(Change::AddLearner(cc.node_id, address()?)),
            t => Err(format!(
                "membership change of kind {t} is not one Tessera makes"
            )),
        }
    }
}

/// One replica's address, as HOST:PORT.
pub fn check_address(a: &str) -> Result<(), String> {
    let port = a.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
    if a.len() > MAX_ADDRESS
        || a.contains([',', ' ', '='])
        || !matches!(port, Some((h, Ok(_))) if !h.is_empty())
    {
        return Err(format!("{a:?} is not one replica's address (HOST:PORT)"));
    }
    Ok(())
}

impl Members {
    /// A new group's: these members, none retired.
    pub fn of(addresses: BTreeMap<u64, String>) -> Members {
        Members {
            addresses,
            retired: BTreeSet::new(),
        }
    }

    /// Whether `change` may be made to a group of voters and learners `conf` that these
    /// members describe. The leader asks before proposing; every replica asks again
    /// before applying a committed one (a change that fails here is a bug or a forgery,
    /// and is not applied).
    pub fn check(&self, conf: &rp::ConfState, change: &Change) -> Result<(), String> {
        if conf.voters.is_empty() {
            return Err("no members are known here yet".into());
        }
        let voter = |id| conf.voters.contains(&id);
        let learner = |id| conf.learners.contains(&id);
        match change {
            Change::AddLearner(id, addr) => {
                if self.retired.contains(id) {
                    return Err(format!(
                        "replica {id} has left the group before; a replica never joins again \
                         under an old id: give it a new one"
                    ));
                }
                if voter(*id) || learner(*id) {
                    return Err(format!("replica {id} is already a member"));
                }
                if let Some((other, _)) = self.addresses.iter().find(|(_, a)| *a == addr) {
                    return Err(format!("replica {other} already has address {addr}"));
                }
                Ok(())
            }
            Change::Promote(id, addr) => {
                if !learner(*id) {
                    return Err(format!("replica {id} is not a learner"));
                }
                if self.addresses.get(id) != Some(addr) {
                    return Err(format!("replica {id} is not at {addr}"));
                }
                Ok(())
            }
            Change::Remove(id) => {
                if !voter(*id) && !learner(*id) {
                    return Err(format!("replica {id} is not a member"));
                }
                if voter(*id) && conf.voters.len() == 1 {
                    return Err("the group's last voter cannot leave".into());
                }
                Ok(())
            }
        }
    }

    /// Takes a committed change (checked).
    pub fn apply(&mut self, change: &Change) {
        match change {
            Change::AddLearner(id, a) | Change::Promote(id, a) => {
                self.addresses.insert(*id, a.clone());
            }
            Change::Remove(id) => {
                self.addresses.remove(id);
                self.retired.insert(*id);
            }
        }
    }

    /// Every voter and learner of `conf` has an address here, and none is retired.
    pub fn covers(&self, conf: &rp::ConfState) -> Result<(), String> {
        for id in conf.voters.iter().chain(conf.learners.iter()) {
            if !self.addresses.contains_key(id) {
                return Err(format!("member {id} has no address"));
            }
            if self.retired.contains(id) {
                return Err(format!("member {id} is retired"));
            }
        }
        if !conf.voters_outgoing.is_empty() || !conf.learners_next.is_empty() {
            return Err("a joint configuration, which Tessera never makes".into());
        }
        Ok(())
    }
}

// ---- the replica's side -------------------------------------------------------------

impl super::Replica {
    /// An admin's request to add or remove a member: the leader proposes it, and answers
    /// once it is applied (`apply_change`).
    pub(super) fn on_change_members(&mut self, id: RequestId, c: pb::ChangeMembersRequest) {
        match self.propose_change(&c) {
            Ok(Some(index)) => {
                self.conf_asked.insert(index, id);
            }
            Ok(None) => {
                let status = self.status_pb();
                self.out
                    .replies
                    .push((id, master::ok(Resp::ReplicaStatus(status))));
            }
            Err(e) => self.out.replies.push((id, master::err(e))),
        }
    }

    /// Proposes the change asked for: the index of its entry, or None when it is made
    /// already (an admin asking again after a lost answer).
    fn propose_change(&mut self, c: &pb::ChangeMembersRequest) -> Result<Option<u64>, FsError> {
        let change = match (c.add, c.remove) {
            (0, 0) => {
                return Err(FsError::InvalidArgument(
                    "give the id (1 and up) of the replica to add or to remove".into(),
                ));
            }
            (1.., 1..) => {
                return Err(FsError::InvalidArgument(
                    "a membership change adds one replica or removes one, not both".into(),
                ));
            }
            (add, 0) => Change::AddLearner(add, c.address.trim().to_string()),
            (0, remove) => Change::Remove(remove),
        };
        if self.master.is_none() {
            return Err(FsError::NotLeader(self.leader_addr()));
        }
        let conf = self.node.raft.prs().conf().to_conf_state();
        let members = self.node.store().members();
        let member = |id: &u64| conf.voters.contains(id) || conf.learners.contains(id);
        match &change {
            Change::AddLearner(id, a) if member(id) && members.addresses.get(id) == Some(a) => {
                return Ok(None);
            }
            Change::Remove(id) if !member(id) && members.retired.contains(id) => {
                return Ok(None);
            }
            Change::Remove(id) if *id == self.cfg.id => {
                return Err(FsError::InvalidArgument(format!(
                    "replica {id} leads the group: stop it so that another takes over, \
                     then ask the new leader to remove it"
                )));
            }
            _ => {}
        }
        members
            .check(&conf, &change)
            .map_err(FsError::InvalidArgument)?;
        if let Change::AddLearner(_, a) = &change {
            check_address(a).map_err(FsError::InvalidArgument)?;
        }
        if let Change::Remove(id) = &change
            && conf.voters.contains(id)
        {
            // The voters left must still reach a majority of themselves, or the group
            // stops: count those the leader hears from.
            let left: Vec<u64> = conf.voters.iter().copied().filter(|v| v != id).collect();
            let heard = left.iter().filter(|&&v| self.answers(v)).count();
            if heard <= left.len() / 2 {
                return Err(FsError::InvalidArgument(format!(
                    "removing replica {id} would leave {} voters of which only {heard} \
                     answer the leader: the group would stop. Bring the others back first",
                    left.len()
                )));
            }
        }
        if self.node.raft.has_pending_conf() {
            return Err(FsError::Unavailable(
                "another membership change is under way; ask again shortly".into(),
            ));
        }
        self.node
            .propose_conf_change(vec![], change.to_raft())
            .map_err(|e| FsError::Unavailable(format!("the change was not proposed: {e}")))?;
        let index = self.node.raft.raft_log.last_index();
        tracing::info!(?change, index, "membership change proposed");
        Ok(Some(index))
    }

    /// Applies a committed membership entry: raft-rs's configuration, the addresses, the
    /// store, and the admin's answer. A change that does not fit the group as it stands
    /// is applied by no replica (each checks the same entry against the same state).
    pub(super) fn apply_change(&mut self, e: &rp::Entry, writes: &mut Vec<super::Write>) {
        let asked = self.conf_asked.remove(&e.index);
        if e.index <= self.node.store().changed_at() {
            // Applied before a restart: the store's configuration holds it.
            return;
        }
        let change = Change::decode(&e.data)
            .expect("membership entries are checked before raft-rs takes them");
        let conf = self.node.raft.prs().conf().to_conf_state();
        let mut members = self.node.store().members().clone();
        if let Err(why) = members.check(&conf, &change) {
            tracing::warn!(index = e.index, ?change, %why, "a committed membership change not applied");
            if let Some(id) = asked {
                self.out
                    .replies
                    .push((id, master::err(FsError::InvalidArgument(why))));
            }
            return;
        }
        let cs = self
            .node
            .apply_conf_change(&change.to_raft())
            .unwrap_or_else(|err| panic!("a checked change {change:?} was refused: {err}"));
        members.apply(&change);
        if matches!(change, Change::AddLearner(..)) {
            // The new replica starts from a snapshot: it names the members.
            self.compact_now = true;
        }
        members
            .covers(&cs)
            .unwrap_or_else(|err| panic!("after {change:?}: {err}"));
        tracing::info!(index = e.index, ?change, voters = ?cs.voters, learners = ?cs.learners, "membership changed");
        self.node.mut_store().set_conf(e.index, cs, members, writes);
        self.update_book();
        if change == Change::Remove(self.cfg.id) && self.node.raft.state == StateRole::Leader {
            // A leader that left stops leading (raft-rs would lead on); the others
            // elect one of themselves.
            self.stop_master();
            let term = self.node.raft.term;
            self.node.raft.become_follower(term, raft::INVALID_ID);
        }
        if let Some(id) = asked {
            let status = self.status_pb();
            self.out
                .replies
                .push((id, master::ok(Resp::ReplicaStatus(status))));
        }
    }

    /// The leader makes a learner that holds everything committed a voter (one at a
    /// time): until then it counts for no majority, so a replica still copying the log
    /// cannot stall the group or help elect a leader that lacks entries.
    pub(super) fn promote_learners(&mut self) {
        let raft = &self.node.raft;
        if self.master.is_none() || raft.has_pending_conf() {
            return;
        }
        let committed = raft.raft_log.committed;
        let ready = raft
            .prs()
            .conf()
            .learners()
            .iter()
            .copied()
            .filter(|&l| {
                self.answers(l) && raft.prs().get(l).is_some_and(|p| p.matched >= committed)
            })
            .min();
        let Some(l) = ready else { return };
        let Some(addr) = self.node.store().members().addresses.get(&l).cloned() else {
            return;
        };
        let change = Change::Promote(l, addr);
        match self.node.propose_conf_change(vec![], change.to_raft()) {
            Ok(()) => tracing::info!(learner = l, "a learner that caught up becomes a voter"),
            Err(e) => tracing::debug!(error = %e, "promotion not proposed"),
        }
    }

    /// Whether replica `id` is this one, or was heard from within an election timeout.
    fn answers(&self, id: u64) -> bool {
        id == self.cfg.id
            || self
                .last_heard
                .get(&id)
                .is_some_and(|&t| self.now.saturating_sub(t) <= self.cfg.election_floor())
    }

    /// The address book follows the members the store knows (and keeps this replica's,
    /// and those of members being added whose entries arrived but are not applied yet).
    pub(super) fn update_book(&mut self) {
        let own = self.cfg.members[&self.cfg.id].clone();
        let m = self.node.store().members();
        if !m.addresses.is_empty() {
            let mut book = m.addresses.clone();
            for (id, a) in &self.cfg.members {
                if !m.retired.contains(id) {
                    book.entry(*id).or_insert_with(|| a.clone());
                }
            }
            self.cfg.members = book;
        }
        self.cfg.members.insert(self.cfg.id, own);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protobuf::Message as _;

    fn conf(voters: &[u64], learners: &[u64]) -> rp::ConfState {
        rp::ConfState::from((voters.to_vec(), learners.to_vec()))
    }

    /// What raft-rs writes for a change, Tessera's mirror reads back as the same change;
    /// kinds and forms Tessera never makes are refused.
    #[test]
    fn a_change_reads_back_through_the_mirror_and_odd_ones_are_refused() {
        for c in [
            Change::AddLearner(4, "m4:7070".into()),
            Change::Promote(4, "m4:7070".into()),
            Change::Remove(2),
        ] {
            let bytes = c.to_raft().write_to_bytes().unwrap();
            assert_eq!(Change::decode(&bytes), Ok(c));
        }
        let enc = |t: u32, id: u64, ctx: &[u8]| {
            pb::RaftConfChange {
                id: 0,
                change_type: t,
                node_id: id,
                context: bytes::Bytes::copy_from_slice(ctx),
            }
            .encode_to_vec()
        };
        assert!(
            Change::decode(&enc(2, 0, b"a"))
                .unwrap_err()
                .contains("replica 0")
        );
        assert!(Change::decode(&enc(2, 4, b"")).is_err());
        assert!(Change::decode(&enc(2, 4, b"a,b")).is_err());
        assert!(Change::decode(&enc(2, 4, &[0xff])).is_err());
        assert!(Change::decode(&enc(1, 4, b"x")).is_err());
        assert!(
            Change::decode(&enc(3, 4, b"x"))
                .unwrap_err()
                .contains("kind 3")
        );
        assert!(Change::decode(b"\xff\xff").is_err());
    }

    #[test]
    fn changes_are_checked_against_the_group() {
        let mut m = Members::of((1..=3).map(|i| (i, format!("m{i}"))).collect());
        let c = conf(&[1, 2, 3], &[]);
        assert!(m.check(&c, &Change::AddLearner(3, "x".into())).is_err());
        assert!(m.check(&c, &Change::AddLearner(4, "m1".into())).is_err());
        assert!(m.check(&c, &Change::Promote(4, "m4".into())).is_err());
        assert!(m.check(&c, &Change::Remove(5)).is_err());
        let add = Change::AddLearner(4, "m4".into());
        assert_eq!(m.check(&c, &add), Ok(()));
        m.apply(&add);
        let c = conf(&[1, 2, 3], &[4]);
        assert!(m.check(&c, &Change::Promote(4, "m5".into())).is_err());
        assert_eq!(m.check(&c, &Change::Promote(4, "m4".into())), Ok(()));
        assert_eq!(m.covers(&c), Ok(()));
        m.apply(&Change::Remove(2));
        let c = conf(&[1, 3], &[4]);
        assert_eq!(m.covers(&c), Ok(()));
        assert!(
            m.check(&c, &Change::AddLearner(2, "m2".into()))
                .unwrap_err()
                .contains("new one")
        );
        assert!(m.covers(&conf(&[1, 2], &[])).is_err());
        assert!(m.check(&conf(&[1], &[]), &Change::Remove(1)).is_err());
    }
}
