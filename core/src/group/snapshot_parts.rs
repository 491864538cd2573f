//! Snapshots sent in parts. A leader sends a follower its snapshot (a checkpoint of the
//! namespace) when the follower needs entries the leader's log no longer holds: a
//! replica just added, or one that was down while the log was truncated. A snapshot
//! grows with the namespace and soon passes what one call may carry (the transport's
//! message limit), so one larger than `GroupConfig::snapshot_part_bytes` goes as parts,
//! each a call of its own.
//!
//! - Every part carries the snapshot message itself with its data left empty, the
//!   offset of its bytes and the whole data's length: parts may come in any order.
//! - The receiver holds the parts from each sender until it has every byte, then takes
//!   the message whole, as if it had come in one piece, through the same checks.
//! - A lost part is not asked for again. The leader, hearing nothing back, sends the
//!   whole snapshot again after a while (`Replica::retry_snapshots`); the receiver drops
//!   what it held of a snapshot whose parts stopped coming (`Assembler::expire`).
//! - A receiver holds one snapshot per sender: a part of a later one (a later term, or
//!   a later index) replaces it; a part of an earlier one is refused. What it holds in
//!   all is capped, and each part's bytes are copied out of the request that brought
//!   them (a slice would keep the whole request's buffer).
//! - The sender sends the parts one after another, each with a deadline of its own.
//!
//! Nothing a part claims is trusted: a part that does not fit its snapshot (bytes past
//! its end, overlapping bytes already held, a length that changes) is refused, and the
//! message made whole is checked as any peer's message is.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};

use crate::pb;

/// raft-rs's `MsgSnapshot`, as it goes on the wire.
const MSG_SNAPSHOT: u32 = 7;

/// The largest snapshot a receiver assembles: far past any namespace this master
/// holds in memory, so only a forged length reaches it.
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 36;

/// A message for the wire: whole, or in parts.
#[derive(Debug)]
pub enum Piece {
    Whole(Box<pb::RaftMessage>),
    Parts(Vec<pb::RaftSnapshotPart>),
}

/// `m` whole, unless it is a snapshot whose data is larger than `part_bytes`: then its
/// parts, in order, each at most `part_bytes` of the data (sliced, not copied).
pub fn split(mut m: pb::RaftMessage, part_bytes: usize) -> Piece {
    let part_bytes = part_bytes.max(1);
    let Some(s) = m.snapshot.as_mut() else {
        return Piece::Whole(Box::new(m));
    };
    if s.data.len() <= part_bytes {
        return Piece::Whole(Box::new(m));
    }
    let data = std::mem::take(&mut s.data);
    let total = data.len() as u64;
    let parts = (0..data.len())
        .step_by(part_bytes)
        .map(|at| pb::RaftSnapshotPart {
            message: Some(m.clone()),
            offset: at as u64,
            total,
            data: data.slice(at..(at + part_bytes).min(data.len())),
        })
        .collect();
    Piece::Parts(parts)
}

/// What a receiver holds of one sender's snapshot.
#[derive(Debug)]
struct Assembly {
    /// The message's term and its snapshot's index: which snapshot this is.
    term: u64,
    index: u64,
    total: u64,
    message: pb::RaftMessage,
    /// The bytes held, by offset; none overlap.
    parts: BTreeMap<u64, Bytes>,
    held: u64,
    /// The tick its latest part came at.
    touched: u64,
}

/// The snapshots a replica is receiving in parts, one per sender.
#[derive(Debug, Default)]
pub struct Assembler {
    from: BTreeMap<u64, Assembly>,
    /// Parts taken, and snapshots made whole from parts, since the replica started.
    pub parts_taken: u64,
    pub assembled: u64,
}

impl Assembler {
    /// Takes `part` (its message already known to come from a member, for this
    /// replica), at tick `tick`: the message whole once every byte of its snapshot is
    /// held, or `None` while some are missing. A part that does not fit is refused.
    pub fn take(
        &mut self,
        part: pb::RaftSnapshotPart,
        tick: u64,
    ) -> Result<Option<pb::RaftMessage>, String> {
        let pb::RaftSnapshotPart {
            message,
            offset,
            total,
            data,
        } = part;
        let message = message.ok_or("a snapshot part without its message")?;
        if message.msg_type != MSG_SNAPSHOT {
            return Err(format!(
                "a snapshot part carries a message of type {}, not a snapshot",
                message.msg_type
            ));
        }
        let (index, has_data) = match &message.snapshot {
            Some(s) => (
                s.metadata.as_ref().map(|m| m.index).unwrap_or(0),
                !s.data.is_empty(),
            ),
            None => return Err("a snapshot part whose message has no snapshot".into()),
        };
        if has_data {
            return Err("a snapshot part whose message carries data of its own".into());
        }
        if total == 0 || total > MAX_SNAPSHOT_BYTES {
            return Err(format!(
                "a snapshot part claims a snapshot of {total} bytes"
            ));
        }
        let end = offset.checked_add(data.len() as u64);
        if data.is_empty() || end.is_none_or(|e| e > total) {
            return Err(format!(
                "a snapshot part of {} bytes at {offset} does not fit a snapshot of {total}",
                data.len()
            ));
        }
        let from = message.from;
        let term = message.term;
        match self.from.get(&from) {
            Some(a) if (a.term, a.index) > (term, index) => {
                return Err(format!(
                    "a part of snapshot {index} (term {term}) after one of a later snapshot \
                     {} (term {})",
                    a.index, a.term
                ));
            }
            Some(a) if (a.term, a.index) == (term, index) && a.total != total => {
                return Err(format!(
                    "a part of snapshot {index} (term {term}) of {total} bytes, where the \
                     parts held say {}",
                    a.total
                ));
            }
            Some(a) if (a.term, a.index) == (term, index) => {}
            _ => {
                let others: u64 = self
                    .from
                    .iter()
                    .filter(|(f, _)| **f != from)
                    .map(|(_, a)| a.held)
                    .sum();
                if others + total > MAX_SNAPSHOT_BYTES {
                    return Err(format!(
                        "a snapshot of {total} bytes, with {others} held of others: past \
                         the {MAX_SNAPSHOT_BYTES} bytes a replica assembles"
                    ));
                }
                self.from.insert(
                    from,
                    Assembly {
                        term,
                        index,
                        total,
                        message,
                        parts: BTreeMap::new(),
                        held: 0,
                        touched: tick,
                    },
                );
            }
        }
        let a = self.from.get_mut(&from).expect("inserted above");
        let len = data.len() as u64;
        if let Some(held) = a.parts.get(&offset) {
            if held.len() as u64 == len {
                // Sent again: the same bytes.
                a.touched = tick;
                return Ok(None);
            }
            return Err(format!(
                "a snapshot part at {offset} of {len} bytes, where one of {} is held",
                held.len()
            ));
        }
        let overlaps_before = a
            .parts
            .range(..offset)
            .next_back()
            .is_some_and(|(&o, b)| o + b.len() as u64 > offset);
        let overlaps_after = a
            .parts
            .range(offset..)
            .next()
            .is_some_and(|(&o, _)| offset + len > o);
        if overlaps_before || overlaps_after {
            return Err(format!(
                "a snapshot part at {offset} of {len} bytes overlaps bytes already held"
            ));
        }
        // Copied: a slice would keep the whole request it came in.
        a.parts.insert(offset, Bytes::copy_from_slice(&data));
        a.held += len;
        a.touched = tick;
        self.parts_taken += 1;
        if a.held < a.total {
            return Ok(None);
        }
        // Every byte, none twice: the parts tile the data from 0 to its end.
        let a = self.from.remove(&from).expect("held above");
        let mut whole = BytesMut::with_capacity(a.total as usize);
        for (o, b) in &a.parts {
            debug_assert_eq!(*o, whole.len() as u64, "parts tile the snapshot");
            whole.extend_from_slice(b);
        }
        let mut message = a.message;
        if let Some(s) = message.snapshot.as_mut() {
            s.data = whole.freeze();
        }
        self.assembled += 1;
        Ok(Some(message))
    }

    /// Drops what is held of each snapshot that had no part for `after` ticks.
    pub fn expire(&mut self, tick: u64, after: u64) {
        self.from.retain(|from, a| {
            let keep = tick.saturating_sub(a.touched) < after;
            if !keep {
                tracing::debug!(
                    from,
                    index = a.index,
                    held = a.held,
                    total = a.total,
                    "dropped a snapshot whose parts stopped coming"
                );
            }
            keep
        });
    }

    /// Bytes held of snapshots not yet whole.
    pub fn held_bytes(&self) -> u64 {
        self.from.values().map(|a| a.held).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(from: u64, term: u64, index: u64, data: &[u8]) -> pb::RaftMessage {
        pb::RaftMessage {
            msg_type: MSG_SNAPSHOT,
            from,
            to: 2,
            term,
            snapshot: Some(pb::RaftSnapshot {
                data: Bytes::copy_from_slice(data),
                metadata: Some(pb::RaftSnapshotMeta {
                    index,
                    term,
                    conf_state: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn parts(m: pb::RaftMessage, n: usize) -> Vec<pb::RaftSnapshotPart> {
        match split(m, n) {
            Piece::Parts(p) => p,
            Piece::Whole(_) => panic!("expected parts"),
        }
    }

    #[test]
    fn a_small_snapshot_and_other_messages_go_whole() {
        let m = snapshot(1, 2, 10, b"abc");
        assert!(matches!(split(m.clone(), 3), Piece::Whole(w) if *w == m));
        let plain = pb::RaftMessage {
            msg_type: 3,
            ..Default::default()
        };
        assert!(matches!(split(plain, 1), Piece::Whole(_)));
    }

    #[test]
    fn parts_in_any_order_make_the_message_whole_once_each_byte_came() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let m = snapshot(1, 2, 10, &data);
        let mut ps = parts(m.clone(), 64);
        assert_eq!(ps.len(), 16);
        assert!(ps.iter().all(|p| p.data.len() <= 64 && p.total == 1000));
        ps.reverse();
        ps.swap(3, 9);
        let mut a = Assembler::default();
        let last = ps.pop().unwrap();
        for p in ps.clone() {
            assert_eq!(a.take(p, 0), Ok(None));
        }
        // A part sent again changes nothing.
        assert_eq!(a.take(ps[0].clone(), 0), Ok(None));
        assert_eq!(a.held_bytes(), 1000 - last.data.len() as u64);
        assert_eq!(a.take(last, 0), Ok(Some(m)));
        assert_eq!(a.held_bytes(), 0);
        assert_eq!((a.parts_taken, a.assembled), (16, 1));
    }

    #[test]
    fn a_part_that_does_not_fit_is_refused() {
        let m = snapshot(1, 2, 10, &[5; 100]);
        let ps = parts(m, 40);
        let mut a = Assembler::default();
        assert_eq!(a.take(ps[0].clone(), 0), Ok(None));
        let mut past_end = ps[2].clone();
        past_end.offset = 90;
        assert!(a.take(past_end, 0).is_err());
        let mut overlapping = ps[1].clone();
        overlapping.offset = 30;
        assert!(a.take(overlapping, 0).is_err());
        let mut other_length = ps[0].clone();
        other_length.data = other_length.data.slice(..10);
        assert!(a.take(other_length, 0).is_err());
        let mut other_total = ps[1].clone();
        other_total.total = 120;
        assert!(a.take(other_total, 0).is_err());
        let mut huge = ps[1].clone();
        huge.total = MAX_SNAPSHOT_BYTES + 1;
        assert!(a.take(huge, 0).is_err());
        let mut carries_data = ps[1].clone();
        carries_data.message = Some(snapshot(1, 2, 10, b"x"));
        assert!(a.take(carries_data, 0).is_err());
        let mut not_a_snapshot = ps[1].clone();
        not_a_snapshot.message.as_mut().unwrap().msg_type = 3;
        assert!(a.take(not_a_snapshot, 0).is_err());
        let mut empty = ps[1].clone();
        empty.data = Bytes::new();
        assert!(a.take(empty, 0).is_err());
        let mut wrapping = ps[1].clone();
        wrapping.offset = u64::MAX;
        assert!(a.take(wrapping, 0).is_err());
        // None of it was taken: the rest still makes the snapshot whole.
        assert_eq!(a.take(ps[1].clone(), 0), Ok(None));
        assert!(matches!(a.take(ps[2].clone(), 0), Ok(Some(_))));
    }

    #[test]
    fn a_later_snapshot_replaces_an_earlier_and_an_earlier_is_refused() {
        let old = parts(snapshot(1, 2, 10, &[1; 100]), 40);
        let new = parts(snapshot(1, 2, 20, &[2; 100]), 40);
        let mut a = Assembler::default();
        assert_eq!(a.take(old[0].clone(), 0), Ok(None));
        assert_eq!(a.take(new[0].clone(), 0), Ok(None));
        assert!(a.take(old[1].clone(), 0).is_err());
        assert_eq!(a.take(new[1].clone(), 0), Ok(None));
        let whole = a.take(new[2].clone(), 0).unwrap().unwrap();
        assert_eq!(whole.snapshot.unwrap().data, Bytes::from(vec![2u8; 100]));
        // Another sender's snapshot is held apart.
        let other = parts(snapshot(3, 2, 10, &[3; 100]), 40);
        assert_eq!(a.take(other[0].clone(), 0), Ok(None));
        assert_eq!(a.held_bytes(), 40);
    }

    #[test]
    fn a_snapshot_whose_parts_stopped_coming_is_dropped() {
        let ps = parts(snapshot(1, 2, 10, &[1; 100]), 40);
        let mut a = Assembler::default();
        assert_eq!(a.take(ps[0].clone(), 5), Ok(None));
        a.expire(10, 10);
        assert_eq!(a.held_bytes(), 40);
        a.expire(15, 10);
        assert_eq!(a.held_bytes(), 0);
        // Sent again, it is taken from the start.
        for p in &ps[..2] {
            assert_eq!(a.take(p.clone(), 20), Ok(None));
        }
        assert!(matches!(a.take(ps[2].clone(), 20), Ok(Some(_))));
    }
}
