//! The cluster benchmark: `tessera put` and `tessera get` of a large file on a real
//! cluster on this machine (a master and three chunkservers as separate processes on
//! loopback, three replicas per chunk), beside two baselines measured in the same run:
//!
//! - the disk: `dd` writing three times the file's size with `conv=fdatasync` into the
//!   directory the chunkservers use. A put writes every byte three times (one per
//!   replica), all to this one disk, so the disk allows at most a third of this. It is
//!   measured just before the put and again just after, and the put is compared with
//!   the mean of the two: this machine's virtual disk runs at very different speeds
//!   from one minute to the next, and is slower right after a few GiB were written (the
//!   host is still writing them back), so a `dd` run on a rested disk and a put run
//!   after other writes would compare two different disks. Shown beside it: the same
//!   `dd` at the start of the round on a rested disk, with the put's ratio against it
//!   (the harder figure on this machine), and `dd` with direct I/O (`oflag=direct`), the
//!   path chunkservers write by. With `--rest-secs S` every timed write (each `dd` and
//!   the put) starts after a `sync` and S seconds idle, so none pays for the one before.
//! - the network: one loopback TCP stream moving the file's size from one thread to
//!   another. A get moves every byte over loopback once (chunkserver to client). Like
//!   the disk, it is measured just before and just after each get it is compared with
//!   (their mean), since it too swings by half from one minute to the next here; the
//!   figure at the start of the round is shown beside.
//!
//! The get after the put finds the file in the chunkservers' memory (their read
//! cache of recent writes); the cold get runs after the chunkservers were killed and
//! started again, so it reads their disks.
//!
//! Figures are ratios against those baselines, because the machine is shared and noisy.
//! Run it with `scripts/bench-cluster.sh` (builds the release binary first), or:
//!
//! `cargo run --release -p tessera-bench --bin cluster -- --tessera PATH [--size-mib N]`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tessera_bench::as_holder;

const MIB: u64 = 1 << 20;

struct Args {
    tessera: PathBuf,
    size_mib: u64,
    dir: PathBuf,
    rounds: u32,
    rest: Duration,
    /// Also measure the cost of tracing (`--trace-cost 1`).
    trace_cost: bool,
    /// Measure the cost of authentication: secured clusters (mutual TLS, chunk
    /// capabilities) beside insecure ones (`--security-cost 0` leaves it out).
    security_cost: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: cluster --tessera PATH [--size-mib N (1024)] [--dir DIR (./target/bench-cluster)] [--rounds N (1)] [--rest-secs S (0)] [--trace-cost 1] [--security-cost 0|1 (1)]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        tessera: PathBuf::new(),
        size_mib: 1024,
        dir: PathBuf::from("target/bench-cluster"),
        rounds: 1,
        rest: Duration::ZERO,
        trace_cost: false,
        security_cost: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let Some(v) = it.next() else { usage() };
        match flag.as_str() {
            "--tessera" => a.tessera = v.into(),
            "--size-mib" => a.size_mib = v.parse().unwrap_or_else(|_| usage()),
            "--dir" => a.dir = v.into(),
            "--rounds" => a.rounds = v.parse().unwrap_or_else(|_| usage()),
            "--rest-secs" => a.rest = Duration::from_secs(v.parse().unwrap_or_else(|_| usage())),
            "--trace-cost" => a.trace_cost = v == "1",
            "--security-cost" => a.security_cost = v == "1",
            _ => usage(),
        }
    }
    if a.tessera.as_os_str().is_empty() {
        usage()
    }
    a
}

fn mb_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

/// `dd` of `bytes` from /dev/zero into `dir`, synced before it reports (conv=fdatasync);
/// with `direct`, in 16 MiB writes with `oflag=direct` (no page cache, as chunkservers
/// write), for reference.
fn disk_baseline(dir: &Path, bytes: u64, direct: bool) -> f64 {
    // Start from a quiet disk: dirty pages left by earlier steps would otherwise be
    // written back during dd and charged to it.
    sync();
    let file = dir.join("dd.out");
    let start = Instant::now();
    let out = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", file.display()))
        .arg(if direct { "bs=16M" } else { "bs=1M" })
        .arg(format!(
            "count={}",
            bytes / MIB / if direct { 16 } else { 1 }
        ))
        .arg("conv=fdatasync")
        .args(direct.then_some("oflag=direct"))
        .stderr(Stdio::piped())
        .output()
        .expect("run dd");
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "dd failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(&file);
    mb_per_s(bytes, took)
}

/// One loopback TCP stream carrying `bytes`, 1 MiB per write, timed until the reader
/// has it all.
fn tcp_baseline(bytes: u64) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let reader = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = vec![0u8; MIB as usize];
        let mut got = 0u64;
        while got < bytes {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got += n as u64,
                Err(e) => panic!("read: {e}"),
            }
        }
        got
    });
    let mut s = TcpStream::connect(addr).expect("connect");
    let buf = vec![7u8; MIB as usize];
    let start = Instant::now();
    for _ in 0..bytes / MIB {
        s.write_all(&buf).expect("write");
    }
    let got = reader.join().expect("reader");
    let took = start.elapsed();
    assert_eq!(got, bytes);
    mb_per_s(bytes, took)
}

/// Writes back every dirty page on the machine (`sync`), so one step's leftovers do not
/// slow the next.
fn sync() {
    let _ = Command::new("sync").status();
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Cluster {
    procs: Vec<Child>,
    master: String,
    /// Each chunkserver's command line, to start it again.
    servers: Vec<(Command, String)>,
    /// The credentials directories of a secured cluster (`make_pki`); None: insecure.
    pki: Option<PathBuf>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

fn start_cluster(bin: &Path, dir: &Path) -> Cluster {
    start_cluster_with(bin, dir, None, None)
}

/// A certificate authority in `dir` and credentials from it for a master, three
/// chunkservers, an admin (who waits for the cluster) and a user (who puts and gets).
fn make_pki(bin: &Path, dir: &Path) -> PathBuf {
    let mut holders = vec![
        ("master", "1".to_string(), "master".to_string()),
        ("admin", "root".into(), "admin".into()),
        ("client", "bench".into(), "client".into()),
    ];
    for i in 0..3 {
        holders.push(("chunkserver", format!("host{i}"), format!("cs{i}")));
    }
    tessera_bench::make_pki(bin, dir, &holders)
}

/// A cluster whose servers record traces into `trace` when given (`--trace-dir`), and
/// run secured with the credentials of `pki` when given (`make_pki`).
fn start_cluster_with(bin: &Path, dir: &Path, trace: Option<&Path>, pki: Option<&Path>) -> Cluster {
    let trace_args: Vec<std::ffi::OsString> = match trace {
        Some(t) => vec!["--trace-dir".into(), t.into()],
        None => Vec::new(),
    };
    let master = format!("127.0.0.1:{}", free_port());
    let log = |name: &str| {
        Stdio::from(std::fs::File::create(dir.join(format!("{name}.log"))).expect("log"))
    };
    let mut procs = vec![
        as_holder(bin, pki, "master")
            .args(["master", "--data-dir"])
            .arg(dir.join("master"))
            .args(["--listen", &master])
            .args(&trace_args)
            .stderr(log("master"))
            .spawn()
            .expect("start the master"),
    ];
    let mut servers = Vec::new();
    for i in 0..3 {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = as_holder(bin, pki, &format!("cs{i}"));
        cmd.args(["chunkserver", "--master", &master, "--data-dir"])
            .arg(dir.join(format!("cs{i}")))
            .args(["--listen", &addr, "--rack", &format!("rack{i}")])
            .args(&trace_args)
            .stderr(log(&format!("cs{i}")));
        procs.push(cmd.spawn().expect("start a chunkserver"));
        servers.push((cmd, addr));
    }
    let c = Cluster {
        procs,
        master,
        servers,
        pki: pki.map(Path::to_path_buf),
    };
    // Wait until the master knows all three servers.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let out = tessera(bin, &c, "admin", &["admin", "report"]);
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("live chunkservers: 3") {
            if pki.is_some() {
                // The benchmark's user writes at the root, as on an insecure cluster;
                // a secured one's root is the admin's.
                let out = tessera(bin, &c, "admin", &["chown", "bench", "/"]);
                assert!(
                    out.status.success(),
                    "chown of / to the benchmark's user: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            return c;
        }
        assert!(Instant::now() < until, "cluster did not come up:\n{text}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

impl Cluster {
    /// Kills every chunkserver (kill -9) and starts it again on its data: what they held
    /// in memory is gone, so reads come from their disks.
    fn restart_chunkservers(&mut self) {
        for p in &mut self.procs[1..] {
            let _ = p.kill();
            let _ = p.wait();
        }
        for (i, (cmd, addr)) in self.servers.iter_mut().enumerate() {
            self.procs[1 + i] = cmd.spawn().expect("restart a chunkserver");
            let until = Instant::now() + Duration::from_secs(30);
            while TcpStream::connect(addr.as_str()).is_err() {
                assert!(
                    Instant::now() < until,
                    "chunkserver {addr} did not come back"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn tessera(bin: &Path, c: &Cluster, who: &str, args: &[&str]) -> std::process::Output {
    as_holder(bin, c.pki.as_deref(), who)
        .args(args)
        .env("TESSERA_MASTER", &c.master)
        .output()
        .expect("run tessera")
}

/// Runs a command as the cluster's user to completion, its stdout thrown away
/// (`/dev/null`), and times it.
fn timed(bin: &Path, c: &Cluster, args: &[&str]) -> Duration {
    let start = Instant::now();
    let out = as_holder(bin, c.pki.as_deref(), "client")
        .args(args)
        .env("TESSERA_MASTER", &c.master)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run tessera");
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "tessera {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

fn random_file(path: &Path, bytes: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("input file"));
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut buf = vec![0u8; MIB as usize];
    for _ in 0..bytes / MIB {
        for w in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&buf).expect("write input");
    }
    f.flush().expect("flush input");
}

fn main() {
    let a = parse_args();
    let bytes = a.size_mib * MIB;
    let _ = std::fs::remove_dir_all(&a.dir);
    std::fs::create_dir_all(&a.dir).expect("bench dir");
    let input = a.dir.join("input");
    random_file(&input, bytes);
    // The first put to a cluster just started warms it (allocator pools, connections,
    // HTTP/2 windows); a running cluster is warm. It is timed and shown on its own.
    let warm_bytes = (bytes / 4).max(MIB);
    let warm_input = a.dir.join("warm-input");
    random_file(&warm_input, warm_bytes);
    let output = a.dir.join("output");

    println!(
        "cluster benchmark: {} MiB, 3 replicas, master + 3 chunkservers on loopback, data in {}",
        a.size_mib,
        a.dir.display()
    );
    println!(
        "{:>5} {:>11} {:>11} {:>11} {:>12} {:>10} {:>11} {:>11} {:>14} {:>10} {:>10} {:>12} {:>14} {:>12} {:>14} {:>12} {:>14}",
        "round",
        "disk rested",
        "disk before",
        "disk after",
        "direct MB/s",
        "tcp start",
        "tcp at get",
        "tcp at cold",
        "first put MB/s",
        "put MB/s",
        "get MB/s",
        "get>file MB/s",
        "cold get MB/s",
        "put/(disk/3)",
        "put/(rested/3)",
        "get/tcp",
        "cold get/tcp"
    );
    // Before each timed write: everything written so far synced, then (with --rest-secs)
    // a pause, so the disk has caught up with it.
    let rest = || {
        sync();
        std::thread::sleep(a.rest);
    };
    // A get to stdout, timed between two TCP streams, and the streams' mean.
    let get_beside_tcp = |c: &Cluster, path: &str| {
        let before = tcp_baseline(bytes);
        let get = timed(&a.tessera, c, &["get", path, "-"]);
        (get, (before + tcp_baseline(bytes)) / 2.0)
    };
    for round in 1..=a.rounds {
        rest();
        let rested = disk_baseline(&a.dir, 3 * bytes, false);
        let direct = disk_baseline(&a.dir, 3 * bytes, true);
        let tcp_start = tcp_baseline(bytes);
        let data = a.dir.join(format!("cluster{round}"));
        std::fs::create_dir_all(&data).expect("cluster dir");
        let mut c = start_cluster(&a.tessera, &data);
        let path = format!("/bench{round}");
        sync();
        let first = timed(
            &a.tessera,
            &c,
            &["put", warm_input.to_str().expect("utf-8 path"), "/warm-up"],
        );
        // The disk just before the put and just after it, each step starting from a
        // synced machine: both baselines and the put see the disk in the same state.
        rest();
        let disk_before = disk_baseline(&a.dir, 3 * bytes, false);
        rest();
        let put = timed(
            &a.tessera,
            &c,
            &["put", input.to_str().expect("utf-8 path"), &path],
        );
        rest();
        let disk_after = disk_baseline(&a.dir, 3 * bytes, false);
        let disk = (disk_before + disk_after) / 2.0;
        // The read path alone, as the TCP baseline's reader: the bytes are thrown away.
        let (get, tcp) = get_beside_tcp(&c, &path);
        // And into a local file (its page cache writes cost as much as the read here).
        let get_file = timed(
            &a.tessera,
            &c,
            &["get", &path, output.to_str().expect("utf-8 path")],
        );
        let same = std::fs::read(&input).ok() == std::fs::read(&output).ok();
        assert!(same, "the file read back differs from the one written");
        // Reads of data the chunkservers no longer hold in memory: from their disks.
        c.restart_chunkservers();
        let (cold, tcp_cold) = get_beside_tcp(&c, &path);
        drop(c);
        let _ = std::fs::remove_dir_all(&data);
        let (first, put, get, get_file, cold) = (
            mb_per_s(warm_bytes, first),
            mb_per_s(bytes, put),
            mb_per_s(bytes, get),
            mb_per_s(bytes, get_file),
            mb_per_s(bytes, cold),
        );
        println!(
            "{round:>5} {rested:>11.0} {disk_before:>11.0} {disk_after:>11.0} {direct:>12.0} {tcp_start:>10.0} {tcp:>11.0} {tcp_cold:>11.0} {first:>14.0} {put:>10.0} {get:>10.0} {get_file:>12.0} {cold:>14.0} {:>12.2} {:>14.2} {:>12.2} {:>14.2}",
            put / (disk / 3.0),
            put / (rested / 3.0),
            get / tcp,
            cold / tcp_cold
        );
    }
    println!(
        "goals: put/(disk/3) >= 0.80, get/tcp >= 0.50 (disk: the mean of dd just before and just after the put; rested: dd at the start of the round, before any cluster write; tcp at get/cold: the mean of the TCP stream just before and just after that get; first put: a quarter of the size, to the cluster just started; put: the next one; get: to stdout, thrown away, after the put (and the dd after it); get>file: into a local file; cold get: to stdout after the chunkservers restarted, so from their disks)"
    );
    if a.trace_cost {
        trace_cost(&a, bytes, &input, &warm_input);
    }
    if a.security_cost {
        security_cost(&a, bytes, &input, &warm_input);
    }
    let _ = std::fs::remove_file(&input);
    let _ = std::fs::remove_file(&warm_input);
    let _ = std::fs::remove_file(&output);
}

/// On cluster `c` just started: a warm-up put, then (synced, rested) a timed put of
/// `input` and a timed get of it to stdout.
fn put_then_get(a: &Args, c: &Cluster, input: &Path, warm_input: &Path) -> (Duration, Duration) {
    let ((put, _), (get, _)) = put_then_get_cpu(a, c, input, warm_input);
    (put, get)
}

/// As [`put_then_get`], with the CPU time (ms) the put and the get each took of the
/// client and every server.
fn put_then_get_cpu(
    a: &Args,
    c: &Cluster,
    input: &Path,
    warm_input: &Path,
) -> ((Duration, f64), (Duration, f64)) {
    let cpu = || {
        tessera_bench::cpu_ms_of(c.procs.iter().map(Child::id))
            + tessera_bench::reaped_children_cpu_ms()
    };
    timed(
        &a.tessera,
        c,
        &["put", warm_input.to_str().expect("utf-8 path"), "/warm-up"],
    );
    sync();
    std::thread::sleep(a.rest);
    let before = cpu();
    let put = timed(
        &a.tessera,
        c,
        &["put", input.to_str().expect("utf-8 path"), "/f"],
    );
    let between = cpu();
    let get = timed(&a.tessera, c, &["get", "/f", "-"]);
    ((put, between - before), (get, cpu() - between))
}

/// The cost of authentication: put and get (to stdout) on fresh clusters, insecure,
/// secured (mutual TLS on every connection, a capability checked on every chunk
/// request), insecure, secured, insecure: each secured figure against the mean of the
/// insecure ones either side of it (this machine's disk and loopback swing from minute
/// to minute).
fn security_cost(a: &Args, bytes: u64, input: &Path, warm_input: &Path) {
    let pki = make_pki(&a.tessera, &a.dir);
    let (mut runs, mut cpu) = (Vec::new(), Vec::new());
    for (i, secured) in [false, true, false, true, false].into_iter().enumerate() {
        let data = a.dir.join(format!("security-cost{i}"));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data).expect("cluster dir");
        let c = start_cluster_with(&a.tessera, &data, None, secured.then_some(pki.as_path()));
        let ((put, put_cpu), (get, get_cpu)) = put_then_get_cpu(a, &c, input, warm_input);
        drop(c);
        let _ = std::fs::remove_dir_all(&data);
        runs.push((mb_per_s(bytes, put), mb_per_s(bytes, get)));
        cpu.push((put_cpu, get_cpu));
    }
    let _ = std::fs::remove_dir_all(&pki);
    // CPU seconds per GiB moved, of the client and every server: on a machine of few
    // cores, a get over loopback is bound by it, and encryption adds to it.
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let per_gib = |ms: f64| ms / 1000.0 / gib;
    for k in [1, 3] {
        let mean = |f: fn(&(f64, f64)) -> f64| (f(&cpu[k - 1]) + f(&cpu[k + 1])) / 2.0;
        let (ip, ig) = (mean(|c| c.0), mean(|c| c.1));
        println!(
            "security cost, CPU s per GiB (client and servers): put insecure {:.2}, secured {:.2} ({:.2}x); get insecure {:.2}, secured {:.2} ({:.2}x); {} cores",
            per_gib(ip),
            per_gib(cpu[k].0),
            cpu[k].0 / ip,
            per_gib(ig),
            per_gib(cpu[k].1),
            cpu[k].1 / ig,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
    }
    for k in [1, 3] {
        let (off_put, off_get) = (
            (runs[k - 1].0 + runs[k + 1].0) / 2.0,
            (runs[k - 1].1 + runs[k + 1].1) / 2.0,
        );
        println!(
            "security cost: put MB/s insecure {:.0} and {:.0}, secured {:.0} ({:.3} of their mean); get MB/s insecure {:.0} and {:.0}, secured {:.0} ({:.3}) (goals: >= 0.95 of insecure)",
            runs[k - 1].0,
            runs[k + 1].0,
            runs[k].0,
            runs[k].0 / off_put,
            runs[k - 1].1,
            runs[k + 1].1,
            runs[k].1,
            runs[k].1 / off_get
        );
    }
}

/// Bytes in the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                dir_bytes(&p)
            } else {
                e.metadata().map_or(0, |m| m.len())
            }
        })
        .sum()
}

/// The cost of tracing: put and get (to stdout) on fresh clusters, untraced, traced,
/// untraced again, the traced figures against the mean of the two untraced ones
/// around them (this machine's disk and loopback swing from minute to minute); then
/// the trace's size per RPC the servers served (RPCs counted by `tessera trace
/// summary`; the trace holds no file data, only its length and CRC).
fn trace_cost(a: &Args, bytes: u64, input: &Path, warm_input: &Path) {
    let mut runs = Vec::new();
    for (i, traced) in [false, true, false].into_iter().enumerate() {
        let data = a.dir.join(format!("trace-cost{i}"));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data).expect("cluster dir");
        let trace = data.join("traces");
        let c = start_cluster_with(&a.tessera, &data, traced.then_some(trace.as_path()), None);
        let (put, get) = put_then_get(a, &c, input, warm_input);
        // Ticks flush the trace files; the servers are killed after the next one.
        std::thread::sleep(Duration::from_secs(2));
        drop(c);
        let (trace_bytes, rpcs) = if traced {
            let out = Command::new(&a.tessera)
                .args(["trace", "summary", "--json"])
                .arg(&trace)
                .output()
                .expect("run tessera trace summary");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let json = String::from_utf8_lossy(&out.stdout);
            let rpcs: u64 = json
                .split("\"calls\": ")
                .skip(1)
                .filter_map(|s| {
                    s.split(|c: char| !c.is_ascii_digit())
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .sum();
            (dir_bytes(&trace), rpcs)
        } else {
            (0, 0)
        };
        let _ = std::fs::remove_dir_all(&data);
        runs.push((
            mb_per_s(bytes, put),
            mb_per_s(bytes, get),
            trace_bytes,
            rpcs,
        ));
    }
    let (put_off, get_off) = ((runs[0].0 + runs[2].0) / 2.0, (runs[0].1 + runs[2].1) / 2.0);
    let (put_on, get_on, trace_bytes, rpcs) = runs[1];
    println!(
        "tracing cost: put MB/s untraced {:.0} and {:.0}, traced {put_on:.0} ({:.3} of their mean); get MB/s untraced {:.0} and {:.0}, traced {get_on:.0} ({:.3}); trace {trace_bytes} bytes for {rpcs} RPCs served: {:.1} bytes per RPC (goals: >= 0.95 of untraced, < 64 bytes per RPC)",
        runs[0].0,
        runs[2].0,
        put_on / put_off,
        runs[0].1,
        runs[2].1,
        get_on / get_off,
        trace_bytes as f64 / rpcs.max(1) as f64
    );
}
