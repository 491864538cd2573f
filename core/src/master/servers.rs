//! The chunkserver registry: who is alive, on which rack, with how much space, and how
//! many chunks the master believes each one holds. Servers are numbered in the order they
//! first appear; a number is never reused, so a replica list can hold plain `u32`s.

use std::collections::HashMap;
use std::time::Duration;

use super::chunks::ServerIdx;
use crate::types::Time;

#[derive(Clone, Debug)]
pub struct Server {
    pub addr: String,
    pub rack: String,
    pub capacity: u64,
    pub used: u64,
    pub last_heartbeat: Time,
    pub alive: bool,
    /// Replicas the chunk table lists on this server.
    pub replicas: u64,
    /// Chunks created on this server in the current placement window.
    pub recent_creations: u32,
    pub window_start: Time,
    /// Clones running with this server as source or target.
    pub clones_in_flight: u32,
}

impl Server {
    pub fn utilization(&self) -> f64 {
        if self.capacity == 0 {
            1.0
        } else {
            self.used as f64 / self.capacity as f64
        }
    }
}

#[derive(Debug, Default)]
pub struct Registry {
    servers: Vec<Server>,
    by_addr: HashMap<String, ServerIdx>,
}

impl Registry {
    /// Records a heartbeat; returns the server's number and whether it was dead or unknown
    /// until now.
    pub fn heartbeat(
        &mut self,
        now: Time,
        addr: &str,
        rack: &str,
        capacity: u64,
        used: u64,
    ) -> (ServerIdx, bool) {
        let idx = match self.by_addr.get(addr) {
            Some(&i) => i,
            None => {
                let i = ServerIdx::try_from(self.servers.len()).expect("fewer than 2^32 servers");
                self.servers.push(Server {
                    addr: addr.to_string(),
                    rack: rack.to_string(),
                    capacity,
                    used,
                    last_heartbeat: now,
                    alive: false,
                    replicas: 0,
                    recent_creations: 0,
                    window_start: now,
                    clones_in_flight: 0,
                });
                self.by_addr.insert(addr.to_string(), i);
                i
            }
        };
        let s = &mut self.servers[idx as usize];
        let revived = !s.alive;
        s.alive = true;
        s.rack = rack.to_string();
        s.capacity = capacity;
        s.used = used;
        s.last_heartbeat = now;
        (idx, revived)
    }

    /// Marks servers silent for longer than `timeout` dead; returns them.
    pub fn expire(&mut self, now: Time, timeout: Duration) -> Vec<ServerIdx> {
        let mut dead = Vec::new();
        for (i, s) in self.servers.iter_mut().enumerate() {
            if s.alive && now.saturating_sub(s.last_heartbeat) > timeout {
                s.alive = false;
                dead.push(i as ServerIdx);
            }
        }
        dead
    }

    pub fn get(&self, i: ServerIdx) -> &Server {
        &self.servers[i as usize]
    }

    pub fn get_mut(&mut self, i: ServerIdx) -> &mut Server {
        &mut self.servers[i as usize]
    }

    pub fn find(&self, addr: &str) -> Option<ServerIdx> {
        self.by_addr.get(addr).copied()
    }

    pub fn is_alive(&self, i: ServerIdx) -> bool {
        self.servers.get(i as usize).is_some_and(|s| s.alive)
    }

    pub fn iter(&self) -> impl Iterator<Item = (ServerIdx, &Server)> {
        self.servers
            .iter()
            .enumerate()
            .map(|(i, s)| (i as ServerIdx, s))
    }

    pub fn live(&self) -> impl Iterator<Item = (ServerIdx, &Server)> {
        self.iter().filter(|(_, s)| s.alive)
    }

    /// Counts a creation against the server's recent-creation limit.
    pub fn note_creation(&mut self, i: ServerIdx, now: Time, window: Duration) {
        let s = &mut self.servers[i as usize];
        if now.saturating_sub(s.window_start) >= window {
            s.window_start = now;
            s.recent_creations = 0;
        }
        s.recent_creations += 1;
    }
}
