//! Chunk versions never go backwards: on the master, and on each chunkserver for as long
//! as it holds the chunk.

use std::collections::HashMap;

use tessera_core::types::{ChunkHandle, Version};

#[derive(Default)]
pub struct Versions {
    master: HashMap<ChunkHandle, Version>,
    servers: HashMap<(String, ChunkHandle), Version>,
}

impl Versions {
    pub fn master(&mut self, h: ChunkHandle, v: Version) -> Option<String> {
        let seen = self.master.entry(h).or_insert(v);
        if v < *seen {
            return Some(format!(
                "master's version of chunk {h} went back from {seen} to {v}"
            ));
        }
        *seen = v;
        None
    }

    pub fn server(&mut self, server: &str, h: ChunkHandle, v: Version) -> Option<String> {
        let seen = self.servers.entry((server.to_string(), h)).or_insert(v);
        if v < *seen {
            return Some(format!(
                "{server}'s version of chunk {h} went back from {seen} to {v}"
            ));
        }
        *seen = v;
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

    /// The server no longer holds `h` (deleted): a later copy starts afresh.
    pub fn server_dropped(&mut self, server: &str, keep: impl Fn(ChunkHandle) -> bool) {
        self.servers.retain(|(s, h), _| s != server || keep(*h));
    }
}
