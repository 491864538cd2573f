//! The fault scheduler. While the workload runs, it injects the faults its mix allows,
//! at times and on targets the seed picks. In a safety run at most R−1 chunkservers are
//! impaired (dead, cut off, or holding corrupted data) at once, so every chunk keeps an
//! intact, reachable replica: only faults the design claims to survive. The beyond-claim
//! mix wipes the disks of R servers at once, and then the runs demand clear errors,
//! never wrong data.

use std::time::Duration;

use madsim::net::NetSim;

use crate::cluster::Cluster;
use crate::replace::{Replacement, Step};

#[derive(Clone, Copy, Debug, Default)]
pub struct FaultMix {
    pub server_crashes: bool,
    /// Chunkservers cut off from everyone.
    pub partitions: bool,
    /// Chunkservers cut off from the master but not from clients.
    pub master_cut: bool,
    pub master_restarts: bool,
    pub corruption: bool,
    pub full_disks: bool,
    pub slow_disks: bool,
    /// Packet loss and long latencies.
    pub lossy_net: bool,
    /// Every chunkserver loses power at once (all replicas of every chunk): acknowledged
    /// data must survive, since every replica synced it before the acknowledgement.
    pub power_cuts: bool,
    /// A node outside the cluster forges heartbeats and orders.
    pub rogue: bool,
    /// Requests delivered twice, and links that hold requests for seconds and then
    /// deliver them.
    pub net_trouble: bool,
    /// Links cut between any two nodes other than the master and a chunkserver (the
    /// master and clients, chunkservers with each other, clients and chunkservers), one
    /// way or both.
    pub any_partitions: bool,
    /// Clocks that drift up to the bound the leases assume and are stepped forward and
    /// back within it.
    pub clock_jumps: bool,
    /// A disk that stops answering for a while.
    pub stuck_disks: bool,
    /// Data writes that land in another block of their chunk.
    pub misdirected_writes: bool,
    /// Clients that crash in the middle of an operation.
    pub client_crashes: bool,
    /// A master group: the leader killed, a shadow killed, the leader cut off from the
    /// other replicas while it still reaches chunkservers and clients.
    pub group_faults: bool,
    /// A master group: a shadow dies, is removed from the group by an admin, and comes
    /// back on a new disk under a new id to join again (`replace.rs`).
    pub replacements: bool,
    /// A master group of five: two replicas impaired at once (a minority: the other
    /// three must elect and commit). Without it, one at a time.
    pub minority_faults: bool,
    /// Of the chunkserver crashes, two in three are timed to land while the server has a write
    /// on its disk not yet synced (its flush slowed meanwhile), so the crash may tear
    /// it: at random times a write is in flight too rarely (about one run in 500 of a
    /// full mix tore one).
    pub mid_write_crashes: bool,
    pub beyond_claim: bool,
}

impl FaultMix {
    /// Every fault kind the design claims to survive.
    pub const ALL: FaultMix = FaultMix {
        server_crashes: true,
        partitions: true,
        master_cut: true,
        master_restarts: true,
        corruption: true,
        full_disks: true,
        slow_disks: true,
        lossy_net: true,
        power_cuts: true,
        rogue: true,
        net_trouble: true,
        any_partitions: true,
        clock_jumps: true,
        stuck_disks: true,
        misdirected_writes: true,
        client_crashes: true,
        group_faults: false,
        replacements: false,
        minority_faults: false,
        mid_write_crashes: true,
        beyond_claim: false,
    };
}

impl FaultMix {
    /// The fault kinds (as counted in `faults=`) each kind of fault in the mix shows up
    /// as: a sweep in which one of them never happened did not test what it claims.
    pub fn kinds(&self) -> Vec<(&'static str, &'static [&'static str])> {
        let all: [(bool, &'static str, &'static [&'static str]); 49] = [
            (
                self.minority_faults,
                "two replicas impaired at once",
                &["two_replicas_down"],
            ),
            (
                self.replacements,
                "replica replacements",
                &["replica_replaced"],
            ),
            (self.group_faults, "leader crashes", &["leader_crash"]),
            (self.group_faults, "shadow crashes", &["replica_crash"]),
            (self.group_faults, "leaders cut off", &["leader_cut"]),
            // Not demanded of a mix with a single master's faults too (all-faults): there
            // only some seeds run a group, and a third of those hold checkpoints back, so
            // a short sweep may well have none.
            (
                self.group_faults && !self.master_restarts,
                "checkpoints that come back late",
                &["slow_checkpoint"],
            ),
            // A master alone's checkpoint built while it logged on (`master::checkpointer`).
            (
                self.master_restarts && !self.group_faults,
                "checkpoints of a master alone that come back late",
                &["slow_master_checkpoint"],
            ),
            (self.server_crashes, "server_crashes", &["crash"]),
            (
                self.server_crashes && self.mid_write_crashes,
                "crashes that tear a write",
                &["torn_write"],
            ),
            (self.partitions, "partitions", &["partition"]),
            (self.master_cut, "master_cut", &["partition", "one_way"]),
            (
                self.master_restarts,
                "master_restarts",
                &["master_crash", "log_damage"],
            ),
            (self.corruption, "corruption", &["bit_flip", "meta_flip"]),
            (
                self.corruption && self.server_crashes,
                "corruption with crashes",
                &["lost_chunk"],
            ),
            (self.full_disks, "full_disks", &["full_disk"]),
            (self.slow_disks, "slow_disks", &["slow_disk"]),
            (self.lossy_net, "lossy_net", &["loss"]),
            (self.power_cuts, "power_cuts", &["power_cut"]),
            (self.rogue, "rogue", &["rogue"]),
            (self.rogue, "forged chunk requests", &["rogue_chunk"]),
            (
                self.rogue,
                "reads without a capability",
                &["rogue_cap_none"],
            ),
            (self.rogue, "altered capabilities", &["rogue_cap_altered"]),
            (
                self.rogue,
                "writes under a capability to read",
                &["rogue_cap_read_as_write"],
            ),
            (
                self.rogue,
                "pushes under a capability to read",
                &["rogue_cap_push"],
            ),
            (
                self.rogue,
                "another server's capabilities",
                &["rogue_cap_other_server"],
            ),
            (self.rogue, "expired capabilities", &["rogue_cap_expired"]),
            // Each kind of message only another role may send, every one tried.
            (
                self.rogue,
                "a client's forged forward of a mutation",
                &["rogue_role_apply"],
            ),
            (
                self.rogue,
                "a client's forged heartbeat as a real server",
                &["rogue_role_heartbeat"],
            ),
            (
                self.rogue,
                "a client's forged corruption report",
                &["rogue_role_corrupt"],
            ),
            (
                self.rogue,
                "a client's forged version change",
                &["rogue_role_set_version"],
            ),
            (
                self.rogue,
                "a client's forged lease revocation",
                &["rogue_role_revoke"],
            ),
            (
                self.rogue,
                "a client's forged clone order",
                &["rogue_role_clone"],
            ),
            (
                self.rogue,
                "a client's forged mend order",
                &["rogue_role_mend"],
            ),
            (
                self.rogue,
                "a client's forged raft message",
                &["rogue_role_raft"],
            ),
            (
                self.rogue,
                "a client's forged member change",
                &["rogue_role_members"],
            ),
            (self.rogue, "a client's admin request", &["rogue_role_fsck"]),
            (
                self.rogue,
                "extensions past a file's chunks",
                &["rogue_extend"],
            ),
            (
                self.rogue,
                "another user's file deleted, moved, written or appended to",
                &[
                    "rogue_perm_delete",
                    "rogue_perm_rename",
                    "rogue_perm_write",
                    "rogue_perm_append",
                ],
            ),
            (
                self.rogue,
                "another user's file given new bits or owner, or an entry in its directory",
                &["rogue_perm_chmod", "rogue_perm_chown", "rogue_perm_create"],
            ),
            (
                self.net_trouble,
                "net_trouble",
                &["duplicate", "long_delay", "late_reply"],
            ),
            // Requests to chunkservers that arrive after their caller gave up, from each
            // kind of caller.
            (self.net_trouble, "late client requests", &["late_request"]),
            (self.net_trouble, "late master orders", &["late_order"]),
            (self.net_trouble, "late forwards", &["late_forward"]),
            (
                self.any_partitions,
                "any_partitions",
                &["partition", "one_way"],
            ),
            (self.clock_jumps, "clock_jumps", &["clock_jump"]),
            (self.stuck_disks, "stuck_disks", &["stuck_disk"]),
            (
                self.misdirected_writes,
                "misdirected_writes",
                &["misdirected_write"],
            ),
            (self.client_crashes, "client_crashes", &["client_crash"]),
            (self.beyond_claim, "beyond_claim", &["wipe"]),
        ];
        all.into_iter()
            .filter(|k| k.0)
            .map(|(_, name, kinds)| (name, kinds))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        !(self.server_crashes
            || self.partitions
            || self.master_cut
            || self.master_restarts
            || self.corruption
            || self.full_disks
            || self.slow_disks
            || self.lossy_net
            || self.power_cuts
            || self.rogue
            || self.net_trouble
            || self.any_partitions
            || self.clock_jumps
            || self.stuck_disks
            || self.misdirected_writes
            || self.client_crashes
            || self.group_faults
            || self.beyond_claim)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Impairment {
    /// To crash once its disk has a write in flight (or at `by` at the latest), then
    /// stay down for `span`.
    Arming {
        by: i64,
        span: i64,
        lose: bool,
    },
    Dead {
        until: i64,
        /// Comes back having lost a chunk file (see [`Scheduler::expire`]).
        lose: bool,
    },
    Isolated {
        until: i64,
    },
    CutFromMaster {
        until: i64,
    },
    /// One direction of the master link only (`to_master`: the server's messages are lost).
    OneWay {
        until: i64,
        to_master: bool,
    },
    /// Its disk answers nothing.
    Stuck {
        until: i64,
    },
    /// Holds a corrupted copy: impaired until the end of the fault phase.
    Corrupted,
    /// Its disk is full.
    Full {
        until: i64,
    },
}

pub struct Scheduler {
    mix: FaultMix,
    impaired: Vec<Option<Impairment>>,
    master_down_until: Option<i64>,
    /// A value of the master's log damaged while it was down (see `damage_log`), and
    /// when it is to be restored once the master was seen to refuse it.
    log_damage: Option<crate::metastore::Damage>,
    repair_log_at: Option<i64>,
    /// When the master was started again on the damaged log.
    restarted_on_damage: Option<i64>,
    log_damages: u32,
    pub log: Vec<String>,
    wiped: bool,
    /// A server has come back without a chunk file in this run (see `expire`).
    lost_any: bool,
    /// Links cut between two nodes (by their places in `Cluster::node_ids`), and until
    /// when.
    links: Vec<(usize, usize, i64)>,
    /// A master group: the replicas impaired now (dead, or cut off from the others and
    /// from some chunkservers, listed), and until when. Never more than a minority
    /// (one of three, two of five), so a majority is always up and connected.
    replica: Vec<Impaired>,
    /// Terms whose leader [`Scheduler::watch`] has seen before it served.
    fresh_terms: std::collections::BTreeSet<u64>,
    /// A replica being replaced (it is in `replica` meanwhile, dead or joining).
    replacing: Option<Replacement>,
    /// The group id the next replaced replica joins under.
    next_group_id: u64,
    /// Replacements finished.
    replaced: u32,
}

/// A master replica impaired: which, dead (or cut off from the chunkservers listed,
/// and from the other replicas), and until when.
#[derive(Clone, Debug)]
struct Impaired {
    i: usize,
    dead: bool,
    until: i64,
    servers: Vec<usize>,
}

fn rand() -> u64 {
    madsim::rand::random()
}

impl Scheduler {
    /// The seed keeps each of the scenario's fault kinds with probability 2/3 (swarm
    /// testing: runs that leave some faults out reach states a full mix never does), but
    /// always at least one.
    pub fn new(mix: FaultMix, servers: usize) -> Scheduler {
        let mut m = mix;
        let keep = |on: &mut bool| {
            if *on && rand().is_multiple_of(3) {
                *on = false;
            }
        };
        keep(&mut m.server_crashes);
        keep(&mut m.partitions);
        keep(&mut m.master_cut);
        keep(&mut m.master_restarts);
        keep(&mut m.corruption);
        keep(&mut m.full_disks);
        keep(&mut m.slow_disks);
        keep(&mut m.lossy_net);
        keep(&mut m.power_cuts);
        keep(&mut m.rogue);
        keep(&mut m.net_trouble);
        keep(&mut m.any_partitions);
        keep(&mut m.clock_jumps);
        keep(&mut m.stuck_disks);
        keep(&mut m.misdirected_writes);
        keep(&mut m.client_crashes);
        if m.is_empty() {
            m = mix;
        }
        Scheduler {
            mix: m,
            impaired: vec![None; servers],
            master_down_until: None,
            log_damage: None,
            repair_log_at: None,
            restarted_on_damage: None,
            log_damages: 0,
            log: Vec::new(),
            wiped: false,
            lost_any: false,
            links: Vec::new(),
            replica: Vec::new(),
            replacing: None,
            next_group_id: 0,
            replaced: 0,
            fresh_terms: Default::default(),
        }
    }

    /// Whether [`Scheduler::watch`] has anything to watch for: a master group whose
    /// replicas take a while to make a new leader's master copy.
    pub fn watches(&self, cluster: &Cluster) -> bool {
        self.arming()
            || (self.mix.group_faults
                && !cluster.replicas.is_empty()
                && !cluster.knobs.checkpoint_delay.is_zero())
    }

    /// A server is to crash at its next write: it is watched closely.
    pub fn arming(&self) -> bool {
        self.impaired
            .iter()
            .any(|i| matches!(i, Some(Impairment::Arming { .. })))
    }

    /// Crashes each arming server whose disk has a write in flight, or whose time is up.
    fn crash_mid_write(&mut self, cluster: &mut Cluster) {
        let now = cluster.true_ms();
        for i in 0..self.impaired.len() {
            let Some(Impairment::Arming { by, span, lose }) = self.impaired[i] else {
                continue;
            };
            let writing = cluster.servers[i].disk.writing();
            if !writing && now < by {
                continue;
            }
            cluster.servers[i].disk.slow_flush(false);
            if writing {
                cluster.kill_server_mid_write(i);
            } else {
                cluster.kill_server(i);
            }
            cluster.count_fault("crash_mid_write", u64::from(writing));
            self.impaired[i] = Some(Impairment::Dead {
                until: now + span,
                lose,
            });
            let when = if writing {
                "mid-write"
            } else {
                "(no write came)"
            };
            self.note(cluster, format!("crash cs{i} {when} for {span}ms"));
        }
    }

    /// Called between steps, often: cuts a leader off from the group while the copy its
    /// master will start from is still being made, in every other term (by its number,
    /// so no draw moves the seed's other faults). The leader loses the lead before the
    /// copy comes back, and must drop it. Random faults never land in that window, a
    /// few hundred milliseconds to two seconds after an election: sweeps counted no
    /// copy dropped.
    pub fn watch(&mut self, cluster: &mut Cluster) {
        self.crash_mid_write(cluster);
        if !self.watches(cluster) || !self.replica.is_empty() || self.replacing.is_some() {
            return;
        }
        let fresh = {
            let c = cluster.checks.lock().expect("checks");
            c.leaders.iter().max_by_key(|(t, _)| **t).map(|(t, node)| {
                (
                    *t,
                    node.clone(),
                    c.serving.get(node).copied().unwrap_or(false),
                )
            })
        };
        let Some((term, node, serving)) = fresh else {
            return;
        };
        let Some(i) = cluster
            .replicas
            .iter()
            .position(|r| r.node == node && r.alive)
        else {
            return;
        };
        if serving || !self.fresh_terms.insert(term) || term % 2 == 1 {
            return;
        }
        cluster.cut_replica(i, &[]);
        cluster.count_fault("fresh_leader_cut", 1);
        let until = cluster.true_ms() + 3 * cluster.knobs.checkpoint_delay.as_millis() as i64;
        self.note(
            cluster,
            format!(
                "cut master{} off from the group as it starts to lead term {term}, before its master's copy is made",
                i + 1
            ),
        );
        self.replica.push(Impaired {
            i,
            dead: false,
            until,
            servers: Vec::new(),
        });
    }

    pub fn mix(&self) -> FaultMix {
        self.mix
    }

    fn budget(&self, cluster: &Cluster) -> usize {
        let used = self.impaired.iter().filter(|i| i.is_some()).count();
        (cluster.knobs.replication as usize - 1).saturating_sub(used)
    }

    fn note(&mut self, cluster: &Cluster, what: String) {
        tracing::info!(t = cluster.true_ms(), "{what}");
        self.log.push(format!("t={}ms {what}", cluster.true_ms()));
    }

    /// Tells the checks which servers are impaired now (see [`Checks::spare_copy`]).
    ///
    /// [`Checks::spare_copy`]: crate::check::Checks::spare_copy
    fn publish(&self, cluster: &Cluster) {
        let set = (0..self.impaired.len())
            .filter(|&i| self.impaired[i].is_some())
            .map(|i| cluster.servers[i].addr.clone())
            .collect();
        cluster.checks.lock().expect("checks").impaired = set;
    }

    /// Ends impairments whose time is up.
    fn expire(&mut self, cluster: &mut Cluster) {
        let now = cluster.true_ms();
        for i in 0..self.impaired.len() {
            match self.impaired[i] {
                Some(Impairment::Dead { until, lose }) if until <= now => {
                    // A chunk file lost (one with an intact copy elsewhere): the master
                    // must stop listing the server for it once it reports what it holds.
                    let lost = if lose {
                        let addr = cluster.servers[i].addr.clone();
                        let spares: Vec<u64> = {
                            let c = cluster.checks.lock().expect("checks");
                            let chunks = cluster.servers[i].disk.chunks();
                            chunks
                                .into_iter()
                                .map(|(h, _)| h)
                                .filter(|&h| c.spare_copy(&addr, h))
                                .collect()
                        };
                        (!spares.is_empty())
                            .then(|| spares[(rand() % spares.len() as u64) as usize])
                            .filter(|&h| cluster.lose_chunk(i, h))
                    } else {
                        None
                    };
                    cluster.restart_server(i);
                    cluster.count_fault("restart", 1);
                    if let Some(h) = lost {
                        self.lost_any = true;
                        self.impaired[i] = Some(Impairment::Corrupted);
                        self.note(
                            cluster,
                            format!("restart cs{i} without its copy of chunk {h}"),
                        );
                    } else {
                        self.impaired[i] = None;
                        self.note(cluster, format!("restart cs{i}"));
                    }
                }
                Some(Impairment::Isolated { until }) if until <= now => {
                    cluster.reconnect(cluster.servers[i].id);
                    self.impaired[i] = None;
                    self.note(cluster, format!("reconnect cs{i}"));
                }
                Some(Impairment::CutFromMaster { until })
                | Some(Impairment::OneWay { until, .. })
                    if until <= now =>
                {
                    cluster.mend_from_master(i);
                    self.impaired[i] = None;
                    self.note(cluster, format!("mend cs{i}-master"));
                }
                Some(Impairment::Full { until }) if until <= now => {
                    let d = &cluster.servers[i].disk;
                    d.set_capacity(cluster.knobs.disk_capacity);
                    self.impaired[i] = None;
                    self.note(cluster, format!("the disk of cs{i} has room again"));
                }
                Some(Impairment::Stuck { until }) if until <= now => {
                    cluster.servers[i].disk.stick(Duration::ZERO);
                    self.impaired[i] = None;
                    self.note(cluster, format!("the disk of cs{i} answers again"));
                }
                _ => {}
            }
        }
        let (done, cut): (Vec<_>, Vec<_>) = self.links.drain(..).partition(|l| l.2 <= now);
        self.links = cut;
        for (a, b, _) in done {
            cluster.mend_link(a, b);
            let what = format!("mend {}-{}", cluster.node_name(a), cluster.node_name(b));
            self.note(cluster, what);
        }
        if let Some(until) = self.master_down_until
            && until <= now
        {
            cluster.restart_master();
            cluster.count_fault("restart", 1);
            self.master_down_until = None;
            let size = cluster
                .master_chunk_size
                .load(std::sync::atomic::Ordering::Relaxed);
            self.note(cluster, format!("restart master (chunk size {size})"));
            if self.log_damage.is_some() {
                // Long enough for recovery to have read the log and stopped.
                self.repair_log_at = Some(now + 1_000 + (rand() % 2_000) as i64);
                self.restarted_on_damage = Some(now);
            }
        }
        self.replace_step(cluster);
        let (done, left): (Vec<Impaired>, Vec<Impaired>) = std::mem::take(&mut self.replica)
            .into_iter()
            .partition(|r| r.until <= now);
        self.replica = left;
        for r in done {
            if r.dead {
                cluster.restart_replica(r.i);
                cluster.count_fault("restart", 1);
                self.note(cluster, format!("restart master{}", r.i + 1));
            } else {
                cluster.mend_replica(r.i, &r.servers, &self.cut_replicas());
                self.note(cluster, format!("reconnect master{}", r.i + 1));
            }
        }
        if self.repair_log_at.is_some_and(|at| at <= now) {
            self.repair_log(cluster);
        }
    }

    /// While the master is down, damages one durable value of its log (a bit flipped or
    /// the value cut short), as a failing disk might. The master must refuse to start on
    /// it; [`Scheduler::repair_log`] then checks it did, and restores the value.
    fn damage_log(&mut self, cluster: &mut Cluster) {
        let Some(d) = cluster.master_store.damage(rand()) else {
            return;
        };
        let key = String::from_utf8_lossy(&d.key).into_owned();
        let what = format!("{} of log key {key:?}", d.what);
        cluster.checks.lock().expect("checks").log_damage = Some(what.clone());
        cluster.count_fault("log_damage", 1);
        self.log_damages += 1;
        self.log_damage = Some(d);
        self.note(cluster, format!("damage the master's log: {what}"));
    }

    /// The operator's part after a damaged log: the master must have refused to start
    /// on it (a master that started served a namespace built from a damaged record);
    /// then the value is restored from a copy and the master started again.
    fn repair_log(&mut self, cluster: &mut Cluster) {
        self.repair_log_at = None;
        self.restarted_on_damage = None;
        let Some(d) = self.log_damage.take() else {
            return;
        };
        let t = cluster.true_ms();
        {
            let mut c = cluster.checks.lock().expect("checks");
            let what = c.log_damage.take().unwrap_or_default();
            if c.master_refusals == 0 {
                c.violation(t, format!("the master started on a damaged log ({what})"));
            }
            c.master_refusals = 0;
        }
        cluster.master_store.restore(&d);
        cluster.kill_master();
        cluster.restart_master();
        self.note(cluster, "restore the master's log; restart master".into());
    }

    /// One scheduling step: maybe inject a fault.
    pub fn step(&mut self, cluster: &mut Cluster) {
        self.inject(cluster);
        self.publish(cluster);
    }

    fn inject(&mut self, cluster: &mut Cluster) {
        self.crash_mid_write(cluster);
        self.expire(cluster);
        let now = cluster.true_ms();
        let n = self.impaired.len();
        let pick = (rand() % n as u64) as usize;
        let span = 1_000 + (rand() % 15_000) as i64;
        self.publish(cluster);
        let free = self.impaired[pick].is_none()
            && self.budget(cluster) > 0
            && cluster
                .checks
                .lock()
                .expect("checks")
                .may_impair(&cluster.servers[pick].addr);
        let m = self.mix;
        let mut options: Vec<u8> = Vec::new();
        if m.server_crashes && free {
            options.push(0);
        }
        if m.partitions && free {
            options.push(1);
        }
        if m.master_cut && free {
            options.push(2);
            options.push(9);
        }
        if m.master_restarts && self.master_down_until.is_none() && self.log_damage.is_none() {
            options.push(3);
        }
        if m.corruption && free && !cluster.servers[pick].disk.chunks().is_empty() {
            options.push(4);
        }
        // A full disk impairs its copies: they miss the next version, and go stale.
        if m.full_disks && free {
            options.push(5);
        }
        if m.slow_disks {
            options.push(6);
        }
        if m.lossy_net {
            options.push(7);
        }
        if m.beyond_claim && !self.wiped && now > 10_000 {
            options.push(8);
        }
        if m.rogue && n > 1 && !cluster.servers[pick].disk.chunks().is_empty() {
            options.push(11);
        }
        if m.net_trouble {
            options.push(12);
        }
        if m.any_partitions {
            options.push(13);
        }
        if m.clock_jumps && cluster.knobs.clock_jump_ms > 0 {
            options.push(14);
        }
        if m.stuck_disks && free {
            options.push(15);
        }
        if m.misdirected_writes && free && !cluster.servers[pick].disk.chunks().is_empty() {
            options.push(16);
        }
        if m.client_crashes {
            options.push(17);
        }
        let minority = if m.minority_faults {
            cluster.replicas.len().saturating_sub(1) / 2
        } else {
            1
        };
        if m.group_faults
            && !cluster.replicas.is_empty()
            && self.replica.len() < minority
            && self.replacing.is_none()
        {
            options.push(18);
        }
        if m.replacements && cluster.replicas.len() >= 3 && self.replica.is_empty() {
            options.push(19);
        }
        // Rarer than the others: every copy of every chunk goes down with it.
        if m.power_cuts && self.impaired.iter().all(Option::is_none) && rand().is_multiple_of(6) {
            options.push(10);
        }
        if options.is_empty() {
            return;
        }
        match options[(rand() % options.len() as u64) as usize] {
            0 => {
                // With corruption in the mix, one crash in three is short (the master
                // does not declare the server dead) and its disk loses a chunk file
                // meanwhile: the server comes back under its old identity without it.
                // Every crash is, until one has: a run has few chunkserver crashes, and
                // at one in three whole windows of 50 seeds went without a lost file.
                let lose = m.corruption && (rand().is_multiple_of(3) || !self.lost_any);
                let span = if lose {
                    300 + (rand() % (cluster.knobs.heartbeat_timeout.as_millis() as u64 / 2)) as i64
                } else {
                    span
                };
                // By the span's parity: no draw of its own, so the mix's other faults
                // keep their seeds.
                if m.mid_write_crashes && span % 3 != 0 {
                    cluster.servers[pick].disk.slow_flush(true);
                    self.impaired[pick] = Some(Impairment::Arming {
                        by: now + 3_000,
                        span,
                        lose,
                    });
                    self.note(cluster, format!("crash cs{pick} at its next write"));
                } else {
                    cluster.kill_server(pick);
                    self.impaired[pick] = Some(Impairment::Dead {
                        until: now + span,
                        lose,
                    });
                    self.note(cluster, format!("crash cs{pick} for {span}ms"));
                }
            }
            1 => {
                cluster.isolate(cluster.servers[pick].id);
                cluster.count_fault("partition", 1);
                self.impaired[pick] = Some(Impairment::Isolated { until: now + span });
                self.note(cluster, format!("isolate cs{pick} for {span}ms"));
            }
            2 => {
                cluster.cut_from_master(pick);
                cluster.count_fault("partition", 1);
                self.impaired[pick] = Some(Impairment::CutFromMaster { until: now + span });
                self.note(cluster, format!("cut cs{pick} from master for {span}ms"));
            }
            9 => {
                let to_master = rand().is_multiple_of(2);
                cluster.cut_one_way(pick, to_master);
                cluster.count_fault("one_way", 1);
                self.impaired[pick] = Some(Impairment::OneWay {
                    until: now + span,
                    to_master,
                });
                let dir = if to_master {
                    "cs->master"
                } else {
                    "master->cs"
                };
                self.note(cluster, format!("cut {dir} for cs{pick} for {span}ms"));
            }
            3 => {
                cluster.kill_master();
                let down = 500 + (rand() % 5_000) as i64;
                self.master_down_until = Some(now + down);
                self.note(cluster, format!("crash master for {down}ms"));
                // Now and then its disk damaged the log too (twice a run at most).
                if self.log_damages < 2 && rand().is_multiple_of(10) {
                    self.damage_log(cluster);
                }
            }
            4 => {
                // Many blocks of many copies on this server, data or checksums; only
                // copies of chunks with an intact copy elsewhere (the budget is per chunk).
                let chunks = cluster.servers[pick].disk.chunks();
                let addr = cluster.servers[pick].addr.clone();
                for _ in 0..1 + rand() % 8 {
                    let (h, len) = chunks[(rand() % chunks.len() as u64) as usize];
                    if !cluster.checks.lock().expect("checks").spare_copy(&addr, h) {
                        continue;
                    }
                    if rand().is_multiple_of(4) {
                        if cluster.flip_checksum(pick, h, rand()) {
                            self.impaired[pick] = Some(Impairment::Corrupted);
                            self.note(
                                cluster,
                                format!("flip a bit of a checksum of chunk {h} on cs{pick}"),
                            );
                        }
                    } else if len > 0 {
                        let off = (rand() % len as u64) as usize;
                        cluster.flip_bit(pick, h, off, (rand() % 8) as u8);
                        self.impaired[pick] = Some(Impairment::Corrupted);
                        self.note(
                            cluster,
                            format!("flip a bit of chunk {h} at {off} on cs{pick}"),
                        );
                    }
                }
            }
            5 => {
                let d = &cluster.servers[pick].disk;
                d.set_capacity(d.used());
                cluster.count_fault("full_disk", 1);
                self.impaired[pick] = Some(Impairment::Full { until: now + span });
                self.note(cluster, format!("fill the disk of cs{pick} for {span}ms"));
            }
            6 => {
                let delay = Duration::from_millis(rand() % 200);
                // One time in three the master's log disk: its syncs then take long
                // enough that a master crash finds records in flight (a lost log tail).
                if rand().is_multiple_of(3) {
                    if cluster.replicas.is_empty() {
                        cluster.master_store.set_delay(delay);
                        self.note(cluster, format!("slow the master's log disk by {delay:?}"));
                    } else {
                        // A group's replica, any of them: the leader's slow syncs hold
                        // commits back; a follower's may cost the leader its majority.
                        let r = (rand() % cluster.replicas.len() as u64) as usize;
                        cluster.replicas[r].store.set_delay(delay);
                        let what = format!(
                            "slow the log disk of {} by {delay:?}",
                            cluster.replicas[r].node
                        );
                        self.note(cluster, what);
                    }
                } else {
                    cluster.servers[pick].disk.set_delay(delay);
                    self.note(cluster, format!("slow the disk of cs{pick}"));
                }
                cluster.count_fault("slow_disk", u64::from(!delay.is_zero()));
            }
            7 => {
                let loss = (rand() % 10) as f64 / 100.0;
                // The range must not be empty: madsim samples from it.
                let max_latency = Duration::from_millis(2 + rand() % 100);
                NetSim::current().update_config(|c| {
                    c.packet_loss_rate = loss;
                    c.send_latency = Duration::from_millis(1)..max_latency;
                });
                cluster.count_fault("loss", u64::from(loss > 0.0));
                self.note(cluster, format!("network loss {loss}"));
            }
            8 => {
                // More failures than replicas: R servers lose their disks at once.
                let r = cluster.knobs.replication as usize;
                for i in 0..r.min(n) {
                    cluster.kill_server(i);
                    cluster.servers[i].disk.wipe();
                    let addr = cluster.servers[i].addr.clone();
                    cluster
                        .checks
                        .lock()
                        .expect("checks")
                        .versions
                        .server_wiped(&addr);
                    cluster.count_fault("wipe", 1);
                    self.impaired[i] = Some(Impairment::Dead {
                        until: now + 3_000,
                        lose: false,
                    });
                }
                self.wiped = true;
                self.note(cluster, format!("wipe the disks of {r} chunkservers"));
            }
            10 => {
                // Short: the point is the crash of every disk at once, not the outage.
                let down = 500 + (rand() % 3_000) as i64;
                for i in 0..n {
                    cluster.kill_server(i);
                    self.impaired[i] = Some(Impairment::Dead {
                        until: now + down,
                        lose: false,
                    });
                }
                cluster.count_fault("power_cut", 1);
                self.note(
                    cluster,
                    format!("power cut of every chunkserver for {down}ms"),
                );
            }
            11 => {
                let chunks = cluster.servers[pick].disk.chunks();
                let (h, _) = chunks[(rand() % chunks.len() as u64) as usize];
                let other = (pick + 1 + (rand() % (n as u64 - 1)) as usize) % n;
                cluster.rogue(pick, h, other);
                self.note(
                    cluster,
                    format!("rogue message about chunk {h} of cs{pick}"),
                );
            }
            12 => {
                let (dup, delay) = (1 + rand() % 30, 1 + rand() % 20);
                cluster.net.set(dup, delay);
                self.note(
                    cluster,
                    format!(
                        "network duplicates {dup}/1000 requests and holds {delay}/1000 requests and replies"
                    ),
                );
            }
            13 => {
                // Any pair but the master and a chunkserver (that is `master_cut`, which
                // the budget of impaired servers governs).
                let ids = cluster.node_ids().len();
                let a = (rand() % ids as u64) as usize;
                let b = (a + 1 + (rand() % (ids as u64 - 1)) as usize) % ids;
                let n = cluster.servers.len();
                let master_and_server =
                    |x: usize, y: usize| cluster.is_master_node(x) && (1..=n).contains(&y);
                if !master_and_server(a, b) && !master_and_server(b, a) {
                    let both = rand().is_multiple_of(2);
                    cluster.cut_link(a, b, both);
                    cluster.count_fault(if both { "partition" } else { "one_way" }, 1);
                    self.links.push((a, b, now + span));
                    let what = format!(
                        "cut {}{}{} for {span}ms",
                        cluster.node_name(a),
                        if both { "-" } else { "->" },
                        cluster.node_name(b)
                    );
                    self.note(cluster, what);
                }
            }
            14 => {
                let k = (rand() % cluster.jumps.len() as u64) as usize;
                let bound = cluster.knobs.clock_jump_ms;
                let to = (rand() % (2 * bound as u64 + 1)) as i64 - bound;
                let from = cluster.jumps[k].get();
                if to != from {
                    cluster.jumps[k].set(to);
                    cluster.count_fault("clock_jump", 1);
                    let what = format!(
                        "step the clock of {} by {}ms",
                        cluster.node_name(k),
                        to - from
                    );
                    self.note(cluster, what);
                }
            }
            15 => {
                cluster.servers[pick]
                    .disk
                    .stick(Duration::from_millis(span as u64));
                self.impaired[pick] = Some(Impairment::Stuck { until: now + span });
                self.note(
                    cluster,
                    format!("the disk of cs{pick} stops answering for {span}ms"),
                );
            }
            16 => {
                let n = 1 + (rand() % 3) as u32;
                cluster.servers[pick].disk.misdirect(n);
                self.impaired[pick] = Some(Impairment::Corrupted);
                self.note(
                    cluster,
                    format!("the next {n} writes on cs{pick} go astray"),
                );
            }
            17 => {
                let permille = 20 + rand() % 100;
                cluster.checks.lock().expect("checks").client_crash_permille = permille;
                self.note(
                    cluster,
                    format!("clients crash in {permille}/1000 operations"),
                );
            }
            18 => {
                // A leader already impaired (cut off, and not yet deposed) is not picked
                // again.
                let leader = cluster
                    .leader()
                    .filter(|l| self.replica.iter().all(|r| r.i != *l));
                let down = 300 + (rand() % 8_000) as i64;
                match (rand() % 3, leader) {
                    (0, Some(l)) => {
                        cluster.kill_replica(l);
                        self.replica.push(Impaired {
                            i: l,
                            dead: true,
                            until: now + down,
                            servers: Vec::new(),
                        });
                        self.note(
                            cluster,
                            format!("crash master{} (leader) for {down}ms", l + 1),
                        );
                    }
                    (1, Some(l)) => {
                        // From the other replicas, and from some chunkservers: those
                        // find the new leader while the rest still heartbeat to this one.
                        // Now and then for longer than the new leader's quiet period,
                        // so it grants leases while the old one may still be running.
                        let down = if rand().is_multiple_of(2) {
                            down
                        } else {
                            let lease = cluster.knobs.lease.as_millis() as i64;
                            lease + 5_000 + (rand() % (lease as u64 + 10_000)) as i64
                        };
                        let servers: Vec<usize> = (0..cluster.servers.len())
                            .filter(|_| rand().is_multiple_of(2))
                            .collect();
                        cluster.cut_replica(l, &servers);
                        cluster.count_fault("leader_cut", 1);
                        self.note(
                            cluster,
                            format!(
                                "cut master{} (leader) off from the group and chunkservers {servers:?} for {down}ms",
                                l + 1
                            ),
                        );
                        self.replica.push(Impaired {
                            i: l,
                            dead: false,
                            until: now + down,
                            servers,
                        });
                    }
                    _ => {
                        // Any replica not impaired already.
                        let whole: Vec<usize> = (0..cluster.replicas.len())
                            .filter(|i| self.replica.iter().all(|r| r.i != *i))
                            .collect();
                        let i = whole[(rand() % whole.len() as u64) as usize];
                        cluster.kill_replica(i);
                        self.replica.push(Impaired {
                            i,
                            dead: true,
                            until: now + down,
                            servers: Vec::new(),
                        });
                        self.note(cluster, format!("crash master{} for {down}ms", i + 1));
                    }
                }
                if self.replica.len() >= 2 {
                    cluster.count_fault("two_replicas_down", 1);
                }
            }
            19 => {
                self.start_replacement(cluster);
            }
            _ => unreachable!(),
        }
    }

    /// The replicas cut off now (their links to others stay cut when one mends).
    fn cut_replicas(&self) -> Vec<usize> {
        self.replica
            .iter()
            .filter(|r| !r.dead)
            .map(|r| r.i)
            .collect()
    }

    /// Loses a shadow, to be replaced (`replace.rs`); false if no replica leads now.
    fn start_replacement(&mut self, cluster: &mut Cluster) -> bool {
        let Some(l) = cluster.leader() else {
            return false;
        };
        let n = cluster.replicas.len();
        let i = (l + 1 + (rand() % (n as u64 - 1)) as usize) % n;
        if self.next_group_id == 0 {
            self.next_group_id = n as u64 + 1;
        }
        let new = self.next_group_id;
        self.next_group_id += 1;
        cluster.kill_replica(i);
        let r = Replacement::new(cluster, i, new);
        self.note(
            cluster,
            format!(
                "master{} (id {}) is lost: remove it, and join it again on a new disk as id {new}",
                i + 1,
                r.old
            ),
        );
        self.replica.push(Impaired {
            i,
            dead: true,
            until: i64::MAX,
            servers: Vec::new(),
        });
        self.replacing = Some(r);
        true
    }

    /// Moves a replacement on: its next admin request, or its end.
    fn replace_step(&mut self, cluster: &mut Cluster) {
        let Some(r) = self.replacing.as_mut() else {
            return;
        };
        let (i, new) = (r.i, r.new);
        match r.step(cluster) {
            Step::Waiting | Step::Learning => {}
            Step::Failed(e) => {
                self.note(cluster, format!("master{}: asked again after: {e}", i + 1))
            }
            Step::Rejoined => self.note(
                cluster,
                format!(
                    "master{} removed; back on a new disk, joining as id {new}",
                    i + 1
                ),
            ),
            Step::Done => {
                self.replaced += 1;
                self.replacing = None;
                self.replica.retain(|r| r.i != i);
                cluster.count_fault("replica_replaced", 1);
                self.note(cluster, format!("master{} added as id {new}", i + 1));
            }
        }
    }

    /// After `heal`: the replacement under way, if one is, finished within `within`; in
    /// a mix with replacements and a run that made none, one made now, in a calm
    /// cluster.
    pub async fn settle(&mut self, cluster: &mut Cluster, within: Duration) -> Result<(), String> {
        let deadline = cluster.true_ms() + within.as_millis() as i64;
        let owed = |s: &Scheduler| s.mix.replacements && s.replaced == 0;
        while self.replacing.is_some() || owed(self) {
            if self.replacing.is_none() && !self.start_replacement(cluster) {
                if cluster.true_ms() > deadline {
                    return Err("no master replica led to start a replacement".into());
                }
                madsim::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            self.replace_step(cluster);
            if self.replacing.is_none() {
                break;
            }
            if cluster.true_ms() > deadline {
                let r = self.replacing.as_ref().expect("checked");
                return Err(format!(
                    "replacing master{} (id {} by id {}) did not finish {} s after healing",
                    r.i + 1,
                    r.old,
                    r.new,
                    within.as_secs()
                ));
            }
            madsim::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }

    /// Ends every fault: all nodes up and connected, disks whole and fast, network clean.
    pub fn heal(&mut self, cluster: &mut Cluster) {
        for i in 0..self.impaired.len() {
            cluster.restart_server(i);
            cluster.reconnect(cluster.servers[i].id);
            cluster.mend_from_master(i);
            let d = &cluster.servers[i].disk;
            d.set_capacity(cluster.knobs.disk_capacity);
            d.set_delay(Duration::ZERO);
            d.slow_flush(false);
            self.impaired[i] = None;
        }
        for i in 0..self.impaired.len() {
            let d = &cluster.servers[i].disk;
            d.stick(Duration::ZERO);
            d.misdirect(0);
        }
        for (a, b, _) in std::mem::take(&mut self.links) {
            cluster.mend_link(a, b);
        }
        cluster.net.set(0, 0);
        cluster.checks.lock().expect("checks").client_crash_permille = 0;
        cluster.master_store.set_delay(Duration::ZERO);
        for r in &cluster.replicas {
            r.store.set_delay(Duration::ZERO);
        }
        let now = cluster.true_ms();
        if self.restarted_on_damage.is_some_and(|t| t < now) {
            // The master was restarted on the damaged log at an earlier step.
            self.repair_log(cluster);
        } else if let Some(d) = self.log_damage.take() {
            // Not restarted on it, or only just now: nothing to judge yet; the log is
            // restored.
            self.repair_log_at = None;
            self.restarted_on_damage = None;
            cluster.checks.lock().expect("checks").log_damage = None;
            cluster.kill_master();
            cluster.master_store.restore(&d);
            self.note(cluster, "restore the master's log".into());
        }
        cluster.restart_master();
        cluster.reconnect(cluster.master_id);
        self.master_down_until = None;
        if self.replacing.is_some() {
            // Finished by `settle`: the replica is dead, or joining, on purpose.
        } else {
            for r in std::mem::take(&mut self.replica) {
                cluster.restart_replica(r.i);
                cluster.mend_replica(r.i, &r.servers, &[]);
            }
        }
        NetSim::current().update_config(|c| *c = madsim::net::Config::default());
        self.publish(cluster);
        self.note(cluster, "heal".into());
    }
}
