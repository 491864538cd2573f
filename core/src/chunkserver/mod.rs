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
mod invariants;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

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
    last_write: Time,
    /// The last mutation serial assigned (as primary) or applied (as secondary) at this
    /// version; a new version starts again from 0.
    serial: u64,
    /// As primary: the latest write sequence number seen from each writer.
    writers: HashMap<u64, u64>,
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
}

/// A lease this server is granted, taken once its new version is durable.
#[derive(Debug)]
struct LeaseGrant {
    /// The lease's end on this server's clock.
    until: Time,
    /// The chunk size of the chunk's file (see `Chunk::lease_chunk_size`).
    chunk_size: u64,
}

#[derive(Debug)]
struct Forward {
    version: Version,
    offset: u64,
    data: Bytes,
    /// Non-zero: the secondaries have the data pushed under this id.
    data_id: u64,
    secondaries: Vec<String>,
    /// The answer once every replica has applied the mutation.
    reply: pb::ChunkResponse,
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
        source: String,
        buf: BytesMut,
    },
    ReportCorrupt,
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
    /// This server's identity, as stored under `IDENTITY_HANDLE` (0: none).
    server_id: u64,
    /// The cluster this server belongs to: it acts on no master of another (0: none yet,
    /// until the first master's heartbeat reply is durable here).
    cluster_id: u64,
    /// A cluster id is being stored (`Pending::Join`).
    joining: bool,
    next_id: u64,
    out: Effects,
}

fn ok(resp: Resp) -> pb::ChunkResponse {
    pb::ChunkResponse {
        error: None,
        resp: Some(resp),
    }
}

fn empty() -> pb::ChunkResponse {
    ok(Resp::Empty(pb::Empty {}))
}

fn err(e: FsError) -> pb::ChunkResponse {
    pb::ChunkResponse {
        error: Some(e.to_pb()),
        resp: None,
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
            chunks: HashMap::new(),
            corrupt: HashSet::new(),
            queues: HashMap::new(),
            queued_requests: 0,
            busy: HashSet::new(),
            pending: HashMap::new(),
            calls: HashMap::new(),
            forwards: HashMap::new(),
            forwarding: HashMap::new(),
            held: Default::default(),
            scrub_cursor: 0,
            pushed: HashMap::new(),
            pushed_bytes: 0,
            cache: cache::ReadCache::new(read_cache_bytes),
            fills: HashMap::new(),
            started: false,
            disk_available: None,
            server_id: 0,
            cluster_id: 0,
            joining: false,
            next_id: 1,
            out: Effects::default(),
        };
        for mut meta in metas {
            if meta.handle == IDENTITY_HANDLE {
                cs.server_id = meta.server_id;
                cs.cluster_id = meta.cluster_id;
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
            cs.chunks.insert(
                h,
                Chunk {
                    meta,
                    lease_until: None,
                    lease_from: Time::ZERO,
                    lease_chunk_size: 0,
                    last_write: Time::ZERO,
                    serial: 0,
                    writers: HashMap::new(),
                },
            );
        }
        cs
    }

    pub fn config(&self) -> &ChunkserverConfig {
        &self.cfg
    }

    /// This server's id (0: its store has none).
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

    /// The disk's free space (`ChunkStore::available_bytes`), for the next heartbeat.
    pub fn set_disk_available(&mut self, free: Option<u64>) {
        self.disk_available = free;
    }

    /// (handle, version, length) of every chunk held, for checks and tests.
    pub fn chunks(&self) -> impl Iterator<Item = (ChunkHandle, Version, u64)> + '_ {
        self.chunks
            .iter()
            .map(|(h, c)| (*h, c.meta.version, c.meta.length))
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
            Input::Request { id, req, arrived } => match req.req {
                None => self
                    .out
                    .replies
                    .push((id, err(FsError::InvalidArgument("empty request".into())))),
                Some(Req::Push(p)) => self.on_push(id, p),
                Some(r) => {
                    let master = match &r {
                        Req::SetVersion(r) => Some(r.cluster_id),
                        Req::Clone(r) => Some(r.cluster_id),
                        Req::RevokeLease(r) => Some(r.cluster_id),
                        _ => None,
                    };
                    if let Some(e) = master.and_then(|c| self.foreign_master(c)) {
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
        }
        std::mem::take(&mut self.out)
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
            Req::RevokeLease(r) => {
                h = r.handle;
                if let Some(c) = self.chunks.get_mut(&h) {
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

    // ---- reads ------------------------------------------------------------------------

    fn start_read(
        &mut self,
        id: RequestId,
        r: pb::ReadChunkRequest,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        let c = self.usable(r.handle, r.version, false)?;
        let length = c.meta.length;
        if r.offset >= length || r.length == 0 {
            return Ok(Some(ok(Resp::Read(pb::ReadChunkResponse {
                data: Bytes::new(),
                chunk_length: length,
            }))));
        }
        let len = r.length.min(length - r.offset);
        let start = r.offset / BLOCK_SIZE * BLOCK_SIZE;
        let end = (r.offset + len)
            .div_ceil(BLOCK_SIZE)
            .saturating_mul(BLOCK_SIZE)
            .min(length);
        if let Some(data) = self.cache.get(r.handle, start, end) {
            // Checked like bytes from disk; a mismatch here is the cache's fault, not the
            // disk's, so the copy is read from disk instead of being called corrupt.
            let sums = &self.chunks.get(&r.handle).expect("usable").meta.checksums;
            if checksum::verify(sums, start, &data).is_ok() {
                let s = (r.offset - start) as usize;
                return Ok(Some(ok(Resp::Read(pb::ReadChunkResponse {
                    data: data.slice(s..s + len as usize),
                    chunk_length: length,
                }))));
            }
            tracing::error!(chunk = r.handle, server = %self.cfg.address, "read cache held bytes that fail their checksums; dropped");
            self.cache.forget(r.handle);
        }
        self.store(
            Pending::Read {
                id,
                h: r.handle,
                off: r.offset,
                len,
                start,
            },
            StoreOp::Read {
                handle: r.handle,
                ranges: vec![(start, end - start)],
            },
        );
        Ok(None)
    }

    fn finish_read(
        &mut self,
        id: RequestId,
        h: ChunkHandle,
        off: u64,
        len: u64,
        start: u64,
        data: Bytes,
    ) {
        let Some(c) = self.chunks.get(&h) else {
            return self.done(h, id, err(FsError::ChunkNotFound(format!("chunk {h}"))));
        };
        let want = (off + len)
            .div_ceil(BLOCK_SIZE)
            .saturating_mul(BLOCK_SIZE)
            .min(c.meta.length)
            - start;
        if data.len() as u64 != want || checksum::verify(&c.meta.checksums, start, &data).is_err() {
            return self.found_corrupt(h, id);
        }
        let s = (off - start) as usize;
        let piece = data.slice(s..s + len as usize);
        let chunk_length = c.meta.length;
        self.done(
            h,
            id,
            ok(Resp::Read(pb::ReadChunkResponse {
                data: piece,
                chunk_length,
            })),
        )
    }

    /// A checksum failed: refuse the reader, never serve this copy again, tell the master.
    fn found_corrupt(&mut self, h: ChunkHandle, id: RequestId) {
        self.mark_corrupt(h, false);
        self.done(
            h,
            id,
            err(FsError::Corrupt(format!(
                "chunk {h} on {}",
                self.cfg.address
            ))),
        );
    }

    fn mark_corrupt(&mut self, h: ChunkHandle, by_scrubber: bool) {
        tracing::warn!(chunk = h, server = %self.cfg.address, "checksum mismatch");
        self.chunks.remove(&h);
        self.cache.forget(h);
        self.corrupt.insert(h);
        let req = pb::MasterRequest {
            req: Some(MReq::ReportCorrupt(pb::ReportCorruptRequest {
                address: self.cfg.address.clone(),
                handle: h,
                by_scrubber,
                server_id: self.server_id,
                cluster_id: self.cluster_id,
            })),
            ..Default::default()
        };
        self.call(Dest::Master, Outgoing::Master(req), CallCtx::ReportCorrupt);
    }

    // ---- writes -----------------------------------------------------------------------

    fn start_write(
        &mut self,
        id: RequestId,
        r: pb::WriteChunkRequest,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        let h = r.handle;
        self.usable(h, r.version, true)?;
        if !self.is_primary(h, self.now) {
            return Err(FsError::Unavailable(format!(
                "{} holds no lease on chunk {h}",
                self.cfg.address
            )));
        }
        let data = self.data_of(r.data_id, r.data)?;
        check_range(r.offset, data.len(), self.lease_chunk_size(h))?;
        let c = self.chunks.get_mut(&h).expect("usable");
        let seen = c.writers.entry(r.client_id).or_insert(r.client_seq);
        if r.client_seq < *seen {
            return Err(FsError::InvalidArgument(format!(
                "write {} of writer {:x} was overtaken by its write {}",
                r.client_seq, r.client_id, seen
            )));
        }
        *seen = r.client_seq;
        let forward = Forward {
            version: r.version,
            offset: r.offset,
            data,
            data_id: r.data_id,
            secondaries: r.secondaries,
            reply: empty(),
        };
        self.mutate(id, h, forward)
    }

    /// A record append: the primary picks the offset, its copy's end. A record that does
    /// not fit is not written; the chunk is padded to its full size on every replica
    /// instead (an empty write at the chunk's end, which fills the gap with zeros), and
    /// the client moves on to the next chunk. No writer sequence check: appends from one
    /// writer have no order to keep, and a late duplicate is what at-least-once allows.
    fn start_append(
        &mut self,
        id: RequestId,
        r: pb::AppendChunkRequest,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        let h = r.handle;
        self.usable(h, r.version, true)?;
        if !self.is_primary(h, self.now) {
            return Err(FsError::Unavailable(format!(
                "{} holds no lease on chunk {h}",
                self.cfg.address
            )));
        }
        let record = self.data_of(r.data_id, r.data)?;
        // The size of this chunk's file, as the master said in the grant: the client
        // cannot be trusted to say it, and the master's default for new files may differ.
        let chunk_size = self.lease_chunk_size(h);
        let max = chunk_size / 4;
        if record.is_empty() || record.len() as u64 > max {
            return Err(FsError::InvalidArgument(format!(
                "a record must be 1 to {max} bytes, not {}",
                record.len()
            )));
        }
        let c = self.chunks.get_mut(&h).expect("usable");
        let length = c.meta.length;
        let fits = length + record.len() as u64 <= chunk_size;
        let (offset, data, full) = if fits {
            (length, record, false)
        } else {
            (chunk_size, Bytes::new(), true)
        };
        // The secondaries use their own pushed copy, unless the chunk is being padded.
        let data_id = if full || !fits { 0 } else { r.data_id };
        tracing::debug!(chunk = h, server = %self.cfg.address, offset, len = data.len(), full, "record append");
        let forward = Forward {
            version: r.version,
            offset,
            data,
            data_id,
            secondaries: r.secondaries,
            reply: ok(Resp::Append(pb::AppendChunkResponse {
                offset: if full { 0 } else { offset },
                chunk_full: full,
            })),
        };
        self.mutate(id, h, forward)
    }

    /// As primary: gives the mutation the chunk's next serial, sends it to the
    /// secondaries and writes it here, all at once; the client is answered once every
    /// replica has applied it. The chunk's next mutation starts when this server's own
    /// write is done, so serials still follow the order of local writes, and the
    /// secondaries apply them in serial order however the network delivers them. The
    /// caller has checked the mutation's range.
    fn mutate(
        &mut self,
        id: RequestId,
        h: ChunkHandle,
        f: Forward,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        let c = self.chunks.get_mut(&h).expect("usable");
        c.serial += 1;
        let serial = c.serial;
        self.forwarding.insert(
            (h, f.version, serial),
            Forwarding {
                id,
                waiting: f.secondaries.len() + 1,
                error: None,
                local: None,
                reply: f.reply,
            },
        );
        if !f.secondaries.is_empty() {
            tracing::debug!(chunk = h, server = %self.cfg.address, serial, offset = f.offset, len = f.data.len(), to = ?f.secondaries, "forwarding mutation");
        }
        for to in f.secondaries {
            let req = pb::ChunkRequest {
                req: Some(Req::Apply(pb::ApplyMutationRequest {
                    handle: h,
                    version: f.version,
                    serial,
                    offset: f.offset,
                    data: if f.data_id == 0 {
                        f.data.clone()
                    } else {
                        Bytes::new()
                    },
                    data_id: f.data_id,
                })),
            };
            self.call(
                Dest::Peer(to),
                Outgoing::Chunk(req),
                CallCtx::Forward {
                    h,
                    version: f.version,
                    serial,
                },
            );
        }
        self.forwards.insert(h, (f.version, serial));
        self.apply_local(id, h, f.offset, f.data)
    }

    /// A mutation from the primary, in its serial order.
    fn start_apply(
        &mut self,
        id: RequestId,
        r: pb::ApplyMutationRequest,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        self.apply_mutation(id, r, false)
    }

    /// Applies a mutation from the primary. One that arrived before its predecessor (the
    /// primary has several out at once, and the network may reorder them) waits for it,
    /// at most `apply_hold`; `released` says that wait is over.
    fn apply_mutation(
        &mut self,
        id: RequestId,
        r: pb::ApplyMutationRequest,
        released: bool,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        let h = r.handle;
        self.usable(h, r.version, true)?;
        let c = self.chunks.get(&h).expect("usable");
        if r.serial <= c.serial {
            return Err(FsError::InvalidArgument(format!(
                "mutation {} of chunk {h} arrived after mutation {}",
                r.serial, c.serial
            )));
        }
        if r.serial > c.serial + 1 && !released {
            if self.held.contains_key(&(h, r.serial)) {
                return Err(FsError::InvalidArgument(format!(
                    "mutation {} of chunk {h} is already waiting",
                    r.serial
                )));
            }
            if r.serial > c.serial + 4096 || self.held.len() >= 65_536 {
                return Err(FsError::Unavailable(format!(
                    "mutation {} of chunk {h} is too far ahead of {}",
                    r.serial, c.serial
                )));
            }
            tracing::debug!(chunk = h, server = %self.cfg.address, serial = r.serial, last = c.serial, "holding a mutation for its predecessor");
            let now = self.now;
            self.held.insert((h, r.serial), (id, r, now));
            self.finish(h);
            return Ok(None);
        }
        let data = self.data_of(r.data_id, r.data)?;
        // A secondary knows no chunk size (its primary checked the mutation against it).
        check_range(r.offset, data.len(), MAX_CHUNK_SIZE)?;
        self.chunks.get_mut(&h).expect("usable").serial = r.serial;
        tracing::debug!(chunk = h, server = %self.cfg.address, serial = r.serial, offset = r.offset, len = data.len(), "applying mutation");
        self.apply_local(id, h, r.offset, data)
    }

    /// Mutations held longer than `apply_hold`: their predecessors are not coming.
    fn release_held(&mut self) {
        let hold = self.cfg.apply_hold;
        let now = self.now;
        let due: Vec<(ChunkHandle, u64)> = self
            .held
            .iter()
            .filter(|(_, (_, _, since))| *since + hold <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            if let Some((id, r, _)) = self.held.remove(&k) {
                self.enqueue(k.0, Job::Released(id, r));
            }
        }
    }

    /// Fails every mutation held on `h` (its version moved on, or it is gone).
    fn drop_held(&mut self, h: ChunkHandle) {
        let keys: Vec<(ChunkHandle, u64)> = self
            .held
            .range((h, 0)..=(h, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some((id, _, _)) = self.held.remove(&k) {
                self.out.replies.push((
                    id,
                    err(FsError::StaleVersion(format!(
                        "chunk {h} moved on while mutation {} waited",
                        k.1
                    ))),
                ));
            }
        }
    }

    /// The chunk size the lease on `h` was granted with; the caller has checked that
    /// this server holds the lease.
    fn lease_chunk_size(&self, h: ChunkHandle) -> u64 {
        let c = self.chunks.get(&h).expect("a leased chunk is held");
        assert!(
            c.lease_until.is_some() && c.lease_chunk_size > 0,
            "chunk {h}: no lease, or one without a chunk size"
        );
        c.lease_chunk_size
    }

    /// Writes `data` at `offset` on this replica, durably; then replies (or forwards).
    fn apply_local(
        &mut self,
        id: RequestId,
        h: ChunkHandle,
        offset: u64,
        data: Bytes,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        // The primary's caller checked against the file's chunk size already.
        let end = check_range(offset, data.len(), MAX_CHUNK_SIZE)?;
        let length = self.chunks.get(&h).expect("usable").meta.length;
        // A write past the end fills the gap with zeros, so the chunk has no holes.
        let (off, data) = if offset > length {
            let mut d = BytesMut::zeroed((offset - length) as usize);
            d.extend_from_slice(&data);
            (length, d.freeze())
        } else {
            (offset, data)
        };
        let edges = Edges::new(off, end, length);
        let ranges = edges.ranges(length);
        if ranges.is_empty() {
            self.commit_write(id, h, off, data, end, Vec::new());
        } else {
            self.store(
                Pending::WriteEdges {
                    id,
                    h,
                    off,
                    data,
                    end,
                },
                StoreOp::Read { handle: h, ranges },
            );
        }
        Ok(None)
    }

    /// Finishes a write once the old bytes of its partly overwritten edge blocks are read:
    /// those blocks are verified first (a write must not bless corrupt bytes with a fresh
    /// checksum), then the touched blocks' checksums are recomputed.
    fn commit_write(
        &mut self,
        id: RequestId,
        h: ChunkHandle,
        off: u64,
        data: Bytes,
        end: u64,
        read: Vec<Bytes>,
    ) {
        let c = self.chunks.get(&h).expect("chunk is busy, so present");
        let mut meta = c.meta.clone();
        let edges = Edges::new(off, end, meta.length);
        let mut read = read.into_iter();
        let head = if edges.head { read.next() } else { None };
        let tail = match (edges.tail, edges.shared) {
            (true, true) => head.clone(),
            (true, false) => read.next(),
            (false, _) => None,
        };
        let intact = |block: u64, bytes: &Option<Bytes>| match bytes {
            Some(b) => {
                b.len() as u64 == (block + BLOCK_SIZE).min(meta.length) - block
                    && checksum::verify(&meta.checksums, block, b).is_ok()
            }
            None => false,
        };
        if (edges.head && !intact(edges.fb, &head)) || (edges.tail && !intact(edges.tb, &tail)) {
            return self.found_corrupt(h, id);
        }
        // The touched blocks' new bytes: the old head, the data, the old tail (no copy).
        let head_part = head
            .as_ref()
            .map_or(&[][..], |b| &b[..(off - edges.fb) as usize]);
        let tail_part = tail
            .as_ref()
            .map_or(&[][..], |b| &b[(end - edges.tb) as usize..]);
        checksum::update(
            &mut meta.checksums,
            edges.fb,
            &[head_part, &data, tail_part],
        );
        let fill = cache_fill(edges.fb, head_part, off, &data, tail_part);
        // Bytes below the old length are overwritten: say so durably first, so a crash
        // in the middle is repaired rather than leaving the whole copy corrupt.
        let intent = (off < meta.length).then(|| pb::ChunkMeta {
            writing: Some(pb::WriteIntent {
                offset: off,
                length: end - off,
            }),
            ..c.meta.clone()
        });
        meta.length = meta.length.max(end);
        let op = self.store(
            Pending::Commit {
                id: Some(id),
                h,
                meta: Some(meta.clone()),
                lease: None,
            },
            StoreOp::Write {
                handle: h,
                offset: off,
                data: data.clone(),
                meta,
                intent,
            },
        );
        self.fills.insert(op, (h, fill));
    }

    // ---- versions and clones ----------------------------------------------------------

    fn start_set_version(
        &mut self,
        id: RequestId,
        r: pb::SetVersionRequest,
        arrived: Time,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        let h = r.handle;
        if r.valid_ms > 0 && self.now > arrived + Duration::from_millis(r.valid_ms) {
            return Err(FsError::Unavailable(format!(
                "version {} of chunk {h} reached us too late",
                r.version
            )));
        }
        if self.corrupt.contains(&h) {
            return Err(FsError::Corrupt(format!("chunk {h}")));
        }
        let meta = match self.chunks.get(&h) {
            Some(c) if c.meta.version > r.version => {
                return Err(FsError::StaleVersion(format!(
                    "chunk {h}: have {}, asked to set {}",
                    c.meta.version, r.version
                )));
            }
            // Every grant has a version of its own, so this is the order that made this
            // version, again: delivered twice, or the copy came by a clone first. Taking
            // its lease now would run it past the master's view of it (which counts from
            // the first answer), into the next grant's.
            Some(c) if c.meta.version == r.version => {
                tracing::debug!(chunk = h, version = r.version, server = %self.cfg.address, "version already taken; no second lease");
                return Ok(Some(empty()));
            }
            Some(c) => pb::ChunkMeta {
                version: r.version,
                ..c.meta.clone()
            },
            None if r.create => pb::ChunkMeta {
                handle: h,
                version: r.version,
                length: 0,
                checksums: vec![],
                writing: None,
                ..Default::default()
            },
            None => return Err(FsError::ChunkNotFound(format!("chunk {h}"))),
        };
        // The lease counts from when the request arrived, not from when it was taken off
        // the queue or made durable. The master counts from when it gave up waiting or
        // got the answer, both later; so the holder's lease always ends first. (This
        // assumes a request reaches this server before its caller's deadline.)
        let lease = if r.lease_ms > 0 {
            if r.chunk_size == 0 || r.chunk_size > MAX_CHUNK_SIZE {
                return Err(FsError::InvalidArgument(format!(
                    "lease on chunk {h} with chunk size {}",
                    r.chunk_size
                )));
            }
            Some(LeaseGrant {
                until: arrived + Duration::from_millis(r.lease_ms),
                chunk_size: r.chunk_size,
            })
        } else {
            None
        };
        self.store(
            Pending::Commit {
                id: Some(id),
                h,
                meta: Some(meta.clone()),
                lease,
            },
            StoreOp::WriteMeta { handle: h, meta },
        );
        Ok(None)
    }

    fn start_clone(
        &mut self,
        id: RequestId,
        r: pb::CloneChunkRequest,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        // Always copy: a copy here at the same version may be one that missed writes (a
        // grant it took too late), which its version cannot reveal. But never over a
        // newer one: an order to clone that arrives late (delayed, or sent twice) must
        // not take the copy back to an older version and its data.
        self.newer_than_clone(r.handle, r.version)?;
        self.clone_read(id, r.handle, r.version, r.source, BytesMut::new());
        Ok(None)
    }

    /// Refuses a clone of `h` at `version` if this server holds a newer version.
    fn newer_than_clone(&self, h: ChunkHandle, version: Version) -> Result<(), FsError> {
        match self.chunks.get(&h) {
            Some(c) if c.meta.version > version => Err(FsError::StaleVersion(format!(
                "chunk {h}: have version {}, the clone is of {version}",
                c.meta.version
            ))),
            _ => Ok(()),
        }
    }

    fn clone_read(
        &mut self,
        id: RequestId,
        h: ChunkHandle,
        version: Version,
        source: String,
        buf: BytesMut,
    ) {
        let req = pb::ChunkRequest {
            req: Some(Req::Read(pb::ReadChunkRequest {
                handle: h,
                version,
                offset: buf.len() as u64,
                length: self.cfg.clone_piece,
            })),
        };
        self.call(
            Dest::Peer(source.clone()),
            Outgoing::Chunk(req),
            CallCtx::CloneRead {
                id,
                h,
                version,
                source,
                buf,
            },
        );
    }

    fn on_clone_piece(
        &mut self,
        id: RequestId,
        h: ChunkHandle,
        version: Version,
        source: String,
        mut buf: BytesMut,
        result: Result<Reply, RpcError>,
    ) {
        let piece = match result {
            Ok(Reply::Chunk(pb::ChunkResponse {
                error: None,
                resp: Some(Resp::Read(r)),
            })) => r,
            Ok(Reply::Chunk(pb::ChunkResponse { error: Some(e), .. })) => {
                return self.done(h, id, err(FsError::from_pb(&e)));
            }
            Ok(_) => {
                return self.done(
                    h,
                    id,
                    err(FsError::Internal(
                        "unexpected reply from clone source".into(),
                    )),
                );
            }
            Err(e) => {
                return self.done(
                    h,
                    id,
                    err(FsError::Unavailable(format!("clone source: {e}"))),
                );
            }
        };
        if piece.chunk_length > MAX_CHUNK_SIZE {
            return self.done(
                h,
                id,
                err(FsError::InvalidArgument(
                    "clone source chunk too large".into(),
                )),
            );
        }
        buf.extend_from_slice(&piece.data);
        if (buf.len() as u64) < piece.chunk_length && !piece.data.is_empty() {
            return self.clone_read(id, h, version, source, buf);
        }
        if (buf.len() as u64) != piece.chunk_length {
            return self.done(
                h,
                id,
                err(FsError::Unavailable(
                    "clone source changed during the copy".into(),
                )),
            );
        }
        if let Err(e) = self.newer_than_clone(h, version) {
            return self.done(h, id, err(e));
        }
        let data = buf.freeze();
        let meta = pb::ChunkMeta {
            handle: h,
            version,
            length: data.len() as u64,
            checksums: checksum::blocks(&data),
            writing: None,
            ..Default::default()
        };
        self.store(
            Pending::Commit {
                id: Some(id),
                h,
                meta: Some(meta.clone()),
                lease: None,
            },
            StoreOp::Replace {
                handle: h,
                data,
                meta,
            },
        );
    }

    fn start_delete(&mut self, h: ChunkHandle, max: Version) {
        if self.chunks.get(&h).is_some_and(|c| c.meta.version > max) {
            // The order judged an older report; this copy has moved on since.
            return self.finish(h);
        }
        self.store(
            Pending::Commit {
                id: None,
                h,
                meta: None,
                lease: None,
            },
            StoreOp::Delete { handle: h },
        );
    }

    // ---- data pushed ahead of writes ---------------------------------------------------

    /// A piece of pushed data: keep it, and pass it down the chain.
    fn on_push(&mut self, id: RequestId, r: pb::PushDataRequest) {
        if let Err(e) = self.keep_piece(&r) {
            return self.out.replies.push((id, err(e)));
        }
        let Some((next, rest)) = r.chain.split_first() else {
            return self.out.replies.push((id, empty()));
        };
        let req = pb::ChunkRequest {
            req: Some(Req::Push(pb::PushDataRequest {
                data_id: r.data_id,
                offset: r.offset,
                total: r.total,
                piece: r.piece.clone(),
                chain: rest.to_vec(),
            })),
        };
        self.call(
            Dest::Peer(next.clone()),
            Outgoing::Chunk(req),
            CallCtx::PushForward {
                id,
                to: next.clone(),
            },
        );
    }

    fn keep_piece(&mut self, r: &pb::PushDataRequest) -> Result<(), FsError> {
        let end = r.offset.checked_add(r.piece.len() as u64);
        if r.data_id == 0
            || r.total == 0
            || r.total > MAX_CHUNK_SIZE
            || end.is_none_or(|e| e > r.total)
        {
            return Err(FsError::InvalidArgument(format!(
                "push of {} bytes at {} of {} (id {:x}) does not fit",
                r.piece.len(),
                r.offset,
                r.total,
                r.data_id
            )));
        }
        let end = end.expect("checked");
        if !self.pushed.contains_key(&r.data_id) {
            // Make room, oldest first.
            while self.pushed_bytes + r.total > self.cfg.push_buffer_bytes {
                let Some((&old, _)) = self.pushed.iter().min_by_key(|(k, b)| (b.touched, **k))
                else {
                    return Err(FsError::Unavailable(format!(
                        "{} has no room for {} bytes of pushed data",
                        self.cfg.address, r.total
                    )));
                };
                self.drop_pushed(old);
            }
            self.pushed_bytes += r.total;
            self.pushed.insert(
                r.data_id,
                PushBuffer {
                    total: r.total,
                    pieces: Default::default(),
                    touched: self.now,
                },
            );
        }
        let b = self.pushed.get_mut(&r.data_id).expect("present");
        if b.total != r.total {
            return Err(FsError::InvalidArgument(format!(
                "pushed data {:x} changed its length",
                r.data_id
            )));
        }
        // The buffer is counted at its data's length, so it holds no more than that: of a
        // piece sent again or split differently, only the bytes not yet held are kept (as
        // slices of the piece, uncopied). Keeping every piece whole would let pieces at
        // overlapping offsets hold many times the counted bytes alive.
        let mut at = r.offset;
        let mut gaps = Vec::new();
        let first = b
            .pieces
            .range(..=r.offset)
            .next_back()
            .map_or(r.offset, |(&s, _)| s);
        for (&s, p) in b.pieces.range(first..end) {
            if s > at {
                gaps.push((at, s));
            }
            at = at.max(s + p.len() as u64);
        }
        if at < end {
            gaps.push((at, end));
        }
        for (s, e) in gaps {
            let piece = r
                .piece
                .slice((s - r.offset) as usize..(e - r.offset) as usize);
            b.pieces.insert(s, piece);
        }
        b.touched = self.now;
        assert!(
            b.pieces.values().map(|p| p.len() as u64).sum::<u64>() <= b.total,
            "pushed data {:x} holds more than its length",
            r.data_id
        );
        Ok(())
    }

    fn drop_pushed(&mut self, id: u64) -> Option<PushBuffer> {
        let b = self.pushed.remove(&id)?;
        self.pushed_bytes -= b.total;
        Some(b)
    }

    /// The data of a mutation: inline, or pushed ahead under `data_id` (used up here).
    fn data_of(&mut self, data_id: u64, inline: Bytes) -> Result<Bytes, FsError> {
        if data_id == 0 {
            return Ok(inline);
        }
        match self.drop_pushed(data_id) {
            Some(b) if b.complete() => Ok(b.assemble()),
            Some(_) => Err(FsError::Unavailable(format!(
                "data {data_id:x} arrived only in part at {}",
                self.cfg.address
            ))),
            None => Err(FsError::Unavailable(format!(
                "data {data_id:x} is not at {} (never pushed, or dropped)",
                self.cfg.address
            ))),
        }
    }

    /// Drops pushed data nobody used in time.
    fn expire_pushed(&mut self) {
        let ttl = self.cfg.push_buffer_ttl;
        let now = self.now;
        let old: Vec<u64> = self
            .pushed
            .iter()
            .filter(|(_, b)| b.touched + ttl <= now)
            .map(|(k, _)| *k)
            .collect();
        for id in old {
            self.drop_pushed(id);
        }
    }

    // ---- scrubbing --------------------------------------------------------------------

    /// On a tick: when due, verify the next idle chunk after the last one verified, in
    /// handle order, so every chunk's turn comes.
    fn scrub(&mut self) {
        if self.cfg.scrub_interval.is_zero() || self.now < self.next_scrub {
            return;
        }
        self.next_scrub = self.now + self.cfg.scrub_interval;
        let now = self.now;
        let idle =
            |c: &Chunk| c.last_write + self.cfg.scrub_idle <= now || c.last_write == Time::ZERO;
        let pick = |from: ChunkHandle| {
            self.chunks
                .iter()
                .filter(|(h, c)| **h > from && c.meta.length > 0 && idle(c))
                .map(|(h, _)| *h)
                .min()
        };
        let Some(h) = pick(self.scrub_cursor).or_else(|| pick(0)) else {
            return;
        };
        self.scrub_cursor = h;
        if self.busy.contains(&h) || self.queues.contains_key(&h) {
            return; // in use: not idle after all; its turn comes round again
        }
        self.enqueue(h, Job::Scrub);
    }

    fn start_scrub(&mut self, h: ChunkHandle) {
        let Some(c) = self.chunks.get(&h) else {
            return self.finish(h); // deleted meanwhile, or found corrupt
        };
        let length = c.meta.length;
        self.store(
            Pending::Scrub { h, length },
            StoreOp::Read {
                handle: h,
                ranges: vec![(0, length)],
            },
        );
    }

    fn finish_scrub(&mut self, h: ChunkHandle, length: u64, data: Bytes) {
        let Some(c) = self.chunks.get(&h) else {
            return self.finish(h);
        };
        // The job held the chunk, so nothing changed it while it was read.
        debug_assert_eq!(c.meta.length, length);
        if data.len() as u64 != c.meta.length
            || checksum::verify(&c.meta.checksums, 0, &data).is_err()
        {
            tracing::warn!(chunk = h, server = %self.cfg.address, "scrubber found a corrupt copy");
            self.mark_corrupt(h, true);
        } else {
            tracing::trace!(chunk = h, server = %self.cfg.address, "scrubbed");
        }
        self.finish(h);
    }

    // ---- repair after a torn write ---------------------------------------------------

    fn start_repair(&mut self, h: ChunkHandle, w: pb::WriteIntent) {
        let Some(c) = self.chunks.get(&h) else {
            return self.finish(h);
        };
        let length = c.meta.length;
        let start = w.offset / BLOCK_SIZE * BLOCK_SIZE;
        let end = w
            .offset
            .saturating_add(w.length)
            .div_ceil(BLOCK_SIZE)
            .saturating_mul(BLOCK_SIZE)
            .min(length);
        if start >= end {
            // Nothing below the length was touched: just clear the mark.
            let meta = c.meta.clone();
            self.store(
                Pending::Commit {
                    id: None,
                    h,
                    meta: Some(meta.clone()),
                    lease: None,
                },
                StoreOp::WriteMeta { handle: h, meta },
            );
            return;
        }
        self.store(
            Pending::Repair { h, start },
            StoreOp::Read {
                handle: h,
                ranges: vec![(start, end - start)],
            },
        );
    }

    fn finish_repair(&mut self, h: ChunkHandle, start: u64, data: Bytes) {
        let Some(c) = self.chunks.get(&h) else {
            return self.finish(h);
        };
        let mut meta = c.meta.clone();
        let want = ((start + data.len() as u64).div_ceil(BLOCK_SIZE) * BLOCK_SIZE).min(meta.length);
        if start + data.len() as u64 != want {
            // The data is shorter than the metadata says: not a torn write's doing.
            tracing::warn!(chunk = h, "chunk data shorter than its metadata");
            self.mark_corrupt(h, false);
            return self.finish(h);
        }
        checksum::update(&mut meta.checksums, start, &[&data]);
        self.store(
            Pending::Commit {
                id: None,
                h,
                meta: Some(meta.clone()),
                lease: None,
            },
            StoreOp::WriteMeta { handle: h, meta },
        );
    }

    // ---- completions ------------------------------------------------------------------

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
                    Ok(StoreOutput::Done) => self.cluster_id = cluster_id,
                    // The next heartbeat reply tries again.
                    Ok(out) => panic!("storage answered {out:?} to storing the cluster id"),
                    Err(e) => tracing::warn!(error = %e, "storing the cluster id failed"),
                }
            }
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
            (Pending::Commit { id, h, meta, lease }, Ok(StoreOutput::Done)) => {
                match meta {
                    Some(meta) => {
                        let now = self.now;
                        let c = self.chunks.entry(h).or_insert_with(|| Chunk {
                            meta: meta.clone(),
                            lease_until: None,
                            lease_from: now,
                            lease_chunk_size: 0,
                            last_write: Time::ZERO,
                            serial: 0,
                            writers: HashMap::new(),
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
                        if let Some(l) = lease {
                            c.lease_until = Some(l.until);
                            c.lease_from = now;
                            c.lease_chunk_size = l.chunk_size;
                        }
                        self.corrupt.remove(&h);
                        if moved_on {
                            self.drop_held(h);
                        }
                    }
                    None => {
                        self.chunks.remove(&h);
                        self.corrupt.remove(&h);
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
                    Pending::Join { .. } => unreachable!("matched above"),
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

    // ---- heartbeats -------------------------------------------------------------------

    fn heartbeat(&mut self) {
        let now = self.now;
        let mut chunks: Vec<pb::ChunkReport> = self
            .chunks
            .iter()
            .map(|(&handle, c)| pb::ChunkReport {
                handle,
                version: c.meta.version,
                length: c.meta.length,
            })
            .collect();
        // A corrupt copy is reported at version 0: stale to the master, which then has
        // it deleted (and the disk space comes back).
        chunks.extend(self.corrupt.iter().map(|&handle| pb::ChunkReport {
            handle,
            version: 0,
            length: 0,
        }));
        chunks.sort_by_key(|c| c.handle);
        // Ask to extend leases only on chunks written during the current term (GFS §3.1):
        // an idle chunk's lease lapses, so the master may clone or re-grant it.
        let mut lease_extensions: Vec<ChunkHandle> = self
            .chunks
            .iter()
            .filter(|(_, c)| {
                c.lease_until.is_some_and(|t| now < t)
                    && c.last_write > Time::ZERO
                    && c.last_write >= c.lease_from
            })
            .map(|(&h, _)| h)
            .collect();
        lease_extensions.sort_unstable();
        // Versions and copies on their way to the disk: one may land after this report
        // (a stuck disk), so the master must not yet take their absence for good.
        let mut changing: Vec<ChunkHandle> = self
            .pending
            .values()
            .filter_map(|p| match p {
                Pending::Commit {
                    h, meta: Some(_), ..
                } => Some(*h),
                _ => None,
            })
            .collect();
        changing.sort_unstable();
        changing.dedup();
        let used_bytes: u64 = self.chunks.values().map(|c| c.meta.length).sum();
        // The configured capacity is a quota; a disk with less room left caps it.
        let capacity_bytes = match self.disk_available {
            Some(free) => self.cfg.capacity_bytes.min(used_bytes.saturating_add(free)),
            None => self.cfg.capacity_bytes,
        };
        let req = pb::MasterRequest {
            req: Some(MReq::Heartbeat(pb::HeartbeatRequest {
                address: self.cfg.address.clone(),
                rack: self.cfg.rack.clone(),
                capacity_bytes,
                used_bytes,
                chunks,
                lease_extensions,
                server_id: self.server_id,
                cluster_id: self.cluster_id,
                changing,
            })),
            ..Default::default()
        };
        self.call(
            Dest::Master,
            Outgoing::Master(req),
            CallCtx::Heartbeat { sent_at: now },
        );
    }

    fn on_heartbeat_reply(&mut self, sent_at: Time, result: Result<Reply, RpcError>) {
        let hb = match result {
            Ok(Reply::Master(pb::MasterResponse {
                error: None,
                resp: Some(pb::master_response::Resp::Heartbeat(hb)),
            })) => hb,
            Ok(Reply::Master(pb::MasterResponse { error: Some(e), .. }))
                if e.code == pb::ErrorCode::InvalidArgument as i32 =>
            {
                // The master will not have this server (another cluster's, or its address
                // taken by another server): only an operator can fix that.
                tracing::error!(server = %self.cfg.address, error = %e.message, "the master refuses this server");
                return;
            }
            Ok(other) => {
                tracing::warn!(reply = ?other, "heartbeat refused");
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "heartbeat failed");
                return;
            }
        };
        if hb.cluster_id != self.cluster_id {
            if self.cluster_id != 0 {
                tracing::error!(
                    server = %self.cfg.address,
                    ours = self.cluster_id,
                    theirs = hb.cluster_id,
                    "ignoring a heartbeat reply from a master of another cluster"
                );
                return;
            }
            // First contact: the id is stored for good before anything this master says
            // is acted on, and this reply's orders wait for the next one.
            if !self.joining {
                tracing::info!(server = %self.cfg.address, cluster_id = hb.cluster_id, "joining the cluster");
                self.joining = true;
                let meta = pb::ChunkMeta {
                    handle: IDENTITY_HANDLE,
                    server_id: self.server_id,
                    cluster_id: hb.cluster_id,
                    ..Default::default()
                };
                self.store(
                    Pending::Join {
                        cluster_id: hb.cluster_id,
                    },
                    StoreOp::WriteMeta {
                        handle: IDENTITY_HANDLE,
                        meta,
                    },
                );
            }
            return;
        }
        let until = sent_at + Duration::from_millis(hb.lease_duration_ms);
        for h in hb.extended_leases {
            if let Some(c) = self.chunks.get_mut(&h)
                && c.lease_until.is_some()
            {
                c.lease_until = Some(until);
                c.lease_from = sent_at;
            }
        }
        for d in hb.delete_chunks {
            tracing::debug!(chunk = d.handle, version = d.version, server = %self.cfg.address, "deleting on the master's word");
            self.enqueue(d.handle, Job::Delete(d.version));
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
