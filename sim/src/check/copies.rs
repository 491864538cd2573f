//! Where a chunk's copies may differ after healing: only where a mutation of it failed
//! (GFS §3.3: a failed mutation leaves its region inconsistent), and no mutation
//! acknowledged after it wrote the same bytes again.
//!
//! The check watches each primary decide: a client's write or record append that the
//! primary takes is given its place (offset and length) in the step it arrives, seen
//! in the mutation the primary forwards to its secondaries, and it is acknowledged when
//! the primary answers that request Ok. What each copy holds is then compared byte for
//! byte; a difference is explained only by a decided mutation that was not
//! acknowledged, over its own range, or (past the shorter copy's end) by the zeros with
//! which a write past a copy's end fills the gap below it. Padding is a mutation like
//! any other: a record append answered "chunk full" is acknowledged, and its padding
//! must be the same on every copy.

use std::collections::HashMap;

use tessera_core::chunkserver as cs;
use tessera_core::pb::{self, chunk_request::Req};

/// A mutation a primary decided: where it goes, in the order primaries decided them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decided {
    /// Its place in the order of every primary's decisions (one primary at a time holds a
    /// chunk's lease, so this is the order the copies applied them in).
    pub order: u64,
    /// Its offset.
    pub offset: u64,
    /// Its length: 0 for padding, which fills from each copy's end to `offset`.
    pub len: u64,
    /// The primary answered it Ok: every copy of its lease applied it.
    pub acked: bool,
    /// The chunk version it was made at, and when it was answered Ok (true ms).
    pub version: u64,
    pub acked_at: Option<i64>,
}

impl Decided {
    fn range(&self) -> (u64, u64) {
        (self.offset, self.offset.saturating_add(self.len))
    }
}

#[derive(Default)]
pub struct Mutations {
    next: u64,
    /// Pushed data's length, by the server it reached (from its client, or along the
    /// push's chain) and its id (the client's choice, unique per attempt).
    pushed: HashMap<(String, u64), u64>,
    /// By chunk: the mutations its primaries decided.
    decided: HashMap<u64, Vec<Decided>>,
    /// A request a primary decided a mutation for, by server and request id, until it is
    /// answered: the chunk and the mutation's index.
    pending: HashMap<(String, u64), (u64, usize)>,
}

impl Mutations {
    /// Chunkserver `node` took a step with `effects` after `input`: a push is noted for
    /// its length, and each mutation it forwarded as primary is decided, until the
    /// request it answers is answered.
    pub fn step(
        &mut self,
        node: &str,
        input: &cs::Input,
        effects: &cs::Effects,
        server: &cs::Chunkserver,
        t: i64,
    ) {
        if let cs::Input::Request { id, req, .. } = input {
            // A request id is a server's own, and a restarted server counts from the start.
            self.pending.remove(&(node.to_string(), *id));
            if let Some(Req::Push(p)) = &req.req {
                self.pushed.insert((node.to_string(), p.data_id), p.total);
            }
        }
        let mut seen = Vec::new();
        for call in &effects.calls {
            let cs::Outgoing::Chunk(pb::ChunkRequest {
                req: Some(Req::Apply(a)),
            }) = &call.req
            else {
                continue;
            };
            if seen.contains(&(a.handle, a.version, a.serial)) {
                continue;
            }
            seen.push((a.handle, a.version, a.serial));
            let Some(id) = server.forwarded_for(a.handle, a.version, a.serial) else {
                continue;
            };
            let len = if !a.data.is_empty() {
                a.data.len() as u64
            } else if a.data_id == 0 {
                0
            } else {
                // Taken by the primary, so pushed to it: unknown only if the check
                // missed the push, and then as long as the rest of the chunk.
                self.pushed
                    .remove(&(node.to_string(), a.data_id))
                    .unwrap_or(u64::MAX)
            };
            self.next += 1;
            let list = self.decided.entry(a.handle).or_default();
            list.push(Decided {
                order: self.next,
                offset: a.offset,
                len,
                acked: false,
                version: a.version,
                acked_at: None,
            });
            self.pending
                .insert((node.to_string(), id), (a.handle, list.len() - 1));
        }
        for (id, r) in &effects.replies {
            self.answered(node, *id, r, t);
        }
    }

    /// Chunkserver `node` answered request `id`.
    fn answered(&mut self, node: &str, id: u64, answer: &pb::ChunkResponse, t: i64) {
        let Some((h, i)) = self.pending.remove(&(node.to_string(), id)) else {
            return;
        };
        if answer.error.is_some() {
            return;
        }
        let d = &mut self.decided.get_mut(&h).expect("decided")[i];
        d.acked = true;
        d.acked_at = Some(t);
    }

    /// The highest version of chunk `h` a mutation was acknowledged at before true ms
    /// `t`, and when.
    pub fn acked_before(&self, h: u64, t: i64) -> Option<(u64, i64)> {
        self.decided(h)
            .iter()
            .filter_map(|d| d.acked_at.filter(|&a| a < t).map(|a| (d.version, a)))
            .max()
    }

    /// Chunk `h`'s decided mutations, in order.
    pub fn decided(&self, h: u64) -> &[Decided] {
        self.decided.get(&h).map_or(&[], |v| v)
    }
}

/// The ranges where copies `a` and `b` differ that no mutation in `decided` accounts
/// for: a byte is accounted for by a mutation not acknowledged that covers it, unless
/// one acknowledged after it covers it too (it was written again, alike, on every
/// copy); past the shorter copy's end, a zero is accounted for by such a mutation at a
/// higher offset (its write filled the gap below it with zeros).
pub fn unexplained(a: &[u8], b: &[u8], decided: &[Decided]) -> Vec<(u64, u64)> {
    let short = a.len().min(b.len()) as u64;
    let longer = if a.len() >= b.len() { a } else { b };
    // Each failed mutation's range, less what an acknowledged later one covers.
    let mut open: Vec<(u64, u64)> = Vec::new();
    let mut gap_below = 0u64;
    for (i, f) in decided.iter().enumerate() {
        if f.acked {
            continue;
        }
        let (lo, hi) = f.range();
        gap_below = gap_below.max(lo);
        let later: Vec<(u64, u64)> = decided[i + 1..]
            .iter()
            .filter(|m| m.acked)
            .map(Decided::range)
            .collect();
        open.extend(without(&[(lo, hi)], &later));
    }
    let explained = |x: u64| {
        open.iter().any(|&(lo, hi)| lo <= x && x < hi)
            || (x >= short && x < gap_below && longer[x as usize] == 0)
    };
    let mut left: Vec<(u64, u64)> = Vec::new();
    for (lo, hi) in differences(a, b) {
        for x in lo..hi {
            if explained(x) {
                continue;
            }
            match left.last_mut() {
                Some(l) if l.1 == x => l.1 = x + 1,
                _ => left.push((x, x + 1)),
            }
        }
    }
    left
}

/// The blocks of `data` that fail their checksums in `sums`, as byte ranges.
pub fn bad_blocks(data: &[u8], sums: &[u32]) -> Vec<(u64, u64)> {
    let b = tessera_core::types::BLOCK_SIZE;
    data.chunks(b as usize)
        .enumerate()
        .filter(|(i, block)| cs::checksum::verify(sums, *i as u64 * b, block).is_err())
        .map(|(i, block)| (i as u64 * b, i as u64 * b + block.len() as u64))
        .collect()
}

/// `ranges` less the union of `cut`.
pub fn without(ranges: &[(u64, u64)], cut: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = ranges.to_vec();
    for &(clo, chi) in cut {
        out = out
            .into_iter()
            .flat_map(|(x, y)| {
                let mut keep = Vec::new();
                if x < clo.min(y) {
                    keep.push((x, clo.min(y)));
                }
                if chi.max(x) < y {
                    keep.push((chi.max(x), y));
                }
                keep
            })
            .collect();
    }
    out
}

/// The ranges where `a` and `b` differ, a byte past the shorter one's end differing.
pub fn differences(a: &[u8], b: &[u8]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let n = a.len().min(b.len());
    let mut i = 0;
    while i < n {
        if a[i] != b[i] {
            let start = i;
            while i < n && a[i] != b[i] {
                i += 1;
            }
            out.push((start as u64, i as u64));
        } else {
            i += 1;
        }
    }
    if a.len() != b.len() {
        let end = a.len().max(b.len()) as u64;
        match out.last_mut() {
            Some(last) if last.1 == n as u64 => last.1 = end,
            _ => out.push((n as u64, end)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(order: u64, offset: u64, len: u64, acked: bool) -> Decided {
        Decided {
            order,
            offset,
            len,
            acked,
            version: 1,
            acked_at: None,
        }
    }

    #[test]
    fn differences_are_found() {
        assert_eq!(differences(b"abcdef", b"abXdYf"), [(2, 3), (4, 5)]);
        assert_eq!(differences(b"abc", b"abcde"), [(3, 5)]);
        assert_eq!(differences(b"abX", b"abcde"), [(2, 5)]);
    }

    #[test]
    fn only_a_failed_mutation_explains_a_difference() {
        let a = b"0123456789";
        let b = b"01xx4567yy";
        // Nothing failed: both runs unexplained.
        assert_eq!(unexplained(a, b, &[]), [(2, 4), (8, 10)]);
        assert_eq!(
            unexplained(a, b, &[d(1, 2, 2, true), d(2, 8, 2, true)]),
            [(2, 4), (8, 10)]
        );
        // Failed mutations over both runs explain them.
        assert!(unexplained(a, b, &[d(1, 2, 2, false), d(2, 8, 2, false)]).is_empty());
        // One acknowledged after the failed one wrote [2, 4) again on every copy.
        assert_eq!(
            unexplained(a, b, &[d(1, 0, 10, false), d(2, 2, 2, true)]),
            [(2, 4)]
        );
        // Acknowledged before it: the failed one may have landed on one copy only.
        assert!(unexplained(a, b, &[d(1, 2, 2, true), d(2, 0, 10, false)]).is_empty());
    }

    #[test]
    fn past_the_shorter_copy_only_a_failed_write_beyond_explains_zeros() {
        let short = b"abcd";
        let long = [b'a', b'b', b'c', b'd', 0, 0, 0, b'x', b'y'];
        // A failed write of "xy" at 7 filled [4, 7) with zeros on the copy it reached.
        assert!(unexplained(short, &long, &[d(1, 7, 2, false)]).is_empty());
        // Acknowledged, it should be on both: nothing explains the difference.
        assert_eq!(unexplained(short, &long, &[d(1, 7, 2, true)]), [(4, 9)]);
        // Failed at 8 only: 7 is no zero of a gap, and not in its range.
        assert_eq!(unexplained(short, &long, &[d(1, 8, 1, false)]), [(7, 8)]);
        // Padding acknowledged: the copies must agree up to the chunk's end.
        let padded = [b'a', b'b', b'c', b'd', 0, 0, 0, 0, 0];
        assert_eq!(unexplained(short, &padded, &[d(1, 9, 0, true)]), [(4, 9)]);
        // Zeros inside both copies' lengths are no gap: they differ from data.
        assert_eq!(
            unexplained(b"abcdXYZ", b"abcd\0\0\0", &[d(1, 9, 0, false)]),
            [(4, 7)]
        );
    }
}
