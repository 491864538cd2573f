//! The client library: async code over `Runtime` and `Transport`, so it runs unchanged in
//! the simulator and in production.
//!
//! Metadata goes to the master, data to chunkservers. Chunk locations are cached for
//! `location_ttl`; a read that fails on one replica tries the next, and refreshes the
//! locations when all have failed. A write goes to the chunk's primary, which orders it
//! and has every secondary apply it before answering; a failed write is retried against a
//! fresh lease, and the file's length is extended after success.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use prost::Message;

use crate::error::{FsError, RpcError};
use crate::pb::{
    self, chunk_request::Req as CReq, chunk_response::Resp as CResp, master_request::Req,
    master_response::Resp,
};
use crate::record;
use crate::runtime::{PartsReader, Runtime, Transport};
use crate::types::Time;

/// Marks a "not the leader" answer that named the leader, now the replica to ask.
const NAMED: &str = "\u{0}named";

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The master's address, or every master replica's, comma-separated: the client
    /// finds the leader and follows it across a failover (`crate::masters`).
    pub master: String,
    pub rpc_timeout: Duration,
    /// How long an operation that fails in a retryable way (master or servers not
    /// answering, a lease settling, no replica known yet) keeps trying, from its start.
    /// The default rides out a master restart and the lease period after it (writes to
    /// existing chunks wait that out when a server that may hold a lease stays down);
    /// zero tries once.
    pub retry_for: Duration,
    /// First back-off between attempts; doubles each time, up to `MAX_BACKOFF`.
    pub backoff: Duration,
    pub location_ttl: Duration,
    /// The client's rack, for ordering the data push by network distance ("" if unknown).
    pub rack: String,
    /// Data is pushed to the replicas in pieces of this size, this many in flight.
    pub push_piece: u64,
    pub push_window: usize,
    /// Entries per page asked for when listing or checking a tree (0: the master's page
    /// size, which is also the most it gives).
    pub page: u32,
    /// Reads (list, stat, chunk locations, report) that the leader did not answer are
    /// asked again letting a shadow master answer, from a state that may lag the
    /// leader's (`Client::last_shadow_answer` says how far). The first attempt always
    /// asks the leader: without failures, reads see every acknowledged mutation.
    pub shadow_reads: bool,
    /// Permission bits new files (from 0666) and directories (from 0777) do not get,
    /// as a POSIX umask (`crate::master::perms`).
    pub umask: u32,
}

impl ClientConfig {
    pub fn new(master: impl Into<String>) -> ClientConfig {
        ClientConfig {
            master: master.into(),
            rpc_timeout: Duration::from_secs(10),
            retry_for: Duration::from_secs(90),
            backoff: Duration::from_millis(100),
            location_ttl: Duration::from_secs(60),
            rack: String::new(),
            push_piece: 1 << 20,
            push_window: 4,
            page: 0,
            shadow_reads: true,
            umask: 0o022,
        }
    }
}

#[derive(Clone, Debug)]
struct Locations {
    info: pb::GetChunksResponse,
    fetched: Time,
}

#[derive(Clone)]
pub struct Client<R: Runtime, T: Transport> {
    rt: R,
    transport: T,
    cfg: ClientConfig,
    masters: crate::masters::Masters,
    cache: Arc<Mutex<HashMap<String, Locations>>>,
    /// Names this client to primaries, which refuse its overtaken writes.
    id: u64,
    /// Numbers this client's write attempts, a retry's too, in the order they are sent.
    seq: Arc<std::sync::atomic::AtomicU64>,
    /// Per file, the chunk the last record append went to.
    append_index: Arc<Mutex<HashMap<String, u64>>>,
    /// Write targets (lease holders) the master gave, by file and chunk index (`APPEND`
    /// for record appends), kept until shortly before the lease ends: mutations need no
    /// master round trip while a lease lasts (GFS §3.1). Dropped on any failure; the
    /// primary refuses a mutation once its lease is over, so a stale entry costs a retry,
    /// never a wrong write.
    targets: Arc<Mutex<TargetCache>>,
    /// Of the reads shadow masters answered this client, the one furthest behind.
    shadow: Arc<Mutex<Option<pb::ShadowAnswer>>>,
    /// No retry loop of this client waits past this (`Client::until`).
    until: Option<Time>,
}

/// (file, chunk index or `APPEND`) to the target and when to stop using it.
type TargetCache = HashMap<(String, u64), (pb::WriteTarget, Time)>;

/// The write-target cache key for record appends (a file's last chunk).
const APPEND: u64 = u64::MAX;

/// The longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The longest wait between two attempts while a master group's leader is looked for
/// (the replica asked could not be reached, or leads no more and names no leader). An
/// election takes one to two seconds; waits that went on doubling would leave the
/// client asleep for up to `MAX_BACKOFF` after the new leader serves (measured: one
/// kill in four of the leader then cost its clients 3.1 s instead of 1.5 s).
pub const LEADER_SEARCH_BACKOFF: Duration = Duration::from_millis(250);

/// The attempts of one operation: waits that double from the configured back-off, for as
/// long as `retry_for` allows since the operation began. The one retry loop every
/// operation shares.
struct Retry {
    /// When the first attempt failed.
    failing_since: Option<Time>,
    until: Time,
    wait: Duration,
    waited: u32,
    warned: bool,
}

/// A retry loop still failing this long after its first failure says so, once: long
/// enough that a master group's failover (one to two seconds) passes without a word.
/// Counted from the failure, which an attempt that ran to its call deadline (10 s) makes
/// late: the warning then comes with the second failure.
pub const STILL_TRYING_AFTER: Duration = Duration::from_secs(3);

impl Retry {
    /// Waits before the next attempt; false once the operation's time is up (the caller
    /// then gives up with the last error).
    async fn pause<R: Runtime>(&mut self, rt: &R, what: &str, error: &FsError) -> bool {
        self.pause_at_most(rt, what, error, MAX_BACKOFF).await
    }

    /// As `pause`, waiting no longer than `cap` this time.
    async fn pause_at_most<R: Runtime>(
        &mut self,
        rt: &R,
        what: &str,
        error: &FsError,
        cap: Duration,
    ) -> bool {
        // The last attempt is made when the time is up, not a whole wait before it.
        let now = rt.now();
        if now >= self.until {
            return false;
        }
        let wait = self.wait.min(cap).min(self.until.saturating_sub(now));
        self.waited += 1;
        // Said once, a few seconds in, so a person at a terminal knows why nothing happens.
        let since = *self.failing_since.get_or_insert(now);
        if !self.warned && now.saturating_sub(since) >= STILL_TRYING_AFTER {
            self.warned = true;
            tracing::warn!(error = %error, "{what}: still trying");
        } else {
            tracing::debug!(attempt = self.waited, error = %error, "{what} failed; retrying");
        }
        rt.sleep(wait).await;
        self.wait = (self.wait * 2).min(MAX_BACKOFF);
        true
    }
}

/// The suffix of the name a put writes under until the file is complete (followed by a
/// random number of the put's own).
pub const COPYING: &str = "._COPYING_";

/// Why a [`Client::put_with`] failed.
#[derive(Debug)]
pub enum PutError<E> {
    /// A step of the put's own failed: `AlreadyExists` if the path exists, or another put
    /// to it finished first.
    Fs(FsError),
    /// The caller's writing of the data failed.
    Write(E),
    /// The put failed, and its file was no longer where it made it: a directory above
    /// the path was renamed (or removed) meanwhile. If renamed, the unfinished file,
    /// `name`, is left under the directory's new name.
    Left {
        failed: Box<PutError<E>>,
        name: String,
    },
}

impl<E: std::fmt::Display> std::fmt::Display for PutError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PutError::Fs(e) => e.fmt(f),
            PutError::Write(e) => e.fmt(f),
            PutError::Left { failed, name } => write!(f, "{failed}{}", left_note(name)),
        }
    }
}

impl<E: std::fmt::Debug + std::fmt::Display> std::error::Error for PutError<E> {}

/// What the error of a put that left its file `name` behind ([`PutError::Left`]) adds.
pub fn left_note(name: &str) -> String {
    format!(
        "; a directory above the path was renamed or removed meanwhile: if renamed, the \
         unfinished copy {name:?} is left under its new name (remove it with rm)"
    )
}

impl<R: Runtime, T: Transport> Client<R, T> {
    pub fn new(rt: R, transport: T, cfg: ClientConfig) -> Self {
        let id = rt.random_u64();
        Client {
            masters: crate::masters::Masters::parse(&cfg.master),
            rt,
            transport,
            cfg,
            cache: Arc::default(),
            id,
            seq: Arc::default(),
            append_index: Arc::default(),
            targets: Arc::default(),
            shadow: Arc::default(),
            until: None,
        }
    }

    /// This client, giving up every operation at `t` at the latest: an operation made of
    /// several steps (a put asks the master, then writes each chunk, each step retried
    /// on its own) otherwise has `retry_for` for each step. A command's `--retry-for`,
    /// counted from its start. An attempt already under way at `t` still runs to its
    /// own deadline.
    pub fn until(mut self, t: Time) -> Self {
        self.until = Some(t);
        self
    }

    /// This client, with shadow reads on or off (see [`ClientConfig::shadow_reads`]);
    /// it shares everything else (caches, the leader it follows, its id) with the
    /// client it was made from.
    pub fn with_shadow_reads(mut self, on: bool) -> Self {
        self.cfg.shadow_reads = on;
        self
    }

    /// Whether a shadow master answered any read of this client since it was made
    /// (or since `forget_shadow_answers`), and of those the one furthest behind: which
    /// replica, from what log position, how far behind. None: the leader answered all.
    /// A command that read from a shadow shows it (its view may be older than the
    /// leader's), whatever its later reads were answered by.
    pub fn last_shadow_answer(&self) -> Option<pb::ShadowAnswer> {
        self.shadow.lock().expect("shadow lock").clone()
    }

    pub fn forget_shadow_answers(&self) {
        *self.shadow.lock().expect("shadow lock") = None;
    }

    /// The runtime, transport and master address this client uses (for tools and tests
    /// that speak the protocol directly).
    pub fn parts(&self) -> (&R, &T, &str) {
        (&self.rt, &self.transport, &self.cfg.master)
    }

    // ---- master calls -----------------------------------------------------------------

    async fn master_once(
        &self,
        req: &Req,
        token: u64,
        stale_ok: bool,
    ) -> Result<(Resp, Option<pb::ShadowAnswer>), FsError> {
        let body = pb::MasterRequest {
            token,
            req: Some(req.clone()),
            stale_ok,
        }
        .encode_to_vec();
        let deadline = self.rt.now() + self.cfg.rpc_timeout;
        let to = self.masters.current();
        let bytes = match self
            .transport
            .call(&to, crate::auth::ServerRole::Master, body.into(), deadline)
            .await
        {
            Ok(b) => b,
            Err(e) => {
                self.masters.unreachable(&to);
                return Err(unavailable(e));
            }
        };
        let resp = match pb::MasterResponse::decode(bytes.clone()) {
            Ok(r) => r,
            Err(e) => {
                // A chunkserver's address given for the master's: its answer, which need
                // not decode as a master's, says what answered.
                if let Ok(pb::ChunkResponse {
                    error: Some(err), ..
                }) = pb::ChunkResponse::decode(bytes)
                {
                    return Err(FsError::from_pb(&err));
                }
                return Err(FsError::Internal(format!(
                    "malformed reply from master: {e}"
                )));
            }
        };
        if let Some(s) = &resp.shadow {
            let mut worst = self.shadow.lock().expect("shadow lock");
            if worst
                .as_ref()
                .is_none_or(|w| (s.lag_ms, u64::MAX - s.seq) > (w.lag_ms, u64::MAX - w.seq))
            {
                *worst = Some(s.clone());
            }
        }
        match (resp.error, resp.resp) {
            (Some(e), _) => {
                let e = FsError::from_pb(&e);
                if let FsError::NotLeader(l) = &e
                    && self.masters.not_leader(&to, l)
                {
                    // A leader named: ask it at once, as the same attempt.
                    return Err(FsError::NotLeader(NAMED.into()));
                }
                Err(e)
            }
            (None, Some(r)) => Ok((r, resp.shadow)),
            (None, None) => Err(FsError::Internal("empty reply from master".into())),
        }
    }

    fn retry(&self) -> Retry {
        let until = self.rt.now() + self.cfg.retry_for;
        Retry {
            failing_since: None,
            until: self.until.map_or(until, |u| u.min(until)),
            wait: self.cfg.backoff,
            waited: 0,
            warned: false,
        }
    }

    /// Calls the master, retrying while the failure is `Unavailable` (unreachable master,
    /// lease settling) or the replica asked does not lead (the leader it names is asked
    /// next; see `crate::masters`). Every attempt carries the same token, so a mutation whose first
    /// attempt was done but whose reply was lost is answered as it was then (the master's
    /// retry cache), not done again; only a call that fails for good leaves its outcome
    /// unknown.
    async fn master(&self, req: Req) -> Result<Resp, FsError> {
        self.master_call(req).await.map(|(r, _)| r)
    }

    /// As `master`, with the shadow master that answered a read, if one did.
    async fn master_call(&self, req: Req) -> Result<(Resp, Option<pb::ShadowAnswer>), FsError> {
        let read = self.cfg.shadow_reads
            && matches!(
                req,
                Req::List(_) | Req::Stat(_) | Req::GetChunks(_) | Req::Report(_)
            );
        self.master_from(req, read).await
    }

    /// As `master`, `read` saying whether a shadow may answer once the leader did
    /// not.
    async fn master_from(
        &self,
        req: Req,
        read: bool,
    ) -> Result<(Resp, Option<pb::ShadowAnswer>), FsError> {
        let mut retry = self.retry();
        // One token for every attempt: a mutation asked again after a lost reply is
        // answered as the first attempt was, not done twice.
        let token = self.rt.random_u64() | 1;
        // Leaders named in a row without a pause, so two replicas that each name the
        // other (a stale view during an election) cannot keep the client spinning.
        let mut named = 0;
        loop {
            // Once every replica was asked and none led to an answer, a shadow may: an
            // address that does not answer is not the leader failing, and the next one
            // may lead (or name the leader).
            let stale_ok = read && retry.waited as usize >= self.masters.len();
            let asked = self.masters.current();
            match self.master_once(&req, token, stale_ok).await {
                Err(FsError::NotLeader(l)) if l == NAMED && named < 3 => named += 1,
                Err(e @ (FsError::Unavailable(_) | FsError::NotLeader(_))) => {
                    named = 0;
                    // Moved on from the replica asked (it did not answer, or knows no
                    // leader), or told it does not lead: a group's leader is looked
                    // for, and may serve any moment now. A master that answered
                    // "unavailable" itself (a lease settling, say) is waited for as
                    // any other failure.
                    let searching = self.masters.len() > 1
                        && (matches!(e, FsError::NotLeader(_)) || self.masters.current() != asked);
                    let e = match e {
                        FsError::NotLeader(l) if l == NAMED => {
                            FsError::NotLeader(self.masters.current())
                        }
                        e => e,
                    };
                    let cap = if searching {
                        LEADER_SEARCH_BACKOFF
                    } else {
                        MAX_BACKOFF
                    };
                    if !retry.pause_at_most(&self.rt, "master call", &e, cap).await {
                        return Err(e);
                    }
                }
                other => return other,
            }
        }
    }

    /// The master replica this client asks now.
    pub fn current_master(&self) -> String {
        self.masters.current()
    }

    /// Where this client finds the master, for tools that speak the protocol directly
    /// and want to follow the leader as the client does.
    pub fn masters(&self) -> &crate::masters::Masters {
        &self.masters
    }

    async fn master_empty(&self, req: Req) -> Result<(), FsError> {
        self.master(req).await.map(|_| ())
    }

    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<(), FsError> {
        self.master_empty(Req::Mkdir(pb::MkdirRequest {
            path: path.into(),
            parents,
            mode: Some(0o777 & !self.cfg.umask),
        }))
        .await
    }

    pub async fn create(&self, path: &str, replication: u32) -> Result<(), FsError> {
        self.master_empty(Req::Create(pb::CreateRequest {
            path: path.into(),
            replication,
            mode: Some(0o666 & !self.cfg.umask),
        }))
        .await
    }

    /// Gives the entry at `path` another owner (only an admin may), another group (its
    /// owner may, for a group it is in) or other permission bits (its owner may); each
    /// left None is kept.
    pub async fn set_permissions(
        &self,
        path: &str,
        owner: Option<&str>,
        group: Option<&str>,
        mode: Option<u32>,
    ) -> Result<(), FsError> {
        self.master_empty(Req::SetPermissions(pb::SetPermissionsRequest {
            path: path.into(),
            owner: owner.unwrap_or_default().into(),
            group: group.unwrap_or_default().into(),
            mode,
        }))
        .await
    }

    pub async fn delete(&self, path: &str, recursive: bool) -> Result<(), FsError> {
        self.forget_all(path);
        self.master_empty(Req::Delete(pb::DeleteRequest {
            path: path.into(),
            recursive,
        }))
        .await
    }

    pub async fn rename(&self, src: &str, dst: &str) -> Result<(), FsError> {
        self.forget_all(src);
        self.forget_all(dst);
        self.master_empty(Req::Rename(pb::RenameRequest {
            src: src.into(),
            dst: dst.into(),
        }))
        .await
    }

    /// The entries of the directory at `path`, in name order, asked for page by page
    /// (the namespace may change between pages, as between two listings).
    pub async fn list(
        &self,
        path: &str,
        include_deleted: bool,
    ) -> Result<Vec<pb::FileInfo>, FsError> {
        let mut out = Vec::new();
        self.list_pages(path, include_deleted, |page| out.extend(page))
            .await?;
        Ok(out)
    }

    /// The listing page by page, each page handed to `entries` as it arrives (a
    /// directory of millions of entries need not be held at once).
    pub async fn list_pages(
        &self,
        path: &str,
        include_deleted: bool,
        mut entries: impl FnMut(Vec<pb::FileInfo>),
    ) -> Result<(), FsError> {
        let mut start_after = String::new();
        loop {
            let page = match self
                .master(Req::List(pb::ListRequest {
                    path: path.into(),
                    include_deleted,
                    start_after: start_after.clone(),
                    limit: self.cfg.page,
                }))
                .await?
            {
                Resp::List(l) => l,
                other => return Err(unexpected(other)),
            };
            let last = page
                .entries
                .last()
                .map(|e| e.path.rsplit('/').next().unwrap_or_default().to_string());
            let more = page.more;
            entries(page.entries);
            if !more {
                return Ok(());
            }
            // Pages go forward in name order.
            match last {
                Some(name) if name > start_after => start_after = name,
                _ => {
                    return Err(FsError::Internal(format!(
                        "listing {path}: the master said more entries follow {start_after:?} but sent none after it"
                    )));
                }
            }
        }
    }

    pub async fn stat(&self, path: &str) -> Result<pb::FileInfo, FsError> {
        match self
            .master(Req::Stat(pb::StatRequest { path: path.into() }))
            .await?
        {
            Resp::Stat(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// Adds or removes one master group replica (`tessera admin masters add|remove`).
    /// The leader answers once the change is committed, with its status; asked again
    /// after a lost answer, a change made already is answered as done.
    pub async fn change_members(
        &self,
        req: pb::ChangeMembersRequest,
    ) -> Result<pb::ReplicaStatus, FsError> {
        match self.master(Req::ChangeMembers(req)).await? {
            Resp::ReplicaStatus(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// The cluster report: servers, space, chunk health (`tessera admin report`).
    pub async fn report(&self) -> Result<pb::ClusterReport, FsError> {
        match self.master(Req::Report(pb::ReportRequest {})).await? {
            Resp::Report(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// Checks the file or tree at `path`: chunk health, replica locations
    /// (`tessera admin fsck`). `list_chunks` lists every file and chunk, not only those
    /// with problems.
    pub async fn fsck(&self, path: &str, list_chunks: bool) -> Result<pb::FsckResponse, FsError> {
        let mut files = Vec::new();
        let mut all = self
            .fsck_pages(path, list_chunks, |page| add_fsck_files(&mut files, page))
            .await?;
        all.files = files;
        Ok(all)
    }

    /// Fsck page by page, each page's files handed to `files` as it arrives (a tree of
    /// millions of files need not be held at once); returns the totals (no files).
    pub async fn fsck_pages(
        &self,
        path: &str,
        list_chunks: bool,
        mut files: impl FnMut(Vec<pb::FsckFile>),
    ) -> Result<pb::FsckResponse, FsError> {
        let mut all = pb::FsckResponse::default();
        let mut after = (String::new(), 0);
        loop {
            let mut page = self
                .fsck_page(path, list_chunks, (&after.0, after.1))
                .await?;
            files(std::mem::take(&mut page.files));
            let next = merge_fsck(&mut all, page);
            if next.0.is_empty() {
                return Ok(all);
            }
            // Pages go forward in path order (by components: "/a/b" before "/a-c"), and
            // within a file by chunk.
            let forward = next
                .0
                .split('/')
                .cmp(after.0.split('/'))
                .then(next.1.cmp(&after.1));
            if forward != std::cmp::Ordering::Greater {
                return Err(FsError::Internal(format!(
                    "fsck went back from page after {} (chunk {}) to {} (chunk {})",
                    after.0, after.1, next.0, next.1
                )));
            }
            after = next;
        }
    }

    /// One page of fsck: the entries after the full path `after` ("" for the first page),
    /// or with a nonzero chunk index, that file's chunks from there and then the entries
    /// after it; the answer's `next` and `next_chunk` say where the next page starts
    /// ("" after the last).
    pub async fn fsck_page(
        &self,
        path: &str,
        list_chunks: bool,
        (after, start_chunk): (&str, u64),
    ) -> Result<pb::FsckResponse, FsError> {
        let req = Req::Fsck(pb::FsckRequest {
            path: path.into(),
            list_chunks,
            start_after: after.into(),
            limit: self.cfg.page,
            start_chunk,
        });
        match self.master(req).await? {
            Resp::Fsck(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    fn forget(&self, path: &str) {
        self.cache.lock().expect("cache lock").remove(path);
    }

    /// Drops everything cached about `path` (it is being renamed or deleted).
    fn forget_all(&self, path: &str) {
        self.forget(path);
        self.targets
            .lock()
            .expect("targets lock")
            .retain(|(p, _), _| p != path);
    }

    fn forget_target(&self, path: &str, key: u64) {
        self.targets
            .lock()
            .expect("targets lock")
            .remove(&(path.to_string(), key));
    }

    /// Where the chunks of `path` are, and this client's capabilities to read each copy,
    /// fresh from the leader: for tools that speak to chunkservers themselves.
    pub async fn chunk_locations(&self, path: &str) -> Result<pb::GetChunksResponse, FsError> {
        self.locations_from(path, true, false).await
    }

    /// The lease holder of chunk `index` of `path`, with this client's capabilities to
    /// write there (a lease is granted first if none is held): for tools that speak to
    /// chunkservers themselves.
    pub async fn lease_holder(&self, path: &str, index: u64) -> Result<pb::WriteTarget, FsError> {
        let path = crate::path::normalize(path)?;
        self.write_target(&path, index, false).await
    }

    /// Where the chunks of `path` are, for a read: a shadow may answer once the leader
    /// could not be reached (its view is used for the read, not kept).
    async fn locations(&self, path: &str, fresh: bool) -> Result<pb::GetChunksResponse, FsError> {
        self.locations_from(path, fresh, true).await
    }

    /// Where the chunks of `path` are, for a write: from the leader only. A shadow
    /// behind it may not have applied the file's create yet (a put creates the file
    /// and writes it at once), and its "not found" would fail a write to a file that
    /// exists.
    async fn leader_locations(&self, path: &str) -> Result<pb::GetChunksResponse, FsError> {
        self.locations_from(path, false, false).await
    }

    async fn locations_from(
        &self,
        path: &str,
        fresh: bool,
        read: bool,
    ) -> Result<pb::GetChunksResponse, FsError> {
        let now = self.rt.now();
        if !fresh
            && let Some(l) = self.cache.lock().expect("cache lock").get(path)
            && now.saturating_sub(l.fetched) < self.cfg.location_ttl
        {
            return Ok(l.info.clone());
        }
        let req = Req::GetChunks(pb::GetChunksRequest {
            path: path.into(),
            first_index: 0,
            count: 0,
        });
        let (info, shadow) = match self.master_from(req, read && self.cfg.shadow_reads).await? {
            (Resp::GetChunks(c), shadow) => (c, shadow),
            (other, _) => return Err(unexpected(other)),
        };
        if info.chunk_size == 0 {
            return Err(FsError::Internal("master reported chunk size 0".into()));
        }
        if shadow.is_some() {
            // A shadow's view: used for this read, not kept.
            return Ok(info);
        }
        self.cache.lock().expect("cache lock").insert(
            path.to_string(),
            Locations {
                info: info.clone(),
                fetched: now,
            },
        );
        Ok(info)
    }

    // ---- chunkserver calls ------------------------------------------------------------

    async fn chunk_call(&self, to: &str, req: CReq) -> Result<pb::ChunkResponse, FsError> {
        let body = crate::wire::request_parts(pb::ChunkRequest { req: Some(req) });
        let deadline = self.rt.now() + self.cfg.rpc_timeout;
        // A read's data arrives as a piece of its own: decoded as a slice of it, uncopied.
        let parts = self
            .transport
            .call_parts(to, crate::auth::ServerRole::Chunkserver, body, deadline)
            .await
            .map_err(unavailable)?;
        let resp = pb::ChunkResponse::decode(PartsReader::from(parts))
            .map_err(|e| FsError::Internal(format!("malformed reply from {to}: {e}")))?;
        match resp.error {
            // A chunkserver refuses a capability that expired, or that a key it does not
            // hold yet signed (a new key, a restarted server): what the master hands out
            // next will do. The master, not the chunkserver, says who may not.
            Some(e) if e.code == pb::ErrorCode::PermissionDenied as i32 => Err(
                FsError::Unavailable(format!("{to} refused the capability: {}", e.message)),
            ),
            Some(e) => Err(FsError::from_pb(&e)),
            None => Ok(resp),
        }
    }

    // ---- data -------------------------------------------------------------------------

    /// Reads up to `len` bytes at `offset`; fewer at the end of the file.
    pub async fn read(&self, path: &str, offset: u64, len: u64) -> Result<Bytes, FsError> {
        let mut info = self.locations(path, false).await?;
        let end = offset.saturating_add(len).min(info.file_length);
        // One buffer holds the read: a length no buffer can (a master's answer is not
        // trusted that far) is an error, not a panic.
        if end.saturating_sub(offset) > isize::MAX as u64 {
            return Err(FsError::InvalidArgument(format!(
                "{path}: a read of {} bytes at {offset} is more than one buffer holds; \
                 read it in pieces",
                end - offset
            )));
        }
        let mut out = BytesMut::new();
        let mut pos = offset;
        let mut retry = self.retry();
        // Whether `info` came from the master since the last failure, not the cache.
        let mut fresh = false;
        while pos < end {
            let cs = info.chunk_size;
            let idx = pos / cs;
            let piece_end = end.min((idx + 1) * cs);
            let data = match self.read_piece(&info, idx, pos % cs, piece_end - pos).await {
                Ok(d) => d,
                // Every replica known failed, or none is known yet (the master may still
                // be learning locations after a restart): wait, ask the master again and
                // place the position anew (the path may name another file by now, laid
                // out in other chunks).
                //
                // Locations from the cache may only be stale (every replica it knew
                // gone, and the chunk copied elsewhere): those get one fresh look even
                // when the time to retry is spent, since trying each gone replica
                // can take it all.
                Err(e) if e.is_retryable() => {
                    if !retry.pause(&self.rt, "read", &e).await && fresh {
                        return Err(e);
                    }
                    info = self.locations(path, true).await?;
                    fresh = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if out.is_empty() && piece_end == end && data.len() as u64 == end - offset {
                // The whole read came from one chunk: hand its buffer over, uncopied.
                return Ok(data);
            }
            if out.is_empty() {
                out.reserve(end.saturating_sub(offset) as usize);
            }
            out.extend_from_slice(&data);
            // Bytes the file's length covers but no replica holds (a hole) read as zeros.
            out.resize((piece_end - offset) as usize, 0);
            pos = piece_end;
        }
        Ok(out.freeze())
    }

    async fn read_piece(
        &self,
        info: &pb::GetChunksResponse,
        idx: u64,
        off: u64,
        len: u64,
    ) -> Result<Bytes, FsError> {
        let Some(c) = info.chunks.iter().find(|c| c.index == idx) else {
            return Ok(Bytes::new()); // no chunk allocated here: a hole
        };
        if c.version == 0 {
            return Ok(Bytes::new());
        }
        if c.replicas.is_empty() {
            // Still retried: a server holding a good copy may come back.
            return Err(FsError::Unavailable(if c.corrupt_copies > 0 {
                format!(
                    "chunk {} has no live replica: {} of its copies failed their checksums \
                     and were dropped, and no good copy is known",
                    c.handle, c.corrupt_copies
                )
            } else {
                format!("chunk {} has no live replica", c.handle)
            }));
        }
        // Start at a random replica to spread load; try each in turn.
        let start = (self.rt.random_u64() % c.replicas.len() as u64) as usize;
        let mut last = None;
        for i in 0..c.replicas.len() {
            let at = (start + i) % c.replicas.len();
            let to = &c.replicas[at];
            let req = CReq::Read(pb::ReadChunkRequest {
                handle: c.handle,
                version: c.version,
                offset: off,
                length: len,
                capability: c.capabilities.get(at).cloned(),
            });
            match self.chunk_call(to, req).await {
                Ok(pb::ChunkResponse {
                    resp: Some(CResp::Read(r)),
                    ..
                }) => return Ok(r.data),
                Ok(_) => last = Some(FsError::Internal(format!("unexpected reply from {to}"))),
                Err(e) => {
                    tracing::debug!(replica = %to, chunk = c.handle, error = %e, "read failed; trying another replica");
                    last = Some(e);
                }
            }
        }
        Err(last.expect("at least one replica tried"))
    }

    /// The chunk size of the file at `path`: its own, fixed when it was created (the
    /// master's default then, which may have changed since).
    pub async fn chunk_size(&self, path: &str) -> Result<u64, FsError> {
        Ok(self.locations(path, false).await?.chunk_size)
    }

    /// As [`Client::chunk_size`], for a file about to be written: asked of the leader
    /// only, as a write's own lookups are (a shadow may not know the file yet).
    pub async fn chunk_size_to_write(&self, path: &str) -> Result<u64, FsError> {
        Ok(self.leader_locations(path).await?.chunk_size)
    }

    /// Writes `data` at `offset`, splitting it at chunk boundaries.
    pub async fn write(&self, path: &str, offset: u64, data: Bytes) -> Result<(), FsError> {
        let chunk_size = self.leader_locations(path).await?.chunk_size;
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| FsError::InvalidArgument("write past the largest offset".into()))?;
        let mut pos = offset;
        // The chunk each piece went to: the master extends the file only if they are its
        // own, so a write whose file was renamed away and its name given to another file
        // meanwhile fails rather than lengthens the other file over bytes it lacks.
        let mut handles = Vec::new();
        while pos < end {
            let idx = pos / chunk_size;
            let piece_end = end.min((idx + 1) * chunk_size);
            let piece = data.slice((pos - offset) as usize..(piece_end - offset) as usize);
            handles.push(
                self.write_piece(path, idx, pos % chunk_size, piece, chunk_size)
                    .await?,
            );
            pos = piece_end;
        }
        if handles.is_empty() {
            // Nothing written: the file keeps its length, as an empty write at any
            // offset leaves a POSIX file's.
            return Ok(());
        }
        self.forget(path);
        self.master_empty(Req::ExtendFile(pb::ExtendFileRequest {
            path: path.into(),
            length: end,
            first_index: offset / chunk_size,
            handles,
        }))
        .await
    }

    /// Appends `data` at the file's end, as a plain write, and returns where it went. The
    /// master picks the offset ([`Client::reserve_append`]), so concurrent appends each
    /// land whole, in some order, never over one another. An append that fails may
    /// leave a region of its length that reads as zeros (one: a reservation asked for
    /// again after a lost reply gets the same region). Do not mix with record appends on one file:
    /// a record append may land inside a region reserved and not yet written.
    pub async fn append(&self, path: &str, data: Bytes) -> Result<u64, FsError> {
        let at = self.reserve_append(path, data.len() as u64).await?;
        if !data.is_empty() {
            self.write(path, at, data).await?;
        }
        Ok(at)
    }

    /// Reserves `length` bytes at the end of `path` for this client to write, and returns
    /// where they start (see [`Client::append`]). The master extends the file over the
    /// region before it answers, so a region is never given out twice, and a region
    /// nobody writes reads as zeros. A length of 0 reserves nothing and returns the
    /// file's length.
    pub async fn reserve_append(&self, path: &str, length: u64) -> Result<u64, FsError> {
        self.forget(path);
        match self
            .master(Req::ReserveAppend(pb::ReserveAppendRequest {
                path: path.into(),
                length,
            }))
            .await?
        {
            Resp::ReserveAppend(r) => Ok(r.offset),
            other => Err(unexpected(other)),
        }
    }

    /// Creates the file `path`, its bytes written by `write`, whole or not at all. The
    /// data is written under a temporary name of this put's own (`path` + [`COPYING`] +
    /// a random number), which `write` is given, and renamed to `path` once `write`
    /// succeeds. The rename fails if `path` exists, so of two puts to one path at once
    /// at most one succeeds, and that one leaves its own bytes there; the other fails
    /// with `AlreadyExists` and removes what it wrote, as any failed put does.
    pub async fn put_with<E, F, Fut>(
        &self,
        path: &str,
        replication: u32,
        write: F,
    ) -> Result<(), PutError<E>>
    where
        F: FnOnce(String) -> Fut,
        Fut: std::future::Future<Output = Result<(), E>>,
    {
        // Asked of the leader: a shadow may not know of a file just removed.
        let exists = self
            .master_from(Req::Stat(pb::StatRequest { path: path.into() }), false)
            .await;
        match exists {
            Ok(_) => return Err(PutError::Fs(FsError::AlreadyExists(path.to_string()))),
            Err(FsError::NotFound(_)) => {}
            Err(e) => return Err(PutError::Fs(e)),
        }
        // A name shared by every put to `path` would let one put delete or write into
        // another's file mid-copy, and rename the mixture into place as its own.
        let tmp = format!("{path}{COPYING}.{:016x}", self.rt.random_u64());
        // The temporary name is this put's own business: errors speak of `path`.
        let own = |e: FsError| {
            PutError::Fs(e.map_message(|m| {
                m.replace(&format!("{tmp:?}"), &format!("{path:?}"))
                    .replace(&tmp, path)
            }))
        };
        match self.create(&tmp, replication).await {
            // Nobody else uses this name: it exists because our first attempt made it
            // and its reply was lost.
            Ok(()) | Err(FsError::AlreadyExists(_)) => {}
            Err(e) => return Err(own(e)),
        }
        let result = match write(tmp.clone()).await {
            Ok(()) => self.rename(&tmp, path).await.map_err(own),
            Err(e) => Err(PutError::Write(e)),
        };
        if let Err(failed) = result {
            return Err(match self.delete(&tmp, false).await {
                Ok(()) => failed,
                // Not where it was made: an ancestor was renamed (or removed) meanwhile,
                // which also failed the put. The file has no name of its own to find it
                // by, so the caller is told where to look.
                Err(FsError::NotFound(_)) => PutError::Left {
                    failed: Box::new(failed),
                    name: tmp.rsplit('/').next().unwrap_or(&tmp).to_string(),
                },
                Err(e) => {
                    tracing::warn!(path = %tmp, error = %e, "a failed put could not remove its file");
                    failed
                }
            });
        }
        result
    }

    /// [`Client::put_with`] of `data`.
    pub async fn put(&self, path: &str, replication: u32, data: Bytes) -> Result<(), FsError> {
        let c = self.clone();
        self.put_with(path, replication, |tmp| async move {
            c.write(&tmp, 0, data).await
        })
        .await
        .map_err(|e| match e {
            PutError::Fs(e) | PutError::Write(e) => e,
            PutError::Left { failed, name } => match *failed {
                PutError::Fs(e) | PutError::Write(e) => e.map_message(|m| m + &left_note(&name)),
                PutError::Left { .. } => unreachable!("put_with nests no Left"),
            },
        })
    }

    /// The largest payload [`Client::append_record`] takes for a file with chunks of
    /// `chunk_size` bytes: a frame is at most a quarter of a chunk.
    pub fn max_record(chunk_size: u64) -> u64 {
        (chunk_size / 4).saturating_sub(record::HEADER as u64)
    }

    /// Record append of `payload`, framed (see [`record`]): atomically, at least once, at
    /// an offset the primary picks. Returns the file offset of the record's frame. A
    /// failed attempt is retried whole, so the record may appear more than once, and a
    /// failed attempt may leave garbage behind; [`Client::read_records`] skips both.
    pub async fn append_record(&self, path: &str, payload: &[u8]) -> Result<u64, FsError> {
        let id = self.rt.random_u64();
        self.record_append(path, record::frame(id, payload)).await
    }

    /// Record append of `data` as it is (the caller frames it): atomic, at least once, at
    /// an offset the primary picks, never across a chunk boundary. Returns its file offset.
    pub async fn record_append(&self, path: &str, data: Bytes) -> Result<u64, FsError> {
        let chunk_size = self.leader_locations(path).await?.chunk_size;
        if data.is_empty() || data.len() as u64 > chunk_size / 4 {
            return Err(FsError::InvalidArgument(format!(
                "a record append takes 1 to {} bytes, not {}",
                chunk_size / 4,
                data.len()
            )));
        }
        // Start at the chunk the last append here went to; the master moves us on to the
        // file's last chunk if there are more.
        let mut index = self.last_append_index(path);
        let mut retry = self.retry();
        loop {
            match self.record_append_once(path, index, data.clone()).await {
                Ok(Appended::At {
                    index: i,
                    offset,
                    chunk_size,
                    handle,
                }) => {
                    self.set_last_append_index(path, i);
                    let at = i * chunk_size + offset;
                    self.forget(path);
                    self.master_empty(Req::ExtendFile(pb::ExtendFileRequest {
                        path: path.into(),
                        length: at + data.len() as u64,
                        first_index: i,
                        handles: vec![handle],
                    }))
                    .await?;
                    return Ok(at);
                }
                // Padded: the next chunk. Not a failure, so no back-off.
                Ok(Appended::Full { index: i }) => {
                    index = i + 1;
                    continue;
                }
                Err(e) if e.is_retryable() => {
                    if !retry.pause(&self.rt, "record append", &e).await {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn last_append_index(&self, path: &str) -> u64 {
        self.append_index
            .lock()
            .expect("append index lock")
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    fn set_last_append_index(&self, path: &str, index: u64) {
        let mut m = self.append_index.lock().expect("append index lock");
        let e = m.entry(path.to_string()).or_default();
        *e = (*e).max(index);
    }

    async fn record_append_once(
        &self,
        path: &str,
        index: u64,
        data: Bytes,
    ) -> Result<Appended, FsError> {
        let t = self.write_target(path, index, true).await?;
        let result = async {
            let data_id = self.push(&t, &data).await?;
            let req = CReq::Append(pb::AppendChunkRequest {
                handle: t.handle,
                version: t.version,
                data: Bytes::new(),
                secondaries: t.secondaries.clone(),
                data_id,
                capability: t.capabilities.first().cloned(),
                secondary_capabilities: t.capabilities.iter().skip(1).cloned().collect(),
            });
            self.chunk_call(&t.primary, req).await
        }
        .await;
        if result.is_err() {
            self.forget_target(path, APPEND);
        }
        match result? {
            pb::ChunkResponse {
                resp: Some(CResp::Append(a)),
                ..
            } => Ok(if a.chunk_full {
                self.forget_target(path, APPEND);
                Appended::Full {
                    index: t.chunk_index,
                }
            } else {
                Appended::At {
                    index: t.chunk_index,
                    offset: a.offset,
                    chunk_size: t.chunk_size,
                    handle: t.handle,
                }
            }),
            other => Err(FsError::Internal(format!(
                "unexpected reply to a record append from {}: {other:?}",
                t.primary
            ))),
        }
    }

    /// Every record in the file, in file order, each once: padding, the remains of failed
    /// appends and duplicates are skipped.
    pub async fn read_records(&self, path: &str) -> Result<Vec<record::Record>, FsError> {
        let data = self.read(path, 0, u64::MAX).await?;
        let chunk_size = self.locations(path, false).await?.chunk_size;
        Ok(record::dedup(record::scan(&data, 0, chunk_size)))
    }

    /// The lease holder for chunk `index` of `path` (for an append: the last chunk, at
    /// `index` or later), from the cache while its lease lasts, else from the master.
    async fn write_target(
        &self,
        path: &str,
        index: u64,
        append: bool,
    ) -> Result<pb::WriteTarget, FsError> {
        let key = (path.to_string(), if append { APPEND } else { index });
        let now = self.rt.now();
        if let Some((t, until)) = self.targets.lock().expect("targets lock").get(&key)
            && now < *until
            && t.chunk_index >= index
        {
            return Ok(t.clone());
        }
        let t = match self
            .master(Req::GetWriteTarget(pb::GetWriteTargetRequest {
                path: path.into(),
                chunk_index: index,
                append,
            }))
            .await?
        {
            Resp::WriteTarget(t) => t,
            other => return Err(unexpected(other)),
        };
        // Stop using it a little early: the primary's clock may run ahead of ours.
        let lease = Duration::from_millis(t.lease_expires_in_ms);
        let until = self.rt.now() + lease.saturating_sub(lease / 10 + Duration::from_millis(500));
        self.targets
            .lock()
            .expect("targets lock")
            .insert(key, (t.clone(), until));
        Ok(t)
    }

    /// Writes `data` at `off` in chunk `idx`, placed there by the file's chunk size
    /// `chunk_size`.
    async fn write_piece(
        &self,
        path: &str,
        idx: u64,
        off: u64,
        data: Bytes,
        chunk_size: u64,
    ) -> Result<u64, FsError> {
        // Names the write in every attempt of it, for traces (each attempt has a number
        // of its own too).
        let write_seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let mut retry = self.retry();
        loop {
            let result = self
                .write_piece_once(path, idx, off, data.clone(), write_seq, chunk_size)
                .await;
            match result {
                Err(e) if e.is_retryable() => {
                    if !retry.pause(&self.rt, "write", &e).await {
                        return Err(e);
                    }
                }
                other => return other,
            }
        }
    }

    async fn write_piece_once(
        &self,
        path: &str,
        idx: u64,
        off: u64,
        data: Bytes,
        write_seq: u64,
        chunk_size: u64,
    ) -> Result<u64, FsError> {
        let t = self.write_target(path, idx, false).await?;
        if t.chunk_size != chunk_size {
            // The path names another file than the one the write was placed in (it was
            // replaced meanwhile), laid out in other chunks: writing here would put the
            // bytes at the wrong offsets. Forget what is cached, so the caller's next
            // attempt places the write again.
            self.forget_all(path);
            return Err(FsError::InvalidArgument(format!(
                "{path}: chunk size changed from {chunk_size} to {} (the file was replaced)",
                t.chunk_size
            )));
        }
        // The data goes first, to every replica along a chain; then the primary orders
        // the write, applies it and has the secondaries apply it, answering once all have.
        let result = async {
            let data_id = self.push(&t, &data).await?;
            // Every attempt has a number above this client's earlier ones: the primary
            // refuses an earlier attempt that arrives after a later one, so a retry's
            // forerunner, late on the network, cannot land over what was written since.
            let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let req = CReq::Write(pb::WriteChunkRequest {
                handle: t.handle,
                version: t.version,
                offset: off,
                data: Bytes::new(),
                secondaries: t.secondaries.clone(),
                client_id: self.id,
                client_seq: seq,
                data_id,
                write_seq,
                capability: t.capabilities.first().cloned(),
                secondary_capabilities: t.capabilities.iter().skip(1).cloned().collect(),
            });
            self.chunk_call(&t.primary, req).await
        }
        .await;
        if result.is_err() {
            self.forget_target(path, idx);
        }
        result.map(|_| t.handle)
    }

    /// The replicas of `t` in push order: from this client, each next one the nearest to
    /// the last (same rack before another rack), ties broken by address.
    fn chain(&self, t: &pb::WriteTarget) -> Vec<String> {
        let mut left: Vec<(String, String)> =
            std::iter::once((t.primary.clone(), t.primary_rack.clone()))
                .chain(
                    t.secondaries.iter().cloned().zip(
                        t.secondary_racks
                            .iter()
                            .cloned()
                            .chain(std::iter::repeat(String::new())),
                    ),
                )
                .collect();
        left.sort();
        let mut here = self.cfg.rack.clone();
        let mut chain = Vec::with_capacity(left.len());
        while !left.is_empty() {
            let i = left
                .iter()
                .position(|(_, r)| !r.is_empty() && *r == here)
                .unwrap_or(0);
            let (addr, rack) = left.remove(i);
            here = rack;
            chain.push(addr);
        }
        chain
    }

    /// Pushes `data` to every replica of `t`, pipelined: pieces go to the first server in
    /// the chain, which forwards each on as it arrives; several pieces are in flight at
    /// once. Returns the id the write names the data by (0 for no data).
    async fn push(&self, t: &pb::WriteTarget, data: &Bytes) -> Result<u64, FsError> {
        use futures::{StreamExt, TryStreamExt};
        if data.is_empty() {
            return Ok(0);
        }
        let chain = self.chain(t);
        let (first, rest) = chain.split_first().expect("a target has a primary");
        let id = self.rt.random_u64() | 1;
        let total = data.len() as u64;
        // Each server of the chain checks its own capability, and hands the rest on.
        let caps: Vec<pb::Capability> = chain
            .iter()
            .map(|a| target_capability(t, a).unwrap_or_default())
            .collect();
        let piece = self.cfg.push_piece.max(1);
        let offsets: Vec<u64> = (0..total).step_by(piece as usize).collect();
        futures::stream::iter(offsets)
            .map(|off| {
                let end = (off + piece).min(total);
                let req = CReq::Push(pb::PushDataRequest {
                    data_id: id,
                    offset: off,
                    total,
                    piece: data.slice(off as usize..end as usize),
                    chain: rest.to_vec(),
                    handle: t.handle,
                    capabilities: if t.capabilities.is_empty() {
                        Vec::new()
                    } else {
                        caps.clone()
                    },
                });
                self.chunk_call(first, req)
            })
            .buffer_unordered(self.cfg.push_window.max(1))
            .try_collect::<Vec<_>>()
            .await?;
        Ok(id)
    }
}

/// The capability `t` carries for the replica at `addr` (its primary, then its
/// secondaries, in order).
fn target_capability(t: &pb::WriteTarget, addr: &str) -> Option<pb::Capability> {
    let at = std::iter::once(&t.primary)
        .chain(&t.secondaries)
        .position(|a| a == addr)?;
    t.capabilities.get(at).cloned()
}

/// Appends a page's fsck files to those of the pages before, joining a file that went on
/// from one page to the next into one entry.
pub fn add_fsck_files(all: &mut Vec<pb::FsckFile>, page: Vec<pb::FsckFile>) {
    let mut files = page.into_iter().peekable();
    if let Some(f) = files.next_if(|f| f.continued) {
        match all.last_mut() {
            Some(last) if last.path == f.path => last.chunks.extend(f.chunks),
            // The file's first page listed none of its chunks: this entry is all of it.
            _ => all.push(pb::FsckFile {
                continued: false,
                ..f
            }),
        }
    }
    all.extend(files);
}

/// Adds an fsck page to the answer so far (files appended, totals summed, the rest from
/// the latest page); returns where the next page starts (`next`, `next_chunk`).
pub fn merge_fsck(all: &mut pb::FsckResponse, page: pb::FsckResponse) -> (String, u64) {
    add_fsck_files(&mut all.files, page.files);
    all.dirs += page.dirs;
    all.total_files += page.total_files;
    all.total_bytes += page.total_bytes;
    all.total_chunks += page.total_chunks;
    all.healthy += page.healthy;
    all.under_replicated += page.under_replicated;
    all.missing += page.missing;
    all.empty += page.empty;
    all.over_replicated += page.over_replicated;
    all.single_rack += page.single_rack;
    all.beyond_servers += page.beyond_servers;
    all.live_servers = page.live_servers;
    all.learning_for_ms = page.learning_for_ms;
    all.chunk_size = page.chunk_size;
    (page.next, page.next_chunk)
}

enum Appended {
    /// Written at `offset` in chunk `index`, of a file with chunks of `chunk_size` (as
    /// the master named it with the target).
    At {
        index: u64,
        offset: u64,
        chunk_size: u64,
        handle: u64,
    },
    Full {
        index: u64,
    },
}

fn unavailable(e: RpcError) -> FsError {
    FsError::Unavailable(e.to_string())
}

fn unexpected(r: Resp) -> FsError {
    FsError::Internal(format!("unexpected reply: {r:?}"))
}
