//! The master group in a small deterministic world: replicas, their stores (what a sync
//! made durable, and what is still in flight), a network that can cut any direction,
//! and a clock. Crashes lose every write not yet synced.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::pb::master_request::Req as MReq;
use crate::trace::recorder::{MemSink, Recorder};

const TICK_MS: u64 = 100;
const STEP_MS: u64 = 10;

struct World {
    gcfg: GroupConfig,
    mcfg: MasterConfig,
    replicas: BTreeMap<u64, Option<Replica>>,
    /// What each replica's store holds durably.
    disks: BTreeMap<u64, BTreeMap<Vec<u8>, Bytes>>,
    /// Persists given out and not yet synced, per replica.
    unsynced: BTreeMap<u64, VecDeque<Persist>>,
    /// Messages in flight: (from, to, message).
    wire: VecDeque<(u64, u64, pb::MasterRequest)>,
    /// Directions cut: (from, to).
    cut: BTreeSet<(u64, u64)>,
    now: Time,
    next_id: RequestId,
    /// Every reply: request id → (replica, reply).
    replies: BTreeMap<RequestId, (u64, pb::MasterResponse)>,
    /// When each replica's master started serving, by term.
    served: Vec<(u64, u64, Time)>,
    /// With a generator: each step syncs a replica's store only now and then, so
    /// crashes lose writes not yet synced.
    slow_sync: Option<crate::rng::Rng>,
    /// The checkpointers of even-numbered replicas (which also hold their master's
    /// records for a flush at the end of each world step), run beside them as a driver runs
    /// them, with the feeds each has not yet taken (they take them one world step
    /// later, so checkpoints come back while entries go on being applied); odd-numbered
    /// replicas run theirs inside their steps.
    checkpointers: BTreeMap<u64, (checkpointer::Checkpointer, VecDeque<checkpointer::Feed>)>,
    /// Checkpoints that came back and compacted a log, by replica.
    compactions: BTreeMap<u64, u64>,
    /// Snapshot parts put on the wire so far, and which of them (by that count) are lost.
    parts_sent: usize,
    lose_parts: BTreeSet<usize>,
    /// Snapshots sent, by the replica they went to (whole or in parts, counted once).
    snapshots_sent: BTreeMap<u64, usize>,
    /// Each step's calls go out in the reverse of the order they were made.
    reverse_calls: bool,
    /// Every replica started from now on runs its checkpointer beside it (not only the
    /// even-numbered ones).
    all_beside: bool,
    /// Replicas whose checkpointers (run beside them) take nothing for now.
    held: BTreeSet<u64>,
    /// Calls between replicas not yet answered: request id → the caller.
    raft_calls: BTreeMap<RequestId, u64>,
    /// Answers with messages in them, on their way back: (answerer, caller, messages).
    answers: VecDeque<(u64, u64, pb::RaftBatch)>,
    /// Answers that carried messages back, so far.
    answers_carried: u64,
    /// Calls put on the wire so far, by (from, to).
    calls_sent: BTreeMap<(u64, u64), u64>,
    /// How far ahead of the world's clock each replica's clock reads, in ms (behind if
    /// negative): a clock that jumps.
    skew: BTreeMap<u64, i64>,
    /// Replicas whose masters are recorded as a driver records them, each into a
    /// trace of its own.
    recorders: BTreeMap<u64, (Recorder<MemSink>, crate::driver::group::Origins)>,
}

fn addr(id: u64) -> String {
    format!("m{id}:7070")
}

fn id_of(a: &str) -> u64 {
    a[1..a.find(':').unwrap()].parse().unwrap()
}

impl World {
    fn new(n: u64) -> World {
        World::with(n, 100_000)
    }

    fn with(n: u64, snapshot_every: u64) -> World {
        let members: BTreeMap<u64, String> = (1..=n).map(|i| (i, addr(i))).collect();
        let mut gcfg = GroupConfig::new(1, members);
        gcfg.snapshot_every = snapshot_every;
        gcfg.seed = 7;
        let mcfg = MasterConfig {
            chunk_size: 1024,
            lease_duration: Duration::from_secs(10),
            max_clock_skew: Duration::from_secs(1),
            ..MasterConfig::default()
        };
        let mut w = World {
            gcfg,
            mcfg,
            replicas: BTreeMap::new(),
            disks: BTreeMap::new(),
            unsynced: BTreeMap::new(),
            wire: VecDeque::new(),
            cut: BTreeSet::new(),
            now: Time(1000),
            next_id: 1,
            replies: BTreeMap::new(),
            served: Vec::new(),
            slow_sync: None,
            checkpointers: BTreeMap::new(),
            compactions: BTreeMap::new(),
            parts_sent: 0,
            snapshots_sent: BTreeMap::new(),
            lose_parts: BTreeSet::new(),
            reverse_calls: false,
            all_beside: false,
            held: BTreeSet::new(),
            raft_calls: BTreeMap::new(),
            answers: VecDeque::new(),
            answers_carried: 0,
            calls_sent: BTreeMap::new(),
            skew: BTreeMap::new(),
            recorders: BTreeMap::new(),
        };
        for i in 1..=n {
            let store = LogStore::fresh((1..=n).map(|i| (i, addr(i))).collect());
            let disk = store
                .format()
                .into_iter()
                .map(|(k, v)| (k, v.unwrap()))
                .collect();
            w.disks.insert(i, disk);
            w.start(i);
        }
        w
    }

    fn start(&mut self, id: u64) {
        let store = LogStore::load(self.disks[&id].clone()).expect("a sound store");
        let mut cfg = self.gcfg.clone();
        cfg.id = id;
        let mut mcfg = self.mcfg.clone();
        mcfg.rng_seed = id;
        let mut r = Replica::start(cfg, mcfg, self.now, store).expect("starts");
        self.checkpointers.remove(&id);
        if id.is_multiple_of(2) || self.all_beside {
            r.hold_proposals();
            let c = r.take_checkpointer().expect("not yet taken");
            self.checkpointers.insert(id, (c, VecDeque::new()));
        }
        self.replicas.insert(id, Some(r));
        self.unsynced.insert(id, VecDeque::new());
    }

    /// Records replica `id`'s masters from now on, as a driver does (`--trace-dir`).
    fn record(&mut self, id: u64) {
        self.replicas
            .get_mut(&id)
            .and_then(Option::as_mut)
            .expect("live")
            .observe();
        let sink = MemSink::new(&addr(id), "master");
        self.recorders
            .insert(id, (Recorder::new(sink), Default::default()));
    }

    /// Kill -9: writes not yet synced are lost, and so are messages to it.
    fn crash(&mut self, id: u64) {
        self.replicas.insert(id, None);
        self.checkpointers.remove(&id);
        self.unsynced.insert(id, VecDeque::new());
        self.wire.retain(|(_, to, _)| *to != id);
        // Its calls' answers are lost with its connections.
        self.raft_calls.retain(|_, caller| *caller != id);
        self.answers.retain(|(_, caller, _)| *caller != id);
    }

    fn step(&mut self, id: u64, input: Input) {
        let Some(Some(r)) = self.replicas.get_mut(&id) else {
            return;
        };
        let skew = self.skew.get(&id).copied().unwrap_or(0);
        let now = Time(self.now.as_millis().saturating_add_signed(skew));
        let e = match self.recorders.get_mut(&id) {
            Some((rec, origins)) => crate::driver::group::step_at(now, r, rec, origins, input),
            None => r.handle(now, input),
        };
        let part_bytes = r.config().snapshot_part_bytes;
        let (serving, term) = (r.master().is_some(), r.status().term);
        if serving && !self.served.iter().any(|&(i, t, _)| i == id && t == term) {
            self.served.push((id, term, self.now));
        }
        for (rid, resp) in e.replies {
            if let Some(caller) = self.raft_calls.remove(&rid) {
                if let Some(pb::master_response::Resp::RaftBatch(b)) = resp.resp
                    && !b.messages.is_empty()
                {
                    self.answers_carried += 1;
                    self.answers.push_back((id, caller, b));
                }
                continue;
            }
            self.replies.insert(rid, (id, resp));
        }
        for (_, m) in &e.send {
            if m.msg_type == raft::eraftpb::MessageType::MsgSnapshot as u32 {
                *self.snapshots_sent.entry(m.to).or_default() += 1;
            }
        }
        let mut calls = super::wire::batches(e.send, part_bytes);
        if self.reverse_calls {
            calls.reverse();
        }
        for (to, m) in calls {
            if let Some(MReq::RaftBatch(b)) = &m.req
                && !b.snapshot_parts.is_empty()
            {
                self.parts_sent += 1;
                if self.lose_parts.contains(&self.parts_sent) {
                    continue;
                }
            }
            *self.calls_sent.entry((id, id_of(&to))).or_default() += 1;
            self.wire.push_back((id, id_of(&to), m));
        }
        if let Some((_, q)) = self.checkpointers.get_mut(&id) {
            q.extend(e.checkpointer);
        } else {
            assert!(
                e.checkpointer.is_empty(),
                "a replica running its own checkpointer fed it out"
            );
        }
        self.unsynced.get_mut(&id).unwrap().extend(e.persist);
    }

    /// Each checkpointer run beside its replica takes the feeds it has waiting; what it
    /// builds goes back to the replica.
    fn run_checkpointers(&mut self) {
        let ids: Vec<u64> = self.checkpointers.keys().copied().collect();
        for id in ids {
            if self.held.contains(&id) {
                continue;
            }
            let Some((c, q)) = self.checkpointers.get_mut(&id) else {
                continue;
            };
            let mut taken = Vec::new();
            for f in std::mem::take(q) {
                taken.extend(c.feed(f));
            }
            for b in taken {
                let t = match b {
                    checkpointer::Built::Checkpoint(t) => t,
                    checkpointer::Built::Copy(h) => {
                        self.step(id, Input::MasterCopy(h));
                        continue;
                    }
                };
                let before = self.replicas[&id]
                    .as_ref()
                    .map(|r| r.node.store().snapshot_index());
                self.step(id, Input::Checkpointed(t));
                let after = self.replicas[&id]
                    .as_ref()
                    .map(|r| r.node.store().snapshot_index());
                if after > before {
                    *self.compactions.entry(id).or_default() += 1;
                }
            }
        }
    }

    /// One step of the world: every message delivered (or dropped if cut), every
    /// store synced, ticks when due.
    fn advance(&mut self) {
        self.now = self.now + Duration::from_millis(STEP_MS);
        let ids: Vec<u64> = self.replicas.keys().copied().collect();
        self.run_checkpointers();
        if self.now.as_millis().is_multiple_of(TICK_MS) {
            for &i in &ids {
                self.step(i, Input::RaftTick);
                self.step(i, Input::Tick);
            }
        }
        for _ in 0..self.answers.len() {
            let (from, to, batch) = self.answers.pop_front().unwrap();
            if self.cut.contains(&(from, to)) {
                continue;
            }
            let arrived = self.now;
            self.step(to, Input::Answer { batch, arrived });
        }
        for _ in 0..self.wire.len() {
            let (from, to, m) = self.wire.pop_front().unwrap();
            if self.cut.contains(&(from, to)) {
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            let arrived = self.now;
            self.raft_calls.insert(id, from);
            self.step(
                to,
                Input::Request {
                    id,
                    req: m,
                    arrived,
                    // Each replica's calls carry its own certificate.
                    from: crate::auth::Caller::Master { replica: from },
                },
            );
        }
        for &i in &ids {
            if let Some(rng) = self.slow_sync.as_mut()
                && rng.below(4) != 0
            {
                continue;
            }
            while let Some(p) = self.unsynced.get_mut(&i).unwrap().pop_front() {
                let disk = self.disks.get_mut(&i).unwrap();
                for (k, v) in p.writes {
                    match v {
                        Some(v) => disk.insert(k, v),
                        None => disk.remove(&k),
                    };
                }
                if p.wait {
                    self.step(i, Input::Persisted { number: p.number });
                }
            }
        }
        // Even-numbered replicas hold their master's records for a flush at the end of
        // each world step, as a driver does at the end of a batch of events.
        for &i in &ids {
            if i.is_multiple_of(2) || self.all_beside {
                self.step(i, Input::Flush);
            }
        }
    }

    fn run(&mut self, ms: u64) {
        for _ in 0..ms / STEP_MS {
            self.advance();
        }
    }

    fn live(&self, id: u64) -> &Replica {
        self.replicas[&id].as_ref().expect("live")
    }

    /// The one replica serving as master, if exactly one does.
    fn leader(&self) -> Option<u64> {
        let serving: Vec<u64> = self
            .replicas
            .iter()
            .filter(|(_, r)| r.as_ref().is_some_and(|r| r.master().is_some()))
            .map(|(&i, _)| i)
            .collect();
        match serving[..] {
            [one] => Some(one),
            _ => None,
        }
    }

    fn ask(&mut self, to: u64, req: MReq, token: u64) -> RequestId {
        let id = self.next_id;
        self.next_id += 1;
        let arrived = self.now;
        self.step(
            to,
            Input::Request {
                id,
                req: pb::MasterRequest {
                    token,
                    req: Some(req),
                    ..Default::default()
                },
                arrived,
                from: crate::auth::Caller::Insecure,
            },
        );
        id
    }

    fn reply(&self, id: RequestId) -> Option<Result<(), FsError>> {
        self.replies.get(&id).map(|(_, r)| match &r.error {
            Some(e) => Err(FsError::from_pb(e)),
            None => Ok(()),
        })
    }

    /// Asks `req` of the leader, following "not the leader" answers and retrying with
    /// the same token (after "unavailable" too), until it is answered otherwise.
    fn call(&mut self, req: MReq, token: u64) -> Result<(), FsError> {
        let mut to = self.leader().unwrap_or(1);
        for _ in 0..100 {
            let id = self.ask(to, req.clone(), token);
            for _ in 0..300 {
                if self.reply(id).is_some() {
                    break;
                }
                self.advance();
            }
            match self.reply(id) {
                Some(Err(FsError::NotLeader(l))) => {
                    if l.is_empty() {
                        self.run(200);
                        to = self.leader().unwrap_or(to % 3 + 1);
                    } else {
                        // The leader named may still be catching up: give it time.
                        to = id_of(&l);
                        self.run(100);
                    }
                }
                // A leader confirming it still leads (one just elected, say): asked
                // again, as a client does.
                Some(Err(FsError::Unavailable(_))) => self.run(100),
                Some(r) => return r,
                None => to = self.leader().unwrap_or(to % 3 + 1),
            }
        }
        let st: Vec<_> = self
            .replicas
            .values()
            .map(|r| {
                r.as_ref()
                    .map(|r| (r.status(), r.unpersisted, r.held.len()))
            })
            .collect();
        panic!(
            "no answer for {req:?}: {st:#?} unsynced {:?}",
            self.unsynced.values().map(|q| q.len()).collect::<Vec<_>>()
        );
    }

    /// Starts replica `id` to join the group (`--join`): an empty store, and the
    /// group's addresses given.
    fn join(&mut self, id: u64) {
        let disk = LogStore::joining()
            .format()
            .into_iter()
            .map(|(k, v)| (k, v.unwrap()))
            .collect();
        self.disks.insert(id, disk);
        self.gcfg.members.insert(id, addr(id));
        self.start(id);
    }

    /// Runs until every live replica has applied `voters` as the group's voters.
    fn until_voters(&mut self, voters: &[u64]) {
        for _ in 0..100 {
            if self
                .replicas
                .values()
                .flatten()
                .all(|r| r.status().voters == voters)
            {
                return;
            }
            self.run(100);
        }
        let st: Vec<_> = self
            .replicas
            .values()
            .flatten()
            .map(|r| r.status())
            .collect();
        panic!("the voters never became {voters:?}: {st:#?}");
    }

    /// Cuts replica `id` off from the other two, both ways.
    fn cut_off(&mut self, id: u64) {
        for i in (1..=3).filter(|&i| i != id) {
            self.cut.insert((i, id));
            self.cut.insert((id, i));
        }
    }

    fn has_dir(&self, id: u64, p: &str) -> bool {
        self.live(id).shadow().meta.ns.dir_id(p).is_ok()
    }
}

fn mkdir(p: &str) -> MReq {
    MReq::Mkdir(pb::MkdirRequest {
        mode: None,
        path: p.into(),
        parents: false,
    })
}

/// Three replicas elect one leader, which serves; a mutation it acknowledges is in every
/// replica's committed state, and a shadow answers with the leader's address.
#[test]
fn three_replicas_elect_one_leader_that_replicates_what_it_acknowledges() {
    let mut w = World::new(3);
    w.run(4000);
    let l = w.leader().expect("one leader");
    assert_eq!(w.call(mkdir("/a"), 11), Ok(()));
    w.run(500);
    for i in 1..=3 {
        assert!(w.has_dir(i, "/a"), "replica {i} lacks /a");
        let s = w.live(i).status();
        assert_eq!(s.leader, l);
        assert_eq!(s.role, if i == l { "leader" } else { "shadow" });
    }
    let shadow = (1..=3).find(|&i| i != l).unwrap();
    let id = w.ask(shadow, mkdir("/b"), 12);
    assert_eq!(w.reply(id), Some(Err(FsError::NotLeader(addr(l)))));
    // Any replica says where it stands (`tessera admin masters`).
    let id = w.ask(shadow, MReq::ReplicaStatus(pb::Empty {}), 0);
    let Some((
        _,
        pb::MasterResponse {
            resp: Some(pb::master_response::Resp::ReplicaStatus(st)),
            ..
        },
    )) = w.replies.get(&id).cloned()
    else {
        panic!("no status from replica {shadow}");
    };
    assert_eq!((st.id, st.role.as_str(), st.leader), (shadow, "shadow", l));
    assert_eq!(st.members.len(), 3);
    // Its master speaks to chunkservers in its term.
    let m = w.live(l).master().unwrap();
    assert_eq!(m.epoch(), w.live(l).status().term);
    assert!(m.epoch() > 0);
    // The cluster's id was made once, by the first leader, and every replica has it.
    let cid = w.live(l).shadow().meta.cluster_id;
    assert_ne!(cid, 0);
    assert!((1..=3).all(|i| w.live(i).shadow().meta.cluster_id == cid));
}

/// A follower's messages to the leader (its append and heartbeat responses) go back in
/// the answers to the leader's calls, not as calls of their own: half the calls.
#[test]
fn followers_answer_the_leader_in_the_answers_to_its_calls() {
    let mut w = World::new(3);
    w.run(4000);
    let l = w.leader().expect("one leader");
    let (calls, answers) = (w.calls_sent.clone(), w.answers_carried);
    for i in 0..30 {
        assert_eq!(w.call(mkdir(&format!("/d{i}")), 100 + i), Ok(()));
    }
    w.run(1000);
    let sent = |w: &World, from: u64, to: u64| {
        w.calls_sent.get(&(from, to)).copied().unwrap_or(0)
            - calls.get(&(from, to)).copied().unwrap_or(0)
    };
    let (mut out, mut back) = (0, 0);
    for f in (1..=3).filter(|&f| f != l) {
        out += sent(&w, l, f);
        back += sent(&w, f, l);
        assert!(w.has_dir(f, "/d29"), "replica {f} lacks /d29");
    }
    let carried = w.answers_carried - answers;
    assert!(
        carried >= 60 && back * 10 <= carried,
        "the leader made {out} calls to its followers; they answered with messages {carried} times and called it {back} times"
    );
}

/// With both followers down, the leader acknowledges nothing (a record counts only
/// once a majority has it) and stops leading; once one follower is back, the caller's
/// retry with the same token is applied once.
#[test]
fn nothing_is_acknowledged_without_a_majority() {
    let mut w = World::new(3);
    w.run(4000);
    let l = w.leader().unwrap();
    let others: Vec<u64> = (1..=3).filter(|&i| i != l).collect();
    for &o in &others {
        w.crash(o);
    }
    let id = w.ask(l, mkdir("/x"), 21);
    w.run(600);
    assert_eq!(w.reply(id), None, "acknowledged by one replica of three");
    w.run(3000);
    assert!(
        matches!(w.reply(id), Some(Err(FsError::NotLeader(_)))),
        "a leader without a majority gave up its held request: {:?}",
        w.reply(id)
    );
    assert!(
        w.live(l).master().is_none(),
        "still serving without a majority"
    );
    w.start(others[0]);
    assert_eq!(w.call(mkdir("/x"), 21), Ok(()));
    w.run(500);
    let seq_of_x = |w: &World, i: u64| w.has_dir(i, "/x");
    assert!(seq_of_x(&w, l) && seq_of_x(&w, others[0]));
}

/// The leader is killed: another is elected, has every acknowledged mutation, and
/// serves. A restarted replica catches up.
#[test]
fn a_new_leader_has_every_acknowledged_mutation() {
    let mut w = World::new(3);
    w.run(4000);
    for i in 0..20 {
        assert_eq!(w.call(mkdir(&format!("/d{i}")), 100 + i), Ok(()));
    }
    let old = w.leader().unwrap();
    w.crash(old);
    w.run(5000);
    let new = w.leader().expect("a new leader");
    assert_ne!(new, old);
    for i in 0..20 {
        assert!(w.has_dir(new, &format!("/d{i}")));
    }
    assert_eq!(w.call(mkdir("/after"), 200), Ok(()));
    w.start(old);
    w.run(3000);
    assert!(w.has_dir(old, "/after"), "the restarted replica caught up");
    assert_eq!(
        w.leader(),
        Some(new),
        "a restarted replica does not disrupt the leader"
    );
}

/// A mutation committed by the group whose reply the deposed leader never sent: the
/// caller retries at the new leader with the same token and is answered as if the first
/// reply had arrived, the mutation done once.
#[test]
fn a_retry_after_failover_is_answered_not_done_again() {
    let mut w = World::new(3);
    w.run(4000);
    let l = w.leader().unwrap();
    // The followers hear the leader, but it hears nothing back: they commit the record
    // once one of them leads; it never learns of the commit.
    for i in (1..=3).filter(|&i| i != l) {
        w.cut.insert((i, l));
    }
    let id = w.ask(l, mkdir("/once"), 31);
    w.run(6000);
    assert!(
        matches!(w.reply(id), Some(Err(FsError::NotLeader(_)))),
        "{:?}",
        w.reply(id)
    );
    w.cut.clear();
    w.run(2000);
    let new = w.leader().unwrap();
    assert_ne!(new, l);
    assert!(
        w.has_dir(new, "/once"),
        "the record committed under the new leader"
    );
    assert_eq!(
        w.call(mkdir("/once"), 31),
        Ok(()),
        "a retry is answered as the first"
    );
    assert!(
        matches!(w.call(mkdir("/once"), 32), Err(FsError::AlreadyExists(_))),
        "another caller's mkdir still finds it"
    );
}

/// A leader cut off from both followers stops extending leases before a new leader can
/// be elected, and stops serving.
#[test]
fn a_cut_off_leader_loses_its_authority_before_another_is_elected() {
    let mut w = World::new(3);
    w.run(4000);
    let l = w.leader().unwrap();
    w.run(1000);
    let before = w.live(l).authority_until();
    assert!(
        before > w.now,
        "a leader in touch with its group has authority"
    );
    w.cut_off(l);
    let cut_at = w.now;
    let mut last_authority = Time::ZERO;
    for _ in 0..600 {
        w.advance();
        if let Some(Some(r)) = w.replicas.get(&l) {
            last_authority = last_authority.max(r.authority_until());
        }
    }
    // The first replica to serve after the cut.
    let (new, _, elected) = *w
        .served
        .iter()
        .find(|&&(i, _, t)| i != l && t > cut_at)
        .expect("another leader serves");
    assert!(new != l);
    assert!(
        last_authority <= elected,
        "the old leader could extend leases until {last_authority:?}, after the new one \
         started at {elected:?}"
    );
    assert!(
        w.live(l).master().is_none(),
        "the cut-off leader still serves"
    );
}

/// A leader cut off from its group answers nothing from its state once its authority
/// has lapsed, though it has not yet stepped down: not a read, and not a refusal of a
/// mutation either. A new leader may be changing that state by then; "not found" for a
/// file it made would fail the write of a client that knows the file is there.
#[test]
fn a_leader_past_its_authority_refuses_no_mutation_from_its_state() {
    let mut w = World::new(3);
    w.run(4000);
    let l = w.leader().unwrap();
    w.run(1000);
    w.cut_off(l);
    let mut asked = Vec::new();
    for n in 0..600 {
        w.advance();
        let r = w.live(l);
        if r.master().is_none() {
            break;
        }
        if w.now >= r.authority_until() {
            // Refused from the state as it is: a parent that is not there, a file that
            // is not there.
            asked.push(w.ask(l, mkdir("/nowhere/x"), 900 + n));
            let target = MReq::GetWriteTarget(pb::GetWriteTargetRequest {
                path: "/nowhere/f".into(),
                chunk_index: 0,
                append: false,
            });
            asked.push(w.ask(l, target, 2000 + n));
        }
    }
    assert!(
        !asked.is_empty(),
        "the leader stepped down before its authority lapsed"
    );
    for id in asked {
        assert!(
            matches!(w.reply(id), None | Some(Err(FsError::Unavailable(_)))),
            "a leader past its authority answered {:?}",
            w.reply(id)
        );
    }
}

/// A replica's clock that jumps back: its master goes on from the latest reading (its
/// clock never goes back), so its trace must hold the readings the master took its steps
/// at, not the clock's, or the master does not replay (its log records carry the time).
#[test]
fn a_master_whose_clock_went_back_replays_from_its_trace() {
    let mut w = World::new(3);
    for id in 1..=3 {
        w.record(id);
    }
    w.run(4000);
    let l = w.leader().unwrap();
    w.call(mkdir("/a"), 1).unwrap();
    // The leader's clock reads ahead for one step its master does not see, then jumps
    // back: its master's next steps are taken at the reading from before the jump.
    w.skew.insert(l, 500);
    w.step(l, Input::RaftTick);
    w.skew.insert(l, -1500);
    for n in 0..5 {
        w.call(mkdir(&format!("/b{n}")), 10 + n).unwrap();
    }
    w.run(1000);
    assert_eq!(
        w.leader(),
        Some(l),
        "the leader changed; nothing was tested"
    );
    for (id, (rec, _)) in &w.recorders {
        let f = crate::trace::parse(&addr(*id), &rec.sink().bytes()).unwrap();
        let report = crate::trace::replay::replay(&[(addr(*id), f)]);
        if let Some(d) = &report.divergence {
            panic!("replica {id}'s master diverged in replay: {d:?}");
        }
        if *id == l {
            assert_eq!(report.runs, 1, "the leader's master ran once");
            assert!(report.steps > 20, "only {} steps replayed", report.steps);
        }
    }
}

/// Snapshots: the log is dropped behind them, a replica restarts from one, and a replica
/// that was down while the log moved past it catches up from the leader's snapshot.
#[test]
fn replicas_restart_and_catch_up_from_snapshots() {
    let mut w = World::with(3, 5);
    w.run(4000);
    let l = w.leader().unwrap();
    let lag = (1..=3).find(|&i| i != l).unwrap();
    w.crash(lag);
    for i in 0..30 {
        assert_eq!(w.call(mkdir(&format!("/s{i}")), 300 + i), Ok(()));
    }
    w.run(500);
    let store = &w.disks[&l];
    let entries = store
        .keys()
        .filter(|k| k.starts_with(store::LOG_PREFIX))
        .count();
    assert!(
        entries < 12,
        "the log is dropped behind snapshots: {entries} entries left"
    );
    assert!(store.contains_key(store::SNAP_KEY));
    w.start(lag);
    w.run(3000);
    for i in 0..30 {
        assert!(
            w.has_dir(lag, &format!("/s{i}")),
            "lagging replica lacks /s{i}"
        );
    }
    // Every replica restarts from its own snapshot and log.
    for i in 1..=3 {
        w.crash(i);
    }
    for i in 1..=3 {
        w.start(i);
    }
    w.run(5000);
    let l = w.leader().expect("a leader after a full restart");
    for i in 0..30 {
        assert!(w.has_dir(l, &format!("/s{i}")));
    }
    assert!(matches!(
        w.call(mkdir("/s0"), 999),
        Err(FsError::AlreadyExists(_))
    ));
    // Replica 2's checkpoints were built beside it and came back to compact its log.
    assert!(
        w.compactions.get(&2).is_some_and(|&n| n > 0),
        "no checkpoint built beside replica 2 compacted its log"
    );
}

/// A shadow that lags, under a new leader that does not yet know all that is committed
/// (its predecessor died before telling anyone of its last commit): the shadow must not
/// claim its state current from that leader's word while it lacks a record the group
/// acknowledged before.
#[test]
fn a_shadow_claims_no_currency_from_a_new_leader_that_does_not_know_all_committed() {
    let mut w = World::new(3);
    w.run(4000);
    let l = w.leader().unwrap();
    let mut others = (1..=3).filter(|&i| i != l);
    let (a, b) = (others.next().unwrap(), others.next().unwrap());
    // b hears nothing from the leader: the leader and a commit without it.
    w.cut.insert((l, b));
    for (i, p) in ["/x1", "/x2", "/x3"].iter().enumerate() {
        assert_eq!(w.call(mkdir(p), 700 + i as u64), Ok(()));
    }
    // The leader dies at once: no one heard that it committed /x3.
    let acked = w.now;
    w.crash(l);
    let mut claimed = false;
    for _ in 0..1000 {
        w.advance();
        let r = w.live(b);
        let lag = r.lag_ms();
        let lacks = !w.has_dir(b, "/x3");
        // As of the replica's own last step (a read it answered then would say so).
        if lag != u64::MAX && r.now.as_millis().saturating_sub(lag) >= acked.as_millis() {
            claimed = true;
            assert!(
                !lacks,
                "replica {b} claims its state current {lag} ms ago, after /x3 was \
                 acknowledged, but lacks it: {:?} heard {:?}; leader {:?}",
                r.status(),
                r.heard,
                w.replicas[&a].as_ref().map(|r| r.status())
            );
        }
        if claimed && w.leader() == Some(a) {
            break;
        }
    }
    assert!(
        claimed,
        "replica {b} never claimed its state current under the new leader"
    );
    assert!(w.has_dir(b, "/x3"));
}

/// Stores that sync late and replicas that crash with writes unsynced: every mkdir the
/// group acknowledged is there after all replicas crash and restart at once.
#[test]
fn acknowledged_records_survive_crashes_that_lose_unsynced_writes() {
    for seed in 0..12 {
        let mut w = World::new(3);
        w.slow_sync = Some(crate::rng::Rng::new(seed));
        let mut rng = crate::rng::Rng::new(seed ^ 0xC0FFEE);
        w.run(4000);
        let mut acked = Vec::new();
        for i in 0..24u64 {
            if rng.below(4) == 0 {
                let v = 1 + rng.below(3);
                w.crash(v);
                w.run(rng.below(400));
                w.start(v);
            }
            let token = 5000 + i;
            if w.call(mkdir(&format!("/p{i}")), token).is_ok() {
                acked.push(i);
            }
        }
        assert!(
            acked.len() > 12,
            "seed {seed}: only {} acknowledged",
            acked.len()
        );
        for v in 1..=3 {
            w.crash(v);
        }
        for v in 1..=3 {
            w.start(v);
        }
        w.run(6000);
        let l = w.leader().expect("a leader after the restart");
        for i in &acked {
            assert!(
                w.has_dir(l, &format!("/p{i}")),
                "seed {seed}: acknowledged /p{i} lost"
            );
        }
    }
}

/// A read a shadow may answer: the same request, with `stale_ok`.
fn ask_stale(w: &mut World, to: u64, req: MReq) -> pb::MasterResponse {
    ask_stale_from(w, to, req, crate::auth::Caller::Insecure)
}

fn ask_stale_from(
    w: &mut World,
    to: u64,
    req: MReq,
    from: crate::auth::Caller,
) -> pb::MasterResponse {
    let id = w.next_id;
    w.next_id += 1;
    let arrived = w.now;
    w.step(
        to,
        Input::Request {
            id,
            req: pb::MasterRequest {
                req: Some(req),
                stale_ok: true,
                ..Default::default()
            },
            arrived,
            from,
        },
    );
    w.replies.get(&id).expect("answered at once").1.clone()
}

/// A shadow answers a read only as far as the caller's permissions let the leader: the
/// same checks, on the state it has applied.
#[test]
fn a_shadow_refuses_the_reads_the_leader_refuses() {
    let mut w = World::new(3);
    w.run(4000);
    let l = w.leader().unwrap();
    let s = (1..=3).find(|&i| i != l).unwrap();
    let private = MReq::Mkdir(pb::MkdirRequest {
        path: "/p".into(),
        parents: false,
        mode: Some(0o700),
    });
    assert_eq!(w.call(private, 41), Ok(()));
    let secret = MReq::Create(pb::CreateRequest {
        path: "/f".into(),
        replication: 3,
        mode: Some(0o600),
    });
    assert_eq!(w.call(secret, 42), Ok(()));
    w.run(300);
    let eve = crate::auth::Caller::Client {
        user: "eve".into(),
        groups: vec![],
    };
    let admin = crate::auth::Caller::Admin {
        name: "operator".into(),
    };
    let reads = [
        (
            MReq::GetChunks(pb::GetChunksRequest {
                path: "/f".into(),
                ..Default::default()
            }),
            "read this file",
        ),
        (
            MReq::List(pb::ListRequest {
                path: "/p".into(),
                ..Default::default()
            }),
            "list this directory",
        ),
        (stat("/p/x"), "search this directory"),
    ];
    for to in [l, s] {
        for (req, what) in &reads {
            let r = ask_stale_from(&mut w, to, req.clone(), eve.clone());
            assert!(
                matches!(r.error.as_ref().map(FsError::from_pb), Some(FsError::PermissionDenied(m)) if m.contains(what)),
                "replica {to}: {r:?}"
            );
            let r = ask_stale_from(&mut w, to, req.clone(), admin.clone());
            assert!(
                !matches!(
                    r.error.as_ref().map(FsError::from_pb),
                    Some(FsError::PermissionDenied(_))
                ),
                "replica {to}: {r:?}"
            );
        }
    }
}

fn stat(p: &str) -> MReq {
    MReq::Stat(pb::StatRequest { path: p.into() })
}

/// Shadows answer reads that allow it from the state they have applied, never past
/// what the group committed, saying from which record and how far behind; without
/// `stale_ok` they name the leader. Cut off from the leader, a shadow's lag grows, and
/// it still answers from what it has.
#[test]
fn shadows_answer_reads_from_their_committed_state_with_their_lag() {
    let mut w = World::new(3);
    w.run(4000);
    let l = w.leader().unwrap();
    let s = (1..=3).find(|&i| i != l).unwrap();
    assert_eq!(w.call(mkdir("/a"), 31), Ok(()));
    w.run(300);
    let r = ask_stale(&mut w, s, stat("/a"));
    assert!(r.error.is_none(), "{r:?}");
    let sh = r.shadow.expect("a shadow says it answered");
    assert_eq!((sh.replica, sh.address.as_str()), (s, addr(s).as_str()));
    assert_eq!(sh.seq, w.live(s).shadow().seq);
    assert_eq!(sh.seq, w.live(l).shadow().seq, "caught up");
    assert!(sh.lag_ms <= 300, "lag {} ms with a live leader", sh.lag_ms);
    // The leader answers as the leader.
    let r = ask_stale(&mut w, l, stat("/a"));
    assert!(r.error.is_none() && r.shadow.is_none(), "{r:?}");
    // Without stale_ok, a shadow names the leader.
    let id = w.ask(s, stat("/a"), 0);
    assert_eq!(w.reply(id), Some(Err(FsError::NotLeader(addr(l)))));
    // A listing of the root and a file's chunk locations.
    let r = ask_stale(
        &mut w,
        s,
        MReq::List(pb::ListRequest {
            path: "/".into(),
            ..Default::default()
        }),
    );
    match r.resp {
        Some(pb::master_response::Resp::List(l)) => {
            assert_eq!(
                l.entries
                    .iter()
                    .map(|e| e.path.as_str())
                    .collect::<Vec<_>>(),
                ["/a"]
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        w.call(
            MReq::Create(pb::CreateRequest {
                mode: None,
                path: "/a/f".into(),
                replication: 3,
            }),
            32
        ),
        Ok(())
    );
    w.run(300);
    let r = ask_stale(
        &mut w,
        s,
        MReq::GetChunks(pb::GetChunksRequest {
            path: "/a/f".into(),
            ..Default::default()
        }),
    );
    assert!(
        matches!(r.resp, Some(pb::master_response::Resp::GetChunks(ref c)) if c.chunks.is_empty()),
        "{r:?}"
    );
    // A mutation asked of a shadow is refused even with stale_ok.
    let r = ask_stale(&mut w, s, mkdir("/nope"));
    assert!(r.shadow.is_none());
    assert_eq!(
        r.error.map(|e| FsError::from_pb(&e)),
        Some(FsError::NotLeader(addr(l)))
    );

    // Cut off from the others, the shadow keeps answering from what it has, its lag
    // growing; the group goes on without it.
    for o in (1..=3).filter(|&i| i != s) {
        w.cut.insert((s, o));
        w.cut.insert((o, s));
    }
    assert_eq!(w.call(mkdir("/b"), 33), Ok(()));
    w.run(700);
    let r = ask_stale(&mut w, s, stat("/b"));
    assert_eq!(
        r.error
            .map(|e| FsError::from_pb(&e).to_string().contains("/b")),
        Some(true)
    );
    let sh = r.shadow.unwrap();
    assert!(
        sh.lag_ms >= 700,
        "lag {} ms after 700 ms cut off",
        sh.lag_ms
    );
    assert!(sh.seq < w.live(w.leader().unwrap()).shadow().seq);
    w.cut.clear();
    w.run(1000);
    let r = ask_stale(&mut w, s, stat("/b"));
    assert!(r.error.is_none(), "{r:?}");
    assert!(r.shadow.unwrap().lag_ms <= 300);
}

/// A fresh replica knows it has never been current.
#[test]
fn a_replica_that_never_heard_a_leader_says_so() {
    let w = World::new(3);
    assert_eq!(w.live(1).lag_ms(), u64::MAX);
}

fn add(id: u64, address: String) -> MReq {
    MReq::ChangeMembers(pb::ChangeMembersRequest {
        add: id,
        address,
        remove: 0,
    })
}

fn remove(id: u64) -> MReq {
    MReq::ChangeMembers(pb::ChangeMembersRequest {
        add: 0,
        address: String::new(),
        remove: id,
    })
}

/// A replica joins as a learner, takes the log, and becomes a voter once it holds it;
/// then a member leaves, the leader crashes, and the group goes on with what it
/// acknowledged. Every replica restarts on the membership its store holds, and a
/// member that left never joins again.
#[test]
fn a_replica_joins_a_member_leaves_and_the_group_goes_on() {
    let mut w = World::new(3);
    w.run(4000);
    assert_eq!(w.call(mkdir("/a"), 1), Ok(()));
    w.join(4);
    w.run(1000);
    assert_eq!(w.live(4).status().role, "joining");
    assert!(!w.has_dir(4, "/a"), "a replica not yet added took the log");

    assert_eq!(w.call(add(4, addr(4)), 0), Ok(()));
    w.until_voters(&[1, 2, 3, 4]);
    assert!(w.has_dir(4, "/a"));
    assert_eq!(w.live(4).status().role, "shadow");
    // Asked again (an answer lost), the change is done already.
    assert_eq!(w.call(add(4, addr(4)), 0), Ok(()));
    let e = w.call(add(5, addr(4)), 0).unwrap_err();
    assert!(e.to_string().contains("already has address"), "{e}");

    let l = w.leader().unwrap();
    let e = w.call(remove(l), 0).unwrap_err();
    assert!(e.to_string().contains("leads the group"), "{e}");
    let gone = (1..=3).find(|&i| i != l).unwrap();
    assert_eq!(w.call(remove(gone), 0), Ok(()));
    let voters: Vec<u64> = (1..=4).filter(|&i| i != gone).collect();
    w.until_voters(&voters);
    assert_eq!(w.live(gone).status().role, "removed");
    w.crash(gone);
    assert_eq!(w.call(mkdir("/b"), 2), Ok(()));

    // Two of the three voters left carry the group once the leader is gone.
    w.crash(l);
    assert_eq!(w.call(mkdir("/c"), 3), Ok(()));
    w.run(1000);
    w.start(l);
    w.until_voters(&voters);
    w.run(1000);
    for &i in &voters {
        for d in ["/a", "/b", "/c"] {
            assert!(w.has_dir(i, d), "replica {i} lacks {d}");
        }
    }
    let e = w.call(add(gone, addr(gone)), 0).unwrap_err();
    assert!(e.to_string().contains("never joins again"), "{e}");
}

/// A learner starts from a snapshot through the entry that added it, built by the
/// leader's checkpointer beside its event loop: while the checkpointer is slow the
/// leader goes on leading and serving, and sends the learner no older snapshot (one
/// that does not name it, which raft-rs would refuse); once the checkpoint comes back,
/// the learner takes it and catches up. So too after the leader restarts with the
/// snapshot not yet taken.
#[test]
fn a_learners_snapshot_is_built_beside_the_leader_and_none_older_is_sent() {
    let mut w = World::new(3);
    w.gcfg.snapshot_every = 5;
    w.all_beside = true;
    for i in 1..=3 {
        w.crash(i);
        w.start(i);
    }
    w.run(4000);
    for i in 0..12 {
        assert_eq!(w.call(mkdir(&format!("/d{i}")), i + 1), Ok(()));
    }
    w.run(1000);
    let l = w.leader().unwrap();
    assert!(
        w.compactions.get(&l).is_some_and(|&n| n > 0),
        "no older snapshot to send"
    );
    let term = w.live(l).status().term;
    w.held = (1..=3).collect();
    w.join(4);
    w.run(1000);
    assert_eq!(w.call(add(4, addr(4)), 0), Ok(()));
    assert_eq!(w.call(mkdir("/while-held"), 20), Ok(()));
    w.run(5000);
    let s = w.live(l).status();
    assert_eq!(
        (s.role, s.term),
        ("leader", term),
        "the leader stopped leading"
    );
    assert!(
        !w.has_dir(4, "/d0"),
        "the learner caught up without the new snapshot"
    );
    assert_eq!(
        w.snapshots_sent.get(&4),
        None,
        "a snapshot from before the learner was added went to it"
    );
    w.held.clear();
    w.until_voters(&[1, 2, 3, 4]);
    assert!(w.has_dir(4, "/d0") && w.has_dir(4, "/while-held"));
    assert!(w.snapshots_sent.get(&4).is_some_and(|&n| n >= 1));

    // Again with every member restarted before its checkpoint came back.
    w.held = (1..=4).collect();
    w.join(5);
    w.run(1000);
    assert_eq!(w.call(add(5, addr(5)), 0), Ok(()));
    for i in 1..=4 {
        w.crash(i);
    }
    for i in 1..=4 {
        w.start(i);
    }
    w.run(5000);
    assert!(
        (1..=4).any(|i| w.live(i).status().role == "leader"),
        "no replica leads (its master waits for the held checkpointer's copy)"
    );
    assert_eq!(
        w.snapshots_sent.get(&5),
        None,
        "a snapshot that does not name the learner went to it"
    );
    w.held.clear();
    w.until_voters(&[1, 2, 3, 4, 5]);
    assert!(w.has_dir(5, "/d0") && w.has_dir(5, "/while-held"));
}

/// A snapshot larger than a part goes in parts, which may come in any order: a replica
/// that joins takes the group's state from them. With a part lost, the leader sends
/// the snapshot again, and the joiner catches up from the second sending.
#[test]
fn a_joining_replica_takes_a_snapshot_sent_in_parts_one_lost() {
    let mut w = World::new(3);
    w.gcfg.snapshot_part_bytes = 100;
    for i in 1..=3 {
        w.crash(i);
        w.start(i);
    }
    w.run(4000);
    for i in 0..20 {
        assert_eq!(w.call(mkdir(&format!("/dir-{i:03}")), i + 1), Ok(()));
    }
    w.reverse_calls = true;
    w.lose_parts.insert(2);
    w.join(4);
    w.run(1000);
    assert_eq!(w.call(add(4, addr(4)), 0), Ok(()));
    w.until_voters(&[1, 2, 3, 4]);
    for i in 0..20 {
        assert!(w.has_dir(4, &format!("/dir-{i:03}")), "/dir-{i:03}");
    }
    let (parts, whole) = w.live(4).snapshot_parts_taken();
    assert!(
        w.parts_sent >= 6,
        "the snapshot went in {} parts",
        w.parts_sent
    );
    assert_eq!(whole, 1, "snapshots made whole from parts");
    assert!(parts as usize >= w.parts_sent / 2, "{parts} parts taken");
    assert!(w.live(4).shadow().seq > 0);
}

/// A new leader's master starts on a copy of the committed state made beside the
/// replica: while it is being made the leader goes on heartbeating (no other is
/// elected, however long it takes), and serves once it comes back.
#[test]
fn a_new_leader_leads_on_while_its_masters_copy_is_made_beside_it() {
    let mut w = World::new(3);
    w.all_beside = true;
    for i in 1..=3 {
        w.crash(i);
        w.start(i);
    }
    w.run(4000);
    assert_eq!(w.call(mkdir("/a"), 1), Ok(()));
    let old = w.leader().unwrap();
    w.held = (1..=3).collect();
    w.crash(old);
    w.run(3000);
    let leading: Vec<Status> = w
        .replicas
        .values()
        .flatten()
        .map(|r| r.status())
        .filter(|s| s.role == "leader")
        .collect();
    assert_eq!(leading.len(), 1, "one leader elected");
    let (l, term) = (leading[0].id, leading[0].term);
    assert!(
        !leading[0].serving,
        "serving before its master's copy came back"
    );
    // Ten election timeouts and more: still the leader of the same term.
    w.run(20_000);
    let s = w.live(l).status();
    assert_eq!((s.role, s.term, s.serving), ("leader", term, false));

    // Cut off before its copy came back, it loses the lead to a replica of the other
    // two; its copy, released, comes back too late and is dropped.
    w.start(old);
    let third = (1..=3).find(|&i| i != l && i != old).unwrap();
    for o in [old, third] {
        w.cut.insert((l, o));
        w.cut.insert((o, l));
    }
    w.run(5000);
    let s = w.live(l).status();
    assert_ne!(s.role, "leader", "{s:?}");
    let masters_run = w.live(l).generation;
    w.held.remove(&l);
    w.run(200);
    assert!(w.checkpointers[&l].1.is_empty(), "its feeds were taken");
    assert_eq!(
        w.live(l).generation,
        masters_run,
        "a master started on a copy asked in a term since lost"
    );
    w.held.clear();
    w.run(200);
    let new = w.leader().expect("one of the two others serves");
    assert_ne!(new, l);
    assert!(w.live(new).status().term > term);
    assert_eq!(w.call(mkdir("/b"), 2), Ok(()));
    w.cut.clear();
    w.run(3000);
    for i in 1..=3 {
        assert!(w.has_dir(i, "/a") && w.has_dir(i, "/b"), "replica {i}");
    }
}

/// A removal that would leave fewer live voters than a majority of those left is
/// refused: the group would stop.
#[test]
fn a_removal_that_would_stop_the_group_is_refused() {
    let mut w = World::new(3);
    w.run(4000);
    let l = w.leader().unwrap();
    let mut others = (1..=3).filter(|&i| i != l);
    let (dead, other) = (others.next().unwrap(), others.next().unwrap());
    w.crash(dead);
    w.run(3000);
    let e = w.call(remove(other), 0).unwrap_err();
    assert!(e.to_string().contains("would stop"), "{e}");
    // The dead one may go: the two left both answer.
    assert_eq!(w.call(remove(dead), 0), Ok(()));
    let mut voters = vec![l, other];
    voters.sort_unstable();
    w.until_voters(&voters);
    assert_eq!(w.call(mkdir("/after"), 9), Ok(()));
}

/// A replica that lost its disk while a voter and comes back with `--join` under its old
/// id never votes: it would vote with a log that lacks what it acknowledged. With the
/// leader then gone, the one replica left cannot be elected with its vote.
#[test]
fn a_voter_back_on_an_empty_disk_under_its_old_id_never_votes() {
    let mut w = World::new(3);
    w.run(4000);
    assert_eq!(w.call(mkdir("/a"), 1), Ok(()));
    let l = w.leader().unwrap();
    let wiped = (1..=3).find(|&i| i != l).unwrap();
    w.crash(wiped);
    w.join(wiped);
    w.run(3000);
    assert_eq!(w.live(wiped).status().role, "joining");
    w.crash(l);
    w.run(10_000);
    let leading: Vec<u64> = w
        .replicas
        .values()
        .flatten()
        .filter(|r| r.status().role == "leader")
        .map(|r| r.status().id)
        .collect();
    assert_eq!(
        leading,
        Vec::<u64>::new(),
        "elected with a wiped replica's vote"
    );
}

/// A leader may apply its own removal: the leader that proposed it died before it was
/// committed, and the replica it removes, holding it in its log, was elected and
/// committed it with its own term's first entry. It then leads no more; the two
/// replicas left carry the group on with everything acknowledged.
#[test]
fn a_leader_that_applies_its_own_removal_leads_no_more() {
    let mut w = World::new(3);
    w.run(4000);
    assert_eq!(w.call(mkdir("/a"), 1), Ok(()));
    let a = w.leader().unwrap();
    let mut others = (1..=3).filter(|&i| i != a);
    let (b, c) = (others.next().unwrap(), others.next().unwrap());
    // a's appends reach b, but nothing gets back from b, and c hears nothing: the
    // removal of b is in b's log, not committed.
    w.cut.insert((b, a));
    w.cut.insert((a, c));
    w.cut.insert((c, a));
    let asked = w.ask(a, remove(b), 0);
    w.run(300);
    assert!(w.reply(asked).is_none(), "the removal was answered");
    assert_eq!(w.live(b).status().voters.len(), 3);
    w.crash(a);
    w.cut.clear();
    // b, with the longest log, is elected and commits the removal of itself.
    let mut led = false;
    for _ in 0..1000 {
        let role = w.live(b).status().role;
        led |= role == "leader";
        if role == "removed" {
            break;
        }
        w.advance();
    }
    let st = w.live(b).status();
    assert_eq!(st.role, "removed", "{st:?}");
    assert!(
        led,
        "b was not elected: the removal was not its own to apply"
    );
    assert!(
        w.live(b).master().is_none(),
        "a removed replica still serves"
    );
    // With a back, a and c elect a leader and go on.
    w.start(a);
    let mut voters = vec![a, c];
    voters.sort_unstable();
    w.until_voters(&voters);
    assert_eq!(w.call(mkdir("/after"), 2), Ok(()));
    w.run(1000);
    for i in [a, c] {
        for d in ["/a", "/after"] {
            assert!(w.has_dir(i, d), "replica {i} lacks {d}");
        }
    }
    assert_ne!(w.leader(), Some(b));
}

/// Only a replica's own certificate speaks for it: raft messages that claim another
/// replica's id (a higher term, say, that would depose the leader) are dropped, and a
/// client's certificate sends none at all.
#[test]
fn raft_messages_are_believed_only_from_their_own_replica_s_certificate() {
    use crate::auth::Caller;
    let mut w = World::new(3);
    w.run(4000);
    let l = w.leader().expect("one leader");
    let target = (1..=3).find(|&i| i != l).unwrap();
    let other = (1..=3).find(|&i| i != l && i != target).unwrap();
    let term = w.live(target).status().term;
    // A message as the leader would send it, at a far higher term.
    let forged = |from: u64| pb::MasterRequest {
        req: Some(MReq::Raft(pb::RaftMessage {
            msg_type: raft::eraftpb::MessageType::MsgHeartbeat as u32,
            to: target,
            from,
            term: term + 700,
            ..Default::default()
        })),
        ..Default::default()
    };
    let refused = w.live(target).refused();
    for (claims, cert) in [
        (l, Caller::Master { replica: other }),
        (
            l,
            Caller::Client {
                user: "mallory".into(),
                groups: vec![],
            },
        ),
        (l, Caller::Chunkserver { name: "cs1".into() }),
    ] {
        let id = w.next_id;
        w.next_id += 1;
        let now = w.now;
        w.step(
            target,
            Input::Request {
                id,
                req: forged(claims),
                arrived: now,
                from: cert,
            },
        );
    }
    assert_eq!(
        w.live(target).status().term,
        term,
        "a forged message moved the term"
    );
    assert_eq!(w.live(target).refused(), refused + 3);
    // The same message under the sender's own certificate is believed (so the check
    // above could have seen the term move).
    let id = w.next_id;
    w.next_id += 1;
    let now = w.now;
    w.step(
        target,
        Input::Request {
            id,
            req: forged(other),
            arrived: now,
            from: Caller::Master { replica: other },
        },
    );
    assert_eq!(w.live(target).status().term, term + 700);
}

/// A member's own certificate does not make any term believable: one far past the
/// replica's is refused (it would depose the leader, and no chunkserver would take a
/// master epoch that high), while the furthest allowed is taken.
#[test]
fn a_term_far_past_the_replicas_is_refused_even_from_a_member() {
    use crate::auth::Caller;
    let mut w = World::new(3);
    w.run(4000);
    let l = w.leader().expect("one leader");
    let target = (1..=3).find(|&i| i != l).unwrap();
    let other = (1..=3).find(|&i| i != l && i != target).unwrap();
    let term = w.live(target).status().term;
    let send = |w: &mut World, term: u64| {
        let id = w.next_id;
        w.next_id += 1;
        let now = w.now;
        w.step(
            target,
            Input::Request {
                id,
                req: pb::MasterRequest {
                    req: Some(MReq::Raft(pb::RaftMessage {
                        msg_type: raft::eraftpb::MessageType::MsgHeartbeat as u32,
                        to: target,
                        from: other,
                        term,
                        ..Default::default()
                    })),
                    ..Default::default()
                },
                arrived: now,
                from: Caller::Master { replica: other },
            },
        );
    };
    send(&mut w, term + super::MAX_TERM_JUMP + 1);
    assert_eq!(
        w.live(target).status().term,
        term,
        "a term far ahead was taken"
    );
    send(&mut w, term + super::MAX_TERM_JUMP);
    assert_eq!(w.live(target).status().term, term + super::MAX_TERM_JUMP);
}
