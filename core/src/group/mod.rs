//! The master group: three or five master replicas that replicate the op log through
//! raft-rs (TiKV's Raft; see ARCHITECTURE.md for the choice), as GFS replicates its
//! master's log (§5.1.3). Sans-IO like the master: `Replica::handle(now, input)` returns
//! `Effects`; a driver carries them out.
//!
//! - The leader runs the master. Each step's log records become one raft entry; the
//!   master hears `LogSynced` for them once the group has committed the entry (a
//!   majority has it on disk), so its durability contract for replies is unchanged and
//!   now means a quorum.
//! - Every replica, the leader too, applies committed entries to its [`shadow::Shadow`]
//!   with the same `Meta::apply`. A new leader waits until it has applied everything
//!   before its own term's first entry, then starts a master from that state, with a
//!   restart's quiet period: the leader before may have left leases out.
//! - A leader that is deposed drops its master. The requests it held are answered
//!   "not the leader"; their callers ask the new one, with the same token, so a
//!   mutation whose record did commit is answered, not done twice (`retries.rs`).
//! - Snapshots are checkpoints of the shadow state, taken on every replica; the log
//!   behind them is dropped.
//! - Members join and leave one at a time, through the log (`members.rs`): a new
//!   replica joins as a learner, and the leader makes it a voter once it holds the log.

pub mod answers;
pub mod checkpointer;
pub mod lease;
pub mod locations;
pub mod members;
pub mod shadow;
pub mod snapshot_parts;
pub mod store;
pub mod wire;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use prost::Message as _;
use raft::eraftpb as rp;
use raft::{RawNode, StateRole};

use crate::auth::{self, Caller};
use crate::error::FsError;
use crate::master::{self, Call, CallId, Master, MasterConfig, Meta, RequestId};
use crate::pb::{self, master_request::Req, master_response::Resp};
use crate::rng::Rng;
use crate::types::{LogSeq, Time};

pub use members::{Change, Members};
pub use store::{LogStore, Write};

/// The rate a snapshot is assumed to cross the network at, at worst, when a leader
/// judges whether a follower's snapshot was lost (`Replica::retry_snapshots`).
const SLOW_LINK_BYTES_PER_SEC: f64 = 8.0 * 1024.0 * 1024.0;

/// The furthest past its own term a replica believes a member's message: a group moves
/// its term by one an election (pre-vote keeps a cut-off replica from inflating it), so
/// a term further ahead is forged or damaged. The same bound as a chunkserver's on a
/// master's epoch.
pub const MAX_TERM_JUMP: u64 = crate::master::MAX_EPOCH_JUMP;

#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// This replica's id in the group (1 and up).
    pub id: u64,
    /// Every member's id and address, this one's included: the replica's address book.
    /// Given, it is the group a replica forms (or, for one that joins, where the group
    /// is); once the store knows the members from the log, the store's are used, and
    /// they change with the membership.
    pub members: BTreeMap<u64, String>,
    /// One consensus tick (`Input::RaftTick` comes this often).
    pub tick: Duration,
    /// Ticks without a leader before a follower stands for election (raft-rs draws the
    /// timeout between this and twice it; here the draw is seeded).
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// Log records applied between snapshots.
    pub snapshot_every: u64,
    /// A snapshot sent to another replica larger than this goes in parts of this size
    /// (`snapshot_parts.rs`), each a call of its own; the snapshot a replica stores lies
    /// in values of this size too (`store.rs`).
    pub snapshot_part_bytes: usize,
    /// Seeds the election timeouts.
    pub seed: u64,
}

impl GroupConfig {
    pub fn new(id: u64, members: BTreeMap<u64, String>) -> GroupConfig {
        GroupConfig {
            id,
            members,
            tick: Duration::from_millis(100),
            election_ticks: 10,
            heartbeat_ticks: 2,
            snapshot_every: 100_000,
            snapshot_part_bytes: 4 << 20,
            seed: 0,
        }
    }

    /// The shortest a follower waits after hearing from a leader before it votes for
    /// another, on its own clock: its ticks come `tick` apart, and the first may come
    /// at once.
    pub fn election_floor(&self) -> Duration {
        self.tick * (self.election_ticks.saturating_sub(1) as u32)
    }
}

// One input at a time, moved into `handle`: a request's size is no cost worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Input {
    /// A request from a client, a chunkserver or another replica, and when it arrived
    /// (it may have waited behind a slow sync since).
    Request {
        id: RequestId,
        req: pb::MasterRequest,
        arrived: Time,
        /// Who sent it, as the transport authenticated it (`crate::auth`).
        from: Caller,
    },
    CallResult {
        id: CallId,
        result: Result<pb::ChunkResponse, crate::error::RpcError>,
    },
    /// The master's tick (liveness, leases, re-replication, garbage).
    Tick,
    /// The consensus tick.
    RaftTick,
    /// Every `Persist` up to and including `number` is durable.
    Persisted {
        number: u64,
    },
    Malformed {
        id: RequestId,
        error: String,
    },
    /// The checkpoint asked of the replica's checkpointer, built (see `checkpointer.rs`).
    Checkpointed(checkpointer::Taken),
    /// The copy of the committed state asked of the checkpointer for a new leader's
    /// master, built.
    MasterCopy(checkpointer::Handover),
    /// With `Replica::hold_proposals`: every event ready now has been handled; the
    /// master's records since the last flush are proposed, as one entry.
    Flush,
    /// Another replica's answer to this one's `raft_batch`, with the messages it had
    /// for this one when it answered (`answers.rs`), and when the answer arrived.
    Answer {
        batch: pb::RaftBatch,
        arrived: Time,
    },
}

/// Writes for the replica's store. Persists are carried out in the order given.
#[derive(Debug)]
pub struct Persist {
    pub number: u64,
    pub writes: Vec<Write>,
    /// The replica waits for these writes: the driver syncs them and then answers
    /// `Persisted`. (A Persist it does not wait for may come of no `Ready`; its number is
    /// then 0.) Without it nothing waits for them (they only move the commit index
    /// on, which a replica that lost it learns again from the group): they are written
    /// before any later Persist's and are durable with its sync, and a crash before
    /// that may lose them.
    pub wait: bool,
}

/// One step of a replica's master, for the observers that watch it
/// (`Effects::master_steps`).
#[derive(Debug)]
pub struct MasterStep {
    /// The generation of the master that took it (`Replica::master_of`).
    pub generation: u64,
    /// The clock reading the master took the step at: the replica's, which never goes
    /// back, not the driver's (which may, after a clock jump). A recorder writes this
    /// one down, for a replay gives the master only what the trace holds.
    pub now: Time,
    pub input: master::Input,
    pub effects: master::Effects,
    /// Until when the master knew it led as it took the step (`Master::set_authority`).
    pub authority: Time,
}

/// A master a replica started (taking over as leader), for the observers: what
/// `Master::take_over` was given.
#[derive(Debug)]
pub struct MasterStart {
    /// Its generation (`Replica::master_of`).
    pub generation: u64,
    /// The checkpoint of the state it took over.
    pub checkpoint: pb::Checkpoint,
    /// Its term.
    pub epoch: u64,
    /// The replica's clock as it started (see `MasterStep::now`).
    pub now: Time,
}

#[derive(Debug, Default)]
pub struct Effects {
    pub replies: Vec<(RequestId, pb::MasterResponse)>,
    /// The master's calls to chunkservers.
    pub calls: Vec<Call>,
    /// Messages to other replicas, by address, in the order made: a driver may send
    /// those for one address together, as one `MasterRequest::raft_batch`
    /// ([`wire::batches`]).
    pub send: Vec<(String, pb::RaftMessage)>,
    pub persist: Vec<Persist>,
    /// With `Replica::observe`: each step the master took, its input and effects, for
    /// the checks and recorders that watch a master.
    /// Each is tagged with the generation of the master that took it
    /// (`Replica::master_of`): a master stopped in this step took some of them.
    pub master_steps: Vec<MasterStep>,
    /// With `Replica::observe`: each master this replica started (taking over as
    /// leader), before its first step.
    pub master_starts: Vec<MasterStart>,
    /// For the checkpointer a driver runs on a task of its own
    /// (`Replica::take_checkpointer`), in order; empty while the replica runs it itself.
    pub checkpointer: Vec<checkpointer::Feed>,
}

/// The most the records of several master steps merged into one raft entry take,
/// encoded (`Replica::hold_proposals`): raft-rs's limit for one append message.
const MERGED_BYTES: usize = 1 << 20;

/// Bits of a chunkserver call's id that are its master's own (`Replica::generation`).
const CALL_ID_BITS: u32 = 40;

/// What `tessera admin masters` shows of a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub id: u64,
    pub role: &'static str,
    pub term: u64,
    pub leader: u64,
    pub commit: u64,
    pub applied: u64,
    pub last_index: u64,
    /// The last master log record applied.
    pub seq: LogSeq,
    /// Leading, caught up, and running its master.
    pub serving: bool,
    /// The voters and learners this replica has applied.
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
}

pub struct Replica {
    cfg: GroupConfig,
    mcfg: MasterConfig,
    node: RawNode<LogStore>,
    shadow: shadow::Shadow,
    master: Option<Master>,
    /// Requests handed to the master and not yet answered.
    asked: BTreeSet<RequestId>,
    /// The raft entry each of the master's steps was proposed as, and its last record.
    proposed: BTreeMap<u64, LogSeq>,
    /// Messages raft-rs sends only once a `Persist` is durable, by its number.
    held: VecDeque<(u64, Vec<rp::Message>)>,
    /// The last `Persist` given out and not yet reported durable.
    unpersisted: Option<u64>,
    authority: lease::Authority,
    /// The term this replica last led, or 0.
    led: u64,
    ticks: u64,
    rng_seed: u64,
    /// Votes are refused before this (see `lease.rs`).
    vote_after: Time,
    last_snapshot_seq: LogSeq,
    /// Copy each master step into `Effects::master_steps`.
    observed: bool,
    /// Numbers the masters this replica has run: a call's id carries its master's in
    /// its high bits, so a result that comes back after a new master took over (its
    /// call ids start again at 1) is not taken for one of the new master's calls.
    generation: u64,
    /// The master's records, waiting to be proposed: raft-rs takes no proposal between
    /// handing out a `Ready` and its advance, and a commit applied from one releases
    /// work that logs.
    unproposed: VecDeque<(pb::RaftRecords, LogSeq)>,
    /// Records wait for `Input::Flush` (`hold_proposals`), and this step is one.
    hold: bool,
    flushing: bool,
    /// The `Persist` that stores a snapshot taken from the leader, until it is durable:
    /// the replica does not tick meanwhile (an election would read entries the snapshot
    /// replaced before raft-rs counts it persisted).
    snapshot_unpersisted: Option<u64>,
    /// Followers sent a snapshot, and the tick it went at: one not taken within a few
    /// election timeouts is reported failed, so raft-rs sends again.
    snapshots_out: BTreeMap<u64, u64>,
    /// Snapshots coming from other replicas in parts.
    assembler: snapshot_parts::Assembler,
    /// The state of a snapshot a peer sent, restored when it was checked in this step
    /// (its index and term), for raft-rs's taking it.
    restored: Option<(u64, u64, shadow::Shadow)>,
    /// The master stopped in the latest step, and its generation: the steps it took
    /// before it stopped are shown to observers with it (`master_of`).
    stopped: Option<(u64, Master)>,
    /// Requests and replica messages refused because of who sent them.
    refused: u64,
    /// Chunk locations from the chunkservers' heartbeats (every replica gets a copy).
    locations: locations::Locations,
    /// Membership changes proposed for an admin's request, by their entry's index: the
    /// request is answered once the entry is applied.
    conf_asked: BTreeMap<u64, RequestId>,
    /// Take a snapshot at the next applied entry whatever the count (a learner was added:
    /// it must start from a snapshot, which names the members, not from the log's first
    /// entry, which comes after the group's first members were set).
    compact_now: bool,
    /// The copy asked of the checkpointer for a new leader's master: the term, and the
    /// entry it is as of.
    copy_asked: Option<(u64, u64)>,
    /// The checkpointer, while the replica runs it itself (inside `handle`); a driver
    /// takes it to run it beside the replica.
    checkpointer: Option<checkpointer::Checkpointer>,
    /// The entry a checkpoint was asked as of, until it comes back.
    checkpoint_asked: Option<u64>,
    /// Calls from other replicas whose answers carry this replica's messages back.
    answers: answers::Answers,
    /// The sender of the last message raft-rs took (`on_peer`), for `answers`.
    took_from: Option<u64>,
    /// When a message from each other replica last arrived (for the leader: which
    /// followers answer).
    last_heard: BTreeMap<u64, Time>,
    /// When a message from the leader of the current term last arrived, and what that
    /// leader had committed when it sent it.
    heard: Option<(Time, u64)>,
    /// When this replica last knew its applied state was the group's latest committed
    /// one: it led with authority, or had applied all a leader's message committed.
    current_at: Option<Time>,
    now: Time,
    out: Effects,
}

impl Replica {
    /// Starts (or restarts: it is the same) a replica on what its store holds.
    pub fn start(
        cfg: GroupConfig,
        mcfg: MasterConfig,
        now: Time,
        store: LogStore,
    ) -> Result<Replica, String> {
        let mut cfg = cfg;
        let mut store = store;
        store.set_part_bytes(cfg.snapshot_part_bytes);
        let mut adopted = false;
        let Some(own) = cfg.members.get(&cfg.id).cloned() else {
            return Err(format!("replica {} is not among the members", cfg.id));
        };
        if let Some(known) = store.members().addresses.get(&cfg.id)
            && *known != own
        {
            return Err(format!(
                "replica {} is at {known} in the group's log, not at {own}",
                cfg.id
            ));
        }
        if store.members().addresses.is_empty() && !store.conf().voters.is_empty() {
            // A store from before membership could change: its voters' addresses are
            // the ones given (the driver checked they name the same replicas).
            let given = store
                .conf()
                .voters
                .iter()
                .filter_map(|id| Some((*id, cfg.members.get(id)?.clone())))
                .collect();
            store.adopt(Members::of(given));
            // Its snapshot, written before snapshots named the members, would be refused
            // by a follower that needs it: the next applied entry takes a new one.
            adopted = true;
        }
        // A learner added before a crash whose snapshot (`want_snapshot`) was not yet
        // taken: the next applied entry asks for it again.
        let unnamed = !store.conf().learners.is_empty()
            && store::members_of(store.snapshot_ref()).map_or(true, |m| {
                store
                    .conf()
                    .learners
                    .iter()
                    .any(|l| !m.addresses.contains_key(l))
            });
        if unnamed {
            let next = store.snapshot_index() + 1;
            store.want_snapshot(next);
        }
        if !store.members().addresses.is_empty() {
            cfg.members = store.members().addresses.clone();
        }
        cfg.members.insert(cfg.id, own);
        if cfg.election_ticks < 2 || cfg.heartbeat_ticks == 0 {
            return Err("the election timeout must be at least two ticks".into());
        }
        let shadow = shadow::Shadow::from_snapshot(store.snapshot_ref(), &mcfg)?;
        let checkpointer = checkpointer::Checkpointer::new(store.snapshot_ref(), &mcfg)?;
        let rcfg = raft::Config {
            id: cfg.id,
            election_tick: cfg.election_ticks,
            heartbeat_tick: cfg.heartbeat_ticks,
            applied: shadow.applied,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            // A leader's commit reaches followers with its next append or heartbeat, not
            // in a message of its own after every commit: half the messages under load,
            // and a shadow waits for its next append, which under load comes at once.
            skip_bcast_commit: true,
            ..Default::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let node = RawNode::new(&rcfg, store, &logger).map_err(|e| e.to_string())?;
        let mut mcfg = mcfg;
        // Snapshots come from the shadow state; the master makes none of its own.
        mcfg.checkpoint_every = u64::MAX;
        let last_snapshot_seq = shadow.seq;
        let vote_after = now + cfg.election_floor() + cfg.tick;
        let locations = locations::Locations::new(mcfg.max_servers);
        let mut r = Replica {
            rng_seed: cfg.seed ^ cfg.id.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            cfg,
            mcfg,
            node,
            shadow,
            master: None,
            asked: BTreeSet::new(),
            proposed: BTreeMap::new(),
            held: VecDeque::new(),
            unpersisted: None,
            authority: lease::Authority::default(),
            led: 0,
            ticks: 0,
            vote_after,
            last_snapshot_seq,
            observed: false,
            generation: 0,
            unproposed: VecDeque::new(),
            hold: false,
            flushing: false,
            snapshot_unpersisted: None,
            snapshots_out: BTreeMap::new(),
            assembler: snapshot_parts::Assembler::default(),
            restored: None,
            stopped: None,
            refused: 0,
            locations,
            conf_asked: BTreeMap::new(),
            compact_now: adopted || unnamed,
            checkpointer: Some(checkpointer),
            copy_asked: None,
            checkpoint_asked: None,
            answers: answers::Answers::default(),
            took_from: None,
            last_heard: BTreeMap::new(),
            heard: None,
            current_at: None,
            now,
            out: Effects::default(),
        };
        r.seed_timeout();
        Ok(r)
    }

    /// The checkpointer, for a driver to run beside the replica, fed with
    /// `Effects::checkpointer`; what it builds comes back as `Input::Checkpointed`.
    /// Until it is taken the replica runs it itself, inside `handle`.
    pub fn take_checkpointer(&mut self) -> Option<checkpointer::Checkpointer> {
        self.checkpointer.take()
    }

    /// From now on the master's records wait for `Input::Flush`, which a driver gives
    /// once it has handled every event ready at once: they go to the group as one entry
    /// (one append to each follower, one entry to store and apply) instead of one per
    /// step. Without it each step's records are proposed at once.
    pub fn hold_proposals(&mut self) {
        self.hold = true;
    }

    /// Reports every step of the master in `Effects::master_steps` from now on.
    pub fn observe(&mut self) {
        self.observed = true;
    }

    pub fn status(&self) -> Status {
        let raft = &self.node.raft;
        let mut conf = raft.prs().conf().to_conf_state();
        conf.voters.sort_unstable();
        conf.learners.sort_unstable();
        let me = self.cfg.id;
        Status {
            id: me,
            role: match raft.state {
                StateRole::Leader => "leader",
                StateRole::Candidate | StateRole::PreCandidate => "candidate",
                StateRole::Follower if conf.voters.contains(&me) => "shadow",
                StateRole::Follower if conf.learners.contains(&me) => "learner",
                StateRole::Follower if self.node.store().members().retired.contains(&me) => {
                    "removed"
                }
                StateRole::Follower => "joining",
            },
            term: raft.term,
            leader: raft.leader_id,
            commit: raft.raft_log.committed,
            applied: self.shadow.applied,
            last_index: raft.raft_log.last_index(),
            seq: self.shadow.seq,
            serving: self.master.is_some(),
            voters: conf.voters,
            learners: conf.learners,
        }
    }

    /// What `tessera admin masters` is told.
    fn status_pb(&self) -> pb::ReplicaStatus {
        let s = self.status();
        pb::ReplicaStatus {
            id: s.id,
            role: s.role.into(),
            term: s.term,
            leader: s.leader,
            commit: s.commit,
            applied: s.applied,
            last_index: s.last_index,
            seq: s.seq,
            serving: s.serving,
            members: self.cfg.members.clone().into_iter().collect(),
            lag_ms: self.lag_ms(),
            voters: s.voters,
            learners: s.learners,
        }
    }

    /// The master, while this replica leads and serves.
    pub fn master(&self) -> Option<&Master> {
        self.master.as_ref()
    }

    /// The master of generation `g` (see `Effects::master_steps`): the one running, or
    /// one stopped in the latest step.
    pub fn master_of(&self, g: u64) -> Option<&Master> {
        match (&self.master, &self.stopped) {
            (Some(m), _) if g == self.generation => Some(m),
            (_, Some((sg, m))) if *sg == g => Some(m),
            _ => None,
        }
    }

    /// Until when this replica's master may extend chunk leases (`lease.rs`); Time::ZERO
    /// when it runs none.
    pub fn authority_until(&self) -> Time {
        if self.master.is_none() {
            return Time::ZERO;
        }
        self.authority.until(
            self.cfg.election_floor(),
            self.mcfg.lease_duration,
            self.mcfg.max_clock_skew,
        )
    }

    /// The committed state.
    pub fn shadow(&self) -> &shadow::Shadow {
        &self.shadow
    }

    pub fn config(&self) -> &GroupConfig {
        &self.cfg
    }

    pub fn handle(&mut self, now: Time, input: Input) -> Effects {
        self.now = self.now.max(now);
        self.stopped = None;
        match input {
            Input::Request { id, req, from, .. }
                if let Some(Err(e)) = req.req.as_ref().map(|r| auth::master_request(&from, r)) =>
            {
                self.refused += 1;
                self.out.replies.push((id, master::err(e)));
            }
            Input::Request {
                id,
                req,
                arrived,
                from,
            } => match req.req {
                Some(Req::Raft(m)) => {
                    if self.speaks_for(&from, m.from) {
                        self.on_peer(m, arrived);
                    }
                    self.out
                        .replies
                        .push((id, master::ok(Resp::Empty(pb::Empty {}))));
                }
                Some(Req::RaftBatch(b)) => {
                    // An answer is held only for a small batch (the transport counts a
                    // request's bytes against its memory bound until it is answered),
                    // and only for a caller this replica took a message from: it
                    // carries back only messages meant for that replica.
                    let small = b.encoded_len() <= answers::HOLD_BYTES;
                    self.took_from = None;
                    for m in b.messages {
                        if self.speaks_for(&from, m.from) {
                            self.on_peer(m, arrived);
                        }
                    }
                    for p in b.snapshot_parts {
                        let sender = p.message.as_ref().map_or(0, |m| m.from);
                        if self.speaks_for(&from, sender) {
                            self.on_snapshot_part(p, arrived);
                        }
                    }
                    match self.took_from.take() {
                        Some(peer) if b.answers && small => self.answers.hold(id, peer),
                        _ => self
                            .out
                            .replies
                            .push((id, master::ok(Resp::Empty(pb::Empty {})))),
                    }
                }
                Some(Req::ReplicaStatus(_)) => {
                    let status = self.status_pb();
                    self.out
                        .replies
                        .push((id, master::ok(Resp::ReplicaStatus(status))));
                }
                Some(Req::ChangeMembers(c)) => self.on_change_members(id, c),
                Some(Req::Heartbeat(ref hb)) if hb.copy => {
                    // For this replica's chunk locations only: the leader's master hears
                    // the server's own heartbeat, and answers it.
                    self.record_heartbeat(hb, &from);
                    self.out
                        .replies
                        .push((id, master::ok(Resp::Empty(pb::Empty {}))));
                }
                _ => {
                    if let Some(Req::Heartbeat(hb)) = &req.req {
                        self.record_heartbeat(hb, &from);
                    }
                    self.on_request(id, req, from)
                }
            },
            Input::Malformed { id, error } => self.out.replies.push((
                id,
                master::err(FsError::InvalidArgument(format!(
                    "malformed request: {error}"
                ))),
            )),
            Input::CallResult { id, result } => {
                if id >> CALL_ID_BITS == self.generation && self.master.is_some() {
                    let id = id & ((1 << CALL_ID_BITS) - 1);
                    self.pass_to_master(master::Input::CallResult { id, result });
                }
            }
            Input::Tick => self.pass_to_master(master::Input::Tick),
            Input::Flush => self.flushing = true,
            Input::Answer { batch, arrived } => {
                for m in batch.messages {
                    self.on_peer(m, arrived);
                }
            }
            Input::MasterCopy(h) => self.copied(h),
            Input::Checkpointed(t) => {
                let mut writes = Vec::new();
                self.checkpointed(t, &mut writes);
                if !writes.is_empty() {
                    // Nothing waits for a compaction: a crash before it is durable leaves
                    // the snapshot before it and the entries it would have dropped.
                    self.out.persist.push(Persist {
                        number: 0,
                        writes,
                        wait: false,
                    });
                }
            }
            Input::RaftTick => {
                if self.snapshot_unpersisted.is_none() {
                    self.node.tick();
                }
                self.ticks += 1;
                self.retry_snapshots();
                self.assembler
                    .expire(self.ticks, 3 * self.cfg.election_ticks as u64);
                self.promote_learners();
                if self.node.raft.state == StateRole::Leader
                    && self.ticks.is_multiple_of(self.cfg.heartbeat_ticks as u64)
                {
                    self.node.read_index(lease::Authority::context(self.now));
                }
            }
            Input::Persisted { number } => {
                if self.snapshot_unpersisted.is_some_and(|n| n <= number) {
                    self.snapshot_unpersisted = None;
                }
                self.node.on_persist_ready(number);
                self.answers.persisted(number);
                self.tell_applied();
                if self.unpersisted.is_some_and(|n| n <= number) {
                    self.unpersisted = None;
                }
                while self.held.front().is_some_and(|(n, _)| *n <= number) {
                    let (_, msgs) = self.held.pop_front().expect("checked");
                    self.send(msgs);
                }
            }
        }
        self.seed_timeout();
        self.propose();
        self.drain();
        self.roles();
        self.propose();
        self.drain();
        self.note_current();
        if !self.answers.is_empty() {
            for (id, batch) in self.answers.due(self.unpersisted, &mut self.out.send) {
                self.out
                    .replies
                    .push((id, master::ok(Resp::RaftBatch(batch))));
            }
        }
        self.flushing = false;
        // Not taken by raft-rs in this step (a snapshot it refused): not kept.
        self.restored = None;
        std::mem::take(&mut self.out)
    }

    /// How long ago this replica last knew its state was the latest committed one
    /// (u64::MAX: not since it started).
    pub fn lag_ms(&self) -> u64 {
        self.current_at
            .map_or(u64::MAX, |t| self.now.saturating_sub(t).as_millis() as u64)
    }

    fn note_current(&mut self) {
        if self.master.is_some() && self.now < self.authority_until() {
            self.current_at = Some(self.now);
        } else if let Some((at, commit)) = self.heard
            && self.shadow.applied >= commit
        {
            self.current_at = Some(self.current_at.map_or(at, |c| c.max(at)));
        }
    }

    fn record_heartbeat(&mut self, hb: &pb::HeartbeatRequest, from: &Caller) {
        let recorded = self.locations.record(
            self.now,
            hb,
            self.shadow.meta.cluster_id,
            self.mcfg.heartbeat_timeout,
            crate::master::cert_name(from),
        );
        if !recorded {
            tracing::debug!(server = %hb.address, "a heartbeat not taken for chunk locations");
        }
    }

    /// A read answered from the committed state this replica has applied, with how far
    /// behind the leader it may be.
    fn answer_stale(&mut self, id: RequestId, req: &pb::MasterRequest, from: &Caller) {
        use crate::master::reads;
        use crate::path::normalize;
        let (meta, now) = (&self.shadow.meta, self.now);
        let timeout = self.mcfg.heartbeat_timeout;
        let result = match req.req.as_ref() {
            Some(Req::List(r)) => normalize(&r.path)
                .and_then(|p| reads::list_page(meta, &p, r, from))
                .map(Resp::List),
            Some(Req::Stat(r)) => normalize(&r.path)
                .and_then(|p| reads::stat(meta, &p, from))
                .map(Resp::Stat),
            Some(Req::GetChunks(r)) => normalize(&r.path)
                .and_then(|p| {
                    reads::chunk_locations(meta, &p, r.first_index, r.count, from, |h, c| {
                        self.locations.replicas(now, timeout, meta, h, c)
                    })
                })
                .map(|mut r| {
                    // Signed as the leader signs (`crate::capability`): the keys derive
                    // from the logged secret, and the servers' heartbeat copies say which
                    // they hold.
                    let locations = &self.locations;
                    crate::capability::sign_locations(
                        &mut r,
                        &meta.capability_secret,
                        now,
                        self.mcfg.lease_duration,
                        from,
                        |a| locations.keys(a),
                    );
                    Resp::GetChunks(r)
                }),
            Some(Req::Report(_)) => Ok(Resp::Report(self.locations.report(
                now,
                timeout,
                meta,
                self.mcfg.chunk_size,
            ))),
            _ => Err(FsError::InvalidArgument(
                "a shadow master answers only list, stat, chunk locations and report".into(),
            )),
        };
        let mut resp = match result {
            Ok(r) => master::ok(r),
            Err(e) => master::err(e),
        };
        resp.shadow = Some(pb::ShadowAnswer {
            replica: self.cfg.id,
            address: self.cfg.members[&self.cfg.id].clone(),
            seq: self.shadow.seq,
            lag_ms: self.lag_ms(),
        });
        self.out.replies.push((id, resp));
    }

    // ---- requests -----------------------------------------------------------------

    fn on_request(&mut self, id: RequestId, req: pb::MasterRequest, from: Caller) {
        let read = matches!(
            req.req,
            Some(Req::List(_) | Req::Stat(_) | Req::GetChunks(_) | Req::Report(_) | Req::Fsck(_))
        );
        let shadow_read = req.stale_ok
            && matches!(
                req.req,
                Some(Req::List(_) | Req::Stat(_) | Req::GetChunks(_) | Req::Report(_))
            );
        if shadow_read && (self.master.is_none() || self.now >= self.authority_until()) {
            self.answer_stale(id, &req, &from);
            return;
        }
        if self.master.is_none() {
            let leader = self.leader_addr();
            self.out
                .replies
                .push((id, master::err(FsError::NotLeader(leader))));
            return;
        }
        if read && self.now >= self.authority_until() {
            // A view of the namespace is answered only while no other replica can have
            // been elected (`lease.rs`): a leader cut off from its group still thinks
            // it leads for a while, and would answer from a state the new leader has
            // moved past. (A mutation's refusal is such a view too: see `absorb`.)
            self.out.replies.push((
                id,
                master::err(FsError::Unavailable(
                    "the master group's leader is confirming it still leads".into(),
                )),
            ));
            return;
        }
        self.asked.insert(id);
        self.pass_to_master(master::Input::Request { id, req, from });
    }

    /// Whether a raft message that says it is from replica `sender` may be believed of
    /// `from`: only a replica's own certificate speaks for it. One that does not is
    /// dropped (and counted), as a message from a non-member is.
    fn speaks_for(&mut self, from: &Caller, sender: u64) -> bool {
        let ok = match from {
            Caller::Insecure => true,
            Caller::Master { replica } => *replica == sender,
            _ => false,
        };
        if !ok {
            self.refused += 1;
            tracing::warn!(%from, sender, "refused a replica message: its certificate is not that replica's");
        }
        ok
    }

    /// Requests and replica messages refused because of who sent them (`crate::auth`).
    pub fn refused(&self) -> u64 {
        self.refused + self.master.as_ref().map_or(0, |m| m.refused())
    }

    fn leader_addr(&self) -> String {
        let l = self.node.raft.leader_id;
        if l == self.cfg.id && self.master.is_none() {
            // Leading, but not yet caught up: ask again here shortly.
            return self.cfg.members[&self.cfg.id].clone();
        }
        self.cfg.members.get(&l).cloned().unwrap_or_default()
    }

    /// A part of a snapshot from another replica: the snapshot message, once whole, is
    /// taken as any other.
    fn on_snapshot_part(&mut self, p: pb::RaftSnapshotPart, arrived: Time) {
        let (from, to, term) = p
            .message
            .as_ref()
            .map(|m| (m.from, m.to, m.term))
            .unwrap_or((0, 0, 0));
        if term < self.node.raft.term {
            // raft-rs would refuse the snapshot of an earlier term: not held.
            tracing::debug!(from, term, "a snapshot part of an earlier term dropped");
            return;
        }
        if to != self.cfg.id || !self.cfg.members.contains_key(&from) || from == to {
            tracing::warn!(
                from,
                to,
                "refused a snapshot part: the sender is no member this replica knows, or \
                 it is meant for another"
            );
            return;
        }
        match self.assembler.take(p, self.ticks) {
            Ok(Some(m)) => {
                let bytes = m.snapshot.as_ref().map_or(0, |s| s.data.len());
                tracing::info!(from, bytes, "a snapshot sent in parts is whole");
                self.on_peer(m, arrived)
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(from, error = %e, "refused a snapshot part"),
        }
    }

    /// Parts taken, and snapshots made whole from parts, since this replica started.
    pub fn snapshot_parts_taken(&self) -> (u64, u64) {
        (self.assembler.parts_taken, self.assembler.assembled)
    }

    /// A message from another replica, checked before raft-rs takes it.
    fn on_peer(&mut self, m: pb::RaftMessage, arrived: Time) {
        let leader_commit = m.leader_commit;
        let m = match wire::message_from_pb(m) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "refused a replica message");
                return;
            }
        };
        if m.to != self.cfg.id || !self.cfg.members.contains_key(&m.from) || m.from == m.to {
            tracing::warn!(
                from = m.from,
                to = m.to,
                "refused a replica message: the sender is no member this replica knows \
                 (removed from the group, or not yet added), or it is meant for another"
            );
            return;
        }
        if m.term > self.node.raft.term.saturating_add(MAX_TERM_JUMP) {
            // Believed, a term that high would depose the leader and leave the group to
            // elect in it; chunkservers refuse it as a master's epoch (`chunkserver`'s
            // `epoch.rs`), so no leader of it could give an order.
            tracing::warn!(
                from = m.from,
                ours = self.node.raft.term,
                theirs = m.term,
                "refused a replica message: its term is far past this replica's (forged, \
                 or damaged)"
            );
            return;
        }
        match self.check_peer(&m) {
            Err(e) => {
                tracing::warn!(from = m.from, error = %e, "refused a replica message");
                return;
            }
            Ok(Some(sh)) => {
                // Restored to check it: kept for raft-rs's taking it in this step.
                let meta = m.get_snapshot().get_metadata();
                self.restored = Some((meta.index, meta.term, sh));
            }
            Ok(None) => {}
        }
        self.last_heard.insert(m.from, arrived.min(self.now));
        use rp::MessageType::*;
        let mut m = m;
        if m.msg_type == MsgAppend
            && !m.entries.is_empty()
            && self.node.store().conf().voters.is_empty()
        {
            // A replica that joins knows no members until a snapshot names them: the
            // log's entries change a membership it would not know. Without them the
            // append is a probe this replica rejects (it lacks the entry named), so the
            // leader steps back to the start of its log, compacted through the entry that
            // added this replica once its checkpointer has built that snapshot
            // (`LogStore::want_snapshot`), and sends the snapshot.
            tracing::debug!(from = m.from, "a joining replica waits for a snapshot");
            m.entries = Vec::new().into();
        }
        if matches!(m.msg_type, MsgRequestVote | MsgRequestPreVote)
            && !self.node.store().conf().voters.contains(&self.cfg.id)
        {
            // Only a voter votes (raft-rs would grant a vote whatever its own
            // membership): a replica still joining, a learner catching up, or one that
            // left holds no log a vote may rely on.
            return;
        }
        if m.msg_type == MsgAppend {
            // Addresses of members being added, as soon as their entries arrive: a
            // replica may have to hear from (or elect) a new member before it has
            // applied the entry that added it.
            for e in m.entries.iter() {
                if e.entry_type == rp::EntryType::EntryConfChange
                    && let Ok(Change::AddLearner(id, a) | Change::Promote(id, a)) =
                        Change::decode(&e.data)
                    && !self.node.store().members().retired.contains(&id)
                {
                    self.cfg.members.entry(id).or_insert(a);
                }
            }
        }
        if matches!(m.msg_type, MsgRequestVote | MsgRequestPreVote) && !m.context.is_empty() {
            // A leader transfer's forced campaign, which skips the refusal that keeps a
            // leader's authority (`lease.rs`); Tessera never transfers leadership.
            tracing::warn!(from = m.from, "refused a forced vote request");
            return;
        }
        if matches!(m.msg_type, MsgRequestVote | MsgRequestPreVote) && self.now < self.vote_after {
            // Just started: it may have heard from a leader just before (`lease.rs`).
            return;
        }
        let from_leader = matches!(m.msg_type, MsgAppend | MsgHeartbeat);
        let (from, term) = (m.from, m.term);
        if let Err(e) = self.node.step(m) {
            tracing::debug!(error = %e, "replica message not taken");
            return;
        }
        self.took_from = Some(from);
        let raft = &self.node.raft;
        if from_leader && from == raft.leader_id && term == raft.term && leader_commit > 0 {
            // As of when it arrived, not when it was taken: it may have waited.
            self.heard = Some((arrived.min(self.now), leader_commit));
        }
    }

    /// What raft-rs would take on trust from a peer and fail on: entries that are not
    /// Tessera's, a snapshot that does not restore, a commit past the log. A snapshot's
    /// state, restored to check it, is given back.
    fn check_peer(&self, m: &rp::Message) -> Result<Option<shadow::Shadow>, String> {
        let mut restored = None;
        if m.term == 0 {
            // raft-rs takes a message of term 0 for one a replica made for itself.
            return Err("a replica message without a term".into());
        }
        for e in m.entries.iter() {
            if e.term == 0 {
                return Err(format!("entry {} has no term", e.index));
            }
            match e.entry_type {
                rp::EntryType::EntryNormal if e.data.is_empty() => {}
                rp::EntryType::EntryNormal => {
                    pb::RaftRecords::decode(e.data.clone())
                        .map_err(|err| format!("entry {} does not decode: {err}", e.index))?;
                }
                rp::EntryType::EntryConfChange => {
                    Change::decode(&e.data).map_err(|err| format!("entry {}: {err}", e.index))?;
                }
                rp::EntryType::EntryConfChangeV2 => {
                    // Tessera changes one member at a time, never through a joint
                    // configuration.
                    return Err(format!(
                        "entry {} is a joint membership change, which Tessera never makes",
                        e.index
                    ));
                }
            }
        }
        if let Some(s) = m.snapshot.as_ref()
            && m.msg_type == rp::MessageType::MsgSnapshot
        {
            let index = s.get_metadata().index;
            wire::check_conf(s.get_metadata().get_conf_state())
                .map_err(|e| format!("snapshot {index}: {e}"))?;
            let members = store::members_of(s).map_err(|e| format!("snapshot {index}: {e}"))?;
            let me = self.cfg.id;
            let own = &self.cfg.members[&me];
            if let Some(a) = members.addresses.get(&me)
                && a != own
            {
                return Err(format!(
                    "snapshot {index} names this replica {me} at {a}, but it serves at {own}: \
                     it was added under another address (remove it, and add it again)"
                ));
            }
            let conf = self.node.store().conf();
            if conf.voters.is_empty()
                && conf.learners.is_empty()
                && s.get_metadata().get_conf_state().voters.contains(&me)
            {
                // Joined with an empty store, yet the group counts this id a voter: it
                // lost its disk while a member, and would vote with a log that lacks
                // what it acknowledged.
                return Err(format!(
                    "snapshot {index} counts replica {me} a voter, but it joined with an empty \
                     store: it lost its data while a member. Remove it from the group and add \
                     it under a new id"
                ));
            }
            restored = Some(
                shadow::Shadow::from_snapshot(s, &self.mcfg)
                    .map_err(|e| format!("snapshot {}: {e}", s.get_metadata().index))?,
            );
        }
        if m.msg_type == rp::MessageType::MsgAppend {
            // Entries follow the one named, in order, no newer than the sender's term,
            // and only the log's start has term 0.
            if m.index > 0 && m.log_term == 0 {
                return Err(format!("append after entry {} of term 0", m.index));
            }
            let mut prev = (m.index, m.log_term);
            for e in m.entries.iter() {
                if Some(e.index) != prev.0.checked_add(1) || e.term < prev.1 || e.term > m.term {
                    return Err(format!(
                        "append entry {} (term {}) after {} (term {}) in term {}",
                        e.index, e.term, prev.0, prev.1, m.term
                    ));
                }
                prev = (e.index, e.term);
            }
        }
        if m.msg_type == rp::MessageType::MsgHeartbeat
            && m.commit > self.node.raft.raft_log.last_index()
            && m.term >= self.node.raft.term
        {
            // raft-rs sends a heartbeat's commit no further than the follower's log.
            return Err(format!(
                "heartbeat commits {} past the log's end {}",
                m.commit,
                self.node.raft.raft_log.last_index()
            ));
        }
        Ok(restored)
    }

    /// One step of the master, if it runs; its effects are taken in.
    fn pass_to_master(&mut self, input: master::Input) {
        let Some(m) = self.master.as_mut() else {
            return;
        };
        let effects = if self.observed {
            let authority = m.authority().unwrap_or(Time::ZERO);
            let e = m.handle(self.now, input.clone());
            let copy = master::Effects {
                log: e.log.clone(),
                replies: e.replies.clone(),
                calls: e.calls.clone(),
                checkpoint_due: None,
            };
            self.out.master_steps.push(MasterStep {
                generation: self.generation,
                now: self.now,
                input,
                effects: copy,
                authority,
            });
            e
        } else {
            m.handle(self.now, input)
        };
        self.absorb(effects);
    }

    /// The master's effects: its records proposed as one entry, the rest passed on.
    fn absorb(&mut self, e: master::Effects) {
        let lapsed = self.now >= self.authority_until();
        for (id, resp) in e.replies {
            self.asked.remove(&id);
            // A refusal for what the state holds ("not found", "already exists") logs
            // nothing: it is a view of the state, given only while no other replica can
            // have been elected, as a read's is. Past that, a new leader may have made
            // the file this one calls missing, and a client that knows it is there would
            // fail its write. Asked again, the request is answered by whichever replica
            // then leads (this one, its refusal remembered, if it never stopped leading).
            let from_state = resp.error.as_ref().is_some_and(|e| {
                matches!(
                    FsError::from_pb(e),
                    FsError::NotFound(_)
                        | FsError::AlreadyExists(_)
                        | FsError::NotADirectory(_)
                        | FsError::IsADirectory(_)
                        | FsError::NotEmpty(_)
                )
            });
            let resp = if from_state && lapsed {
                master::err(FsError::Unavailable(
                    "the master group's leader is confirming it still leads".into(),
                ))
            } else {
                resp
            };
            self.out.replies.push((id, resp));
        }
        let generation = self.generation;
        self.out.calls.extend(e.calls.into_iter().map(|mut c| {
            assert!(c.id < 1 << CALL_ID_BITS, "call id {} out of range", c.id);
            c.id |= generation << CALL_ID_BITS;
            c
        }));
        let Some(&(first_seq, _)) = e.log.first() else {
            return;
        };
        let last = e.log.last().expect("not empty").0;
        let batch = pb::RaftRecords {
            first_seq,
            records: e.log.into_iter().map(|(_, r)| r).collect(),
        };
        self.unproposed.push_back((batch, last));
    }

    /// Proposes the master's waiting records: each step's as one entry, or, held for a
    /// flush, all of them as one.
    fn propose(&mut self) {
        if self.hold && !self.flushing {
            return;
        }
        if self.hold && self.unproposed.len() > 1 {
            // Merged up to MERGED_BYTES an entry (one step's records may be more, alone):
            // raft-rs never splits an entry, and one larger than a message may carry could
            // never reach a follower.
            let mut merged: VecDeque<(pb::RaftRecords, LogSeq, usize)> = VecDeque::new();
            for (b, l) in self.unproposed.drain(..) {
                let size = b.encoded_len();
                match merged.back_mut() {
                    Some((batch, last, n)) if *n + size <= MERGED_BYTES => {
                        assert_eq!(
                            batch.first_seq + batch.records.len() as u64,
                            b.first_seq,
                            "the master's records are proposed in order"
                        );
                        batch.records.extend(b.records);
                        *last = l;
                        *n += size;
                    }
                    _ => merged.push_back((b, l, size)),
                }
            }
            self.unproposed = merged.into_iter().map(|(b, l, _)| (b, l)).collect();
        }
        while let Some((batch, last)) = self.unproposed.pop_front() {
            if self.master.is_none() {
                // Stopped meanwhile: the records go with the master that made them.
                self.unproposed.clear();
                return;
            }
            match self.node.propose(vec![], batch.encode_to_vec()) {
                Ok(()) => {
                    let index = self.node.raft.raft_log.last_index();
                    self.proposed.insert(index, last);
                }
                Err(e) => {
                    // The master's state now runs ahead of a log that will not have these
                    // records: it cannot go on. Like a crash; a new master takes over
                    // from the committed state.
                    tracing::error!(error = %e, "proposal refused; the master stops");
                    self.stop_master();
                }
            }
        }
    }

    /// Reports snapshots not taken within a few election timeouts (and the time they
    /// take to send) as failed, so raft-rs sends the follower another (it waits for a
    /// report otherwise).
    fn retry_snapshots(&mut self) {
        if self.node.raft.state != StateRole::Leader {
            self.snapshots_out.clear();
            return;
        }
        let waiting: Vec<u64> = self
            .node
            .raft
            .prs()
            .iter()
            .filter(|(_, p)| p.state == raft::ProgressState::Snapshot)
            .map(|(&id, _)| id)
            .collect();
        self.snapshots_out.retain(|id, _| waiting.contains(id));
        // A few election timeouts, and the time a large snapshot takes to send at a
        // slow link's rate.
        let secs = self.node.store().snapshot_ref().data.len() as f64 / SLOW_LINK_BYTES_PER_SEC;
        let limit = 3 * self.cfg.election_ticks as u64
            + (secs / self.cfg.tick.as_secs_f64().max(1e-3)).ceil() as u64;
        for id in waiting {
            let since = *self.snapshots_out.entry(id).or_insert(self.ticks);
            if self.ticks - since >= limit {
                self.snapshots_out.remove(&id);
                self.node.report_snapshot(id, raft::SnapshotStatus::Failure);
            }
        }
    }

    // ---- consensus ----------------------------------------------------------------

    /// raft-rs draws its election timeouts from the OS; the replica's own seeded draw
    /// replaces each one (it depends only on the seed, the replica and the term).
    fn seed_timeout(&mut self) {
        let raft = &mut self.node.raft;
        let lo = self.cfg.election_ticks as u64;
        let t = Rng::new(self.rng_seed ^ raft.term.wrapping_mul(0xA24B_AED4_963E_E407)).below(lo);
        raft.set_randomized_election_timeout((lo + t) as usize);
    }

    fn send(&mut self, msgs: Vec<rp::Message>) {
        for m in msgs {
            let Some(addr) = self.cfg.members.get(&m.to) else {
                continue;
            };
            let mut pm = wire::message_to_pb(&m);
            if matches!(
                m.msg_type,
                rp::MessageType::MsgAppend | rp::MessageType::MsgHeartbeat
            ) && self.node.raft.commit_to_current_term()
                && self.now < self.authority_until()
            {
                // Only once it has committed an entry of its own term does a new leader
                // know all that is committed: before, an earlier leader's entries it
                // holds may be committed without its knowing. And only within its
                // authority: past it, another leader may be committing more.
                pm.leader_commit = self.node.raft.raft_log.committed;
            }
            self.out.send.push((addr.clone(), pm));
        }
    }

    /// Handles every `Ready` raft-rs has.
    fn drain(&mut self) {
        while self.node.has_ready() {
            let mut rd = self.node.ready();
            let mut writes = Vec::new();
            self.send(rd.take_messages());
            for rs in rd.take_read_states() {
                self.authority.confirmed(&rs.request_ctx);
            }
            let took_snapshot = !rd.snapshot().is_empty();
            if took_snapshot {
                let snap = rd.snapshot().clone();
                let meta = snap.get_metadata();
                self.shadow = match self.restored.take() {
                    // Restored once already, when it was checked (`check_peer`): the
                    // state as of one index and term is one state.
                    Some((index, term, sh)) if (index, term) == (meta.index, meta.term) => sh,
                    _ => shadow::Shadow::from_snapshot(&snap, &self.mcfg)
                        .expect("a snapshot is checked before raft-rs takes it"),
                };
                self.feed(checkpointer::Feed::Reset(snap.clone()), &mut writes);
                let members = store::members_of(&snap)
                    .expect("a snapshot is checked before raft-rs takes it");
                self.last_snapshot_seq = self.shadow.seq;
                self.node
                    .mut_store()
                    .apply_snapshot(snap, members, &mut writes);
                self.update_book();
            }
            let committed = rd.take_committed_entries();
            self.apply(committed, &mut writes);
            if !rd.entries().is_empty() {
                let ents = rd.take_entries();
                self.node.mut_store().append(&ents, &mut writes);
            }
            // Whether this Ready writes nothing but a later commit index (no entries, no
            // snapshot, no term or vote, no membership or compaction): a leader's every
            // commit is one, and waiting for its sync would hold the next proposal
            // behind it. Nothing that is sent depends on it being durable.
            let commit_only = writes.is_empty()
                && rd.hs().is_some_and(|hs| {
                    let was = self.node.store().hard_state();
                    hs.term == was.term && hs.vote == was.vote
                });
            if let Some(hs) = rd.hs() {
                let hs = hs.clone();
                self.node.mut_store().set_hard_state(hs, &mut writes);
            }
            let persisted = rd.take_persisted_messages();
            let number = rd.number();
            self.node.advance_append_async(rd);
            self.tell_applied();
            if writes.is_empty() && self.unpersisted.is_none() {
                self.node.on_persist_ready(number);
                self.send(persisted);
            } else if commit_only && self.unpersisted.is_none() {
                self.node.on_persist_ready(number);
                self.send(persisted);
                self.out.persist.push(Persist {
                    number,
                    writes,
                    wait: false,
                });
            } else {
                if took_snapshot {
                    self.snapshot_unpersisted = Some(number);
                }
                self.unpersisted = Some(number);
                self.held.push_back((number, persisted));
                self.out.persist.push(Persist {
                    number,
                    writes,
                    wait: true,
                });
            }
            self.propose();
        }
        let until = self.authority_until();
        if let Some(m) = self.master.as_mut() {
            m.set_authority(until);
        }
    }

    /// Tells raft-rs how far the shadow state has applied, as far as it may know: a
    /// snapshot taken from the leader counts once it is persisted.
    fn tell_applied(&mut self) {
        let log = &self.node.raft.raft_log;
        let a = self.shadow.applied.min(log.persisted).min(log.committed);
        if a > log.applied {
            self.node.advance_apply_to(a);
        }
    }

    fn apply(&mut self, entries: Vec<rp::Entry>, writes: &mut Vec<Write>) {
        for e in entries {
            if e.index <= self.shadow.applied {
                continue;
            }
            let data = (e.entry_type == rp::EntryType::EntryNormal).then(|| e.data.clone());
            self.feed(
                checkpointer::Feed::Apply {
                    index: e.index,
                    data,
                },
                writes,
            );
            if e.entry_type == rp::EntryType::EntryNormal && !e.data.is_empty() {
                let batch = pb::RaftRecords::decode(e.data.clone())
                    .expect("entries are checked before raft-rs takes them");
                self.shadow.apply(e.index, &batch);
                if let Some(through) = self.proposed.remove(&e.index) {
                    assert_eq!(
                        through, self.shadow.seq,
                        "entry {} committed with other records than proposed",
                        e.index
                    );
                    self.pass_to_master(master::Input::LogSynced { through });
                }
            } else if e.entry_type == rp::EntryType::EntryConfChange {
                self.apply_change(&e, writes);
                self.shadow.applied = e.index;
            } else {
                self.shadow.applied = e.index;
            }
        }
        // A change asked for whose entry was not the change (a leader before lost it):
        // the admin asks again.
        let applied = self.shadow.applied;
        let lost: Vec<u64> = self.conf_asked.range(..=applied).map(|(&i, _)| i).collect();
        for i in lost {
            let id = self.conf_asked.remove(&i).expect("listed");
            self.out.replies.push((
                id,
                master::err(FsError::Unavailable(
                    "the membership change was not committed; ask again".into(),
                )),
            ));
        }
        // A leader keeps the entries a follower it hears from still lacks, so a follower
        // a little behind catches up from the log, not from a whole snapshot.
        let floor = if self.node.raft.state == StateRole::Leader {
            let me = self.cfg.id;
            self.node
                .raft
                .prs()
                .iter()
                .filter(|&(&id, p)| id != me && p.recent_active)
                .map(|(_, p)| p.matched)
                .min()
                .unwrap_or(u64::MAX)
        } else {
            u64::MAX
        };
        let due = self.shadow.seq - self.last_snapshot_seq >= self.cfg.snapshot_every
            && floor >= self.shadow.applied
            && self.checkpoint_asked.is_none();
        if self.shadow.applied <= self.node.store().snapshot_index() {
            return;
        }
        if self.compact_now {
            // A learner was added: it must start from a snapshot taken through the entry
            // that added it, whatever the count. Built by the checkpointer like any
            // other, beside the event loop (a big namespace takes a while); until it is
            // taken no snapshot goes out, as an older one would not name the learner.
            self.compact_now = false;
            let ask = self.ask();
            self.node.mut_store().want_snapshot(ask.index);
            self.checkpoint_asked = Some(ask.index);
            self.last_snapshot_seq = self.shadow.seq;
            self.feed(checkpointer::Feed::Take(ask), writes);
        } else if due {
            let ask = self.ask();
            self.checkpoint_asked = Some(ask.index);
            self.last_snapshot_seq = self.shadow.seq;
            self.feed(checkpointer::Feed::Take(ask), writes);
        }
    }

    /// A checkpoint as of the entry last applied, with the membership as of it.
    fn ask(&self) -> checkpointer::Ask {
        let store = self.node.store();
        checkpointer::Ask {
            index: self.shadow.applied,
            conf: store.conf().clone(),
            members: store.members().addresses.clone(),
            retired: store.members().retired.iter().copied().collect(),
        }
    }

    /// Gives the checkpointer what happened: at once if the replica runs it, or through
    /// `Effects::checkpointer`.
    fn feed(&mut self, f: checkpointer::Feed, writes: &mut Vec<Write>) {
        match self.checkpointer.as_mut() {
            Some(c) => match c.feed(f) {
                Some(checkpointer::Built::Checkpoint(t)) => self.checkpointed(t, writes),
                Some(checkpointer::Built::Copy(h)) => self.copied(h),
                None => {}
            },
            None => self.out.checkpointer.push(f),
        }
    }

    /// A checkpoint built: the log behind it goes, unless a snapshot taken from the
    /// leader meanwhile (or a learner's) already covers it.
    fn checkpointed(&mut self, t: checkpointer::Taken, writes: &mut Vec<Write>) {
        if self.checkpoint_asked == Some(t.ask.index) {
            self.checkpoint_asked = None;
        }
        let store = self.node.store();
        if t.ask.index <= store.snapshot_index() || store.entry(t.ask.index).is_none() {
            return;
        }
        self.node
            .mut_store()
            .compact(t.ask.index, t.data, t.ask.conf, writes);
    }

    /// Starts or stops the master as leadership comes and goes.
    fn roles(&mut self) {
        let raft = &self.node.raft;
        let leading = raft.state == StateRole::Leader;
        if self.master.is_some() && (!leading || raft.term != self.led) {
            self.stop_master();
        }
        let raft = &self.node.raft;
        if leading && self.master.is_none() {
            if raft.term != self.led {
                self.led = raft.term;
                self.authority.reset();
            }
            if !self.caught_up() {
                return;
            }
            if self.copy_asked != Some((self.led, self.shadow.applied)) {
                // Made by the checkpointer: beside the event loop, which goes on
                // (heartbeats, votes) until the copy comes back (`copied`), or at once
                // if the replica runs it itself. A copy writes nothing.
                self.copy_asked = Some((self.led, self.shadow.applied));
                let index = self.shadow.applied;
                self.feed(checkpointer::Feed::Copy { index }, &mut Vec::new());
            }
        }
    }

    /// A new leader may start its master: everything before this term's first entry is
    /// applied (the master starts from the state the previous leaders committed; the
    /// first entry of a term is raft-rs's empty one), and nothing of an earlier master
    /// of this term waits to be committed.
    fn caught_up(&self) -> bool {
        let raft = &self.node.raft;
        raft.state == StateRole::Leader
            && raft.term == self.led
            && self.master.is_none()
            && raft.raft_log.committed >= raft.raft_log.last_index()
            && self.shadow.applied >= raft.raft_log.committed
            && self.proposed.is_empty()
    }

    /// The copy of the committed state for a new leader's master came back: the master
    /// starts on it if this replica still leads in the term it was asked for, still
    /// caught up at the entry it is as of. Otherwise it is dropped (a later term asks
    /// for its own).
    fn copied(&mut self, h: checkpointer::Handover) {
        let asked = self.copy_asked;
        let Some((cp, meta)) = h.take() else {
            return;
        };
        if asked.is_none_or(|(_, index)| index != h.index) {
            tracing::debug!(index = h.index, "a copy not asked for (any more) dropped");
            return;
        }
        self.copy_asked = None;
        if asked.map(|(term, _)| term) != Some(self.led)
            || !self.caught_up()
            || self.shadow.applied != h.index
        {
            tracing::debug!(
                index = h.index,
                "a copy for a leadership since lost dropped"
            );
            return;
        }
        assert_eq!(
            h.seq, self.shadow.seq,
            "the copy of the state through entry {} ends at another record than the state",
            h.index
        );
        self.start_master(cp, meta);
    }

    /// Starts the master of this leader's term on `meta`, the committed state (made
    /// through `cp`).
    fn start_master(&mut self, cp: pb::Checkpoint, meta: Meta) {
        self.generation += 1;
        if self.observed {
            // The observers see what the master was built from.
            self.out.master_starts.push(MasterStart {
                generation: self.generation,
                checkpoint: cp,
                epoch: self.led,
                now: self.now,
            });
        }
        let mut m = Master::take_over(self.mcfg.clone(), self.now, meta, self.shadow.seq, self.led);
        m.set_authority(Time::ZERO);
        tracing::info!(
            term = self.led,
            seq = self.shadow.seq,
            "master group leader serving"
        );
        // The master's first step may log (a fresh cluster's id).
        self.master = Some(m);
        self.pass_to_master(master::Input::Tick);
    }

    /// Drops the master: what it held is answered "not the leader" (the caller asks
    /// the leader with the same token), what it proposed is committed or not by the
    /// group, and the shadow state has it either way.
    fn stop_master(&mut self) {
        let Some(m) = self.master.take() else {
            return;
        };
        if self.observed {
            self.stopped = Some((self.generation, m));
        }
        tracing::info!(
            term = self.node.raft.term,
            "master group leader stepped down"
        );
        self.proposed.clear();
        self.unproposed.clear();
        let leader = {
            let l = self.node.raft.leader_id;
            if l == self.cfg.id {
                String::new()
            } else {
                self.cfg.members.get(&l).cloned().unwrap_or_default()
            }
        };
        let conf_asked = std::mem::take(&mut self.conf_asked).into_values();
        for id in std::mem::take(&mut self.asked)
            .into_iter()
            .chain(conf_asked)
        {
            self.out
                .replies
                .push((id, master::err(FsError::NotLeader(leader.clone()))));
        }
    }
}
