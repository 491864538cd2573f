//! Versions and clones: a grant's new version (and the lease with it), copies cloned from
//! another server, and deletions on the master's word.

use super::*;

/// Where a clone reads its copy from, and the master's leave to read it there.
#[derive(Clone, Debug)]
pub(super) struct Source {
    pub addr: String,
    pub capability: Option<pb::Capability>,
}

impl Chunkserver {
    pub(super) fn start_set_version(
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
                // A new version starts a new order of mutations.
                serial: 0,
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
        // the queue or made durable. The master counts from when it got the answer,
        // later, or, with none, from when it gave up plus the longest a request may
        // still arrive after (`MasterConfig::late_delivery`); so the holder's lease
        // always ends first.
        let lease = if r.lease_ms > 0 {
            if r.chunk_size == 0 || r.chunk_size > MAX_CHUNK_SIZE {
                return Err(FsError::InvalidArgument(format!(
                    "lease on chunk {h} with chunk size {}",
                    r.chunk_size
                )));
            }
            Some(LeaseGrant {
                until: arrived + Duration::from_millis(r.lease_ms),
                epoch: r.epoch,
                chunk_size: r.chunk_size,
                secondaries: r.names_secondaries.then(|| {
                    let mut s = r.secondaries.clone();
                    s.sort();
                    s
                }),
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

    pub(super) fn start_clone(
        &mut self,
        id: RequestId,
        r: pb::CloneChunkRequest,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        // Always copy: a copy here at the same version may be one that missed writes (a
        // grant it took too late), which its version cannot reveal. But never over a
        // newer one: an order to clone that arrives late (delayed, or sent twice) must
        // not take the copy back to an older version and its data.
        self.newer_than_clone(r.handle, r.version)?;
        let source = Source {
            addr: r.source,
            capability: r.source_capability,
        };
        self.clone_read(id, r.handle, r.version, source, BytesMut::new());
        Ok(None)
    }

    /// Refuses a clone of `h` at `version` if this server holds a newer version.
    pub(super) fn newer_than_clone(&self, h: ChunkHandle, version: Version) -> Result<(), FsError> {
        match self.chunks.get(&h) {
            Some(c) if c.meta.version > version => Err(FsError::StaleVersion(format!(
                "chunk {h}: have version {}, the clone is of {version}",
                c.meta.version
            ))),
            _ => Ok(()),
        }
    }

    pub(super) fn clone_read(
        &mut self,
        id: RequestId,
        h: ChunkHandle,
        version: Version,
        source: Source,
        buf: BytesMut,
    ) {
        let req = pb::ChunkRequest {
            req: Some(Req::Read(pb::ReadChunkRequest {
                handle: h,
                version,
                offset: buf.len() as u64,
                length: self.cfg.clone_piece,
                // The master's, given with the order: the source checks it as any
                // reader's.
                capability: source.capability.clone(),
            })),
        };
        self.call(
            Dest::Peer(source.addr.clone()),
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

    pub(super) fn on_clone_piece(
        &mut self,
        id: RequestId,
        h: ChunkHandle,
        version: Version,
        source: Source,
        mut buf: BytesMut,
        result: Result<Reply, RpcError>,
    ) {
        let piece = match result {
            Ok(Reply::Chunk(pb::ChunkResponse {
                error: None,
                resp: Some(Resp::Read(r)),
                ..
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
        if let Err(e) = self.room_for(h, buf.len() as u64) {
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

    pub(super) fn start_delete(&mut self, h: ChunkHandle, max: Version) {
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
}
