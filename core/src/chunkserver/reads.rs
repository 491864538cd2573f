//! Reads: each byte verified against its block checksum before it leaves; a mismatch
//! marks the copy corrupt, tells the master, and the copy is never served again.

use super::*;

impl Chunkserver {
    pub(super) fn start_read(
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

    pub(super) fn finish_read(
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
    pub(super) fn found_corrupt(&mut self, h: ChunkHandle, id: RequestId) {
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

    pub(super) fn mark_corrupt(&mut self, h: ChunkHandle, by_scrubber: bool) {
        tracing::warn!(chunk = h, server = %self.cfg.address, "checksum mismatch");
        let mut version = 0;
        if let Some(c) = self.forget_chunk(h) {
            version = c.meta.version;
            self.kept.insert(h, c.meta);
        }
        self.cache.forget(h);
        self.corrupt.insert(h);
        let req = pb::MasterRequest {
            req: Some(MReq::ReportCorrupt(pb::ReportCorruptRequest {
                address: self.cfg.address.clone(),
                handle: h,
                by_scrubber,
                server_id: self.server_id,
                cluster_id: self.cluster_id,
                version,
            })),
            ..Default::default()
        };
        self.call(Dest::Master, Outgoing::Master(req), CallCtx::ReportCorrupt);
    }
}
