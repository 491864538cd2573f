//! The model of a file written by record append (GFS §3.3), and the judge of what a
//! reader finds in it:
//! - every acknowledged record is there, intact, at the offset its append returned, at
//!   least once, on every replica;
//! - every intact frame found is a record some client tried to append, with its bytes;
//! - no frame runs across a chunk boundary;
//! - the bytes between frames are padding (zeros) or bytes some mutation stored at that
//!   very place of that chunk: the remains of failed attempts, never bytes nobody wrote.
//!
//! The last rule needs every byte ever stored; the observer keeps them ([`Stored`]) in
//! runs that check appends.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use tessera_core::record;
use tessera_core::types::ChunkHandle;

#[derive(Clone, Debug, Default)]
pub struct AppendLog {
    /// Every record a client tried to append: id to payload.
    pub attempted: HashMap<u64, Bytes>,
    /// Acknowledged appends: id, the offset returned, and when (true ms).
    pub acked: Vec<(u64, u64, i64)>,
}

/// Every data write chunkservers made durable, per chunk: (offset, bytes).
#[derive(Default)]
pub struct Stored {
    pub writes: HashMap<ChunkHandle, Vec<(u64, Bytes)>>,
}

impl Stored {
    fn allows(&self, h: ChunkHandle, at: u64, b: u8) -> bool {
        self.writes.get(&h).is_some_and(|ws| {
            ws.iter()
                .any(|(o, d)| at >= *o && at < o + d.len() as u64 && d[(at - o) as usize] == b)
        })
    }
}

impl AppendLog {
    /// Judges `data`, the file's bytes from offset `base` (a chunk boundary) as read at
    /// true time `rs` (acknowledgements after that need not show). Records acknowledged
    /// at offsets in `base..limit` must be in it. `handles` maps chunk index to handle,
    /// for the stored-bytes rule; None skips that rule.
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &self,
        data: &Bytes,
        base: u64,
        limit: u64,
        chunk_size: u64,
        rs: i64,
        handles: Option<&BTreeMap<u64, ChunkHandle>>,
        stored: Option<&Stored>,
    ) -> Result<usize, String> {
        let found = record::scan(data, base, chunk_size);
        let mut at: HashMap<u64, &record::Record> = HashMap::new();
        for r in &found {
            match self.attempted.get(&r.id) {
                Some(p) if *p == r.payload => {}
                Some(_) => {
                    return Err(format!(
                        "record {:x} at {} holds bytes it was not appended with",
                        r.id, r.offset
                    ));
                }
                None => {
                    return Err(format!(
                        "a frame at {} (id {:x}) that no client appended",
                        r.offset, r.id
                    ));
                }
            }
            let last = r.offset + (record::HEADER + r.payload.len()) as u64 - 1;
            if r.offset / chunk_size != last / chunk_size {
                return Err(format!(
                    "record {:x} at {} straddles chunks",
                    r.id, r.offset
                ));
            }
            at.insert(r.offset, r);
        }
        for &(id, off, t) in &self.acked {
            if t >= rs || off < base || off >= limit {
                continue;
            }
            match at.get(&off) {
                Some(r) if r.id == id => {}
                Some(r) => {
                    return Err(format!(
                        "acknowledged record {id:x} at {off} is missing; record {:x} is there",
                        r.id
                    ));
                }
                None => {
                    let len = self.attempted.get(&id).map_or(0, |p| p.len());
                    let s = (off - base) as usize;
                    let e = (s + record::HEADER + len).min(data.len());
                    let damage = if e <= s {
                        "past the end of what was read".to_string()
                    } else {
                        let want = record::frame(id, &self.attempted[&id]);
                        let first_bad = (s..e).find(|&i| data[i] != want[i - s]);
                        format!(
                            "{} of {} bytes read, first difference at {first_bad:?}",
                            e - s,
                            want.len()
                        )
                    };
                    return Err(format!(
                        "acknowledged record {id:x} is not intact at {off} ({damage})"
                    ));
                }
            }
        }
        if let (Some(handles), Some(stored)) = (handles, stored) {
            // Bytes outside frames: padding, or stored there by some mutation.
            let mut covered = vec![false; data.len()];
            for r in &found {
                let s = (r.offset - base) as usize;
                let e = s + record::HEADER + r.payload.len();
                covered[s..e].iter_mut().for_each(|c| *c = true);
            }
            for (i, &b) in data.iter().enumerate() {
                if covered[i] || b == 0 {
                    continue;
                }
                let pos = base + i as u64;
                let idx = pos / chunk_size;
                let Some(&h) = handles.get(&idx) else {
                    return Err(format!(
                        "byte {pos} read as {b} in a chunk the file does not have"
                    ));
                };
                if !stored.allows(h, pos % chunk_size, b) {
                    return Err(format!(
                        "byte {pos} (chunk {h} offset {}) read as {b}, which no mutation stored there",
                        pos % chunk_size
                    ));
                }
            }
        }
        Ok(found.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges_records_padding_and_garbage() {
        let mut log = AppendLog::default();
        let p1 = Bytes::from_static(b"first");
        let p2 = Bytes::from_static(b"second");
        log.attempted.insert(1, p1.clone());
        log.attempted.insert(2, p2.clone());
        let f1 = record::frame(1, &p1);
        let f2 = record::frame(2, &p2);
        let mut file = f1.to_vec();
        file.extend_from_slice(&[0; 10]);
        file.extend_from_slice(&f2);
        let file = Bytes::from(file);
        log.acked.push((1, 0, 5));
        log.acked.push((2, (f1.len() + 10) as u64, 5));
        assert_eq!(
            log.check(&file, 0, u64::MAX, 1 << 20, 10, None, None),
            Ok(2)
        );
        // Acknowledged later than the read began: need not be there.
        log.acked.push((2, 900, 20));
        assert!(
            log.check(&file, 0, u64::MAX, 1 << 20, 10, None, None)
                .is_ok()
        );
        assert!(
            log.check(&file, 0, u64::MAX, 1 << 20, 30, None, None)
                .is_err()
        );
        log.acked.pop();
        // A lost record.
        let mut lost = file.to_vec();
        lost[f1.len() + 12] ^= 1;
        assert!(
            log.check(&Bytes::from(lost), 0, u64::MAX, 1 << 20, 10, None, None)
                .is_err()
        );
        // Garbage that nothing stored.
        let mut junk = file.to_vec();
        junk[f1.len() + 3] = 7;
        let handles = BTreeMap::from([(0u64, 42u64)]);
        let mut stored = Stored::default();
        assert!(
            log.check(
                &Bytes::from(junk.clone()),
                0,
                u64::MAX,
                1 << 20,
                10,
                Some(&handles),
                Some(&stored)
            )
            .is_err()
        );
        stored
            .writes
            .insert(42, vec![(f1.len() as u64 + 3, Bytes::from_static(&[7]))]);
        assert!(
            log.check(
                &Bytes::from(junk),
                0,
                u64::MAX,
                1 << 20,
                10,
                Some(&handles),
                Some(&stored)
            )
            .is_ok()
        );
    }
}
