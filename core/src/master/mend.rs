//! Mending the last copy of a version (the chunkserver's half is `chunkserver/mend.rs`).
//!
//! A copy reported corrupt is dropped and deleted at once when the chunk has another
//! copy of its version: re-replication restores the goal from that (GFS §5.2). When the
//! reporter holds the only copy of the current version, deleting it would fall the
//! chunk back to its demoted older copies (`fallback.rs`) and take with it every
//! mutation acknowledged since: the rot is usually in a block those mutations never
//! touched, and the older copies still hold that block intact. So the master orders the
//! reporter to mend its copy from them instead, and keeps it listed meanwhile (no lease
//! is granted and no clone made from it until the mend ends). Only if the mend fails
//! (a bad block no other copy matches) or goes unanswered is the copy handled as any
//! corrupt one. An order that goes unanswered or is refused (the server busy with
//! another mend, or cut off) is given again from a later heartbeat, which shows the copy
//! at version 0, up to `MEND_TRIES` times in all.
//!
//! The chunkserver is the judge of its copy as it is now: a report that arrives late or
//! twice, after the copy was mended, leads to an order the server answers by verifying
//! the copy whole; so the master never deletes a last copy on a report alone, even with
//! no older copy left to mend from.
//!
//! A corrupt copy shows in its server's heartbeats at version 0, so an order is given on
//! either a corruption report or a heartbeat (a report may be lost). The state lives only
//! in the master's memory: a master that restarts (or a new leader) orders the mend
//! again when the copy's heartbeat shows it corrupt, if the log names the server a
//! holder of the current version; a mend order that outlives its master is harmless (it
//! only ever makes a copy whole at its own version).

use crate::error::FsError;
use crate::types::{ChunkHandle, HashMap, Version};

use super::chunks::ServerIdx;
use super::{CallCtx, Master};
use crate::pb;

/// Orders to mend one copy that may go unanswered or be refused before it is handled as
/// destroyed.
pub(super) const MEND_TRIES: u32 = 3;

/// Chunks whose last current copy is being mended, and the server mending it; and the
/// orders each (chunk, server) has had that came to nothing.
#[derive(Debug, Default)]
pub(super) struct Mending {
    out: HashMap<ChunkHandle, ServerIdx>,
    tries: HashMap<(ChunkHandle, ServerIdx), u32>,
}

impl Mending {
    /// Whether `h` is being mended (on any server).
    pub(super) fn contains(&self, h: ChunkHandle) -> bool {
        self.out.contains_key(&h)
    }

    /// Whether `server`'s copy of `h` is the one being mended.
    pub(super) fn by(&self, h: ChunkHandle, server: ServerIdx) -> bool {
        self.out.get(&h) == Some(&server)
    }

    pub(super) fn len(&self) -> usize {
        self.out.len()
    }
}

/// What became of a copy reported corrupt (`Master::try_mend`).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Mend {
    /// Ordered mended (or being mended already): kept listed.
    Ordered,
    /// To be ordered mended later (its server busy with another mend): kept listed.
    Later,
    /// Not the last copy of its version, or out of tries: the caller discards it.
    No,
}

impl Master {
    /// How many last copies this master has had mended since it started, and how many
    /// mends are under way.
    pub fn mends(&self) -> (u64, usize) {
        (self.mended, self.mending.len())
    }

    /// Whether `server`'s copy of `h` is out for mending: listed, though its server
    /// serves it no more, until the mend's answer (or its call's deadline).
    pub fn is_mending(&self, h: ChunkHandle, server: ServerIdx) -> bool {
        self.mending.by(h, server)
    }

    /// `server` reported its copy of `h` corrupt. If that copy is the only one of the
    /// current version, orders it mended from the older copies that survive.
    pub(super) fn try_mend(&mut self, h: ChunkHandle, server: ServerIdx) -> Mend {
        if self.mending.by(h, server) {
            return Mend::Ordered; // reported again while mending: the mend decides
        }
        let Some(c) = self.meta.chunks.get(h) else {
            return Mend::No;
        };
        let own = &self.servers.get(server).addr;
        // The only copy of the current version listed, or (on a master that restarted
        // and has not heard it report the version yet) none listed, and it a holder as
        // the log knows them.
        let fallback = self.meta.fallbacks.get(&h);
        let holder = c.replicas.contains(server)
            || fallback.is_some_and(|f| f.holders.contains(own.as_str()));
        if !holder
            || c.replicas.as_slice().iter().any(|&s| s != server)
            || c.version == 0
            || self.leases.is_granting(h)
            || self.mending.tries.get(&(h, server)).copied().unwrap_or(0) >= MEND_TRIES
        {
            return Mend::No;
        }
        if self.mending.contains(h) || self.mending.out.values().any(|&s| s == server) {
            // One mend per chunk, and per server (each holds a chunk in its memory).
            return Mend::Later;
        }
        let version = c.version;
        // Every other copy the master knows of, whatever its version: the demoted ones
        // (read at their version), and, read at any version, holders of the current one
        // not listed (a clone that landed while a lease was out, say) and copies ordered
        // deleted but perhaps not yet gone. Only bytes that match this copy's own
        // checksums are taken, so any copy may serve.
        let mut named: Vec<(String, Version)> = fallback
            .into_iter()
            .flat_map(|f| f.demoted.iter().map(|(a, &v)| (a.clone(), v)))
            .collect();
        named.extend(
            fallback
                .into_iter()
                .flat_map(|f| f.holders.iter().map(|a| (a.clone(), 0))),
        );
        named.extend(
            self.servers
                .iter()
                .filter(|&(s, _)| self.gc.pending_deletes.is_ordered(s, h))
                .map(|(_, sv)| (sv.addr.clone(), 0)),
        );
        // Not only those this master counts alive: one that just restarted has not heard
        // from every server yet, and one it declared dead may be back before its next
        // heartbeat. A source that does not answer is asked once, and skipped after.
        let mut sources: Vec<pb::MendSource> = Vec::new();
        for (addr, version) in named {
            if addr != *own && sources.iter().all(|s| s.address != addr) {
                // A source this master knows no keys of (not registered since it
                // started) is asked without: refused on a secured cluster, and skipped.
                let capability = self.servers.find(&addr).and_then(|s| {
                    self.peer_read_capability(h, version, s, server, self.cfg.clone_timeout)
                });
                sources.push(pb::MendSource {
                    address: addr,
                    version,
                    capability,
                });
            }
        }
        tracing::warn!(
            chunk = h,
            server = %own,
            sources = sources.len(),
            "the last copy of the current version is reported corrupt: ordering it mended"
        );
        self.mending.out.insert(h, server);
        let req = pb::chunk_request::Req::Mend(pb::MendChunkRequest {
            handle: h,
            version,
            sources,
            cluster_id: self.meta.cluster_id,
            epoch: self.epoch,
        });
        self.call(server, CallCtx::Mend { handle: h, server }, req);
        Mend::Ordered
    }

    /// The answer to an order to mend: `Ok` (mended, or verified whole), the copy's own
    /// error (a block no source matches: `Corrupt`), or none (unanswered, refused).
    pub(super) fn on_mend_result(
        &mut self,
        h: ChunkHandle,
        server: ServerIdx,
        result: Result<(), Option<FsError>>,
    ) {
        if !self.mending.by(h, server) {
            return;
        }
        self.mending.out.remove(&h);
        let addr = self.servers.get(server).addr.clone();
        let destroyed = match result {
            Ok(()) => {
                // Whole, and served again; its next report lists it as usual.
                tracing::info!(chunk = h, server = %addr, "corrupt copy mended");
                self.mending.tries.remove(&(h, server));
                self.mended += 1;
                false
            }
            Err(Some(FsError::Corrupt(why))) => {
                tracing::warn!(chunk = h, server = %addr, %why, "corrupt copy cannot be mended; deleting it");
                true
            }
            Err(other) => {
                let tries = self.mending.tries.entry((h, server)).or_default();
                *tries += 1;
                tracing::warn!(chunk = h, server = %addr, error = ?other, tries = *tries, "an order to mend came to nothing");
                *tries >= MEND_TRIES
            }
        };
        if destroyed {
            self.mending.tries.remove(&(h, server));
            if self.meta.chunks.get(h).is_some() {
                self.discard_corrupt(h, server);
            }
        }
    }
}
