//! Block checksums (GFS §5.2): one CRC32C per 64 KiB block of a chunk, the last block
//! covering only the bytes below the chunk's length.

use crate::types::BLOCK_SIZE;

const B: usize = BLOCK_SIZE as usize;

/// Checksums of `data`, which starts on a block boundary.
pub fn blocks(data: &[u8]) -> Vec<u32> {
    data.chunks(B).map(crc32c::crc32c).collect()
}

/// Verifies `data`, read from block-aligned offset `start`, against `sums`. Returns the
/// first bad block's index.
pub fn verify(sums: &[u32], start: u64, data: &[u8]) -> Result<(), usize> {
    let first = (start / BLOCK_SIZE) as usize;
    for (i, block) in data.chunks(B).enumerate() {
        match sums.get(first + i) {
            Some(&s) if s == crc32c::crc32c(block) => {}
            _ => return Err(first + i),
        }
    }
    Ok(())
}

/// Checksums of the bytes of `parts` one after another (starting on a block boundary),
/// without joining them.
pub fn blocks_of(parts: &[&[u8]]) -> Vec<u32> {
    let mut out = Vec::new();
    let (mut crc, mut fill) = (0u32, 0usize);
    for part in parts {
        let mut p: &[u8] = part;
        while !p.is_empty() {
            let n = (B - fill).min(p.len());
            crc = crc32c::crc32c_append(crc, &p[..n]);
            (fill, p) = (fill + n, &p[n..]);
            if fill == B {
                out.push(crc);
                (crc, fill) = (0, 0);
            }
        }
    }
    if fill > 0 {
        out.push(crc);
    }
    out
}

/// The checksums after writing: `covered` is the chunk's new bytes from block-aligned
/// offset `start` up to the end of the last block the write touched (old bytes around the
/// write included), in parts. Blocks outside that range keep their checksums.
pub fn update(sums: &mut Vec<u32>, start: u64, covered: &[&[u8]]) {
    let first = (start / BLOCK_SIZE) as usize;
    let new = blocks_of(covered);
    if sums.len() < first + new.len() {
        sums.resize(first + new.len(), 0);
    }
    sums[first..first + new.len()].copy_from_slice(&new);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Applies a write to a model chunk and to its checksums the way the chunkserver does:
    /// only the edge blocks' old bytes are read.
    fn write(chunk: &mut Vec<u8>, sums: &mut Vec<u32>, off: usize, data: &[u8]) {
        if chunk.len() < off {
            chunk.resize(off, 0);
        }
        let old_len = chunk.len();
        let end = off + data.len();
        let fb = off / B * B;
        let tail_end = end.div_ceil(B) * B;
        let mut covered = chunk[fb..off].to_vec();
        covered.extend_from_slice(data);
        if end < old_len {
            covered.extend_from_slice(&chunk[end..old_len.min(tail_end)]);
        }
        if chunk.len() < end {
            chunk.resize(end, 0);
        }
        chunk[off..end].copy_from_slice(data);
        // In parts, split where the chunkserver splits them (old head, data, old tail).
        let (head, rest) = covered.split_at(off - fb);
        let (mid, tail) = rest.split_at(data.len());
        update(sums, fb as u64, &[head, mid, tail]);
    }

    proptest! {
        #[test]
        fn blocks_of_parts_equal_blocks_of_the_whole(
            data in proptest::collection::vec(any::<u8>(), 0..300_000),
            cuts in proptest::collection::vec(0usize..300_000, 0..6)
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.sort_unstable();
            let mut parts = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([data.len()]) {
                parts.push(&data[at..c]);
                at = c;
            }
            prop_assert_eq!(blocks_of(&parts), blocks(&data));
        }

        #[test]
        fn incremental_update_equals_recompute(
            writes in proptest::collection::vec((0usize..400_000, 1usize..200_000, any::<u8>()), 1..12)
        ) {
            let mut chunk = Vec::new();
            let mut sums = Vec::new();
            for (off, len, byte) in writes {
                // Writes start at or before the end, as the chunkserver ensures by zero-filling.
                let off = off.min(chunk.len());
                let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
                write(&mut chunk, &mut sums, off, &data);
                prop_assert_eq!(&sums, &blocks(&chunk));
                prop_assert!(verify(&sums, 0, &chunk).is_ok());
            }
        }
    }

    #[test]
    fn verify_finds_the_bad_block() {
        let mut data = vec![7u8; 3 * B + 10];
        let sums = blocks(&data);
        data[2 * B + 5] ^= 1;
        assert_eq!(verify(&sums, 0, &data), Err(2));
        assert_eq!(verify(&sums, BLOCK_SIZE, &data[B..2 * B]), Ok(()));
        assert_eq!(
            verify(&sums[..1], 0, &data[..2 * B]),
            Err(1),
            "missing checksum"
        );
    }
}
