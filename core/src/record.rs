//! Record framing for record append (GFS §3.3): self-identifying, checksummed records,
//! so a reader can skip what record append leaves between records (padding, the remains
//! of failed attempts) and drop the duplicates its retries make.
//!
//! A frame is a 20-byte header, then the payload:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `TsR1` |
//! | 4..8 | payload length, little-endian u32 |
//! | 8..16 | record id, little-endian u64, chosen by the writer, unique per record |
//! | 16..20 | CRC32C of bytes 4..16 and the payload |
//!
//! A frame never straddles chunks (record append guarantees it), so a reader scans each
//! chunk on its own: at each position, a valid frame is taken whole; anything else moves
//! the scan one byte on. A stray valid frame inside garbage is as unlikely as a CRC32C
//! collision on bytes that also start with the magic.

use std::collections::HashSet;

use bytes::{BufMut, Bytes, BytesMut};

pub const MAGIC: [u8; 4] = *b"TsR1";
pub const HEADER: usize = 20;

/// The frame holding `payload` as record `id`.
pub fn frame(id: u64, payload: &[u8]) -> Bytes {
    let len = u32::try_from(payload.len()).expect("record payload under 4 GiB");
    let mut b = BytesMut::with_capacity(HEADER + payload.len());
    b.put_slice(&MAGIC);
    b.put_u32_le(len);
    b.put_u64_le(id);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[4..16]), payload);
    b.put_u32_le(crc);
    b.put_slice(payload);
    b.freeze()
}

/// The size of the frame for a payload of `len` bytes.
pub fn framed_len(len: usize) -> usize {
    HEADER + len
}

/// A record found in a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Where its frame starts in the file.
    pub offset: u64,
    pub id: u64,
    pub payload: Bytes,
}

/// The frame starting at `data[at..]`, if one is there whole and intact.
fn frame_at(data: &Bytes, at: usize) -> Option<(u64, Bytes)> {
    let h = data.get(at..at + HEADER)?;
    if h[..4] != MAGIC {
        return None;
    }
    let len = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes")) as usize;
    let id = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(h[16..20].try_into().expect("4 bytes"));
    let body = at + HEADER;
    let payload = data.get(body..body.checked_add(len)?)?;
    (crc32c::crc32c_append(crc32c::crc32c(&h[4..16]), payload) == crc)
        .then(|| (id, data.slice(body..body + len)))
}

/// Every intact frame in `data`, which holds the file's bytes from offset `base` (a chunk
/// boundary), with chunks of `chunk_size` bytes. Duplicates are kept, in file order.
pub fn scan(data: &Bytes, base: u64, chunk_size: u64) -> Vec<Record> {
    assert!(chunk_size > 0, "chunk size 0");
    assert_eq!(base % chunk_size, 0, "scans start at a chunk boundary");
    let mut out = Vec::new();
    let step = usize::try_from(chunk_size).unwrap_or(usize::MAX);
    let mut chunk_start = 0usize;
    while chunk_start < data.len() {
        let chunk_end = chunk_start.saturating_add(step).min(data.len());
        let chunk = data.slice(chunk_start..chunk_end);
        let mut at = 0;
        while at + HEADER <= chunk.len() {
            match frame_at(&chunk, at) {
                Some((id, payload)) => {
                    let n = HEADER + payload.len();
                    out.push(Record {
                        offset: base + (chunk_start + at) as u64,
                        id,
                        payload,
                    });
                    at += n;
                }
                None => {
                    // Skip to the next byte that could start a frame.
                    at += 1;
                    match chunk[at..].iter().position(|&b| b == MAGIC[0]) {
                        Some(p) => at += p,
                        None => break,
                    }
                }
            }
        }
        chunk_start = chunk_end;
    }
    out
}

/// `records` with every repeat of an id after its first dropped.
pub fn dedup(records: Vec<Record>) -> Vec<Record> {
    let mut seen = HashSet::new();
    records.into_iter().filter(|r| seen.insert(r.id)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_are_found_between_padding_and_garbage() {
        let a = frame(1, b"alpha");
        let b = frame(2, b"");
        let mut file = BytesMut::new();
        file.put_slice(&a);
        file.put_slice(&[0u8; 7]); // zeros, as padding or an unfilled gap
        file.put_slice(&a[..10]); // the head of a frame, cut
        file.put_slice(b"TsR1junk");
        file.put_slice(&b);
        file.put_slice(&a); // a duplicate from a retry
        let file = file.freeze();
        let got = scan(&file, 0, 1 << 20);
        let ids: Vec<u64> = got.iter().map(|r| r.id).collect();
        assert_eq!(ids, vec![1, 2, 1]);
        assert_eq!(got[0].offset, 0);
        assert_eq!(got[0].payload, Bytes::from_static(b"alpha"));
        assert_eq!(got[1].offset, (a.len() + 7 + 10 + 8) as u64);
        assert_eq!(dedup(got).len(), 2);
    }

    #[test]
    fn a_damaged_frame_is_skipped() {
        let mut f = frame(9, b"payload").to_vec();
        f[HEADER + 2] ^= 0x40;
        assert!(scan(&Bytes::from(f), 0, 1 << 20).is_empty());
    }

    #[test]
    fn frames_do_not_run_across_chunks() {
        // A frame cut by a chunk boundary is not a record; the next chunk starts afresh.
        let f = frame(3, &[5u8; 30]);
        let mut file = BytesMut::new();
        file.put_slice(&[0u8; 40]);
        file.put_slice(&f[..24]);
        file.put_slice(&f);
        let got = scan(&file.freeze(), 64, 64);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].offset, 128);
    }

    proptest! {
        /// Frames laid at random places among random garbage are all found, at their
        /// offsets, with their payloads (garbage here never holds the magic).
        #[test]
        fn every_frame_is_found(
            parts in proptest::collection::vec(
                (proptest::collection::vec(any::<u8>(), 0..50),
                 proptest::collection::vec(any::<u8>(), 0..40)), 0..20)
        ) {
            let mut file = BytesMut::new();
            let mut want = Vec::new();
            for (i, (garbage, payload)) in parts.iter().enumerate() {
                let garbage: Vec<u8> = garbage.iter().map(|&b| if b == MAGIC[0] { 0 } else { b }).collect();
                file.put_slice(&garbage);
                want.push((file.len() as u64, i as u64, payload.clone()));
                file.put_slice(&frame(i as u64, payload));
            }
            let got = scan(&file.freeze(), 0, 1 << 30);
            let got: Vec<(u64, u64, Vec<u8>)> =
                got.into_iter().map(|r| (r.offset, r.id, r.payload.to_vec())).collect();
            prop_assert_eq!(got, want);
        }
    }
}
