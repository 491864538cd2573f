//! A replica's copy of the replicated log, as raft-rs reads it (`raft::Storage`), and how
//! it lies in the replica's `MetaStore`.
//!
//! In the store: `group/hard` (term, vote, commit), `group/conf` (the voters and
//! learners, with every member's address and the ids retired: `members.rs`),
//! `group/snap` (the latest snapshot's metadata: a checkpoint of the master's state as of
//! a log index), `group/snap/<part, 4 bytes big-endian>` (the checkpoint's bytes, in
//! parts of at most `GroupConfig::snapshot_part_bytes`: a namespace's checkpoint soon
//! passes what one value of a key-value store should hold) and
//! `group/log/<index, 8 bytes big-endian>` (the entries after it). Every value is sealed
//! like the single master's log (`driver::master::seal`), so damage is found when the
//! replica starts, not believed. A snapshot and its parts are written in one batch.
//! A store written before snapshots went in parts (its data in `group/snap` itself)
//! loads as it is.
//!
//! The copy in memory is updated when raft-rs hands over entries, before they are on
//! disk (raft-rs asks for that: it reads them back before they are persisted); a replica
//! tells raft-rs an entry is persisted only once the driver has synced its write.

use bytes::Bytes;
use raft::eraftpb as rp;
use raft::{GetEntriesContext, RaftState, StorageError};

use super::members::Members;
use super::wire;
use crate::driver::checkpoint::{join, pieces, split};
use crate::driver::master::{seal, unseal};
use crate::pb;

pub const PREFIX: &[u8] = b"group/";
pub const HARD_KEY: &[u8] = b"group/hard";
pub const CONF_KEY: &[u8] = b"group/conf";
pub const SNAP_KEY: &[u8] = b"group/snap";
pub const SNAP_PART_PREFIX: &[u8] = b"group/snap/";

fn part_key(n: u32) -> Vec<u8> {
    let mut k = SNAP_PART_PREFIX.to_vec();
    k.extend_from_slice(&n.to_be_bytes());
    k
}
pub const LOG_PREFIX: &[u8] = b"group/log/";

pub fn entry_key(index: u64) -> Vec<u8> {
    let mut k = LOG_PREFIX.to_vec();
    k.extend_from_slice(&index.to_be_bytes());
    k
}

/// A write for the replica's store: a key and its new value (None: delete it).
pub type Write = (Vec<u8>, Option<Bytes>);

#[derive(Debug, Default)]
pub struct LogStore {
    hard: rp::HardState,
    conf: rp::ConfState,
    /// Addresses of the members `conf` names, and the ids retired (empty in a store a
    /// replica that is joining formatted, or one written before membership changed).
    members: Members,
    /// The log index of the last membership change `conf` holds (`changed_at`).
    changed_at: u64,
    snap: rp::Snapshot,
    /// The entries after the snapshot, consecutive.
    entries: Vec<rp::Entry>,
    /// No snapshot is handed to raft-rs before one through this index is taken (not
    /// kept: a restart asks again, see `Replica::new`): a learner was added at it, and
    /// must start from a snapshot that names it and the members.
    wanted: u64,
    /// How many parts the stored snapshot's data lies in, and the most bytes a new one
    /// puts in each.
    stored_parts: u32,
    part_bytes: usize,
}

impl LogStore {
    /// A new group's first state: no entries, the given voters.
    pub fn fresh(members: std::collections::BTreeMap<u64, String>) -> LogStore {
        let conf = rp::ConfState {
            voters: members.keys().copied().collect(),
            ..Default::default()
        };
        let mut snap = rp::Snapshot::default();
        snap.mut_metadata().set_conf_state(conf.clone());
        LogStore {
            conf,
            members: Members::of(members),
            snap,
            ..Default::default()
        }
    }

    /// A replica's that joins a running group: it knows no members until the group's
    /// log (or a snapshot of it) reaches it, and is no voter until the leader makes it
    /// one.
    pub fn joining() -> LogStore {
        LogStore::default()
    }

    /// The members' addresses and retired ids, as far as this store knows them.
    pub fn members(&self) -> &Members {
        &self.members
    }

    pub fn conf(&self) -> &rp::ConfState {
        &self.conf
    }

    fn conf_record(&self) -> Bytes {
        let mut c = wire::conf_to_pb(&self.conf);
        c.addresses = self.members.addresses.clone().into_iter().collect();
        c.retired = self.members.retired.iter().copied().collect();
        c.changed_at = self.changed_at;
        seal(&c)
    }

    /// Takes the addresses of a store written before membership could change (its
    /// conf has voters but no addresses); they are written with the next change.
    pub fn adopt(&mut self, members: Members) {
        assert!(
            self.members.addresses.is_empty(),
            "the store knows its members already"
        );
        self.members = members;
    }

    /// The log index of the last membership change the store holds: a committed change
    /// at or below it is applied already.
    pub fn changed_at(&self) -> u64 {
        self.changed_at
    }

    /// Takes the membership change of entry `index` raft-rs applied: its new voters and
    /// learners, and the addresses and retired ids that go with them.
    pub fn set_conf(
        &mut self,
        index: u64,
        conf: rp::ConfState,
        members: Members,
        out: &mut Vec<Write>,
    ) {
        self.conf = conf;
        self.members = members;
        self.changed_at = index;
        out.push((CONF_KEY.to_vec(), Some(self.conf_record())));
    }

    /// The voting members the store holds, in order.
    pub fn voters(&self) -> Vec<u64> {
        let mut v = self.conf.voters.clone();
        v.sort_unstable();
        v
    }

    /// The writes that make the store hold `self` from scratch (a new group's first).
    pub fn format(&self) -> Vec<Write> {
        vec![
            (CONF_KEY.to_vec(), Some(self.conf_record())),
            (HARD_KEY.to_vec(), Some(seal(&wire::hard_to_pb(&self.hard)))),
        ]
    }

    /// The store as the values under [`PREFIX`] describe it, each checked.
    pub fn load(values: impl IntoIterator<Item = (Vec<u8>, Bytes)>) -> Result<LogStore, String> {
        let damaged = |what: &str, e: String| {
            format!(
                "the master replica's log is damaged: {what}: {e}; refusing to start on it. \
                 Replace the replica: remove it from the group (`tessera admin masters \
                 remove ID`) and add a new one under a new id. Do not start it on an older \
                 copy of its data: it may have acknowledged entries the copy lacks"
            )
        };
        let mut s = LogStore::default();
        let mut have_conf = false;
        let mut head: Option<pb::RaftSnapshot> = None;
        let mut parts: std::collections::BTreeMap<u32, pb::RaftSnapshotPart> = Default::default();
        for (k, v) in values {
            if k == HARD_KEY {
                s.hard = wire::hard_from_pb(unseal(&v).map_err(|e| damaged("hard state", e))?);
            } else if k == CONF_KEY {
                let c: pb::RaftConfState = unseal(&v).map_err(|e| damaged("voters", e))?;
                s.members = Members {
                    addresses: c.addresses.clone().into_iter().collect(),
                    retired: c.retired.iter().copied().collect(),
                };
                s.changed_at = c.changed_at;
                s.conf = wire::conf_from_pb(c);
                have_conf = true;
            } else if k == SNAP_KEY {
                head = Some(unseal(&v).map_err(|e| damaged("snapshot", e))?);
            } else if let Some(n) = k.strip_prefix(SNAP_PART_PREFIX) {
                let n = <[u8; 4]>::try_from(n)
                    .map(u32::from_be_bytes)
                    .map_err(|_| damaged("snapshot part key", format!("{k:?}")))?;
                let what = format!("snapshot part {n}");
                parts.insert(n, unseal(&v).map_err(|e| damaged(&what, e))?);
            } else if let Some(i) = k.strip_prefix(LOG_PREFIX) {
                let index = <[u8; 8]>::try_from(i)
                    .map(u64::from_be_bytes)
                    .map_err(|_| damaged("log key", format!("{k:?}")))?;
                let what = format!("entry {index}");
                let e = wire::entry_from_pb(unseal(&v).map_err(|e| damaged(&what, e))?)
                    .map_err(|e| damaged(&what, e))?;
                if e.index != index {
                    return Err(damaged(&what, format!("holds entry {}", e.index)));
                }
                s.entries.push(e);
            } else {
                return Err(damaged("unknown key", format!("{k:?}")));
            }
        }
        if !have_conf {
            return Err("the master replica's store has no voters: not a replica's store".into());
        }
        if let Some(h) = head {
            let (data, n) = snapshot_data(&h, parts).map_err(|e| damaged("snapshot", e))?;
            s.stored_parts = n;
            s.snap = wire::snapshot_from_pb(pb::RaftSnapshot { data, ..h });
        } else if !parts.is_empty() {
            return Err(damaged("snapshot", "parts without a snapshot".into()));
        }
        s.entries.sort_by_key(|e| e.index);
        // Entries the snapshot covers may outlive it when a crash cut the batch that
        // removed them (they are written in one batch, but be lenient with an old one).
        let snap_index = s.snap.get_metadata().index;
        s.entries.retain(|e| e.index > snap_index);
        if let Some(first) = s.entries.first()
            && first.index != snap_index + 1
        {
            return Err(damaged(
                "log",
                format!("entry {} follows snapshot {snap_index}", first.index),
            ));
        }
        for w in s.entries.windows(2) {
            if w[1].index != w[0].index + 1 {
                return Err(damaged(
                    "log",
                    format!("entry {} follows {}", w[1].index, w[0].index),
                ));
            }
        }
        if s.hard.commit < snap_index {
            s.hard.commit = snap_index;
        }
        // What raft-rs would take on trust at start-up, and stop on.
        wire::check_conf(&s.conf).map_err(|e| damaged("voters", e))?;
        wire::check_conf(s.snap.get_metadata().get_conf_state())
            .map_err(|e| damaged("snapshot", e))?;
        if s.hard.commit > s.last() {
            return Err(damaged(
                "hard state",
                format!(
                    "commits entry {} past the log's end {}",
                    s.hard.commit,
                    s.last()
                ),
            ));
        }
        Ok(s)
    }

    pub fn hard_state(&self) -> &rp::HardState {
        &self.hard
    }

    pub fn snapshot_ref(&self) -> &rp::Snapshot {
        &self.snap
    }

    pub fn snapshot_index(&self) -> u64 {
        self.snap.get_metadata().index
    }

    fn first(&self) -> u64 {
        self.snapshot_index() + 1
    }

    fn last(&self) -> u64 {
        self.snapshot_index() + self.entries.len() as u64
    }

    /// The entry at `index`, if held.
    pub fn entry(&self, index: u64) -> Option<&rp::Entry> {
        let i = index.checked_sub(self.first())?;
        self.entries.get(usize::try_from(i).ok()?)
    }

    /// Takes entries raft-rs handed over (they may replace a conflicting tail).
    pub fn append(&mut self, ents: &[rp::Entry], out: &mut Vec<Write>) {
        let Some(first) = ents.first() else { return };
        assert!(
            first.index >= self.first() && first.index <= self.last() + 1,
            "raft handed over entries from {} to a log holding {}..={}",
            first.index,
            self.first(),
            self.last()
        );
        let keep = (first.index - self.first()) as usize;
        for gone in self.entries.drain(keep..) {
            out.push((entry_key(gone.index), None));
        }
        for e in ents {
            out.push((entry_key(e.index), Some(seal(&wire::entry_to_pb(e)))));
        }
        self.entries.extend_from_slice(ents);
    }

    pub fn set_hard_state(&mut self, hs: rp::HardState, out: &mut Vec<Write>) {
        out.push((HARD_KEY.to_vec(), Some(seal(&wire::hard_to_pb(&hs)))));
        self.hard = hs;
    }

    /// Takes a snapshot from the leader, with the members it names: the entries it
    /// covers (all, here) go.
    pub fn apply_snapshot(&mut self, snap: rp::Snapshot, members: Members, out: &mut Vec<Write>) {
        // The snapshot first: a batch cut short (were a store's not atomic) then leaves
        // entries it covers, which loading drops, never a gap.
        let meta = snap.get_metadata();
        self.hard.term = self.hard.term.max(meta.term);
        self.hard.commit = self.hard.commit.max(meta.index);
        self.conf = meta.get_conf_state().clone();
        self.members = members;
        self.changed_at = meta.index;
        self.write_snapshot(&snap, out);
        out.push((CONF_KEY.to_vec(), Some(self.conf_record())));
        out.push((HARD_KEY.to_vec(), Some(seal(&wire::hard_to_pb(&self.hard)))));
        for gone in self.entries.drain(..) {
            out.push((entry_key(gone.index), None));
        }
        self.snap = snap;
    }

    /// The most bytes of a snapshot's data one stored value holds (0: the default).
    pub fn set_part_bytes(&mut self, part_bytes: usize) {
        self.part_bytes = part_bytes;
    }

    /// The writes that store `snap`: its metadata under [`SNAP_KEY`], its data in parts
    /// after it, and the removal of the earlier snapshot's parts it does not overwrite.
    fn write_snapshot(&mut self, snap: &rp::Snapshot, out: &mut Vec<Write>) {
        let data = &snap.data;
        let parts = pieces(data.len(), self.part_bytes);
        let mut head = wire::snapshot_to_pb(snap);
        head.data = Bytes::new();
        head.parts = parts;
        head.length = data.len() as u64;
        out.push((SNAP_KEY.to_vec(), Some(seal(&head))));
        for (n, (offset, piece)) in split(data, self.part_bytes).enumerate() {
            let p = pb::RaftSnapshotPart {
                message: None,
                offset,
                total: data.len() as u64,
                data: piece,
            };
            out.push((part_key(n as u32), Some(seal(&p))));
        }
        for n in parts..self.stored_parts {
            out.push((part_key(n), None));
        }
        self.stored_parts = parts;
    }

    /// Until a snapshot through `index` is taken, raft-rs is told none is ready yet (it
    /// asks again later): an older one would not name a learner added at `index`.
    pub fn want_snapshot(&mut self, index: u64) {
        self.wanted = self.wanted.max(index);
    }

    /// Makes `data` (a sealed checkpoint of the state through entry `index`, which has
    /// been applied, when the group's configuration was `conf`) the snapshot, and drops
    /// the entries it covers, in one batch.
    pub fn compact(&mut self, index: u64, data: Bytes, conf: rp::ConfState, out: &mut Vec<Write>) {
        assert!(
            index > self.snapshot_index() && index <= self.last(),
            "compacting to {index} outside {}..={}",
            self.first(),
            self.last()
        );
        let term = self.entry(index).expect("checked").term;
        let mut snap = rp::Snapshot {
            data,
            ..Default::default()
        };
        snap.mut_metadata().index = index;
        snap.mut_metadata().term = term;
        snap.mut_metadata().set_conf_state(conf);
        let n = (index - self.snapshot_index()) as usize;
        self.write_snapshot(&snap, out);
        for gone in self.entries.drain(..n) {
            out.push((entry_key(gone.index), None));
        }
        self.snap = snap;
    }
}

impl raft::Storage for LogStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState {
            hard_state: self.hard.clone(),
            conf_state: self.conf.clone(),
        })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<rp::Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let lo = (low - self.first()) as usize;
        let hi = (high - self.first()) as usize;
        let mut ents = self.entries[lo..hi].to_vec();
        raft::util::limit_size(&mut ents, max_size.into());
        Ok(ents)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.snapshot_index() {
            return Ok(self.snap.get_metadata().term);
        }
        if idx < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        match self.entry(idx) {
            Some(e) => Ok(e.term),
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<rp::Snapshot> {
        if self.snapshot_index() < request_index.max(self.wanted) || self.snap.data.is_empty() {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snap.clone())
    }
}

/// A stored snapshot's data: in `head` itself (a store from before parts), or in
/// exactly `head.parts` parts that fit end to end to `head.length` bytes. Also the
/// number of parts.
fn snapshot_data(
    head: &pb::RaftSnapshot,
    parts: std::collections::BTreeMap<u32, pb::RaftSnapshotPart>,
) -> Result<(Bytes, u32), String> {
    if head.parts == 0 {
        if !parts.is_empty() || head.length != 0 {
            return Err(format!(
                "no parts, yet {} part values and a length of {}",
                parts.len(),
                head.length
            ));
        }
        return Ok((head.data.clone(), 0));
    }
    if !head.data.is_empty() {
        return Err("data both in the snapshot and in parts".into());
    }
    let held = parts
        .into_iter()
        .map(|(n, p)| (n, (p.offset, p.total, p.data)))
        .collect();
    Ok((join(head.parts, head.length, &held)?, head.parts))
}

/// The checkpoint a snapshot carries (None: the empty state before any).
pub fn checkpoint_of(snap: &rp::Snapshot) -> Result<Option<pb::Checkpoint>, String> {
    if snap.data.is_empty() {
        return Ok(None);
    }
    unseal(&snap.data).map(Some)
}

/// The members a snapshot's checkpoint names (`group_members`), checked to cover its
/// configuration.
pub fn members_of(snap: &rp::Snapshot) -> Result<Members, String> {
    let cp = checkpoint_of(snap)?.ok_or("a snapshot with no checkpoint")?;
    let m = Members {
        addresses: cp.group_members.into_iter().collect(),
        retired: cp.group_retired.into_iter().collect(),
    };
    let conf = snap.get_metadata().get_conf_state();
    if conf.voters.is_empty() {
        return Err("a snapshot of a group with no voters".into());
    }
    m.covers(conf)?;
    Ok(m)
}

#[cfg(test)]
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;
    use raft::Storage;

    fn entry(index: u64, term: u64) -> rp::Entry {
        let mut e = rp::Entry::default();
        e.index = index;
        e.term = term;
        e.data = Bytes::from(format!("e{index}"));
        e
    }

    fn as_values(writes: Vec<Write>) -> Vec<(Vec<u8>, Bytes)> {
        let mut m = std::collections::BTreeMap::new();
        for (k, v) in writes {
            match v {
                Some(v) => m.insert(k, v),
                None => m.remove(&k),
            };
        }
        m.into_iter().collect()
    }

    /// What the writes put in the store reads back as the store in memory: after a
    /// conflicting tail is replaced and after compaction.
    #[test]
    fn the_writes_rebuild_the_store() {
        let mut s = LogStore::fresh((1..=3).map(|i| (i, format!("m{i}"))).collect());
        let mut w = s.format();
        s.append(&[entry(1, 1), entry(2, 1), entry(3, 1)], &mut w);
        s.append(&[entry(3, 2), entry(4, 2)], &mut w);
        let mut hs = rp::HardState::default();
        hs.term = 2;
        hs.commit = 3;
        s.set_hard_state(hs, &mut w);
        let back = LogStore::load(as_values(w.clone())).unwrap();
        assert_eq!(back.entries, s.entries);
        assert_eq!(back.members(), s.members());
        assert_eq!(back.members().addresses[&2], "m2");
        assert_eq!(back.term(3).unwrap(), 2);
        assert_eq!(back.hard_state().commit, 3);

        let conf = s.conf().clone();
        s.compact(2, Bytes::from_static(b"cp"), conf, &mut w);
        let back = LogStore::load(as_values(w.clone())).unwrap();
        assert_eq!(back.first_index().unwrap(), 3);
        assert_eq!(back.last_index().unwrap(), 4);
        assert_eq!(back.term(2).unwrap(), 1);
        assert!(matches!(
            back.entries(1, 3, None, GetEntriesContext::empty(false)),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        assert_eq!(back.snapshot(0, 2).unwrap().data, Bytes::from_static(b"cp"));

        // A damaged entry stops the load, naming it.
        let mut vals = as_values(w);
        let (_, v) = vals.iter_mut().find(|(k, _)| *k == entry_key(4)).unwrap();
        let mut bad = v.to_vec();
        *bad.last_mut().unwrap() ^= 1;
        *v = bad.into();
        let err = LogStore::load(vals).unwrap_err();
        assert!(err.contains("entry 4"), "{err}");
    }

    /// A snapshot lies in the store in parts of at most the replica's part size, read
    /// back whole; a later, smaller one leaves none of the earlier one's parts behind. A
    /// part damaged, missing or out of place stops the load, and a store from before
    /// parts (the data in the snapshot's own value) still loads.
    #[test]
    fn a_snapshot_is_stored_in_parts_and_read_back_whole() {
        let mut s = LogStore::fresh((1..=3).map(|i| (i, format!("m{i}"))).collect());
        s.set_part_bytes(100);
        let mut w = s.format();
        let ents: Vec<rp::Entry> = (1..=6).map(|i| entry(i, 1)).collect();
        s.append(&ents, &mut w);
        let big: Bytes = (0..1050u32)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
            .into();
        let conf = s.conf().clone();
        s.compact(3, big.clone(), conf.clone(), &mut w);
        let parts = |vals: &[(Vec<u8>, Bytes)]| {
            vals.iter()
                .filter(|(k, _)| k.starts_with(SNAP_PART_PREFIX))
                .map(|(_, v)| v.len())
                .collect::<Vec<_>>()
        };
        let vals = as_values(w.clone());
        assert_eq!(parts(&vals).len(), 11, "1050 bytes in parts of 100");
        assert!(
            parts(&vals).iter().all(|&n| n < 100 + 32),
            "{:?}",
            parts(&vals)
        );
        let head = &vals.iter().find(|(k, _)| k == SNAP_KEY).unwrap().1;
        assert!(head.len() < 100, "the snapshot's own value holds its data");
        let back = LogStore::load(vals.clone()).unwrap();
        assert_eq!(back.snapshot(0, 2).unwrap().data, big);
        assert_eq!(back.snapshot_index(), 3);

        // A smaller one after it: three parts, the other eight gone.
        let small: Bytes = vec![9u8; 250].into();
        s.compact(5, small.clone(), conf, &mut w);
        let vals = as_values(w.clone());
        assert_eq!(parts(&vals).len(), 3);
        let mut back = LogStore::load(vals.clone()).unwrap();
        assert_eq!(back.snapshot(0, 2).unwrap().data, small);
        // The store loaded knows its parts: its next snapshot removes them too.
        back.set_part_bytes(1000);
        let mut w2 = Vec::new();
        let conf = back.conf().clone();
        back.compact(6, big.clone(), conf, &mut w2);
        let mut after: std::collections::BTreeMap<Vec<u8>, Bytes> = vals.into_iter().collect();
        for (k, v) in w2 {
            match v {
                Some(v) => after.insert(k, v),
                None => after.remove(&k),
            };
        }
        let after: Vec<(Vec<u8>, Bytes)> = after.into_iter().collect();
        assert_eq!(parts(&after).len(), 2);
        assert_eq!(
            LogStore::load(after).unwrap().snapshot(0, 2).unwrap().data,
            big
        );

        let vals = as_values(w);
        let part = |n: u32| vals.iter().position(|(k, _)| *k == part_key(n)).unwrap();
        // A bit flipped in a part.
        let mut bad = vals.clone();
        let mut v = bad[part(1)].1.to_vec();
        v[20] ^= 4;
        bad[part(1)].1 = v.into();
        let err = LogStore::load(bad).unwrap_err();
        assert!(err.contains("snapshot part 1"), "{err}");
        // A part missing.
        let mut bad = vals.clone();
        bad.remove(part(2));
        let err = LogStore::load(bad).unwrap_err();
        assert!(err.contains("3 parts, 2 held"), "{err}");
        // Parts swapped: each whole, but out of place.
        let mut bad = vals.clone();
        let (a, b) = (bad[part(0)].1.clone(), bad[part(1)].1.clone());
        bad[part(0)].1 = b;
        bad[part(1)].1 = a;
        let err = LogStore::load(bad).unwrap_err();
        assert!(err.contains("part 0 holds 100 bytes at 100"), "{err}");
        // A part left behind past the snapshot's last.
        let mut bad = vals.clone();
        bad.push((part_key(7), vals[part(0)].1.clone()));
        assert!(LogStore::load(bad).is_err());

        // A store from before parts: the data in the snapshot's value itself.
        let mut old = vals.clone();
        old.retain(|(k, _)| !k.starts_with(SNAP_PART_PREFIX));
        let mut head: pb::RaftSnapshot =
            unseal(&old.iter().find(|(k, _)| k == SNAP_KEY).unwrap().1).unwrap();
        (head.parts, head.length, head.data) = (0, 0, small.clone());
        let at = old.iter().position(|(k, _)| k == SNAP_KEY).unwrap();
        old[at].1 = seal(&head);
        assert_eq!(
            LogStore::load(old).unwrap().snapshot(0, 2).unwrap().data,
            small
        );
    }
}
