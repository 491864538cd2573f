//! raft-rs's messages to and from Tessera's (`pb::Raft*`, field for field). What a peer
//! sends or a disk holds is decoded by prost and checked here before raft-rs sees it:
//! an unknown kind of entry or message is refused, and so is every kind a replica only
//! makes for itself (an election order, a proposal, a local status), which raft-rs would
//! otherwise act on as if it had made it.

use prost::Message as _;
use raft::eraftpb as rp;

use crate::pb;

pub fn entry_to_pb(e: &rp::Entry) -> pb::RaftEntry {
    pb::RaftEntry {
        entry_type: e.entry_type as u32,
        term: e.term,
        index: e.index,
        data: e.data.clone(),
        context: e.context.clone(),
    }
}

pub fn entry_from_pb(e: pb::RaftEntry) -> Result<rp::Entry, String> {
    let entry_type = match e.entry_type {
        0 => rp::EntryType::EntryNormal,
        1 => rp::EntryType::EntryConfChange,
        2 => rp::EntryType::EntryConfChangeV2,
        t => return Err(format!("unknown raft entry type {t}")),
    };
    Ok(rp::Entry {
        entry_type,
        term: e.term,
        index: e.index,
        data: e.data,
        context: e.context,
        ..Default::default()
    })
}

pub fn conf_to_pb(c: &rp::ConfState) -> pb::RaftConfState {
    pb::RaftConfState {
        voters: c.voters.clone(),
        learners: c.learners.clone(),
        voters_outgoing: c.voters_outgoing.clone(),
        learners_next: c.learners_next.clone(),
        auto_leave: c.auto_leave,
        // Tessera's own (the store fills them in: `store.rs`).
        addresses: Default::default(),
        retired: Vec::new(),
        changed_at: 0,
    }
}

pub fn conf_from_pb(c: pb::RaftConfState) -> rp::ConfState {
    rp::ConfState {
        voters: c.voters,
        learners: c.learners,
        voters_outgoing: c.voters_outgoing,
        learners_next: c.learners_next,
        auto_leave: c.auto_leave,
        ..Default::default()
    }
}

/// Refuses a configuration raft-rs cannot restore (it would stop the process): a joint
/// one (Tessera changes one member at a time, never through a joint configuration), a
/// member named twice or with id 0 (raft-rs's "no one"), or any other that raft-rs's
/// own restore, run here on a scratch tracker, would not rebuild as it is.
pub fn check_conf(c: &rp::ConfState) -> Result<(), String> {
    if !c.voters_outgoing.is_empty() || !c.learners_next.is_empty() || c.auto_leave {
        return Err("a joint configuration, which Tessera never makes".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for id in c.voters.iter().chain(&c.learners) {
        if *id == 0 {
            return Err("a member with id 0".into());
        }
        if !seen.insert(*id) {
            return Err(format!("member {id} is named twice"));
        }
    }
    let mut tracker = raft::ProgressTracker::new(1);
    let changes = c
        .voters
        .iter()
        .map(|&id| (id, rp::ConfChangeType::AddNode))
        .chain(
            c.learners
                .iter()
                .map(|&id| (id, rp::ConfChangeType::AddLearnerNode)),
        );
    for (id, kind) in changes {
        let mut cc = rp::ConfChangeSingle {
            node_id: id,
            ..Default::default()
        };
        cc.set_change_type(kind);
        let (conf, map) = raft::Changer::new(&tracker)
            .simple(&[cc])
            .map_err(|e| format!("member {id}: {e}"))?;
        tracker.apply_conf(conf, map, 1);
    }
    let got = tracker.conf().to_conf_state();
    let sorted = |v: &[u64]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v
    };
    if sorted(&got.voters) != sorted(&c.voters) || sorted(&got.learners) != sorted(&c.learners) {
        return Err(format!(
            "voters {:?} and learners {:?} do not restore as named",
            c.voters, c.learners
        ));
    }
    Ok(())
}

pub fn hard_to_pb(h: &rp::HardState) -> pb::RaftHardState {
    pb::RaftHardState {
        term: h.term,
        vote: h.vote,
        commit: h.commit,
    }
}

pub fn hard_from_pb(h: pb::RaftHardState) -> rp::HardState {
    rp::HardState {
        term: h.term,
        vote: h.vote,
        commit: h.commit,
        ..Default::default()
    }
}

pub fn snapshot_to_pb(s: &rp::Snapshot) -> pb::RaftSnapshot {
    let m = s.get_metadata();
    pb::RaftSnapshot {
        data: s.data.clone(),
        metadata: Some(pb::RaftSnapshotMeta {
            conf_state: Some(conf_to_pb(m.get_conf_state())),
            index: m.index,
            term: m.term,
        }),
        parts: 0,
        length: 0,
    }
}

pub fn snapshot_from_pb(s: pb::RaftSnapshot) -> rp::Snapshot {
    let mut out = rp::Snapshot {
        data: s.data,
        ..Default::default()
    };
    if let Some(m) = s.metadata {
        let meta = out.mut_metadata();
        meta.index = m.index;
        meta.term = m.term;
        meta.set_conf_state(conf_from_pb(m.conf_state.unwrap_or_default()));
    }
    out
}

pub fn message_to_pb(m: &rp::Message) -> pb::RaftMessage {
    pb::RaftMessage {
        msg_type: m.msg_type as u32,
        to: m.to,
        from: m.from,
        term: m.term,
        log_term: m.log_term,
        index: m.index,
        entries: m.entries.iter().map(entry_to_pb).collect(),
        commit: m.commit,
        commit_term: m.commit_term,
        snapshot: m.snapshot.as_ref().map(snapshot_to_pb),
        request_snapshot: m.request_snapshot,
        reject: m.reject,
        reject_hint: m.reject_hint,
        context: m.context.clone(),
        priority: m.priority,
        leader_commit: 0,
    }
}

/// A message from a peer, as raft-rs takes it; refused if it is of a kind peers never
/// send one another.
pub fn message_from_pb(m: pb::RaftMessage) -> Result<rp::Message, String> {
    use rp::MessageType::*;
    let msg_type = match m.msg_type {
        3 => MsgAppend,
        4 => MsgAppendResponse,
        5 => MsgRequestVote,
        6 => MsgRequestVoteResponse,
        7 => MsgSnapshot,
        8 => MsgHeartbeat,
        9 => MsgHeartbeatResponse,
        17 => MsgRequestPreVote,
        18 => MsgRequestPreVoteResponse,
        // Hup, Beat, Unreachable, SnapStatus and CheckQuorum are a replica's orders to
        // itself; proposals, read-index requests and leader transfers (and their
        // answers) are made only on the leader by its own master, never forwarded.
        t @ (0..=2 | 10..=16) => {
            return Err(format!(
                "raft message type {t} is never sent between replicas"
            ));
        }
        t => return Err(format!("unknown raft message type {t}")),
    };
    let entries = m
        .entries
        .into_iter()
        .map(entry_from_pb)
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = rp::Message {
        msg_type,
        to: m.to,
        from: m.from,
        term: m.term,
        log_term: m.log_term,
        index: m.index,
        entries: entries.into(),
        commit: m.commit,
        commit_term: m.commit_term,
        request_snapshot: m.request_snapshot,
        reject: m.reject,
        reject_hint: m.reject_hint,
        context: m.context,
        priority: m.priority,
        ..Default::default()
    };
    if let Some(s) = m.snapshot {
        out.set_snapshot(snapshot_from_pb(s));
    }
    Ok(out)
}

/// The most a batch of replica messages holds, encoded, before the next call is begun
/// (a message larger than this goes alone): far below a transport's message limit
/// (64 MiB), which a leader catching a follower up could otherwise pass with its many
/// appends of up to 1 MiB each.
pub const BATCH_BYTES: usize = 8 << 20;

/// Messages for other replicas as calls: for each address, its messages in the order
/// they were made, in as few calls as hold them within [`BATCH_BYTES`]; addresses in the
/// order first named. A snapshot larger than `part_bytes` goes in parts, a call each
/// (`snapshot_parts.rs`).
pub fn batches(
    send: Vec<(String, pb::RaftMessage)>,
    part_bytes: usize,
) -> Vec<(String, pb::MasterRequest)> {
    // (address, batch, its encoded size); the last batch of an address takes more.
    let mut out: Vec<(String, pb::RaftBatch, usize)> = Vec::new();
    for (to, m) in send {
        let m = match super::snapshot_parts::split(m, part_bytes) {
            super::snapshot_parts::Piece::Whole(m) => *m,
            super::snapshot_parts::Piece::Parts(parts) => {
                for p in parts {
                    let size = p.encoded_len();
                    let batch = pb::RaftBatch {
                        snapshot_parts: vec![p],
                        answers: true,
                        ..Default::default()
                    };
                    out.push((to.clone(), batch, size.max(BATCH_BYTES)));
                }
                continue;
            }
        };
        let size = m.encoded_len() + 8;
        match out.iter_mut().rev().find(|(a, _, _)| *a == to) {
            Some((_, b, n)) if *n + size <= BATCH_BYTES => {
                b.messages.push(m);
                *n += size;
            }
            _ => out.push((
                to,
                pb::RaftBatch {
                    messages: vec![m],
                    answers: true,
                    ..Default::default()
                },
                size,
            )),
        }
    }
    out.into_iter()
        .map(|(to, b, _)| {
            (
                to,
                pb::MasterRequest {
                    req: Some(pb::master_request::Req::RaftBatch(b)),
                    ..Default::default()
                },
            )
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;

    /// A stored or sent configuration raft-rs would stop on is refused first.
    #[test]
    fn a_configuration_raft_rs_would_not_restore_is_refused() {
        let conf = |voters: &[u64], learners: &[u64]| rp::ConfState {
            voters: voters.to_vec(),
            learners: learners.to_vec(),
            ..Default::default()
        };
        assert_eq!(check_conf(&conf(&[1, 2, 3], &[4])), Ok(()));
        assert_eq!(check_conf(&conf(&[], &[])), Ok(()));
        for (bad, why) in [
            (conf(&[1, 2, 2], &[]), "named twice"),
            (conf(&[1, 2], &[2]), "named twice"),
            (conf(&[1], &[0]), "id 0"),
            (
                rp::ConfState {
                    voters_outgoing: vec![1],
                    ..conf(&[1, 2], &[])
                },
                "joint",
            ),
        ] {
            let e = check_conf(&bad).expect_err("refused");
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    /// Every field survives the trip both ways, and only the kinds peers send get in.
    #[test]
    fn a_message_round_trips_and_local_kinds_are_refused() {
        let mut e = rp::Entry::default();
        e.entry_type = rp::EntryType::EntryConfChangeV2;
        e.term = 3;
        e.index = 9;
        e.data = bytes::Bytes::from_static(b"records");
        e.context = bytes::Bytes::from_static(b"ctx");
        let mut m = rp::Message::default();
        m.msg_type = rp::MessageType::MsgAppend;
        m.to = 2;
        m.from = 1;
        m.term = 3;
        m.log_term = 2;
        m.index = 8;
        m.entries = vec![e].into();
        m.commit = 7;
        m.commit_term = 2;
        m.request_snapshot = 4;
        m.reject = true;
        m.reject_hint = 6;
        m.context = bytes::Bytes::from_static(b"read");
        m.priority = -1;
        let mut s = rp::Snapshot::default();
        s.data = bytes::Bytes::from_static(b"checkpoint");
        s.mut_metadata().index = 5;
        s.mut_metadata().term = 2;
        s.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        s.mut_metadata().mut_conf_state().learners = vec![4];
        m.set_snapshot(s);
        let back = message_from_pb(message_to_pb(&m)).unwrap();
        assert_eq!(back, m);

        for t in [0u32, 1, 2, 10, 11, 12, 13, 14, 15, 16] {
            let mut p = message_to_pb(&m);
            p.msg_type = t;
            let err = message_from_pb(p).unwrap_err();
            assert!(err.contains("never sent between replicas"), "{t}: {err}");
        }
        let mut p = message_to_pb(&m);
        p.msg_type = 19;
        assert!(message_from_pb(p).unwrap_err().contains("unknown"));
        let mut p = message_to_pb(&m);
        p.entries[0].entry_type = 3;
        assert!(message_from_pb(p).unwrap_err().contains("entry type 3"));
    }

    /// Each address gets one call with its messages in the order made.
    #[test]
    fn messages_go_one_call_per_replica_in_order() {
        let m = |to: u64, index: u64| pb::RaftMessage {
            to,
            index,
            ..Default::default()
        };
        let send = vec![
            ("b".to_string(), m(2, 1)),
            ("c".to_string(), m(3, 1)),
            ("b".to_string(), m(2, 2)),
            ("b".to_string(), m(2, 3)),
            ("c".to_string(), m(3, 2)),
        ];
        let calls = batches(send, 1 << 20);
        let got: Vec<(String, Vec<u64>)> = calls
            .into_iter()
            .map(|(to, r)| match r.req {
                Some(pb::master_request::Req::RaftBatch(b)) => {
                    (to, b.messages.iter().map(|m| m.index).collect())
                }
                other => panic!("not a batch: {other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![("b".into(), vec![1, 2, 3]), ("c".into(), vec![1, 2])]
        );
    }

    /// A batch is split before it outgrows BATCH_BYTES; a message larger goes alone.
    #[test]
    fn a_large_batch_is_split_in_order() {
        let m = |index: u64, len: usize| pb::RaftMessage {
            to: 2,
            index,
            entries: vec![pb::RaftEntry {
                data: bytes::Bytes::from(vec![0u8; len]),
                ..Default::default()
            }],
            ..Default::default()
        };
        let third = BATCH_BYTES / 3;
        let send: Vec<_> = [
            (1, third),
            (2, third),
            (3, third),
            (4, BATCH_BYTES * 2),
            (5, 10),
        ]
        .into_iter()
        .map(|(i, len)| ("b".to_string(), m(i, len)))
        .collect();
        let calls: Vec<Vec<u64>> = batches(send, 1 << 20)
            .into_iter()
            .map(|(_, r)| match r.req {
                Some(pb::master_request::Req::RaftBatch(b)) => {
                    b.messages.iter().map(|m| m.index).collect()
                }
                other => panic!("not a batch: {other:?}"),
            })
            .collect();
        assert_eq!(calls, vec![vec![1, 2], vec![3], vec![4], vec![5]]);
    }

    /// A large snapshot goes in parts, a call each, in its place among the messages.
    #[test]
    fn a_large_snapshot_goes_in_parts_a_call_each() {
        let m = |index: u64| pb::RaftMessage {
            to: 2,
            index,
            ..Default::default()
        };
        let mut snap = m(2);
        snap.msg_type = 7;
        snap.snapshot = Some(pb::RaftSnapshot {
            data: bytes::Bytes::from(vec![1u8; 250]),
            metadata: None,
            ..Default::default()
        });
        let send: Vec<_> = [m(1), snap, m(3)]
            .into_iter()
            .map(|x| ("b".to_string(), x))
            .collect();
        // Each call: its messages' indexes, and its parts' offsets and lengths.
        type Call = (Vec<u64>, Vec<(u64, usize)>);
        let calls: Vec<Call> = batches(send, 100)
            .into_iter()
            .map(|(_, r)| match r.req {
                Some(pb::master_request::Req::RaftBatch(b)) => (
                    b.messages.iter().map(|m| m.index).collect(),
                    b.snapshot_parts
                        .iter()
                        .map(|p| (p.offset, p.data.len()))
                        .collect(),
                ),
                other => panic!("not a batch: {other:?}"),
            })
            .collect();
        assert_eq!(
            calls,
            vec![
                (vec![1], vec![]),
                (vec![], vec![(0, 100)]),
                (vec![], vec![(100, 100)]),
                (vec![], vec![(200, 50)]),
                (vec![3], vec![]),
            ]
        );
    }
}
