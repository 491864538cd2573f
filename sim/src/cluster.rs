//! A simulated cluster: one master, chunkservers across racks, and client nodes, each a
//! madsim node with its own clock error. Disks and the master's store live outside the
//! nodes, so a killed node restarts onto what it had made durable.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim::net::NetSim;
use madsim::runtime::{Handle, NodeHandle};
use madsim::task::NodeId;
use madsim::time::Instant;
use tessera_core::auth::{Caller, ServerRole};
use tessera_core::chunkserver::ChunkserverConfig;
use tessera_core::client::{Client, ClientConfig};
use tessera_core::driver::{DriverError, chunkserver, group, master};
use tessera_core::error::FsError;
use tessera_core::master::MasterConfig;
use tessera_core::trace::Recorder;
use tessera_tracefile::{FileSink, Rotation};

use crate::check::{Shared, observer::SimObserver};
use crate::disk::SimDisk;
use crate::metastore::SimMetaStore;
use crate::net::{NetFaults, SimNet};
use crate::runtime::{Clock, Jump, SimRuntime};

const PORT: u16 = 7000;
/// The part a master replica's snapshot is sent and stored in, and a master alone's
/// checkpoint stored in: far below a checkpoint's size here, so the transfer of a
/// replica's state in parts runs under the network's faults, and every restart loads a
/// checkpoint from parts.
const SNAPSHOT_PART_BYTES: usize = 512;

/// The knobs a run is made of. The seed picks them (swarm testing): tiny chunks and short
/// leases are among the choices so rare paths get hit.
#[derive(Clone, Debug)]
pub struct Knobs {
    /// The master's chunk size at the start, which the files made before any fault have.
    pub chunk_size: u64,
    /// Non-zero: the chunk size a restarted master gives new files, every other restart
    /// (the others go back to `chunk_size`). Files keep the size they were made with, so
    /// the cluster then holds files of both sizes, as after an operator's change.
    pub restart_chunk_size: u64,
    pub replication: u32,
    pub lease: Duration,
    pub max_clock_skew: Duration,
    pub heartbeat: Duration,
    pub heartbeat_timeout: Duration,
    pub master_tick: Duration,
    pub gc_delay: Duration,
    pub checkpoint_every: u64,
    /// How long a master replica's checkpointer waits before building each checkpoint
    /// (`GroupOptions::checkpoint_delay`). Not drawn (a draw would change every later
    /// one for every seed): taken from `checkpoint_every` and `scrub_idle`.
    pub checkpoint_delay: Duration,
    pub rpc_timeout: Duration,
    pub disk_capacity: u64,
    /// Largest clock offset (±) and drift (± ppm) a node may get.
    pub clock_offset_ms: i64,
    pub clock_drift_ppm: i64,
    /// The farthest (±) a node's clock may be stepped from where its drift has it: the
    /// fault scheduler's clock jumps stay within it.
    pub clock_jump_ms: i64,
    pub scrub_interval: Duration,
    pub scrub_idle: Duration,
    pub clone_timeout: Duration,
    /// Record every node's trace here (`tessera_tracefile`), as `--trace-dir` does on
    /// real servers. Not picked: the runner's `--trace-dir` sets it.
    pub trace_dir: Option<std::path::PathBuf>,
}

impl Knobs {
    pub fn pick(rng: &mut impl FnMut() -> u64) -> Knobs {
        let pick =
            |rng: &mut dyn FnMut() -> u64, xs: &[u64]| xs[(rng() % xs.len() as u64) as usize];
        let lease = Duration::from_millis(pick(rng, &[2_000, 5_000, 10_000, 60_000]));
        let sizes = [64 << 10, 100 << 10, 256 << 10, 1 << 20];
        let mut k = Knobs {
            chunk_size: pick(rng, &sizes),
            restart_chunk_size: 0,
            replication: 3,
            lease,
            // Drift of up to 200 ppm over a 60 s lease is 12 ms; the bound leaves room.
            max_clock_skew: Duration::from_millis(pick(rng, &[50, 200, 1_000])),
            heartbeat: Duration::from_millis(pick(rng, &[200, 500, 1_000])),
            heartbeat_timeout: Duration::from_millis(pick(rng, &[2_000, 4_000, 8_000])),
            master_tick: Duration::from_millis(pick(rng, &[100, 250, 500])),
            gc_delay: Duration::from_millis(pick(rng, &[1_000, 10_000, 60_000])),
            checkpoint_every: pick(rng, &[5, 50, 1_000]),
            checkpoint_delay: Duration::ZERO,
            rpc_timeout: Duration::from_millis(pick(rng, &[500, 1_000, 3_000])),
            disk_capacity: 1 << 30,
            clock_offset_ms: pick(rng, &[0, 50, 5_000]) as i64,
            clock_drift_ppm: pick(rng, &[0, 50, 200]) as i64,
            clock_jump_ms: 0,
            scrub_interval: Duration::from_millis(pick(rng, &[500, 2_000, 10_000])),
            scrub_idle: Duration::from_millis(pick(rng, &[1_000, 10_000])),
            clone_timeout: Duration::from_millis(pick(rng, &[5_000, 30_000])),
            trace_dir: None,
        };
        k.checkpoint_delay = Duration::from_millis(match (k.checkpoint_every, k.scrub_idle) {
            (_, idle) if idle.as_millis() == 1_000 => 0,
            (5, _) => 300,
            (50, _) => 2_000,
            _ => 0,
        });
        // Picked last, so the knobs above stay what they were for every seed. Half the
        // seeds change the size across master restarts.
        if rng().is_multiple_of(2) {
            let others: Vec<u64> = sizes.into_iter().filter(|&s| s != k.chunk_size).collect();
            k.restart_chunk_size = pick(rng, &others);
        }
        k
    }

    /// Clock errors up to the bound the lease logic assumes (`max_clock_skew` over one
    /// lease), rather than far below it: each node's drift takes up to `share` of the
    /// bound over a lease (two nodes, the master and a primary, can err apart), and what
    /// is left is for jumps (each node's clock moves within ±`clock_jump_ms`, so by
    /// twice that within a lease; again two nodes).
    pub fn clocks_near_the_bound(&mut self, share: f64) {
        let skew = self.max_clock_skew.as_millis() as f64;
        let lease = self.lease.as_millis() as f64;
        self.clock_drift_ppm = ((share * skew / lease * 1e6) as i64).min(100_000);
        let drift_used = 2.0 * self.clock_drift_ppm as f64 * lease / 1e6;
        self.clock_jump_ms = (((skew - drift_used) / 4.0) as i64).max(0);
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// 1: one master. 3 or 5: a master group (`tessera_core::group`).
    pub masters: usize,
    pub chunkservers: usize,
    pub racks: usize,
    pub clients: usize,
}

pub struct ServerNode {
    pub id: NodeId,
    pub addr: String,
    pub disk: SimDisk,
    pub alive: bool,
}

/// A master replica of a group.
pub struct ReplicaNode {
    pub id: NodeId,
    pub addr: String,
    /// Its name in the checks (`Checks::serving`, violations).
    pub node: String,
    pub store: SimMetaStore,
    pub alive: bool,
    /// Its id in the group: a replica replaced (its disk wiped, `Cluster::rejoin_replica`)
    /// joins again under a new one.
    pub group_id: Arc<AtomicU64>,
    /// Start with `join` on an empty store (a replaced replica's first start).
    pub joining: Arc<AtomicBool>,
}

/// How much of a chunk a clone reads at once: less than a chunk, so a clone takes
/// several reads (and the clone race can rot a block after the first).
pub const CLONE_PIECE: u64 = 64 << 10;

pub struct Cluster {
    pub handle: Handle,
    pub start: Instant,
    pub knobs: Knobs,
    pub checks: Shared,
    pub master_id: NodeId,
    /// The master's address; with a group, every replica's, comma-separated.
    pub master_addr: String,
    /// The master group's replicas (empty: one master, `master_id`).
    pub replicas: Vec<ReplicaNode>,
    /// The group's members by id, as a joining replica is told (`--peers`).
    pub group_members: Arc<Mutex<BTreeMap<u64, String>>>,
    pub master_store: SimMetaStore,
    pub master_alive: bool,
    /// The chunk size the master node starts with (read at each restart).
    pub master_chunk_size: Arc<AtomicU64>,
    pub servers: Vec<ServerNode>,
    pub clients: Vec<(NodeHandle, Clock)>,
    /// How far each node's clock is stepped, in the order of [`Cluster::node_ids`].
    pub jumps: Vec<Jump>,
    /// Duplicated requests, and long-held requests and replies, shared by every node's
    /// transport.
    pub net: NetFaults,
    /// A node that belongs to no cluster: it sends forged messages (see `rogue`).
    pub rogue: NodeHandle,
    /// Chunk locations the rogue was given (with its capabilities), and when (true ms):
    /// replayed once long expired (`rogue_capabilities`).
    pub rogue_seen: Arc<Mutex<std::collections::VecDeque<(i64, tessera_core::pb::ChunkLocation)>>>,
    /// Racks in the cluster; client `i` sits in rack `i % racks`, as chunkservers do.
    pub racks: usize,
}

/// A node's trace recorder, when the run records traces. The files are real ones: they
/// take no part in the simulated world.
fn recorder(
    dir: &Option<std::path::PathBuf>,
    role: &str,
    addr: &str,
) -> Option<Recorder<FileSink>> {
    let dir = dir.as_ref()?;
    // Every run of the node kept: a simulated node restarts far more often than a real one.
    let rotation = Rotation {
        files: 100_000,
        ..Rotation::default()
    };
    let sink = FileSink::open(dir, role, addr, rotation)
        .unwrap_or_else(|e| panic!("cannot record the trace of {addr}: {e}"));
    Some(Recorder::new(sink))
}

/// One message the rogue forges (`Cluster::rogue_orders`).
struct Forgery {
    /// Its fault kind, counted when it was answered.
    kind: &'static str,
    what: String,
    to: String,
    role: ServerRole,
    body: Vec<u8>,
}

/// The third octet of chunkservers' addresses (masters' is 0, clients' 2).
pub const CHUNKSERVER_NET: u8 = 1;

fn ip(a: u8, b: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, a, b))
}

fn clock(knobs: &Knobs) -> Clock {
    let r = |span: i64| {
        if span == 0 {
            0
        } else {
            (madsim::rand::random::<u64>() % (2 * span as u64 + 1)) as i64 - span
        }
    };
    Clock {
        offset_ms: r(knobs.clock_offset_ms),
        drift_ppm: r(knobs.clock_drift_ppm),
    }
}

/// Starts a master group of `n` replicas, at 10.0.0.1 and up.
fn start_group(
    handle: &Handle,
    start: Instant,
    knobs: &Knobs,
    checks: &Shared,
    net: &NetFaults,
    jumps: Vec<Jump>,
    book: &Arc<Mutex<BTreeMap<u64, String>>>,
) -> Vec<ReplicaNode> {
    let n = jumps.len();
    let addrs: Vec<String> = (0..n)
        .map(|i| format!("{}:{PORT}", ip(0, i as u8 + 1)))
        .collect();
    *book.lock().expect("members") = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (i as u64 + 1, a.clone()))
        .collect();
    let mut out = Vec::new();
    for (i, (addr, jump)) in addrs.iter().zip(jumps).enumerate() {
        let store = SimMetaStore::default();
        let c = clock(knobs);
        let node = format!("master{}", i + 1);
        let group_id = Arc::new(AtomicU64::new(i as u64 + 1));
        let joining = Arc::new(AtomicBool::new(false));
        let (store2, checks, knobs, net, book, node2, group_id2, joining2, addr2) = (
            store.clone(),
            checks.clone(),
            knobs.clone(),
            net.clone(),
            book.clone(),
            node.clone(),
            group_id.clone(),
            joining.clone(),
            addr.clone(),
        );
        let id = handle
            .create_node()
            .name(node.clone())
            .ip(ip(0, i as u8 + 1))
            .init(move || {
                let rt = SimRuntime::with_jump(start, c, jump.clone());
                let gid = group_id2.load(Ordering::Relaxed);
                let mut members = book.lock().expect("members").clone();
                members.insert(gid, addr2.clone());
                let mut group = tessera_core::group::GroupConfig::new(gid, members);
                group.seed = madsim::rand::random();
                group.snapshot_every = knobs.checkpoint_every;
                // Small, so that every snapshot a replica sends goes in parts.
                group.snapshot_part_bytes = SNAPSHOT_PART_BYTES;
                let opts = group::GroupOptions {
                    group,
                    master: MasterConfig {
                        chunk_size: knobs.chunk_size,
                        default_replication: knobs.replication as u8,
                        lease_duration: knobs.lease,
                        max_clock_skew: knobs.max_clock_skew,
                        heartbeat_timeout: knobs.heartbeat_timeout,
                        gc_delay: knobs.gc_delay,
                        clone_timeout: knobs.clone_timeout,
                        rng_seed: madsim::rand::random(),
                        capability_secret: madsim::rand::random(),
                        call_timeout: knobs.rpc_timeout,
                        late_delivery: crate::net::MAX_LATE,
                        root: crate::root_perms(),
                        ..MasterConfig::default()
                    },
                    tick: knobs.master_tick,
                    call_timeout: knobs.rpc_timeout,
                    // The group forms on first start; a replica that restarts has kept
                    // at least the formatting (it is synced before anything else). A
                    // replaced one joins on its new disk's first start.
                    bootstrap: store2.is_empty() && !joining2.load(Ordering::Relaxed),
                    join: store2.is_empty() && joining2.load(Ordering::Relaxed),
                    checkpoint_delay: knobs.checkpoint_delay,
                };
                let obs = (
                    SimObserver {
                        node: node2.clone(),
                        clock: c,
                        jump: rt.jump.clone(),
                        start,
                        checks: checks.clone(),
                        store: None,
                    },
                    recorder(&knobs.trace_dir, "master", &addr2),
                );
                let (store, net) = (
                    store2.clone(),
                    SimNet::late_to_chunkservers(
                        rt.clone(),
                        net.clone(),
                        "late_order",
                        Caller::Master { replica: gid },
                    ),
                );
                let checks = checks.clone();
                async move {
                    if let Err(e) = group::run(rt, net, store, opts, obs).await {
                        let t = start.elapsed().as_millis() as i64;
                        checks
                            .lock()
                            .expect("checks")
                            .violation(t, format!("master replica stopped: {e}"));
                    }
                }
            })
            .build()
            .id();
        out.push(ReplicaNode {
            id,
            addr: addr.clone(),
            node,
            store,
            alive: true,
            group_id,
            joining,
        });
    }
    out
}

impl Cluster {
    /// The replica whose master serves now, if one does (as its last step showed); of
    /// two (a deposed leader not yet stepped down), the one of the later term.
    /// The group's leader, waited for up to a minute (healed, a group elects one soon).
    pub async fn leader_soon(&self) -> Option<usize> {
        let give_up = madsim::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(l) = self.leader() {
                return Some(l);
            }
            if madsim::time::Instant::now() >= give_up {
                return None;
            }
            madsim::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn leader(&self) -> Option<usize> {
        let c = self.checks.lock().expect("checks");
        let serving = |i: usize| {
            let r = &self.replicas[i];
            r.alive && c.serving.get(&r.node).copied().unwrap_or(false)
        };
        let mut terms: Vec<(&u64, &String)> = c.leaders.iter().collect();
        terms.sort_unstable_by(|a, b| b.0.cmp(a.0));
        terms
            .into_iter()
            .filter_map(|(_, node)| self.replicas.iter().position(|r| &r.node == node))
            .find(|&i| serving(i))
            .or_else(|| (0..self.replicas.len()).find(|&i| serving(i)))
    }

    /// Kills master replica `i`; its store keeps some prefix of its unsynced batches.
    pub fn kill_replica(&mut self, i: usize) {
        let leading = self.leader() == Some(i);
        let r = &mut self.replicas[i];
        if !r.alive {
            return;
        }
        self.handle.kill(r.id);
        let lost = r.store.crash(|n| {
            if n == 0 {
                0
            } else {
                (madsim::rand::random::<u64>() % (n as u64 + 1)) as usize
            }
        });
        r.alive = false;
        let mut c = self.checks.lock().expect("checks");
        c.fault(
            if leading {
                "leader_crash"
            } else {
                "replica_crash"
            },
            1,
        );
        c.fault("log_tail_loss", u64::from(lost > 0));
        c.versions.master_crashed(&r.node);
        c.serving.insert(r.node.clone(), false);
    }

    /// Replica `i`, dead and removed from the group, comes back on a new disk under
    /// group id `new` and joins (`--join`); an admin then adds it.
    pub fn rejoin_replica(&mut self, i: usize, new: u64) {
        let r = &mut self.replicas[i];
        assert!(!r.alive, "master{} is replaced while it runs", i + 1);
        r.store.wipe();
        r.group_id.store(new, Ordering::Relaxed);
        r.joining.store(true, Ordering::Relaxed);
        {
            let mut book = self.group_members.lock().expect("members");
            book.retain(|_, a| *a != r.addr);
            book.insert(new, r.addr.clone());
        }
        self.handle.restart(r.id);
        r.alive = true;
    }

    pub fn restart_replica(&mut self, i: usize) {
        let r = &mut self.replicas[i];
        if !r.alive {
            self.handle.restart(r.id);
            r.alive = true;
        }
    }

    /// Cuts master replica `i` off from the other replicas and from chunkservers
    /// `servers` (both ways), leaving it reachable by the other chunkservers and by
    /// clients.
    pub fn cut_replica(&self, i: usize, servers: &[usize]) {
        let net = NetSim::current();
        let me = self.replicas[i].id;
        let others = self.replicas.iter().enumerate().filter(|&(j, _)| j != i);
        for id in others
            .map(|(_, o)| o.id)
            .chain(servers.iter().map(|&s| self.servers[s].id))
        {
            net.clog_link(me, id);
            net.clog_link(id, me);
        }
    }

    /// Undoes `cut_replica`, but for the links to replicas in `still_cut`, which stay
    /// cut off.
    pub fn mend_replica(&self, i: usize, servers: &[usize], still_cut: &[usize]) {
        let net = NetSim::current();
        let me = self.replicas[i].id;
        let others = self
            .replicas
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i && !still_cut.contains(&j));
        for id in others
            .map(|(_, o)| o.id)
            .chain(servers.iter().map(|&s| self.servers[s].id))
        {
            net.unclog_link(me, id);
            net.unclog_link(id, me);
        }
    }

    /// Cuts client `i` off from master replicas `replicas` (both ways).
    pub fn cut_client(&self, i: usize, replicas: &[usize]) {
        let net = NetSim::current();
        let me = self.clients[i].0.id();
        for &r in replicas {
            net.clog_link(me, self.replicas[r].id);
            net.clog_link(self.replicas[r].id, me);
        }
    }

    /// Undoes `cut_client`.
    pub fn mend_client(&self, i: usize, replicas: &[usize]) {
        let net = NetSim::current();
        let me = self.clients[i].0.id();
        for &r in replicas {
            net.unclog_link(me, self.replicas[r].id);
            net.unclog_link(self.replicas[r].id, me);
        }
    }

    /// Builds and starts the cluster. Call inside the madsim runtime.
    pub fn start(shape: Shape, knobs: Knobs, checks: Shared) -> Cluster {
        let handle = Handle::current();
        let start = Instant::now();
        let master_addr = format!("{}:{PORT}", ip(0, 1));
        let master_store = SimMetaStore::default();
        let master_clock = clock(&knobs);
        let net = NetFaults::new(checks.clone());
        // A group's replicas after the clients, but the first, which is `master_id`.
        let extra = shape.masters.saturating_sub(1);
        let jumps: Vec<Jump> = (0..1 + shape.chunkservers + shape.clients + extra)
            .map(|_| Jump::default())
            .collect();
        let group_members = Arc::new(Mutex::new(BTreeMap::new()));
        let replicas = if shape.masters > 1 {
            let mine = std::iter::once(jumps[0].clone())
                .chain(
                    jumps[1 + shape.chunkservers + shape.clients..]
                        .iter()
                        .cloned(),
                )
                .collect();
            start_group(&handle, start, &knobs, &checks, &net, mine, &group_members)
        } else {
            Vec::new()
        };
        let master_jump = jumps[0].clone();
        let net_m = net.clone();
        let master_chunk_size = Arc::new(AtomicU64::new(knobs.chunk_size));
        let master_id = if let Some(r) = replicas.first() {
            r.id
        } else {
            let (store, checks, knobs, addr, chunk_size) = (
                master_store.clone(),
                checks.clone(),
                knobs.clone(),
                master_addr.clone(),
                master_chunk_size.clone(),
            );
            handle
                .create_node()
                .name("master")
                .ip(ip(0, 1))
                .init(move || {
                    let rt = SimRuntime::with_jump(start, master_clock, master_jump.clone());
                    let opts = master::MasterOptions {
                        config: MasterConfig {
                            chunk_size: chunk_size.load(Ordering::Relaxed),
                            default_replication: knobs.replication as u8,
                            lease_duration: knobs.lease,
                            max_clock_skew: knobs.max_clock_skew,
                            heartbeat_timeout: knobs.heartbeat_timeout,
                            gc_delay: knobs.gc_delay,
                            checkpoint_every: knobs.checkpoint_every,
                            clone_timeout: knobs.clone_timeout,
                            rng_seed: madsim::rand::random(),
                            capability_secret: madsim::rand::random(),
                            call_timeout: knobs.rpc_timeout,
                            late_delivery: crate::net::MAX_LATE,
                            root: crate::root_perms(),
                            ..MasterConfig::default()
                        },
                        listen: addr.clone(),
                        tick: knobs.master_tick,
                        call_timeout: knobs.rpc_timeout,
                        checkpoint_delay: knobs.checkpoint_delay,
                        checkpoint_part_bytes: SNAPSHOT_PART_BYTES,
                    };
                    let obs = (
                        SimObserver {
                            node: "master".into(),
                            clock: master_clock,
                            jump: rt.jump.clone(),
                            start,
                            checks: checks.clone(),
                            store: Some(store.clone()),
                        },
                        recorder(&knobs.trace_dir, "master", &addr),
                    );
                    let (store, net) = (
                        store.clone(),
                        SimNet::late_to_chunkservers(
                            rt.clone(),
                            net_m.clone(),
                            "late_order",
                            Caller::Master { replica: 1 },
                        ),
                    );
                    let checks = checks.clone();
                    async move {
                        if let Err(e) = master::run(rt, net, store, opts, obs).await {
                            let t = start.elapsed().as_millis() as i64;
                            let mut c = checks.lock().expect("checks");
                            match (&c.log_damage, &e) {
                                // The refusal a damaged value makes; any other (a gap
                                // in the log, say) is a bug even while a value is damaged.
                                (Some(d), DriverError::Recovery(m))
                                    if m.contains("the master's log is damaged") =>
                                {
                                    tracing::info!(t, damage = %d, "master refused: {m}");
                                    c.master_refusals += 1;
                                }
                                _ => c.violation(t, format!("master stopped: {e}")),
                            }
                        }
                    }
                })
                .build()
                .id()
        };
        // Chunkservers and clients are given every replica's address.
        let master_addr = if replicas.is_empty() {
            master_addr
        } else {
            replicas
                .iter()
                .map(|r| r.addr.clone())
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut servers = Vec::new();
        for i in 0..shape.chunkservers {
            let addr = format!("{}:{PORT}", ip(1, i as u8 + 1));
            let disk = SimDisk::new(knobs.disk_capacity);
            disk.report_to(checks.clone(), addr.clone());
            let c = clock(&knobs);
            let (jump, net_c) = (jumps[1 + i].clone(), net.clone());
            let (d, checks2, knobs2, addr2, maddr) = (
                disk.clone(),
                checks.clone(),
                knobs.clone(),
                addr.clone(),
                master_addr.clone(),
            );
            let rack = format!("rack{}", i % shape.racks.max(1));
            let id = handle
                .create_node()
                .name(format!("cs{i}"))
                .ip(ip(1, i as u8 + 1))
                .init(move || {
                    let rt = SimRuntime::with_jump(start, c, jump.clone());
                    let opts = chunkserver::ChunkserverOptions {
                        config: ChunkserverConfig {
                            address: addr2.clone(),
                            rack: rack.clone(),
                            capacity_bytes: knobs2.disk_capacity,
                            clone_piece: CLONE_PIECE,
                            scrub_interval: knobs2.scrub_interval,
                            scrub_idle: knobs2.scrub_idle,
                            // Shorter than a forward's deadline, so a held mutation is
                            // applied before its primary gives up on it.
                            apply_hold: knobs2.rpc_timeout / 2,
                            // Half the servers read back recent writes from memory, the
                            // other half always from their disks, so runs take both paths.
                            read_cache_bytes: if i.is_multiple_of(2) {
                                4 * knobs2.chunk_size
                            } else {
                                0
                            },
                            // Drawn at each start, as the binary draws it.
                            boot: madsim::rand::random(),
                            ..ChunkserverConfig::default()
                        },
                        master: maddr.clone(),
                        heartbeat_interval: knobs2.heartbeat,
                        call_timeout: knobs2.rpc_timeout,
                    };
                    let obs = (
                        SimObserver {
                            node: addr2.clone(),
                            clock: c,
                            jump: rt.jump.clone(),
                            start,
                            checks: checks2.clone(),
                            store: None,
                        },
                        recorder(&knobs2.trace_dir, "chunkserver", &addr2),
                    );
                    let (d, net) = (
                        d.clone(),
                        SimNet::late_to_chunkservers(
                            rt.clone(),
                            net_c.clone(),
                            "late_forward",
                            Caller::Chunkserver {
                                name: format!("cs{i}"),
                            },
                        ),
                    );
                    let checks = checks2.clone();
                    async move {
                        if let Err(e) = chunkserver::run(rt, net, d, opts, obs).await {
                            let t = start.elapsed().as_millis() as i64;
                            checks
                                .lock()
                                .expect("checks")
                                .violation(t, format!("chunkserver stopped: {e}"));
                        }
                    }
                })
                .build()
                .id();
            servers.push(ServerNode {
                id,
                addr,
                disk,
                alive: true,
            });
        }
        let clients = (0..shape.clients)
            .map(|i| {
                let node = handle
                    .create_node()
                    .name(format!("client{i}"))
                    .ip(ip(2, i as u8 + 1))
                    .build();
                (node, clock(&knobs))
            })
            .collect();
        let rogue = handle.create_node().name("rogue").ip(ip(3, 1)).build();
        Cluster {
            jumps,
            net,
            rogue,
            rogue_seen: Default::default(),
            racks: shape.racks.max(1),
            handle,
            start,
            knobs,
            checks,
            master_id,
            master_addr,
            replicas,
            group_members,
            master_store,
            master_alive: true,
            master_chunk_size,
            servers,
            clients,
        }
    }

    pub fn true_ms(&self) -> i64 {
        self.start.elapsed().as_millis() as i64
    }

    /// A client library handle for client node `i`; use it from a task on that node.
    pub fn client(&self, i: usize) -> Client<SimRuntime, SimNet> {
        self.client_with_ttl(i, Duration::from_secs(5))
    }

    /// A client that caches chunk locations for `ttl`. Readers of files other clients
    /// write use 0: a cached location may name a replica that has since gone stale, and
    /// GFS's bound on that window is the cache's timeout.
    pub fn client_with_ttl(&self, i: usize, ttl: Duration) -> Client<SimRuntime, SimNet> {
        self.client_with(i, ttl, None)
    }

    /// As [`Cluster::client_with_ttl`], retrying each operation for `retry_for` when
    /// given (in place of the workload's).
    pub fn client_with(
        &self,
        i: usize,
        ttl: Duration,
        retry_for: Option<Duration>,
    ) -> Client<SimRuntime, SimNet> {
        let who = Caller::Client {
            user: format!("client{i}"),
            groups: vec![crate::USERS.into()],
        };
        self.client_as(i, ttl, retry_for, who)
    }

    /// Client `i`'s node, with an administrator's certificate: member changes and
    /// reports are an admin's to ask for.
    pub fn admin(&self, i: usize) -> Client<SimRuntime, SimNet> {
        let who = Caller::Admin {
            name: "operator".into(),
        };
        self.client_as(i, Duration::from_secs(5), None, who)
    }

    fn client_as(
        &self,
        i: usize,
        ttl: Duration,
        retry_for: Option<Duration>,
        who: Caller,
    ) -> Client<SimRuntime, SimNet> {
        let jump = self.jumps[1 + self.servers.len() + i].clone();
        let rt = SimRuntime::with_jump(self.start, self.clients[i].1, jump);
        let mut cfg = ClientConfig::new(self.master_addr.clone());
        cfg.rpc_timeout = self.knobs.rpc_timeout;
        // About as long as six attempts used to take: long enough to ride out most
        // faults, short enough that clients also see failures and must judge them.
        cfg.retry_for = retry_for.unwrap_or(self.knobs.rpc_timeout * 2 + Duration::from_secs(3));
        cfg.backoff = Duration::from_millis(100);
        cfg.location_ttl = ttl;
        // The workload's checks judge reads as linearizable: a shadow master's answer
        // is not, and is asked for (and judged as the stale read it is) on purpose only
        // (`workload::ns_shadow_read`).
        cfg.shadow_reads = false;
        cfg.rack = format!("rack{}", i % self.racks);
        cfg.umask = crate::UMASK;
        // Small pieces, so pushes of the simulator's small writes are pipelined too.
        cfg.push_piece = 16 << 10;
        Client::new(
            rt.clone(),
            SimNet::late_to_chunkservers(rt, self.net.clone(), "late_request", who),
            cfg,
        )
    }

    /// Kills chunkserver `i` (a crash: unsynced writes lost, the last one maybe torn).
    pub fn kill_server(&mut self, i: usize) {
        self.crash_server(i, false);
    }

    /// Kills chunkserver `i` while a write is in flight on its disk: the write is torn
    /// (some prefix of it lands, maybe none, maybe all), not left whole half the time.
    pub fn kill_server_mid_write(&mut self, i: usize) {
        self.crash_server(i, true);
    }

    fn crash_server(&mut self, i: usize, tear: bool) {
        let s = &mut self.servers[i];
        if !s.alive {
            return;
        }
        self.handle.kill(s.id);
        let damage = s.disk.crash(
            || {
                let r: u64 = madsim::rand::random();
                (tear || r.is_multiple_of(2)).then(|| (r >> 8) as f64 / (1u64 << 56) as f64)
            },
            || madsim::rand::random::<u64>().is_multiple_of(2),
        );
        s.alive = false;
        let mut c = self.checks.lock().expect("checks");
        c.fault("crash", 1);
        c.fault("torn_write", damage.torn);
        c.fault("lost_write", damage.lost);
        c.fault("stale_meta", damage.stale_meta);
        c.leases.forget(&s.addr);
        c.versions.server_crashed(&s.addr);
        // Its request ids start again from 1: an order in flight is never answered.
        c.mends_asked.retain(|(n, _), _| *n != s.addr);
    }

    pub fn restart_server(&mut self, i: usize) {
        let s = &mut self.servers[i];
        if s.alive {
            return;
        }
        self.handle.restart(s.id);
        s.alive = true;
    }

    /// Loses chunkserver `i`'s copy of `h` from its disk (while it is down: it comes back
    /// under its old identity without it), and notes the copy as damaged, as a corrupted
    /// one is (it spends one of the chunk's R−1 budget). Returns false if it had none.
    pub fn lose_chunk(&self, i: usize, h: u64) -> bool {
        let s = &self.servers[i];
        let lost = s.disk.lose_chunk(h);
        if lost {
            let mut c = self.checks.lock().expect("checks");
            c.fault("lost_chunk", 1);
            c.corrupted.insert((s.addr.clone(), h));
        }
        lost
    }

    /// Flips one bit of chunkserver `i`'s copy of `h`, and notes that this copy may now
    /// fail its checksums. Returns false if there is no such byte.
    pub fn flip_bit(&self, i: usize, h: u64, offset: usize, bit: u8) -> bool {
        let s = &self.servers[i];
        let flipped = s.disk.flip_bit(h, offset, bit);
        if flipped {
            let mut c = self.checks.lock().expect("checks");
            c.fault("bit_flip", 1);
            c.corrupted.insert((s.addr.clone(), h));
        }
        flipped
    }

    /// Flips a bit of one stored checksum of chunk `h` on chunkserver `i` (seen when the
    /// server next loads its metadata: at restart).
    pub fn flip_checksum(&self, i: usize, h: u64, pick: u64) -> bool {
        let s = &self.servers[i];
        let flipped = s.disk.flip_checksum(h, pick);
        if flipped {
            let mut c = self.checks.lock().expect("checks");
            c.fault("meta_flip", 1);
            c.corrupted.insert((s.addr.clone(), h));
        }
        flipped
    }

    /// A rogue node's forged message: a heartbeat to the master that claims a chunk of
    /// chunkserver `i` at a version never granted (from the rogue's own address or one
    /// of the cluster's, with no cluster id or another's), or an order to chunkserver `i`
    /// to create a chunk another server holds, at such a version. None may be believed:
    /// the master adopts versions only up to the highest it reserved, and chunkservers
    /// take orders only from their own cluster's master. Counted as `rogue` when it was
    /// delivered.
    ///
    /// Each also comes with a forged read of the chunk from chunkserver `i` at a version
    /// never granted, and a forged mutation of it at version 0, which no chunk ever has:
    /// a chunkserver serves and applies only at the version it holds (a read at an
    /// older one too, never a newer), so an Ok answer to either is a violation. Counted
    /// as `rogue_chunk` when answered.
    pub fn rogue(&self, i: usize, h: u64, other: usize) {
        use prost::Message;
        use tessera_core::pb;
        use tessera_core::runtime::{Runtime, Transport};
        let r = |n: u64| madsim::rand::random::<u64>() % n;
        let forged_version = 1_000_000 + r(1000);
        let cluster_id = if r(2) == 0 { 0 } else { madsim::rand::random() };
        let (to, to_server, body) = if r(2) == 0 {
            let address = if r(2) == 0 {
                format!("{}:{PORT}", ip(3, 1))
            } else {
                self.servers[i].addr.clone()
            };
            let req = pb::MasterRequest {
                req: Some(pb::master_request::Req::Heartbeat(pb::HeartbeatRequest {
                    address,
                    rack: "rack0".into(),
                    capacity_bytes: 1 << 30,
                    used_bytes: 0,
                    chunks: vec![pb::ChunkReport {
                        handle: h,
                        version: forged_version,
                        length: 0,
                    }],
                    lease_extensions: vec![],
                    server_id: madsim::rand::random(),
                    cluster_id,
                    changing: vec![],
                    copy: false,
                    boot: 0,
                    capability_keys: vec![],
                    // Heartbeats are not authenticated: a forged term could end a new
                    // leader's quiet period for the server it names (a known limit).
                    epoch: 0,
                    report_seq: madsim::rand::random(),
                })),
                ..Default::default()
            };
            (
                self.master_addr.clone(),
                ServerRole::Master,
                req.encode_to_vec(),
            )
        } else {
            let req = pb::ChunkRequest {
                req: Some(pb::chunk_request::Req::SetVersion(pb::SetVersionRequest {
                    handle: h,
                    version: forged_version,
                    create: true,
                    lease_ms: 0,
                    valid_ms: 60_000,
                    chunk_size: 0,
                    cluster_id,
                    epoch: 0,
                    ..Default::default()
                })),
            };
            (
                self.servers[other].addr.clone(),
                ServerRole::Chunkserver,
                req.encode_to_vec(),
            )
        };
        let (rt, net) = self.rogue_net(&[]);
        let checks = self.checks.clone();
        // Above every forged grant's version: a server not yet in a cluster (a wiped
        // one, back) takes a forged grant, and holds that version until told otherwise.
        let never_granted = forged_version + 1_000_000;
        let read = pb::ChunkRequest {
            req: Some(pb::chunk_request::Req::Read(pb::ReadChunkRequest {
                handle: h,
                version: never_granted,
                offset: 0,
                length: 1 << 20,
                capability: None,
            })),
        };
        let apply = pb::ChunkRequest {
            req: Some(pb::chunk_request::Req::Apply(pb::ApplyMutationRequest {
                handle: h,
                version: 0,
                // Past the serials a primary gives a version in a run (they start at 1
                // with each version), and within the 4096 a secondary holds a mutation
                // for its predecessors, then applies it: so only the version refuses it.
                serial: 4000 + r(90),
                offset: 0,
                data: bytes::Bytes::from_static(b"forged bytes no client wrote"),
                data_id: 0,
                capability: None,
            })),
        };
        let server = self.servers[i].addr.clone();
        let forged = [
            (
                format!("a read at never-granted version {never_granted}"),
                read,
            ),
            ("a mutation at version 0".to_string(), apply),
        ];
        let informed = self.rogue_orders(i, h, other);
        let with_capabilities = self.rogue_capabilities();
        self.rogue.spawn(async move {
            let deadline = rt.now() + std::time::Duration::from_secs(2);
            if net
                .call(&to, to_server, body.into(), deadline)
                .await
                .is_ok()
            {
                checks.lock().expect("checks").fault("rogue", 1);
            }
            for (what, req) in forged {
                // Longer than a held mutation waits for its predecessors.
                let deadline = rt.now() + std::time::Duration::from_secs(5);
                let Ok(answer) = net
                    .call(
                        &server,
                        ServerRole::Chunkserver,
                        req.encode_to_vec().into(),
                        deadline,
                    )
                    .await
                else {
                    continue;
                };
                let mut c = checks.lock().expect("checks");
                c.fault("rogue_chunk", 1);
                match pb::ChunkResponse::decode(answer) {
                    Ok(resp) if resp.error.is_none() => c.violation(
                        rt.true_ms(),
                        format!("{server} answered Ok to a forged request for chunk {h}: {what}"),
                    ),
                    _ => {}
                }
            }
            for f in informed {
                let deadline = rt.now() + std::time::Duration::from_secs(5);
                let Ok(answer) = net.call(&f.to, f.role, f.body.into(), deadline).await else {
                    continue;
                };
                let ok = match f.role {
                    ServerRole::Master => {
                        pb::MasterResponse::decode(answer).is_ok_and(|r| r.error.is_none())
                    }
                    ServerRole::Chunkserver => {
                        pb::ChunkResponse::decode(answer).is_ok_and(|r| r.error.is_none())
                    }
                };
                let mut c = checks.lock().expect("checks");
                c.fault(f.kind, 1);
                if ok {
                    c.violation(
                        rt.true_ms(),
                        format!("{} answered Ok to a client's forgery of {}", f.to, f.what),
                    );
                }
            }
            with_capabilities.await;
        });
    }

    /// What the rogue forges knowing everything public, under its client certificate:
    /// every message kind only a master, a chunkserver or an admin may send, about
    /// chunk `h` of chunkserver `i` as it stands (its current version, the cluster id,
    /// the server's id and address, the master term it follows: what `admin fsck
    /// --list`, `admin report` and probing tell), so that nothing but the sender's role
    /// refuses it. Counted per kind (`rogue_role_*`) when answered; an Ok answer is a
    /// violation.
    fn rogue_orders(&self, i: usize, h: u64, other: usize) -> Vec<Forgery> {
        use prost::Message;
        use tessera_core::chunkserver::IDENTITY_HANDLE;
        use tessera_core::pb::{self, chunk_request::Req as CReq, master_request::Req as MReq};
        let r = |n: u64| madsim::rand::random::<u64>() % n.max(1);
        let s = &self.servers[i];
        let (Some(id), Some(meta)) = (s.disk.meta(IDENTITY_HANDLE), s.disk.meta(h)) else {
            return vec![];
        };
        let (cluster_id, epoch, version) = (id.cluster_id, id.master_epoch, meta.version);
        let source = self.servers[other].addr.clone();
        let chunk = |kind, what: String, req| Forgery {
            kind,
            what,
            to: s.addr.clone(),
            role: ServerRole::Chunkserver,
            body: pb::ChunkRequest { req: Some(req) }.encode_to_vec(),
        };
        let masters: Vec<&str> = self.master_addr.split(',').collect();
        let master = masters[r(masters.len() as u64) as usize].to_string();
        let to_master = |kind, what: String, req| Forgery {
            kind,
            what,
            to: master.clone(),
            role: ServerRole::Master,
            body: pb::MasterRequest {
                req: Some(req),
                ..Default::default()
            }
            .encode_to_vec(),
        };
        let members: Vec<u64> = self
            .group_members
            .lock()
            .expect("members")
            .keys()
            .copied()
            .collect();
        let member = members
            .get(r(members.len() as u64) as usize)
            .copied()
            .unwrap_or(1);
        vec![
            chunk(
                "rogue_role_apply",
                format!("a primary's mutation of chunk {h} at its version {version}"),
                CReq::Apply(pb::ApplyMutationRequest {
                    handle: h,
                    version,
                    serial: 1 + r(4000),
                    offset: 0,
                    data: bytes::Bytes::from_static(b"forged bytes no client wrote"),
                    data_id: 0,
                    capability: None,
                }),
            ),
            chunk(
                "rogue_role_set_version",
                format!("the master's grant of chunk {h} at version {}", version + 1),
                CReq::SetVersion(pb::SetVersionRequest {
                    handle: h,
                    version: version + 1 + r(1_000_000_000),
                    create: false,
                    lease_ms: 60_000,
                    valid_ms: 60_000,
                    cluster_id,
                    epoch,
                    ..Default::default()
                }),
            ),
            chunk(
                "rogue_role_revoke",
                format!("the master's revocation of chunk {h}'s lease at version {version}"),
                CReq::RevokeLease(pb::RevokeLeaseRequest {
                    handle: h,
                    cluster_id,
                    epoch,
                    version,
                }),
            ),
            chunk(
                "rogue_role_clone",
                format!("the master's order to clone chunk {h} from {source}"),
                CReq::Clone(pb::CloneChunkRequest {
                    handle: h,
                    version,
                    source: source.clone(),
                    cluster_id,
                    epoch,
                    source_capability: None,
                }),
            ),
            chunk(
                "rogue_role_mend",
                format!("the master's order to mend chunk {h} from {source}"),
                CReq::Mend(pb::MendChunkRequest {
                    handle: h,
                    version,
                    sources: vec![pb::MendSource {
                        address: source.clone(),
                        version,
                        capability: None,
                    }],
                    cluster_id,
                    epoch,
                }),
            ),
            to_master(
                "rogue_role_heartbeat",
                format!(
                    "{}'s heartbeat, as server {}, reporting no chunks",
                    s.addr, id.server_id
                ),
                MReq::Heartbeat(pb::HeartbeatRequest {
                    address: s.addr.clone(),
                    rack: "rack0".into(),
                    capacity_bytes: 1 << 30,
                    server_id: id.server_id,
                    cluster_id,
                    epoch,
                    ..Default::default()
                }),
            ),
            to_master(
                "rogue_role_corrupt",
                format!("{}'s report that its copy of chunk {h} is corrupt", s.addr),
                MReq::ReportCorrupt(pb::ReportCorruptRequest {
                    address: s.addr.clone(),
                    handle: h,
                    by_scrubber: true,
                    server_id: id.server_id,
                    cluster_id,
                    version,
                }),
            ),
            to_master(
                "rogue_role_raft",
                format!("replica {member}'s raft append at term {}", epoch + 1),
                MReq::Raft(pb::RaftMessage {
                    // An append (raft-rs's MsgAppend): a newer term deposes the leader.
                    msg_type: 3,
                    to: member % members.len().max(1) as u64 + 1,
                    from: member,
                    term: epoch + 1,
                    ..Default::default()
                }),
            ),
            to_master(
                "rogue_role_members",
                "an admin's addition of a learner replica".into(),
                MReq::ChangeMembers(pb::ChangeMembersRequest {
                    add: 1000 + r(1000),
                    address: format!("{}:{PORT}", ip(3, 1)),
                    remove: 0,
                }),
            ),
            to_master(
                "rogue_role_fsck",
                "an admin's fsck".into(),
                MReq::Fsck(pb::FsckRequest {
                    path: "/".into(),
                    ..Default::default()
                }),
            ),
        ]
    }

    /// The rogue's clock and network. It holds a valid client certificate: what it
    /// forges beyond what a client may send must be refused for its role, not merely
    /// for its content. Its certificate puts it in `groups`: in none, it may write no
    /// client's file (the permission attacks); in the clients' group, every one, and
    /// only checks of what it sends stand in its way.
    fn rogue_net(&self, groups: &[&str]) -> (SimRuntime, SimNet) {
        let rt = SimRuntime::new(self.start, Clock::default());
        let net = SimNet::new(
            rt.clone(),
            self.net.clone(),
            Caller::Client {
                user: "rogue".into(),
                groups: groups.iter().map(|g| g.to_string()).collect(),
            },
        );
        (rt, net)
    }

    /// The rogue as a client that learns what any client may (it lists the namespace
    /// and asks for a file's chunk locations, which come with capabilities signed for
    /// it, to read) and then tries, on one copy of one chunk at its current version,
    /// what those capabilities do not allow: a read with no capability, with the one
    /// signed for another server, with one whose subject it altered to another client's,
    /// with one it was given long ago (expired: replayed from `rogue_seen`), a write and
    /// a pushed piece under a capability to read; and it asks the master to extend the
    /// file past its chunks. Each must be refused: an Ok answer is a violation. Counted per kind (`rogue_cap_*`) when answered, so a sweep shows each
    /// was tried.
    fn rogue_capabilities(&self) -> impl std::future::Future<Output = ()> + 'static {
        use prost::Message;
        use tessera_core::pb::{self, chunk_request::Req as CReq};
        use tessera_core::runtime::{Runtime, Transport};
        let (rt, net) = self.rogue_net(&[]);
        let (_, insider) = self.rogue_net(&[crate::USERS]);
        let mut cfg = ClientConfig::new(self.master_addr.clone());
        cfg.rpc_timeout = self.knobs.rpc_timeout;
        cfg.retry_for = Duration::from_secs(3);
        cfg.backoff = Duration::from_millis(100);
        cfg.shadow_reads = false;
        let client = Client::new(rt.clone(), net.clone(), cfg);
        let (checks, seen) = (self.checks.clone(), self.rogue_seen.clone());
        let master = self.master_addr.clone();
        // Well past any capability's life (a lease) on any server's clock.
        let expired_after =
            (3 * self.knobs.lease + 2 * self.knobs.max_clock_skew).as_millis() as i64;
        let r = |n: usize| (madsim::rand::random::<u64>() % n.max(1) as u64) as usize;
        async move {
            let mut dir = "/".to_string();
            let mut file = None;
            for _ in 0..8 {
                let Ok(entries) = client.list(&dir, false).await else {
                    return;
                };
                let Some(e) = entries.get(r(entries.len())) else {
                    return;
                };
                if e.is_dir {
                    dir = e.path.clone();
                } else {
                    file = Some(e.path.clone());
                    break;
                }
            }
            let Some(path) = file else { return };
            rogue_permissions(&client, &rt, &checks, &path, &dir).await;
            let Ok(info) = client.chunk_locations(&path).await else {
                return;
            };
            // A length past every chunk the file has, over all of them: a file read as
            // zeros for ever, if taken. Named, the chunks bound it however the file grows
            // meanwhile; with none to name (the file may gain some before the master
            // answers), only a length no file can reach is a forgery.
            let reach = (info.chunks.len() as u64).saturating_mul(info.chunk_size);
            let length = if r(2) == 0 {
                u64::MAX
            } else {
                let past = reach + 1 + r(info.chunk_size.max(1) as usize) as u64;
                if info.chunks.is_empty() {
                    u64::MAX
                } else {
                    past
                }
            };
            let extend = pb::MasterRequest {
                req: Some(pb::master_request::Req::ExtendFile(pb::ExtendFileRequest {
                    path: path.clone(),
                    length,
                    first_index: 0,
                    handles: info.chunks.iter().map(|c| c.handle).collect(),
                })),
                ..Default::default()
            };
            // As a member of the clients' group, who may write the file: only the
            // bound on its length stands in the way.
            let deadline = rt.now() + Duration::from_secs(5);
            if let Ok(answer) = insider
                .call(
                    &master,
                    ServerRole::Master,
                    extend.encode_to_vec().into(),
                    deadline,
                )
                .await
            {
                let mut c = checks.lock().expect("checks");
                c.fault("rogue_extend", 1);
                if let Ok(resp) = pb::MasterResponse::decode(answer)
                    && resp.error.is_none()
                {
                    c.violation(
                        rt.true_ms(),
                        format!(
                            "the master answered Ok to extending {path} to {length}, past \
                             its chunks' {reach} bytes"
                        ),
                    );
                }
            }
            let usable: Vec<&pb::ChunkLocation> = info
                .chunks
                .iter()
                .filter(|c| !c.replicas.is_empty() && c.capabilities.len() == c.replicas.len())
                .collect();
            let Some(&loc) = usable.get(r(usable.len())) else {
                return;
            };
            let now = rt.true_ms();
            let old = {
                let mut seen = seen.lock().expect("rogue's locations");
                let old = seen
                    .iter()
                    .find(|(t, _)| now - t > expired_after)
                    .map(|(_, l)| l.clone());
                seen.push_back((now, loc.clone()));
                if seen.len() > 32 {
                    seen.pop_front();
                }
                old
            };
            let n = loc.replicas.len();
            let i = r(n);
            let (h, v, cap) = (loc.handle, loc.version, loc.capabilities[i].clone());
            let read = |cap: Option<pb::Capability>| {
                CReq::Read(pb::ReadChunkRequest {
                    handle: h,
                    version: v,
                    offset: 0,
                    length: 1 << 16,
                    capability: cap,
                })
            };
            let forged = bytes::Bytes::from_static(b"bytes the rogue may not write");
            let mut tries: Vec<(&'static str, String, CReq)> = vec![
                (
                    "rogue_cap_none",
                    "a read without a capability".into(),
                    read(None),
                ),
                (
                    "rogue_cap_altered",
                    "a read under its capability given to another client".into(),
                    read(Some(pb::Capability {
                        subject: "client:client0".into(),
                        ..cap.clone()
                    })),
                ),
                (
                    "rogue_cap_read_as_write",
                    "a write under a capability to read".into(),
                    CReq::Write(pb::WriteChunkRequest {
                        handle: h,
                        version: v,
                        offset: 0,
                        data: forged.clone(),
                        client_id: madsim::rand::random(),
                        client_seq: 1,
                        capability: Some(cap.clone()),
                        ..Default::default()
                    }),
                ),
                (
                    "rogue_cap_push",
                    "a pushed piece under a capability to read".into(),
                    CReq::Push(pb::PushDataRequest {
                        data_id: madsim::rand::random::<u64>() | 1,
                        offset: 0,
                        total: forged.len() as u64,
                        piece: forged.clone(),
                        chain: vec![],
                        handle: h,
                        capabilities: vec![cap.clone()],
                    }),
                ),
            ];
            if n > 1 {
                let other = loc.capabilities[(i + 1) % n].clone();
                tries.push((
                    "rogue_cap_other_server",
                    "a read under the capability signed for another server".into(),
                    read(Some(other)),
                ));
            }
            let mut targets = vec![loc.replicas[i].clone(); tries.len()];
            if let Some(old) = old {
                let j = r(old.replicas.len());
                if let Some(c) = old.capabilities.get(j) {
                    targets.push(old.replicas[j].clone());
                    tries.push((
                        "rogue_cap_expired",
                        format!(
                            "a read of chunk {} under a capability given {}+ ms before",
                            old.handle, expired_after
                        ),
                        CReq::Read(pb::ReadChunkRequest {
                            handle: old.handle,
                            version: old.version,
                            offset: 0,
                            length: 1 << 16,
                            capability: Some(c.clone()),
                        }),
                    ));
                }
            }
            for ((kind, what, req), to) in tries.into_iter().zip(targets) {
                let body = pb::ChunkRequest { req: Some(req) }.encode_to_vec();
                let deadline = rt.now() + Duration::from_secs(5);
                let Ok(answer) = net
                    .call(&to, ServerRole::Chunkserver, body.into(), deadline)
                    .await
                else {
                    continue;
                };
                let mut c = checks.lock().expect("checks");
                c.fault(kind, 1);
                if let Ok(resp) = pb::ChunkResponse::decode(answer)
                    && resp.error.is_none()
                {
                    c.violation(
                        rt.true_ms(),
                        format!("{to} answered Ok to a forged request for chunk {h}: {what}"),
                    );
                }
            }
        }
    }

    /// Counts faults of `kind` that happened, for the run's summary.
    pub fn count_fault(&self, kind: &'static str, n: u64) {
        self.checks.lock().expect("checks").fault(kind, n);
    }

    /// Kills the master; its store keeps some prefix of its unsynced batches.
    pub fn kill_master(&mut self) {
        self.kill_master_keeping(|n| {
            if n == 0 {
                0
            } else {
                (madsim::rand::random::<u64>() % (n as u64 + 1)) as usize
            }
        });
    }

    /// Kills the master as a power loss that reaches the disk before any unsynced batch
    /// does: every one is lost. Returns how many.
    pub fn kill_master_losing_unsynced(&mut self) -> usize {
        self.kill_master_keeping(|_| 0)
    }

    /// Kills the master; its store keeps `keep(n)` of its `n` unsynced batches. Returns
    /// how many were lost.
    fn kill_master_keeping(&mut self, keep: impl FnOnce(usize) -> usize) -> usize {
        if !self.master_alive {
            return 0;
        }
        self.handle.kill(self.master_id);
        let lost = self.master_store.crash(keep);
        self.master_alive = false;
        let mut c = self.checks.lock().expect("checks");
        c.fault("master_crash", 1);
        c.fault("log_tail_loss", u64::from(lost > 0));
        c.versions.master_crashed("master");
        lost
    }

    /// Restarts the master; with `restart_chunk_size` set, with the other chunk size.
    pub fn restart_master(&mut self) {
        if !self.master_alive {
            let k = &self.knobs;
            if k.restart_chunk_size != 0 {
                let now = self.master_chunk_size.load(Ordering::Relaxed);
                let next = if now == k.chunk_size {
                    k.restart_chunk_size
                } else {
                    k.chunk_size
                };
                self.master_chunk_size.store(next, Ordering::Relaxed);
                tracing::info!(
                    t = self.true_ms(),
                    chunk_size = next,
                    "master restarts with another chunk size"
                );
            }
            self.handle.restart(self.master_id);
            self.master_alive = true;
        }
    }

    /// Cuts a node off from everyone (both directions).
    pub fn isolate(&self, id: NodeId) {
        NetSim::current().clog_node(id);
    }

    pub fn reconnect(&self, id: NodeId) {
        NetSim::current().unclog_node(id);
    }

    /// Cuts the link between the master and chunkserver `i`, leaving both reachable by
    /// clients.
    pub fn cut_from_master(&self, i: usize) {
        let net = NetSim::current();
        net.clog_link(self.master_id, self.servers[i].id);
        net.clog_link(self.servers[i].id, self.master_id);
    }

    /// Cuts one direction of the link between the master and chunkserver `i`.
    pub fn cut_one_way(&self, i: usize, to_master: bool) {
        let net = NetSim::current();
        if to_master {
            net.clog_link(self.servers[i].id, self.master_id);
        } else {
            net.clog_link(self.master_id, self.servers[i].id);
        }
    }

    /// Every node's id: the master (a group's first replica), then each chunkserver,
    /// then each client, then a group's other replicas (the order of `jumps`).
    pub fn node_ids(&self) -> Vec<NodeId> {
        let mut ids = vec![self.master_id];
        ids.extend(self.servers.iter().map(|s| s.id));
        ids.extend(self.clients.iter().map(|c| c.0.id()));
        ids.extend(self.replicas.iter().skip(1).map(|r| r.id));
        ids
    }

    /// Whether node `k` (a place in [`Cluster::node_ids`]) is the master or a replica.
    pub fn is_master_node(&self, k: usize) -> bool {
        k == 0 || k > self.servers.len() + self.clients.len()
    }

    /// A node's name for the fault log, by its place in [`Cluster::node_ids`].
    pub fn node_name(&self, k: usize) -> String {
        let (n, c) = (self.servers.len(), self.clients.len());
        match k {
            0 if self.replicas.is_empty() => "master".into(),
            0 => self.replicas[0].node.clone(),
            k if k <= n => format!("cs{}", k - 1),
            k if k <= n + c => format!("client{}", k - 1 - n),
            k => self.replicas[k - n - c].node.clone(),
        }
    }

    /// Cuts the link from node `a` to node `b` (by their places in
    /// [`Cluster::node_ids`]); `both` cuts the way back too.
    pub fn cut_link(&self, a: usize, b: usize, both: bool) {
        let (ids, net) = (self.node_ids(), NetSim::current());
        net.clog_link(ids[a], ids[b]);
        if both {
            net.clog_link(ids[b], ids[a]);
        }
    }

    pub fn mend_link(&self, a: usize, b: usize) {
        let (ids, net) = (self.node_ids(), NetSim::current());
        net.unclog_link(ids[a], ids[b]);
        net.unclog_link(ids[b], ids[a]);
    }

    pub fn mend_from_master(&self, i: usize) {
        let net = NetSim::current();
        net.unclog_link(self.master_id, self.servers[i].id);
        net.unclog_link(self.servers[i].id, self.master_id);
    }
}

/// The rogue, in no group, tries what only a file's owner or its group may do to `path`
/// (a client's file in `dir`): each must be refused, and is counted per kind when an
/// answer came back.
async fn rogue_permissions(
    client: &Client<SimRuntime, SimNet>,
    rt: &SimRuntime,
    checks: &Shared,
    path: &str,
    dir: &str,
) {
    let moved = format!("{path}.rogue");
    let made = format!("{}/rogue-made", dir.trim_end_matches('/'));
    let tries: [(&'static str, String, Result<(), FsError>); 7] = [
        (
            "rogue_perm_delete",
            format!("delete {path}"),
            client.delete(path, false).await,
        ),
        (
            "rogue_perm_rename",
            format!("rename {path} to {moved}"),
            client.rename(path, &moved).await,
        ),
        (
            "rogue_perm_write",
            format!("take a write target of {path}"),
            client.lease_holder(path, 0).await.map(|_| ()),
        ),
        (
            "rogue_perm_append",
            format!("reserve an append region of {path}"),
            client.reserve_append(path, 1).await.map(|_| ()),
        ),
        (
            "rogue_perm_chmod",
            format!("chmod 666 {path}"),
            client.set_permissions(path, None, None, Some(0o666)).await,
        ),
        (
            "rogue_perm_chown",
            format!("chown {path} to itself"),
            client
                .set_permissions(path, Some("rogue"), None, None)
                .await,
        ),
        (
            "rogue_perm_create",
            format!("make {made}"),
            client.create(&made, 0).await,
        ),
    ];
    let mut c = checks.lock().expect("checks");
    for (kind, what, result) in tries {
        match result {
            Ok(()) => c.violation(
                rt.true_ms(),
                format!("the master let user rogue (in no group) {what}"),
            ),
            Err(FsError::PermissionDenied(_)) => c.fault(kind, 1),
            // Not answered for its permissions (the file went meanwhile, no master
            // answered): not an attempt the master judged.
            Err(_) => {}
        }
    }
}
