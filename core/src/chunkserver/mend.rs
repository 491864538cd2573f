//! Mending: a corrupt copy that is the last of its chunk's current version is rebuilt
//! block by block from other copies, where their bytes match this copy's own checksums.
//!
//! A copy that fails a checksum is normally deleted once the master has another (GFS
//! §5.2). When it is the only copy of the current version (the others missed a version
//! change and were kept as older fallbacks), deleting it would lose every mutation made
//! at that version, though the rot is usually in a block those mutations never touched.
//! The master then orders a mend instead, naming the other copies. The bytes of each bad
//! block are taken from a source where the source has them, and kept from this copy past
//! the end of the source's data; the block is accepted only if it matches the checksum
//! this copy recorded when it wrote the block, so nothing unverified is ever served. A
//! block no source matches cannot be rebuilt: the mend fails and the copy stays corrupt.

use super::*;

const B: usize = BLOCK_SIZE as usize;

/// A mend under way: the copy's data as read, the blocks still bad, and where to look.
#[derive(Debug)]
pub(super) struct Mend {
    id: RequestId,
    h: ChunkHandle,
    meta: pb::ChunkMeta,
    sources: Vec<pb::MendSource>,
    data: Vec<u8>,
    /// The bad blocks, in order; `next` is the one being fetched.
    bad: Vec<usize>,
    next: usize,
    /// The source being asked for block `bad[next]`.
    source: usize,
    /// Sources that failed to answer (unreachable, refused): not asked again.
    failed: Vec<bool>,
    /// A source gave no bytes for the current block (an error, or no answer): its
    /// failing is then no proof that the block cannot be mended.
    unread: bool,
    /// The copy was being served when the order came (read back from disk after a
    /// restart, its rot not yet found): it is verified, and taken out of service only if
    /// a block is bad.
    served: bool,
}

impl Mend {
    pub(super) fn id(&self) -> RequestId {
        self.id
    }

    pub(super) fn handle(&self) -> ChunkHandle {
        self.h
    }
}

impl Chunkserver {
    pub(super) fn start_mend(
        &mut self,
        id: RequestId,
        r: pb::MendChunkRequest,
    ) -> Result<Option<pb::ChunkResponse>, FsError> {
        let h = r.handle;
        // One mend at a time on a server: each holds a whole chunk in memory.
        let busy = self.pending.values().any(|p| matches!(p, Pending::Mend(_)))
            || self
                .calls
                .values()
                .any(|c| matches!(c, CallCtx::MendRead(_)));
        if busy {
            return Err(FsError::Unavailable(format!(
                "{} is mending another chunk",
                self.cfg.address
            )));
        }
        let served = self.chunks.get(&h).map(|c| c.meta.clone());
        let meta = match served.as_ref().or(self.kept.get(&h)) {
            Some(m) if m.version == r.version => m.clone(),
            Some(m) => {
                return Err(FsError::StaleVersion(format!(
                    "chunk {h}: the copy here is of version {}, the mend is of {}",
                    m.version, r.version
                )));
            }
            None => {
                return Err(FsError::ChunkNotFound(format!(
                    "chunk {h} on {}: no corrupt copy to mend",
                    self.cfg.address
                )));
            }
        };
        let length = meta.length;
        self.store(
            Pending::Mend(Box::new(Mend {
                id,
                h,
                meta,
                failed: vec![false; r.sources.len()],
                unread: false,
                sources: r.sources,
                data: Vec::new(),
                bad: Vec::new(),
                next: 0,
                source: 0,
                served: served.is_some(),
            })),
            StoreOp::Read {
                handle: h,
                ranges: vec![(0, length)],
            },
        );
        Ok(None)
    }

    /// The copy as read from disk: find its bad blocks and start fetching the first.
    pub(super) fn mend_read(&mut self, mut m: Box<Mend>, data: Bytes) {
        if data.len() as u64 != m.meta.length {
            if m.served {
                self.mark_corrupt(m.h, false);
            }
            return self.mend_failed(&m, "its data is shorter than its metadata says".to_string());
        }
        m.bad = data
            .chunks(B)
            .enumerate()
            .filter(|&(i, block)| m.meta.checksums.get(i) != Some(&crc32c::crc32c(block)))
            .map(|(i, _)| i)
            .collect();
        if m.served && !m.bad.is_empty() {
            // Its rot found only now: out of service, and reported, like any.
            self.mark_corrupt(m.h, false);
            m.served = false;
        }
        m.data = data.to_vec();
        if !m.bad.is_empty() {
            tracing::info!(chunk = m.h, server = %self.cfg.address, bad = m.bad.len(), sources = m.sources.len(), "mending a corrupt copy");
        }
        self.mend_next(m);
    }

    /// Asks the current source for the current bad block, or stores the copy once no
    /// bad block is left.
    fn mend_next(&mut self, mut m: Box<Mend>) {
        let Some(&block) = m.bad.get(m.next) else {
            let (id, h, meta) = (m.id, m.h, m.meta.clone());
            if m.served {
                // Verified whole where it stands: nothing to rewrite.
                return self.done(h, id, empty());
            }
            debug_assert!(checksum::verify(&meta.checksums, 0, &m.data).is_ok());
            tracing::info!(chunk = h, server = %self.cfg.address, blocks = m.bad.len(), "corrupt copy mended");
            self.store(
                Pending::Commit {
                    id: Some(id),
                    h,
                    meta: Some(meta.clone()),
                    lease: None,
                },
                StoreOp::Replace {
                    handle: h,
                    data: Bytes::from(m.data),
                    meta,
                },
            );
            return;
        };
        while m.failed.get(m.source) == Some(&true) {
            m.source += 1;
        }
        let Some(src) = m.sources.get(m.source) else {
            if m.unread || m.failed.iter().any(|&f| f) {
                // Some source could not be read: another try may find it.
                let e = FsError::Unavailable(format!(
                    "chunk {} on {}: block {block} could not be read from every other copy",
                    m.h, self.cfg.address
                ));
                tracing::warn!(chunk = m.h, server = %self.cfg.address, block, "a mend found no source it could read");
                return self.done(m.h, m.id, err(e));
            }
            let why = format!(
                "block {block} matches no other copy ({} asked)",
                m.sources.len()
            );
            return self.mend_failed(&m, why);
        };
        let start = block * B;
        let len = B.min(m.data.len() - start);
        let req = pb::ChunkRequest {
            req: Some(Req::Read(pb::ReadChunkRequest {
                handle: m.h,
                version: src.version,
                offset: start as u64,
                length: len as u64,
                // The master's leave, given with the order.
                capability: src.capability.clone(),
            })),
        };
        let to = src.address.clone();
        self.call(Dest::Peer(to), Outgoing::Chunk(req), CallCtx::MendRead(m));
    }

    /// A source's answer for the current block: taken if, with this copy's own bytes past
    /// the end of the source's, it matches the block's recorded checksum.
    pub(super) fn on_mend_piece(&mut self, mut m: Box<Mend>, result: Result<Reply, RpcError>) {
        let block = m.bad[m.next];
        let start = block * B;
        let len = B.min(m.data.len() - start);
        let fits = match result {
            Ok(Reply::Chunk(pb::ChunkResponse {
                error: None,
                resp: Some(Resp::Read(r)),
                ..
            })) if r.data.len() <= len => {
                let mut candidate = m.data[start..start + len].to_vec();
                candidate[..r.data.len()].copy_from_slice(&r.data);
                let fits = m.meta.checksums.get(block) == Some(&crc32c::crc32c(&candidate));
                if fits {
                    m.data[start..start + len].copy_from_slice(&candidate);
                }
                fits
            }
            // Its copy is there but corrupt too, or older than asked, or gone: asked
            // again for the next block all the same (another block of it may do).
            Ok(Reply::Chunk(pb::ChunkResponse { error: Some(_), .. })) => {
                m.unread = true;
                false
            }
            // Unreachable, or an answer that makes no sense: not asked again.
            Ok(_) | Err(_) => {
                m.failed[m.source] = true;
                false
            }
        };
        if fits {
            tracing::debug!(chunk = m.h, block, source = %m.sources[m.source].address, "block mended");
            m.next += 1;
            m.source = 0;
            m.unread = false;
        } else {
            m.source += 1;
        }
        self.mend_next(m);
    }

    fn mend_failed(&mut self, m: &Mend, why: String) {
        tracing::warn!(chunk = m.h, server = %self.cfg.address, %why, "corrupt copy cannot be mended");
        let e = FsError::Corrupt(format!(
            "chunk {} on {}: cannot be mended: {why}",
            m.h, self.cfg.address
        ));
        self.done(m.h, m.id, err(e));
    }
}
