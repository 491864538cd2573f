//! The chunkserver registry: who is alive, on which rack, with how much space, and how
//! many chunks the master believes each one holds. Servers are numbered in the order they
//! first appear; a number is never reused, so a replica list can hold plain `u32`s.

use crate::types::HashMap;
use std::time::Duration;

use super::chunks::ServerIdx;
use crate::types::Time;

#[derive(Clone, Debug)]
pub struct Server {
    pub addr: String,
    /// The id the server's heartbeats carry (0: a server from before servers had one).
    pub id: u64,
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
    /// The master term its last heartbeat said it had stored.
    pub epoch: u64,
    /// Whether this master has answered one of its heartbeats: only then can it have
    /// stored this master's term (or a master alone's epoch) from this master.
    pub answered: bool,
    /// The name in the certificate its heartbeats came with (`crate::auth`; empty on an
    /// insecure cluster): the server id is bound to it, so no other certificate can
    /// speak for this server.
    pub cert: String,
    /// Its run and the capability keys it holds, as its last heartbeat reported them
    /// (`crate::capability`): what the master signs its capabilities with.
    pub keys: crate::capability::ServerKeys,
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

/// How a heartbeat found its server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Registered and alive.
    Known,
    /// New here, or back after being declared dead.
    Revived,
    /// Another server (another id) at the address of a dead one: a disk replaced, or a
    /// server moved. What the old one held is gone with it.
    Replaced,
}

/// Why a heartbeat was refused, changing nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// A live server with another id holds the address.
    AddressInUse { registered: u64 },
    /// The certificate belongs to a live server at another address: one certificate
    /// speaks for one server at a time.
    CertInUse { addr: String },
    /// The server id (or the live server at the address) is another certificate's.
    OtherCert { id: u64, cert: String },
    /// A new address, and the registry holds its most servers already (`dead` of them
    /// dead).
    Full { held: usize, dead: usize },
}

#[derive(Debug)]
pub struct Registry {
    servers: Vec<Server>,
    by_addr: HashMap<String, ServerIdx>,
    /// The most servers it holds (`MasterConfig::max_servers`).
    max: usize,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new(usize::MAX)
    }
}

impl Registry {
    /// A registry that holds at most `max` servers.
    pub fn new(max: usize) -> Registry {
        Registry {
            servers: Vec::new(),
            by_addr: HashMap::default(),
            max,
        }
    }

    /// Records a heartbeat from server `id` at `addr`; returns the server's number and how
    /// it arrived. Refused, changing nothing, if a live server with another id holds the
    /// address (two servers configured with one address would otherwise take turns
    /// being each other). An id of 0 (a server from before ids) matches any.
    ///
    /// `cert` is the name the heartbeat's certificate gives its sender (empty: nobody is
    /// authenticated). A server id, once heard with a certificate, stays that
    /// certificate's; and a certificate speaks for one live server at a time, so a
    /// holder of one cannot make up servers (other ids, other addresses) beside it.
    // Each argument is one thing the heartbeat claims or carried; the registry stays
    // apart from the wire type (its tests call it with bare values).
    #[allow(clippy::too_many_arguments)]
    pub fn heartbeat(
        &mut self,
        now: Time,
        id: u64,
        addr: &str,
        rack: &str,
        capacity: u64,
        used: u64,
        cert: &str,
    ) -> Result<(ServerIdx, Arrival), Refused> {
        let here = self.by_addr.get(addr).copied();
        if !cert.is_empty() {
            for (i, s) in self.servers.iter().enumerate() {
                let i = i as ServerIdx;
                if Some(i) == here {
                    // A live server's address, or a dead one's id, is its certificate's.
                    let theirs = s.alive || (id != 0 && s.id == id);
                    if theirs && !s.cert.is_empty() && s.cert != cert {
                        return Err(Refused::OtherCert {
                            id: s.id,
                            cert: s.cert.clone(),
                        });
                    }
                    continue;
                }
                if s.alive && s.cert == cert {
                    return Err(Refused::CertInUse {
                        addr: s.addr.clone(),
                    });
                }
                if id != 0 && s.id == id && !s.cert.is_empty() && s.cert != cert {
                    return Err(Refused::OtherCert {
                        id,
                        cert: s.cert.clone(),
                    });
                }
            }
        }
        let mut replaced = false;
        let idx = match here {
            Some(i) => {
                let s = &mut self.servers[i as usize];
                if id != 0 && s.id != id {
                    if s.alive && s.id != 0 {
                        return Err(Refused::AddressInUse { registered: s.id });
                    }
                    replaced = s.id != 0;
                    s.id = id;
                    // Another server: the term it has stored is its own to report.
                    s.epoch = 0;
                    s.answered = false;
                }
                i
            }
            None => {
                if self.servers.len() >= self.max {
                    return Err(Refused::Full {
                        held: self.servers.len(),
                        dead: self.servers.iter().filter(|s| !s.alive).count(),
                    });
                }
                let i = ServerIdx::try_from(self.servers.len()).expect("fewer than 2^32 servers");
                self.servers.push(Server {
                    addr: addr.to_string(),
                    id,
                    rack: rack.to_string(),
                    capacity,
                    used,
                    last_heartbeat: now,
                    alive: false,
                    replicas: 0,
                    recent_creations: 0,
                    window_start: now,
                    clones_in_flight: 0,
                    epoch: 0,
                    answered: false,
                    cert: String::new(),
                    keys: Default::default(),
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
        s.cert = cert.to_string();
        let arrival = match (replaced, revived) {
            (true, _) => Arrival::Replaced,
            (false, true) => Arrival::Revived,
            (false, false) => Arrival::Known,
        };
        Ok((idx, arrival))
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
