//! Space: the chunkserver's capacity (`--capacity`) is a quota on the bytes of the chunks
//! it holds, and it keeps to it. A write or record that would grow its chunks past the
//! quota is refused with `NoSpace` before anything is written or forwarded, as one the
//! disk has no room for; so is a clone, once its bytes are in. The master places no new
//! chunk on a server whose heartbeat says it is full.
//!
//! What the client sees is what a full disk gives it. A primary's refusal reaches it as
//! `NoSpace`, which it does not retry. A secondary's fails the mutation as any
//! secondary's failure does (`Unavailable`), which the client retries on the same
//! replicas: a write until its patience runs out, a record append possibly leaving a
//! copy of the record on the primary (at-least-once, as after any failed append).
//! Padding, a quarter chunk at most, is let through, so that an append can always move
//! on to a new chunk.
//!
//! The quota is checked against the chunks as committed, so writes in flight at once
//! may pass it together by at most their own growth; the disk's own limit stays the hard
//! one. The bytes held are counted as chunks change (`used_bytes`), not summed per
//! mutation: the invariants check the count against the sum.

use super::*;

impl Chunkserver {
    /// Refuses to let chunk `h` grow to `end` bytes if that would pass this server's
    /// capacity. Overwrites below a chunk's length grow nothing and always pass.
    pub(super) fn room_for(&self, h: ChunkHandle, end: u64) -> Result<(), FsError> {
        let length = self.chunks.get(&h).map_or(0, |c| c.meta.length);
        let growth = end.saturating_sub(length);
        if growth == 0 || self.used_bytes.saturating_add(growth) <= self.cfg.capacity_bytes {
            return Ok(());
        }
        Err(FsError::NoSpace(format!(
            "{}: chunk {h} would grow by {growth} bytes, past this server's capacity of {} \
             bytes ({} in use)",
            self.cfg.address, self.cfg.capacity_bytes, self.used_bytes
        )))
    }

    /// Takes chunk `h` out of those held (deleted, or found corrupt), and its bytes out
    /// of the count.
    pub(super) fn forget_chunk(&mut self, h: ChunkHandle) -> Option<Chunk> {
        let c = self.chunks.remove(&h)?;
        self.used_bytes -= c.meta.length;
        Some(c)
    }

    /// The bytes of the chunks held.
    pub(super) fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// The sum the count must equal (for the invariants: linear in the chunks held).
    pub(super) fn used_bytes_summed(&self) -> u64 {
        self.chunks.values().map(|c| c.meta.length).sum()
    }
}
