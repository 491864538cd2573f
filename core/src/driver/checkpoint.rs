//! A master alone's checkpoint as it lies in its store.
//!
//! A namespace's checkpoint soon passes what one value of a key-value store should hold,
//! so it is stored in parts: `checkpoint` holds a head (the record the checkpoint runs
//! through, how many parts, how many bytes, their checksum), and `checkpoint/<part, 4
//! bytes big-endian>` the checkpoint's encoding, in parts of about
//! `MasterOptions::checkpoint_part_bytes`. Head and parts are written in one batch with
//! the deletion of the records the checkpoint covers and of the earlier checkpoint's
//! parts past the new one's last (`driver::commit`).
//!
//! The encoding is never whole in memory, nor is the checkpoint as a message: the
//! checkpointer walks its state into pieces (`Meta::checkpoint_pieces`: the scalars,
//! then each item of each repeated field alone, such as an entry or a chunk), and
//! [`Sealed::build`] encodes each into the part being filled, cutting a part only
//! between pieces and sealing it at once. The encodings of a message's pieces, end to
//! end, are an encoding of the message, so each part decodes alone and merges into
//! those before it at start-up.
//! Loading refuses a part damaged, missing, out of place or left over, and checks the
//! head's checksum over every part's bytes end to end, so parts that fit end to end yet
//! come from two checkpoints are refused too.
//!
//! The head is sealed under a format byte of its own ([`HEAD`]). A binary from before
//! parts reads `checkpoint` as a whole checkpoint and refuses that byte; a head sealed as
//! an ordinary value would have decoded there as the checkpoint of an empty namespace.
//! Stores written before parts (the whole checkpoint in `checkpoint`), or in the first
//! layout of parts (the sealed whole cut at any byte, [`CUT_ANYWHERE`]), load as they
//! are; the next checkpoint is written in pieces.
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

/// [`pb::CheckpointHead::layout`]: the sealed whole cut at any byte (the first layout of
/// parts, still loaded).
pub const CUT_ANYWHERE: u32 = 0;
/// [`pb::CheckpointHead::layout`]: the encoding cut between the pieces it was encoded in.
pub const CUT_BETWEEN_PIECES: u32 = 1;

/// The size of parts asked for: 0 is [`PART_BYTES`].
fn part_size(part_bytes: usize) -> usize {
    if part_bytes == 0 {
        PART_BYTES
    } else {
        part_bytes
    }
}

/// `data` cut into consecutive pieces of at most `part_bytes` (0: [`PART_BYTES`]), each
/// with its offset.
pub(crate) fn split(data: &Bytes, part_bytes: usize) -> impl Iterator<Item = (u64, Bytes)> + '_ {
    let part = part_size(part_bytes);
    (0..data.len().div_ceil(part)).map(move |n| {
        let at = n * part;
        (at as u64, data.slice(at..(at + part).min(data.len())))
    })
}

/// The number of pieces [`split`] cuts `len` bytes into.
pub(crate) fn pieces(len: usize, part_bytes: usize) -> u32 {
    u32::try_from(len.div_ceil(part_size(part_bytes))).expect("a value in 2^32 parts")
}

/// The `length` bytes that exactly `count` stored pieces (numbered from 0, each its
/// offset, the total it claims and its bytes) hold end to end.
pub(crate) fn join(
    count: u32,
    length: u64,
    held: &BTreeMap<u32, (u64, u64, Bytes)>,
) -> Result<Bytes, String> {
    check_run(count, length, length, held)?;
    // Nothing is allocated on a length not yet seen to add up.
    let mut whole = BytesMut::with_capacity(length as usize);
    for (_, _, data) in held.values() {
        whole.extend_from_slice(data);
    }
    Ok(whole.freeze())
}

/// Whether exactly `count` stored pieces, each claiming the `total` given, hold
/// `length` bytes end to end.
fn check_run(
    count: u32,
    length: u64,
    total: u64,
    held: &BTreeMap<u32, (u64, u64, Bytes)>,
) -> Result<(), String> {
    if held.len() != count as usize || held.keys().next_back() != count.checked_sub(1).as_ref() {
        return Err(format!(
            "{count} parts, {} held (the last numbered {:?})",
            held.len(),
            held.keys().next_back()
        ));
    }
    let mut at = 0u64;
    for (n, (offset, claimed, data)) in held {
        if *offset != at || *claimed != total || data.is_empty() {
            return Err(format!(
                "part {n} holds {} bytes at {offset} of {claimed}, where {at} of {length} \
                 come next",
                data.len(),
            ));
        }
        at += data.len() as u64;
    }
    if at != length {
        return Err(format!("parts hold {at} bytes of {length}"));
    }
    Ok(())
}

/// `cp` in the pieces `Meta::checkpoint_pieces` gives a state's checkpoint in: its
/// scalars, then each item of each repeated field alone, the fields in the same order.
pub fn pieces_of(cp: pb::Checkpoint) -> impl Iterator<Item = pb::Checkpoint> {
    // Named field by field, so a field added to the message does not compile here
    // until it is given a piece.
    let pb::Checkpoint {
        through_seq,
        next_handle,
        entries,
        chunks,
        retired,
        reserved,
        cluster_id,
        completed,
        fallbacks,
        group_members,
        group_retired,
        lease_holders,
        leases_settled_in,
        master_epoch,
        capability_secret,
        root,
    } = cp;
    let scalars = pb::Checkpoint {
        through_seq,
        next_handle,
        cluster_id,
        leases_settled_in,
        master_epoch,
        capability_secret,
        root,
        ..Default::default()
    };
    let one = pb::Checkpoint::default;
    std::iter::once(scalars)
        .chain(entries.into_iter().map(move |e| pb::Checkpoint {
            entries: vec![e],
            ..one()
        }))
        .chain(chunks.into_iter().map(move |c| pb::Checkpoint {
            chunks: vec![c],
            ..one()
        }))
        .chain(retired.into_iter().map(move |r| pb::Checkpoint {
            retired: vec![r],
            ..one()
        }))
        .chain(reserved.into_iter().map(move |r| pb::Checkpoint {
            reserved: vec![r],
            ..one()
        }))
        .chain(fallbacks.into_iter().map(move |f| pb::Checkpoint {
            fallbacks: vec![f],
            ..one()
        }))
        .chain(completed.into_iter().map(move |c| pb::Checkpoint {
            completed: vec![c],
            ..one()
        }))
        .chain(lease_holders.into_iter().map(move |l| pb::Checkpoint {
            lease_holders: vec![l],
            ..one()
        }))
        // A group's snapshot's members, last, as the group checkpointer adds them.
        .chain(
            (!group_members.is_empty() || !group_retired.is_empty()).then(|| pb::Checkpoint {
                group_members,
                group_retired,
                ..one()
            }),
        )
}

/// A checkpoint ready for the store: its head and its parts, sealed.
#[derive(Clone, Debug)]
pub struct Sealed {
    pub through_seq: LogSeq,
    /// How many namespace entries and chunks it holds.
    pub entries: u64,
    pub chunks: u64,
    head: Bytes,
    parts: Vec<Bytes>,
}

impl Sealed {
    /// `cp` stored as [`Sealed::build`] stores a state's checkpoint: in the pieces
    /// [`pieces_of`] cuts it into.
    pub fn new(cp: pb::Checkpoint, part_bytes: usize) -> Sealed {
        Sealed::build(cp.through_seq, pieces_of(cp), part_bytes)
    }

    /// The checkpoint through record `through_seq` that `pieces` make up (merged in
    /// order: `Meta::checkpoint_pieces`), encoded piece by piece into parts of at most
    /// `part_bytes` (0: [`PART_BYTES`]) unless one piece alone is larger: a part is cut
    /// only between pieces, so such a piece gets a part of its own. Each part is sealed
    /// as soon as it is full: only the sealed parts and the one being filled are held,
    /// never the whole checkpoint or its whole encoding.
    pub fn build(
        through_seq: LogSeq,
        pieces: impl IntoIterator<Item = pb::Checkpoint>,
        part_bytes: usize,
    ) -> Sealed {
        let part_bytes = part_size(part_bytes);
        let mut parts = Vec::new();
        let (mut length, mut crc) = (0u64, 0u32);
        let mut filling: Vec<u8> = Vec::new();
        let (mut entries, mut chunks) = (0, 0);
        let mut cut = |filling: &mut Vec<u8>| {
            let data = Bytes::from(std::mem::take(filling));
            crc = crc32c::crc32c_append(crc, &data);
            let offset = length;
            length += data.len() as u64;
            // The total is not known yet: the head holds it.
            parts.push(seal(&pb::CheckpointPart {
                offset,
                total: 0,
                data,
            }));
        };
        for piece in pieces {
            // The scalars' piece says which record it runs through: it must be this
            // one, or the head and the parts would disagree.
            assert!(
                piece.through_seq == 0 || piece.through_seq == through_seq,
                "a piece of a checkpoint through record {} in one through {through_seq}",
                piece.through_seq
            );
            entries += piece.entries.len() as u64;
            chunks += piece.chunks.len() as u64;
            let len = piece.encoded_len();
            if !filling.is_empty() && filling.len() + len > part_bytes {
                cut(&mut filling);
            }
            if filling.is_empty() {
                filling.reserve_exact(part_bytes.max(len));
            }
            piece.encode(&mut filling).expect("a Vec grows");
        }
        if !filling.is_empty() {
            cut(&mut filling);
        }
        let head = seal_as(
            HEAD,
            &pb::CheckpointHead {
                through_seq,
                parts: u32::try_from(parts.len()).expect("a checkpoint in 2^32 parts"),
                length,
                layout: CUT_BETWEEN_PIECES,
                crc32c: crc,
            },
        );
        Sealed {
            through_seq,
            entries,
            chunks,
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
    let checkpoint = match h.layout {
        CUT_ANYWHERE => {
            let whole = join(h.parts, h.length, &held)?;
            let (checkpoint, sealed) =
                open::<pb::Checkpoint>(&whole).map_err(|e| format!("whole: {e}"))?;
            if !sealed {
                return Err("whole: not sealed".into());
            }
            checkpoint
        }
        CUT_BETWEEN_PIECES => {
            check_run(h.parts, h.length, 0, &held)?;
            let crc = held
                .values()
                .fold(0, |crc, (_, _, data)| crc32c::crc32c_append(crc, data));
            if crc != h.crc32c {
                return Err(format!(
                    "the parts' checksum is {crc:#010x}, the head's {:#010x}",
                    h.crc32c
                ));
            }
            // Each part is dropped once merged.
            let mut checkpoint = pb::Checkpoint::default();
            for (n, (_, _, data)) in held {
                checkpoint
                    .merge(data)
                    .map_err(|e| format!("part {n} does not decode: {e}"))?;
            }
            checkpoint
        }
        other => {
            return Err(format!(
                "head: unknown layout {other} (from a newer binary?)"
            ));
        }
    };
    if checkpoint.through_seq != h.through_seq {
        return Err(format!(
            "its head says through record {}, its parts hold one through {}",
            h.through_seq, checkpoint.through_seq
        ));
    }
    Ok(Some(Loaded {
        checkpoint,
        sealed: true,
        parts: h.parts,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::master::unseal;
    use crate::master::Meta;
    use crate::pb::log_record::Op;

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

    /// The stored parts' bytes end to end.
    fn data(vals: &[(Vec<u8>, Bytes)]) -> Vec<u8> {
        vals.iter()
            .filter(|(k, _)| k.starts_with(PART_PREFIX))
            .flat_map(|(_, v)| unseal::<pb::CheckpointPart>(v).unwrap().data)
            .collect()
    }

    /// A store in the first layout of parts: the sealed whole cut at any byte.
    fn cut_anywhere(cp: &pb::Checkpoint, part_bytes: usize) -> Vec<(Vec<u8>, Bytes)> {
        let whole = seal(cp);
        let total = whole.len() as u64;
        let mut out = vec![(
            CHECKPOINT_KEY.to_vec(),
            seal_as(
                HEAD,
                &pb::CheckpointHead {
                    through_seq: cp.through_seq,
                    parts: pieces(whole.len(), part_bytes),
                    length: total,
                    ..Default::default()
                },
            ),
        )];
        for (n, (offset, data)) in split(&whole, part_bytes).enumerate() {
            let part = pb::CheckpointPart {
                offset,
                total,
                data,
            };
            out.push((part_key(n as u32), seal(&part)));
        }
        out
    }

    /// A checkpoint lies in parts of at most the size asked, cut between its pieces, and
    /// is read back whole; a piece larger than a part gets one of its own; a later,
    /// smaller one leaves none of the earlier one's parts behind; stores from before
    /// parts and in the first layout of parts load as they are.
    #[test]
    fn a_checkpoint_is_stored_in_parts_and_read_back_whole() {
        let mut big = cp(40, 60);
        big.entries[7].path = format!("/dir/{}", "x".repeat(300));
        let s = Sealed::new(big.clone(), 100);
        let (parts, _) = s.size();
        assert!(parts > 10, "{parts} parts");
        let vals = stored(&s);
        let mut oversized = 0;
        for (k, v) in &vals {
            if k == CHECKPOINT_KEY {
                continue;
            }
            let data = unseal::<pb::CheckpointPart>(v).unwrap().data;
            // Each part decodes alone: it was cut between pieces.
            let piece = pb::Checkpoint::decode(data.clone()).expect("a part decodes alone");
            if data.len() > 100 {
                oversized += 1;
                assert_eq!(piece.entries.len(), 1, "only a piece too big is alone");
                assert!(piece.entries[0].path.len() > 300);
            }
        }
        assert_eq!(oversized, 1);
        // End to end, the parts are an encoding of the checkpoint.
        assert_eq!(pb::Checkpoint::decode(&data(&vals)[..]).unwrap(), big);
        let back = load(vals).unwrap().unwrap();
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

        // The first layout of parts.
        let first = cut_anywhere(&cp(9, 60), 100);
        let back = load(first.clone()).unwrap().unwrap();
        assert_eq!(
            (back.checkpoint, back.parts),
            (cp(9, 60), first.len() as u32 - 1)
        );
    }

    /// A state's checkpoint built from its pieces, as the checkpointer builds it, is the
    /// state's checkpoint: entries, chunks and completed requests included.
    #[test]
    fn the_pieces_of_a_state_make_up_its_checkpoint() {
        let mut records = Vec::new();
        let mut rec = |token, op| {
            records.push((
                records.len() as u64 + 1,
                pb::LogRecord {
                    time_ms: 1,
                    token,
                    op: Some(op),
                },
            ))
        };
        rec(
            0,
            Op::ClusterId(pb::ClusterIdOp {
                root: None,
                cluster_id: 5,
            }),
        );
        rec(
            0,
            Op::Mkdir(pb::MkdirOp {
                perms: None,
                path: "/d".into(),
            }),
        );
        for i in 0..20u64 {
            let path = format!("/d/f{i}");
            let op = Op::Create(pb::CreateOp {
                perms: None,
                path: path.clone(),
                replication: 3,
                chunk_size: 1 << 20,
            });
            rec(1000 + i, op);
            rec(
                0,
                Op::AddChunk(pb::AddChunkOp {
                    path,
                    handle: i + 1,
                }),
            );
        }
        let (meta, through) = Meta::replay(1 << 20, None, records).unwrap();
        let want = meta.checkpoint(through);
        assert_eq!(
            (want.entries.len(), want.chunks.len(), want.completed.len()),
            (21, 20, 20)
        );
        let s = Sealed::build(through, meta.checkpoint_pieces(through), 64);
        let len = want.encoded_len();
        assert!(
            len > 640 && s.size().0 as usize >= len / 64,
            "{len} bytes in {:?}",
            s.size()
        );
        assert_eq!((s.entries, s.chunks), (21, 20));
        assert_eq!(s.read().unwrap(), want);
        // The same, built from the whole message.
        assert_eq!(stored(&Sealed::new(want.clone(), 64)), stored(&s));
        // Sealed whole from the pieces, as a replica's snapshot is: the same message in
        // as many bytes as sealing the message gives.
        let whole = super::super::master::seal_pieces(meta.checkpoint_pieces(through));
        assert_eq!(whole.len(), seal(&want).len());
        assert_eq!(unseal::<pb::Checkpoint>(&whole).unwrap(), want);
    }

    /// A part damaged, missing, out of place, left over, from another checkpoint or cut
    /// inside a piece, or a head damaged or forged, stops the load with what is wrong.
    #[test]
    fn damage_to_a_stored_checkpoint_is_refused() {
        let s = Sealed::new(cp(40, 60), 100);
        let vals = stored(&s);
        let part = |vals: &[(Vec<u8>, Bytes)], n: u32| {
            vals.iter().position(|(k, _)| *k == part_key(n)).unwrap()
        };
        let err = |vals: Vec<(Vec<u8>, Bytes)>| load(vals).expect_err("refused");
        let head = pb::CheckpointHead::decode(checked(&vals[0].1).unwrap()).unwrap();
        let with_head = |vals: &[(Vec<u8>, Bytes)], h: pb::CheckpointHead| {
            let mut bad = vals.to_vec();
            bad[0].1 = seal_as(HEAD, &h);
            bad
        };

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
        let e = err(bad);
        assert!(
            e.contains("part 0 holds") && e.contains("where 0 of"),
            "{e}"
        );

        let mut bad = vals.clone();
        bad.push((part_key(s.size().0 + 2), vals[part(&vals, 0)].1.clone()));
        assert!(err(bad).contains("held"), "a part left over");

        // A part from another checkpoint, cut at the same places, fits end to end: the
        // head's checksum of every part refuses it.
        let mut changed = cp(40, 60);
        changed.entries[30].length = 31;
        let other = stored(&Sealed::new(changed, 100));
        let n = (1..s.size().0)
            .find(|&n| other[part(&other, n)].1 != vals[part(&vals, n)].1)
            .expect("a part differs");
        let mut bad = vals.clone();
        bad[part(&vals, n)].1 = other[part(&other, n)].1.clone();
        assert!(err(bad).contains("the parts' checksum is"));
        let other = stored(&Sealed::new(cp(41, 60), 100));
        let mut bad = vals.clone();
        bad[part(&vals, 0)].1 = other[part(&other, 0)].1.clone();
        assert!(err(bad).contains("the parts' checksum is"));

        // A head that agrees with the parts in all but its record.
        let forged = pb::CheckpointHead {
            through_seq: 41,
            ..head
        };
        assert!(
            err(with_head(&vals, forged))
                .contains("its head says through record 41, its parts hold one through 40")
        );
        let newer = pb::CheckpointHead { layout: 7, ..head };
        assert!(err(with_head(&vals, newer)).contains("unknown layout 7"));

        // The same bytes cut inside a piece, under a head that agrees with them: a part
        // that does not decode alone.
        let bytes = Bytes::from(data(&vals));
        let mut recut = vec![(CHECKPOINT_KEY.to_vec(), Bytes::new())];
        for (n, (offset, data)) in split(&bytes, 7).enumerate() {
            let p = pb::CheckpointPart {
                offset,
                total: 0,
                data,
            };
            recut.push((part_key(n as u32), seal(&p)));
        }
        let h = pb::CheckpointHead {
            parts: recut.len() as u32 - 1,
            ..head
        };
        assert!(err(with_head(&recut, h)).contains("does not decode"));

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

        // The first layout keeps its own checks: a part from another checkpoint of the
        // same length fails the whole's seal.
        let first = cut_anywhere(&cp(40, 60), 100);
        let mut changed = cp(40, 60);
        changed.entries[30].length = 31;
        let other = cut_anywhere(&changed, 100);
        let n = (1..first.len())
            .find(|&n| other[n].1 != first[n].1)
            .expect("a part differs");
        let mut bad = first.clone();
        bad[n].1 = other[n].1.clone();
        assert!(err(bad).contains("whole: checksum mismatch"));
    }

    /// A binary of the first layout of parts joins the parts and opens the whole as one
    /// sealed value: it must refuse a store in pieces, not misread it. Each part claims
    /// a total of 0, which its join refuses; past that, the bytes end to end are no
    /// sealed value, which it refuses too.
    #[test]
    fn a_binary_of_the_first_layout_refuses_pieces() {
        let vals = stored(&Sealed::new(cp(40, 60), 100));
        let h = pb::CheckpointHead::decode(checked(&vals[0].1).unwrap()).unwrap();
        let held: BTreeMap<u32, (u64, u64, Bytes)> = vals[1..]
            .iter()
            .enumerate()
            .map(|(n, (_, v))| {
                let p = unseal::<pb::CheckpointPart>(v).unwrap();
                (n as u32, (p.offset, p.total, p.data))
            })
            .collect();
        let e = join(h.parts, h.length, &held).expect_err("refused");
        assert!(e.contains("part 0 holds") && e.contains(" of 0,"), "{e}");
        let whole = Bytes::from(data(&vals));
        let (_, sealed) = open::<pb::Checkpoint>(&whole).unwrap();
        assert!(
            !sealed,
            "taken for a value from before sealing, which it refuses"
        );
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
