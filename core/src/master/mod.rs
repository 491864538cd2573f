//! The master: a sans-IO state machine. `Master::handle(now, input)` returns `Effects`;
//! the driver (`crate::driver::master`) carries them out.
//!
//! Ordering rules the types and this module keep:
//! - A mutation is applied to memory, its record goes to `Effects::log`, and its reply is
//!   held inside the master until the driver reports the record durable with
//!   `Input::LogSynced`. So every reply in `Effects::replies` may be sent at once.
//! - Until then the mutation keeps its path locks, so nobody reads what is not yet durable
//!   (`locks.rs`).
//! - `Effects::checkpoint`, when present, covers every record in `Effects::log` of the same
//!   step and all before it; the driver writes it after those records.

mod admin;
mod append;
pub mod checkpointer;
mod chunks;
mod config;
mod fallback;
mod gc;
mod heartbeat;
pub(crate) use heartbeat::cert_name;
mod invariants;
mod leases;
mod locks;
mod mend;
mod meta;
mod namespace;
pub mod perms;
mod placement;
pub mod reads;
mod replication;
pub(crate) mod retries;
mod servers;

#[cfg(test)]
mod tests;

use crate::types::HashMap;
use std::collections::{BTreeMap, VecDeque};

pub use admin::TROUBLED_LISTED;
pub use chunks::{Chunk, ChunkTable, Replicas, ServerIdx};
pub use config::MasterConfig;
pub use gc::deleted_at;
pub use locks::{LockSet, Mode, PathLocks};
pub use meta::{Applied, Meta};
pub use namespace::{DELETED_PREFIX, FileMeta, Namespace, Node};
pub use servers::{Registry, Server};

use crate::auth::{self, Caller};
use crate::capability;
use crate::error::{FsError, RpcError};
use crate::pb::{self, log_record::Op, master_request::Req, master_response::Resp};
use crate::rng::Rng;
use crate::types::{ChunkHandle, LogSeq, Time, Version};
use perms::Check;
use std::time::Duration;

/// Names one inbound request, so its reply can find its way back. Chosen by the driver.
pub type RequestId = u64;
/// Names one call the master makes to a chunkserver. Chosen by the master.
pub type CallId = u64;

// One input at a time, moved into `handle`: a request's size is no cost worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Input {
    /// A request from a client or a chunkserver, and who sent it (`crate::auth`).
    Request {
        id: RequestId,
        req: pb::MasterRequest,
        from: Caller,
    },
    /// The outcome of a call in an earlier `Effects::calls`.
    CallResult {
        id: CallId,
        result: Result<pb::ChunkResponse, RpcError>,
    },
    /// Every log record up to and including `through` is durable.
    LogSynced { through: LogSeq },
    /// Time passed: check liveness, leases, re-replication and garbage.
    Tick,
    /// A request that did not decode: answered as an invalid argument, changing nothing.
    /// It passes through `handle` (not answered by the driver) so that every input a
    /// node takes is seen, recorded and replayed in one place.
    Malformed { id: RequestId, error: String },
}

/// A call to a chunkserver.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub id: CallId,
    pub to: String,
    pub req: pb::ChunkRequest,
    /// How long to wait for the answer, where the driver's usual deadline is too short
    /// (a clone copies a whole chunk).
    pub timeout: Option<std::time::Duration>,
}

#[derive(Debug, Default)]
pub struct Effects {
    /// Records to append to the op log, in order, numbered consecutively.
    pub log: Vec<(LogSeq, pb::LogRecord)>,
    /// Replies that may be sent now: whatever they depend on is durable.
    pub replies: Vec<(RequestId, pb::MasterResponse)>,
    /// Calls to chunkservers; each answers with one `Input::CallResult`.
    pub calls: Vec<Call>,
    /// A checkpoint is due, through this record (the last in `log`). The master does not
    /// build it: a checkpoint of the whole namespace takes time in proportion to its
    /// size, and the master answers nothing while it builds. Its driver builds it beside
    /// the event loop from a copy of the state fed the same records (`checkpointer`).
    pub checkpoint_due: Option<LogSeq>,
}

/// A reply, and the locks to release, once a log record is durable.
#[derive(Debug)]
struct Held {
    reply: Option<(RequestId, pb::MasterResponse)>,
    locks: Option<LockSet>,
}

/// What a master→chunkserver call was for.
#[derive(Debug)]
enum CallCtx {
    SetVersion {
        handle: u64,
        server: ServerIdx,
    },
    Clone {
        handle: u64,
        source: ServerIdx,
        target: ServerIdx,
        version: u64,
    },
    Revoke {
        handle: u64,
        server: ServerIdx,
    },
    /// An order to mend the last copy of a version (`mend.rs`).
    Mend {
        handle: u64,
        server: ServerIdx,
    },
}

pub struct Master {
    cfg: MasterConfig,
    meta: Meta,
    servers: Registry,
    locks: PathLocks,
    rng: Rng,
    now: Time,
    /// The last record given a sequence number, and the last one known durable.
    last_seq: LogSeq,
    synced_seq: LogSeq,
    held: BTreeMap<LogSeq, Vec<Held>>,
    /// Requests waiting for locks, oldest first.
    queued: VecDeque<(RequestId, pb::MasterRequest, Caller)>,
    calls: HashMap<CallId, CallCtx>,
    next_call: CallId,
    leases: leases::Leases,
    repl: replication::Replication,
    gc: gc::Gc,
    /// Stale copies kept while their chunk is below its goal (`fallback.rs`).
    fallbacks: fallback::Fallbacks,
    /// Last copies of a version being mended (`mend.rs`), and how many were mended.
    mending: mend::Mending,
    mended: u64,
    /// Requests refused because their sender's role does not allow them (`crate::auth`),
    /// since this master started.
    refused: u64,
    /// Servers whose copy of a chunk failed its checksums and was dropped, since this
    /// master started (not logged: like locations, learned again). Fsck and clients
    /// are told how many of a chunk's copies were found corrupt, so a chunk with no
    /// good copy left reads as corrupt, not merely missing.
    found_corrupt: HashMap<ChunkHandle, Vec<ServerIdx>>,
    /// Each server's run (`boot`) as its last heartbeat gave it, and the latest step
    /// stamped on an answer it gave in that run (`ChunkResponse::report_seq`).
    answered: HashMap<ServerIdx, (u64, u64)>,
    /// Copies listed on a server's answer (a grant's, a clone's), with its run and step
    /// then: its heartbeat of that run composed at an earlier step does not show them
    /// yet, and their absence from it is no loss (`heartbeat.rs`). Cleared by its next
    /// report composed later, and when it is declared dead: bounded by the copies
    /// listed since a server's last heartbeat.
    listed_on_answer: HashMap<(ChunkHandle, ServerIdx), (u64, u64)>,
    checkpoint_seq: LogSeq,
    /// Write-target requests waiting for their chunk's allocation to be durable:
    /// (request, chunk, its index in the file, the file's chunk size).
    deferred_targets: BTreeMap<LogSeq, Vec<(RequestId, u64, u64, u64)>>,
    /// When each retired copy's order was given (or the master started), for lifting it.
    retired_at: HashMap<(u64, ServerIdx), Time>,
    /// The record that gave the cluster its id, when this master made it (0: it was in
    /// the log it recovered). No heartbeat reply names the id before it is durable: a
    /// chunkserver stores it for good, and a master that crashed first would make another.
    cluster_id_seq: LogSeq,
    /// Requests for locations or a write target not answered yet: who asked, and what
    /// their capabilities are to allow (`sign_replies`).
    signing: HashMap<RequestId, (Caller, u32)>,
    /// The token of the request being handled (0: none); the record that completes it
    /// names it ([`Master::log_for_request`]).
    request_token: u64,
    /// Mutations refused lately, refused again when asked again (`retries.rs`).
    refusals: retries::Refusals,
    /// In a master group, the time until which this master is known to lead (a
    /// majority heard from it since); past it, no lease is extended. None: it runs alone.
    authority: Option<Time>,
    /// The term in which this master leads its group, or the epoch of this run of a
    /// master that runs alone (`start_alone`); every message it sends a chunkserver
    /// carries it (see `chunkserver/epoch.rs`). 0: a master alone that took no epoch.
    epoch: u64,
    /// Whether this master runs alone and took its epoch itself (`start_alone`).
    alone: bool,
    /// The epoch this master started leading in (`epoch` may grow since, `outrun`):
    /// the quiet period it ends is that epoch's, and the holders it names from then on
    /// are kept when it logs so.
    first_epoch: u64,
    /// After `outrun`, grants go only to servers that reported the newer epoch until
    /// this time, whatever the quiet period (see `on_my_term`).
    outrun_at: Option<Time>,
    /// The record of this run's epoch (0: none): no heartbeat reply, which carries the
    /// epoch, goes out before it is durable, so no chunkserver stores an epoch a crash
    /// could hand to a later run again.
    start_seq: LogSeq,
    out: Effects,
}

/// The furthest a master alone moves its epoch past its log's on one heartbeat's word
/// (`Master::outrun`): a log restored from a copy lost at most this many runs.
pub const MAX_EPOCH_JUMP: u64 = 1 << 20;

impl Master {
    /// A master with an empty namespace, as on a fresh cluster.
    pub fn new(cfg: MasterConfig, now: Time) -> Master {
        let meta = Meta::new(cfg.chunk_size);
        Master::from_meta(cfg, now, meta, 0)
    }

    fn from_meta(cfg: MasterConfig, now: Time, meta: Meta, seq: LogSeq) -> Master {
        assert!(
            cfg.chunk_size > 0 && cfg.chunk_size <= crate::types::MAX_CHUNK_SIZE,
            "chunk size {} out of range",
            cfg.chunk_size
        );
        let rng = Rng::new(cfg.rng_seed);
        let max_servers = cfg.max_servers;
        let leases = leases::Leases::starting(now, &cfg, meta.next_handle);
        // Replica locations are not persisted: until heartbeats say otherwise, every chunk
        // may be short of its goal. Clones wait until every live server has had time to
        // report, or the master would copy chunks that are merely not yet reported.
        let mut repl = replication::Replication::starting(now + cfg.heartbeat_timeout);
        let fallbacks =
            fallback::Fallbacks::starting(now + cfg.clone_timeout + cfg.order_lifetime());
        for (h, _) in meta.chunks.iter() {
            repl.check(h);
        }
        Master {
            cfg,
            meta,
            servers: Registry::new(max_servers),
            locks: PathLocks::default(),
            rng,
            now,
            last_seq: seq,
            synced_seq: seq,
            held: BTreeMap::new(),
            queued: VecDeque::new(),
            calls: HashMap::default(),
            next_call: 1,
            leases,
            repl,
            gc: Default::default(),
            fallbacks,
            mending: mend::Mending::default(),
            mended: 0,
            refused: 0,
            found_corrupt: HashMap::default(),
            answered: HashMap::default(),
            listed_on_answer: HashMap::default(),
            checkpoint_seq: seq,
            retired_at: HashMap::default(),
            deferred_targets: BTreeMap::new(),
            cluster_id_seq: 0,
            signing: HashMap::default(),
            request_token: 0,
            refusals: Default::default(),
            authority: None,
            epoch: 0,
            alone: false,
            first_epoch: 0,
            outrun_at: None,
            start_seq: 0,
            out: Effects::default(),
        }
        .with_cluster_id()
    }

    /// Gives a cluster without an id one: a fresh log, or one from before clusters had
    /// ids. Drawn from the seeded generator (core reads no OS randomness), so a master's
    /// seed must differ between clusters that share a network; the binary seeds it from
    /// the OS. The record is the first effect the master returns.
    fn with_cluster_id(mut self) -> Master {
        if self.meta.cluster_id == 0 {
            // A stream of its own, so the placement and primary choices that follow the
            // seed are the same whether or not this master made the id.
            let cluster_id = Rng::new(self.cfg.rng_seed ^ CLUSTER_ID_STREAM)
                .next_u64()
                .max(1);
            let (seq, _) = self
                .log(Op::ClusterId(pb::ClusterIdOp {
                    cluster_id,
                    root: Some(self.cfg.root.clone()),
                }))
                .expect("a cluster without an id takes one");
            self.cluster_id_seq = seq;
            tracing::info!(cluster_id = %format_args!("{cluster_id:016x}"), "cluster id made");
        }
        if self.meta.capability_secret.is_empty() {
            // Heartbeat replies hand out keys derived from it only once it is durable
            // (they wait for `cluster_id_seq`): a secret lost with its record would leave
            // servers holding keys no master can sign with.
            let secret = self.cfg.capability_secret.to_vec().into();
            let (seq, _) = self
                .log(Op::CapabilitySecret(pb::CapabilitySecretOp { secret }))
                .expect("a cluster without a capability secret takes one");
            self.cluster_id_seq = seq;
            tracing::info!("capability secret made");
        }
        self
    }

    /// A master taking over `meta` (the state through record `seq`, all of it durable)
    /// as a master group's new leader: the same start as a restart's (quiet period, no
    /// replica locations), as the leader before may have left leases out.
    /// `epoch` is the term in which it leads.
    pub fn take_over(cfg: MasterConfig, now: Time, meta: Meta, seq: LogSeq, epoch: u64) -> Master {
        let mut m = Master::from_meta(cfg, now, meta, seq);
        m.lead_in(epoch);
        m
    }

    /// A master that runs alone, just recovered, takes the epoch of this run: one more
    /// than every epoch and term its log names, logged (`MasterStartOp`) and sent on
    /// every message to a chunkserver, as a group's leader sends its term. A server that
    /// stores it gives up the leases earlier runs granted, so the quiet period ends once
    /// every server named as a lease holder has reported the epoch, not a lease period
    /// later (see `leases.rs`). The driver writes the record durably before the master
    /// sends anything; its heartbeat replies wait for it in any case.
    pub fn start_alone(&mut self) {
        let latest = self.meta.latest_epoch();
        let Some(epoch) = latest.checked_add(1) else {
            // Only a damaged log could name the last epoch there is: run in it without
            // fencing (a reused epoch ends no lease), waiting the quiet period out.
            tracing::error!("the log names the last master epoch there is: running in it again");
            self.alone = true;
            self.epoch = latest;
            self.first_epoch = latest;
            return;
        };
        let (seq, _) = self
            .log(Op::MasterStart(pb::MasterStartOp { epoch }))
            .expect("a master start with a newer epoch applies");
        self.alone = true;
        self.start_seq = seq;
        tracing::info!(epoch, "master epoch taken");
        self.lead_in(epoch);
    }

    /// Starts leading in `epoch`, fencing older leases where the log names every server
    /// that may hold one.
    fn lead_in(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.first_epoch = epoch;
        // Fencing needs every holder of a lease that may be out named in the log: so it
        // is once some leader's quiet period has ended, or when no chunk was ever made (a
        // log from before holders were named leaves the first leader to wait it out).
        // Holders named in this very term were granted by an earlier master of it, whose
        // leases no term change ends.
        let h = &self.meta.lease_holders;
        let known = self.meta.leases_settled_in > 0 || self.meta.next_handle <= 1;
        if known && h.values().all(|&t| t < epoch) {
            let older: std::collections::BTreeSet<(String, u64)> = h.keys().cloned().collect();
            self.leases.fence(self.now, older);
        }
    }

    /// A master alone that hears a server report an epoch this run did not give it (a
    /// newer one, or its own before it answered the server) is running on a log that
    /// lost runs: restored from an older copy, say. It takes an epoch past the one
    /// reported (the servers would refuse it for good as a deposed leader otherwise),
    /// and waits its quiet period out by time: the holders of leases the lost runs
    /// granted are not named in its log, so fencing could not account for them.
    /// The leases this run granted stay in its table until they expire, though their
    /// holders give them up. A jump past [`MAX_EPOCH_JUMP`] is refused as forged or
    /// damaged (heartbeats are not authenticated).
    pub(super) fn outrun(&mut self, theirs: u64) {
        if !self.alone || theirs < self.epoch {
            return;
        }
        let latest = self.meta.latest_epoch();
        if theirs > latest.saturating_add(MAX_EPOCH_JUMP) {
            tracing::error!(
                ours = self.epoch,
                theirs,
                "a heartbeat reports a master epoch far past this log's: ignored"
            );
            return;
        }
        // Every live server must be able to follow: a chunkserver believes a term at most
        // MAX_EPOCH_JUMP past the one it stored (`chunkserver`'s `epoch.rs`), so one
        // server's report (a forgery from its certificate) may not take the epoch past
        // what the lowest reported allows, or the rest would refuse this master for good.
        let floor = self
            .servers
            .live()
            .map(|(_, s)| s.epoch)
            .filter(|&e| e > 0)
            .min()
            .unwrap_or(theirs);
        if theirs >= floor.saturating_add(MAX_EPOCH_JUMP) {
            tracing::error!(
                ours = self.epoch,
                theirs,
                lowest = floor,
                "a heartbeat reports a master epoch the other servers could not follow: ignored"
            );
            return;
        }
        let Some(epoch) = theirs.max(latest).checked_add(1) else {
            return;
        };
        match self.log(Op::MasterStart(pb::MasterStartOp { epoch })) {
            Ok((seq, _)) => {
                tracing::warn!(
                    ours = self.epoch,
                    theirs,
                    epoch,
                    "a chunkserver reports a master epoch this run did not give it: the log \
                     lost runs (restored from an older copy?); taking a newer epoch and \
                     waiting the quiet period out"
                );
                self.start_seq = seq;
                self.epoch = epoch;
                self.outrun_at = Some(self.now);
                self.leases.unfence();
            }
            Err(e) => tracing::error!("taking master epoch {epoch}: {e}"),
        }
    }

    /// The term in which this master leads its group, or the epoch of this run of a
    /// master alone (0: a master alone that took none, see `start_alone`).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// In a master group: this master is known to lead until `until` (see
    /// `crate::group::lease`); it extends no lease from then on.
    pub fn set_authority(&mut self, until: Time) {
        self.authority = Some(until);
    }

    /// Until when this master knows it leads its group (None: it runs alone).
    pub fn authority(&self) -> Option<Time> {
        self.authority
    }

    /// The cluster's id (see `Meta::cluster_id`).
    pub fn cluster_id(&self) -> u64 {
        self.meta.cluster_id
    }

    /// Start-up is recovery: the latest checkpoint (if any), then every durable record
    /// after it, in order. Replica locations are not persisted; heartbeats bring them.
    pub fn recover(
        cfg: MasterConfig,
        now: Time,
        checkpoint: Option<&pb::Checkpoint>,
        tail: impl IntoIterator<Item = (LogSeq, pb::LogRecord)>,
    ) -> Result<Master, FsError> {
        let (meta, seq) = Meta::replay(cfg.chunk_size, checkpoint, tail)?;
        Ok(Master::from_meta(cfg, now, meta, seq))
    }

    /// As [`Master::recover`], from records it borrows (its driver's checkpointer
    /// recovers from the same ones).
    pub fn recover_from(
        cfg: MasterConfig,
        now: Time,
        checkpoint: Option<&pb::Checkpoint>,
        tail: &[(LogSeq, pb::LogRecord)],
    ) -> Result<Master, FsError> {
        let (meta, seq) = Meta::replay(
            cfg.chunk_size,
            checkpoint,
            tail.iter().map(|(s, r)| (*s, r)),
        )?;
        Ok(Master::from_meta(cfg, now, meta, seq))
    }

    pub fn config(&self) -> &MasterConfig {
        &self.cfg
    }

    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    pub fn servers(&self) -> &Registry {
        &self.servers
    }

    pub fn last_seq(&self) -> LogSeq {
        self.last_seq
    }

    /// The last record the driver has said is durable (`Input::LogSynced`).
    pub fn synced_seq(&self) -> LogSeq {
        self.synced_seq
    }

    /// The master's clock: the latest time its driver has given it (it never goes back,
    /// even when the machine's clock does). Its timers (leases, the collector's delay)
    /// are measured by it.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Whether any operation still waits for durability or locks.
    pub fn is_quiescent(&self) -> bool {
        self.held.is_empty()
            && self.queued.is_empty()
            && self.locks.is_idle()
            && self.deferred_targets.is_empty()
    }

    pub fn handle(&mut self, now: Time, input: Input) -> Effects {
        // The master's clock never goes back, even if the driver's does.
        self.now = self.now.max(now);
        match input {
            Input::Request { id, req, from } => {
                // Locations and write targets go out with capabilities for their caller,
                // signed as the reply leaves (`sign_replies`).
                let ops = match &req.req {
                    Some(Req::GetChunks(_)) => capability::READ,
                    Some(Req::GetWriteTarget(t)) if t.append => capability::APPEND,
                    Some(Req::GetWriteTarget(_)) => capability::WRITE,
                    _ => 0,
                };
                if ops != 0 && from != Caller::Insecure {
                    self.signing.insert(id, (from.clone(), ops));
                }
                if let Err(e) = self.authorize(&from, &req) {
                    self.refused += 1;
                    self.reply_err(id, e);
                } else if !self.on_request(id, &req, &from) {
                    if self.queued.len() >= self.cfg.max_queued {
                        self.reply_err(
                            id,
                            FsError::Unavailable(format!(
                                "master busy: {} requests wait for locks",
                                self.queued.len()
                            )),
                        );
                    } else {
                        self.queued.push_back((id, req, from));
                    }
                }
            }
            Input::CallResult { id, result } => self.on_call_result(id, result),
            Input::LogSynced { through } => self.on_log_synced(through),
            Input::Tick => self.on_tick(),
            Input::Malformed { id, error } => self.reply_err(
                id,
                FsError::InvalidArgument(format!("malformed request: {error}")),
            ),
        }
        self.maybe_checkpoint();
        self.sign_replies();
        // Cheap promises, checked where the master runs (the rest: `check_invariants`).
        assert!(self.synced_seq <= self.last_seq, "log synced past its end");
        assert!(
            self.held.keys().next().is_none_or(|&s| s > self.synced_seq),
            "a reply held for a record already durable"
        );
        std::mem::take(&mut self.out)
    }

    /// Signs the capabilities of the locations and write targets about to go out, for
    /// the callers that asked (`crate::capability`).
    /// The leave for chunkserver `reader` to read chunk `h` at `version` from `holder`'s
    /// copy (a clone's or a mend's source), for `life` at most (the key's own life bounds
    /// it too); None on an insecure cluster, where the reader's certificate names
    /// nobody. Signed with `holder`'s key, so it is good on that server alone.
    pub(super) fn peer_read_capability(
        &self,
        h: ChunkHandle,
        version: Version,
        holder: ServerIdx,
        reader: ServerIdx,
        life: Duration,
    ) -> Option<pb::Capability> {
        let name = &self.servers.get(reader).cert;
        if name.is_empty() {
            return None;
        }
        let want = capability::Want {
            handle: h,
            version,
            ops: capability::READ,
        };
        let subject = Caller::Chunkserver { name: name.clone() };
        Some(self.servers.get(holder).keys.issue(
            &self.meta.capability_secret,
            self.now,
            life,
            want,
            &subject,
        ))
    }

    fn sign_replies(&mut self) {
        if self.signing.is_empty() {
            return;
        }
        let (secret, now, life) = (
            &self.meta.capability_secret,
            self.now,
            self.cfg.lease_duration,
        );
        let servers = &self.servers;
        let keys = |a: &str| servers.find(a).map(|i| &servers.get(i).keys);
        for (id, resp) in &mut self.out.replies {
            let Some((caller, ops)) = self.signing.remove(id) else {
                continue;
            };
            match &mut resp.resp {
                Some(Resp::GetChunks(r)) => {
                    capability::sign_locations(r, secret, now, life, &caller, keys)
                }
                Some(Resp::WriteTarget(t)) => {
                    capability::sign_target(t, secret, now, life, ops, &caller, keys)
                }
                _ => {}
            }
        }
    }

    // ---- logging and holding replies -------------------------------------------------

    /// Applies `op` and logs it. On error nothing is logged.
    fn log(&mut self, op: Op) -> Result<(LogSeq, Applied), FsError> {
        self.log_with(op, 0)
    }

    /// Logs the one record that completes the request being handled, naming its token
    /// so that the request asked again is answered as now (see `retries.rs`).
    fn log_for_request(&mut self, op: Op) -> Result<(LogSeq, Applied), FsError> {
        self.log_with(op, self.request_token)
    }

    fn log_with(&mut self, op: Op, token: u64) -> Result<(LogSeq, Applied), FsError> {
        let rec = pb::LogRecord {
            time_ms: self.now.as_millis(),
            token,
            op: Some(op),
        };
        let applied = self.meta.apply(&rec)?;
        self.last_seq += 1;
        self.out.log.push((self.last_seq, rec));
        for &h in &applied.reclaimed {
            self.forget_chunk(h);
        }
        Ok((self.last_seq, applied))
    }

    /// Releases `reply` and `locks` once record `seq` is durable (at once if it is).
    fn hold(
        &mut self,
        seq: LogSeq,
        reply: Option<(RequestId, pb::MasterResponse)>,
        locks: Option<LockSet>,
    ) {
        if seq <= self.synced_seq {
            if let Some(l) = locks {
                self.locks.release(&l);
            }
            if let Some(r) = reply {
                self.out.replies.push(r);
            }
        } else {
            self.held
                .entry(seq)
                .or_default()
                .push(Held { reply, locks });
        }
    }

    fn reply(&mut self, id: RequestId, resp: Resp) {
        self.out.replies.push((id, ok(resp)));
    }

    /// Replies with a view of the namespace once everything logged so far is durable.
    /// A listing takes only its directory's read lock, so it can see an entry whose
    /// create (or miss one whose delete) is still in flight; were the master to crash
    /// before that record is durable, the change would be undone after someone saw it.
    /// Holding the answer until the log has caught up makes visibility follow durability.
    fn reply_durable(&mut self, id: RequestId, resp: Resp) {
        let last = self.last_seq;
        self.hold(last, Some((id, ok(resp))), None);
    }

    fn reply_err(&mut self, id: RequestId, e: FsError) {
        self.out.replies.push((id, err(e)));
    }

    fn on_log_synced(&mut self, through: LogSeq) {
        assert!(
            through <= self.last_seq,
            "log synced through {through}, but only {} records exist",
            self.last_seq
        );
        if through <= self.synced_seq {
            return;
        }
        self.synced_seq = through;
        let later = self.held.split_off(&(through + 1));
        let ready = std::mem::replace(&mut self.held, later);
        let mut released = false;
        for (_, hs) in ready {
            for h in hs {
                if let Some(l) = h.locks {
                    self.locks.release(&l);
                    released = true;
                }
                if let Some(r) = h.reply {
                    self.out.replies.push(r);
                }
            }
        }
        self.reservations_synced(through);
        let later = self.deferred_targets.split_off(&(through + 1));
        let ready = std::mem::replace(&mut self.deferred_targets, later);
        for (seq, targets) in ready {
            for (id, h, index, chunk_size) in targets {
                self.write_target(id, h, seq, index, chunk_size);
            }
        }
        if released {
            self.retry_queued();
        }
    }

    fn retry_queued(&mut self) {
        for _ in 0..self.queued.len() {
            let (id, req, from) = self.queued.pop_front().expect("counted");
            if !self.on_request(id, &req, &from) {
                self.queued.push_back((id, req, from));
            }
        }
    }

    fn maybe_checkpoint(&mut self) {
        if self.last_seq - self.checkpoint_seq >= self.cfg.checkpoint_every {
            self.checkpoint_seq = self.last_seq;
            self.out.checkpoint_due = Some(self.last_seq);
        }
    }

    /// A checkpoint of everything logged so far (for an operator, or a test).
    pub fn checkpoint_now(&mut self) -> pb::Checkpoint {
        self.checkpoint_seq = self.last_seq;
        self.meta.checkpoint(self.last_seq)
    }

    // ---- requests ---------------------------------------------------------------------

    /// Whether `from` may send `req`: its role allows the kind (`crate::auth`). What a
    /// heartbeat or a corruption report claims of its server is checked where they are
    /// handled, against the server its certificate names.
    fn authorize(&self, from: &Caller, req: &pb::MasterRequest) -> Result<(), FsError> {
        match &req.req {
            Some(r) => auth::master_request(from, r),
            None => Ok(()),
        }
    }

    /// Requests refused because their sender's role does not allow them.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Handles a request; returns false if it must wait for locks (nothing was done).
    fn on_request(&mut self, id: RequestId, req: &pb::MasterRequest, from: &Caller) -> bool {
        let Some(r) = &req.req else {
            self.reply_err(id, FsError::InvalidArgument("empty request".into()));
            return true;
        };
        let result = match self.answer_repeat(id, req, r) {
            Some(answered) => answered,
            None => {
                let mutation = retries::mutation(r);
                if mutation.is_some() {
                    self.request_token = req.token;
                }
                let result = self.dispatch(id, r, from);
                self.request_token = 0;
                if let (Err(e), Some((path, _))) = (&result, mutation) {
                    self.refusals.insert(req.token, r, path, e);
                }
                result
            }
        };
        match result {
            Ok(done) => done,
            Err(e) => {
                self.reply_err(id, e);
                true
            }
        }
    }

    fn dispatch(&mut self, id: RequestId, r: &Req, from: &Caller) -> Result<bool, FsError> {
        match r {
            Req::Mkdir(r) => self.on_mkdir(id, r, from),
            Req::Create(r) => self.on_create(id, r, from),
            Req::Delete(r) => self.on_delete(id, r, from),
            Req::Rename(r) => self.on_rename(id, r, from),
            Req::List(r) => self.on_list(id, r, from),
            Req::Stat(r) => self.on_stat(id, r, from),
            Req::GetChunks(r) => self.on_get_chunks(id, r, from),
            Req::GetWriteTarget(r) => self.on_get_write_target(id, r, from),
            Req::ExtendFile(r) => self.on_extend_file(id, r, from),
            Req::ReserveAppend(r) => self.on_reserve_append(id, r, from),
            Req::SetPermissions(r) => self.on_set_permissions(id, r, from),
            Req::Heartbeat(r) if r.copy => {
                // A copy for a shadow master's chunk locations; this master answers the
                // server's own heartbeat, not its copies.
                self.reply(id, Resp::Empty(pb::Empty {}));
                Ok(true)
            }
            Req::Heartbeat(r) => {
                self.on_heartbeat(id, r, from);
                Ok(true)
            }
            Req::ReportCorrupt(r) => {
                self.on_report_corrupt(id, r, from);
                Ok(true)
            }
            Req::Report(_) => {
                self.on_report(id);
                Ok(true)
            }
            Req::Fsck(r) => self.on_fsck(id, r),
            // A master replica takes these before its master sees a request
            // (`crate::group`); one reaching a master on its own was misaddressed.
            Req::Raft(_) | Req::RaftBatch(_) | Req::ReplicaStatus(_) => {
                Err(FsError::InvalidArgument(
                    "a master group message reached a master that runs alone".into(),
                ))
            }
            Req::ChangeMembers(_) => Err(FsError::InvalidArgument(
                "this master runs alone, not in a group of replicas: it has no members to \
                 change"
                    .into(),
            )),
        }
    }

    /// Takes `set`; Ok(false) if it must wait.
    fn lock(&mut self, set: &LockSet) -> bool {
        self.locks.try_acquire(set)
    }

    /// Runs a one-record mutation under `set`: applied and logged (naming the request's
    /// token), reply held until durable; or refused, locks released and the error
    /// returned at once.
    fn mutate(&mut self, id: RequestId, set: LockSet, op: Op) -> Result<bool, FsError> {
        if !self.lock(&set) {
            return Ok(false);
        }
        match self.log_for_request(op) {
            Ok((seq, _)) => {
                self.hold(seq, Some((id, ok(Resp::Empty(pb::Empty {})))), Some(set));
                Ok(true)
            }
            Err(e) => {
                self.locks.release(&set);
                Err(e)
            }
        }
    }

    /// What `from` may do in the namespace as it stands (`perms`).
    fn check<'a>(&'a self, from: &'a Caller) -> Check<'a> {
        Check::new(&self.meta.ns, from)
    }

    fn on_mkdir(
        &mut self,
        id: RequestId,
        r: &pb::MkdirRequest,
        from: &Caller,
    ) -> Result<bool, FsError> {
        let path = crate::path::normalize(&r.path)?;
        namespace::refuse_reserved(&path)?;
        let mode = u32::from(perms::valid_mode(
            r.mode.unwrap_or(perms::DEFAULT_DIR_MODE),
        )?);
        if !r.parents {
            let check = self.check(from);
            let perms = Some(check.new_entry(check.create(&path)?, mode));
            let set = LockSet::on(&path, Mode::Write)?;
            return self.mutate(id, set, Op::Mkdir(pb::MkdirOp { path, perms }));
        }
        // mkdir -p: create each missing component, all under one lock set.
        let mut todo = crate::path::ancestors(&path)?;
        todo.push(path.clone());
        todo.retain(|p| p != "/");
        let mut set = LockSet::default();
        for p in &todo {
            set.add(p, Mode::Write)?;
        }
        if !self.lock(&set) {
            return Ok(false);
        }
        let mut last = None;
        for p in todo {
            match self.meta.ns.get(&p) {
                Ok(Node::Dir { .. }) => continue,
                Ok(Node::File(_)) => {
                    self.release_or_hold(last, set);
                    return Err(FsError::NotADirectory(p));
                }
                Err(_) => {}
            }
            // Each is made in the one before: checked as it is reached. Those on the way
            // are searchable and writable by their maker, as POSIX's mkdir -p makes them.
            let mode = if p == path { mode } else { mode | 0o300 };
            let check = self.check(from);
            let perms = match check.create(&p) {
                Ok(parent) => Some(check.new_entry(parent, mode)),
                Err(e) => {
                    self.release_or_hold(last, set);
                    return Err(e);
                }
            };
            match self.log(Op::Mkdir(pb::MkdirOp { path: p, perms })) {
                Ok((seq, _)) => last = Some(seq),
                Err(e) => {
                    self.release_or_hold(last, set);
                    return Err(e);
                }
            }
        }
        let reply = Some((id, ok(Resp::Empty(pb::Empty {}))));
        match last {
            Some(seq) => self.hold(seq, reply, Some(set)),
            None => {
                // Every directory there already: answered, as a stat is, once everything
                // logged so far is durable (a record its answer reflects may not be yet).
                self.locks.release(&set);
                let seq = self.last_seq;
                self.hold(seq, reply, None);
            }
        }
        Ok(true)
    }

    /// After a partial multi-record mutation fails: keep the locks until what was logged
    /// is durable, or release them now if nothing was.
    fn release_or_hold(&mut self, last: Option<LogSeq>, set: LockSet) {
        match last {
            Some(seq) => self.hold(seq, None, Some(set)),
            None => self.locks.release(&set),
        }
    }

    fn on_create(
        &mut self,
        id: RequestId,
        r: &pb::CreateRequest,
        from: &Caller,
    ) -> Result<bool, FsError> {
        let path = crate::path::normalize(&r.path)?;
        namespace::refuse_reserved(&path)?;
        let mode = u32::from(perms::valid_mode(
            r.mode.unwrap_or(perms::DEFAULT_FILE_MODE),
        )?);
        let check = self.check(from);
        let perms = Some(check.new_entry(check.create(&path)?, mode));
        let replication = match r.replication {
            0 => u32::from(self.cfg.default_replication),
            n => n,
        };
        if replication > 255 {
            return Err(FsError::InvalidArgument(format!(
                "replication {replication} above 255"
            )));
        }
        let set = LockSet::on(&path, Mode::Write)?;
        // The file keeps the chunk size of today's configuration for good.
        let op = Op::Create(pb::CreateOp {
            path,
            replication,
            chunk_size: self.cfg.chunk_size,
            perms,
        });
        self.mutate(id, set, op)
    }

    fn on_rename(
        &mut self,
        id: RequestId,
        r: &pb::RenameRequest,
        from: &Caller,
    ) -> Result<bool, FsError> {
        let src = crate::path::normalize(&r.src)?;
        let dst = crate::path::normalize(&r.dst)?;
        namespace::refuse_reserved(&dst)?;
        self.check(from).rename(&src, &dst)?;
        let mut set = LockSet::on(&src, Mode::Write)?;
        set.add(&dst, Mode::Write)?;
        self.mutate(id, set, Op::Rename(pb::RenameOp { src, dst }))
    }

    /// Changes an entry's owner, group or bits (`perms`), each if asked.
    fn on_set_permissions(
        &mut self,
        id: RequestId,
        r: &pb::SetPermissionsRequest,
        from: &Caller,
    ) -> Result<bool, FsError> {
        let path = crate::path::normalize(&r.path)?;
        for name in [&r.owner, &r.group] {
            if !name.is_empty() && !auth::valid_name(name) {
                return Err(FsError::InvalidArgument(format!(
                    "{name:?} is not a user or group name"
                )));
            }
        }
        if let Some(m) = r.mode {
            perms::valid_mode(m)?;
        }
        fn some(s: &str) -> Option<&str> {
            (!s.is_empty()).then_some(s)
        }
        self.check(from)
            .set_perms(&path, some(&r.owner), some(&r.group), r.mode)?;
        let set = LockSet::on(&path, Mode::Write)?;
        let op = Op::SetPermissions(pb::SetPermissionsOp {
            path,
            owner: r.owner.clone(),
            group: r.group.clone(),
            mode: r.mode,
        });
        self.mutate(id, set, op)
    }

    fn on_list(
        &mut self,
        id: RequestId,
        r: &pb::ListRequest,
        from: &Caller,
    ) -> Result<bool, FsError> {
        let path = crate::path::normalize(&r.path)?;
        let set = LockSet::on(&path, Mode::Read)?;
        if !self.lock(&set) {
            return Ok(false);
        }
        let result = reads::list_page(&self.meta, &path, r, from);
        self.locks.release(&set);
        self.reply_durable(id, Resp::List(result?));
        Ok(true)
    }

    fn on_stat(
        &mut self,
        id: RequestId,
        r: &pb::StatRequest,
        from: &Caller,
    ) -> Result<bool, FsError> {
        let path = crate::path::normalize(&r.path)?;
        let set = LockSet::on(&path, Mode::Read)?;
        if !self.lock(&set) {
            return Ok(false);
        }
        let info = reads::stat(&self.meta, &path, from);
        self.locks.release(&set);
        self.reply_durable(id, Resp::Stat(info?));
        Ok(true)
    }

    fn on_get_chunks(
        &mut self,
        id: RequestId,
        r: &pb::GetChunksRequest,
        from: &Caller,
    ) -> Result<bool, FsError> {
        let path = crate::path::normalize(&r.path)?;
        let set = LockSet::on(&path, Mode::Read)?;
        if !self.lock(&set) {
            return Ok(false);
        }
        let result =
            reads::chunk_locations(&self.meta, &path, r.first_index, r.count, from, |_, c| {
                self.addrs(c.replicas.as_slice())
            })
            .map(|mut r| {
                for l in &mut r.chunks {
                    if l.replicas.is_empty()
                        && let Some(c) = self.meta.chunks.get(l.handle)
                    {
                        l.corrupt_copies = self.corrupt_copies(l.handle, c);
                    }
                }
                r
            });
        self.locks.release(&set);
        self.reply(id, Resp::GetChunks(result?));
        Ok(true)
    }

    fn addrs(&self, servers: &[ServerIdx]) -> Vec<String> {
        servers
            .iter()
            .filter(|&&s| self.servers.is_alive(s))
            .map(|&s| self.servers.get(s).addr.clone())
            .collect()
    }

    fn on_extend_file(
        &mut self,
        id: RequestId,
        r: &pb::ExtendFileRequest,
        from: &Caller,
    ) -> Result<bool, FsError> {
        let path = crate::path::normalize(&r.path)?;
        self.check(from).write(&path)?;
        let set = LockSet::on(&path, Mode::Write)?;
        if !self.lock(&set) {
            return Ok(false);
        }
        let file = self.meta.ns.file(&path).and_then(|f| {
            // The chunks written must be this file's: else the name is another file's
            // now, and the bytes written are not in it.
            for (k, &h) in r.handles.iter().enumerate() {
                let at = r.first_index.saturating_add(k as u64);
                if usize::try_from(at).ok().and_then(|i| f.chunks.get(i)) != Some(&h) {
                    return Err(FsError::NotFound(format!(
                        "{path}: chunk {at} is not {h:#x}: the file written was renamed or \
                         deleted meanwhile"
                    )));
                }
            }
            // No longer than the chunks written reach (than the file's chunks, if none
            // is named): a length past them would read as zeros for ever, and a length
            // never shrinks.
            let chunk_size = u64::from(f.chunk_size);
            let reach = if r.handles.is_empty() {
                f.chunks.len() as u64
            } else {
                r.first_index.saturating_add(r.handles.len() as u64)
            }
            .saturating_mul(chunk_size);
            if r.length > reach {
                return Err(FsError::InvalidArgument(format!(
                    "{path}: length {} is past the end of the chunks written ({reach})",
                    r.length
                )));
            }
            Ok(f)
        });
        match file {
            Ok(f) if f.length >= r.length => {
                // Long enough already, but the record that made it so may not be durable
                // yet: answer when everything logged so far is.
                let last = self.last_seq;
                self.hold(last, Some((id, ok(Resp::Empty(pb::Empty {})))), Some(set));
                Ok(true)
            }
            Ok(_) => {
                self.locks.release(&set);
                let set = LockSet::on(&path, Mode::Write)?;
                self.mutate(
                    id,
                    set,
                    Op::SetLength(pb::SetLengthOp {
                        path,
                        length: r.length,
                        ..Default::default()
                    }),
                )
            }
            Err(e) => {
                self.locks.release(&set);
                Err(e)
            }
        }
    }

    // ---- calls to chunkservers -------------------------------------------------------

    fn call(&mut self, to: ServerIdx, ctx: CallCtx, req: pb::chunk_request::Req) {
        // A clone that timed out here would be started again while the first copy still
        // runs, queueing duplicate copies (and the grants behind them) on the target.
        // A mend reads blocks from other servers too: as long.
        let timeout = matches!(
            req,
            pb::chunk_request::Req::Clone(_) | pb::chunk_request::Req::Mend(_)
        )
        .then_some(self.cfg.clone_timeout);
        let id = self.next_call;
        self.next_call += 1;
        self.calls.insert(id, ctx);
        self.out.calls.push(Call {
            id,
            to: self.servers.get(to).addr.clone(),
            req: pb::ChunkRequest { req: Some(req) },
            timeout,
        });
    }

    fn on_call_result(&mut self, id: CallId, result: Result<pb::ChunkResponse, RpcError>) {
        let Some(ctx) = self.calls.remove(&id) else {
            tracing::warn!(call = id, "result for an unknown call");
            return;
        };
        let ok = match &result {
            Ok(resp) => resp.error.is_none(),
            Err(_) => false,
        };
        if let Ok(resp) = &result {
            let server = match ctx {
                CallCtx::SetVersion { server, .. }
                | CallCtx::Revoke { server, .. }
                | CallCtx::Mend { server, .. } => server,
                CallCtx::Clone { target, .. } => target,
            };
            let seen = self.answered.entry(server).or_default();
            seen.1 = seen.1.max(resp.report_seq);
        }
        match ctx {
            CallCtx::SetVersion { handle, server } => {
                self.on_set_version_result(handle, server, ok)
            }
            CallCtx::Clone {
                handle,
                source,
                target,
                version,
            } => self.on_clone_result(handle, source, target, version, ok, result.is_ok()),
            CallCtx::Revoke { handle, server } => self.on_revoke_result(handle, server, ok),
            CallCtx::Mend { handle, server } => {
                let outcome = match result {
                    Ok(pb::ChunkResponse { error: None, .. }) => Ok(()),
                    Ok(pb::ChunkResponse { error: Some(e), .. }) => Err(Some(FsError::from_pb(&e))),
                    Err(_) => Err(None),
                };
                self.on_mend_result(handle, server, outcome)
            }
        }
    }

    fn on_tick(&mut self) {
        self.leases.purge(self.now, self.cfg.max_clock_skew);
        self.forget_old_lease_holders();
        self.check_liveness();
        self.schedule_clones();
        self.collect_garbage();
        let chunks = &self.meta.chunks;
        self.found_corrupt.retain(|&h, _| chunks.get(h).is_some());
    }

    /// How many copies of `h` were found corrupt and are not listed as replicas now.
    fn corrupt_copies(&self, h: ChunkHandle, c: &Chunk) -> u32 {
        self.found_corrupt.get(&h).map_or(0, |found| {
            found.iter().filter(|&&s| !c.replicas.contains(s)).count() as u32
        })
    }

    /// Whether `server`'s copy of `h` is retired at the chunk's current version.
    fn is_retired(&self, h: u64, server: ServerIdx) -> bool {
        let c = self.meta.chunks.get(h);
        let addr = &self.servers.get(server).addr;
        match (c, self.meta.retired.get(&(h, addr.clone()))) {
            (Some(c), Some(&v)) => c.version == v,
            _ => false,
        }
    }

    /// The chunk's replicas on servers now alive.
    fn live_replicas(&self, c: &Chunk) -> Vec<ServerIdx> {
        c.replicas
            .as_slice()
            .iter()
            .copied()
            .filter(|&s| self.servers.is_alive(s))
            .collect()
    }

    /// A chunk left the table: forget its lease and repair work.
    fn forget_chunk(&mut self, h: u64) {
        self.leases.forget(h);
        self.repl.forget(h);
        self.fallbacks.forget(h);
    }
}

pub(crate) fn ok(resp: Resp) -> pb::MasterResponse {
    pb::MasterResponse {
        error: None,
        resp: Some(resp),
        shadow: None,
    }
}

pub(crate) fn err(e: FsError) -> pb::MasterResponse {
    pb::MasterResponse {
        error: Some(e.to_pb()),
        resp: None,
        shadow: None,
    }
}

/// Mixed into the master's seed for the cluster id's draw.
const CLUSTER_ID_STREAM: u64 = 0x636c_7573_7465_7269;

/// Entries per listing page at most (HDFS lists 1000 at a time too): a reply stays far
/// below the largest message, however big the directory.
pub const LIST_PAGE: usize = 1000;
/// Entries (files and directories) per fsck page at most.
pub const FSCK_PAGE: usize = 10_000;
/// Chunks an fsck page lists at most; a page that reaches it ends there, inside a file if
/// need be.
pub const FSCK_CHUNKS_PAGE: usize = 100_000;

/// The page size a request asked for: `asked`, unless 0 or above `most`.
fn page_limit(asked: u32, most: usize) -> usize {
    match asked as usize {
        0 => most,
        n => n.min(most),
    }
}

fn file_info(names: &perms::Names, path: String, node: &Node) -> pb::FileInfo {
    let p = names.to_pb(node.perms());
    let (owner, group, mode) = (p.owner, p.group, p.mode);
    match node {
        Node::Dir { mtime_ms, .. } => pb::FileInfo {
            path,
            is_dir: true,
            mtime_ms: *mtime_ms,
            owner,
            group,
            mode,
            ..Default::default()
        },
        Node::File(f) => pb::FileInfo {
            path,
            is_dir: false,
            length: f.length,
            replication: f.replication.into(),
            chunk_count: f.chunks.len() as u64,
            mtime_ms: f.mtime_ms,
            owner,
            group,
            mode,
        },
    }
}
