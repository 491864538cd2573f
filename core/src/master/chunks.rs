//! The chunk table: for each handle, its version, reference count, replication goal
//! (persisted through the op log) and its replica locations (never persisted: learned from
//! heartbeats, GFS §2.6.2).
//!
//! Handles are handed out from a counter, so the table is dense: it is stored as pages of
//! fixed-size slots indexed by handle, and a page is freed when its last chunk goes. A
//! chunk costs its 32-byte slot and nothing else, where a hash map would add 50–100%.

use std::collections::BTreeMap;

use crate::types::{ChunkHandle, Version};

/// A chunkserver, as the master numbers them (see `servers.rs`).
pub type ServerIdx = u32;

const PAGE_BITS: u32 = 10;
const PAGE: usize = 1 << PAGE_BITS;

/// Replica locations: three inline, more on the heap (goals above three are rare).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replicas {
    Inline { len: u8, ids: [ServerIdx; 3] },
    Spilled(Box<Vec<ServerIdx>>),
}

impl Default for Replicas {
    fn default() -> Self {
        Replicas::Inline {
            len: 0,
            ids: [0; 3],
        }
    }
}

impl Replicas {
    pub fn as_slice(&self) -> &[ServerIdx] {
        match self {
            Replicas::Inline { len, ids } => &ids[..*len as usize],
            Replicas::Spilled(v) => v,
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, s: ServerIdx) -> bool {
        self.as_slice().contains(&s)
    }

    /// Adds `s`; returns false if it was there already.
    pub fn insert(&mut self, s: ServerIdx) -> bool {
        if self.contains(s) {
            return false;
        }
        match self {
            Replicas::Inline { len, ids } if (*len as usize) < ids.len() => {
                ids[*len as usize] = s;
                *len += 1;
            }
            Replicas::Inline { ids, .. } => {
                let mut v = ids.to_vec();
                v.push(s);
                *self = Replicas::Spilled(Box::new(v));
            }
            Replicas::Spilled(v) => v.push(s),
        }
        true
    }

    /// Removes `s`; returns false if it was not there.
    pub fn remove(&mut self, s: ServerIdx) -> bool {
        let mut v = self.as_slice().to_vec();
        let Some(pos) = v.iter().position(|&x| x == s) else {
            return false;
        };
        v.remove(pos);
        *self = Replicas::from_vec(v);
        true
    }

    fn from_vec(v: Vec<ServerIdx>) -> Replicas {
        if v.len() <= 3 {
            let mut ids = [0; 3];
            ids[..v.len()].copy_from_slice(&v);
            Replicas::Inline {
                len: v.len() as u8,
                ids,
            }
        } else {
            Replicas::Spilled(Box::new(v))
        }
    }

    pub fn clear(&mut self) {
        *self = Replicas::default();
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chunk {
    /// The newest version a replica has acknowledged. 0: never created on any server.
    pub version: Version,
    /// Files (and, later, snapshots) that refer to the chunk. 0 marks an empty slot.
    pub refcount: u32,
    /// Replicas wanted.
    pub goal: u8,
    /// Live chunkservers holding the chunk at `version`.
    pub replicas: Replicas,
}

type Page = Box<[Chunk; PAGE]>;

#[derive(Debug, Default)]
pub struct ChunkTable {
    pages: BTreeMap<u64, (u32, Page)>,
    len: usize,
}

/// An empty page, built where it lives: an array this size built on the stack and then
/// boxed costs a 40 KiB copy, and a master builds one at every start and recovery.
fn empty_page() -> Page {
    let slots: Box<[Chunk]> = (0..PAGE).map(|_| Chunk::default()).collect();
    slots.try_into().expect("a page has PAGE slots")
}

fn split(h: ChunkHandle) -> (u64, usize) {
    (h >> PAGE_BITS, (h as usize) & (PAGE - 1))
}

impl ChunkTable {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, h: ChunkHandle) -> Option<&Chunk> {
        let (p, i) = split(h);
        let c = &self.pages.get(&p)?.1[i];
        (c.refcount > 0).then_some(c)
    }

    pub fn get_mut(&mut self, h: ChunkHandle) -> Option<&mut Chunk> {
        let (p, i) = split(h);
        let c = &mut self.pages.get_mut(&p)?.1[i];
        (c.refcount > 0).then_some(c)
    }

    /// Adds a chunk with one reference. The handle must be unused.
    pub fn insert(&mut self, h: ChunkHandle, version: Version, goal: u8) {
        let (p, i) = split(h);
        let (live, page) = self.pages.entry(p).or_insert_with(|| (0, empty_page()));
        assert_eq!(page[i].refcount, 0, "chunk {h} inserted twice");
        page[i] = Chunk {
            version,
            refcount: 1,
            goal,
            replicas: Replicas::default(),
        };
        *live += 1;
        self.len += 1;
    }

    /// Drops one reference; returns true if that was the last and the chunk is gone.
    pub fn unref(&mut self, h: ChunkHandle) -> bool {
        let (p, i) = split(h);
        let Some((live, page)) = self.pages.get_mut(&p) else {
            panic!("unref of unknown chunk {h}");
        };
        assert!(page[i].refcount > 0, "unref of unknown chunk {h}");
        page[i].refcount -= 1;
        if page[i].refcount > 0 {
            return false;
        }
        page[i] = Chunk::default();
        *live -= 1;
        self.len -= 1;
        if *live == 0 {
            self.pages.remove(&p);
        }
        true
    }

    /// Every chunk, by handle. A page's scan stops at its last live slot (handles are
    /// handed out in order, so a young page's chunks are all at its front).
    pub fn iter(&self) -> impl Iterator<Item = (ChunkHandle, &Chunk)> {
        self.pages.iter().flat_map(|(p, (live, page))| {
            page.iter()
                .enumerate()
                .filter(|(_, c)| c.refcount > 0)
                .take(*live as usize)
                .map(move |(i, c)| ((p << PAGE_BITS) | i as u64, c))
        })
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (ChunkHandle, &mut Chunk)> {
        self.pages.iter_mut().flat_map(|(p, (live, page))| {
            let p = *p;
            page.iter_mut()
                .enumerate()
                .filter(|(_, c)| c.refcount > 0)
                .take(*live as usize)
                .map(move |(i, c)| ((p << PAGE_BITS) | i as u64, c))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_is_small() {
        assert!(
            std::mem::size_of::<Chunk>() <= 32,
            "{}",
            std::mem::size_of::<Chunk>()
        );
    }

    #[test]
    fn insert_unref_and_pages_freed() {
        let mut t = ChunkTable::default();
        for h in 1..3000 {
            t.insert(h, 0, 3);
        }
        assert_eq!(t.len(), 2999);
        assert_eq!(t.iter().count(), 2999);
        // A page with holes still yields every live chunk, in order.
        for h in (1..3000).step_by(7) {
            assert!(t.unref(h));
        }
        let live: Vec<u64> = (1..3000).filter(|h| (h - 1) % 7 != 0).collect();
        assert_eq!(t.iter().map(|(h, _)| h).collect::<Vec<_>>(), live);
        assert_eq!(t.iter_mut().map(|(h, _)| h).collect::<Vec<_>>(), live);
        for &h in &live {
            assert!(t.unref(h));
        }
        assert!(t.is_empty());
        for h in 1..3000 {
            t.insert(h, 0, 3);
        }
        for h in 1..3000 {
            assert!(t.unref(h));
        }
        assert!(t.is_empty());
        assert!(t.pages.is_empty());
    }

    #[test]
    fn replicas_spill_and_shrink() {
        let mut r = Replicas::default();
        for s in 0..5 {
            assert!(r.insert(s));
        }
        assert!(!r.insert(3));
        assert_eq!(r.as_slice(), &[0, 1, 2, 3, 4]);
        r.remove(0);
        r.remove(4);
        assert!(matches!(r, Replicas::Inline { len: 3, .. }));
        assert_eq!(r.as_slice(), &[1, 2, 3]);
    }
}
