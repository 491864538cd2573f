//! The chunkserver: a sans-IO state machine over one server's chunks.
//!
//! It keeps each chunk's metadata (version, length, block checksums) in memory and asks
//! the driver for storage operations; data never passes through here except to be
//! checksummed. Rules it keeps:
//! - No byte leaves before its blocks' checksums verify. A mismatch is an error to the
//!   reader and a report to the master; the copy is never served again.
//! - A write, a new version or a clone is acknowledged only after the storage operation
//!   that makes it durable completes (`StoreOp` documents what each one syncs).
//! - Operations on one chunk run one at a time, in arrival order; different chunks
//!   proceed together.

mod cache;
pub mod checksum;
mod epoch;
mod heartbeat;
mod invariants;
mod mend;
mod push;
mod reads;
mod repair;
mod scrub;
mod space;
mod versions;
mod writes;

#[cfg(test)]
mod tests;

use crate::types::{HashMap, HashSet};
use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::auth::{self, Caller};
use crate::capability;
use crate::error::{FsError, RpcError, StoreError};
use crate::pb::{self, chunk_request::Req, chunk_response::Resp, master_request::Req as MReq};
use crate::types::{BLOCK_SIZE, ChunkHandle, MAX_CHUNK_SIZE, Time, Version};

pub type RequestId = u64;
pub type CallId = u64;
pub type OpId = u64;

/// The metadata record of this handle names no chunk (the master hands out handles from
/// 1): it holds the server's identity (`pb::ChunkMeta::server_id`, `cluster_id`).
pub const IDENTITY_HANDLE: ChunkHandle = 0;

#[derive(Clone, Debug)]
pub struct ChunkserverConfig {
    /// The address other nodes reach this server at; also its identity to the master.
    pub address: String,
    pub rack: String,
    /// A quota on the bytes of the chunks this server holds: a mutation or clone that
    /// would pass it is refused with `NoSpace`, as when the disk is full (`space.rs`).
    pub capacity_bytes: u64,
    /// Largest piece read from a peer in one call while cloning.
    pub clone_piece: u64,
    /// The scrubber verifies one idle chunk this often (zero turns it off). It finds
    /// silent corruption in data nobody reads, before the last good copy is gone.
    pub scrub_interval: Duration,
    /// A chunk written within this long is not idle, so not scrubbed yet.
    pub scrub_idle: Duration,
    /// Memory for data pushed ahead of writes; the oldest buffers go when it runs short.
    pub push_buffer_bytes: u64,
    /// A pushed buffer no write has used for this long is dropped.
    pub push_buffer_ttl: Duration,
    /// As secondary: how long a mutation that arrived before its predecessor waits for
    /// it before being applied anyway (the predecessor then fails, as a lost one would).
    pub apply_hold: Duration,
    /// Memory for recently written data, so reading it back needs no disk (zero: none).
    pub read_cache_bytes: u64,
    /// Requests that may wait behind others on one chunk, and on all chunks together;
    /// past either a request is refused as busy (the client retries), so a flood of
    /// requests cannot grow the queues without bound.
    pub max_queued_per_chunk: usize,
    pub max_queued: usize,
    /// Drawn afresh at every start (the runtime's randomness): names this run to the
    /// master, so the capability keys this run takes are its own (`crate::capability`).
    pub boot: u64,
}

impl Default for ChunkserverConfig {
    fn default() -> Self {
        ChunkserverConfig {
            address: String::new(),
            rack: "default".into(),
            capacity_bytes: 1 << 40,
            clone_piece: 4 << 20,
            scrub_interval: Duration::from_secs(10),
            scrub_idle: Duration::from_secs(60),
            push_buffer_bytes: 256 << 20,
            push_buffer_ttl: Duration::from_secs(60),
            apply_hold: Duration::from_secs(1),
            read_cache_bytes: 1 << 30,
            max_queued_per_chunk: 1024,
            max_queued: 65_536,
            boot: 0,
        }
    }
}

#[derive(Clone, Debug)]
pub enum Input {
    /// A request, with the time it arrived from the network (stamped by the driver, so a
    /// request that waited in a queue is not mistaken for a fresh one).
    Request {
        id: RequestId,
        req: pb::ChunkRequest,
        arrived: Time,
        /// Who sent it, as the transport authenticated it (`crate::auth`).
        from: Caller,
    },
    CallResult {
        id: CallId,
        result: Result<Reply, RpcError>,
    },
    StoreDone {
        id: OpId,
        result: Result<StoreOutput, StoreError>,
    },
    /// Time for a heartbeat.
    Tick,
    /// The disk's free space changed (`None`: unknown); the next heartbeat offers at most
    /// this much. The driver sends it when a reading differs from the last, so the
    /// reading passes through `handle` and is recorded and replayed with the rest.
    DiskSpace { free: Option<u64> },
    /// A request that did not decode: answered as an invalid argument, changing nothing.
    Malformed { id: RequestId, error: String },
}

/// A reply to one of this server's calls.
#[derive(Clone, Debug)]
pub enum Reply {
    Master(pb::MasterResponse),
    Chunk(pb::ChunkResponse),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Dest {
    Master,
    Peer(String),
}

#[derive(Clone, Debug, PartialEq)]
// One per call in flight, moved once: not worth a box for the heartbeat's size.
#[allow(clippy::large_enum_variant)]
pub enum Outgoing {
    Master(pb::MasterRequest),
    Chunk(pb::ChunkRequest),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub id: CallId,
    pub to: Dest,
    pub req: Outgoing,
}

/// A storage operation. Each completes with one `Input::StoreDone`.
#[derive(Clone, Debug, PartialEq)]
pub enum StoreOp {
    /// Reads byte ranges of a chunk's data (short at the end of the data).
    Read {
        handle: ChunkHandle,
        ranges: Vec<(u64, u64)>,
    },
    /// Writes `data` at `offset`, then `meta`, then syncs both: on completion the write
    /// and its checksums are durable. With an `intent` (the old metadata marked with the
    /// range about to be overwritten), that is written and synced first.
    Write {
        handle: ChunkHandle,
        offset: u64,
        data: Bytes,
        meta: pb::ChunkMeta,
        intent: Option<pb::ChunkMeta>,
    },
    /// Replaces the chunk's data and metadata whole (a clone), durably.
    Replace {
        handle: ChunkHandle,
        data: Bytes,
        meta: pb::ChunkMeta,
    },
    /// Writes the metadata (creating an empty chunk if none), durably.
    WriteMeta {
        handle: ChunkHandle,
        meta: pb::ChunkMeta,
    },
    /// Removes the chunk's data and metadata.
    Delete { handle: ChunkHandle },
}

impl StoreOp {
    /// The chunk the operation is on.
    pub fn handle(&self) -> ChunkHandle {
        match self {
            StoreOp::Read { handle, .. }
            | StoreOp::Write { handle, .. }
            | StoreOp::Replace { handle, .. }
            | StoreOp::WriteMeta { handle, .. }
            | StoreOp::Delete { handle } => *handle,
        }
    }
}

#[derive(Clone, Debug)]
pub enum StoreOutput {
    Data(Vec<Bytes>),
    Done,
}

#[derive(Debug, Default)]
pub struct Effects {
    pub replies: Vec<(RequestId, pb::ChunkResponse)>,
    pub calls: Vec<Call>,
    pub store: Vec<(OpId, StoreOp)>,
}

#[derive(Clone, Debug)]
struct Chunk {
    meta: pb::ChunkMeta,
    /// This server is primary until then (its own clock).
    lease_until: Option<Time>,
    /// When the current lease term began (grant or last extension), on this clock.
    lease_from: Time,
    /// The chunk size of the chunk's file, from the lease grant: what a record append is
    /// padded to and bounded by, and the end of the chunk for writes. Meaningful while
    /// `lease_until` is set; only in memory, as the lease is (a restart ends both).
    lease_chunk_size: u64,
    /// The secondaries the lease's grant went to, sorted (None: not named, by a master
    /// from before): a write or an append names some of these, and exactly the ones its
    /// capability names (those that took the version).
    lease_secondaries: Option<Vec<String>>,
    last_write: Time,
    /// The last mutation serial assigned (as primary) or applied (as secondary) at this
    /// version; a new version starts again from 0. Stored with each write
    /// (`ChunkMeta::serial`), so a restart keeps it.
    serial: u64,
    /// As primary, at this version: each writer's latest write attempt.
    writers: HashMap<u64, Attempt>,
}

/// As primary: a writer's latest write attempt on a chunk. Every attempt of a client's
/// write has a number of its own, above all its earlier ones, so an earlier attempt that
/// arrives late (its writer gave up on it and retried) is refused rather than landing on
/// top of what was written since; a copy of the latest attempt (the network sent it twice)
/// is not applied again but gets the first copy's answer.
#[derive(Clone, Debug)]
struct Attempt {
    seq: u64,
    /// The mutation serial it was given.
    serial: u64,
    /// Its answer, once every replica has answered; until then, copies of it wait.
    answer: Option<pb::ChunkResponse>,
}

/// Work on one chunk, run in order.
#[derive(Debug)]
enum Job {
    Request(RequestId, Req, Time),
    /// Delete the copy unless its version is above this.
    Delete(Version),
    /// A mutation held for its predecessor, now to be applied (gap or not).
    Released(RequestId, pb::ApplyMutationRequest),
    /// Read the whole copy and verify every block.
    Scrub,
    /// After a crash in the middle of an overwrite: recompute the checksums of the
    /// blocks the write touched (see `pb::ChunkMeta::writing`).
    Repair(pb::WriteIntent),
}

#[derive(Debug)]
enum Pending {
    Read {
        id: RequestId,
        h: ChunkHandle,
        off: u64,
        len: u64,
        start: u64,
    },
    WriteEdges {
        id: RequestId,
        h: ChunkHandle,
        off: u64,
        data: Bytes,
        end: u64,
    },
    Scrub {
        h: ChunkHandle,
        length: u64,
    },
    Repair {
        h: ChunkHandle,
        start: u64,
    },
    Commit {
        id: Option<RequestId>,
        h: ChunkHandle,
        meta: Option<pb::ChunkMeta>,
        lease: Option<LeaseGrant>,
    },
    /// The cluster id of the first master that answered, being made durable.
    Join {
        cluster_id: u64,
    },
    /// A newer master term, being made durable (`epoch.rs`).
    Epoch {
        epoch: u64,
    },
    /// A corrupt copy read whole, to be mended (`mend.rs`).
    Mend(Box<mend::Mend>),
}

/// A lease this server is granted, taken once its new version is durable.
#[derive(Debug)]
struct LeaseGrant {
    /// The lease's end on this server's clock.
    until: Time,
    /// The term of the master that granted it: a lease whose version write lands after
    /// a newer term was stored is not taken (`epoch.rs`).
    epoch: u64,
    /// The chunk size of the chunk's file (see `Chunk::lease_chunk_size`).
    chunk_size: u64,
    /// The lease's secondaries, when the master named them (`Chunk::lease_secondaries`).
    secondaries: Option<Vec<String>>,
}

#[derive(Debug)]
struct Forward {
    version: Version,
    offset: u64,
    data: Bytes,
    /// Non-zero: the secondaries have the data pushed under this id.
    data_id: u64,
    secondaries: Vec<String>,
    /// The writer's capability for each secondary, in order, handed on with the mutation
    /// (`crate::capability`; none on an insecure cluster).
    capabilities: Vec<pb::Capability>,
    /// The answer once every replica has applied the mutation.
    reply: pb::ChunkResponse,
    /// The writer and attempt, for a client's write (not for a record append).
    writer: Option<(u64, u64)>,
}

/// One replica's answer to a mutation, as the primary counts them.
#[derive(Debug)]
enum Settled {
    /// This server's own write: done, or how it failed.
    Local(Option<FsError>),
    /// A secondary's answer: applied, or how it failed.
    Secondary(Option<FsError>),
}

/// As primary: a mutation being applied here and on the secondaries at once.
#[derive(Debug)]
struct Forwarding {
    id: RequestId,
    /// Copies of the same write attempt that arrived meanwhile: they get the same answer.
    copies: Vec<RequestId>,
    /// The writer and attempt, for a client's write (not for a record append).
    writer: Option<(u64, u64)>,
    /// Answers still awaited: one per secondary, and this server's own write.
    waiting: usize,
    /// The first failure of a secondary.
    error: Option<FsError>,
    /// The failure of this server's own write.
    local: Option<FsError>,
    reply: pb::ChunkResponse,
}

#[derive(Debug)]
enum CallCtx {
    Forward {
        h: ChunkHandle,
        version: Version,
        serial: u64,
    },
    Heartbeat {
        sent_at: Time,
    },
    CloneRead {
        id: RequestId,
        h: ChunkHandle,
        version: Version,
        source: versions::Source,
        buf: BytesMut,
    },
    ReportCorrupt,
    /// A bad block asked of another copy, for a mend (`mend.rs`).
    MendRead(Box<mend::Mend>),
    /// A pushed piece forwarded down the chain, for the request that brought it.
    PushForward {
        id: RequestId,
        to: String,
    },
}

/// Data pushed ahead of a write, as it arrives piece by piece.
#[derive(Debug)]
struct PushBuffer {
    /// The length of the whole data.
    total: u64,
    /// Pieces received, by offset, kept as they came off the network (no copy), never
    /// overlapping: of a piece sent again only what was missing is kept.
    pieces: std::collections::BTreeMap<u64, Bytes>,
    touched: Time,
    /// Whose it is: the subject of the capability it was pushed under, and the chunk that
    /// names (`owner_of`; empty on an insecure cluster). Only a mutation of that chunk
    /// under that subject's capability takes it, and more pushed under that id are
    /// refused: nobody else's bytes can be slipped in under a writer's data id.
    owner: (String, ChunkHandle),
}

impl PushBuffer {
    /// Whether every byte has arrived.
    fn complete(&self) -> bool {
        let mut at = 0;
        for (&s, p) in &self.pieces {
            if s > at {
                return false;
            }
            at = at.max(s + p.len() as u64);
        }
        at == self.total
    }

    /// The whole data, once complete: a single piece as it is, several copied once into
    /// one buffer that starts on an `IO_ALIGN` boundary (where pieces overlap, the one at
    /// the lower offset wins).
    fn assemble(mut self) -> Bytes {
        if self.pieces.len() == 1 {
            let (_, p) = self.pieces.pop_first().expect("one piece");
            return p;
        }
        // Starting on an IO_ALIGN boundary (the room before it is skipped).
        let mut out: Vec<u8> = Vec::with_capacity(self.total as usize + crate::types::IO_ALIGN);
        let pad = out.as_ptr().align_offset(crate::types::IO_ALIGN);
        out.resize(pad, 0);
        for (s, p) in self.pieces {
            let at = (out.len() - pad) as u64;
            let skip = at.saturating_sub(s) as usize;
            if skip < p.len() {
                out.extend_from_slice(&p[skip..]);
            }
        }
        Bytes::from(out).slice(pad..)
    }
}

pub struct Chunkserver {
    cfg: ChunkserverConfig,
    now: Time,
    chunks: HashMap<ChunkHandle, Chunk>,
    /// Copies that failed a checksum: never served, deleted on the master's word.
    corrupt: HashSet<ChunkHandle>,
    /// The metadata of those found corrupt since start-up, should the master order one
    /// mended (`mend.rs`).
    kept: HashMap<ChunkHandle, pb::ChunkMeta>,
    queues: HashMap<ChunkHandle, VecDeque<Job>>,
    /// `Job::Request`s in `queues`, counted against `max_queued`.
    queued_requests: usize,
    busy: HashSet<ChunkHandle>,
    pending: HashMap<OpId, Pending>,
    calls: HashMap<CallId, CallCtx>,
    /// As primary: the version and serial of the mutation whose local write is the job
    /// running on the chunk (it lives only as long as that job).
    forwards: HashMap<ChunkHandle, (Version, u64)>,
    /// As primary: mutations out to the secondaries, by chunk, version and serial (serials
    /// start again at each version, and an answer from an older version's mutation must
    /// not count for a newer one's). Several may be out at once: the next mutation starts
    /// once this one is applied locally.
    forwarding: HashMap<(ChunkHandle, Version, u64), Forwarding>,
    /// As secondary: mutations that arrived ahead of their predecessor, by chunk and
    /// serial, with when they arrived.
    held:
        std::collections::BTreeMap<(ChunkHandle, u64), (RequestId, pb::ApplyMutationRequest, Time)>,
    /// The scrubber's next run, and the handle it verified last.
    next_scrub: Time,
    scrub_cursor: ChunkHandle,
    /// Data pushed ahead of writes, by id, and the bytes they hold.
    pushed: HashMap<u64, PushBuffer>,
    pushed_bytes: u64,
    /// Recently written data, and the writes whose data joins it once they complete.
    cache: cache::ReadCache,
    fills: HashMap<OpId, (ChunkHandle, Vec<(u64, Bytes)>)>,
    /// Whether the jobs queued by recovery have been started.
    started: bool,
    /// Free space on the disk, as the store last told the driver.
    disk_available: Option<u64>,
    /// The bytes of the chunks held: the sum of their lengths, kept as they change.
    used_bytes: u64,
    /// This server's identity, as stored under `IDENTITY_HANDLE` (0: none).
    server_id: u64,
    /// The cluster this server belongs to: it acts on no master of another (0: none yet,
    /// until the first master's heartbeat reply is durable here).
    cluster_id: u64,
    /// A cluster id is being stored (`Pending::Join`).
    joining: bool,
    /// The highest master term stored, and the highest being stored (`epoch.rs`).
    epoch: u64,
    storing_epoch: u64,
    /// The master replica that sent the first order of the stored term, and that term:
    /// a term has one leader, so orders of it from another replica are refused
    /// (`epoch.rs`).
    term_leader: Option<(u64, u64)>,
    next_id: u64,
    /// Requests refused because their sender's role does not allow them (`crate::auth`),
    /// or their capability does not (`crate::capability`).
    refused: u64,
    /// Steps taken since start: stamped on every answer and heartbeat, so the master can
    /// tell a report composed before an answer from one composed after it.
    step: u64,
    /// The capability keys this run was given (`crate::capability`).
    keys: capability::KeyRing,
    out: Effects,
}

fn ok(resp: Resp) -> pb::ChunkResponse {
    pb::ChunkResponse {
        error: None,
        resp: Some(resp),
        ..Default::default()
    }
}

fn empty() -> pb::ChunkResponse {
    ok(Resp::Empty(pb::Empty {}))
}

fn err(e: FsError) -> pb::ChunkResponse {
    pb::ChunkResponse {
        error: Some(e.to_pb()),
        resp: None,
        ..Default::default()
    }
}

impl Chunkserver {
    /// Start-up is recovery: the chunk metadata found on disk. A record that is
    /// inconsistent (checksum count not matching its length) is treated as corrupt.
    pub fn recover(cfg: ChunkserverConfig, now: Time, metas: Vec<pb::ChunkMeta>) -> Chunkserver {
        let read_cache_bytes = cfg.read_cache_bytes;
        let mut cs = Chunkserver {
            next_scrub: now + cfg.scrub_interval,
            cfg,
            now,
            chunks: HashMap::default(),
            corrupt: HashSet::default(),
            kept: HashMap::default(),
            queues: HashMap::default(),
            queued_requests: 0,
            busy: HashSet::default(),
            pending: HashMap::default(),
            calls: HashMap::default(),
            forwards: HashMap::default(),
            forwarding: HashMap::default(),
            held: Default::default(),
            scrub_cursor: 0,
            pushed: HashMap::default(),
            pushed_bytes: 0,
            cache: cache::ReadCache::new(read_cache_bytes),
            fills: HashMap::default(),
            started: false,
            disk_available: None,
            used_bytes: 0,
            server_id: 0,
            cluster_id: 0,
            joining: false,
            epoch: 0,
            storing_epoch: 0,
            term_leader: None,
            next_id: 1,
            refused: 0,
            step: 0,
            keys: capability::KeyRing::default(),
            out: Effects::default(),
        };
        for mut meta in metas {
            if meta.handle == IDENTITY_HANDLE {
                cs.server_id = meta.server_id;
                cs.cluster_id = meta.cluster_id;
                cs.epoch = meta.master_epoch;
                cs.storing_epoch = meta.master_epoch;
                continue;
            }
            let h = meta.handle;
            // The length is not checked against the chunk size: that is the master's, and
            // arrives with the first heartbeat reply.
            if meta.checksums.len() as u64 != meta.length.div_ceil(BLOCK_SIZE) {
                tracing::warn!(
                    chunk = h,
                    "chunk metadata inconsistent; treating as corrupt"
                );
                cs.corrupt.insert(h);
                continue;
            }
            let writing = meta.writing.take();
            if let Some(w) = writing {
                tracing::info!(
                    chunk = h,
                    offset = w.offset,
                    length = w.length,
                    "an overwrite was cut short; repairing its checksums"
                );
                cs.queues.entry(h).or_default().push_back(Job::Repair(w));
            }
            let serial = meta.serial;
            cs.chunks.insert(
                h,
                Chunk {
                    meta,
                    lease_until: None,
                    lease_from: Time::ZERO,
                    lease_chunk_size: 0,
                    lease_secondaries: None,
                    last_write: Time::ZERO,
                    serial,
                    writers: HashMap::default(),
                },
            );
        }
        // Summed once all are in: a store may hold two records of one chunk (the later
        // is taken), which a count kept as they came would count twice.
        cs.used_bytes = cs.used_bytes_summed();
        cs
    }

    pub fn config(&self) -> &ChunkserverConfig {
        &self.cfg
    }

    /// This server's id (0: its store has none).
    /// The highest master term (or epoch) this server has taken.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Requests refused because their sender's role does not allow them.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Whether the capability a read, a write, an append, a pushed piece or a forwarded
    /// mutation carries allows it (`crate::capability`), checked before anything is
    /// read, queued or buffered. A chunkserver reading another's copy (a clone's or a
    /// mend's source) needs the one its master gave it with the order; nobody on an
    /// insecure cluster needs one.
    fn check_capability(&self, from: &Caller, r: &Req) -> Result<(), FsError> {
        use capability::{APPEND, READ, WRITE, Want};
        let (cap, want) = match r {
            Req::Read(r) => (r.capability.as_ref(), (r.handle, r.version, READ)),
            Req::Write(r) => (r.capability.as_ref(), (r.handle, r.version, WRITE)),
            Req::Append(r) => (r.capability.as_ref(), (r.handle, r.version, APPEND)),
            Req::Apply(r) => (r.capability.as_ref(), (r.handle, r.version, WRITE | APPEND)),
            Req::Push(p) => {
                // A push names no version: the one the capability names is checked when
                // the write that uses the data is (by the same writer's capability).
                let cap = p.capabilities.first();
                let version = cap.map_or(0, |c| c.version);
                (cap, (p.handle, version, WRITE | APPEND))
            }
            _ => return Ok(()),
        };
        let (handle, version, ops) = want;
        self.keys.check(
            self.now,
            cap,
            Want {
                handle,
                version,
                ops,
            },
            from,
        )?;
        // A writer names the secondaries the master signed for, all of them: the grant
        // says whom the version went to, not which of them took it.
        let named = match r {
            Req::Write(w) => &w.secondaries,
            Req::Append(a) => &a.secondaries,
            _ => return Ok(()),
        };
        let (Some(cap), false) = (cap, *from == Caller::Insecure) else {
            return Ok(());
        };
        let mut named = named.clone();
        named.sort();
        if named != cap.secondaries {
            return Err(FsError::PermissionDenied(format!(
                "chunk {handle}: the write names secondaries {named:?}, its capability {:?}",
                cap.secondaries
            )));
        }
        Ok(())
    }

    pub fn server_id(&self) -> u64 {
        self.server_id
    }

    /// The cluster this server joined (0: none yet).
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// Why a message from a master of cluster `theirs` must be ignored, if it must. A
    /// server acts only on its own cluster's master: any other (a master this server was
    /// pointed at by mistake, or one forging orders) could have it change versions or
    /// delete the copies its own cluster's files need. 0 on either side is a master or
    /// server from before clusters had ids; a server that has an id holds every master
    /// to it.
    fn foreign_master(&self, theirs: u64) -> Option<FsError> {
        if theirs == self.cluster_id {
            return None;
        }
        Some(if self.cluster_id == 0 {
            // Not joined yet: the first heartbeat reply brings the id, and calls wait for
            // it (the master only calls servers that heartbeat).
            FsError::Unavailable(format!("{} has not joined a cluster yet", self.cfg.address))
        } else {
            tracing::error!(
                server = %self.cfg.address,
                ours = self.cluster_id,
                theirs,
                "refusing orders from a master of another cluster"
            );
            FsError::InvalidArgument(format!(
                "wrong cluster: {} belongs to cluster {:016x}, not {theirs:016x}",
                self.cfg.address, self.cluster_id
            ))
        })
    }

    /// (handle, version, length) of every chunk held, for checks and tests.
    pub fn chunks(&self) -> impl Iterator<Item = (ChunkHandle, Version, u64)> + '_ {
        self.chunks
            .iter()
            .map(|(h, c)| (*h, c.meta.version, c.meta.length))
    }

    /// The request a mutation this server forwards as primary will answer, while it is
    /// in flight (for checks: which request's answer acknowledges which mutation).
    pub fn forwarded_for(
        &self,
        h: ChunkHandle,
        version: Version,
        serial: u64,
    ) -> Option<RequestId> {
        self.forwarding.get(&(h, version, serial)).map(|f| f.id)
    }

    /// Chunks this server holds a lease on, with the lease's end on this server's clock.
    pub fn leases(&self) -> impl Iterator<Item = (ChunkHandle, Time)> + '_ {
        self.chunks
            .iter()
            .filter_map(|(h, c)| c.lease_until.map(|t| (*h, t)))
    }

    pub fn is_primary(&self, h: ChunkHandle, now: Time) -> bool {
        self.chunks
            .get(&h)
            .and_then(|c| c.lease_until)
            .is_some_and(|t| now < t)
    }

    pub fn handle(&mut self, now: Time, input: Input) -> Effects {
        self.step += 1;
        let mut out = self.take_input(now, input);
        for (_, r) in &mut out.replies {
            r.report_seq = self.step;
        }
        out
    }

    fn take_input(&mut self, now: Time, input: Input) -> Effects {
        self.now = self.now.max(now);
        if !self.started {
            // Repairs found by recovery run first, before anything else on their chunks.
            self.started = true;
            let mut queued: Vec<ChunkHandle> = self.queues.keys().copied().collect();
            queued.sort_unstable();
            for h in queued {
                self.run_next(h);
            }
        }
        match input {
            Input::Request { id, req, from, .. }
                if let Some(Err(e)) = req.req.as_ref().map(|r| {
                    auth::chunk_request(&from, r).and_then(|()| self.check_capability(&from, r))
                }) =>
            {
                self.refused += 1;
                self.out.replies.push((id, err(e)))
            }
            Input::Request {
                id,
                req,
                arrived,
                from,
            } => match req.req {
                None => {
                    let e = self.not_a_chunkserver_request("empty request");
                    self.out.replies.push((id, err(e)))
                }
                Some(Req::Push(p)) => self.on_push(id, p),
                Some(r) => {
                    let master = match &r {
                        Req::SetVersion(r) => Some((r.cluster_id, r.epoch)),
                        Req::Clone(r) => Some((r.cluster_id, r.epoch)),
                        Req::RevokeLease(r) => Some((r.cluster_id, r.epoch)),
                        Req::Mend(r) => Some((r.cluster_id, r.epoch)),
                        _ => None,
                    };
                    let refused = master.and_then(|(c, epoch)| {
                        self.foreign_master(c)
                            .or_else(|| self.stale_master(epoch, Some(&from)))
                    });
                    if let Some(e) = refused {
                        self.out.replies.push((id, err(e)));
                        return std::mem::take(&mut self.out);
                    }
                    let h = match &r {
                        Req::Read(r) => r.handle,
                        Req::Write(r) => r.handle,
                        Req::SetVersion(r) => r.handle,
                        Req::Clone(r) => r.handle,
                        Req::RevokeLease(r) => r.handle,
                        Req::Apply(r) => r.handle,
                        Req::Append(r) => r.handle,
                        Req::Mend(r) => r.handle,
                        Req::Push(_) => unreachable!("handled above"),
                    };
                    let waiting = self.queues.get(&h).map_or(0, VecDeque::len);
                    if waiting >= self.cfg.max_queued_per_chunk
                        || self.queued_requests >= self.cfg.max_queued
                    {
                        let e = FsError::Unavailable(format!(
                            "{} busy: {waiting} requests wait on chunk {h}, {} in all",
                            self.cfg.address, self.queued_requests
                        ));
                        self.out.replies.push((id, err(e)));
                    } else {
                        self.enqueue(h, Job::Request(id, r, arrived.min(self.now)));
                    }
                }
            },
            Input::CallResult { id, result } => self.on_call_result(id, result),
            Input::StoreDone { id, result } => self.on_store_done(id, result),
            Input::Tick => {
                self.heartbeat();
                self.scrub();
                self.expire_pushed();
                self.release_held();
            }
            Input::DiskSpace { free } => self.disk_available = free,
            Input::Malformed { id, error } => {
                let e = self.not_a_chunkserver_request(&error);
                self.out.replies.push((id, err(e)))
            }
        }
        std::mem::take(&mut self.out)
    }

    /// The answer to a request that is none of a chunkserver's. Most often a client was
    /// given this server's address for its master's (a master's request may even decode
    /// as an empty chunkserver request): the answer says what answered.
    fn not_a_chunkserver_request(&self, error: &str) -> FsError {
        FsError::InvalidArgument(format!(
            "malformed request: {} is a chunkserver, and this is no chunkserver request \
             ({error})",
            self.cfg.address
        ))
    }

    fn fresh_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn store(&mut self, pending: Pending, op: StoreOp) -> OpId {
        // The cache must never hold bytes the disk no longer has: whatever this changes
        // goes from it now (what a write stores joins it once the write completes).
        match &op {
            StoreOp::Write {
                handle,
                offset,
                data,
                ..
            } => self
                .cache
                .forget_range(*handle, *offset, offset + data.len() as u64),
            StoreOp::Replace { handle, .. } | StoreOp::Delete { handle } => {
                self.cache.forget(*handle)
            }
            StoreOp::Read { .. } | StoreOp::WriteMeta { .. } => {}
        }
        let id = self.fresh_id();
        self.pending.insert(id, pending);
        self.out.store.push((id, op));
        id
    }

    fn call(&mut self, to: Dest, req: Outgoing, ctx: CallCtx) {
        let id = self.fresh_id();
        self.calls.insert(id, ctx);
        self.out.calls.push(Call { id, to, req });
    }

    // ---- per-chunk queues -------------------------------------------------------------

    fn enqueue(&mut self, h: ChunkHandle, job: Job) {
        self.queued_requests += usize::from(matches!(job, Job::Request(..)));
        self.queues.entry(h).or_default().push_back(job);
        self.run_next(h);
    }

    /// Starts the next job on `h` if none is running.
    fn run_next(&mut self, h: ChunkHandle) {
        while !self.busy.contains(&h) {
            let Some(q) = self.queues.get_mut(&h) else {
                return;
            };
            let Some(job) = q.pop_front() else {
                self.queues.remove(&h);
                return;
            };
            if matches!(job, Job::Request(..)) {
                self.queued_requests -= 1;
            }
            self.busy.insert(h);
            match job {
                Job::Request(id, req, arrived) => self.start(id, req, arrived),
                Job::Delete(max) => self.start_delete(h, max),
                Job::Scrub => self.start_scrub(h),
                Job::Released(id, r) => match self.apply_mutation(id, r, true) {
                    Ok(_) => {}
                    Err(e) => self.done(h, id, err(e)),
                },
                Job::Repair(w) => self.start_repair(h, w),
            }
        }
    }

    /// The running job on `h` is over.
    fn finish(&mut self, h: ChunkHandle) {
        assert!(
            self.busy.remove(&h),
            "finishing chunk {h}, which was not busy"
        );
        // A mutation's mark lives only as long as its job, and must not be taken for the
        // next mutation's.
        self.forwards.remove(&h);
        self.run_next(h);
    }

    fn done(&mut self, h: ChunkHandle, id: RequestId, resp: pb::ChunkResponse) {
        if let Some((version, serial)) = self.forwards.remove(&h) {
            // The primary's own write failed; the secondaries' answers may still be out.
            let e = resp.error.as_ref().map_or_else(
                || FsError::Internal("a mutation ended without its write".into()),
                FsError::from_pb,
            );
            self.settle(h, version, serial, Settled::Local(Some(e)));
            return self.finish(h);
        }
        self.out.replies.push((id, resp));
        self.finish(h);
    }

    /// The chunk as it may be used now: present, not corrupt, at least `version`.
    fn usable(&self, h: ChunkHandle, version: Version, exact: bool) -> Result<&Chunk, FsError> {
        if self.corrupt.contains(&h) {
            return Err(FsError::Corrupt(format!(
                "chunk {h} on {}",
                self.cfg.address
            )));
        }
        let c = self
            .chunks
            .get(&h)
            .ok_or_else(|| FsError::ChunkNotFound(format!("chunk {h} on {}", self.cfg.address)))?;
        let v = c.meta.version;
        if v < version || (exact && v != version) {
            return Err(FsError::StaleVersion(format!(
                "chunk {h}: have version {v}, asked for {version}"
            )));
        }
        Ok(c)
    }

    fn start(&mut self, id: RequestId, req: Req, arrived: Time) {
        let h;
        let result = match req {
            Req::Read(r) => {
                h = r.handle;
                self.start_read(id, r)
            }
            Req::Write(r) => {
                h = r.handle;
                self.start_write(id, r)
            }
            Req::Apply(r) => {
                h = r.handle;
                self.start_apply(id, r)
            }
            Req::Append(r) => {
                h = r.handle;
                self.start_append(id, r)
            }
            Req::Push(_) => unreachable!("pushes do not queue on a chunk"),
            Req::SetVersion(r) => {
                h = r.handle;
                self.start_set_version(id, r, arrived)
            }
            Req::Clone(r) => {
                h = r.handle;
                self.start_clone(id, r)
            }
            Req::Mend(r) => {
                h = r.handle;
                self.start_mend(id, r)
            }
            Req::RevokeLease(r) => {
                h = r.handle;
                // Only the lease of the version named: a later one is another lease.
                if let Some(c) = self.chunks.get_mut(&h)
                    && (r.version == 0 || c.meta.version == r.version)
                {
                    c.lease_until = None;
                }
                Ok(Some(empty()))
            }
        };
        match result {
            Ok(Some(resp)) => self.done(h, id, resp),
            Ok(None) => {} // continues when storage or a peer answers
            Err(e) => self.done(h, id, err(e)),
        }
    }
}

impl Chunkserver {
    fn on_store_done(&mut self, op: OpId, result: Result<StoreOutput, StoreError>) {
        // A completed write's bytes are on disk: they may be read from memory from now on
        // (before anything else runs on the chunk). A failed one's may be anywhere.
        if let Some((h, fill)) = self.fills.remove(&op) {
            match &result {
                Ok(StoreOutput::Done) => {
                    for (off, data) in fill {
                        self.cache.insert(h, off, data);
                    }
                }
                _ => self.cache.forget(h),
            }
        }
        let Some(p) = self.pending.remove(&op) else {
            tracing::warn!(op, "completion for an unknown storage operation");
            return;
        };
        match (p, result) {
            (Pending::Join { cluster_id }, result) => {
                self.joining = false;
                match result {
                    Ok(StoreOutput::Done) => {
                        self.cluster_id = cluster_id;
                        // The master's orders (its term among them) come in the reply
                        // to a heartbeat sent now, not a heartbeat interval later.
                        self.heartbeat();
                    }
                    // The next heartbeat reply tries again.
                    Ok(out) => panic!("storage answered {out:?} to storing the cluster id"),
                    Err(e) => tracing::warn!(error = %e, "storing the cluster id failed"),
                }
            }
            (Pending::Epoch { epoch }, result) => match result {
                Ok(StoreOutput::Done) => self.epoch_stored(epoch, true),
                Ok(out) => panic!("storage answered {out:?} to storing the master's term"),
                Err(e) => {
                    tracing::warn!(error = %e, "storing the master's term failed");
                    self.epoch_stored(epoch, false)
                }
            },
            (
                Pending::Read {
                    id,
                    h,
                    off,
                    len,
                    start,
                },
                Ok(StoreOutput::Data(mut d)),
            ) if d.len() == 1 => {
                self.finish_read(id, h, off, len, start, d.pop().expect("one range"))
            }
            (
                Pending::WriteEdges {
                    id,
                    h,
                    off,
                    data,
                    end,
                },
                Ok(StoreOutput::Data(d)),
            ) => self.commit_write(id, h, off, data, end, d),
            (Pending::Scrub { h, length }, Ok(StoreOutput::Data(mut d))) if d.len() == 1 => {
                self.finish_scrub(h, length, d.pop().expect("one range"))
            }
            (Pending::Repair { h, start }, Ok(StoreOutput::Data(mut d))) if d.len() == 1 => {
                self.finish_repair(h, start, d.pop().expect("one range"))
            }
            (Pending::Mend(m), Ok(StoreOutput::Data(mut d))) if d.len() == 1 => {
                self.mend_read(m, d.pop().expect("one range"))
            }
            (Pending::Commit { id, h, meta, lease }, Ok(StoreOutput::Done)) => {
                match meta {
                    Some(meta) => {
                        let now = self.now;
                        let was = self.chunks.get(&h).map_or(0, |c| c.meta.length);
                        self.used_bytes = self.used_bytes - was + meta.length;
                        let c = self.chunks.entry(h).or_insert_with(|| Chunk {
                            meta: meta.clone(),
                            lease_until: None,
                            lease_from: now,
                            lease_chunk_size: 0,
                            lease_secondaries: None,
                            last_write: Time::ZERO,
                            serial: 0,
                            writers: HashMap::default(),
                        });
                        let moved_on = c.meta.version != meta.version;
                        if moved_on {
                            c.serial = 0;
                            c.writers.clear();
                        }
                        tracing::debug!(chunk = h, server = %self.cfg.address, version = meta.version, length = meta.length, "committed");
                        let wrote =
                            c.meta.length != meta.length || c.meta.checksums != meta.checksums;
                        c.meta = meta;
                        if wrote {
                            c.last_write = now;
                        }
                        if moved_on {
                            // A lease was on the old version; the new one's, if any, is
                            // below. The master grants each version's lease afresh.
                            c.lease_until = None;
                        }
                        match lease {
                            // Granted by a leader deposed while the version was being
                            // written: this server's heartbeats already say it holds no
                            // lease of an older term, so it takes none.
                            Some(l) if l.epoch < self.epoch => {
                                tracing::info!(chunk = h, server = %self.cfg.address, granted = l.epoch, ours = self.epoch, "a deposed leader's lease not taken");
                            }
                            Some(l) => {
                                c.lease_until = Some(l.until);
                                c.lease_from = now;
                                c.lease_chunk_size = l.chunk_size;
                                c.lease_secondaries = l.secondaries;
                            }
                            None => {}
                        }
                        self.corrupt.remove(&h);
                        self.kept.remove(&h);
                        if moved_on {
                            self.drop_held(h);
                        }
                    }
                    None => {
                        self.forget_chunk(h);
                        self.corrupt.remove(&h);
                        self.kept.remove(&h);
                        self.drop_held(h);
                    }
                }
                match id {
                    Some(id) => self.after_commit(h, id),
                    None => self.finish(h),
                }
            }
            (p, Err(e)) => {
                let (id, h) = match p {
                    Pending::Read { id, h, .. } | Pending::WriteEdges { id, h, .. } => {
                        (Some(id), h)
                    }
                    Pending::Commit { id, h, .. } => (id, h),
                    Pending::Mend(m) => (Some(m.id()), m.handle()),
                    Pending::Join { .. } | Pending::Epoch { .. } => unreachable!("matched above"),
                    Pending::Scrub { h, .. } | Pending::Repair { h, .. } => (None, h),
                };
                tracing::warn!(chunk = h, error = %e, "storage operation failed");
                match id {
                    Some(id) => self.done(h, id, err(e.into())),
                    None => self.finish(h),
                }
            }
            (p, Ok(out)) => panic!("storage answered {out:?} to {p:?}"),
        }
    }

    /// The local write is durable. As primary, count this replica in (the client is
    /// answered once the secondaries have too), and let the next mutation on the chunk
    /// start. As secondary, answer now, and let a mutation held for this one go next.
    fn after_commit(&mut self, h: ChunkHandle, id: RequestId) {
        if let Some((version, serial)) = self.forwards.remove(&h) {
            self.settle(h, version, serial, Settled::Local(None));
            return self.finish(h);
        }
        let next = self.chunks.get(&h).map(|c| c.serial + 1);
        if let Some(held) = next.and_then(|s| self.held.remove(&(h, s))) {
            let (hid, r, _) = held;
            self.queues
                .entry(h)
                .or_default()
                .push_front(Job::Released(hid, r));
        }
        self.done(h, id, empty())
    }

    fn on_forward_result(
        &mut self,
        h: ChunkHandle,
        version: Version,
        serial: u64,
        result: Result<Reply, RpcError>,
    ) {
        let error = match result {
            Ok(Reply::Chunk(pb::ChunkResponse { error: None, .. })) => None,
            Ok(Reply::Chunk(pb::ChunkResponse { error: Some(e), .. })) => {
                Some(FsError::from_pb(&e))
            }
            Ok(Reply::Master(_)) => {
                Some(FsError::Internal("secondary answered as a master".into()))
            }
            Err(e) => Some(FsError::Unavailable(format!("secondary: {e}"))),
        };
        self.settle(h, version, serial, Settled::Secondary(error));
    }

    /// One replica's answer to a mutation; the client's answer once all are in: the
    /// mutation's reply if every replica applied it within the lease, else the primary's
    /// own failure, else a secondary's. Any failure leaves the region inconsistent; the writer retries.
    fn settle(&mut self, h: ChunkHandle, version: Version, serial: u64, answer: Settled) {
        let Some(entry) = self.forwarding.get_mut(&(h, version, serial)) else {
            return;
        };
        entry.waiting -= 1;
        match answer {
            Settled::Local(e) => {
                entry.local = e;
            }
            Settled::Secondary(e) => {
                if entry.error.is_none() {
                    entry.error = e;
                }
            }
        }
        if entry.waiting > 0 {
            return;
        }
        let Forwarding {
            id,
            copies,
            writer,
            error,
            local,
            reply,
            ..
        } = self
            .forwarding
            .remove(&(h, version, serial))
            .expect("present");
        // Every replica must have applied it while its lease held: once that is over the
        // master may copy a replica (one that took this mutation after the copy was read
        // would leave the new copy without it) and grant the next version, maybe to this
        // server again: a lease on a newer version is not the one it was sent under.
        let lease_over = !self.is_primary(h, self.now)
            || self
                .chunks
                .get(&h)
                .is_none_or(|c| c.meta.version != version);
        let resp = match (local, error) {
            (None, None) if lease_over => err(FsError::Unavailable(format!(
                "chunk {h}: the lease ended before every replica applied the mutation"
            ))),
            (None, None) => reply,
            (Some(e), _) => err(e),
            (None, Some(e)) => err(FsError::Unavailable(format!(
                "mutation not applied everywhere: {e}"
            ))),
        };
        if let Some((client, seq)) = writer {
            let latest = self
                .chunks
                .get_mut(&h)
                .filter(|c| c.meta.version == version)
                .and_then(|c| c.writers.get_mut(&client))
                .filter(|a| a.seq == seq);
            if let Some(a) = latest {
                a.answer = Some(resp.clone());
            }
        }
        for copy in copies {
            self.out.replies.push((copy, resp.clone()));
        }
        self.out.replies.push((id, resp));
    }

    fn on_call_result(&mut self, id: CallId, result: Result<Reply, RpcError>) {
        let Some(ctx) = self.calls.remove(&id) else {
            tracing::warn!(call = id, "result for an unknown call");
            return;
        };
        match ctx {
            CallCtx::Heartbeat { sent_at } => self.on_heartbeat_reply(sent_at, result),
            CallCtx::CloneRead {
                id,
                h,
                version,
                source,
                buf,
            } => self.on_clone_piece(id, h, version, source, buf, result),
            CallCtx::ReportCorrupt => {}
            CallCtx::MendRead(m) => self.on_mend_piece(m, result),
            CallCtx::PushForward { id, to } => {
                let resp = match result {
                    Ok(Reply::Chunk(pb::ChunkResponse { error: None, .. })) => empty(),
                    Ok(Reply::Chunk(pb::ChunkResponse { error: Some(e), .. })) => {
                        err(FsError::Unavailable(format!("push to {to}: {}", e.message)))
                    }
                    Ok(Reply::Master(_)) => {
                        err(FsError::Internal("push answered by a master".into()))
                    }
                    Err(e) => err(FsError::Unavailable(format!("push to {to}: {e}"))),
                };
                self.out.replies.push((id, resp));
            }
            CallCtx::Forward { h, version, serial } => {
                self.on_forward_result(h, version, serial, result)
            }
        }
    }
}

/// The end of a write of `len` bytes at `offset`, if it stays within `chunk_size`.
fn check_range(offset: u64, len: usize, chunk_size: u64) -> Result<u64, FsError> {
    offset
        .checked_add(len as u64)
        .filter(|&e| e <= chunk_size)
        .ok_or_else(|| {
            FsError::InvalidArgument(format!(
                "write of {len} bytes at {offset} passes the chunk size {chunk_size}"
            ))
        })
}

/// What a write leaves in the blocks it touches, as read-cache entries on block
/// boundaries: the write's own buffer (no copy) from its first block boundary to its last,
/// and copies of the edge blocks it shares with old bytes (`head` before `off`, from block
/// `fb`; `tail` after the data).
fn cache_fill(fb: u64, head: &[u8], off: u64, data: &Bytes, tail: &[u8]) -> Vec<(u64, Bytes)> {
    let end = off + data.len() as u64;
    let new_end = end + tail.len() as u64;
    let copy = |from: u64, to: u64| {
        let mut out = Vec::with_capacity((to - from) as usize);
        let mut at = fb;
        for p in [head, &data[..], tail] {
            let (s, e) = (at, at + p.len() as u64);
            let (a, b) = (from.max(s), to.min(e));
            if a < b {
                out.extend_from_slice(&p[(a - s) as usize..(b - s) as usize]);
            }
            at = e;
        }
        Bytes::from(out)
    };
    let head_end = if head.is_empty() {
        fb
    } else {
        (fb + BLOCK_SIZE).min(new_end)
    };
    let tail_start = if tail.is_empty() {
        new_end
    } else {
        (new_end - 1) / BLOCK_SIZE * BLOCK_SIZE
    }
    .max(head_end);
    let mut out = Vec::new();
    if head_end > fb {
        out.push((fb, copy(fb, head_end)));
    }
    if tail_start > head_end {
        let (a, b) = ((head_end - off) as usize, (tail_start - off) as usize);
        out.push((head_end, data.slice(a..b)));
    }
    if new_end > tail_start {
        out.push((tail_start, copy(tail_start, new_end)));
    }
    out
}

/// The blocks a write of [off, end) overwrites only partly, on a chunk of `length` bytes.
struct Edges {
    /// First block's start, and whether it holds old bytes before `off`.
    fb: u64,
    head: bool,
    /// Last block's start, and whether it holds old bytes after `end`.
    tb: u64,
    tail: bool,
    /// Head and tail are one block.
    shared: bool,
}

impl Edges {
    fn new(off: u64, end: u64, length: u64) -> Edges {
        let fb = off / BLOCK_SIZE * BLOCK_SIZE;
        let tb = end / BLOCK_SIZE * BLOCK_SIZE;
        let head = off > fb;
        let tail = end < length && end > tb;
        Edges {
            fb,
            head,
            tb,
            tail,
            shared: head && tail && fb == tb,
        }
    }

    /// Whole old blocks to read.
    fn ranges(&self, length: u64) -> Vec<(u64, u64)> {
        let block = |b: u64| (b, (b + BLOCK_SIZE).min(length) - b);
        let mut r = Vec::new();
        if self.head {
            r.push(block(self.fb));
        }
        if self.tail && !self.shared {
            r.push(block(self.tb));
        }
        r
    }
}
