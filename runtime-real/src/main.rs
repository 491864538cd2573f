//! The `tessera` binary: servers, a dev cluster, and file commands in the spirit of
//! `hdfs dfs`. Run `tessera --help`, or `tessera <command> --help`.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use tessera::rt::TokioRuntime;
use tessera::server::{self, Knobs};
use tessera::tls::Security;
use tessera::transport::GrpcTransport;
use tessera_core::auth::Caller;
use tessera_core::client::{Client, ClientConfig, PutError};
use tessera_core::error::FsError;
use tessera_core::pb;

/// Servers and the client move data in buffers of several MiB. glibc's malloc serves
/// those from fresh mappings that are faulted in and zeroed page by page on every use;
/// mimalloc keeps and reuses them.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The dev cluster's master, the default for file commands.
const DEV_MASTER: &str = tessera::dev::DEFAULT_MASTER;
/// Bytes written per call by put and append (each call is pushed, committed and synced
/// on every replica, so larger calls mean fewer syncs per byte).
const PIECE: usize = 16 << 20;
/// Chunks put and get move at once.
const PARALLEL: usize = 4;
/// Bytes per read call, and reads in flight when writing to stdout.
const READ_PIECE: u64 = 4 << 20;
const READ_AHEAD: usize = 16;

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Tessera, a distributed file system in the line of GFS",
    after_help = "File, admin and bench commands (and chunkservers) talk to the master named by --master \
                  HOST:PORT (every replica of a master group: A,B,C) or TESSERA_MASTER, \
                  127.0.0.1:7070 (the dev cluster's) if neither; --master and --retry-for \
                  may come before the command or after it."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct MasterAddr {
    /// The master to talk to.
    #[arg(long, env = "TESSERA_MASTER", default_value = DEV_MASTER, global = true, value_parser = server::master_list)]
    master: String,
    /// How long a command keeps trying while the master or chunkservers do not answer:
    /// a master restart or failover takes a few seconds, and writes to files that existed
    /// before it wait until the chunkservers that may hold leases report the new master
    /// (or, if one of them stays down, out the lease period: about 72 s with the default
    /// 60 s lease), so the default leaves room for both (0s tries once).
    #[arg(long, env = "TESSERA_RETRY_FOR", default_value = "120s", value_parser = humantime::parse_duration, global = true)]
    retry_for: Duration,
    /// Permission bits new files (from 666) and directories (from 777) do not get, in
    /// octal, as a shell's umask.
    #[arg(long, env = "TESSERA_UMASK", default_value = "022", value_parser = parse_umask, global = true)]
    umask: u32,
    #[command(flatten)]
    security: Security,
}

fn parse_umask(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s, 8) {
        Ok(m) if m <= 0o777 && !s.is_empty() && s.len() <= 4 => Ok(m),
        _ => Err(format!(
            "{s:?}: a umask is up to three octal digits, at most 777"
        )),
    }
}

fn parse_mode(s: &str) -> Result<u32, String> {
    tessera_core::master::perms::parse_mode(s)
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a master: the namespace, chunk metadata, leases, re-replication and GC. With
    /// --peers, one replica of a master group: the op log is replicated (raft), the
    /// leader serves, the others are shadows and take over when it fails.
    Master {
        /// Where the operation log and checkpoints live.
        #[arg(long)]
        data_dir: PathBuf,
        /// Address to serve on, host:port (with --peers: this replica's address there).
        #[arg(long, default_value = DEV_MASTER)]
        listen: String,
        /// Every replica of the master group, this one included: `1=host:port,2=...`,
        /// or `host:port,...` (numbered 1, 2, ... in order). Every replica and every
        /// start must be given the same list.
        #[arg(long)]
        peers: Option<String>,
        /// This replica's number in --peers (default: the one whose address is --listen).
        #[arg(long, requires = "peers")]
        id: Option<u64>,
        /// Form a new master group: give it on every replica's first start, and never
        /// after (a replica refuses to start without it on an empty data directory, and
        /// with it on one that holds group state).
        #[arg(long, requires = "peers")]
        bootstrap: bool,
        /// Join a running master group as a new replica: give it on the replica's first
        /// start only, with a new --id and --peers naming the group's replicas and this
        /// one; then `tessera admin masters add ID ADDRESS` lets it in. It copies the
        /// group's state, and votes once the leader makes it a voter.
        #[arg(long, requires = "peers", conflicts_with = "bootstrap")]
        join: bool,
        /// Threads that run the master: its event loop is one thread whatever this says,
        /// and more threads serve its connections beside it. One (the default) is the
        /// fastest where cores are few or shared (measured by `scripts/bench-meta.sh`:
        /// a group of three replicas on two cores made 40 % more creates per second on
        /// one thread each than on two); give more on a machine of its own with many
        /// clients. Reading and syncing the store always runs on threads of its own.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        threads: u16,
        #[command(flatten)]
        knobs: Knobs,
        #[command(flatten)]
        security: Security,
    },
    /// Run a chunkserver: stores chunk replicas and serves reads and mutations.
    Chunkserver {
        /// The master's address, host:port.
        #[arg(long, env = "TESSERA_MASTER", default_value = DEV_MASTER, value_parser = server::master_list)]
        master: String,
        /// Where chunk files and their metadata live.
        #[arg(long)]
        data_dir: PathBuf,
        /// Address to serve on, host:port; also this server's identity to the master.
        #[arg(long)]
        listen: String,
        /// The rack this server sits in (replicas are spread across racks).
        #[arg(long, default_value = "rack0")]
        rack: String,
        #[command(flatten)]
        knobs: Knobs,
        #[command(flatten)]
        security: Security,
    },
    /// Run a whole cluster on this machine: a master and chunkservers on loopback, all in
    /// this one process (each server with its own port and data directory, under one
    /// directory). Ctrl-C stops it; run it again and the data is still there. To kill
    /// one server alone, start them as separate `tessera master` and `tessera
    /// chunkserver` processes instead.
    Dev {
        /// Where the cluster keeps its data.
        #[arg(long, default_value = "./tessera-dev")]
        dir: PathBuf,
        /// How many chunkservers.
        #[arg(long, default_value_t = 3)]
        chunkservers: usize,
        /// The master listens here; chunkservers on the ports after it.
        #[arg(long, default_value_t = 7070)]
        port: u16,
        /// Master replicas: 1 runs one master; 3 or 5 a replicated master group on the
        /// first ports (clients then take every address: TESSERA_MASTER=a,b,c).
        #[arg(long, default_value_t = 1)]
        masters: usize,
        /// No authentication (plain TCP; commands then need --insecure too). Without it
        /// the cluster makes its own authority and credentials under --dir, and puts an
        /// admin's where commands look by default.
        #[arg(long, env = "TESSERA_INSECURE")]
        insecure: bool,
        #[command(flatten)]
        knobs: Knobs,
    },
    /// List a directory (or show one file).
    Ls {
        path: String,
        /// Include deleted entries still recoverable.
        #[arg(long)]
        deleted: bool,
        /// Long form: permission bits, owner and group too, and when each entry last
        /// changed.
        #[arg(short, long)]
        long: bool,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Give files or directories other permission bits, in octal (`640`, `1777` for a
    /// sticky directory anyone may add to): the owner of each may, and an admin.
    Chmod {
        #[arg(value_parser = parse_mode)]
        mode: u32,
        #[arg(required = true)]
        paths: Vec<String>,
        /// Each directory's entries too, all the way down.
        #[arg(short = 'R', long)]
        recursive: bool,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Give files or directories another owner, and with OWNER:GROUP another group:
    /// only an admin may.
    Chown {
        owner: String,
        #[arg(required = true)]
        paths: Vec<String>,
        #[arg(short = 'R', long)]
        recursive: bool,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Give files or directories another group: the owner of each may, for a group its
    /// certificate puts it in, and an admin.
    Chgrp {
        group: String,
        #[arg(required = true)]
        paths: Vec<String>,
        #[arg(short = 'R', long)]
        recursive: bool,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Make directories (each in turn; every one that fails is said, and the exit
    /// status is 1 if any did).
    Mkdir {
        #[arg(required = true)]
        paths: Vec<String>,
        /// Make missing parents too; no error if it exists.
        #[arg(short, long)]
        parents: bool,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Copy a local file (or - for stdin) into Tessera. The file appears when complete
    /// (it is written as PATH._COPYING_.<random> and renamed); a failed put removes it
    /// (a put that is killed leaves that file, for `rm` to remove, and so does one whose
    /// directory is renamed meanwhile, under the directory's new name: the error says so).
    ///
    /// Onto an existing directory, the file goes under it with the local file's name
    /// (as cp does).
    ///
    /// Of two puts to one path at once, at most one succeeds, and the file then holds
    /// its bytes; the other fails with "already exists" and leaves nothing.
    Put {
        local: String,
        path: String,
        /// Replicas per chunk (0: the master's default).
        #[arg(long, default_value_t = 0)]
        replication: u32,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Copy a file out of Tessera to a local file (or - for stdout).
    Get {
        path: String,
        local: String,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Print a file to stdout.
    Cat {
        path: String,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Delete a file, or a directory with -r. Deleted entries stay recoverable for the
    /// GC delay (see `ls --deleted`).
    Rm {
        path: String,
        #[arg(short, long)]
        recursive: bool,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Rename a file or directory; onto an existing directory, move it under that
    /// directory with its own name (as mv does).
    Mv {
        src: String,
        dst: String,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Show a file's or directory's attributes.
    Stat {
        path: String,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Append a local file (or - for stdin) to the end of a file, creating it if needed.
    ///
    /// The master gives each append its place at the end: concurrent appends each land
    /// whole, in some order; an append that fails may leave a region of zeros of its
    /// length; do not mix with record appends on one file. A regular file is one
    /// append; from stdin each 16 MiB piece is an append of its own and lands whole
    /// (another appender's data may come between pieces).
    Append {
        local: String,
        path: String,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Read the traces servers write with --trace-dir.
    Trace {
        #[command(subcommand)]
        cmd: TraceCmd,
    },
    /// Replay from a trace.
    Replay {
        #[command(subcommand)]
        cmd: ReplayCmd,
    },
    /// Operator commands: the cluster report and fsck.
    Admin {
        #[command(subcommand)]
        cmd: AdminCmd,
        #[command(flatten)]
        m: MasterAddr,
    },
    /// Benchmarks against a running cluster.
    Bench {
        #[command(subcommand)]
        cmd: BenchCmd,
        #[command(flatten)]
        m: MasterAddr,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Metadata operations over RPC, as QFS's mstress: C clients each create N empty
    /// files in a directory of their own, stat them, list it, rename and delete them;
    /// operations per second and latency percentiles of each, for each C. Works in a
    /// directory of its own under /, removed at the end.
    Meta {
        /// Numbers of concurrent clients, one run each (comma-separated).
        #[arg(long, default_value = "1,16", value_delimiter = ',')]
        clients: Vec<usize>,
        /// Files per client.
        #[arg(long, default_value_t = 2000)]
        files: usize,
    },
}

#[derive(Subcommand)]
enum TraceCmd {
    /// Per method: calls, errors, bytes, and latency from arrival to reply (p50, p99,
    /// max); and the GFS paper's §6.3 breakdowns: reads, writes and record appends by
    /// size, and master requests by type. Each PATH is a --trace-dir, a node's trace
    /// directory in it, or one trace file.
    Summary {
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ReplayCmd {
    /// Rebuild a node from its trace's start record, feed it the recorded inputs with
    /// the recorded clock readings, and check that it produces the recorded effects.
    /// DIR is the node's trace directory (DIR/<role>-<address> of --trace-dir). Prints
    /// the first divergence with the records before it and exits 1; exits 2 if the
    /// trace cannot be read, 3 if nothing in it could be replayed. A master replays
    /// exactly; a chunkserver's trace keeps no file data, so its runs are counted, not
    /// replayed.
    Node {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum MastersCmd {
    /// Add replica ID, serving at ADDRESS and started with `tessera master --join`: it
    /// copies the group's state as a learner, and the leader makes it a voter once it
    /// holds everything committed. An id that was ever removed is refused.
    Add { id: u64, address: String },
    /// Remove replica ID from the group (to replace a lost one: remove it, then add a
    /// new replica under a new id). Not the leader: stop it first, so another leads.
    Remove { id: u64 },
}

#[derive(Subcommand)]
enum CertsCmd {
    /// Make a cluster authority in --ca: ca.pem (for every node and user) and
    /// ca-key.pem (keep it secret: whoever holds it can issue any identity).
    Init {
        #[arg(long, value_name = "DIR")]
        ca: PathBuf,
    },
    /// Issue credentials from the authority in --ca into --out (ca.pem, cert.pem,
    /// key.pem), for a master replica (--name is its replica id, 1 for a master that
    /// runs alone), a chunkserver (--name names its host: one live server per
    /// certificate), a client (a user, with --groups) or an admin.
    Issue {
        #[arg(long, value_name = "DIR")]
        ca: PathBuf,
        #[arg(long, value_parser = ["master", "chunkserver", "client", "admin"])]
        role: String,
        #[arg(long)]
        name: String,
        /// A client's groups, comma-separated.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// How long the credentials are valid.
        #[arg(long, default_value_t = tessera::tls::DEFAULT_DAYS)]
        days: u32,
    },
}

#[derive(Subcommand)]
enum AdminCmd {
    /// The cluster's authority and the credentials it issues (mutual TLS): no master is
    /// asked.
    Certs {
        #[command(subcommand)]
        cmd: CertsCmd,
    },
    /// Chunkservers (live or dead, rack, capacity and use, chunks held) and the health
    /// of all chunks: under-replicated, missing, copies awaiting deletion.
    Report,
    /// Each master replica's role, term, log position and lag behind the leader
    /// (asked of every address in --master); or a change of the group's members.
    Masters {
        #[command(subcommand)]
        change: Option<MastersCmd>,
    },
    /// Check a file or everything below a directory: each file's chunks, their versions,
    /// replica locations, and problems found. Exits 1 if any chunk is missing.
    Fsck {
        #[arg(default_value = "/")]
        path: String,
        /// List every file and chunk, not just those with problems.
        #[arg(long)]
        list: bool,
    },
}

/// mimalloc's purge delay for this process, unless the environment sets one.
const PURGE_DELAY_MS: &str = "10000";

/// Starts this program again with mimalloc's purge delay raised, unless it was set.
///
/// A chunkserver and the data commands allocate and free buffers of megabytes at a high
/// rate (every piece received, assembled or sent). With mimalloc's default (10 ms) freed
/// memory goes back to the kernel almost at once, and the next buffer faults in and
/// zeroes fresh pages: on the test machine that doubled a chunkserver's CPU per byte
/// written (measured: 4.1-4.5 s against 1.8-2.5 s of CPU per GiB put). Memory freed
/// after a burst still returns to the system, ten seconds later. mimalloc reads its
/// options from the environment when the process starts, so the setting is made by
/// starting again (the same process id; nothing has run yet).
fn tune_allocator() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("MIMALLOC_PURGE_DELAY", PURGE_DELAY_MS)
        .exec();
    // exec returns only if it failed: run untuned.
    eprintln!("tessera: could not restart with allocator settings ({err}); continuing");
}

/// The options every client command shares, which a user may also give before the
/// command (`tessera --master a,b,c ls /`, as `hdfs dfs -fs X -ls /` reads).
const SHARED_OPTIONS: [&str; 2] = ["--master", "--retry-for"];

/// `tessera --master X ls /` as `tessera ls --master X /`: the shared options given before
/// the command move to just after it, where clap takes them. Anything else is left where
/// it is, for clap to judge (so `tessera --master X dev` is refused: dev takes none).
fn options_after_command(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut moved = Vec::new();
    let mut i = 1;
    while i < args.len() {
        let Some(a) = args[i].to_str() else { break };
        if SHARED_OPTIONS
            .iter()
            .any(|o| a.starts_with(&format!("{o}=")))
        {
            moved.push(args[i].clone());
            i += 1;
        } else if SHARED_OPTIONS.contains(&a) && i + 1 < args.len() {
            moved.extend_from_slice(&args[i..i + 2]);
            i += 2;
        } else {
            break;
        }
    }
    // Only before a command that takes them (not `help`, not `--`): otherwise clap says
    // what is wrong with the line as it was typed (`tessera --master ls /`).
    let is_command = args.get(i).and_then(|a| a.to_str()).is_some_and(|name| {
        name != "help"
            && <Cli as clap::CommandFactory>::command()
                .find_subcommand(name)
                .is_some()
    });
    if moved.is_empty() || !is_command {
        return args;
    }
    // Just after the command: `admin` and `bench` take them there for their own
    // subcommands too.
    let mut out = vec![args[0].clone(), args[i].clone()];
    out.extend(moved);
    out.extend_from_slice(&args[i + 1..]);
    out
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse_from(options_after_command(std::env::args_os().collect()));
    // Reading traces needs no runtime and no logging set-up.
    match cli.cmd {
        Cmd::Trace {
            cmd: TraceCmd::Summary { paths, json },
        } => return tessera::traces::summary(&paths, json),
        Cmd::Replay {
            cmd: ReplayCmd::Node { dir },
        } => return tessera::traces::replay_node(&dir),
        _ => {}
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG").unwrap_or_else(|_| {
        let servers = matches!(
            cli.cmd,
            Cmd::Master { .. } | Cmd::Chunkserver { .. } | Cmd::Dev { .. }
        );
        tracing_subscriber::EnvFilter::new(if servers { "info" } else { "warn" })
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // A master runs on the threads it is given (`--threads`); every other command on
    // one worker per core.
    let mut b = match cli.cmd {
        Cmd::Master { threads: 1, .. } => tokio::runtime::Builder::new_current_thread(),
        Cmd::Master { threads, .. } => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(threads.into());
            b
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let rt = match b.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tessera: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The command runs as a task on the runtime's workers, not on this thread: the
    // tasks it wakes (and that wake it) run on the same threads, and a wake-up that
    // crosses threads costs more than the work of most requests.
    let result = rt.block_on(async move {
        match tokio::spawn(run(cli.cmd)).await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(format!("the command's task was cancelled: {e}")),
        }
    });
    // Not waiting long for work on the blocking threads (a checkpoint being built):
    // every stop is a crash, and the next start recovers from the store. But the tasks
    // are dropped, and the stores they hold closed, before the process exits: a store
    // still closing on a worker thread while the process exits aborts it ("pthread lock:
    // Invalid argument", seen on `tessera dev` stopped by Ctrl-C).
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The master a file command talks to and how long it keeps trying, for its error
/// messages (one command, one master).
static TALKING_TO: std::sync::OnceLock<MasterAddr> = std::sync::OnceLock::new();

fn client(m: &MasterAddr) -> Client<TokioRuntime, GrpcTransport> {
    let _ = TALKING_TO.set(m.clone());
    if let Some(why) = unresolvable(&m.master) {
        eprintln!("tessera: no master address resolves: {why}; check --master or TESSERA_MASTER");
        std::process::exit(1);
    }
    let mut cfg = ClientConfig::new(&m.master);
    cfg.rpc_timeout = Duration::from_secs(10);
    cfg.retry_for = m.retry_for;
    cfg.umask = m.umask;
    // Each step of a command keeps trying for --retry-for. Not `Client::until`: a hard
    // end for the whole command would fail a long put, get or streamed append at the
    // first failover after it (a review found this).
    Client::new(TokioRuntime, net(m), cfg)
}

/// `tessera admin certs`.
fn certs(cmd: CertsCmd) -> Result<(), String> {
    match cmd {
        CertsCmd::Init { ca } => {
            tessera::tls::init_ca(&ca, &ca.display().to_string()).map_err(|e| e.to_string())?;
            println!(
                "made a cluster authority in {}: give ca.pem to every node and user, keep \
                 ca-key.pem secret",
                ca.display()
            );
            Ok(())
        }
        CertsCmd::Issue {
            ca,
            role,
            name,
            groups,
            out,
            days,
        } => {
            let label = if role == "client" && !groups.is_empty() {
                format!("client:{name}:{}", groups.join(","))
            } else {
                format!("{role}:{name}")
            };
            let who = Caller::parse(&label).map_err(|e| format!("--name/--groups: {e}"))?;
            tessera::tls::issue(&ca, &who, days, &out).map_err(|e| e.to_string())?;
            println!(
                "issued {} in {}, valid for {days} days",
                who.label(),
                out.display()
            );
            Ok(())
        }
    }
}

/// The transport a file or admin command talks with: mutually authenticated with the
/// user's credentials (`--certs`, or the default directory), or insecure with
/// `--insecure`. A command that has none says so and exits.
fn net(m: &MasterAddr) -> GrpcTransport {
    let made = m.security.user().and_then(|c| {
        GrpcTransport::maybe_secured(Default::default(), c.as_ref()).map_err(|e| e.to_string())
    });
    match made {
        Ok(t) => t,
        Err(e) => {
            eprintln!("tessera: {e}");
            std::process::exit(1);
        }
    }
}

/// Why none of a master list's host names resolves, if none does: a slip in the name,
/// said at once, where a master that is down is retried for `--retry-for`. A resolver
/// that fails for now ("temporary failure") counts as resolving: the calls retry it. One
/// name that resolves is enough (the group's other replicas may be down or renamed).
fn unresolvable(list: &str) -> Option<String> {
    let mut why = Vec::new();
    for a in list.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        match std::net::ToSocketAddrs::to_socket_addrs(a) {
            Ok(_) => return None,
            Err(e) if e.to_string().to_lowercase().contains("temporary") => return None,
            Err(e) => why.push(format!("{a} ({e})")),
        }
    }
    (!why.is_empty()).then(|| why.join(", "))
}

/// Writes `bytes` to stdout. A reader that went away (`| head`) ends the command there,
/// quietly and with success, as `cat` ends; any other failure to write is an error.
fn out(bytes: impl AsRef<[u8]>) {
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_all(bytes.as_ref()).and_then(|()| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("tessera: stdout: {e}");
        std::process::exit(1);
    }
}

/// `tessera ls`: a directory's entries, page by page, or a file's own line.
async fn ls(
    c: &Client<TokioRuntime, GrpcTransport>,
    path: &str,
    deleted: bool,
    long: bool,
) -> Result<(), String> {
    let st = c.stat(path).await.map_err(|e| say(e, path))?;
    let print = |entries: Vec<tessera_core::pb::FileInfo>| {
        let mut page = String::new();
        for e in entries {
            let kind = if e.is_dir { "d" } else { "-" };
            if long {
                let bits = tessera_core::master::perms::mode_string(e.mode);
                let modified = match e.mtime_ms {
                    0 => "-".to_string(),
                    ms => humantime::format_rfc3339_seconds(
                        std::time::UNIX_EPOCH + Duration::from_millis(ms),
                    )
                    .to_string(),
                };
                page.push_str(&format!(
                    "{kind}{bits} {:<10} {:<10} {:>3} {:>14} {:>6} {modified:>20} {}\n",
                    e.owner, e.group, e.replication, e.length, e.chunk_count, e.path
                ));
            } else {
                page.push_str(&format!(
                    "{kind} {:>3} {:>14} {:>6} {}\n",
                    e.replication, e.length, e.chunk_count, e.path
                ));
            }
        }
        out(page);
    };
    if st.is_dir {
        // Each page printed as it arrives.
        c.list_pages(path, deleted, print)
            .await
            .map_err(|e| say(e, path))?;
    } else {
        print(vec![st]);
    }
    Ok(())
}

/// `tessera chmod`, `chown`, `chgrp`: each path in turn (with `recursive`, each
/// directory's entries after it, all the way down); every one that fails is said, and
/// the command fails if any did.
async fn set_permissions(
    c: &Client<TokioRuntime, GrpcTransport>,
    paths: &[String],
    recursive: bool,
    owner: Option<&str>,
    group: Option<&str>,
    mode: Option<u32>,
) -> Result<(), String> {
    let mut failed = Vec::new();
    for top in paths {
        let mut todo = vec![top.clone()];
        while let Some(path) = todo.pop() {
            if let Err(e) = c.set_permissions(&path, owner, group, mode).await {
                failed.push(say(e, &path));
                continue;
            }
            if !recursive {
                continue;
            }
            match c.stat(&path).await {
                Ok(s) if s.is_dir => {}
                Ok(_) => continue,
                Err(e) => {
                    failed.push(say(e, &path));
                    continue;
                }
            }
            let mut below = Vec::new();
            if let Err(e) = c
                .list_pages(&path, false, |page| {
                    below.extend(page.into_iter().map(|e| e.path))
                })
                .await
            {
                failed.push(say(e, &path));
            }
            // Popped in name order.
            todo.extend(below.into_iter().rev());
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("\ntessera: "))
    }
}

/// Says on stderr that a shadow master answered a read of the command (the leader did
/// not): what it showed may lag the leader's state, by as much as it says.
fn note_shadow(c: &Client<TokioRuntime, GrpcTransport>) {
    if let Some(s) = c.last_shadow_answer() {
        let lag = if s.lag_ms == u64::MAX {
            "not known to be current since it started".to_string()
        } else {
            format!("up to {} ms behind", s.lag_ms)
        };
        eprintln!(
            "tessera: the leader did not answer; shadow master {} (replica {}) did, from log \
             record {}, {lag}",
            s.address, s.replica, s.seq
        );
    }
}

/// Errors as a user should read them, with a hint that fits: an unreachable master on
/// this machine's dev address most likely means no dev cluster runs; one elsewhere, or
/// a chunkserver, is a cluster in trouble, not a missing one.
fn say(e: FsError, what: &str) -> String {
    let (master, patience) = match TALKING_TO.get() {
        Some(m) => (m.master.as_str(), humantime::format_duration(m.retry_for)),
        None => (
            DEV_MASTER,
            humantime::format_duration(Duration::from_secs(120)),
        ),
    };
    match e {
        FsError::Unavailable(m)
            if m.contains(&format!("cannot reach {master}"))
                || m.contains(&format!("calling {master}")) =>
        {
            if master == DEV_MASTER {
                format!(
                    "{what}: no master answers at {master} ({m}, for {patience}); is the dev cluster running? (`tessera dev` or ./scripts/dev.sh starts it; --master or TESSERA_MASTER names another)"
                )
            } else {
                format!(
                    "{what}: the master at {master} did not answer for {patience} ({m}); is it running, and is that its address? (--retry-for waits longer)"
                )
            }
        }
        FsError::Unavailable(m)
            if master.contains(',')
                && master.split(',').any(|a| {
                    m.contains(&format!("cannot reach {a}")) || m.contains(&format!("calling {a}"))
                })
                || master.contains(',') && m.contains("no leader") =>
        {
            format!(
                "{what}: no replica of the master group at {master} led within {patience} ({m}); `tessera admin masters` shows each replica's role (a group takes changes only while a majority of its replicas run and reach each other; --retry-for waits longer)"
            )
        }
        FsError::NotLeader(l) if l.is_empty() => format!(
            "{what}: no replica of the master group at {master} led within {patience} (those that answered know no leader); `tessera admin masters` shows each replica's role (a group takes changes only while a majority of its replicas run and reach each other; --retry-for waits longer)"
        ),
        FsError::Unavailable(m) if m.contains("deadline") || m.contains("cannot reach") => {
            format!(
                "{what}: a server did not answer for {patience} ({m}); `tessera admin report` shows which servers are down (--retry-for waits longer)"
            )
        }
        FsError::Unavailable(m) if m.contains("failed their checksums") => format!(
            "{what}: {m}, after {patience}: its data is lost unless a server holding a good copy comes back (`tessera admin report` shows which servers are down; `tessera admin fsck {what}` shows the chunk)"
        ),
        FsError::Unavailable(m) if m.contains("no live replica") => format!(
            "{what}: {m} after {patience}: every server holding it is down or has not reported since the master started; `tessera admin fsck {what}` shows where its copies are"
        ),
        // The address given for the master's is a chunkserver's (its answer says so).
        FsError::InvalidArgument(m)
            if m.contains(" is a chunkserver, and this is no chunkserver request") =>
        {
            let cs = m
                .strip_prefix("malformed request: ")
                .and_then(|r| r.split(" is a chunkserver").next())
                .unwrap_or(master);
            format!(
                "{what}: {cs} is a chunkserver, not a master: --master (or TESSERA_MASTER) must name the cluster's master, or every replica of its master group (`tessera admin report` on the master lists the chunkservers)"
            )
        }
        // "/a: already exists", not "/a: already exists: /a".
        e => {
            let (full, msg) = (e.to_string(), e.to_pb().message);
            let kind = full
                .strip_suffix(msg.as_str())
                .and_then(|k| k.strip_suffix(": "));
            match kind {
                Some(kind) if msg == what => format!("{what}: {kind}"),
                Some(kind) => match msg.strip_prefix(what).and_then(|r| r.strip_prefix(": ")) {
                    Some(rest) => format!("{what}: {kind}: {rest}"),
                    None => format!("{what}: {full}"),
                },
                None => format!("{what}: {full}"),
            }
        }
    }
}

/// Whether the local source of a put or append can be read, checked before anything in
/// Tessera is made for it: a missing file must not leave a file (or a deleted
/// `._COPYING_` entry) behind.
fn readable(local: &str) -> Result<(), String> {
    if local == "-" {
        return Ok(());
    }
    // Not opened: opening and closing a named pipe here would leave its writer with no
    // reader.
    let meta = std::fs::metadata(local).map_err(|e| format!("{local}: {e}"))?;
    if meta.is_dir() {
        return Err(format!("{local}: is a directory"));
    }
    Ok(())
}

/// `to` as a command that copies or moves `from` there means it: an existing directory
/// takes the entry under `from`'s own name, as cp and mv do. `moving`: `from` is a path
/// in Tessera (mv), which may be a directory, and a directory may go to a missing `to/`.
async fn into_dir(c: &Tessera, from: &str, to: &str, moving: bool) -> Result<String, String> {
    match c.stat(to).await {
        Ok(st) if st.is_dir => {
            let name = from.trim_end_matches('/').rsplit('/').next().unwrap_or("");
            if name.is_empty() || name == "-" {
                return Err(format!("{to}: is a directory"));
            }
            Ok(format!("{}/{name}", to.trim_end_matches('/')))
        }
        // `to/` names a directory: no file is made or replaced there, as with cp and mv;
        // a directory may be moved to a new name written so.
        Ok(_) if names_dir(to) => Err(format!("{to}: not a directory")),
        // Asked only then, so a master that does not answer is waited for once.
        Err(FsError::NotFound(_)) if names_dir(to) && moving => match c.stat(from).await {
            Ok(st) if st.is_dir => Ok(to.to_string()),
            Ok(_) => Err(format!("{to}: not a directory")),
            Err(e) => Err(say(e, from)),
        },
        Err(FsError::NotFound(_)) if names_dir(to) => Err(format!("{to}: not a directory")),
        Err(FsError::NotFound(_)) | Ok(_) => Ok(to.to_string()),
        // The master did not answer, or `to` cannot be a path: said once, now, not
        // after a second wait by the command itself.
        Err(e) => Err(say(e, to)),
    }
}

/// Whether `path` names a directory by its form: a trailing slash, as in `/a/b/`.
fn names_dir(path: &str) -> bool {
    path.len() > 1 && path.ends_with('/')
}

/// A path written with a trailing slash must name a directory, as it must for ls, rm and
/// mv: `/a/f/` is no way to name the file `/a/f`. (One stat, for such paths only.)
async fn slash_means_dir(c: &Tessera, path: &str) -> Result<(), String> {
    if !names_dir(path) {
        return Ok(());
    }
    match c.stat(path).await {
        Ok(st) if !st.is_dir => Err(format!("{path}: not a directory")),
        Ok(_) | Err(FsError::NotFound(_)) => Ok(()),
        Err(e) => Err(say(e, path)),
    }
}

async fn run(cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Master {
            data_dir,
            listen,
            peers: None,
            knobs,
            security,
            ..
        } => {
            let c = security.server("master", |c| matches!(c, Caller::Master { .. }))?;
            server::run_master(data_dir, listen, &knobs, c).await
        }
        Cmd::Master {
            data_dir,
            listen,
            peers,
            id,
            bootstrap,
            join,
            knobs,
            security,
            ..
        } => {
            let members = server::parse_peers(peers.as_deref().unwrap_or(&listen))?;
            let id = match id {
                Some(id) => id,
                None => members
                    .iter()
                    .find(|(_, a)| **a == listen)
                    .map(|(&i, _)| i)
                    .ok_or_else(|| format!("--listen {listen} is not in --peers; give --id"))?,
            };
            let c = security.server(&format!("master replica {id}"), |c| {
                *c == Caller::Master { replica: id }
            })?;
            server::run_replica(data_dir, id, members, bootstrap, join, &knobs, c).await
        }
        Cmd::Chunkserver {
            master,
            data_dir,
            listen,
            rack,
            knobs,
            security,
        } => {
            let c = security.server("chunkserver", |c| matches!(c, Caller::Chunkserver { .. }))?;
            server::run_chunkserver(data_dir, listen, master, rack, &knobs, c).await
        }
        Cmd::Dev {
            dir,
            chunkservers,
            port,
            masters,
            insecure,
            knobs,
        } => tessera::dev::run(dir, chunkservers, masters, port, &knobs, insecure).await,
        Cmd::Ls {
            path,
            deleted,
            long,
            m,
        } => {
            let c = client(&m);
            slash_means_dir(&c, &path).await?;
            let done = ls(&c, &path, deleted, long).await;
            note_shadow(&c);
            done
        }
        Cmd::Chmod {
            mode,
            paths,
            recursive,
            m,
        } => {
            let c = client(&m);
            set_permissions(&c, &paths, recursive, None, None, Some(mode)).await
        }
        Cmd::Chown {
            owner,
            paths,
            recursive,
            m,
        } => {
            let c = client(&m);
            let (owner, group) = match owner.split_once(':') {
                Some((o, g)) => (o.to_string(), Some(g.to_string())),
                None => (owner, None),
            };
            let group = group.filter(|g| !g.is_empty());
            let owner = Some(owner).filter(|o| !o.is_empty());
            if owner.is_none() && group.is_none() {
                return Err("chown: name an owner, OWNER:GROUP or :GROUP".into());
            }
            set_permissions(
                &c,
                &paths,
                recursive,
                owner.as_deref(),
                group.as_deref(),
                None,
            )
            .await
        }
        Cmd::Chgrp {
            group,
            paths,
            recursive,
            m,
        } => {
            let c = client(&m);
            set_permissions(&c, &paths, recursive, None, Some(&group), None).await
        }
        Cmd::Mkdir { paths, parents, m } => {
            let c = client(&m);
            let mut failed = Vec::new();
            for path in &paths {
                if let Err(e) = c.mkdir(path, parents).await {
                    failed.push(say(e, path));
                }
            }
            if failed.is_empty() {
                Ok(())
            } else {
                Err(failed.join("\ntessera: "))
            }
        }
        Cmd::Rm { path, recursive, m } => {
            let c = client(&m);
            slash_means_dir(&c, &path).await?;
            c.delete(&path, recursive).await.map_err(|e| say(e, &path))
        }
        Cmd::Mv { src, dst, m } => {
            let c = client(&m);
            slash_means_dir(&c, &src).await?;
            let dst = into_dir(&c, &src, &dst, true).await?;
            if dst.trim_end_matches('/') == src.trim_end_matches('/') {
                return Err(match c.stat(&src).await {
                    Ok(_) => format!("{src}: is already there"),
                    Err(e) => say(e, &src),
                });
            }
            c.rename(&src, &dst).await.map_err(|e| match e {
                FsError::AlreadyExists(_) => format!("{dst}: already exists"),
                // Named after the path it is about: a missing parent of the destination
                // is not a missing source.
                e => {
                    let msg = e.to_pb().message;
                    let to = dst.trim_end_matches('/');
                    // The master's "`to`: parent `p`" (not "`p`", which may be an
                    // ancestor of the source as well).
                    let about_dst = msg.starts_with(&format!("{to}: "));
                    say(e, if about_dst { to } else { &src })
                }
            })
        }
        Cmd::Stat { path, m } => {
            let c = client(&m);
            let s = c.stat(&path).await.map_err(|e| say(e, &path));
            note_shadow(&c);
            let s = s?;
            if !s.is_dir && names_dir(&path) {
                return Err(format!("{path}: not a directory"));
            }
            // The root was never made by a request, so it has no time of its own: "-",
            // not the epoch.
            let modified = match s.mtime_ms {
                0 => "-".to_string(),
                ms => humantime::format_rfc3339_millis(
                    std::time::UNIX_EPOCH + Duration::from_millis(ms),
                )
                .to_string(),
            };
            out(format!(
                "path: {}\ntype: {}\nlength: {}\nreplication: {}\nchunks: {}\nmodified_ms: {}\nmodified: {}\nowner: {}\ngroup: {}\nmode: {:04o} ({})\n",
                s.path,
                if s.is_dir { "directory" } else { "file" },
                s.length,
                s.replication,
                s.chunk_count,
                s.mtime_ms,
                modified,
                s.owner,
                s.group,
                s.mode,
                tessera_core::master::perms::mode_string(s.mode),
            ));
            Ok(())
        }
        Cmd::Put {
            local,
            path,
            replication,
            m,
        } => {
            // Written under a temporary name and renamed when complete, so the file
            // appears whole or not at all; a failed put removes what it wrote.
            let c = client(&m);
            readable(&local)?;
            let path = into_dir(&c, &local, &path, false).await?;
            c.put_with(&path, replication, |tmp| {
                let (c, local, path) = (&c, &local, &path);
                async move {
                    copy_in(c, local, &tmp, Dest::At(0))
                        .await
                        .map_err(|e| e.replace(&tmp, path))
                }
            })
            .await
            .map_err(|e| {
                let said = |e: PutError<String>| match e {
                    PutError::Fs(FsError::AlreadyExists(_)) => format!("{path}: already exists"),
                    PutError::Fs(e) => say(e, &path),
                    PutError::Write(e) => e,
                    left @ PutError::Left { .. } => left.to_string(),
                };
                match e {
                    PutError::Left { failed, name } => {
                        format!(
                            "{}{}",
                            said(*failed),
                            tessera_core::client::left_note(&name)
                        )
                    }
                    e => said(e),
                }
            })
        }
        Cmd::Append { local, path, m } => {
            let c = client(&m);
            readable(&local)?;
            if names_dir(&path) {
                return Err(format!(
                    "{path}: a trailing slash names a directory; append names a file"
                ));
            }
            match c.stat(&path).await {
                Ok(_) => {}
                Err(FsError::NotFound(_)) => match c.create(&path, 0).await {
                    // Another appender made it first.
                    Ok(()) | Err(FsError::AlreadyExists(_)) => {}
                    Err(e) => return Err(say(e, &path)),
                },
                Err(e) => return Err(say(e, &path)),
            }
            copy_in(&c, &local, &path, Dest::Append).await
        }
        Cmd::Get { path, local, m } => {
            let c = client(&m);
            let done = copy_out(&c, &path, &local).await;
            note_shadow(&c);
            done
        }
        Cmd::Trace { .. } | Cmd::Replay { .. } => unreachable!("handled before the runtime"),
        Cmd::Bench {
            cmd: BenchCmd::Meta { clients, files },
            m,
        } => {
            let _ = TALKING_TO.set(m.clone());
            let phases = tessera::bench_meta::run(&m.master, &clients, files, &net(&m)).await?;
            out(tessera::bench_meta::text(&phases));
            Ok(())
        }
        Cmd::Admin {
            cmd: AdminCmd::Certs { cmd },
            ..
        } => certs(cmd),
        Cmd::Admin {
            cmd: AdminCmd::Report,
            m,
        } => {
            let c = client(&m);
            let r = c.report().await.map_err(|e| say(e, "report"));
            note_shadow(&c);
            let r = r?;
            out(tessera::admin::report_text(&r));
            // Only a master that runs as this command does answers it: a secured one
            // takes no plain connection, an insecure one no TLS.
            out(&match m.security.user() {
                Ok(Some(c)) => format!("security: mutual TLS (this command as {})\n", c.caller),
                _ => "security: NONE (--insecure): anyone who reaches a port may read, change \
                      or delete anything\n"
                    .to_string(),
            });
            Ok(())
        }
        Cmd::Admin {
            cmd: AdminCmd::Masters { change: Some(c) },
            m,
        } => {
            // Asking again is answered as done (a lost answer); say so rather than nothing.
            if let MastersCmd::Add { id, address } = &c {
                let rows = tessera::admin::masters(&m.master, &net(&m)).await;
                let member = rows.iter().any(|(_, r)| {
                    r.as_ref().is_ok_and(|s| {
                        s.members
                            .get(id)
                            .is_some_and(|a| a.trim() == address.trim())
                    })
                });
                if member {
                    eprintln!("replica {id} is a member at {address} already: nothing to do");
                }
            }
            let req = match c {
                MastersCmd::Add { id, address } => pb::ChangeMembersRequest {
                    add: id,
                    address,
                    remove: 0,
                },
                MastersCmd::Remove { id } => pb::ChangeMembersRequest {
                    add: 0,
                    address: String::new(),
                    remove: id,
                },
            };
            client(&m)
                .change_members(req)
                .await
                .map_err(|e| say(e, "the master group"))?;
            let rows = tessera::admin::masters(&m.master, &net(&m)).await;
            out(tessera::admin::masters_text(&rows));
            Ok(())
        }
        Cmd::Admin {
            cmd: AdminCmd::Masters { change: None },
            m,
        } => {
            let rows = tessera::admin::masters(&m.master, &net(&m)).await;
            out(tessera::admin::masters_text(&rows));
            match tessera::admin::masters_problem(&m.master, &rows) {
                Some(p) => Err(p),
                None => Ok(()),
            }
        }
        Cmd::Admin {
            cmd: AdminCmd::Fsck { path, list },
            m,
        } => {
            // Each page's files printed as it arrives, the totals last.
            let (mut listed, mut last) = (false, String::new());
            let r = client(&m)
                .fsck_pages(&path, list, |files| {
                    listed |= !files.is_empty();
                    out(tessera::admin::fsck_files_text(&files, &mut last));
                })
                .await
                .map_err(|e| say(e, &path))?;
            if listed {
                out("\n");
            }
            out(tessera::admin::fsck_summary_text(&path, &r));
            if r.missing > 0 {
                return Err(format!("{path}: {} chunks missing", r.missing));
            }
            Ok(())
        }
        Cmd::Cat { path, m } => {
            let c = client(&m);
            let done = copy_out(&c, &path, "-").await;
            note_shadow(&c);
            done
        }
    }
}

fn bar(len: Option<u64>) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let b = match len {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{bytes}/{total_bytes} {bytes_per_sec} {wide_bar} {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(b)
}

/// The ranges [start, end) that `[at, at + len)` splits into at chunk boundaries.
fn chunk_ranges(at: u64, len: u64, chunk: u64) -> Vec<(u64, u64)> {
    let end = at + len;
    let mut out = Vec::new();
    let mut pos = at;
    while pos < end {
        let next = ((pos / chunk) + 1) * chunk;
        out.push((pos, next.min(end)));
        pos = next.min(end);
    }
    out
}

type Tessera = Client<TokioRuntime, GrpcTransport>;

/// Runs `work` on every range, `PARALLEL` at a time, each range in order within itself;
/// the first error stops the rest.
async fn for_each_range<F, Fut>(ranges: Vec<(u64, u64)>, work: F) -> Result<(), String>
where
    F: Fn(u64, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
{
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let ranges = Arc::new(ranges);
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let work = Arc::new(work);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..PARALLEL {
        let (ranges, next, failed, work) =
            (ranges.clone(), next.clone(), failed.clone(), work.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ranges.len() || failed.load(Ordering::Relaxed) {
                    return Ok(());
                }
                let (start, end) = ranges[i];
                if let Err(e) = work(start, end).await {
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        });
    }
    let mut first = Ok(());
    while let Some(r) = tasks.join_next().await {
        let r = r
            .map_err(|e| format!("internal error: {e}"))
            .and_then(|r| r);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// Where `copy_in` writes.
#[derive(Clone, Copy)]
enum Dest {
    /// From this offset on.
    At(u64),
    /// At the file's end, in a region the master reserves: the whole length of a regular
    /// file at once, a stream's pieces one by one.
    Append,
}

/// Writes `local` (or stdin) into `path`. A regular file is written a chunk per task,
/// several chunks at once (each chunk's replicas are a pipeline of their own, so this
/// keeps the disks and the network busy); stdin in order.
async fn copy_in(c: &Tessera, local: &str, path: &str, dest: Dest) -> Result<(), String> {
    if local == "-" {
        return copy_in_stream(c, Box::new(std::io::stdin()), local, path, dest, None).await;
    }
    let f = std::fs::File::open(local).map_err(|e| format!("{local}: {e}"))?;
    let meta = f.metadata().map_err(|e| format!("{local}: {e}"))?;
    if !meta.is_file() {
        return copy_in_stream(c, Box::new(f), local, path, dest, None).await;
    }
    let len = meta.len();
    if matches!(dest, Dest::Append) && len == 0 {
        return Ok(());
    }
    // Just created, perhaps: the leader knows it, a shadow may not yet. Asked before an
    // append reserves its range, so nothing but the writes can fail after it.
    let chunk = c
        .chunk_size_to_write(path)
        .await
        .map_err(|e| say(e, path))?;
    let at = match dest {
        Dest::At(at) => at,
        Dest::Append => c
            .reserve_append(path, len)
            .await
            .map_err(|e| say(e, path))?,
    };
    let progress = bar(Some(len));
    drop(f);
    let (c2, path2, local2, bar2) = (
        c.clone(),
        path.to_string(),
        local.to_string(),
        progress.clone(),
    );
    let done = for_each_range(chunk_ranges(at, len, chunk), move |start, end| {
        let (c, path, local, bar) = (c2.clone(), path2.clone(), local2.clone(), bar2.clone());
        async move {
            use std::io::Seek;
            // A handle of the range's own, read in order into fresh buffers (no zero fill).
            // (Opened again: a duplicated descriptor would share the file position.)
            let mut f = std::fs::File::open(&local).map_err(|e| format!("{local}: {e}"))?;
            f.seek(std::io::SeekFrom::Start(start - at))
                .map_err(|e| format!("{local}: {e}"))?;
            let mut pos = start;
            while pos < end {
                let n = (end - pos).min(PIECE as u64) as usize;
                let mut buf = Vec::with_capacity(n);
                (&mut f)
                    .take(n as u64)
                    .read_to_end(&mut buf)
                    .map_err(|e| format!("{local}: {e}"))?;
                if buf.len() < n {
                    return Err(format!("{local}: shorter than it was ({pos} bytes in)"));
                }
                c.write(&path, pos, Bytes::from(buf))
                    .await
                    .map_err(|e| say(e, &path))?;
                pos += n as u64;
                if let Some(b) = &bar {
                    b.inc(n as u64);
                }
            }
            Ok(())
        }
    })
    .await;
    if let Some(b) = progress {
        b.finish_and_clear();
    }
    done.map_err(|e| match dest {
        // The file's length took in the whole range when it was reserved.
        Dest::Append => format!(
            "{e}; the append failed part way: {path} now holds the {len} bytes reserved \
             for it at offset {at}, some of which may not hold {local}'s bytes (they read \
             as zeros or as a part written)"
        ),
        Dest::At(_) => e,
    })
}

/// Writes a stream into `path`, in pieces, in order: from an offset on, or each piece
/// appended on its own (the length is not known ahead).
async fn copy_in_stream(
    c: &Tessera,
    mut input: Box<dyn Read + Send>,
    local: &str,
    path: &str,
    dest: Dest,
    len: Option<u64>,
) -> Result<(), String> {
    let progress = bar(len);
    let mut done = 0;
    let mut buf = vec![0u8; PIECE];
    loop {
        let mut n = 0;
        while n < PIECE {
            match input.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("{local}: {e}")),
            }
        }
        if n == 0 {
            break;
        }
        let piece = Bytes::copy_from_slice(&buf[..n]);
        match dest {
            Dest::At(at) => c.write(path, at + done, piece).await.map(|_| ()),
            Dest::Append => c.append(path, piece).await.map(|_| ()),
        }
        .map_err(|e| match dest {
            // Each piece is an append of its own: those before it are whole.
            Dest::Append => format!(
                "{}; the append failed: {path} holds the first {done} bytes of {}, and \
                 after them perhaps a part of the next {n} (an append that fails may leave \
                 its region written in part, or as zeros)",
                say(e, path),
                if local == "-" { "stdin" } else { local }
            ),
            Dest::At(_) => say(e, path),
        })?;
        done += n as u64;
        if let Some(b) = &progress {
            b.set_position(done);
        }
        if n < PIECE {
            break;
        }
    }
    if let Some(b) = progress {
        b.finish_and_clear();
    }
    Ok(())
}

/// Reads `path` whole into `local` (or stdout), several pieces at once: into a local
/// file a chunk per task, to stdout in order with the next pieces read ahead.
async fn copy_out(c: &Tessera, path: &str, local: &str) -> Result<(), String> {
    let st = c.stat(path).await.map_err(|e| say(e, path))?;
    if st.is_dir {
        return Err(format!("{path}: is a directory"));
    }
    if names_dir(path) {
        return Err(format!("{path}: not a directory"));
    }
    if local == "-" {
        // In order, but with the next pieces already on their way.
        use futures::StreamExt;
        let pieces = (0..st.length.div_ceil(READ_PIECE)).map(|i| {
            let (c, path) = (c.clone(), path.to_string());
            async move {
                let off = i * READ_PIECE;
                c.read(&path, off, READ_PIECE)
                    .await
                    .map_err(|e| say(e, &path))
            }
        });
        let mut pieces = futures::stream::iter(pieces).buffered(READ_AHEAD);
        while let Some(data) = pieces.next().await {
            out(data?);
        }
        return Ok(());
    }
    // Into a directory: under the file's own name there, as cp does.
    let local = match std::fs::metadata(local) {
        Ok(m) if m.is_dir() => {
            let name = path.rsplit('/').next().unwrap_or(path);
            std::path::Path::new(local)
                .join(name)
                .to_string_lossy()
                .into_owned()
        }
        _ => local.to_string(),
    };
    // Through a symbolic link, as cp writes: the link stays, its target gets the bytes.
    let local = match std::fs::symlink_metadata(&local) {
        Ok(m) if m.file_type().is_symlink() => match std::fs::canonicalize(&local) {
            Ok(target) => target.to_string_lossy().into_owned(),
            // A dangling link: the file it names, made now.
            Err(_) => match std::fs::read_link(&local) {
                Ok(t) => std::path::Path::new(&local)
                    .parent()
                    .unwrap_or(std::path::Path::new("."))
                    .join(t)
                    .to_string_lossy()
                    .into_owned(),
                Err(e) => return Err(format!("{local}: {e}")),
            },
        },
        _ => local,
    };
    let local = local.as_str();
    // A regular file (or none yet) is written whole beside it and renamed over it at the
    // end, so a get that fails leaves what was there as it was. Anything else (a device,
    // a pipe) is written into directly.
    let existing = std::fs::metadata(local).ok();
    let direct = existing.as_ref().is_some_and(|m| !m.is_file());
    let into = if direct {
        local.to_string()
    } else {
        let p = std::path::Path::new(local);
        let name = p
            .file_name()
            .map_or_else(|| local.into(), |n| n.to_string_lossy());
        p.with_file_name(format!(".{name}.tessera-get-{}", std::process::id()))
            .to_string_lossy()
            .into_owned()
    };
    let done = copy_out_into(c, path, &into, local, st.length).await;
    if direct {
        return done;
    }
    let done = done.and_then(|()| {
        if let Some(m) = &existing {
            std::fs::set_permissions(&into, m.permissions())
                .map_err(|e| format!("{local}: {e}"))?;
        }
        std::fs::rename(&into, local).map_err(|e| format!("{local}: {e}"))
    });
    if done.is_err() {
        let _ = std::fs::remove_file(&into);
    }
    done
}

/// Writes the `length` bytes of `path` into the local file `into` (`local` names it in
/// errors).
async fn copy_out_into(
    c: &Tessera,
    path: &str,
    into: &str,
    local: &str,
    length: u64,
) -> Result<(), String> {
    let f = std::fs::File::create(into).map_err(|e| format!("{local}: {e}"))?;
    f.set_len(length).map_err(|e| format!("{local}: {e}"))?;
    let chunk = c.chunk_size(path).await.map_err(|e| say(e, path))?;
    let progress = bar(Some(length));
    let f = std::sync::Arc::new(f);
    let (c2, path2, local2, bar2) = (
        c.clone(),
        path.to_string(),
        local.to_string(),
        progress.clone(),
    );
    let done = for_each_range(chunk_ranges(0, length, chunk), move |start, end| {
        let (c, f, path, local, bar) = (
            c2.clone(),
            f.clone(),
            path2.clone(),
            local2.clone(),
            bar2.clone(),
        );
        async move {
            use std::os::unix::fs::FileExt;
            let mut pos = start;
            while pos < end {
                let data = c
                    .read(&path, pos, (end - pos).min(READ_PIECE))
                    .await
                    .map_err(|e| say(e, &path))?;
                if data.is_empty() {
                    return Err(format!("{path}: shorter than its length {end}"));
                }
                f.write_all_at(&data, pos)
                    .map_err(|e| format!("{local}: {e}"))?;
                pos += data.len() as u64;
                if let Some(b) = &bar {
                    b.inc(data.len() as u64);
                }
            }
            Ok(())
        }
    })
    .await;
    if let Some(b) = progress {
        b.finish_and_clear();
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Cli, String> {
        let args = line.split(' ').map(Into::into).collect();
        Cli::try_parse_from(options_after_command(args)).map_err(|e| e.to_string())
    }

    fn master_of(line: &str) -> (String, Duration) {
        let m = match parse(line).expect(line).cmd {
            Cmd::Ls { m, .. } | Cmd::Admin { m, .. } | Cmd::Bench { m, .. } => m,
            _ => panic!("{line}: not a command with a master"),
        };
        (m.master, m.retry_for)
    }

    #[test]
    fn a_master_name_that_does_not_resolve_is_said_at_once() {
        assert_eq!(unresolvable("127.0.0.1:7070"), None);
        assert_eq!(unresolvable("localhost:7070"), None);
        assert_eq!(unresolvable("[::1]:7070"), None);
        // One replica's name that resolves is enough.
        assert_eq!(unresolvable("gone.invalid.:7070,127.0.0.1:7071"), None);
        // `.invalid` never resolves (RFC 2606), but a machine with no resolver it can
        // reach says "temporary failure" for every name, which is retried.
        if resolver_says_no_such_name() {
            let why = unresolvable("nosuch.invalid.:7070").expect("a name that resolves");
            assert!(why.starts_with("nosuch.invalid.:7070 ("), "{why}");
            let why = unresolvable("a.invalid.:1,b.invalid.:2").expect("a name that resolves");
            assert!(
                why.contains("a.invalid.:1") && why.contains("b.invalid.:2"),
                "{why}"
            );
        }
    }

    /// Whether this machine's resolver answers that a name does not exist, rather than
    /// that it cannot tell for now.
    fn resolver_says_no_such_name() -> bool {
        match std::net::ToSocketAddrs::to_socket_addrs("nosuch.invalid.:7070") {
            Ok(_) => false,
            Err(e) => !e.to_string().to_lowercase().contains("temporary"),
        }
    }

    #[test]
    fn the_master_may_be_named_before_the_command() {
        let want = ("a:1,b:2".to_string(), Duration::from_secs(120));
        for line in [
            "tessera ls --master a:1,b:2 /",
            "tessera --master a:1,b:2 ls /",
            "tessera --master=a:1,b:2 ls /",
            "tessera --master a:1,b:2 admin masters",
            "tessera --master a:1,b:2 admin report",
            "tessera admin masters --master a:1,b:2",
            "tessera --master a:1,b:2 bench meta --files 10",
        ] {
            assert_eq!(master_of(line), want, "{line}");
        }
        assert_eq!(
            master_of("tessera --retry-for 5s --master x:9 ls /"),
            ("x:9".to_string(), Duration::from_secs(5))
        );
        // A file named like an option after the command is the command's to read.
        match parse("tessera --master x:9 mkdir --master").map(|c| c.cmd) {
            Err(e) => assert!(e.contains("--master"), "{e}"),
            Ok(_) => panic!("mkdir --master with no value parsed"),
        }
    }

    #[test]
    fn servers_that_take_no_master_refuse_one_before_the_command() {
        let e = parse("tessera --master x:9 dev")
            .err()
            .expect("dev took --master");
        assert!(e.contains("--master"), "{e}");
        assert!(parse("tessera --master x:9").is_err());
        // Nothing given before the command, or no command after the options (a value
        // left out, `--`, `help`): the arguments pass through as they are, for clap to
        // judge.
        for line in [
            "tessera ls /",
            "tessera --master ls /",
            "tessera --master x:9 -- ls /",
            "tessera --master x:9 help ls",
            "tessera --master x:9 nosuchcommand",
        ] {
            let args: Vec<std::ffi::OsString> = line.split(' ').map(Into::into).collect();
            assert_eq!(options_after_command(args.clone()), args, "{line}");
        }
        let e = parse("tessera --master ls /")
            .err()
            .expect("a missing value taken");
        assert!(e.contains("--master"), "{e}");
    }
}
