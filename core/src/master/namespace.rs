//! The namespace: a lookup table from path names to metadata (GFS §4.1).
//!
//! Entries are keyed by (parent directory id, name), which is the table's prefix
//! compression: a path's leading components are stored once, as a directory id, not in
//! every entry. Renaming a directory re-keys one entry. There are no links, and a directory
//! has no list of its own: listing is a range scan of the table.
//!
//! Every method here is a pure function of the table; locking and logging are the
//! master's concern (`locks.rs`, `oplog.rs`).

use crate::types::HashMap;
use std::collections::BTreeMap;

use super::perms::{Names, Perms};
use crate::error::FsError;
use crate::path;
use crate::types::{ChunkHandle, MAX_CHUNK_SIZE};

pub type DirId = u64;
/// A table key: (parent directory, name).
pub type Key = (DirId, Box<str>);
pub const ROOT: DirId = 0;

// A file's chunk size is kept in 32 bits.
const _: () = assert!(MAX_CHUNK_SIZE <= u32::MAX as u64);

/// The prefix of a name that a delete gives a file or directory; see `gc.rs`.
pub const DELETED_PREFIX: &str = ".tessera-deleted-";

/// Refuses a path that a user operation would give a name only deletes may give: the
/// garbage collector takes such a name for a deleted entry and reclaims it when its
/// time stamp says so, so a file moved to one would be gone for good. A deleted entry
/// may still be renamed *from* (undelete), read or deleted at once.
///
/// A new name may not hold control characters either (a newline, a tab, an escape):
/// listings print one entry per line, and a name that moves a terminal's cursor or
/// splits a line would make every listing of its directory lie. Names made before this
/// rule stay readable, movable and removable.
pub fn refuse_reserved(path: &str) -> Result<(), FsError> {
    if let Some(c) = path.chars().find(|c| c.is_control()) {
        return Err(FsError::InvalidArgument(format!(
            "{path:?}: names may not hold control characters ({c:?})"
        )));
    }
    match path.split('/').find(|c| c.starts_with(DELETED_PREFIX)) {
        Some(c) => Err(FsError::InvalidArgument(format!(
            "{path}: names starting with {DELETED_PREFIX} are reserved for deleted entries ({c})"
        ))),
        None => Ok(()),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Dir {
        id: DirId,
        mtime_ms: u64,
        perms: Perms,
    },
    File(FileMeta),
}

impl Node {
    pub fn perms(&self) -> Perms {
        match self {
            Node::Dir { perms, .. } => *perms,
            Node::File(f) => f.perms,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMeta {
    /// Chunk handles in file order. A boxed slice rather than a `Vec`: files gain chunks
    /// rarely, and the saved capacity word is 8 bytes on every file.
    pub chunks: Box<[ChunkHandle]>,
    pub length: u64,
    pub mtime_ms: u64,
    pub replication: u8,
    /// Bytes per chunk, fixed at create: chunk i holds the file's bytes from
    /// i * chunk_size on, so the size a file was written with must outlive any change to
    /// the master's default. 32 bits (`MAX_CHUNK_SIZE` is below 4 GiB) fit in the padding
    /// after `replication`, so a file costs no more than before.
    pub chunk_size: u32,
    pub perms: Perms,
}

#[derive(Clone, Debug)]
struct DirInfo {
    parent: DirId,
    name: Box<str>,
}

#[derive(Clone, Debug, Default)]
pub struct Namespace {
    entries: BTreeMap<(DirId, Box<str>), Node>,
    /// Where each directory lives, so a path can be rebuilt from an id.
    dirs: HashMap<DirId, DirInfo>,
    next_dir: DirId,
    files: u64,
    /// The root directory's owner, group and bits (it has no entry of its own).
    pub root: Perms,
    /// Every owner and group name, each kept once (`Perms` holds their ids).
    pub names: Names,
}

/// What a path names, as [`Namespace::find`] found it.
#[derive(Clone, Copy, Debug)]
pub enum Found<'a> {
    Root,
    Entry(&'a Node),
    /// Nothing: the last component is missing, or one before it is (or is a file).
    Missing,
}

/// Entries with their full paths, as a walk of the tree gives them.
pub type Walked<'a> = Vec<(String, &'a Node)>;

/// A listed entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    pub name: &'a str,
    pub node: &'a Node,
}

impl Namespace {
    pub fn new() -> Namespace {
        Namespace {
            next_dir: ROOT + 1,
            root: Perms::LEGACY_DIR,
            ..Default::default()
        }
    }

    /// What `path` names, and the permissions of each directory on the way to it, root
    /// first, its parent last (none for the root itself). The walk stops where a
    /// component is missing or is not a directory: `Found::Missing`, with the
    /// directories walked so far.
    pub fn find(&self, path: &str) -> Result<(Found<'_>, Vec<Perms>), FsError> {
        let components = path::components(path)?;
        let Some((last, init)) = components.split_last() else {
            return Ok((Found::Root, Vec::new()));
        };
        let mut walked = vec![self.root];
        let mut dir = ROOT;
        for c in init {
            match self.entries.get(&(dir, Box::from(*c))) {
                Some(Node::Dir { id, perms, .. }) => {
                    walked.push(*perms);
                    dir = *id;
                }
                _ => return Ok((Found::Missing, walked)),
            }
        }
        let found = match self.entries.get(&(dir, Box::from(*last))) {
            Some(n) => Found::Entry(n),
            None => Found::Missing,
        };
        Ok((found, walked))
    }

    /// The entries of directory `dir`, in name order.
    pub fn children(&self, dir: DirId) -> impl Iterator<Item = (&str, &Node)> + '_ {
        self.entries
            .range((dir, Box::<str>::from(""))..(dir + 1, Box::<str>::from("")))
            .map(|((_, name), node)| (&**name, node))
    }

    /// Runs `f` with the permissions a record carries (`legacy` if none), their names kept
    /// only if `f` succeeds.
    pub fn with_perms<T>(
        &mut self,
        p: Option<&crate::pb::Permissions>,
        legacy: Perms,
        f: impl FnOnce(&mut Namespace, Perms) -> Result<T, FsError>,
    ) -> Result<T, FsError> {
        let mark = self.names.len();
        let result = self.names.take(p, legacy).and_then(|perms| f(self, perms));
        if result.is_err() {
            self.names.forget_after(mark);
        }
        result
    }

    /// Gives the entry at `path` (the root for "/") new permissions.
    pub fn set_perms(&mut self, path: &str, perms: Perms) -> Result<(), FsError> {
        if path::components(path)?.is_empty() {
            self.root = perms;
            return Ok(());
        }
        let key = self.parent_key(path)?;
        match self.entries.get_mut(&key) {
            Some(Node::Dir { perms: p, .. }) => *p = perms,
            Some(Node::File(f)) => f.perms = perms,
            None => return Err(FsError::NotFound(path.to_string())),
        }
        Ok(())
    }

    /// The permissions of the entry at `path` (the root's for "/").
    pub fn perms(&self, path: &str) -> Result<Perms, FsError> {
        if path::components(path)?.is_empty() {
            return Ok(self.root);
        }
        Ok(self.get(path)?.perms())
    }

    pub fn file_count(&self) -> u64 {
        self.files
    }

    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// The id of the directory at `path`.
    pub fn dir_id(&self, path: &str) -> Result<DirId, FsError> {
        let mut dir = ROOT;
        for c in path::components(path)? {
            match self.entries.get(&(dir, Box::from(c))) {
                Some(Node::Dir { id, .. }) => dir = *id,
                Some(Node::File(_)) => return Err(FsError::NotADirectory(path.to_string())),
                None => return Err(FsError::NotFound(path.to_string())),
            }
        }
        Ok(dir)
    }

    /// (parent directory id, last component) of `path`; the parent must exist.
    fn parent_key(&self, path: &str) -> Result<(DirId, Box<str>), FsError> {
        let (parent, name) = path::split_last(path)?;
        let dir = self.dir_id(&parent).map_err(|e| match e {
            FsError::NotFound(_) => FsError::NotFound(format!("{path}: parent {parent}")),
            other => other,
        })?;
        Ok((dir, name.into_boxed_str()))
    }

    pub fn get(&self, path: &str) -> Result<&Node, FsError> {
        let key = self.parent_key(path)?;
        self.entries
            .get(&key)
            .ok_or_else(|| FsError::NotFound(path.to_string()))
    }

    pub fn exists(&self, path: &str) -> bool {
        path == "/" || self.get(path).is_ok()
    }

    pub fn file(&self, path: &str) -> Result<&FileMeta, FsError> {
        match self.get(path)? {
            Node::File(f) => Ok(f),
            Node::Dir { .. } => Err(FsError::IsADirectory(path.to_string())),
        }
    }

    fn file_mut(&mut self, path: &str) -> Result<&mut FileMeta, FsError> {
        let key = self.parent_key(path)?;
        match self.entries.get_mut(&key) {
            Some(Node::File(f)) => Ok(f),
            Some(Node::Dir { .. }) => Err(FsError::IsADirectory(path.to_string())),
            None => Err(FsError::NotFound(path.to_string())),
        }
    }

    fn insert_new(&mut self, path: &str, node: Node) -> Result<(), FsError> {
        let key = self.parent_key(path)?;
        if self.entries.contains_key(&key) {
            return Err(FsError::AlreadyExists(path.to_string()));
        }
        if let Node::Dir { id, .. } = node {
            self.dirs.insert(
                id,
                DirInfo {
                    parent: key.0,
                    name: key.1.clone(),
                },
            );
        } else {
            self.files += 1;
        }
        self.entries.insert(key, node);
        Ok(())
    }

    pub fn mkdir(&mut self, path: &str, mtime_ms: u64, perms: Perms) -> Result<(), FsError> {
        if path::components(path)?.is_empty() {
            return Err(FsError::AlreadyExists("/".into()));
        }
        let id = self.next_dir;
        let node = Node::Dir {
            id,
            mtime_ms,
            perms,
        };
        self.insert_new(path, node)?;
        self.next_dir += 1;
        Ok(())
    }

    pub fn create(
        &mut self,
        path: &str,
        replication: u8,
        chunk_size: u64,
        mtime_ms: u64,
        perms: Perms,
    ) -> Result<(), FsError> {
        if replication == 0 {
            return Err(FsError::InvalidArgument(
                "replication must be at least 1".into(),
            ));
        }
        let chunk_size = u32::try_from(chunk_size)
            .ok()
            .filter(|&c| c > 0 && u64::from(c) <= MAX_CHUNK_SIZE)
            .ok_or_else(|| {
                FsError::InvalidArgument(format!(
                    "chunk size {chunk_size} not within 1 to {MAX_CHUNK_SIZE}"
                ))
            })?;
        let meta = FileMeta {
            chunks: Box::new([]),
            length: 0,
            mtime_ms,
            replication,
            chunk_size,
            perms,
        };
        self.insert_new(path, Node::File(meta))
    }

    /// Moves `src` to `dst`, which must not exist and whose parent must. A directory moves
    /// with everything below it, and cannot move into its own subtree.
    pub fn rename(&mut self, src: &str, dst: &str) -> Result<(), FsError> {
        let src_key = self.parent_key(src)?;
        if !self.entries.contains_key(&src_key) {
            return Err(FsError::NotFound(src.to_string()));
        }
        let dst_key = self.parent_key(dst)?;
        if self.entries.contains_key(&dst_key) {
            return Err(FsError::AlreadyExists(dst.to_string()));
        }
        if let Some(Node::Dir { id, .. }) = self.entries.get(&src_key) {
            if self.is_ancestor_dir(*id, dst_key.0) {
                return Err(FsError::InvalidArgument(format!(
                    "cannot move {src} into itself ({dst})"
                )));
            }
            let info = self
                .dirs
                .get_mut(id)
                .expect("every directory has a DirInfo");
            info.parent = dst_key.0;
            info.name = dst_key.1.clone();
        }
        let node = self.entries.remove(&src_key).expect("checked above");
        self.entries.insert(dst_key, node);
        Ok(())
    }

    /// Whether directory `anc` is `dir` or one of its ancestors.
    fn is_ancestor_dir(&self, anc: DirId, mut dir: DirId) -> bool {
        loop {
            if dir == anc {
                return true;
            }
            if dir == ROOT {
                return false;
            }
            dir = self
                .dirs
                .get(&dir)
                .expect("every directory has a DirInfo")
                .parent;
        }
    }

    /// Removes a file, or a directory with everything below it. Returns the chunk handles
    /// of every file removed, whose references the caller drops.
    pub fn remove(&mut self, path: &str) -> Result<Vec<ChunkHandle>, FsError> {
        let key = self.parent_key(path)?;
        let node = self
            .entries
            .remove(&key)
            .ok_or_else(|| FsError::NotFound(path.to_string()))?;
        let mut chunks = Vec::new();
        self.drop_node(node, &mut chunks);
        Ok(chunks)
    }

    fn drop_node(&mut self, node: Node, chunks: &mut Vec<ChunkHandle>) {
        match node {
            Node::File(f) => {
                self.files -= 1;
                chunks.extend_from_slice(&f.chunks);
            }
            Node::Dir { id, .. } => {
                self.dirs.remove(&id);
                let children: Vec<_> = self.children_keys(id);
                for k in children {
                    let n = self.entries.remove(&k).expect("listed just now");
                    self.drop_node(n, chunks);
                }
            }
        }
    }

    fn children_keys(&self, dir: DirId) -> Vec<(DirId, Box<str>)> {
        self.entries
            .range((dir, Box::<str>::from(""))..(dir + 1, Box::<str>::from("")))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Whether a directory has any entry at all, deleted ones included.
    pub fn has_children(&self, dir: DirId) -> bool {
        self.entries
            .range((dir, Box::<str>::from(""))..(dir + 1, Box::<str>::from("")))
            .next()
            .is_some()
    }

    /// Entries of the directory at `path`, in name order.
    pub fn list(&self, path: &str) -> Result<Vec<Entry<'_>>, FsError> {
        let dir = self.dir_id(path)?;
        Ok(self
            .entries
            .range((dir, Box::<str>::from(""))..(dir + 1, Box::<str>::from("")))
            .map(|((_, name), node)| Entry { name, node })
            .collect())
    }

    /// Entries of the directory at `path` after the name `after` ("": from the first),
    /// in name order.
    pub fn list_after<'a>(
        &'a self,
        path: &str,
        after: &str,
    ) -> Result<impl Iterator<Item = Entry<'a>> + 'a, FsError> {
        use std::ops::Bound;
        let dir = self.dir_id(path)?;
        let from = if after.is_empty() {
            Bound::Included((dir, Box::<str>::from("")))
        } else {
            Bound::Excluded((dir, Box::<str>::from(after)))
        };
        Ok(self
            .entries
            .range((from, Bound::Excluded((dir + 1, Box::<str>::from("")))))
            .map(|((_, name), node)| Entry { name, node }))
    }

    pub fn add_chunk(&mut self, path: &str, handle: ChunkHandle) -> Result<(), FsError> {
        let f = self.file_mut(path)?;
        let mut v = std::mem::take(&mut f.chunks).into_vec();
        v.push(handle);
        f.chunks = v.into_boxed_slice();
        Ok(())
    }

    pub fn set_length(&mut self, path: &str, length: u64, mtime_ms: u64) -> Result<(), FsError> {
        let f = self.file_mut(path)?;
        f.length = f.length.max(length);
        f.mtime_ms = mtime_ms;
        Ok(())
    }

    /// The full path of a directory.
    pub fn dir_path(&self, mut dir: DirId) -> String {
        let mut names = Vec::new();
        while dir != ROOT {
            let info = self.dirs.get(&dir).expect("every directory has a DirInfo");
            names.push(&*info.name);
            dir = info.parent;
        }
        names.reverse();
        path::join(&names)
    }

    /// Up to `limit` entries after `after` in table order, with their full paths; the
    /// cursor for the next call is the last key returned. Used by the garbage collector's
    /// incremental scan.
    pub fn scan(&self, after: Option<&Key>, limit: usize) -> Vec<(Key, String, &Node)> {
        use std::ops::Bound;
        let range = match after {
            Some(k) => self
                .entries
                .range((Bound::Excluded(k.clone()), Bound::Unbounded)),
            None => self.entries.range::<(DirId, Box<str>), _>(..),
        };
        range
            .take(limit)
            .map(|(k, n)| {
                let parent = self.dir_path(k.0);
                let full = if parent == "/" {
                    format!("/{}", k.1)
                } else {
                    format!("{parent}/{}", k.1)
                };
                (k.clone(), full, n)
            })
            .collect()
    }

    /// Every entry with its full path, parents before children (for checkpoints): each
    /// directory's entries in name order, then those of the directories among them, the
    /// last first. Built as it is taken, so the paths are never all in memory at once.
    pub fn walk(&self) -> impl Iterator<Item = (String, &Node)> + '_ {
        type Range<'a> = std::collections::btree_map::Range<'a, (DirId, Box<str>), Node>;
        let mut stack = vec![(ROOT, String::new())];
        let mut dir: Option<(Range<'_>, String)> = None;
        std::iter::from_fn(move || {
            loop {
                if let Some((range, prefix)) = &mut dir
                    && let Some(((_, name), node)) = range.next()
                {
                    let p = format!("{prefix}/{name}");
                    if let Node::Dir { id, .. } = node {
                        stack.push((*id, p.clone()));
                    }
                    return Some((p, node));
                }
                let (id, prefix) = stack.pop()?;
                let range = self
                    .entries
                    .range((id, Box::<str>::from(""))..(id + 1, Box::<str>::from("")));
                dir = Some((range, prefix));
            }
        })
    }

    /// Up to `limit` entries below the directory at `path` in path order (a directory
    /// just before what is in it, names in byte order), starting after the full path
    /// `after` (empty: from the first); and whether more follow. `after` need not exist
    /// any more: the page starts where it would be. Each entry costs a lookup, so a page
    /// costs its own size, not the size of what came before it.
    pub fn walk_page(
        &self,
        path: &str,
        after: &str,
        limit: usize,
    ) -> Result<(Walked<'_>, bool), FsError> {
        use std::ops::Bound;
        struct Frame {
            dir: DirId,
            path: String,
            /// Entries of `dir` after this name are still to come (None: all of them).
            after: Option<Box<str>>,
        }
        let top = self.dir_id(path)?;
        let top_path = if path == "/" { "" } else { path };
        let mut stack = Vec::new();
        if after.is_empty() {
            stack.push(Frame {
                dir: top,
                path: top_path.to_string(),
                after: None,
            });
        } else {
            let (outer, inner) = (path::components(path)?, path::components(after)?);
            if inner.len() <= outer.len() || inner[..outer.len()] != outer[..] {
                return Err(FsError::InvalidArgument(format!(
                    "{after} is not below {path}"
                )));
            }
            let rel = &inner[outer.len()..];
            let (mut dir, mut at) = (top, top_path.to_string());
            for (i, &c) in rel.iter().enumerate() {
                stack.push(Frame {
                    dir,
                    path: at.clone(),
                    after: Some(c.into()),
                });
                // What is inside `c` comes before the entries after it.
                let Some(Node::Dir { id, .. }) = self.entries.get(&(dir, Box::from(c))) else {
                    break;
                };
                at = format!("{at}/{c}");
                if i + 1 == rel.len() {
                    stack.push(Frame {
                        dir: *id,
                        path: at,
                        after: None,
                    });
                    break;
                }
                dir = *id;
            }
        }
        let mut out = Vec::new();
        while let Some(frame) = stack.last_mut() {
            let from = match &frame.after {
                Some(name) => Bound::Excluded((frame.dir, name.clone())),
                None => Bound::Included((frame.dir, Box::<str>::from(""))),
            };
            let end = Bound::Excluded((frame.dir + 1, Box::<str>::from("")));
            let Some(((_, name), node)) = self.entries.range((from, end)).next() else {
                stack.pop();
                continue;
            };
            if out.len() == limit {
                return Ok((out, true));
            }
            frame.after = Some(name.clone());
            let full = format!("{}/{name}", frame.path);
            if let Node::Dir { id, .. } = node {
                stack.push(Frame {
                    dir: *id,
                    path: full.clone(),
                    after: None,
                });
            }
            out.push((full, node));
        }
        Ok((out, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Perms = Perms::LEGACY_DIR;
    const F: Perms = Perms::LEGACY_FILE;

    #[test]
    fn create_list_rename_remove() {
        let mut ns = Namespace::new();
        ns.mkdir("/a", 1, D).unwrap();
        ns.mkdir("/a/b", 1, D).unwrap();
        ns.create("/a/b/f", 3, 1024, 2, F).unwrap();
        assert_eq!(
            ns.create("/a/b/f", 3, 1024, 2, F),
            Err(FsError::AlreadyExists("/a/b/f".into()))
        );
        assert!(matches!(
            ns.create("/x/f", 3, 1024, 2, F),
            Err(FsError::NotFound(_))
        ));
        assert!(matches!(
            ns.create("/a/b/f/g", 3, 1024, 2, F),
            Err(FsError::NotADirectory(_))
        ));
        ns.add_chunk("/a/b/f", 7).unwrap();
        ns.rename("/a", "/z").unwrap();
        assert_eq!(&*ns.file("/z/b/f").unwrap().chunks, &[7]);
        assert!(ns.rename("/z", "/z/b/inside").is_err());
        assert_eq!(ns.remove("/z").unwrap(), vec![7]);
        assert_eq!(ns.file_count(), 0);
        assert_eq!(ns.entry_count(), 0);
        assert!(ns.dirs.is_empty());
    }

    #[test]
    fn walk_lists_parents_first() {
        let mut ns = Namespace::new();
        ns.mkdir("/a", 1, D).unwrap();
        ns.create("/a/f", 1, 1024, 1, F).unwrap();
        ns.mkdir("/b", 1, D).unwrap();
        ns.mkdir("/a/c", 1, D).unwrap();
        ns.create("/a/c/g", 1, 1024, 1, F).unwrap();
        ns.mkdir("/b/d", 1, D).unwrap();
        let paths: Vec<_> = ns.walk().map(|(p, _)| p).collect();
        // A directory's entries, then those of its directories, the last first: the
        // order checkpoints have always been written in.
        assert_eq!(paths, ["/a", "/b", "/b/d", "/a/c", "/a/f", "/a/c/g"]);
    }

    /// Every path below `dir` in path order, built from listings alone.
    fn in_path_order(ns: &Namespace, dir: &str, out: &mut Vec<String>) {
        for e in ns.list(dir).unwrap() {
            let p = if dir == "/" {
                format!("/{}", e.name)
            } else {
                format!("{dir}/{}", e.name)
            };
            out.push(p.clone());
            if matches!(e.node, Node::Dir { .. }) {
                in_path_order(ns, &p, out);
            }
        }
    }

    /// Pages of `limit`, each after the last path of the one before, until no more.
    fn all_pages(ns: &Namespace, top: &str, limit: usize) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        loop {
            let after = out.last().cloned().unwrap_or_default();
            let (page, more) = ns.walk_page(top, &after, limit).unwrap();
            assert!(page.len() <= limit);
            out.extend(page.into_iter().map(|(p, _)| p));
            if !more {
                return out;
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn pages_of_any_size_walk_the_tree_in_path_order(
            paths in proptest::collection::vec(
                (proptest::collection::vec(0usize..4, 1..4), proptest::bool::ANY),
                0..24,
            ),
            limit in 1usize..6,
        ) {
            // Names where byte order and path order differ ("a-c" sorts before "a/…").
            const NAMES: [&str; 4] = ["a", "a-c", "b", "c"];
            let mut ns = Namespace::new();
            for (comps, dir) in &paths {
                let p = format!("/{}", comps.iter().map(|&i| NAMES[i]).collect::<Vec<_>>().join("/"));
                let _ = if *dir { ns.mkdir(&p, 1, D) } else { ns.create(&p, 1, 1024, 1, F) };
            }
            for top in ["/", "/a", "/b"] {
                if ns.dir_id(top).is_err() {
                    continue;
                }
                let mut want = Vec::new();
                in_path_order(&ns, top, &mut want);
                proptest::prop_assert_eq!(all_pages(&ns, top, limit), want.clone());
                proptest::prop_assert_eq!(all_pages(&ns, top, usize::MAX), want);
            }
        }
    }

    #[test]
    fn a_page_starts_where_a_vanished_path_would_be() {
        let mut ns = Namespace::new();
        for d in ["/a", "/a/b", "/c"] {
            ns.mkdir(d, 1, D).unwrap();
        }
        for f in ["/a/b/f", "/a/b/g", "/a/z", "/c/h"] {
            ns.create(f, 1, 1024, 1, F).unwrap();
        }
        let (first, more) = ns.walk_page("/", "", 3).unwrap();
        let first: Vec<_> = first.into_iter().map(|(p, _)| p).collect();
        assert_eq!(first, ["/a", "/a/b", "/a/b/f"]);
        assert!(more);
        // The directory the cursor was in is gone: the walk goes on after it.
        ns.remove("/a/b").unwrap();
        let (next, more) = ns.walk_page("/", "/a/b/f", 10).unwrap();
        let next: Vec<_> = next.into_iter().map(|(p, _)| p).collect();
        assert_eq!(next, ["/a/z", "/c", "/c/h"]);
        assert!(!more);
        // A cursor outside the tree walked is refused.
        assert!(matches!(
            ns.walk_page("/c", "/a/z", 10),
            Err(FsError::InvalidArgument(_))
        ));
        assert!(matches!(
            ns.walk_page("/c", "/c", 10),
            Err(FsError::InvalidArgument(_))
        ));
        assert!(matches!(
            ns.walk_page("/a/z", "", 10),
            Err(FsError::NotADirectory(_))
        ));
    }
}
