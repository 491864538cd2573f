//! The master's knobs. The defaults are GFS's where the paper gives one.

use std::time::Duration;

use crate::types::DEFAULT_CHUNK_SIZE;

#[derive(Clone, Debug)]
pub struct MasterConfig {
    /// Bytes per chunk of new files: each file keeps the size it was created with (in its
    /// create record), so changing this affects new files only. 64 MiB in production;
    /// tests make it tiny so chunk boundaries and padding are hit often. At most
    /// `MAX_CHUNK_SIZE`.
    pub chunk_size: u64,
    /// Replicas per chunk for files created without one.
    pub default_replication: u8,
    /// How long a lease lasts without extension (GFS: 60 s).
    pub lease_duration: Duration,
    /// The most any two nodes' clocks may disagree over one lease period. A new lease is
    /// granted only once the old one has been expired this long on the master's clock.
    pub max_clock_skew: Duration,
    /// A chunkserver silent for this long is dead: its replicas stop counting.
    pub heartbeat_timeout: Duration,
    /// How long a deleted file stays recoverable before its space is reclaimed (GFS: 3 days).
    pub gc_delay: Duration,
    /// Namespace entries the garbage collector looks at per tick.
    pub gc_scan_batch: usize,
    /// Window and per-server limit for recent chunk creations (GFS §4.2).
    pub creation_window: Duration,
    pub creation_limit: u32,
    /// Clones one server may take part in at once, and clones in the whole cluster.
    pub clones_per_server: u32,
    pub clones_cluster: u32,
    /// How long the master waits for a clone to finish before counting it failed.
    pub clone_timeout: Duration,
    /// A checkpoint is taken after this many log records.
    pub checkpoint_every: u64,
    /// Seed for the master's tie-breaking choices (placement, primaries).
    pub rng_seed: u64,
    /// Requests that may wait for path locks at once; past it a request is refused as
    /// busy (the client retries), so a flood on one path cannot grow the queue, and the
    /// work each lock release does, without bound.
    pub max_queued: usize,
    /// The deadline of a grant's call (`SetVersion`): its driver's (the driver raises
    /// this to its own; clones have a longer one of their own, but carry no lease).
    pub call_timeout: Duration,
    /// How long after its caller's deadline a request may still reach its server (held
    /// on a link, retransmitted once the link heals). In Tessera's fault model a request
    /// arrives within this of its caller's deadline or never: an assumption, as the
    /// bound on a message's lifetime is (the simulator delivers requests to chunkservers
    /// up to it late). So an order the master gave up on may still land up to
    /// [`MasterConfig::order_lifetime`] after it was sent, and every time the master
    /// waits out what its orders may yet do counts that whole time: a void lease, a
    /// restart's quiet period (see `leases.rs`), a retired copy's order, a fallback
    /// holder's absence (a report may be as late).
    pub late_delivery: Duration,
    /// The most chunks one write-target request may add to a file. A write past a file's
    /// end allocates every chunk up to the one written (the hole reads as zeros), so
    /// without a bound one small request could make the master log and keep millions of
    /// chunks; a write further past the end is refused (`InvalidArgument`) before
    /// anything is logged. 1024 chunks is 64 GiB at the default chunk size.
    pub max_new_chunks: u64,
    /// The most chunkservers the registry holds, live and dead together: a heartbeat
    /// from a new address past it is refused (`InvalidArgument`), so that neither a
    /// holder of a chunkserver certificate (which may register a new address each time
    /// its last is declared dead) nor anyone on an insecure cluster can grow it without
    /// bound. Dead servers are forgotten when the master restarts (the registry is
    /// rebuilt from heartbeats).
    pub max_servers: usize,
    /// The cluster's capability secret (`crate::capability`), should this master be the
    /// first to lead a cluster without one: it then logs it, and every replica signs with
    /// what was logged. The binary draws it from the OS; tests may leave it fixed.
    pub capability_secret: [u8; crate::capability::SECRET_BYTES],
    /// Who owns the root directory of a cluster this master formats (the first to lead
    /// it): logged with the cluster's id. Later changes are `tessera chown` and `chmod`.
    pub root: crate::pb::Permissions,
}

impl MasterConfig {
    /// The longest after it was sent that a grant's order may reach its server: its
    /// deadline, and then the network's bound on a late delivery.
    pub fn order_lifetime(&self) -> Duration {
        self.call_timeout + self.late_delivery
    }
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            chunk_size: DEFAULT_CHUNK_SIZE,
            default_replication: 3,
            lease_duration: Duration::from_secs(60),
            max_clock_skew: Duration::from_secs(2),
            heartbeat_timeout: Duration::from_secs(15),
            gc_delay: Duration::from_secs(3 * 24 * 3600),
            gc_scan_batch: 1000,
            creation_window: Duration::from_secs(60),
            creation_limit: 20,
            clones_per_server: 2,
            clones_cluster: 16,
            clone_timeout: Duration::from_secs(300),
            checkpoint_every: 100_000,
            rng_seed: 0,
            max_queued: 10_000,
            call_timeout: Duration::from_secs(10),
            late_delivery: Duration::from_secs(5),
            max_new_chunks: 1024,
            max_servers: 16_384,
            capability_secret: [0x5e; crate::capability::SECRET_BYTES],
            root: crate::pb::Permissions {
                owner: super::perms::SUPERUSER.into(),
                group: super::perms::SUPERUSER.into(),
                mode: super::perms::DEFAULT_DIR_MODE,
            },
        }
    }
}
