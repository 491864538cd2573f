//! What an operator asks the master: the cluster report (`tessera admin report`: servers,
//! space, chunk health) and fsck (`tessera admin fsck PATH`: files, their chunks, replica
//! locations and problems). Both are read-only and answered at once from memory, so they
//! show the master's view: replica locations as the latest heartbeats reported them.
//!
//! The report scans the whole chunk table. That is fine for an operator's occasional
//! look, not for a monitoring loop every second on a huge cluster. Fsck of a tree comes
//! in pages (`FSCK_PAGE` entries, `FSCK_CHUNKS_PAGE` chunks listed), each a walk of its
//! own entries only, so no answer outgrows a message and the master is never busy with
//! one request for long; the client asks for page after page.

use crate::types::{HashMap, HashSet};

use super::chunks::{Chunk, ServerIdx};
use super::locks::{LockSet, Mode};
use super::namespace::{DELETED_PREFIX, Node, Walked};
use super::{Master, RequestId};
use crate::error::FsError;
use crate::pb::{self, ChunkHealth, master_response::Resp};
use crate::types::ChunkHandle;

/// How many troubled chunk handles a report lists.
pub const TROUBLED_LISTED: usize = 100;

impl Master {
    /// The chunk's health and its live replicas.
    fn health(&self, c: &Chunk) -> (ChunkHealth, Vec<ServerIdx>) {
        let live = self.live_replicas(c);
        let goal = usize::from(c.goal);
        let h = if c.version == 0 {
            ChunkHealth::Empty
        } else if live.is_empty() {
            ChunkHealth::Missing
        } else if live.len() < goal {
            ChunkHealth::UnderReplicated
        } else if live.len() > goal {
            ChunkHealth::OverReplicated
        } else {
            ChunkHealth::Healthy
        };
        (h, live)
    }

    fn learning_for_ms(&self) -> u64 {
        self.repl_not_before().saturating_sub(self.now).as_millis() as u64
    }

    pub(super) fn on_report(&mut self, id: RequestId) {
        let mut r = pb::ClusterReport {
            files: self.meta.ns.file_count(),
            chunks: self.meta.chunks.len() as u64,
            clones_running: u64::from(self.repl.running()),
            learning_for_ms: self.learning_for_ms(),
            chunk_size: self.cfg.chunk_size,
            deleting: self.gc.deleting.values().map(|hs| hs.len() as u64).sum(),
            cluster_id: self.meta.cluster_id,
            ..Default::default()
        };
        let mut missing = Vec::new();
        let mut under = Vec::new();
        for (h, c) in self.meta.chunks.iter() {
            match self.health(c).0 {
                ChunkHealth::Missing => {
                    r.missing += 1;
                    missing.push(h);
                }
                ChunkHealth::UnderReplicated => {
                    r.under_replicated += 1;
                    under.push(h);
                }
                ChunkHealth::OverReplicated => r.over_replicated += 1,
                ChunkHealth::Healthy | ChunkHealth::Empty => {}
            }
        }
        r.troubled = missing
            .into_iter()
            .chain(under)
            .take(TROUBLED_LISTED)
            .collect();
        for (_, s) in self.servers.iter() {
            r.servers.push(pb::ServerReport {
                address: s.addr.clone(),
                rack: s.rack.clone(),
                alive: s.alive,
                capacity_bytes: s.capacity,
                used_bytes: s.used,
                chunks: s.replicas,
                last_heartbeat_ms_ago: self.now.saturating_sub(s.last_heartbeat).as_millis() as u64,
                clones_in_flight: s.clones_in_flight,
                server_id: s.id,
            });
        }
        r.servers.sort_by(|a, b| a.address.cmp(&b.address));
        self.reply(id, Resp::Report(r));
    }

    /// Fsck of a file or of everything below a directory. Takes a read lock on the path
    /// itself, as a listing does, and like a listing answers only once every mutation it
    /// may have seen is durable.
    pub(super) fn on_fsck(&mut self, id: RequestId, r: &pb::FsckRequest) -> Result<bool, FsError> {
        let path = crate::path::normalize(&r.path)?;
        let set = LockSet::on(&path, Mode::Read)?;
        if !self.lock(&set) {
            return Ok(false);
        }
        let limit = super::page_limit(r.limit, super::FSCK_PAGE);
        let result = self.fsck(
            &path,
            r.list_chunks,
            (&r.start_after, r.start_chunk),
            limit,
            super::FSCK_CHUNKS_PAGE,
        );
        self.locks.release(&set);
        self.reply_durable(id, Resp::Fsck(result?));
        Ok(true)
    }

    /// One page of fsck: up to `limit` entries after `after` below `path` (a file: itself),
    /// ending early once it lists `chunk_budget` chunks, inside a file if need be. With a
    /// nonzero chunk index beside it, `after` is a file the last page ended in, and the
    /// page starts with its chunks from that index (if it is still a file).
    pub(super) fn fsck(
        &self,
        path: &str,
        list_chunks: bool,
        (after, start_chunk): (&str, u64),
        limit: usize,
        chunk_budget: usize,
    ) -> Result<pb::FsckResponse, FsError> {
        let file = match path {
            "/" => None,
            _ => Some(self.meta.ns.get(path)?).filter(|n| matches!(n, Node::File(_))),
        };
        let resume = start_chunk > 0 && !after.is_empty();
        let (mut entries, mut more): (Walked<'_>, bool) = match file {
            None => self.meta.ns.walk_page(path, after, limit)?,
            Some(f) if after.is_empty() || (resume && after == path) => {
                (vec![(path.to_string(), f)], false)
            }
            Some(_) => {
                return Err(FsError::InvalidArgument(format!(
                    "{path} is a file: it has no page after {after}"
                )));
            }
        };
        // The file the last page ended in goes first, unless it has gone since (or is a
        // directory now, whose contents follow it in the walk anyway).
        let mut resumed = resume && file.is_some();
        if resume
            && file.is_none()
            && let Ok(n @ Node::File(_)) = self.meta.ns.get(after)
        {
            entries.insert(0, (after.to_string(), n));
            resumed = true;
        }
        let mut deleting: HashMap<ChunkHandle, Vec<String>> = HashMap::default();
        for (&server, hs) in &self.gc.deleting {
            for &h in hs {
                deleting
                    .entry(h)
                    .or_default()
                    .push(self.servers.get(server).addr.clone());
            }
        }
        for addrs in deleting.values_mut() {
            addrs.sort();
        }
        let live_racks: HashSet<&str> = self.servers.live().map(|(_, s)| &*s.rack).collect();
        let live_servers = self.servers.live().count();
        let mut out = pb::FsckResponse {
            learning_for_ms: self.learning_for_ms(),
            chunk_size: self.cfg.chunk_size,
            live_servers: live_servers as u64,
            ..Default::default()
        };
        let (mut listed, mut last) = (0usize, String::new());
        for (i, (p, node)) in entries.into_iter().enumerate() {
            if listed >= chunk_budget {
                // Enough for one message: the rest comes in the next page.
                more = true;
                break;
            }
            last.clone_from(&p);
            let f = match node {
                Node::Dir { .. } => {
                    out.dirs += 1;
                    continue;
                }
                Node::File(f) => f,
            };
            let continued = i == 0 && resumed;
            let first = if continued { start_chunk as usize } else { 0 };
            if !continued {
                out.total_files += 1;
                out.total_bytes += f.length;
            }
            let mut file = pb::FsckFile {
                deleted: p.split('/').any(|c| c.starts_with(DELETED_PREFIX)),
                path: p,
                length: f.length,
                replication: u32::from(f.replication),
                chunk_count: f.chunks.len() as u64,
                chunks: Vec::new(),
                continued,
            };
            for (index, &h) in f.chunks.iter().enumerate().skip(first) {
                if listed + file.chunks.len() >= chunk_budget {
                    // This file alone has more to list than a page may: the next page
                    // goes on from this chunk.
                    out.next_chunk = index as u64;
                    more = true;
                    break;
                }
                out.total_chunks += 1;
                let Some(c) = self.meta.chunks.get(h) else {
                    return Err(FsError::Internal(format!(
                        "{}: chunk {h} is not in the chunk table",
                        file.path
                    )));
                };
                let (health, live) = self.health(c);
                match health {
                    ChunkHealth::Healthy => out.healthy += 1,
                    ChunkHealth::UnderReplicated => {
                        out.under_replicated += 1;
                        // Only once it is on every live server: short of that,
                        // re-replication still adds copies.
                        if usize::from(c.goal) > live_servers && live.len() >= live_servers {
                            out.beyond_servers += 1;
                        }
                    }
                    ChunkHealth::Missing => out.missing += 1,
                    ChunkHealth::Empty => out.empty += 1,
                    ChunkHealth::OverReplicated => out.over_replicated += 1,
                }
                let racks: HashSet<&str> =
                    live.iter().map(|&s| &*self.servers.get(s).rack).collect();
                let single_rack = racks.len() == 1 && live_racks.len() > 1 && c.goal > 1;
                if single_rack {
                    out.single_rack += 1;
                }
                let dels = deleting.get(&h).cloned().unwrap_or_default();
                let trouble = !matches!(health, ChunkHealth::Healthy | ChunkHealth::Empty);
                if list_chunks || trouble || single_rack || !dels.is_empty() {
                    file.chunks.push(pb::FsckChunk {
                        index: index as u64,
                        handle: h,
                        version: c.version,
                        goal: u32::from(c.goal),
                        health: health.into(),
                        replicas: live
                            .iter()
                            .map(|&s| {
                                let s = self.servers.get(s);
                                pb::ReplicaInfo {
                                    address: s.addr.clone(),
                                    rack: s.rack.clone(),
                                }
                            })
                            .collect(),
                        deleting: dels,
                        corrupt_copies: self.corrupt_copies(h, c),
                    });
                }
            }
            listed += file.chunks.len();
            if list_chunks || !file.chunks.is_empty() {
                out.files.push(file);
            }
            if out.next_chunk > 0 {
                break;
            }
        }
        if more {
            out.next = last;
        }
        Ok(out)
    }
}
