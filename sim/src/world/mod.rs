//! An in-process world for fuzzing the mutation protocol: the pure master and
//! chunkserver state machines, a network of messages in flight, disks that keep written
//! and durable state apart, and clients that speak the protocol (`clients.rs`), all moved
//! one step at a time by whoever drives the world (the `mutation_protocol` fuzz target,
//! `crate::fuzz`). No async runtime and no threads: a step is a function call, so a run
//! is as fast as the state machines and exactly as the driver chose it.
//!
//! What the real drivers add on top of the state machines is taken from them, not
//! copied: the op log's group commit (`driver::commit`), one storage operation at a time
//! per chunk (`driver::queues`), the durability recipe of each storage operation
//! (`driver::chunkserver::execute`, over `testkit`'s in-memory stores), recovery of the
//! master from its store (`driver::master::recover`) and of a chunkserver from its disk.
//! Every step goes through the simulator's per-step checks (`check::step`), so the same
//! invariants judge both.

pub mod clients;

use std::collections::{BTreeMap, HashMap};

use futures::executor::block_on;
use tessera_core::auth;
use tessera_core::chunkserver::{
    self as cs, Chunkserver, ChunkserverConfig, Dest, OpId, Outgoing, Reply, StoreOp,
};
use tessera_core::driver::checkpoint::Sealed;
use tessera_core::driver::chunkserver::{ensure_server_id, execute};
use tessera_core::driver::commit::{Held, LogBatch};
use tessera_core::driver::master as master_driver;
use tessera_core::driver::queues::ChunkQueues;
use tessera_core::error::RpcError;
use tessera_core::master::checkpointer::Checkpointer;
use tessera_core::master::{self as ms, Master, MasterConfig};
use tessera_core::pb;
use tessera_core::pb::master_request as ms_req;
use tessera_core::runtime::ChunkStore;
use tessera_core::testkit::{MemChunkStore, MemMetaStore};
use tessera_core::types::{ChunkHandle, Time};

use crate::check::{Checks, step};

pub use clients::{ClientOp, OpKind};

/// Every node's clock starts here, so a negative offset still reads as a valid `Time`.
const EPOCH_MS: i64 = 1_000_000;

/// Names a call in flight; its reply, or its deadline, goes back to the caller.
pub type Token = u64;

/// Who waits for a call's answer. A node's calls are void once it crashed
/// (`incarnation` moved on).
#[derive(Clone, Copy, Debug)]
enum Caller {
    Master {
        incarnation: u32,
        call: u64,
    },
    Server {
        i: usize,
        incarnation: u32,
        call: u64,
    },
    Client(usize),
    /// A read or a master call the world's driver makes to look (`probe_*`).
    Probe,
}

/// A message on the network.
#[derive(Clone, Debug)]
pub enum Payload {
    ToMaster(pb::MasterRequest),
    ToServer(usize, pb::ChunkRequest),
    FromMaster(pb::MasterResponse),
    FromServer(pb::ChunkResponse),
}

#[derive(Clone, Debug)]
pub struct Msg {
    pub token: Token,
    pub payload: Payload,
    /// A copy the network made: its reply, if any, goes nowhere.
    pub duplicate: bool,
    /// A request is delivered before its caller gives up, or never (true ms): its
    /// deadline, or earlier if the caller hears of a failure first (`time_out`). The
    /// simulator's network keeps the same bound (`net.rs`): a request that arrives after
    /// its caller gave up is a fault Tessera does not claim to survive.
    pub expires: i64,
    /// Who sent a request, as a secured transport would name it (`auth::Caller`).
    pub from: auth::Caller,
}

/// How long a caller waits for an answer (true ms), as the drivers' call timeout.
pub const CALL_TIMEOUT_MS: i64 = 10_000;

impl Msg {
    fn is_request(&self) -> bool {
        matches!(self.payload, Payload::ToMaster(_) | Payload::ToServer(..))
    }
}

/// The world's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub servers: usize,
    pub master: MasterConfig,
    /// Each node's clock offset from true time (ms): the master's, then each server's.
    pub offsets: Vec<i64>,
}

impl Settings {
    pub fn new(servers: usize, rng_seed: u64) -> Settings {
        Settings {
            servers,
            master: MasterConfig {
                chunk_size: 4096,
                default_replication: 3,
                lease_duration: std::time::Duration::from_secs(10),
                max_clock_skew: std::time::Duration::from_millis(200),
                heartbeat_timeout: std::time::Duration::from_secs(4),
                gc_delay: std::time::Duration::from_secs(10),
                checkpoint_every: 20,
                clone_timeout: std::time::Duration::from_secs(30),
                rng_seed,
                call_timeout: std::time::Duration::from_millis(CALL_TIMEOUT_MS as u64),
                // This world's requests arrive before their caller's deadline or never.
                late_delivery: std::time::Duration::ZERO,
                root: crate::root_perms(),
                ..MasterConfig::default()
            },
            offsets: vec![0; servers + 1],
        }
    }
}

struct MasterNode {
    m: Master,
    replies: HashMap<u64, Token>,
    next_request: u64,
    batch: LogBatch,
    held: Held,
    /// The copy of the state checkpoints are built from, fed what the master logs, as
    /// the driver's checkpointer task is (`master::checkpointer`).
    checkpointer: Checkpointer,
    /// A checkpoint built when it fell due, written with the next sync (by then the
    /// master may have logged more, as it does while a driver's checkpointer builds).
    built: Option<Sealed>,
}

/// The size of a stored checkpoint's parts (a piece larger than that gets one alone).
const CHECKPOINT_PART_BYTES: usize = 256;

struct Live {
    cs: Chunkserver,
    replies: HashMap<u64, Token>,
    next_request: u64,
    queues: ChunkQueues,
    /// Storage operations started (first on their chunk) and not yet done.
    running: Vec<(OpId, StoreOp)>,
}

pub struct Server {
    pub addr: String,
    live: Option<Live>,
    pub store: MemChunkStore,
    incarnation: u32,
    /// Fresh server ids handed out so far (each start may need one).
    ids: u64,
    /// Its disk was last said to be full.
    full: bool,
}

pub struct World {
    pub settings: Settings,
    /// True time, ms since the world began.
    pub now: i64,
    master: Option<MasterNode>,
    master_store: MemMetaStore,
    master_incarnation: u32,
    pub servers: Vec<Server>,
    pub net: Vec<Msg>,
    outstanding: BTreeMap<Token, Caller>,
    next_token: Token,
    pub clients: Vec<ClientOp>,
    pub checks: Checks,
    /// A master that refused to start, and why (a violation: nothing here damages its log).
    pub refused: Option<String>,
    /// The answer to the last probe.
    probe: Option<Result<clients::Answer, RpcError>>,
    /// Every node's inputs and effects, one line each, when asked for (`World::log`).
    pub log: Option<Vec<String>>,
}

impl World {
    pub fn new(settings: Settings) -> World {
        let servers = (0..settings.servers)
            .map(|i| Server {
                addr: format!("cs{i}"),
                live: None,
                store: MemChunkStore::default(),
                incarnation: 0,
                ids: 0,
                full: false,
            })
            .collect();
        let mut checks = Checks {
            stored: Some(Default::default()),
            ..Default::default()
        };
        checks.missing.grace_ms = 0;
        let mut w = World {
            settings,
            now: 0,
            master: None,
            master_store: MemMetaStore::default(),
            master_incarnation: 0,
            servers,
            net: Vec::new(),
            outstanding: BTreeMap::new(),
            next_token: 1,
            clients: Vec::new(),
            checks,
            refused: None,
            probe: None,
            log: None,
        };
        w.start_master();
        for i in 0..w.servers.len() {
            w.start_server(i);
        }
        w
    }

    fn clock(&self, node: usize) -> Time {
        let off = self.settings.offsets.get(node).copied().unwrap_or(0);
        Time((EPOCH_MS + off + self.now).max(0) as u64)
    }

    fn master_clock(&self) -> Time {
        self.clock(0)
    }

    fn server_clock(&self, i: usize) -> Time {
        self.clock(i + 1)
    }

    pub fn master_up(&self) -> bool {
        self.master.is_some()
    }

    pub fn server_up(&self, i: usize) -> bool {
        self.servers[i].live.is_some()
    }

    /// Whether server `i` may be impaired now (crashed, its disk full, a copy of it
    /// corrupted) within the claim, as the simulator's fault scheduler keeps it: at most
    /// R−1 servers impaired at once, and no chunk left with a corrupted copy and no
    /// intact one on a server that is not impaired.
    pub fn may_impair(&self, i: usize) -> bool {
        let addr = &self.servers[i].addr;
        let goal = self.settings.master.default_replication as usize;
        (self.checks.impaired.contains(addr) || self.checks.impaired.len() + 1 < goal)
            && self.checks.may_impair(addr)
    }

    /// Server `i` is impaired from now on, or (`false`) no longer: up, its disk not full
    /// and none of its copies corrupted by the run.
    fn set_impaired(&mut self, i: usize) {
        let s = &self.servers[i];
        let corrupt = self.checks.corrupted.iter().any(|(a, _)| *a == s.addr);
        if s.live.is_none() || s.full || corrupt {
            self.checks.impaired.insert(s.addr.clone());
        } else {
            self.checks.impaired.remove(&s.addr);
        }
    }

    /// The end of the faults: nothing counts as impaired any longer.
    pub fn end_impairments(&mut self) {
        self.checks.impaired.clear();
    }

    pub fn master(&self) -> Option<&Master> {
        self.master.as_ref().map(|m| &m.m)
    }

    pub fn server(&self, i: usize) -> Option<&Chunkserver> {
        self.servers[i].live.as_ref().map(|l| &l.cs)
    }

    fn server_index(&self, addr: &str) -> Option<usize> {
        self.servers.iter().position(|s| s.addr == addr)
    }

    /// Prints the log, if one is kept, to stderr.
    pub fn print_log(&self) {
        for line in self.log.iter().flatten() {
            eprintln!("{line}");
        }
    }

    /// Keeps a line in the log, if one is kept (a debugging aid: lines longer than
    /// `MP_WIDTH` characters, 400 unless set, are cut).
    fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(log) = self.log.as_mut() {
            let mut s = line();
            let width = std::env::var("MP_WIDTH")
                .ok()
                .and_then(|w| w.parse().ok())
                .unwrap_or(400);
            if s.len() > width {
                let mut end = width;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                s.truncate(end);
                s.push_str(" …");
            }
            log.push(s);
        }
    }

    /// Puts a request on the network: it arrives before its caller's deadline or never.
    fn send_request(&mut self, token: Token, payload: Payload) {
        let from = match self.outstanding.get(&token) {
            Some(Caller::Master { .. }) => auth::Caller::Master { replica: 1 },
            Some(Caller::Server { i, .. }) => auth::Caller::Chunkserver {
                name: format!("cs{i}"),
            },
            Some(Caller::Client(c)) => auth::Caller::Client {
                user: format!("client{c}"),
                groups: vec![crate::USERS.into()],
            },
            // A checker's read of a copy, which no capability covers: a look from
            // outside the system, as an insecure cluster's reads are.
            Some(Caller::Probe) | None if matches!(payload, Payload::ToServer(..)) => {
                auth::Caller::Insecure
            }
            Some(Caller::Probe) | None => auth::Caller::Admin {
                name: "probe".into(),
            },
        };
        self.net.push(Msg {
            token,
            payload,
            duplicate: false,
            expires: self.now + CALL_TIMEOUT_MS,
            from,
        });
    }

    /// Puts a reply on the network (a late one finds its caller gone, if it gave up).
    fn send_reply(&mut self, token: Token, payload: Payload) {
        self.net.push(Msg {
            token,
            payload,
            duplicate: false,
            expires: i64::MAX,
            from: auth::Caller::Insecure,
        });
    }

    fn token(&mut self, caller: Caller) -> Token {
        let t = self.next_token;
        self.next_token += 1;
        self.outstanding.insert(t, caller);
        t
    }

    // ---- the master ---------------------------------------------------------------

    /// Starts the master from its store, as the driver's start-up does.
    pub fn start_master(&mut self) {
        self.note(|| "start master".into());
        if self.master.is_some() {
            return;
        }
        let now = self.master_clock();
        let cfg = self.settings.master.clone();
        // A run's checkpoints and owed answers die with it; the next run's come afresh.
        self.checks.master_started("master");
        let durable = match block_on(master_driver::load(&mut self.master_store)) {
            Ok(d) => d,
            Err(e) => {
                self.refused = Some(e.to_string());
                return;
            }
        };
        let checkpointer =
            Checkpointer::recover(cfg.chunk_size, durable.checkpoint.as_ref(), &durable.tail);
        match master_driver::rebuild(cfg, now, &durable) {
            Ok((mut m, held)) => {
                let checkpointer =
                    checkpointer.expect("the master recovered from the same durable state");
                // As the driver does; here the record is written with the next batch.
                m.start_alone();
                self.master_incarnation += 1;
                self.checks.versions.master_crashed("master");
                let mut batch = LogBatch::default();
                batch.delete(durable.stale());
                self.master = Some(MasterNode {
                    m,
                    replies: HashMap::new(),
                    next_request: 1,
                    batch,
                    held,
                    checkpointer,
                    built: None,
                });
            }
            Err(e) => self.refused = Some(e.to_string()),
        }
    }

    /// Crashes the master: what it had not synced is gone, and so are its calls.
    pub fn crash_master(&mut self) {
        self.note(|| "crash master".into());
        if let Some(node) = self.master.take() {
            self.master_store.crash();
            self.checks.versions.master_crashed("master");
            // Its callers hear nothing more.
            for token in node.replies.into_values() {
                self.time_out(token);
            }
        }
    }

    fn master_input(&mut self, input: ms::Input) {
        let now = self.master_clock();
        let t = self.now;
        let off = EPOCH_MS + self.settings.offsets.first().copied().unwrap_or(0);
        let incarnation = self.master_incarnation;
        let Some(node) = self.master.as_mut() else {
            return;
        };
        let mut effects = node.m.handle(now, input.clone());
        if self.log.is_some() {
            let line = format!("{t} master <- {input:?} -> {effects:?}");
            self.note(|| line);
        }
        let Some(node) = self.master.as_mut() else {
            return;
        };
        step::master_step(
            &mut self.checks,
            "master",
            t,
            now,
            &input,
            &effects,
            &node.m,
            |local| local - off,
        );
        node.batch.add(&effects);
        if !effects.log.is_empty() {
            node.checkpointer.apply(std::mem::take(&mut effects.log));
        }
        if let Some(through) = effects.checkpoint_due {
            // Built from the checkpointer's copy as the driver builds it, in parts far
            // smaller than a checkpoint, so every restart loads from parts. Once
            // written, the stored parts are read back and must be the master's state
            // at this record (`check::step`).
            let pieces = node.checkpointer.take(through);
            node.built = Some(Sealed::build(through, pieces, CHECKPOINT_PART_BYTES));
        }
        let replies: Vec<_> = effects
            .replies
            .into_iter()
            .filter_map(|(id, r)| node.replies.remove(&id).map(|t| (t, r)))
            .collect();
        for (token, resp) in replies {
            self.send_reply(token, Payload::FromMaster(resp));
        }
        for call in effects.calls {
            let to = self.server_index(&call.to);
            let token = self.token(Caller::Master {
                incarnation,
                call: call.id,
            });
            match to {
                Some(i) => self.send_request(token, Payload::ToServer(i, call.req)),
                // Nobody there: the call times out.
                None => self.time_out(token),
            }
        }
    }

    /// The master's log: what its steps wrote goes to the store and is synced, then the
    /// master hears of it (one group commit). False if there was nothing to write.
    pub fn sync_master(&mut self) -> bool {
        let Some(node) = self.master.as_mut() else {
            return false;
        };
        let built = node.built.take();
        if let Some(cp) = &built {
            node.batch.checkpoint(cp.clone());
        }
        if node.batch.is_empty() {
            return false;
        }
        let logged = node.m.last_seq();
        let commit = std::mem::take(&mut node.batch).commit(&mut node.held);
        use tessera_core::runtime::MetaStore;
        block_on(self.master_store.write(commit.writes)).expect("an in-memory store");
        block_on(self.master_store.sync()).expect("an in-memory store");
        if let Some(sealed) = built {
            // Read back from the store as a start-up reads it, and judged as the
            // scenarios judge a driver's checkpoints: it must be the master's state at
            // the step that said it was due.
            let stored = block_on(self.master_store.scan(master_driver::CHECKPOINT_KEY))
                .expect("an in-memory store");
            step::master_checkpointed(
                &mut self.checks,
                "master",
                self.now,
                &sealed,
                Some(stored),
                logged,
            );
        }
        if let Some(through) = commit.through {
            self.master_input(ms::Input::LogSynced { through });
        }
        true
    }

    pub fn tick_master(&mut self) {
        self.master_input(ms::Input::Tick);
    }

    // ---- chunkservers -------------------------------------------------------------

    /// Starts server `i` from its disk, as the driver's start-up does.
    pub fn start_server(&mut self, i: usize) {
        self.note(|| format!("start cs{i}"));
        let now = self.server_clock(i);
        let s = &mut self.servers[i];
        if s.live.is_some() {
            return;
        }
        let mut metas = block_on(s.store.load()).expect("an in-memory store");
        s.ids += 1;
        let fresh = (i as u64 + 1) << 32 | s.ids;
        block_on(ensure_server_id(fresh, &mut s.store, &mut metas)).expect("an in-memory store");
        let cfg = ChunkserverConfig {
            address: s.addr.clone(),
            clone_piece: 4096,
            scrub_interval: std::time::Duration::from_secs(2),
            scrub_idle: std::time::Duration::from_secs(5),
            apply_hold: std::time::Duration::from_millis(500),
            read_cache_bytes: if i.is_multiple_of(2) { 1 << 20 } else { 0 },
            ..ChunkserverConfig::default()
        };
        s.incarnation += 1;
        s.live = Some(Live {
            cs: Chunkserver::recover(cfg, now, metas),
            replies: HashMap::new(),
            next_request: 1,
            queues: ChunkQueues::default(),
            running: Vec::new(),
        });
        self.checks.leases.forget(&self.servers[i].addr);
        self.set_impaired(i);
    }

    /// Crashes server `i`: its unsynced writes are lost, its storage operations under
    /// way stop, its calls are void.
    pub fn crash_server(&mut self, i: usize) {
        self.note(|| format!("crash cs{i}"));
        let s = &mut self.servers[i];
        if let Some(live) = s.live.take() {
            s.store.crash();
            let addr = s.addr.clone();
            self.checks.leases.forget(&addr);
            self.checks.versions.server_crashed(&addr);
            for token in live.replies.into_values() {
                self.time_out(token);
            }
        }
        self.set_impaired(i);
    }

    fn server_input(&mut self, i: usize, input: cs::Input) {
        let now = self.server_clock(i);
        let t = self.now;
        let off = EPOCH_MS + self.settings.offsets.get(i + 1).copied().unwrap_or(0);
        let incarnation = self.servers[i].incarnation;
        let addr = self.servers[i].addr.clone();
        let Some(live) = self.servers[i].live.as_mut() else {
            return;
        };
        let effects = live.cs.handle(now, input.clone());
        if self.log.is_some() {
            let line = format!("{t} {addr} <- {input:?} -> {effects:?}");
            self.note(|| line);
        }
        let Some(live) = self.servers[i].live.as_mut() else {
            return;
        };
        step::chunkserver_step(
            &mut self.checks,
            &addr,
            t,
            now,
            &input,
            &effects,
            &live.cs,
            |local| local - off,
        );
        for (id, op) in effects.store {
            if let Some(started) = live.queues.issue(id, op) {
                live.running.push(started);
            }
        }
        let replies: Vec<_> = effects
            .replies
            .into_iter()
            .filter_map(|(id, r)| live.replies.remove(&id).map(|t| (t, r)))
            .collect();
        for (token, resp) in replies {
            self.send_reply(token, Payload::FromServer(resp));
        }
        for call in effects.calls {
            let token = self.token(Caller::Server {
                i,
                incarnation,
                call: call.id,
            });
            let payload = match (call.to, call.req) {
                (Dest::Master, Outgoing::Master(req)) => Payload::ToMaster(req),
                (Dest::Peer(a), Outgoing::Chunk(req)) => match self.server_index(&a) {
                    Some(j) => Payload::ToServer(j, req),
                    None => {
                        self.time_out(token);
                        continue;
                    }
                },
                (to, req) => panic!("a call to {to:?} of {req:?}"),
            };
            self.send_request(token, payload);
        }
    }

    pub fn tick_server(&mut self, i: usize) {
        self.server_input(i, cs::Input::Tick);
    }

    /// Tells server `i` its disk's free space (`Some(0)`: full).
    pub fn disk_space(&mut self, i: usize, free: Option<u64>) {
        self.servers[i].full = free == Some(0);
        self.set_impaired(i);
        self.server_input(i, cs::Input::DiskSpace { free });
    }

    /// Storage operations under way on server `i`.
    pub fn running(&self, i: usize) -> usize {
        self.servers[i].live.as_ref().map_or(0, |l| l.running.len())
    }

    /// Finishes the `k`-th storage operation under way on server `i` (modulo their
    /// number), by the driver's recipe; the next one on its chunk starts. False if none.
    pub fn finish_store(&mut self, i: usize, k: usize) -> bool {
        let s = &mut self.servers[i];
        let Some(live) = s.live.as_mut() else {
            return false;
        };
        if live.running.is_empty() {
            return false;
        }
        let (id, op) = live.running.swap_remove(k % live.running.len());
        let h = op.handle();
        let result = block_on(execute(&mut s.store, op));
        if let Some(next) = live.queues.finished(h) {
            live.running.push(next);
        }
        self.server_input(i, cs::Input::StoreDone { id, result });
        true
    }

    /// Flips a bit of server `i`'s copy of a chunk (the `k`-th it holds), where another
    /// intact copy the master counts exists, so no data depends on this one alone.
    /// Returns the chunk, if a bit was flipped.
    pub fn flip_bit(&mut self, i: usize, k: usize, at: usize) -> Option<ChunkHandle> {
        let s = &self.servers[i];
        let handles: Vec<ChunkHandle> = s
            .store
            .handles()
            .into_iter()
            .filter(|&h| s.store.data(h).is_some_and(|d| !d.is_empty()))
            .collect();
        if handles.is_empty() {
            return None;
        }
        let h = handles[k % handles.len()];
        let len = s.store.data(h).map_or(0, |d| d.len());
        if len == 0 || !self.checks.spare_copy(&s.addr, h) || !self.may_impair(i) {
            return None;
        }
        s.store.corrupt(h, at % len);
        let addr = s.addr.clone();
        self.note(|| format!("flip a bit of chunk {h} at {} on {addr}", at % len));
        self.checks.corrupted.insert((addr, h));
        self.set_impaired(i);
        Some(h)
    }

    // ---- the network ----------------------------------------------------------------

    /// Delivers the `k`-th message in flight (modulo their number). False if none.
    pub fn deliver(&mut self, k: usize) -> bool {
        if self.net.is_empty() {
            return false;
        }
        let msg = self.net.remove(k % self.net.len());
        self.receive(msg);
        true
    }

    /// Loses the `k`-th message in flight; its caller's deadline passes.
    pub fn drop_message(&mut self, k: usize) -> bool {
        if self.net.is_empty() {
            return false;
        }
        let msg = self.net.remove(k % self.net.len());
        self.note(|| format!("lose {:?}", msg.token));
        if !msg.duplicate {
            self.time_out(msg.token);
        }
        true
    }

    /// Copies the `k`-th request in flight: the server does it twice, its caller hears
    /// one answer.
    pub fn duplicate(&mut self, k: usize) -> bool {
        if self.net.is_empty() {
            return false;
        }
        let i = k % self.net.len();
        let m = &self.net[i];
        if matches!(m.payload, Payload::FromMaster(_) | Payload::FromServer(_)) {
            return false;
        }
        let mut copy = m.clone();
        copy.duplicate = true;
        let token = copy.token;
        self.note(|| format!("duplicate {token}"));
        self.net.push(copy);
        true
    }

    /// The `k`-th call in flight (modulo their number) passes its deadline: its caller
    /// hears a timeout now, and its answer, if one comes, is ignored.
    pub fn deadline(&mut self, k: usize) -> bool {
        if self.outstanding.is_empty() {
            return false;
        }
        let token = *self
            .outstanding
            .keys()
            .nth(k % self.outstanding.len())
            .expect("in range");
        self.note(|| format!("deadline {token}"));
        self.time_out(token);
        true
    }

    fn time_out(&mut self, token: Token) {
        // The caller gave up: its request, if still on its way, never arrives.
        self.net.retain(|m| m.token != token || !m.is_request());
        if let Some(caller) = self.outstanding.remove(&token) {
            let e = RpcError::Deadline("a fuzzed peer".into());
            match caller {
                Caller::Master { incarnation, call } => {
                    if incarnation == self.master_incarnation {
                        self.master_input(ms::Input::CallResult {
                            id: call,
                            result: Err(e),
                        });
                    }
                }
                Caller::Server {
                    i,
                    incarnation,
                    call,
                } => {
                    if incarnation == self.servers[i].incarnation {
                        self.server_input(
                            i,
                            cs::Input::CallResult {
                                id: call,
                                result: Err(e),
                            },
                        );
                    }
                }
                Caller::Client(op) => self.client_result(op, Err(e)),
                Caller::Probe => self.probe = Some(Err(e)),
            }
        }
    }

    fn receive(&mut self, msg: Msg) {
        match msg.payload {
            Payload::ToMaster(req) => {
                let Some(node) = self.master.as_mut() else {
                    if !msg.duplicate {
                        self.time_out(msg.token);
                    }
                    return;
                };
                let id = node.next_request;
                node.next_request += 1;
                if !msg.duplicate {
                    node.replies.insert(id, msg.token);
                }
                self.master_input(ms::Input::Request {
                    id,
                    req,
                    from: msg.from,
                });
            }
            Payload::ToServer(i, req) => {
                let now = self.server_clock(i);
                let Some(live) = self.servers[i].live.as_mut() else {
                    if !msg.duplicate {
                        self.time_out(msg.token);
                    }
                    return;
                };
                let id = live.next_request;
                live.next_request += 1;
                if !msg.duplicate {
                    live.replies.insert(id, msg.token);
                }
                self.server_input(
                    i,
                    cs::Input::Request {
                        id,
                        req,
                        arrived: now,
                        from: msg.from,
                    },
                );
            }
            Payload::FromMaster(resp) => self.answer(msg.token, clients::Answer::Master(resp)),
            Payload::FromServer(resp) => self.answer(msg.token, clients::Answer::Chunk(resp)),
        }
    }

    /// Hands the answer to call `token` to its caller, if it still waits for it.
    fn answer(&mut self, token: Token, answer: clients::Answer) {
        match (self.outstanding.remove(&token), answer) {
            (Some(Caller::Master { incarnation, call }), clients::Answer::Chunk(resp))
                if incarnation == self.master_incarnation =>
            {
                self.master_input(ms::Input::CallResult {
                    id: call,
                    result: Ok(resp),
                })
            }
            (
                Some(Caller::Server {
                    i,
                    incarnation,
                    call,
                }),
                answer,
            ) if incarnation == self.servers[i].incarnation => {
                let reply = match answer {
                    clients::Answer::Master(r) => Reply::Master(r),
                    clients::Answer::Chunk(r) => Reply::Chunk(r),
                };
                self.server_input(
                    i,
                    cs::Input::CallResult {
                        id: call,
                        result: Ok(reply),
                    },
                )
            }
            (Some(Caller::Client(op)), answer) => self.client_result(op, Ok(answer)),
            (Some(Caller::Probe), answer) => self.probe = Some(Ok(answer)),
            _ => {}
        }
    }

    /// Moves time on by `ms` of true time.
    pub fn advance(&mut self, ms: i64) {
        self.note(|| format!("advance {ms} ms"));
        self.now += ms;
        // Requests past their caller's deadline: the caller hears a timeout (if it
        // still waits), and the request is gone.
        let now = self.now;
        let late: Vec<Token> = self
            .net
            .iter()
            .filter(|m| m.expires <= now)
            .map(|m| m.token)
            .collect();
        for token in late {
            self.time_out(token);
        }
        self.wake_clients();
    }

    /// Whether anything is under way: messages, calls, storage, unsynced log.
    pub fn busy(&self) -> bool {
        !self.net.is_empty()
            || self
                .master
                .as_ref()
                .is_some_and(|m| !m.batch.is_empty() || m.built.is_some())
            || self
                .servers
                .iter()
                .any(|s| s.live.as_ref().is_some_and(|l| !l.running.is_empty()))
    }

    /// Runs everything under way to its end, in order (messages first in, first
    /// delivered; storage done; the log synced), at most `limit` events. Returns the
    /// events run.
    pub fn settle(&mut self, limit: usize) -> usize {
        let mut n = 0;
        while n < limit {
            if !self.net.is_empty() {
                self.deliver(0);
            } else if let Some(i) = (0..self.servers.len()).find(|&i| self.running(i) > 0) {
                self.finish_store(i, 0);
            } else if !self.sync_master() {
                break;
            }
            n += 1;
        }
        n
    }

    /// Calls still waiting for an answer.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Sends `payload` as a probe and runs everything under way until it is answered.
    fn probe(&mut self, payload: Payload) -> Option<clients::Answer> {
        self.probe = None;
        let token = self.token(Caller::Probe);
        self.send_request(token, payload);
        for _ in 0..100 {
            self.settle(20_000);
            if self.probe.is_some() {
                break;
            }
            self.tick_master();
            self.advance(100);
        }
        self.outstanding.remove(&token);
        self.probe.take().and_then(Result::ok)
    }

    /// Asks the master `req`, run to its answer with everything under way.
    pub fn probe_master(&mut self, req: ms_req::Req) -> Option<pb::MasterResponse> {
        match self.probe(Payload::ToMaster(pb::MasterRequest {
            req: Some(req),
            ..Default::default()
        }))? {
            clients::Answer::Master(r) => Some(r),
            clients::Answer::Chunk(_) => None,
        }
    }

    /// Reads up to `len` bytes of chunk `h` at version `version` from server `i`.
    pub fn probe_read(
        &mut self,
        i: usize,
        h: ChunkHandle,
        version: u64,
        len: u64,
    ) -> Result<bytes::Bytes, (Option<pb::ErrorCode>, String)> {
        let req = pb::ChunkRequest {
            req: Some(pb::chunk_request::Req::Read(pb::ReadChunkRequest {
                handle: h,
                version,
                offset: 0,
                length: len,
                capability: None,
            })),
        };
        match self.probe(Payload::ToServer(i, req)) {
            Some(clients::Answer::Chunk(pb::ChunkResponse { error: Some(e), .. })) => {
                Err((pb::ErrorCode::try_from(e.code).ok(), format!("{e:?}")))
            }
            Some(clients::Answer::Chunk(pb::ChunkResponse {
                resp: Some(pb::chunk_response::Resp::Read(r)),
                ..
            })) => Ok(r.data),
            other => Err((None, format!("no answer ({})", other.is_some()))),
        }
    }
}
