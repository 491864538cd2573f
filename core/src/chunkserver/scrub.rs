//! Scrubbing: idle chunks are read and verified in turn, so a copy that rots on the disk
//! is found before a reader needs it.

use super::*;

impl Chunkserver {
    /// On a tick: when due, verify the next idle chunk after the last one verified, in
    /// handle order, so every chunk's turn comes.
    pub(super) fn scrub(&mut self) {
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

    pub(super) fn start_scrub(&mut self, h: ChunkHandle) {
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

    pub(super) fn finish_scrub(&mut self, h: ChunkHandle, length: u64, data: Bytes) {
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
}
