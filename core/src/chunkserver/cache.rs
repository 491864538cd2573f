//! Recently written chunk data, kept in memory so reading it back needs no disk.
//!
//! Chunk files are written and read with direct I/O, past the kernel's page cache (which
//! would copy every byte once more and write it back on its own schedule). This cache
//! takes the page cache's place for the common case of reading what was just written
//! (a job's output read by the next job): a write's bytes are kept, as the same
//! reference-counted buffer the write used, once the write is durable.
//!
//! Rules it keeps:
//! - It only ever holds bytes that are on disk: an entry is added after the storage
//!   write that put its bytes there completed, and every storage operation that changes
//!   a chunk's data drops the entries it touches before it is issued.
//! - Entries start on a block boundary, so a read (which covers whole blocks, to verify
//!   their checksums) can be served from them; they are checked against the chunk's
//!   checksums on every read like bytes from disk, and dropped on a mismatch.
//! - Least recently used entries go first once the budget is spent; a zero budget turns
//!   it off.
//! - The budget counts the bytes entries hold, and memory kept alive stays within twice
//!   that: an entry is a slice of the buffer a write used, and what is left of it after
//!   a later write cut through it is copied out once it is less than half that buffer
//!   (a few blocks left of a 16 MiB write must not keep all 16 MiB).
//!
//! Reads of data not in the cache come from disk and are not added: one-time scans would
//! otherwise push out what was just written. The scrubber always reads the disk.

use crate::types::HashMap;
use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};

use crate::types::{BLOCK_SIZE, ChunkHandle};

#[derive(Debug)]
struct Entry {
    data: Bytes,
    /// Bytes of the buffer `data` is a slice of (as inserted): at most twice its length.
    held: u64,
    /// When it was last added or read (a counter): its place in `lru`.
    used: u64,
}

#[derive(Debug, Default)]
pub struct ReadCache {
    budget: u64,
    bytes: u64,
    /// Per chunk, entries by the offset they start at; they never overlap.
    chunks: HashMap<ChunkHandle, BTreeMap<u64, Entry>>,
    /// (last use, chunk, offset) of every entry, oldest first.
    lru: BTreeMap<u64, (ChunkHandle, u64)>,
    clock: u64,
}

impl ReadCache {
    pub fn new(budget: u64) -> ReadCache {
        ReadCache {
            budget,
            ..ReadCache::default()
        }
    }

    /// Bytes held.
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Keeps `data`, now on disk at `offset` of chunk `h`. Bytes before the first block
    /// boundary are left out; entries it overlaps are dropped first.
    pub fn insert(&mut self, h: ChunkHandle, offset: u64, data: Bytes) {
        let start = offset.next_multiple_of(BLOCK_SIZE);
        let skip = start - offset;
        if self.budget == 0 || skip >= data.len() as u64 {
            return;
        }
        let held = data.len() as u64;
        let data = data.slice(skip as usize..);
        let len = data.len() as u64;
        if len > self.budget {
            return;
        }
        self.forget_range(h, start, start + len);
        while self.bytes + len > self.budget {
            let Some((_, (oh, ooff))) = self.lru.pop_first() else {
                break;
            };
            self.remove(oh, ooff);
        }
        self.add(h, start, data, held);
    }

    /// Adds an entry that overlaps none, as the most recently used.
    fn add(&mut self, h: ChunkHandle, at: u64, data: Bytes, held: u64) {
        self.clock += 1;
        let used = self.clock;
        self.lru.insert(used, (h, at));
        self.bytes += data.len() as u64;
        self.chunks
            .entry(h)
            .or_default()
            .insert(at, Entry { data, held, used });
    }

    /// The bytes `[start, end)` of chunk `h` if the cache holds all of them (`start` on a
    /// block boundary): the entry's own buffer when one entry covers it, else one copy.
    pub fn get(&mut self, h: ChunkHandle, start: u64, end: u64) -> Option<Bytes> {
        if end <= start {
            return None;
        }
        let entries = self.chunks.get_mut(&h)?;
        // The entry holding `start`, then each one starting where the last ended.
        let (&first, e) = entries.range(..=start).next_back()?;
        let mut pos = first + e.data.len() as u64;
        if pos <= start {
            return None;
        }
        let mut parts = vec![first];
        while pos < end {
            let e = entries.get(&pos)?;
            parts.push(pos);
            pos += e.data.len() as u64;
        }
        // Mark them used.
        for &off in &parts {
            self.clock += 1;
            let e = entries.get_mut(&off).expect("listed above");
            self.lru.remove(&e.used);
            e.used = self.clock;
            self.lru.insert(e.used, (h, off));
        }
        let slice = |off: u64, e: &Entry| {
            let from = start.max(off) - off;
            let to = end.min(off + e.data.len() as u64) - off;
            e.data.slice(from as usize..to as usize)
        };
        if let [off] = parts[..] {
            return Some(slice(off, &entries[&off]));
        }
        let mut out = BytesMut::with_capacity((end - start) as usize);
        for &off in &parts {
            out.extend_from_slice(&slice(off, &entries[&off]));
        }
        Some(out.freeze())
    }

    /// Drops what the cache holds of the blocks `[offset, end)` touches; the rest of an
    /// entry it cuts through stays (sliced, no copy, unless less than half its buffer).
    pub fn forget_range(&mut self, h: ChunkHandle, offset: u64, end: u64) {
        let Some(entries) = self.chunks.get(&h) else {
            return;
        };
        let lo = offset / BLOCK_SIZE * BLOCK_SIZE;
        let hi = end.next_multiple_of(BLOCK_SIZE);
        let hit: Vec<u64> = entries
            .range(..hi)
            .filter(|(off, e)| **off + e.data.len() as u64 > lo)
            .map(|(off, _)| *off)
            .collect();
        for off in hit {
            let Some(e) = self.remove(h, off) else {
                continue;
            };
            let e_end = off + e.data.len() as u64;
            // What lies outside the touched blocks is still on disk as it was.
            let keep_head = (off < lo).then(|| (off, e.data.slice(..(lo - off) as usize)));
            let keep_tail = (e_end > hi).then(|| (hi, e.data.slice((hi - off) as usize..)));
            for (at, data) in keep_head.into_iter().chain(keep_tail) {
                let len = data.len() as u64;
                if len * 2 < e.held {
                    self.add(h, at, Bytes::copy_from_slice(&data), len);
                } else {
                    self.add(h, at, data, e.held);
                }
            }
        }
    }

    /// Drops everything held of chunk `h`.
    pub fn forget(&mut self, h: ChunkHandle) {
        if let Some(entries) = self.chunks.remove(&h) {
            for e in entries.values() {
                self.lru.remove(&e.used);
                self.bytes -= e.data.len() as u64;
            }
        }
    }

    fn remove(&mut self, h: ChunkHandle, off: u64) -> Option<Entry> {
        let entries = self.chunks.get_mut(&h)?;
        let e = entries.remove(&off)?;
        if entries.is_empty() {
            self.chunks.remove(&h);
        }
        self.lru.remove(&e.used);
        self.bytes -= e.data.len() as u64;
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// Bytes on disk change at (chunk, offset, len), then the write's bytes are kept.
        Write(u64, u64, u64, u8),
        /// Bytes on disk change and the cache is not told what they are now.
        Scribble(u64, u64, u64),
        Forget(u64),
        Get(u64, u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let range = (0..3u64, 0..6 * BLOCK_SIZE, 1..3 * BLOCK_SIZE);
        prop_oneof![
            3 => (range.clone(), any::<u8>()).prop_map(|((h, o, l), v)| Op::Write(h, o, l, v)),
            1 => range.clone().prop_map(|(h, o, l)| Op::Scribble(h, o, l)),
            1 => (0..3u64).prop_map(Op::Forget),
            4 => (0..3u64, 0..6u64, 1..7 * BLOCK_SIZE)
                .prop_map(|(h, b, l)| Op::Get(h, b * BLOCK_SIZE, l)),
        ]
    }

    proptest! {
        /// Whatever the cache hands out equals the disk's bytes, as long as every change
        /// on disk first drops the range it touches; and it keeps to its budget.
        #[test]
        fn what_the_cache_serves_is_what_the_disk_holds(
            budget in 0..8 * BLOCK_SIZE,
            ops in proptest::collection::vec(op(), 1..60),
        ) {
            let mut cache = ReadCache::new(budget);
            let mut disk: HashMap<u64, Vec<u8>> = HashMap::default();
            let mut scribbles = 0u8;
            for op in ops {
                match op {
                    Op::Write(h, off, len, v) => {
                        let d = disk.entry(h).or_default();
                        let end = (off + len) as usize;
                        if d.len() < end {
                            d.resize(end, 0);
                        }
                        d[off as usize..end].fill(v);
                        cache.forget_range(h, off, off + len);
                        // As a write keeps its bytes: from the block its data starts in.
                        let from = off / BLOCK_SIZE * BLOCK_SIZE;
                        cache.insert(h, from, Bytes::copy_from_slice(&d[from as usize..end]));
                    }
                    Op::Scribble(h, off, len) => {
                        scribbles = scribbles.wrapping_add(1);
                        let d = disk.entry(h).or_default();
                        let end = ((off + len) as usize).min(d.len());
                        if (off as usize) < end {
                            d[off as usize..end].fill(scribbles);
                        }
                        cache.forget_range(h, off, off + len);
                    }
                    Op::Forget(h) => {
                        disk.remove(&h);
                        cache.forget(h);
                    }
                    Op::Get(h, start, len) => {
                        if let Some(got) = cache.get(h, start, start + len) {
                            let d = &disk[&h];
                            prop_assert!(((start + len) as usize) <= d.len());
                            prop_assert!(
                                got[..] == d[start as usize..(start + len) as usize],
                                "stale bytes at {start}+{len} of chunk {h}"
                            );
                        }
                    }
                }
                prop_assert!(cache.bytes() <= budget);
                let held: u64 = cache
                    .chunks
                    .values()
                    .flat_map(|m| m.values())
                    .map(|e| e.data.len() as u64)
                    .sum();
                prop_assert_eq!(held, cache.bytes());
                for e in cache.chunks.values().flat_map(|m| m.values()) {
                    prop_assert!(
                        e.data.len() as u64 * 2 >= e.held,
                        "{} bytes keep a buffer of {} alive",
                        e.data.len(),
                        e.held
                    );
                }
                prop_assert_eq!(cache.lru.len(), cache.chunks.values().map(|m| m.len()).sum::<usize>());
            }
        }
    }

    #[test]
    fn one_entry_is_handed_out_uncopied_and_several_are_joined() {
        let mut c = ReadCache::new(1 << 20);
        let a = Bytes::from(vec![1u8; 2 * BLOCK_SIZE as usize]);
        c.insert(9, 0, a.clone());
        c.insert(9, 2 * BLOCK_SIZE, Bytes::from(vec![2u8; 100]));
        let got = c.get(9, BLOCK_SIZE, 2 * BLOCK_SIZE).unwrap();
        assert_eq!(got.as_ptr(), a[BLOCK_SIZE as usize..].as_ptr());
        let got = c.get(9, BLOCK_SIZE, 2 * BLOCK_SIZE + 100).unwrap();
        assert_eq!(got.len(), BLOCK_SIZE as usize + 100);
        assert_eq!(got[BLOCK_SIZE as usize..], [2u8; 100]);
        assert!(c.get(9, BLOCK_SIZE, 2 * BLOCK_SIZE + 101).is_none());
        // Bytes before the first block boundary are not kept.
        c.insert(8, 10, Bytes::from(vec![3u8; BLOCK_SIZE as usize]));
        assert_eq!(
            c.get(8, BLOCK_SIZE, BLOCK_SIZE + 10).unwrap()[..],
            [3u8; 10]
        );
        assert!(c.get(8, 0, 10).is_none());
    }

    /// What is left of an entry after a write cut through it stays a slice of the write's
    /// buffer while it is at least half of it, and is copied out once it is less.
    #[test]
    fn a_small_rest_of_a_big_write_is_copied_out() {
        let b = BLOCK_SIZE as usize;
        let mut c = ReadCache::new(1 << 30);
        let a = Bytes::from((0..16 * b).map(|i| i as u8).collect::<Vec<u8>>());
        c.insert(1, 0, a.clone());
        let within = |p: *const u8| a.as_ptr_range().contains(&p);
        // Block 0 rewritten: 15 of 16 blocks left, still the write's own buffer.
        c.forget_range(1, 0, 1);
        let rest = c.get(1, BLOCK_SIZE, 16 * BLOCK_SIZE).unwrap();
        assert!(within(rest.as_ptr()));
        // Blocks 1..=8 rewritten: 7 left, less than half of 16, so copied.
        c.forget_range(1, BLOCK_SIZE, 9 * BLOCK_SIZE - 1);
        let rest = c.get(1, 9 * BLOCK_SIZE, 16 * BLOCK_SIZE).unwrap();
        assert!(!within(rest.as_ptr()));
        assert_eq!(rest[..], a[9 * b..]);
        assert!(c.get(1, 8 * BLOCK_SIZE, 9 * BLOCK_SIZE).is_none());
        assert_eq!(c.bytes(), 7 * BLOCK_SIZE);
    }
}
