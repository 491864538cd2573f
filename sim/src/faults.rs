//! The fault scheduler. While the workload runs, it injects the faults its mix allows,
//! at times and on targets the seed picks. In a safety run at most R−1 chunkservers are
//! impaired (dead, cut off, or holding corrupted data) at once, so every chunk keeps an
//! intact, reachable replica: only faults the design claims to survive. The beyond-claim
//! mix wipes the disks of R servers at once, and then the runs demand clear errors,
//! never wrong data.

use std::time::Duration;

use madsim::net::NetSim;

use crate::cluster::Cluster;

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
    pub beyond_claim: bool,
}

impl FaultMix {
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
            || self.beyond_claim)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Impairment {
    Dead {
        until: i64,
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
    /// Holds a corrupted copy: impaired until the end of the fault phase.
    Corrupted,
}

pub struct Scheduler {
    mix: FaultMix,
    impaired: Vec<Option<Impairment>>,
    master_down_until: Option<i64>,
    pub log: Vec<String>,
    wiped: bool,
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
        if m.is_empty() {
            m = mix;
        }
        Scheduler {
            mix: m,
            impaired: vec![None; servers],
            master_down_until: None,
            log: Vec::new(),
            wiped: false,
        }
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

    /// Ends impairments whose time is up.
    fn expire(&mut self, cluster: &mut Cluster) {
        let now = cluster.true_ms();
        for i in 0..self.impaired.len() {
            match self.impaired[i] {
                Some(Impairment::Dead { until }) if until <= now => {
                    cluster.restart_server(i);
                    cluster.count_fault("restart", 1);
                    self.impaired[i] = None;
                    self.note(cluster, format!("restart cs{i}"));
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
                _ => {}
            }
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
        }
    }

    /// One scheduling step: maybe inject a fault.
    pub fn step(&mut self, cluster: &mut Cluster) {
        self.expire(cluster);
        let now = cluster.true_ms();
        let n = self.impaired.len();
        let pick = (rand() % n as u64) as usize;
        let span = 1_000 + (rand() % 15_000) as i64;
        let free = self.impaired[pick].is_none() && self.budget(cluster) > 0;
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
        if m.master_restarts && self.master_down_until.is_none() {
            options.push(3);
        }
        if m.corruption && free && !cluster.servers[pick].disk.chunks().is_empty() {
            options.push(4);
        }
        if m.full_disks {
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
        // Rarer than the others: every copy of every chunk goes down with it.
        if m.power_cuts && self.impaired.iter().all(Option::is_none) && rand().is_multiple_of(6) {
            options.push(10);
        }
        if options.is_empty() {
            return;
        }
        match options[(rand() % options.len() as u64) as usize] {
            0 => {
                cluster.kill_server(pick);
                self.impaired[pick] = Some(Impairment::Dead { until: now + span });
                self.note(cluster, format!("crash cs{pick} for {span}ms"));
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
            }
            4 => {
                let chunks = cluster.servers[pick].disk.chunks();
                let (h, len) = chunks[(rand() % chunks.len() as u64) as usize];
                if len > 0 {
                    let off = (rand() % len as u64) as usize;
                    cluster.flip_bit(pick, h, off, (rand() % 8) as u8);
                    self.impaired[pick] = Some(Impairment::Corrupted);
                    self.note(
                        cluster,
                        format!("flip a bit of chunk {h} at {off} on cs{pick}"),
                    );
                }
            }
            5 => {
                let d = &cluster.servers[pick].disk;
                d.set_capacity(d.used());
                cluster.count_fault("full_disk", 1);
                self.note(cluster, format!("fill the disk of cs{pick}"));
            }
            6 => {
                let delay = Duration::from_millis(rand() % 200);
                // One time in three the master's log disk: its syncs then take long
                // enough that a master crash finds records in flight (a lost log tail).
                if rand().is_multiple_of(3) {
                    cluster.master_store.set_delay(delay);
                    self.note(cluster, format!("slow the master's log disk by {delay:?}"));
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
                    cluster.count_fault("wipe", 1);
                    self.impaired[i] = Some(Impairment::Dead { until: now + 3_000 });
                }
                self.wiped = true;
                self.note(cluster, format!("wipe the disks of {r} chunkservers"));
            }
            10 => {
                // Short: the point is the crash of every disk at once, not the outage.
                let down = 500 + (rand() % 3_000) as i64;
                for i in 0..n {
                    cluster.kill_server(i);
                    self.impaired[i] = Some(Impairment::Dead { until: now + down });
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
            _ => unreachable!(),
        }
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
            self.impaired[i] = None;
        }
        cluster.master_store.set_delay(Duration::ZERO);
        cluster.restart_master();
        cluster.reconnect(cluster.master_id);
        self.master_down_until = None;
        NetSim::current().update_config(|c| *c = madsim::net::Config::default());
        self.note(cluster, "heal".into());
    }
}
