//! A master alone's checkpoint as it lies in its store.
//!
//! A namespace's checkpoint soon passes what one value of a key-value store should hold,
//! so it is stored in parts: `checkpoint` holds a head (the record the checkpoint runs
//! through, how many parts, how many bytes), and `checkpoint/<part, 4 bytes big-endian>`
//! the sealed checkpoint's bytes, in parts of at most `MasterOptions::checkpoint_part_bytes`.
//! Head and parts are written in one batch with the deletion of the records the
//! checkpoint covers and of the earlier checkpoint's parts past the new one's last
//! (`driver::commit`). Loading refuses a part damaged, missing, out of place or left
//! over; the whole is sealed once more, so parts that fit end to end yet come from two
//! checkpoints are refused too.
//!
//! The head is sealed under a format byte of its own ([`HEAD`]). A binary from before
//! parts reads `checkpoint` as a whole checkpoint and refuses that byte; a head sealed as
//! an ordinary value would have decoded there as the checkpoint of an empty namespace. A
//! store written before parts (the whole checkpoint in `checkpoint`) loads as it is.
//!
//! The checkpointer encodes and splits a checkpoint on its own task ([`Sealed::new`]):
//! the master's loop only writes the values.
//!
//! [`split`] and [`join`] also lay a master replica's snapshot in its store
//! (`group::store`).

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use prost::Message;

use super::master::{CHECKPOINT_KEY, checked, open, seal, seal_as};
use crate::pb;
use crate::types::LogSeq;

/// The first byte of a sealed head: one of [`super::master`]'s sealed values is 0xC5.
/// Neither is one bit away from any first byte of a value from before sealing.
pub(crate) const HEAD: u8 = 0xC6;

/// Where parts lie: `checkpoint/<n>`.
pub const PART_PREFIX: &[u8] = b"checkpoint/";

/// The size of a stored checkpoint's parts unless the master is given another.
pub const PART_BYTES: usize = 4 << 20;

pub fn part_key(n: u32) -> Vec<u8> {
    let mut k = PART_PREFIX.to_vec();
    k.extend_from_slice(&n.to_be_bytes());
    k
}

/// A write for the store: a key and its new value (None: delete it).
pub type Write = (Vec<u8>, Option<Bytes>);

/// `data` cut into consecutive pieces of at most `part_bytes` (0: [`PART_BYTES`]), each
/// with its offset.
pub(crate) fn split(data: &Bytes, part_bytes: usize) -> impl Iterator<Item = (u64, Bytes)> + '_ {
    let part = if part_bytes == 0 {
        PART_BYTES
    } else {
        part_bytes
    };
    (0..data.len().div_ceil(part)).map(move |n| {
        let at = n * part;
        (at as u64, data.slice(at..(at + part).min(data.len())))
    })
}

/// The number of pieces [`split`] cuts `len` bytes into.
pub(crate) fn pieces(len: usize, part_bytes: usize) -> u32 {
    let part = if part_bytes == 0 {
        PART_BYTES
    } else {
        part_bytes
    };
    u32::try_from(len.div_ceil(part)).expect("a value in 2^32 parts")
}

/// The `length` bytes that exactly `count` stored pieces (numbered from 0, each its
/// offset, the total it claims and its bytes) hold end to end.
pub(crate) fn join(
    count: u32,
    length: u64,
    held: &BTreeMap<u32, (u64, u64, Bytes)>,
) -> Result<Bytes, String> {
    if held.len() != count as usize || held.keys().next_back() != count.checked_sub(1).as_ref() {
        return Err(format!(
            "{count} parts, {} held (the last numbered {:?})",
            held.len(),
            held.keys().next_back()
        ));
    }
    // Nothing is allocated on a length not yet seen to add up.
    let mut at = 0u64;
    for (n, (offset, total, data)) in held {
        if *offset != at || *total != length || data.is_empty() {
            return Err(format!(
                "part {n} holds {} bytes at {offset} of {total}, where {at} of {length} come \
                 next",
                data.len(),
            ));
        }
        at += data.len() as u64;
    }
    if at != length {
        return Err(format!("parts hold {at} bytes of {length}"));
    }
    let mut whole = BytesMut::with_capacity(at as usize);
    for (_, _, data) in held.values() {
        whole.extend_from_slice(data);
    }
    Ok(whole.freeze())
}

/// A checkpoint ready for the store: its head and its parts, sealed.
#[derive(Clone, Debug)]
pub struct Sealed {
    pub through_seq: LogSeq,
    head: Bytes,
    parts: Vec<Bytes>,
}

impl Sealed {
    /// `cp` encoded, sealed and cut into parts of at most `part_bytes` (0:
    /// [`PART_BYTES`]). It is dropped once encoded: at most it and its encoding, or its
    /// encoding and the parts, are held at once.
    pub fn new(cp: pb::Checkpoint, part_bytes: usize) -> Sealed {
        let through_seq = cp.through_seq;
        let whole = seal(&cp);
        drop(cp);
        let total = whole.len() as u64;
        let parts: Vec<Bytes> = split(&whole, part_bytes)
            .map(|(offset, data)| {
                seal(&pb::CheckpointPart {
                    offset,
                    total,
                    data,
                })
            })
            .collect();
        let head = seal_as(
            HEAD,
            &pb::CheckpointHead {
                through_seq,
                parts: u32::try_from(parts.len()).expect("a checkpoint in 2^32 parts"),
                length: total,
            },
        );
        Sealed {
            through_seq,
            head,
            parts,
        }
    }

    /// How many parts it lies in, and how many bytes its values hold.
    pub fn size(&self) -> (u32, usize) {
        let bytes = self.head.len() + self.parts.iter().map(Bytes::len).sum::<usize>();
        (self.parts.len() as u32, bytes)
    }

    /// The values it is stored as.
    pub fn values(&self) -> impl Iterator<Item = (Vec<u8>, Bytes)> + '_ {
        std::iter::once((CHECKPOINT_KEY.to_vec(), self.head.clone())).chain(
            self.parts
                .iter()
                .enumerate()
                .map(|(n, p)| (part_key(n as u32), p.clone())),
        )
    }

    /// The writes that store it in place of a checkpoint in `stored` parts: its values,
    /// and the removal of the earlier one's parts past its last. `stored` becomes its
    /// own count.
    pub fn writes(&self, stored: &mut u32, out: &mut Vec<Write>) {
        out.extend(self.values().map(|(k, v)| (k, Some(v))));
        let (parts, _) = self.size();
        out.extend((parts..*stored).map(|n| (part_key(n), None)));
        *stored = parts;
    }

    /// What a start-up reads back from its values (for checks: the simulator's).
    pub fn read(&self) -> Result<pb::Checkpoint, String> {
        let loaded = load(self.values())?.ok_or("no checkpoint")?;
        Ok(loaded.checkpoint)
    }
}

/// A stored checkpoint, as loaded.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub checkpoint: pb::Checkpoint,
    /// It was sealed: every value logged after it was too.
    pub sealed: bool,
    /// How many parts it lies in (0: a value of its own, from before parts).
    pub parts: u32,
}

/// The checkpoint the values under `checkpoint` hold (None: there is none), each value
/// checked. An error names what is damaged.
pub fn load(values: impl IntoIterator<Item = (Vec<u8>, Bytes)>) -> Result<Option<Loaded>, String> {
    let mut head: Option<Bytes> = None;
    let mut held = BTreeMap::new();
    for (k, v) in values {
        if k == CHECKPOINT_KEY {
            head = Some(v);
        } else if let Some(n) = k.strip_prefix(PART_PREFIX) {
            let n = <[u8; 4]>::try_from(n)
                .map(u32::from_be_bytes)
                .map_err(|_| format!("part key {k:?}"))?;
            let p: pb::CheckpointPart = open(&v)
                .and_then(|(p, sealed)| sealed.then_some(p).ok_or_else(|| "not sealed".into()))
                .map_err(|e| format!("part {n}: {e}"))?;
            held.insert(n, (p.offset, p.total, p.data));
        } else {
            return Err(format!("unknown key {k:?}"));
        }
    }
    let Some(head) = head else {
        return match held.keys().next() {
            None => Ok(None),
            Some(n) => Err(format!("part {n} without a head")),
        };
    };
    if head.first() != Some(&HEAD) {
        // From before parts: the whole checkpoint in one value.
        if !held.is_empty() {
            return Err(format!(
                "the head is not one (first byte {:#04x}), yet {} parts are stored",
                head.first().copied().unwrap_or(0),
                held.len()
            ));
        }
        let (checkpoint, sealed) = open::<pb::Checkpoint>(&head)?;
        return Ok(Some(Loaded {
            checkpoint,
            sealed,
            parts: 0,
        }));
    }
    let h = pb::CheckpointHead::decode(checked(&head).map_err(|e| format!("head: {e}"))?)
        .map_err(|e| format!("head does not decode: {e}"))?;
    let whole = join(h.parts, h.length, &held)?;
    let (checkpoint, sealed) = open::<pb::Checkpoint>(&whole).map_err(|e| format!("whole: {e}"))?;
    if !sealed {
        return Err("whole: not sealed".into());
    }
    if checkpoint.through_seq != h.through_seq {
        return Err(format!(
            "its head says through record {}, its parts hold one through {}",
            h.through_seq, checkpoint.through_seq
        ));
    }
    Ok(Some(Loaded {
        checkpoint,
        sealed,
        parts: h.parts,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp(through_seq: u64, files: usize) -> pb::Checkpoint {
        pb::Checkpoint {
            through_seq,
            next_handle: 9,
            entries: (0..files)
                .map(|i| pb::CheckpointEntry {
                    path: format!("/dir/file-{i:04}"),
                    length: i as u64,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn stored(s: &Sealed) -> Vec<(Vec<u8>, Bytes)> {
        s.values().collect()
    }

    /// A checkpoint lies in parts of at most the size asked and is read back whole; a
    /// later, smaller one leaves none of the earlier one's parts behind; a store from
    /// before parts loads as it is.
    #[test]
    fn a_checkpoint_is_stored_in_parts_and_read_back_whole() {
        let big = cp(40, 60);
        let s = Sealed::new(big.clone(), 100);
        let (parts, _) = s.size();
        let whole = seal(&big).len();
        assert_eq!(parts as usize, whole.div_ceil(100));
        assert!(parts > 10, "{parts} parts");
        for (k, v) in stored(&s) {
            assert!(
                k == CHECKPOINT_KEY || v.len() <= 100 + 32,
                "{k:?}: {}",
                v.len()
            );
        }
        let back = load(stored(&s)).unwrap().unwrap();
        assert_eq!(
            (back.checkpoint, back.parts, back.sealed),
            (big, parts, true)
        );

        // The writes of a smaller one over it remove the parts it does not overwrite.
        let mut store: BTreeMap<Vec<u8>, Bytes> = stored(&s).into_iter().collect();
        let mut count = parts;
        let small = Sealed::new(cp(80, 2), 100);
        let mut out = Vec::new();
        small.writes(&mut count, &mut out);
        for (k, v) in out {
            match v {
                Some(v) => store.insert(k, v),
                None => store.remove(&k),
            };
        }
        assert_eq!(count, small.size().0);
        assert_eq!(store.len(), 1 + count as usize, "the old parts are gone");
        assert_eq!(load(store).unwrap().unwrap().checkpoint, cp(80, 2));

        // A checkpoint stored whole, as before parts.
        let old = vec![(CHECKPOINT_KEY.to_vec(), seal(&cp(7, 3)))];
        let back = load(old).unwrap().unwrap();
        assert_eq!((back.checkpoint, back.parts), (cp(7, 3), 0));
        assert!(load(Vec::new()).unwrap().is_none());
    }

    /// A part damaged, missing, out of place, left over or from another checkpoint, or a
    /// head damaged, stops the load with what is wrong.
    #[test]
    fn damage_to_a_stored_checkpoint_is_refused() {
        let s = Sealed::new(cp(40, 60), 100);
        let vals = stored(&s);
        let part = |vals: &[(Vec<u8>, Bytes)], n: u32| {
            vals.iter().position(|(k, _)| *k == part_key(n)).unwrap()
        };
        let err = |vals: Vec<(Vec<u8>, Bytes)>| load(vals).expect_err("refused");

        let mut bad = vals.clone();
        let i = part(&bad, 2);
        let mut v = bad[i].1.to_vec();
        v[20] ^= 4;
        bad[i].1 = v.into();
        assert!(err(bad).contains("part 2: checksum mismatch"));

        let mut bad = vals.clone();
        bad.remove(part(&vals, 3));
        assert!(err(bad).contains("parts, "), "a part missing");

        let mut bad = vals.clone();
        let (a, b) = (part(&vals, 0), part(&vals, 1));
        let (va, vb) = (bad[a].1.clone(), bad[b].1.clone());
        bad[a].1 = vb;
        bad[b].1 = va;
        assert!(err(bad).contains("part 0 holds 100 bytes at 100"));

        let mut bad = vals.clone();
        bad.push((part_key(s.size().0 + 2), vals[part(&vals, 0)].1.clone()));
        assert!(err(bad).contains("held"), "a part left over");

        // A part from another checkpoint of the same length fits end to end: the
        // whole's own seal refuses it, and the head's record a first part with a seal
        // of its own.
        let mut changed = cp(40, 60);
        changed.entries[30].length = 31;
        let other = stored(&Sealed::new(changed, 100));
        let n = (1..s.size().0)
            .find(|&n| other[part(&other, n)].1 != vals[part(&vals, n)].1)
            .expect("a part differs");
        let mut bad = vals.clone();
        bad[part(&vals, n)].1 = other[part(&other, n)].1.clone();
        assert!(err(bad).contains("whole: checksum mismatch"));
        let other = stored(&Sealed::new(cp(41, 60), 100));
        let mut bad = vals.clone();
        bad[part(&vals, 0)].1 = other[part(&other, 0)].1.clone();
        assert!(
            err(bad).contains("its head says through record 40, its parts hold one through 41")
        );

        let mut bad = vals.clone();
        let mut v = bad[0].1.to_vec();
        *v.last_mut().unwrap() ^= 1;
        bad[0].1 = v.into();
        assert!(err(bad).contains("head: checksum mismatch"));

        let mut bad = vals.clone();
        let mut v = bad[0].1.to_vec();
        v[0] ^= 1;
        bad[0].1 = v.into();
        assert!(err(bad).contains("the head is not one (first byte 0xc7)"));

        let mut bad = vals.clone();
        bad.remove(0);
        assert!(err(bad).contains("part 0 without a head"));
        let mut bad = vals.clone();
        bad.push((b"checkpointx".to_vec(), Bytes::from_static(b"x")));
        assert!(err(bad).contains("unknown key"));
    }

    /// A binary from before parts reads `checkpoint` as a whole sealed checkpoint: it
    /// must refuse the head, not take it for the checkpoint of an empty namespace.
    #[test]
    fn a_binary_from_before_parts_refuses_the_head() {
        let s = Sealed::new(cp(40, 60), 100);
        let head = &stored(&s)[0].1;
        let e = open::<pb::Checkpoint>(head).expect_err("refused");
        assert!(e.contains("unknown format (first byte 0xc6)"), "{e}");
    }
}
