//! Chunk versions never go backwards: on the master below any version its log made
//! durable (one applied in memory but lost with an unsynced log tail may be undone by a
//! crash: no client was told of it, and replicas that took it are adopted again), and on
//! each chunkserver for as long as it holds the chunk, across its crashes too: a version
//! a server acknowledged setting was durable before it said so, so after a crash and
//! restart it holds the chunk at that version or newer (or not at all).

use std::collections::HashMap;

use tessera_core::types::{ChunkHandle, LogSeq, Version};

#[derive(Default)]
pub struct Versions {
    /// The master's latest version of each chunk, as it last showed it.
    master: HashMap<ChunkHandle, Version>,
    /// The highest version of each chunk a durable log record gave it.
    durable: HashMap<ChunkHandle, Version>,
    /// Version records logged and not yet known durable: (master node, log position,
    /// chunk, version). Per node: in a master group, a deposed leader still running and
    /// its successor number their records from the same point.
    pending: Vec<(String, LogSeq, ChunkHandle, Version)>,
    servers: HashMap<(String, ChunkHandle), Version>,
    /// The highest version each server acknowledged setting on a chunk, kept across its
    /// crashes, until it deletes the chunk while running.
    acked: HashMap<(String, ChunkHandle), Version>,
    /// Version orders a server has taken and not yet answered: (server, request) ->
    /// (chunk, version).
    ordered: HashMap<(String, u64), (ChunkHandle, Version)>,
    /// Servers that have taken a step since they last crashed.
    stepped: std::collections::HashSet<String>,
    /// Moves on whenever what the master-side checks read here changes (`generation`).
    generation: u64,
}

impl Versions {
    pub fn master(&mut self, h: ChunkHandle, v: Version) -> Option<String> {
        if self.master.insert(h, v) != Some(v) {
            self.generation += 1;
        }
        match self.durable.get(&h) {
            Some(&d) if v < d => Some(format!(
                "master's version of chunk {h} went back to {v}, below {d}, which its log made durable"
            )),
            _ => None,
        }
    }

    /// The master logged record `seq` setting `h` to version `v`.
    pub fn master_logged(&mut self, node: &str, seq: LogSeq, h: ChunkHandle, v: Version) {
        self.pending.push((node.to_string(), seq, h, v));
    }

    /// The master's log is durable through `through`.
    pub fn master_synced(&mut self, node: &str, through: LogSeq) {
        let durable = &mut self.durable;
        self.pending.retain(|(n, seq, h, v)| {
            let (seq, h, v) = (*seq, *h, *v);
            if n != node || seq > through {
                return true;
            }
            let d = durable.entry(h).or_insert(v);
            *d = (*d).max(v);
            false
        });
        self.generation += 1;
    }

    /// The master crashed: records not yet known durable are the store's to keep or lose
    /// (a restarted master numbers its records afresh from what survived).
    pub fn master_crashed(&mut self, node: &str) {
        // A master recovered from its log is checked afresh.
        self.generation += 1;
        self.pending.retain(|(n, ..)| n != node);
    }

    /// `server` took request `id`, an order to set `h` to version `v`.
    pub fn server_ordered(&mut self, server: &str, id: u64, h: ChunkHandle, v: Version) {
        self.ordered.insert((server.to_string(), id), (h, v));
    }

    /// `server` answered request `id` (`ok`: without an error).
    pub fn server_answered(&mut self, server: &str, id: u64, ok: bool) {
        if let Some((h, v)) = self.ordered.remove(&(server.to_string(), id))
            && ok
        {
            let a = self.acked.entry((server.to_string(), h)).or_insert(v);
            *a = (*a).max(v);
        }
    }

    /// `server` crashed: what it held in memory is gone, what it acknowledged is not.
    pub fn server_crashed(&mut self, server: &str) {
        self.generation += 1;
        self.stepped.remove(server);
        self.servers.retain(|(s, _), _| s != server);
        self.ordered.retain(|(s, _), _| s != server);
    }

    /// `server`'s disk was lost (beyond the claim): so is what it acknowledged.
    pub fn server_wiped(&mut self, server: &str) {
        self.server_crashed(server);
        self.acked.retain(|(s, _), _| s != server);
    }

    pub fn server(&mut self, server: &str, h: ChunkHandle, v: Version) -> Option<String> {
        if let Some(&a) = self.acked.get(&(server.to_string(), h))
            && v < a
        {
            return Some(format!(
                "{server} holds chunk {h} at version {v}, below {a}, which it acknowledged setting"
            ));
        }
        let seen = self
            .servers
            .entry((server.to_string(), h))
            .or_insert_with(|| {
                self.generation += 1;
                v
            });
        if v < *seen {
            return Some(format!(
                "{server}'s version of chunk {h} went back from {seen} to {v}"
            ));
        }
        if *seen != v {
            *seen = v;
            self.generation += 1;
        }
        None
    }

    /// The master's latest version of `h`.
    pub fn master_version(&self, h: ChunkHandle) -> Option<Version> {
        self.master.get(&h).copied()
    }

    /// Copies servers hold at a version below the master's: (server, chunk, version).
    pub fn stale_copies(&self) -> Vec<(String, ChunkHandle, Version)> {
        let mut v: Vec<_> = self
            .servers
            .iter()
            .filter(|((_, h), v)| self.master.get(h).is_some_and(|m| *v < m))
            .map(|((s, h), v)| (s.clone(), *h, *v))
            .collect();
        v.sort();
        v
    }

    /// Every server's last word on `h`.
    pub fn holders(&self, h: ChunkHandle) -> Vec<(String, Version)> {
        let mut v: Vec<_> = self
            .servers
            .iter()
            .filter(|((_, x), _)| *x == h)
            .map(|((s, _), v)| (s.clone(), *v))
            .collect();
        v.sort();
        v
    }

    /// What `server` last said its version of `h` is.
    pub fn server_version(&self, server: &str, h: ChunkHandle) -> Option<Version> {
        self.servers.get(&(server.to_string(), h)).copied()
    }

    /// The running server no longer holds `h` (deleted): a later copy starts afresh.
    /// Called after each of its steps, so it also says the server's holdings are known.
    pub fn server_dropped(&mut self, server: &str, keep: impl Fn(ChunkHandle) -> bool) {
        let before = self.servers.len();
        self.servers.retain(|(s, h), _| s != server || keep(*h));
        self.acked.retain(|(s, h), _| s != server || keep(*h));
        if !self.stepped.contains(server) {
            self.stepped.insert(server.to_string());
            self.generation += 1;
        }
        if self.servers.len() != before {
            self.generation += 1;
        }
    }

    /// A number that moves on whenever the master's recorded versions, the durable ones
    /// or a server's holdings change: checks that read only those (and the master) need
    /// not run again while it and the master stand still.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether what `server` holds is known: it has taken a step since it last crashed
    /// (its chunks then are all those [`Versions::server_version`] names).
    pub fn server_known(&self, server: &str) -> bool {
        self.stepped.contains(server)
    }
}
