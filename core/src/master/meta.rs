//! The master's persistent state — the namespace and the chunk table's version, reference
//! count and goal — and the one function that changes it: `apply`, run on the live path
//! and on replay alike, so the two cannot drift. Checkpoints are this state, whole.

use crate::error::FsError;
use crate::pb::{self, log_record::Op};
use crate::types::HashMap;
use std::collections::{BTreeMap, BTreeSet};

use crate::types::{ChunkHandle, LogSeq, Version};

use super::chunks::ChunkTable;
use super::namespace::{Namespace, Node};
use super::perms::Perms;
use super::retries::{Completed, Retries};

#[derive(Debug)]
pub struct Meta {
    pub ns: Namespace,
    pub chunks: ChunkTable,
    /// The next chunk handle to give out; never reused.
    pub next_handle: ChunkHandle,
    /// Copies not to be trusted: (chunk, server address) -> the version they may falsely
    /// claim. Meaningful only while the chunk is still at that version.
    pub retired: BTreeMap<(ChunkHandle, String), Version>,
    /// The highest version a grant reserved, where above the chunk's version (a grant
    /// out or failed). The next grant goes above it.
    pub reserved: HashMap<ChunkHandle, Version>,
    /// The cluster's id (0 until its record is applied). Set once, by the first record of
    /// a log, and never changed: chunkservers hold the master to it.
    pub cluster_id: u64,
    /// The cluster's capability secret (`crate::capability`; empty until its record is
    /// applied). Set once, and never changed: every key a chunkserver holds derives
    /// from it.
    pub capability_secret: bytes::Bytes,
    /// The latest requests completed with a token: asked again, they are answered as
    /// before (see `retries.rs`).
    pub retries: Retries,
    /// Chunks with copies a grant demoted, kept as a last resort while the chunk is
    /// below its goal (`fallback.rs`), with every server that may hold its current
    /// version. Logged, so a restarted master keeps them too.
    pub fallbacks: BTreeMap<ChunkHandle, Fallback>,
    /// Servers that may hold a lease some master granted: (address, server id) -> the
    /// term of the master that named it (`LeaseHolderOp`, see `leases.rs`).
    pub lease_holders: BTreeMap<(String, u64), u64>,
    /// The latest term whose leader's quiet period ended (0: none). Only after one has
    /// are all the holders of leases that may be out named in the log: a log from before
    /// holders were named says nothing of its leases.
    pub leases_settled_in: u64,
    /// The epoch of the latest start of a master that runs alone (`MasterStartOp`; 0:
    /// none). Each start takes one more than every epoch and term the log names.
    pub master_epoch: u64,
    /// The chunk size of files whose create record (or checkpoint entry) names none: the
    /// master's configured default when it recovers. Records made before files kept
    /// their own size have none; no cluster was deployed then, so this only serves old
    /// development data directories, whose files were all written at the default of
    /// their day (a master started with another one reads them wrong, as it always did).
    /// Not persistent state itself: every record made now names the size.
    pub default_chunk_size: u64,
}

/// A chunk's demoted copies and the holders of its current version (see `fallback.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fallback {
    /// Server address -> the version its demoted copy holds (below the chunk's).
    pub demoted: BTreeMap<String, Version>,
    /// Every server that may hold the chunk's current version: those that took it, each
    /// clone target (logged before the clone starts), each server found holding it. One
    /// leaves only when its copy is known destroyed.
    pub holders: BTreeSet<String>,
    /// Versions every copy of which is demoted when reported, but on the servers named
    /// (see `SetVersionOp::demoted_any`): each grant that left the chunk below its goal
    /// adds the version it left, up to the one it gave.
    pub any_at: BTreeMap<Version, Level>,
}

/// The copies a grant demoted as their servers report them: those at the version it
/// left (the key in `Fallback::any_at`), or at any version below the one it gave (a
/// version reserved for a grant that a crash cut short: never current, so no write was
/// acknowledged under it), but on the servers in `not` (retired at the version left).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Level {
    /// The version the grant gave: the first one not at this level.
    pub until: Version,
    pub not: BTreeSet<String>,
}

/// What an applied record did beyond the state change, for the master to follow up.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Chunks whose last reference went: their replicas are garbage now.
    pub reclaimed: Vec<ChunkHandle>,
}

impl Meta {
    /// An empty state; `default_chunk_size` as on the field.
    pub fn new(default_chunk_size: u64) -> Meta {
        Meta {
            ns: Namespace::new(),
            chunks: ChunkTable::default(),
            next_handle: 1,
            retired: BTreeMap::new(),
            reserved: HashMap::default(),
            cluster_id: 0,
            capability_secret: bytes::Bytes::new(),
            retries: Retries::default(),
            fallbacks: BTreeMap::new(),
            lease_holders: BTreeMap::new(),
            leases_settled_in: 0,
            master_epoch: 0,
            default_chunk_size,
        }
    }

    /// A file's chunk size as a record or checkpoint entry gives it (0: none given).
    fn chunk_size_or_default(&self, given: u64) -> u64 {
        match given {
            0 => self.default_chunk_size,
            n => n,
        }
    }

    /// The highest master epoch or group term the log names: a master that runs alone
    /// starts in the next one (`Master::start_alone`).
    pub fn latest_epoch(&self) -> u64 {
        let holders = self.lease_holders.values().copied().max().unwrap_or(0);
        self.master_epoch.max(self.leases_settled_in).max(holders)
    }

    /// Applies one record. On the live path an error means the operation is refused and
    /// nothing is logged; on replay it means the log is corrupt.
    pub fn apply(&mut self, rec: &pb::LogRecord) -> Result<Applied, FsError> {
        let t = rec.time_ms;
        let mut out = Applied::default();
        // Checked before anything changes: an error leaves the state as it was.
        let done = match rec.token {
            0 => None,
            token => Some(rec.op.as_ref().and_then(Completed::of).ok_or_else(|| {
                FsError::Internal(format!("token {token:#x} on a record no request makes"))
            })?),
        };
        match &rec.op {
            None => return Err(FsError::InvalidArgument("log record without an op".into())),
            Some(Op::Mkdir(o)) => {
                self.ns
                    .with_perms(o.perms.as_ref(), Perms::LEGACY_DIR, |ns, p| {
                        ns.mkdir(&o.path, t, p)
                    })?
            }
            Some(Op::Create(o)) => {
                let r = u8::try_from(o.replication)
                    .map_err(|_| FsError::InvalidArgument("replication above 255".into()))?;
                let chunk_size = self.chunk_size_or_default(o.chunk_size);
                self.ns
                    .with_perms(o.perms.as_ref(), Perms::LEGACY_FILE, |ns, p| {
                        ns.create(&o.path, r, chunk_size, t, p)
                    })?
            }
            Some(Op::SetPermissions(o)) => {
                let now = self.ns.perms(&o.path)?;
                let names = &self.ns.names;
                let new = pb::Permissions {
                    owner: match o.owner.as_str() {
                        "" => names.name(now.owner).to_string(),
                        s => s.to_string(),
                    },
                    group: match o.group.as_str() {
                        "" => names.name(now.group).to_string(),
                        s => s.to_string(),
                    },
                    mode: o.mode.unwrap_or(now.mode.into()),
                };
                self.ns
                    .with_perms(Some(&new), now, |ns, p| ns.set_perms(&o.path, p))?
            }
            Some(Op::Rename(o)) => self.ns.rename(&o.src, &o.dst)?,
            Some(Op::Remove(o)) => {
                for h in self.ns.remove(&o.path)? {
                    if self.chunks.unref(h) {
                        out.reclaimed.push(h);
                    }
                }
            }
            Some(Op::AddChunk(o)) => {
                let f = self.ns.file(&o.path)?;
                if o.handle < self.next_handle || self.chunks.get(o.handle).is_some() {
                    return Err(FsError::Internal(format!(
                        "chunk handle {} reused",
                        o.handle
                    )));
                }
                let goal = f.replication;
                self.ns.add_chunk(&o.path, o.handle)?;
                self.chunks.insert(o.handle, 0, goal);
                self.next_handle = o.handle + 1;
            }
            Some(Op::SetVersion(o)) => {
                let c = self.chunks.get_mut(o.handle).ok_or_else(|| {
                    FsError::ChunkNotFound(format!("set version of unknown chunk {}", o.handle))
                })?;
                if o.version < c.version {
                    return Err(FsError::Internal(format!(
                        "chunk {} version would go back from {} to {}",
                        o.handle, c.version, o.version
                    )));
                }
                let fallback = !o.demoted.is_empty()
                    || o.demoted_any != 0
                    || self.fallbacks.contains_key(&o.handle);
                if fallback && o.holders.is_empty() {
                    return Err(FsError::Internal(format!(
                        "chunk {}: version {} with fallbacks names no holder",
                        o.handle, o.version
                    )));
                }
                if let Some(v) = o
                    .demoted
                    .iter()
                    .map(|d| d.version)
                    .chain((o.demoted_any != 0).then_some(o.demoted_any))
                    .find(|&v| v >= o.version)
                {
                    return Err(FsError::Internal(format!(
                        "chunk {}: copies demoted at version {v} by version {}",
                        o.handle, o.version
                    )));
                }
                c.version = o.version;
                if fallback {
                    let f = self.fallbacks.entry(o.handle).or_default();
                    for d in &o.demoted {
                        f.demoted.insert(d.address.clone(), d.version);
                    }
                    f.holders = o.holders.iter().cloned().collect();
                    for a in &o.holders {
                        f.demoted.remove(a);
                    }
                    if o.demoted_any != 0 {
                        let level = Level {
                            until: o.version,
                            not: o.not_demoted.iter().cloned().collect(),
                        };
                        f.any_at.insert(o.demoted_any, level);
                    }
                }
                if self
                    .reserved
                    .get(&o.handle)
                    .is_some_and(|&r| r <= o.version)
                {
                    self.reserved.remove(&o.handle);
                }
            }
            Some(Op::ReserveVersion(o)) => {
                let c = self.chunks.get(o.handle).ok_or_else(|| {
                    FsError::ChunkNotFound(format!(
                        "reserve a version of unknown chunk {}",
                        o.handle
                    ))
                })?;
                if o.version <= c.version {
                    return Err(FsError::Internal(format!(
                        "chunk {}: reserving version {} at version {}",
                        o.handle, o.version, c.version
                    )));
                }
                let r = self.reserved.entry(o.handle).or_insert(o.version);
                *r = (*r).max(o.version);
            }
            Some(Op::SetLength(o)) => {
                if o.append_offset > o.length {
                    return Err(FsError::Internal(format!(
                        "{}: append region from {} to {}",
                        o.path, o.append_offset, o.length
                    )));
                }
                self.ns.set_length(&o.path, o.length, t)?
            }
            Some(Op::LeaseHolder(o)) => match (o.address.is_empty(), o.forget_before) {
                (false, 0) => {
                    let key = (o.address.clone(), o.server_id);
                    let t = self.lease_holders.entry(key).or_insert(o.term);
                    *t = (*t).max(o.term);
                }
                (true, before) if before > 0 => {
                    self.lease_holders.retain(|_, t| *t >= before);
                    self.leases_settled_in = self.leases_settled_in.max(before);
                }
                _ => {
                    return Err(FsError::Internal(format!(
                        "a lease holder record names {:?} and forgets before term {}",
                        o.address, o.forget_before
                    )));
                }
            },
            Some(Op::MasterStart(o)) => {
                // Epochs only grow: one that does not was never logged by a master.
                if o.epoch <= self.master_epoch {
                    return Err(FsError::Internal(format!(
                        "master start in epoch {} after epoch {}",
                        o.epoch, self.master_epoch
                    )));
                }
                self.master_epoch = o.epoch;
            }
            Some(Op::ClusterId(o)) => {
                // A second id would turn away every chunkserver that took the first.
                if self.cluster_id != 0 || o.cluster_id == 0 {
                    return Err(FsError::Internal(format!(
                        "cluster id {} where the cluster has id {}",
                        o.cluster_id, self.cluster_id
                    )));
                }
                if let Some(root) = &o.root {
                    self.ns
                        .with_perms(Some(root), Perms::LEGACY_DIR, |ns, p| ns.set_perms("/", p))?;
                }
                self.cluster_id = o.cluster_id;
            }
            Some(Op::CapabilitySecret(o)) => {
                // A second secret would void every capability signed with the first.
                if !self.capability_secret.is_empty()
                    || o.secret.len() != crate::capability::SECRET_BYTES
                {
                    return Err(FsError::Internal(format!(
                        "a capability secret of {} bytes where the cluster has {}",
                        o.secret.len(),
                        self.capability_secret.len()
                    )));
                }
                self.capability_secret = o.secret.clone();
            }
            Some(Op::Fallback(o)) => {
                if self.chunks.get(o.handle).is_none() {
                    return Err(FsError::ChunkNotFound(format!(
                        "fallback of unknown chunk {}",
                        o.handle
                    )));
                }
                use pb::Fallback as K;
                let version = self.chunks.get(o.handle).map_or(0, |c| c.version);
                match K::try_from(o.kind) {
                    Ok(K::Demoted) => {
                        let f = self.fallbacks.get_mut(&o.handle).ok_or_else(|| {
                            FsError::Internal(format!("chunk {} has no fallbacks", o.handle))
                        })?;
                        if o.version >= version {
                            return Err(FsError::Internal(format!(
                                "chunk {} at version {version}: {} demoted at version {}",
                                o.handle, o.address, o.version
                            )));
                        }
                        f.demoted.insert(o.address.clone(), o.version);
                    }
                    Ok(K::Forget) => {
                        self.fallbacks.remove(&o.handle);
                    }
                    Ok(kind @ (K::Holder | K::NotHolder | K::Gone)) => {
                        let f = self.fallbacks.get_mut(&o.handle).ok_or_else(|| {
                            FsError::Internal(format!("chunk {} has no fallbacks", o.handle))
                        })?;
                        match kind {
                            K::Holder => {
                                f.holders.insert(o.address.clone());
                            }
                            K::NotHolder => {
                                f.holders.remove(&o.address);
                            }
                            _ => {
                                f.demoted.remove(&o.address);
                            }
                        }
                    }
                    _ => {
                        return Err(FsError::Internal(format!(
                            "fallback record of kind {}",
                            o.kind
                        )));
                    }
                }
            }
            Some(Op::RetireReplica(o)) => {
                if self.chunks.get(o.handle).is_none() {
                    return Err(FsError::ChunkNotFound(format!(
                        "retire a copy of unknown chunk {}",
                        o.handle
                    )));
                }
                if o.lift {
                    self.retired.remove(&(o.handle, o.address.clone()));
                } else {
                    self.retired
                        .insert((o.handle, o.address.clone()), o.version);
                }
            }
        }
        // A name moved away or removed: regions given in the file(s) it named belong
        // to no file a later request can reach by that name.
        match &rec.op {
            Some(Op::Rename(o)) => self.retries.forget_appends_under(&o.src),
            Some(Op::Remove(o)) => self.retries.forget_appends_under(&o.path),
            _ => {}
        }
        if let Some(done) = done {
            self.retries.insert(rec.token, done);
        }
        // Orders about versions the chunk has left, or chunks that are gone, are moot.
        if matches!(&rec.op, Some(Op::SetVersion(_)) | Some(Op::Remove(_))) {
            let chunks = &self.chunks;
            self.retired
                .retain(|(h, _), v| chunks.get(*h).is_some_and(|c| c.version == *v));
        }
        for h in &out.reclaimed {
            self.reserved.remove(h);
            self.fallbacks.remove(h);
        }
        Ok(out)
    }

    /// The checkpoint of this state through record `through_seq`: its pieces, merged.
    pub fn checkpoint(&self, through_seq: LogSeq) -> pb::Checkpoint {
        let mut pieces = self.checkpoint_pieces(through_seq);
        let mut cp = pieces.next().expect("the scalars come first");
        for piece in pieces {
            // Named field by field, so a field added to the message does not compile
            // here until it is given a piece.
            let pb::Checkpoint {
                through_seq: 0,
                next_handle: 0,
                entries,
                chunks,
                retired,
                reserved,
                cluster_id: 0,
                completed,
                fallbacks,
                group_members,
                group_retired,
                lease_holders,
                leases_settled_in: 0,
                master_epoch: 0,
                capability_secret,
                root: None,
            } = piece
            else {
                panic!("a piece after the first sets a scalar");
            };
            assert!(group_members.is_empty() && group_retired.is_empty());
            assert!(
                capability_secret.is_empty(),
                "a piece after the first sets a scalar"
            );
            cp.entries.extend(entries);
            cp.chunks.extend(chunks);
            cp.retired.extend(retired);
            cp.reserved.extend(reserved);
            cp.completed.extend(completed);
            cp.fallbacks.extend(fallbacks);
            cp.lease_holders.extend(lease_holders);
        }
        cp
    }

    /// The checkpoint through record `through_seq` in pieces, each built as it is
    /// taken, so that it is never whole in memory: first its scalars, then each item of
    /// each repeated field alone (entries, chunks, retired copies, reservations,
    /// fallbacks, completed requests, lease holders). The encodings of the pieces, end
    /// to end, are an encoding of the whole (a protobuf message merges what it
    /// decodes). A group's snapshot adds its members (`group::members`).
    pub fn checkpoint_pieces(
        &self,
        through_seq: LogSeq,
    ) -> impl Iterator<Item = pb::Checkpoint> + '_ {
        let scalars = pb::Checkpoint {
            through_seq,
            cluster_id: self.cluster_id,
            next_handle: self.next_handle,
            leases_settled_in: self.leases_settled_in,
            master_epoch: self.master_epoch,
            capability_secret: self.capability_secret.clone(),
            root: Some(self.ns.names.to_pb(self.ns.root)),
            ..Default::default()
        };
        let entries = self.ns.walk().map(|e| pb::Checkpoint {
            entries: vec![checkpoint_entry(&self.ns, e)],
            ..Default::default()
        });
        let chunks = self.chunks.iter().map(|(handle, c)| pb::Checkpoint {
            chunks: vec![pb::CheckpointChunk {
                handle,
                version: c.version,
                refcount: c.refcount,
                goal: c.goal.into(),
            }],
            ..Default::default()
        });
        let retired = self
            .retired
            .iter()
            .map(|((handle, address), version)| pb::Checkpoint {
                retired: vec![pb::RetireReplicaOp {
                    handle: *handle,
                    address: address.clone(),
                    version: *version,
                    lift: false,
                }],
                ..Default::default()
            });
        // In handle order, for a checkpoint that does not depend on a hash map's: the
        // pairs are sorted whole (16 bytes for each chunk with a grant out or failed).
        let mut reserved: Vec<(ChunkHandle, Version)> =
            self.reserved.iter().map(|(&h, &v)| (h, v)).collect();
        reserved.sort_unstable();
        let reserved = reserved
            .into_iter()
            .map(|(handle, version)| pb::Checkpoint {
                reserved: vec![pb::ChunkVersion { handle, version }],
                ..Default::default()
            });
        let fallbacks = self.fallbacks.iter().map(|(&handle, f)| pb::Checkpoint {
            fallbacks: vec![pb::FallbackEntry {
                handle,
                demoted: f
                    .demoted
                    .iter()
                    .map(|(address, &version)| pb::DemotedCopy {
                        address: address.clone(),
                        version,
                    })
                    .collect(),
                holders: f.holders.iter().cloned().collect(),
                levels: f
                    .any_at
                    .iter()
                    .map(|(&version, l)| pb::DemotedLevel {
                        version,
                        not_demoted: l.not.iter().cloned().collect(),
                        until: l.until,
                    })
                    .collect(),
            }],
            ..Default::default()
        });
        let completed = self.retries.iter().map(|(token, c)| pb::Checkpoint {
            completed: vec![pb::Completed {
                token,
                path: c.path.clone(),
                offset: c.append.map_or(0, |a| a.0),
                length: c.append.map_or(0, |a| a.1),
                append: c.append.is_some(),
            }],
            ..Default::default()
        });
        let lease_holders = self
            .lease_holders
            .iter()
            .map(|((address, server_id), &term)| pb::Checkpoint {
                lease_holders: vec![pb::LeaseHolderOp {
                    address: address.clone(),
                    term,
                    forget_before: 0,
                    server_id: *server_id,
                }],
                ..Default::default()
            });
        std::iter::once(scalars)
            .chain(entries)
            .chain(chunks)
            .chain(retired)
            .chain(reserved)
            .chain(fallbacks)
            .chain(completed)
            .chain(lease_holders)
    }

    /// The state a checkpoint (if any) and the durable records after it describe, and
    /// the last record applied. Records the checkpoint covers are skipped; a gap, or a
    /// record that does not apply, is an error. `default_chunk_size` as on the field.
    pub fn replay<R: std::borrow::Borrow<pb::LogRecord>>(
        default_chunk_size: u64,
        checkpoint: Option<&pb::Checkpoint>,
        tail: impl IntoIterator<Item = (LogSeq, R)>,
    ) -> Result<(Meta, LogSeq), FsError> {
        let (mut meta, mut seq) = match checkpoint {
            // Files from before each kept its own chunk size take the configured one.
            Some(cp) => (Meta::restore(cp, default_chunk_size)?, cp.through_seq),
            None => (Meta::new(default_chunk_size), 0),
        };
        let base = seq;
        for (s, rec) in tail {
            if s <= base {
                continue;
            }
            if s != seq + 1 {
                return Err(FsError::Internal(format!(
                    "op log has a gap: record {s} follows {seq}"
                )));
            }
            meta.apply(rec.borrow())
                .map_err(|e| FsError::Internal(format!("op log record {s} does not apply: {e}")))?;
            seq = s;
        }
        Ok((meta, seq))
    }

    /// Rebuilds the state from a checkpoint, checking it for consistency: a checkpoint
    /// comes from disk, and a bad one must be an error, not a crash.
    /// `default_chunk_size` as on the field.
    pub fn restore(cp: &pb::Checkpoint, default_chunk_size: u64) -> Result<Meta, FsError> {
        let bad = |m: String| FsError::Internal(format!("corrupt checkpoint: {m}"));
        let mut meta = Meta::new(default_chunk_size);
        meta.next_handle = cp.next_handle.max(1);
        meta.cluster_id = cp.cluster_id;
        if !cp.capability_secret.is_empty()
            && cp.capability_secret.len() != crate::capability::SECRET_BYTES
        {
            return Err(bad(format!(
                "a capability secret of {} bytes",
                cp.capability_secret.len()
            )));
        }
        meta.capability_secret = cp.capability_secret.clone();
        for c in &cp.chunks {
            if c.refcount == 0
                || meta.chunks.get(c.handle).is_some()
                || c.handle >= meta.next_handle
            {
                return Err(bad(format!("chunk {}", c.handle)));
            }
            let goal = u8::try_from(c.goal).map_err(|_| bad(format!("goal of {}", c.handle)))?;
            meta.chunks.insert(c.handle, c.version, goal);
            meta.chunks
                .get_mut(c.handle)
                .expect("just inserted")
                .refcount = c.refcount;
        }
        let mut refs: crate::types::HashMap<ChunkHandle, u32> = Default::default();
        meta.ns
            .with_perms(cp.root.as_ref(), Perms::LEGACY_DIR, |ns, p| {
                ns.set_perms("/", p)
            })?;
        for e in &cp.entries {
            if e.is_dir {
                meta.ns
                    .with_perms(e.perms.as_ref(), Perms::LEGACY_DIR, |ns, p| {
                        ns.mkdir(&e.path, e.mtime_ms, p)
                    })?;
                continue;
            }
            let r = u8::try_from(e.replication).map_err(|_| bad(e.path.clone()))?;
            let chunk_size = meta.chunk_size_or_default(e.chunk_size);
            meta.ns
                .with_perms(e.perms.as_ref(), Perms::LEGACY_FILE, |ns, p| {
                    ns.create(&e.path, r, chunk_size, e.mtime_ms, p)
                })?;
            for &h in &e.chunks {
                if meta.chunks.get(h).is_none() {
                    return Err(bad(format!("{} names unknown chunk {h}", e.path)));
                }
                *refs.entry(h).or_default() += 1;
                meta.ns.add_chunk(&e.path, h)?;
            }
            meta.ns.set_length(&e.path, e.length, e.mtime_ms)?;
        }
        for (h, c) in meta.chunks.iter() {
            if refs.get(&h).copied().unwrap_or(0) != c.refcount {
                return Err(bad(format!("chunk {h} reference count")));
            }
        }
        for r in &cp.retired {
            if meta.chunks.get(r.handle).is_none() {
                return Err(bad(format!("retired copy of unknown chunk {}", r.handle)));
            }
            meta.retired
                .insert((r.handle, r.address.clone()), r.version);
        }
        for r in &cp.reserved {
            match meta.chunks.get(r.handle) {
                Some(c) if r.version > c.version => {
                    meta.reserved.insert(r.handle, r.version);
                }
                _ => return Err(bad(format!("reserved version of chunk {}", r.handle))),
            }
        }
        for l in &cp.lease_holders {
            if l.address.is_empty() || l.forget_before != 0 {
                return Err(bad(format!("lease holder {l:?}")));
            }
            meta.lease_holders
                .insert((l.address.clone(), l.server_id), l.term);
        }
        meta.leases_settled_in = cp.leases_settled_in;
        meta.master_epoch = cp.master_epoch;
        for e in &cp.fallbacks {
            let Some(c) = meta.chunks.get(e.handle) else {
                return Err(bad(format!("fallbacks of unknown chunk {}", e.handle)));
            };
            if e.demoted.iter().any(|d| d.version >= c.version)
                || e.levels.iter().any(|l| {
                    l.version >= c.version
                        || l.version == 0
                        || l.until > c.version
                        || (l.until != 0 && l.until <= l.version)
                })
                || meta.fallbacks.contains_key(&e.handle)
            {
                return Err(bad(format!("fallbacks of chunk {}", e.handle)));
            }
            meta.fallbacks.insert(
                e.handle,
                Fallback {
                    demoted: e
                        .demoted
                        .iter()
                        .map(|d| (d.address.clone(), d.version))
                        .collect(),
                    holders: e.holders.iter().cloned().collect(),
                    any_at: e
                        .levels
                        .iter()
                        .map(|l| {
                            let level = Level {
                                // Written before levels had an end: the version alone.
                                until: if l.until == 0 { l.version + 1 } else { l.until },
                                not: l.not_demoted.iter().cloned().collect(),
                            };
                            (l.version, level)
                        })
                        .collect(),
                },
            );
        }
        for c in &cp.completed {
            if c.token == 0 || c.offset.checked_add(c.length).is_none() {
                return Err(bad(format!("completed request {:#x}", c.token)));
            }
            meta.retries.insert(
                c.token,
                Completed {
                    path: c.path.clone(),
                    append: c.append.then_some((c.offset, c.length)),
                },
            );
        }
        Ok(meta)
    }

    /// A canonical dump of the whole state, for tests that compare two masters.
    pub fn fingerprint(&self) -> pb::Checkpoint {
        self.checkpoint(0)
    }
}

/// A namespace entry as a checkpoint holds it.
fn checkpoint_entry(ns: &Namespace, (path, node): (String, &Node)) -> pb::CheckpointEntry {
    let perms = Some(ns.names.to_pb(node.perms()));
    match node {
        Node::Dir { mtime_ms, .. } => pb::CheckpointEntry {
            path,
            is_dir: true,
            mtime_ms: *mtime_ms,
            perms,
            ..Default::default()
        },
        Node::File(f) => pb::CheckpointEntry {
            path,
            is_dir: false,
            mtime_ms: f.mtime_ms,
            length: f.length,
            replication: f.replication.into(),
            chunks: f.chunks.to_vec(),
            chunk_size: f.chunk_size.into(),
            perms,
        },
    }
}
