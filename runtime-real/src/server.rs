//! Running a master or a chunkserver on real sockets and disks. Start-up is recovery:
//! a server killed at any moment (kill -9, power loss) starts again from what it made
//! durable, through the same path as a clean start.

use crate::tls::Credentials;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tessera_core::auth::Caller;

use serde::Deserialize;
use tessera_core::chunkserver::ChunkserverConfig;
use tessera_core::driver::{Quiet, chunkserver, master};
use tessera_core::master::{MasterConfig, perms};

use tessera_core::trace::Recorder;
use tessera_tracefile::{FileSink, Rotation};

use crate::chunkstore::FileChunkStore;
use crate::metastore::RocksMetaStore;
use crate::rt::TokioRuntime;
use crate::transport::{GrpcTransport, MAX_MESSAGE, ServerLimits};

/// Settings a config file may give (TOML); a flag given on the command line wins.
/// Durations are written as "60s", "500ms", "3days".
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSettings {
    pub root_owner: Option<String>,
    pub root_mode: Option<String>,
    pub chunk_size: Option<u64>,
    pub replication: Option<u8>,
    #[serde(default, with = "opt_duration")]
    pub lease: Option<Duration>,
    #[serde(default, with = "opt_duration")]
    pub max_clock_skew: Option<Duration>,
    #[serde(default, with = "opt_duration")]
    pub late_delivery: Option<Duration>,
    #[serde(default, with = "opt_duration")]
    pub heartbeat: Option<Duration>,
    #[serde(default, with = "opt_duration")]
    pub dead_after: Option<Duration>,
    #[serde(default, with = "opt_duration")]
    pub gc_delay: Option<Duration>,
    pub clones_per_server: Option<u32>,
    pub clones_cluster: Option<u32>,
    pub max_servers: Option<usize>,
    #[serde(default, with = "opt_duration")]
    pub clone_timeout: Option<Duration>,
    #[serde(default, with = "opt_duration")]
    pub rpc_timeout: Option<Duration>,
    #[serde(default, with = "opt_duration")]
    pub tick: Option<Duration>,
    pub checkpoint_every: Option<u64>,
    pub snapshot_part_bytes: Option<usize>,
    pub capacity: Option<u64>,
    #[serde(default, with = "opt_duration")]
    pub scrub_interval: Option<Duration>,
    #[serde(default, with = "opt_duration")]
    pub scrub_idle: Option<Duration>,
    pub read_cache: Option<u64>,
    pub max_queued: Option<usize>,
    pub max_queued_per_chunk: Option<usize>,
    pub max_connections: Option<usize>,
    pub max_streams: Option<u32>,
    pub request_memory: Option<usize>,
    #[serde(default, with = "opt_duration")]
    pub receive_timeout: Option<Duration>,
    pub max_per_caller: Option<usize>,
    #[serde(default, with = "opt_duration")]
    pub idle_timeout: Option<Duration>,
    pub trace_dir: Option<PathBuf>,
    pub trace_file_bytes: Option<u64>,
    pub trace_files: Option<usize>,
}

mod opt_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        s.map(|s| humantime::parse_duration(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Every timing and size knob, as flags (each also settable in the config file).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Knobs {
    /// Config file (TOML) with any of the settings below; flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Who owns the root directory of a cluster this master formats (on the first start
    /// of its first master, and never after: then `tessera chown` and `chmod`), as
    /// OWNER:GROUP [default: root:root].
    #[arg(long, value_name = "OWNER:GROUP")]
    pub root_owner: Option<String>,
    /// The root directory's permission bits when the cluster is formatted, in octal
    /// (1777: anyone may make entries, only their owners remove them) [default: 755].
    #[arg(long, value_name = "MODE")]
    pub root_mode: Option<String>,
    /// Bytes per chunk of new files [default: 67108864 (64 MiB)]. Set on the master; a file
    /// keeps the size it was created with, so a change affects new files only.
    #[arg(long)]
    pub chunk_size: Option<u64>,
    /// Replicas per chunk for files created without a count [default: 3].
    #[arg(long)]
    pub replication: Option<u8>,
    /// How long a lease lasts without extension [default: 60s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub lease: Option<Duration>,
    /// Most that two servers' clocks may disagree over one lease [default: 2s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_clock_skew: Option<Duration>,
    /// Longest a request may still reach its server after its caller's deadline (held
    /// by the network, then delivered): the master counts it into void leases and its
    /// quiet period after a start [default: 5s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub late_delivery: Option<Duration>,
    /// Chunkserver heartbeat interval [default: 1s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub heartbeat: Option<Duration>,
    /// A chunkserver silent this long is dead; its replicas stop counting [default: 15s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub dead_after: Option<Duration>,
    /// How long a deleted file can be recovered before its space is reclaimed
    /// [default: 3days].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub gc_delay: Option<Duration>,
    /// Re-replication throttle: clones one server takes part in at once [default: 2].
    #[arg(long)]
    pub clones_per_server: Option<u32>,
    /// Re-replication throttle: clones in the whole cluster at once [default: 16].
    #[arg(long)]
    pub clones_cluster: Option<u32>,
    /// The most chunkservers the master registers, live and dead together; a new one
    /// past it is refused until the master restarts, which forgets the dead
    /// [default: 16384].
    #[arg(long)]
    pub max_servers: Option<usize>,
    /// How long the master waits for one clone to finish [default: 5m].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub clone_timeout: Option<Duration>,
    /// Deadline for calls between servers [default: 10s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub rpc_timeout: Option<Duration>,
    /// How often the master checks liveness, leases, re-replication and garbage
    /// [default: 500ms].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub tick: Option<Duration>,
    /// The master writes a checkpoint after this many log records [default: 100000].
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// A master stores its checkpoint in parts of about this many bytes (one value each:
    /// as many of its entries as fit, or one larger entry alone), and a master replica sends another a checkpoint larger than this in
    /// parts of this many bytes, one call each; 64 at least [default: 4194304 (4 MiB)].
    #[arg(long)]
    pub snapshot_part_bytes: Option<usize>,
    /// Most bytes a chunkserver offers; the disk's free space caps it further
    /// [default: 1099511627776 (1 TiB)].
    #[arg(long)]
    pub capacity: Option<u64>,
    /// The scrubber verifies one idle chunk this often; 0s turns it off [default: 10s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub scrub_interval: Option<Duration>,
    /// A chunk written within this long is not scrubbed yet [default: 60s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub scrub_idle: Option<Duration>,
    /// Bytes of memory a chunkserver keeps recently written data in, so reading it back
    /// needs no disk (chunk files bypass the kernel's page cache); 0 turns it off
    /// [default: 1073741824 (1 GiB)].
    #[arg(long, value_name = "BYTES")]
    pub read_cache: Option<u64>,
    /// Requests that may wait at once: on the master for path locks, on a chunkserver
    /// behind other work on chunks; past it a request is refused as busy and the client
    /// retries [default: 10000 on the master, 65536 on a chunkserver].
    #[arg(long)]
    pub max_queued: Option<usize>,
    /// Requests that may wait behind others on one chunk [default: 1024].
    #[arg(long)]
    pub max_queued_per_chunk: Option<usize>,
    /// Connections a server serves at once; more wait until one closes [default: 512].
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Calls in progress at once on one connection (HTTP/2 max concurrent streams); a
    /// client's further calls wait [default: 256].
    #[arg(long)]
    pub max_streams: Option<u32>,
    /// Bytes of requests a server holds at once, from their arrival to their reply; a
    /// request that would pass it is refused as busy. At least 67108864 (64 MiB, the
    /// largest message) [default: 268435456 (256 MiB)].
    #[arg(long, value_name = "BYTES")]
    pub request_memory: Option<usize>,
    /// The longest a request may take to arrive whole before its sender is cut off
    /// [default: 30s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub receive_timeout: Option<Duration>,
    /// Connections one authenticated caller (a certificate's identity) may hold on a
    /// server at once; more are closed as they come. Not applied with --insecure
    /// [default: 128].
    #[arg(long)]
    pub max_per_caller: Option<usize>,
    /// A connection that carries no call for this long is closed (its caller reconnects
    /// when it next calls) [default: 5m].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// Record what crosses each server's state machine (requests, replies, calls,
    /// timers, storage operations, clock readings; file data as length and CRC only) to
    /// a trace in DIR/<role>-<address>/, for `tessera trace summary` and `tessera replay
    /// node` [default: no trace].
    #[arg(long, value_name = "DIR")]
    pub trace_dir: Option<PathBuf>,
    /// Bytes per trace file before the next is begun [default: 67108864 (64 MiB)].
    #[arg(long, value_name = "BYTES")]
    pub trace_file_bytes: Option<u64>,
    /// Trace files a server keeps; the oldest go [default: 16].
    #[arg(long)]
    pub trace_files: Option<usize>,
}

/// Flags over the config file over the defaults.
pub struct Resolved {
    pub master: MasterConfig,
    pub chunkserver: ChunkserverConfig,
    pub heartbeat: Duration,
    pub rpc_timeout: Duration,
    pub tick: Duration,
    pub limits: ServerLimits,
    pub trace: Option<(PathBuf, Rotation)>,
    /// A master's stored checkpoint, and a master replica's snapshots to others, go in
    /// parts of this size.
    pub snapshot_part_bytes: usize,
}

impl Knobs {
    pub fn resolve(&self) -> Result<Resolved, String> {
        let file: FileSettings = match &self.config {
            None => FileSettings::default(),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read config {}: {e}", p.display()))?;
                toml::from_str(&text).map_err(|e| format!("config {}: {e}", p.display()))?
            }
        };
        let mut m = MasterConfig::default();
        let mut c = ChunkserverConfig::default();
        macro_rules! pick {
            ($field:ident, $default:expr) => {
                self.$field.or(file.$field).unwrap_or($default)
            };
        }
        // The chunk size of new files; each file keeps the one it was created with.
        m.chunk_size = pick!(chunk_size, m.chunk_size);
        if m.chunk_size < 4 * tessera_core::BLOCK_SIZE
            || m.chunk_size > tessera_core::MAX_CHUNK_SIZE
        {
            return Err(format!(
                "chunk size must be {} to {} bytes",
                4 * tessera_core::BLOCK_SIZE,
                tessera_core::MAX_CHUNK_SIZE
            ));
        }
        // A zero would be taken for "at least one" (or "every record"), silently.
        let positive = |name: &str, v: u64| {
            if v == 0 {
                Err(format!("--{name} must be at least 1"))
            } else {
                Ok(())
            }
        };
        m.default_replication = pick!(replication, m.default_replication);
        positive("replication", u64::from(m.default_replication))?;
        m.lease_duration = pick!(lease, m.lease_duration);
        m.max_clock_skew = pick!(max_clock_skew, m.max_clock_skew);
        m.late_delivery = pick!(late_delivery, m.late_delivery);
        m.heartbeat_timeout = pick!(dead_after, m.heartbeat_timeout);
        m.gc_delay = pick!(gc_delay, m.gc_delay);
        m.clones_per_server = pick!(clones_per_server, m.clones_per_server);
        m.clones_cluster = pick!(clones_cluster, m.clones_cluster);
        m.max_servers = pick!(max_servers, m.max_servers);
        if m.max_servers == 0 {
            return Err("--max-servers must be at least 1".into());
        }
        m.clone_timeout = pick!(clone_timeout, m.clone_timeout);
        m.checkpoint_every = pick!(checkpoint_every, m.checkpoint_every);
        positive("checkpoint-every", m.checkpoint_every)?;
        let root_owner = self
            .root_owner
            .clone()
            .or(file.root_owner.clone())
            .unwrap_or_else(|| format!("{0}:{0}", perms::SUPERUSER));
        let bad_owner = || format!("--root-owner {root_owner:?}: give OWNER:GROUP (user names)");
        let (owner, group) = root_owner.split_once(':').ok_or_else(bad_owner)?;
        if !tessera_core::auth::valid_name(owner) || !tessera_core::auth::valid_name(group) {
            return Err(bad_owner());
        }
        let mode = match self.root_mode.clone().or(file.root_mode.clone()) {
            Some(s) => perms::parse_mode(&s).map_err(|e| format!("--root-mode: {e}"))?,
            None => perms::DEFAULT_DIR_MODE,
        };
        m.root = tessera_core::pb::Permissions {
            owner: owner.into(),
            group: group.into(),
            mode,
        };
        m.rng_seed = rand::random();
        // From the OS's generator (rand's thread generator is seeded from it): only a
        // master that leads a cluster without a secret logs it, and only then is it used.
        m.capability_secret = rand::random();
        let snapshot_part_bytes = pick!(snapshot_part_bytes, 4 << 20);
        // Each part carries a key and about 25 bytes of seal and framing: tiny parts
        // would multiply a checkpoint's values and bytes many times over.
        if !(64..=MAX_MESSAGE / 2).contains(&snapshot_part_bytes) {
            return Err(format!(
                "--snapshot-part-bytes must be 64 to {} bytes (half the largest message)",
                MAX_MESSAGE / 2
            ));
        }
        c.capacity_bytes = pick!(capacity, c.capacity_bytes);
        c.scrub_interval = pick!(scrub_interval, c.scrub_interval);
        c.scrub_idle = pick!(scrub_idle, c.scrub_idle);
        c.read_cache_bytes = pick!(read_cache, c.read_cache_bytes);
        m.max_queued = pick!(max_queued, m.max_queued);
        c.max_queued = pick!(max_queued, c.max_queued);
        c.max_queued_per_chunk = pick!(max_queued_per_chunk, c.max_queued_per_chunk);
        positive("max-queued", m.max_queued as u64)?;
        positive("max-queued-per-chunk", c.max_queued_per_chunk as u64)?;
        let heartbeat = pick!(heartbeat, Duration::from_secs(1));
        let rpc_timeout = pick!(rpc_timeout, Duration::from_secs(10));
        let tick = pick!(tick, Duration::from_millis(500));
        // A zero period would spin (a heartbeat or tick loop busy, seen from outside at
        // 92 % of a core), a zero lease would let no write through, a zero timeout would
        // fail every call: none is what anybody means.
        for (name, d) in [
            ("heartbeat", heartbeat),
            ("tick", tick),
            ("lease", m.lease_duration),
            ("rpc-timeout", rpc_timeout),
            ("clone-timeout", m.clone_timeout),
            ("scrub-interval", c.scrub_interval),
        ] {
            if d.is_zero() {
                return Err(format!("--{name} must be more than 0s"));
            }
        }
        positive("capacity", c.capacity_bytes)?;
        if heartbeat * 2 > m.heartbeat_timeout {
            return Err("--dead-after must be at least twice --heartbeat".into());
        }
        let d = ServerLimits::default();
        let limits = ServerLimits {
            max_connections: pick!(max_connections, d.max_connections),
            max_streams: pick!(max_streams, d.max_streams),
            request_bytes: pick!(request_memory, d.request_bytes),
            receive_timeout: pick!(receive_timeout, d.receive_timeout),
            max_per_caller: pick!(max_per_caller, d.max_per_caller),
            idle_timeout: pick!(idle_timeout, d.idle_timeout),
        };
        if limits.max_connections == 0 || limits.max_streams == 0 || limits.max_per_caller == 0 {
            return Err(
                "--max-connections, --max-streams and --max-per-caller must be at least 1".into(),
            );
        }
        if limits.idle_timeout < limits.receive_timeout {
            return Err("--idle-timeout must be at least --receive-timeout".into());
        }
        if limits.request_bytes < MAX_MESSAGE {
            return Err(format!(
                "--request-memory must be at least {MAX_MESSAGE} bytes, the largest message"
            ));
        }
        if limits.receive_timeout.is_zero() {
            return Err("--receive-timeout must be more than 0s".into());
        }
        let rotation = Rotation {
            file_bytes: pick!(trace_file_bytes, Rotation::default().file_bytes),
            files: pick!(trace_files, Rotation::default().files),
        };
        if rotation.file_bytes < 4096 || rotation.files == 0 {
            return Err(
                "--trace-file-bytes must be at least 4096 and --trace-files at least 1".into(),
            );
        }
        let trace = self
            .trace_dir
            .clone()
            .or(file.trace_dir)
            .map(|d| (d, rotation));
        // The master's quiet period after a restart covers a grant still in flight.
        m.call_timeout = rpc_timeout;
        Ok(Resolved {
            limits,
            trace,
            master: m,
            chunkserver: c,
            heartbeat,
            rpc_timeout,
            tick,
            snapshot_part_bytes,
        })
    }
}

/// Makes a server's data directory (and its parents) if need be, and keeps it readable
/// by its owner alone, whatever the umask: a master's holds the cluster's capability
/// secret (whoever reads it forges any capability) and the whole namespace, a
/// chunkserver's every file's bytes.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot make {} its owner's alone: {e}", dir.display()))
}

pub async fn run_master(
    data_dir: PathBuf,
    listen: String,
    knobs: &Knobs,
    creds: Option<Credentials>,
) -> Result<(), String> {
    let r = knobs.resolve()?;
    reachable("--listen", &listen)?;
    private_dir(&data_dir)?;
    let store = RocksMetaStore::open(&data_dir.join("meta")).map_err(|e| {
        format!(
            "cannot open the metadata store in {}: {e}",
            data_dir.display()
        )
    })?;
    let opts = master::MasterOptions {
        config: r.master,
        listen,
        tick: r.tick,
        call_timeout: r.rpc_timeout,
        checkpoint_delay: Duration::ZERO,
        checkpoint_part_bytes: r.snapshot_part_bytes,
    };
    let trace = recorder(&r.trace, "master", &opts.listen)?;
    let transport = transport(r.limits, creds.as_ref())?;
    master::run(TokioRuntime, transport, store, opts, (Quiet, trace))
        .await
        .map_err(|e| format!("master stopped: {e}"))
}

/// A server's `--listen` checked: it is also the address others reach it at, and its
/// identity to the master (a chunkserver's) or the group (a replica's), so a port 0
/// (the system's pick, known to nobody) or an address of no host (0.0.0.0, [::]) will
/// not do.
pub fn reachable(flag: &str, listen: &str) -> Result<(), String> {
    let Some((host, port)) = listen.rsplit_once(':') else {
        return Err(format!("{flag} {listen:?}: give host:port"));
    };
    if host.is_empty() || !matches!(port.parse::<u16>(), Ok(p) if p != 0) {
        return Err(format!(
            "{flag} {listen:?}: give host:port, with a port other than 0"
        ));
    }
    let ip = host.trim_start_matches('[').trim_end_matches(']');
    if ip
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified())
    {
        return Err(format!(
            "{flag} {listen:?} is no address others can reach this server at (it is also \
             the server's name to them): give its own, such as 127.0.0.1:{port}"
        ));
    }
    Ok(())
}

/// A `--master` (or `TESSERA_MASTER`) value checked: one or more addresses, `host:port`,
/// separated by commas. Anything else is refused at once, rather than tried until
/// `--retry-for` runs out (an empty value was, for two minutes).
pub fn master_list(list: &str) -> Result<String, String> {
    let addrs: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    if addrs.is_empty() {
        return Err("no master address: give host:port (a group's: a,b,c)".into());
    }
    for a in &addrs {
        let port = a.rsplit_once(':').and_then(|(host, port)| {
            // Not `1=host:port`: that is how --peers numbers replicas, not an address.
            (!host.is_empty() && !host.contains('=')).then_some(())?;
            port.parse::<u16>().ok().filter(|&p| p != 0)
        });
        if port.is_none() {
            return Err(format!("{a:?} is no master address: give host:port"));
        }
    }
    if let Some(twice) = addrs
        .iter()
        .enumerate()
        .find_map(|(i, a)| addrs[..i].contains(a).then_some(a))
    {
        // A slip (the list was meant to name each replica once): the group is not the
        // one the list seems to describe.
        return Err(format!("{twice} is named twice: name each master once"));
    }
    Ok(list.to_string())
}

/// A master group's members from `1=host:port,2=...` or `host:port,...` (numbered 1,
/// 2, ... in order).
pub fn parse_peers(list: &str) -> Result<std::collections::BTreeMap<u64, String>, String> {
    let mut members = std::collections::BTreeMap::new();
    for (n, part) in list
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .enumerate()
    {
        let (id, addr) = match part.split_once('=') {
            Some((id, addr)) => (
                id.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("--peers: {id:?} is not a replica number"))?,
                addr.trim().to_string(),
            ),
            None => (n as u64 + 1, part.to_string()),
        };
        if id == 0 {
            return Err("--peers: replicas are numbered from 1".into());
        }
        if addr.is_empty() {
            return Err(format!("--peers: replica {id} has no address"));
        }
        if members.values().any(|a| *a == addr) {
            return Err(format!("--peers: {addr} named twice"));
        }
        if members.insert(id, addr).is_some() {
            return Err(format!("--peers: replica {id} named twice"));
        }
    }
    if members.is_empty() {
        return Err("--peers names no replica".into());
    }
    Ok(members)
}

/// Runs replica `id` of the master group `members` (forming it with `bootstrap`, or
/// joining it with `join`).
pub async fn run_replica(
    data_dir: PathBuf,
    id: u64,
    members: std::collections::BTreeMap<u64, String>,
    bootstrap: bool,
    join: bool,
    knobs: &Knobs,
    creds: Option<Credentials>,
) -> Result<(), String> {
    let r = knobs.resolve()?;
    if let Some(c) = &creds
        && c.caller != (Caller::Master { replica: id })
    {
        return Err(format!(
            "{}: the certificate names {}, not master replica {id}",
            c.dir().display(),
            c.caller
        ));
    }
    if !members.contains_key(&id) {
        return Err(format!("replica {id} is not in --peers {members:?}"));
    }
    for a in members.values() {
        reachable("--peers", a)?;
    }
    if members.len().is_multiple_of(2) && bootstrap {
        // Allowed (a group changes size one replica at a time, through even sizes), but
        // an even group survives no more failures than one replica fewer.
        tracing::warn!(
            replicas = members.len(),
            "a group of {} replicas stops if {} of them fail, as a group of {} does: \
             form groups of 3 or 5",
            members.len(),
            members.len() / 2,
            members.len() - 1
        );
    }
    private_dir(&data_dir)?;
    let store = RocksMetaStore::open(&data_dir.join("meta")).map_err(|e| {
        format!(
            "cannot open the metadata store in {}: {e}",
            data_dir.display()
        )
    })?;
    let mut group = tessera_core::group::GroupConfig::new(id, members);
    group.seed = rand::random();
    group.snapshot_every = r.master.checkpoint_every;
    group.snapshot_part_bytes = r.snapshot_part_bytes;
    let opts = tessera_core::driver::group::GroupOptions {
        group,
        master: r.master,
        tick: r.tick,
        call_timeout: r.rpc_timeout,
        bootstrap,
        join,
        checkpoint_delay: Duration::ZERO,
    };
    // The replica's trace holds its master's runs: one for each time it led.
    let listen = opts.group.members[&id].clone();
    let trace = recorder(&r.trace, "master", &listen)?;
    let transport = transport(r.limits, creds.as_ref())?;
    tessera_core::driver::group::run(TokioRuntime, transport, store, opts, (Quiet, trace))
        .await
        .map_err(|e| format!("master replica {id} stopped: {e}"))
}

pub async fn run_chunkserver(
    data_dir: PathBuf,
    listen: String,
    master_addr: String,
    rack: String,
    knobs: &Knobs,
    creds: Option<Credentials>,
) -> Result<(), String> {
    let r = knobs.resolve()?;
    reachable("--listen", &listen)?;
    if master_addr.split(',').map(str::trim).any(|m| m == listen) {
        // It would call itself for ever, taking its own refusals for a master's.
        return Err(format!(
            "--master names this chunkserver's own address {listen}: give the master's"
        ));
    }
    private_dir(&data_dir)?;
    let store = FileChunkStore::open(&data_dir)
        .map_err(|e| format!("cannot open the chunk store in {}: {e}", data_dir.display()))?;
    let config = ChunkserverConfig {
        address: listen,
        rack,
        boot: rand::random(),
        ..r.chunkserver
    };
    let opts = chunkserver::ChunkserverOptions {
        config,
        master: master_addr,
        heartbeat_interval: r.heartbeat,
        call_timeout: r.rpc_timeout,
    };
    let trace = recorder(&r.trace, "chunkserver", &opts.config.address)?;
    let transport = transport(r.limits, creds.as_ref())?;
    chunkserver::run(TokioRuntime, transport, store, opts, (Quiet, trace))
        .await
        .map_err(|e| format!("chunkserver stopped: {e}"))
}

/// A server's transport: mutually authenticated with `creds`, or insecure.
fn transport(limits: ServerLimits, creds: Option<&Credentials>) -> Result<GrpcTransport, String> {
    GrpcTransport::maybe_secured(limits, creds).map_err(|e| e.to_string())
}

/// The trace recorder of a server, when `--trace-dir` asks for one.
fn recorder(
    trace: &Option<(PathBuf, Rotation)>,
    role: &str,
    address: &str,
) -> Result<Option<Recorder<FileSink>>, String> {
    let Some((dir, rotation)) = trace else {
        return Ok(None);
    };
    let sink = FileSink::open(dir, role, address, *rotation)?;
    tracing::info!(dir = %sink.dir().display(), "recording a trace");
    Ok(Some(Recorder::new(sink)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Knobs;

    /// A data directory is its owner's alone, made so or found wider open.
    #[test]
    fn data_directories_are_readable_by_their_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let new = t.path().join("a/b");
        super::private_dir(&new).unwrap();
        assert_eq!(mode(&new), 0o700);
        let old = t.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
        super::private_dir(&old).unwrap();
        assert_eq!(mode(&old), 0o700);
    }

    /// The root's owner and bits are checked as given.
    #[test]
    fn a_root_owner_and_mode_are_checked() {
        use clap::Parser;
        #[derive(Parser)]
        struct K {
            #[command(flatten)]
            k: Knobs,
        }
        let resolve = |args: &[&str]| {
            let mut all = vec!["x"];
            all.extend_from_slice(args);
            K::try_parse_from(all)
                .unwrap()
                .k
                .resolve()
                .map(|r| r.master.root)
        };
        let r = resolve(&[]).unwrap();
        assert_eq!(
            (r.owner.as_str(), r.group.as_str(), r.mode),
            ("root", "root", 0o755)
        );
        let r = resolve(&["--root-owner", "hdfs:users", "--root-mode", "1777"]).unwrap();
        assert_eq!(
            (r.owner.as_str(), r.group.as_str(), r.mode),
            ("hdfs", "users", 0o1777)
        );
        for bad in [
            &["--root-owner", "hdfs"][..],
            &["--root-owner", "a b:c"],
            &["--root-mode", "4755"],
            &["--root-mode", "rwx"],
        ] {
            assert!(resolve(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_master_address_is_host_and_port() {
        use super::master_list;
        for ok in [
            "127.0.0.1:7070",
            "a:1, b:2 ,c:3",
            "[::1]:7070",
            "localhost:7070,",
        ] {
            assert_eq!(master_list(ok).as_deref(), Ok(ok), "{ok}");
        }
        for bad in [
            "",
            " , ",
            "127.0.0.1",
            ":7070",
            "a:b",
            "a:0",
            "a:70700",
            "a:1,b",
            "a:1,b:2,a:1",
        ] {
            assert!(master_list(bad).is_err(), "{bad:?} taken");
        }
    }

    #[test]
    fn a_server_listens_where_others_can_reach_it() {
        use super::reachable;
        for ok in [
            "127.0.0.1:7070",
            "localhost:7070",
            "[::1]:7070",
            "10.0.0.3:1",
        ] {
            assert_eq!(reachable("--listen", ok), Ok(()), "{ok}");
        }
        for bad in [
            "127.0.0.1:0",
            "0.0.0.0:7070",
            "[::]:7070",
            "127.0.0.1",
            ":7070",
            "a:b",
        ] {
            assert!(reachable("--listen", bad).is_err(), "{bad:?} taken");
        }
    }

    #[test]
    fn a_zero_where_one_is_the_least_is_refused() {
        assert!(Knobs::default().resolve().is_ok());
        let refused = |k: Knobs| k.resolve().err().unwrap_or_default();
        let e = refused(Knobs {
            replication: Some(0),
            ..Knobs::default()
        });
        assert_eq!(e, "--replication must be at least 1");
        let e = refused(Knobs {
            checkpoint_every: Some(0),
            ..Knobs::default()
        });
        assert_eq!(e, "--checkpoint-every must be at least 1");
        let e = refused(Knobs {
            max_queued: Some(0),
            ..Knobs::default()
        });
        assert_eq!(e, "--max-queued must be at least 1");
        let e = refused(Knobs {
            max_queued_per_chunk: Some(0),
            ..Knobs::default()
        });
        assert_eq!(e, "--max-queued-per-chunk must be at least 1");
        let zero = Some(Duration::ZERO);
        for (name, k) in [
            (
                "heartbeat",
                Knobs {
                    heartbeat: zero,
                    ..Knobs::default()
                },
            ),
            (
                "tick",
                Knobs {
                    tick: zero,
                    ..Knobs::default()
                },
            ),
            (
                "lease",
                Knobs {
                    lease: zero,
                    ..Knobs::default()
                },
            ),
            (
                "rpc-timeout",
                Knobs {
                    rpc_timeout: zero,
                    ..Knobs::default()
                },
            ),
            (
                "clone-timeout",
                Knobs {
                    clone_timeout: zero,
                    ..Knobs::default()
                },
            ),
            (
                "scrub-interval",
                Knobs {
                    scrub_interval: zero,
                    ..Knobs::default()
                },
            ),
        ] {
            assert_eq!(refused(k), format!("--{name} must be more than 0s"));
        }
        let e = refused(Knobs {
            capacity: Some(0),
            ..Knobs::default()
        });
        assert_eq!(e, "--capacity must be at least 1");
        let one = Knobs {
            replication: Some(1),
            checkpoint_every: Some(1),
            max_queued: Some(1),
            max_queued_per_chunk: Some(1),
            ..Knobs::default()
        };
        assert!(one.resolve().is_ok());
    }
}
