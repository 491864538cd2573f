//! Repair after a torn write: blocks an interrupted overwrite may have left half old,
//! half new are re-read and their checksums recomputed at start-up.

use super::*;

impl Chunkserver {
    pub(super) fn start_repair(&mut self, h: ChunkHandle, w: pb::WriteIntent) {
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

    pub(super) fn finish_repair(&mut self, h: ChunkHandle, start: u64, data: Bytes) {
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
}
