//! Lazy garbage collection (GFS §4.4).
//!
//! Deleting renames the file (or directory) to a hidden name in the same directory that
//! carries the deletion time: `.tessera-deleted-<ms>-<name>`. It can be read and renamed
//! back (undeleted) until the collector's incremental scan of the namespace finds it older
//! than `gc_delay` and removes it for good. Deleting a hidden name removes it at once.
//! Removal drops chunk references; a chunk with none leaves the table, and its replicas,
//! now orphans, are deleted when their servers next report them.

use crate::types::HashMap;

use super::chunks::ServerIdx;
use super::heartbeat::PendingDeletes;
use super::locks::{LockSet, Mode};
use super::namespace::{DELETED_PREFIX, DirId, Node};
use super::{Master, RequestId};
use crate::error::FsError;
use crate::pb::{self, log_record::Op};
use crate::types::ChunkHandle;

#[derive(Debug, Default)]
pub(super) struct Gc {
    cursor: Option<(DirId, Box<str>)>,
    pub pending_deletes: PendingDeletes,
    /// The copies each live server reported in its latest heartbeat and was told to
    /// delete (stale, orphaned, corrupt). Only for the operator's view (fsck, report).
    pub deleting: HashMap<ServerIdx, Vec<ChunkHandle>>,
}

/// The deletion time in a hidden name, if it is one.
pub fn deleted_at(name: &str) -> Option<u64> {
    let rest = name.strip_prefix(DELETED_PREFIX)?;
    let (ms, _) = rest.split_once('-')?;
    ms.parse().ok()
}

impl Master {
    pub(super) fn on_delete(
        &mut self,
        id: RequestId,
        r: &pb::DeleteRequest,
        from: &crate::auth::Caller,
    ) -> Result<bool, FsError> {
        let path = crate::path::normalize(&r.path)?;
        let (parent, name) = crate::path::split_last(&path)?;
        self.check(from).delete(&path)?;
        if deleted_at(&name).is_some() {
            // Deleting a deleted file reclaims it at once.
            let set = LockSet::on(&path, Mode::Write)?;
            return self.mutate(id, set, Op::Remove(pb::RemoveOp { path }));
        }
        let set = LockSet::on(&path, Mode::Write)?;
        if !self.lock(&set) {
            return Ok(false);
        }
        let check = match self.meta.ns.get(&path) {
            Ok(Node::Dir { .. }) if !r.recursive => match self.meta.ns.list(&path) {
                Ok(es) if es.iter().any(|e| !e.name.starts_with(DELETED_PREFIX)) => {
                    Err(FsError::NotEmpty(path.clone()))
                }
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            },
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        self.locks.release(&set);
        check?;
        let ms = self.now.as_millis();
        let mut n = 0;
        let hidden = loop {
            let suffix = if n == 0 {
                String::new()
            } else {
                format!(".{n}")
            };
            let Some(hidden) = hidden_name(&parent, &name, ms, &suffix) else {
                // So deep that no hidden name fits beside it: reclaimed at once.
                let set = LockSet::on(&path, Mode::Write)?;
                return self.mutate(id, set, Op::Remove(pb::RemoveOp { path }));
            };
            let candidate = join(&parent, &hidden);
            if !self.meta.ns.exists(&candidate) {
                break candidate;
            }
            n += 1;
        };
        let mut set = LockSet::on(&path, Mode::Write)?;
        set.add(&hidden, Mode::Write)?;
        self.mutate(
            id,
            set,
            Op::Rename(pb::RenameOp {
                src: path,
                dst: hidden,
            }),
        )
    }

    /// One step of the collector's namespace scan.
    pub(super) fn collect_garbage(&mut self) {
        let batch = self
            .meta
            .ns
            .scan(self.gc.cursor.as_ref(), self.cfg.gc_scan_batch);
        // A short batch reached the end of the table: the next pass starts over.
        self.gc.cursor = if batch.len() < self.cfg.gc_scan_batch {
            None
        } else {
            batch.last().map(|(k, _, _)| k.clone())
        };
        let now = self.now.as_millis();
        let delay = crate::types::millis(self.cfg.gc_delay);
        let due: Vec<String> = batch
            .into_iter()
            .filter(|(k, _, _)| deleted_at(&k.1).is_some_and(|t| t.saturating_add(delay) <= now))
            .map(|(_, p, _)| p)
            .collect();
        for path in due {
            let Ok(set) = LockSet::on(&path, Mode::Write) else {
                continue;
            };
            if !self.lock(&set) {
                continue; // busy: the next pass will see it again
            }
            match self.log(Op::Remove(pb::RemoveOp { path: path.clone() })) {
                Ok((seq, applied)) => {
                    tracing::info!(path = %path, chunks = applied.reclaimed.len(), "reclaimed deleted file");
                    self.hold(seq, None, Some(set));
                }
                Err(_) => self.locks.release(&set),
            }
        }
    }
}

/// The hidden name of `name` in `parent`, deleted at `ms`: `.tessera-deleted-<ms>-<name>`
/// with `suffix`, the name cut short (at a character boundary) where it would make the
/// name or the path longer than allowed, so any file that could be made can be deleted.
/// None if not even the name's head fits in the path.
fn hidden_name(parent: &str, name: &str, ms: u64, suffix: &str) -> Option<String> {
    let head = format!("{DELETED_PREFIX}{ms}-");
    let path_room = crate::path::MAX_PATH.checked_sub(parent.len() + 1)?;
    let room = crate::path::MAX_NAME
        .min(path_room)
        .checked_sub(head.len() + suffix.len())?;
    let mut cut = name.len().min(room);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    Some(format!("{head}{}{suffix}", &name[..cut]))
}

fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}
