//! GFS's namespace locks (§4.1): an operation on `/d1/d2/leaf` takes read locks on `/`,
//! `/d1`, `/d1/d2` and a read or write lock on `/d1/d2/leaf`.
//!
//! In this sans-IO master an operation's effect on memory is immediate, but nobody may see
//! it before its log record is durable. So a mutation keeps its locks until then, and any
//! operation that conflicts waits in the master's queue: a directory's contents cannot
//! change under a holder of its write lock, no one reads a file that a pending create or
//! rename is still writing, and operations on different files in one directory proceed
//! together (read lock on the directory, write locks on different names).
//!
//! Locks are taken all at once or not at all, so waiting never holds a lock and there is
//! no deadlock.

use crate::types::HashMap;

use crate::error::FsError;
use crate::path;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
}

/// The locks one operation holds or wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockSet(Vec<(String, Mode)>);

impl LockSet {
    /// Read locks on every ancestor of `target` and `mode` on `target` itself.
    pub fn on(target: &str, mode: Mode) -> Result<LockSet, FsError> {
        let mut set = LockSet::default();
        set.add(target, mode)?;
        Ok(set)
    }

    pub fn add(&mut self, target: &str, mode: Mode) -> Result<(), FsError> {
        let target = path::normalize(target)?;
        for a in path::ancestors(&target)? {
            self.push(a, Mode::Read);
        }
        self.push(target, mode);
        Ok(())
    }

    fn push(&mut self, p: String, mode: Mode) {
        match self.0.iter_mut().find(|(q, _)| *q == p) {
            Some((_, m)) => {
                if mode == Mode::Write {
                    *m = Mode::Write;
                }
            }
            None => self.0.push((p, mode)),
        }
    }

    pub fn paths(&self) -> impl Iterator<Item = (&str, Mode)> {
        self.0.iter().map(|(p, m)| (p.as_str(), *m))
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Held {
    readers: u32,
    writer: bool,
}

#[derive(Debug, Default)]
pub struct PathLocks {
    held: HashMap<String, Held>,
}

impl PathLocks {
    /// Takes every lock in `set`, or none if any conflicts.
    pub fn try_acquire(&mut self, set: &LockSet) -> bool {
        let free = set.paths().all(|(p, m)| match (self.held.get(p), m) {
            (None, _) => true,
            (Some(h), Mode::Read) => !h.writer,
            (Some(h), Mode::Write) => !h.writer && h.readers == 0,
        });
        if !free {
            return false;
        }
        for (p, m) in set.paths() {
            let h = self.held.entry(p.to_string()).or_default();
            match m {
                Mode::Read => h.readers += 1,
                Mode::Write => h.writer = true,
            }
        }
        true
    }

    pub fn release(&mut self, set: &LockSet) {
        for (p, m) in set.paths() {
            let h = self
                .held
                .get_mut(p)
                .unwrap_or_else(|| panic!("releasing {p}, which is not locked"));
            match m {
                Mode::Read => {
                    assert!(h.readers > 0, "read lock on {p} released twice");
                    h.readers -= 1;
                }
                Mode::Write => {
                    assert!(h.writer, "write lock on {p} released twice");
                    h.writer = false;
                }
            }
            if h.readers == 0 && !h.writer {
                self.held.remove(p);
            }
        }
    }

    pub fn is_idle(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_proceed_directory_write_excludes() {
        let mut locks = PathLocks::default();
        let f1 = LockSet::on("/d/f1", Mode::Write).unwrap();
        let f2 = LockSet::on("/d/f2", Mode::Write).unwrap();
        let dir = LockSet::on("/d", Mode::Write).unwrap();
        assert!(locks.try_acquire(&f1));
        assert!(
            locks.try_acquire(&f2),
            "creating two files in one directory at once"
        );
        assert!(
            !locks.try_acquire(&dir),
            "directory changed under its children"
        );
        locks.release(&f1);
        locks.release(&f2);
        assert!(locks.try_acquire(&dir));
        assert!(
            !locks.try_acquire(&f1),
            "file created while its directory is write-locked"
        );
        locks.release(&dir);
        assert!(locks.is_idle());
    }

    #[test]
    fn rename_locks_both_ends() {
        let mut set = LockSet::on("/a/x", Mode::Write).unwrap();
        set.add("/a/y", Mode::Write).unwrap();
        let modes: Vec<_> = set.paths().collect();
        assert_eq!(
            modes,
            vec![
                ("/", Mode::Read),
                ("/a", Mode::Read),
                ("/a/x", Mode::Write),
                ("/a/y", Mode::Write)
            ]
        );
    }
}
