//! The metadata benchmark: `tessera bench meta` (creates, stats, lists, renames and
//! deletes over RPC from C concurrent clients) against a single master and against a
//! group of three master replicas, in the same run on this machine, each a separate
//! process on loopback with its own data directory (every create is synced to disk
//! before it is acknowledged: on a group, on a majority of the replicas). Then, on the
//! group:
//!
//! - shadow lag: while clients create files steadily, `tessera admin masters` is asked
//!   every 100 ms; each shadow says how long since it last knew its state current.
//! - unavailability after kill -9 of the leader, from a client's view: the leader is
//!   killed, and a `tessera mkdir` is timed until it answers (it keeps trying); the
//!   killed replica is started again and caught up before the next kill. Reported
//!   beside the time of a `tessera mkdir` with no failure (the command's own cost).
//!
//! The cost of authentication, in the same run: the same benchmark on a master alone
//! run secured (mutual TLS on every connection, each request authorized by its caller's
//! certificate, permissions checked on every path), between two insecure runs, each
//! secured figure against the mean of the insecure ones either side of it; and on a
//! group, secured beside insecure. The shadow lag and the kills run on the secured group.
//!
//! Baseline, in the same run: this disk's rate of small synced writes, alone and with two
//! writers at once. One client's creates each wait for a sync (on a group, the leader's
//! and a follower's, on this one disk), so that rate bounds them.
//!
//! QFS's figures for its metaserver on this kind of machine (one client: 3,065–3,643
//! creates/s; 16 clients: 19,940) are printed beside for reference; they were not
//! measured here.
//!
//! `scripts/bench-meta.sh` builds the release binary and runs it, or:
//! `cargo run --release -p tessera-bench --bin meta -- --tessera PATH`

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tessera_bench::as_holder;

struct Args {
    tessera: PathBuf,
    dir: PathBuf,
    files: usize,
    kills: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: meta --tessera PATH [--dir DIR (./target/bench-meta)] [--files N per client (2000)] [--kills N (20)]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        tessera: PathBuf::new(),
        dir: PathBuf::from("target/bench-meta"),
        files: 2000,
        kills: 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let Some(v) = it.next() else { usage() };
        match flag.as_str() {
            "--tessera" => a.tessera = v.into(),
            "--dir" => a.dir = v.into(),
            "--files" => a.files = v.parse().unwrap_or_else(|_| usage()),
            "--kills" => a.kills = v.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    if a.tessera.as_os_str().is_empty() {
        usage()
    }
    a
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A certificate authority and credentials for three master replicas (`master1`..
/// `master3`) and an admin (who runs the benchmark's clients).
fn make_pki(bin: &Path, dir: &Path) -> PathBuf {
    let mut holders = vec![("admin", "root".to_string(), "admin".to_string())];
    for i in 1..=3 {
        holders.push(("master", i.to_string(), format!("master{i}")));
    }
    tessera_bench::make_pki(bin, dir, &holders)
}

/// Master processes: one alone, or the replicas of a group.
struct Masters {
    bin: PathBuf,
    dir: PathBuf,
    /// The credentials of a secured group (`make_pki`); None: insecure.
    pki: Option<PathBuf>,
    addrs: Vec<String>,
    procs: Vec<Option<Child>>,
}

impl Masters {
    fn start(bin: &Path, dir: &Path, n: usize, pki: Option<&Path>) -> Masters {
        let addrs = (0..n)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let mut m = Masters {
            bin: bin.into(),
            dir: dir.into(),
            pki: pki.map(Path::to_path_buf),
            addrs,
            procs: Vec::new(),
        };
        for i in 0..n {
            let p = m.spawn(i, true);
            m.procs.push(Some(p));
        }
        m.wait_ready();
        m
    }

    fn spawn(&self, i: usize, first: bool) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("master{i}.log")))
            .expect("log");
        let mut cmd = as_holder(&self.bin, self.pki.as_deref(), &format!("master{}", i + 1));
        cmd.args(["master", "--data-dir"])
            .arg(self.dir.join(format!("master{i}")))
            .args(["--listen", &self.addrs[i]]);
        if self.addrs.len() > 1 {
            cmd.args(["--peers", &self.addrs.join(",")]);
            if first {
                cmd.arg("--bootstrap");
            }
        }
        cmd.stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start a master")
    }

    fn list(&self) -> String {
        self.addrs.join(",")
    }

    /// The binary as the admin of this group, given its masters.
    fn admin(&self) -> Command {
        let mut cmd = as_holder(&self.bin, self.pki.as_deref(), "admin");
        cmd.env("TESSERA_MASTER", self.list());
        cmd
    }

    /// A command of the admin's, run to its end.
    fn run(&self, args: &[&str]) -> std::process::Output {
        self.admin().args(args).output().expect("run tessera")
    }

    /// Until a mkdir answers (a group has elected its leader).
    fn wait_ready(&self) {
        let out = self.run(&["mkdir", "-p", "/ready"]);
        assert!(
            out.status.success(),
            "the masters did not come up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `tessera admin masters`: (address, role, lag in ms) of each replica answering.
    fn roles(&self) -> Vec<(String, String, Option<u64>)> {
        let out = self.run(&["admin", "masters"]);
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .skip(1)
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                // Rows only: not the voters line or a footnote.
                if w.len() < 3 || w[0].parse::<u64>().is_err() {
                    return None;
                }
                let lag = l
                    .split("current ")
                    .nth(1)
                    .and_then(|r| r.split(" ms").next())
                    .and_then(|n| n.parse().ok());
                Some((w[1].to_string(), w[2].to_string(), lag))
            })
            .collect()
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.procs[i].take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

impl Drop for Masters {
    fn drop(&mut self) {
        for i in 0..self.procs.len() {
            self.kill(i);
        }
    }
}

/// CPU time (user and system) the running masters of `m` have used so far, in ms.
fn cpu_ms(m: &Masters) -> f64 {
    tessera_bench::cpu_ms_of(m.procs.iter().flatten().map(Child::id))
}

/// `tessera bench meta` against `m`: its output, the creates per second with each
/// number of clients, and the masters' CPU time per 1,000 operations (of every kind).
fn bench(m: &Masters, clients: &str, files: usize) -> (String, Vec<f64>, f64) {
    let cpu_before = cpu_ms(m);
    let out = m.run(&[
        "bench",
        "meta",
        "--clients",
        clients,
        "--files",
        &files.to_string(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "bench meta failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cpu = cpu_ms(m) - cpu_before;
    let ops: f64 = text
        .lines()
        .filter_map(|l| {
            l.split("ops=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
        .sum();
    let creates = text
        .lines()
        .filter(|l| l.starts_with("create"))
        .filter_map(|l| {
            l.split("ops/s=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    (text, creates, cpu / ops.max(1.0) * 1000.0)
}

/// This disk's rate of small synced writes, the baseline a client waiting for each of
/// its creates to be durable is held to: `writers` threads at once, each appending 100
/// bytes to a file of its own and `fdatasync`ing it, `n` times. Syncs per second per
/// writer.
fn syncs_per_sec(dir: &Path, writers: usize, n: usize) -> f64 {
    use std::io::Write;
    let start = Instant::now();
    std::thread::scope(|s| {
        for w in 0..writers {
            let path = dir.join(format!("sync-baseline-{w}"));
            s.spawn(move || {
                let mut f = std::fs::File::create(&path).expect("baseline file");
                for _ in 0..n {
                    f.write_all(&[7u8; 100]).expect("baseline write");
                    f.sync_data().expect("baseline sync");
                }
                drop(f);
                let _ = std::fs::remove_file(&path);
            });
        }
    });
    n as f64 / start.elapsed().as_secs_f64().max(1e-9)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let a = parse_args();
    let _ = std::fs::remove_dir_all(&a.dir);
    std::fs::create_dir_all(&a.dir).expect("bench dir");
    let bin = a.tessera.clone();
    // The disk's sync rate, alone and with two writers at once (a group's leader and a
    // follower syncing the same entry on this one disk), measured before the masters.
    let sync1 = syncs_per_sec(&a.dir, 1, 1000);
    let sync2 = syncs_per_sec(&a.dir, 2, 1000);

    let pki = make_pki(&bin, &a.dir);
    // Started, measured with one and with 16 clients, and stopped.
    let measure = |name: &str, n: usize, pki: Option<&Path>| {
        let dir = a.dir.join(name);
        std::fs::create_dir_all(&dir).expect("dir");
        let m = Masters::start(&bin, &dir, n, pki);
        bench(&m, "1,16", a.files)
    };
    let (single_text, single_creates, single_cpu) = measure("single", 1, None);
    println!("== one master\n{single_text}");
    let (secured_text, secured_creates, secured_cpu) = measure("single-secured", 1, Some(&pki));
    println!("== one master, secured\n{secured_text}");
    let (_, again_creates, _) = measure("single-again", 1, None);

    let (group_text, group_creates, group_cpu) = measure("group", 3, None);
    println!("== a group of three master replicas\n{group_text}");
    let group_dir = a.dir.join("group-secured");
    std::fs::create_dir_all(&group_dir).expect("dir");
    let mut group = Masters::start(&bin, &group_dir, 3, Some(&pki));
    let (gsec_text, gsec_creates, gsec_cpu) = bench(&group, "1,16", a.files);
    println!("== a group of three master replicas, secured\n{gsec_text}");
    // Insecure again, beside the secured group (idle meanwhile): each secured figure
    // against the mean of the insecure ones either side of it, as for one master.
    let (_, gagain_creates, _) = measure("group-again", 3, None);

    println!(
        "== the cost of authentication: creates per second secured, against insecure in the same run (goal: >= 0.9)"
    );
    for (i, clients) in [1, 16].iter().enumerate() {
        let (a1, s, a2, g, gs, g2) = (
            single_creates[i],
            secured_creates[i],
            again_creates[i],
            group_creates[i],
            gsec_creates[i],
            gagain_creates[i],
        );
        println!(
            "clients={clients:<2}  one master: insecure {a1:.0} and {a2:.0}/s, secured {s:.0}/s ({:.3} of their mean)  \
             group: insecure {g:.0} and {g2:.0}/s, secured {gs:.0}/s ({:.3} of their mean)",
            s / ((a1 + a2) / 2.0),
            gs / ((g + g2) / 2.0)
        );
    }
    println!(
        "== master CPU time per 1,000 operations, secured against insecure: single {secured_cpu:.0} \
         against {single_cpu:.0} ms ({:.2}), group {gsec_cpu:.0} against {group_cpu:.0} ms ({:.2})",
        secured_cpu / single_cpu,
        gsec_cpu / group_cpu
    );

    println!("== creates per second, this run (QFS's metaserver for reference, not measured here)");
    for (i, clients) in [1, 16].iter().enumerate() {
        let (s, g) = (single_creates[i], group_creates[i]);
        let qfs = if *clients == 1 { 3_643.0 } else { 19_940.0 };
        println!(
            "clients={clients:<2}  single={s:.0}/s  group={g:.0}/s  group/single={:.2}  single/QFS={:.2}",
            g / s,
            s / qfs
        );
    }
    println!(
        "== one client waits for a sync per create: this disk does {sync1:.0} synced writes/s \
         (each of two writers at once: {sync2:.0}/s); one client's creates: single={:.2} of \
         one writer's rate, group={:.2} of the rate of each of two writers at once",
        single_creates[0] / sync1,
        group_creates[0] / sync2
    );
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "== master CPU time per 1,000 operations (all kinds, all replicas): single={single_cpu:.0} ms  \
         group={group_cpu:.0} ms  group/single={:.2}  ({cores} cores shared by the masters and the \
         clients)",
        group_cpu / single_cpu
    );

    // Shadow lag under a steady create load.
    let load = group
        .admin()
        .args(["bench", "meta", "--clients", "4", "--files", "3000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the load");
    let mut load = load;
    std::thread::sleep(Duration::from_secs(1));
    let mut lags = Vec::new();
    while load.try_wait().expect("load").is_none() {
        for (_, role, lag) in group.roles() {
            if role == "shadow"
                && let Some(l) = lag
            {
                lags.push(l as f64);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let n = lags.len();
    let lag_median = median(lags.clone());
    lags.sort_by(f64::total_cmp);
    let p90 = lags.get(n * 9 / 10).copied().unwrap_or(f64::NAN);
    println!(
        "== shadow lag under a steady create load (4 clients): median {lag_median:.0} ms, p90 {p90:.0} ms ({n} samples)"
    );

    // Unavailability after kill -9 of the leader.
    let mut plain = Vec::new();
    for k in 0..5 {
        let t = Instant::now();
        let out = group.run(&["mkdir", &format!("/plain{k}")]);
        assert!(out.status.success());
        plain.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut pauses = Vec::new();
    for k in 0..a.kills {
        let roles = group.roles();
        let Some(leader) = roles.iter().find(|r| r.1 == "leader") else {
            panic!("no leader: {roles:?}");
        };
        let i = group
            .addrs
            .iter()
            .position(|x| *x == leader.0)
            .expect("a member");
        group.kill(i);
        let t = Instant::now();
        let out = group.run(&["mkdir", &format!("/after-kill{k}")]);
        let pause = t.elapsed();
        assert!(
            out.status.success(),
            "mkdir after kill {k}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pauses.push(pause.as_secs_f64() * 1e3);
        eprintln!(
            "kill {k}: leader {} killed; mkdir answered after {pause:?}",
            leader.0
        );
        group.procs[i] = Some(group.spawn(i, false));
        // Caught up and a shadow again before the next kill.
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let r = group.roles();
            if r.len() == 3
                && r.iter()
                    .all(|x| x.2.is_some_and(|l| l < 1_000) || x.1 == "leader")
            {
                break;
            }
            assert!(
                Instant::now() < until,
                "replica {i} did not catch up: {r:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    pauses.sort_by(f64::total_cmp);
    println!(
        "== unavailability after kill -9 of the leader ({} kills; election timeout 1-2 s: 10-20 ticks of 100 ms): \
         median {:.0} ms, max {:.0} ms; a mkdir with no failure takes {:.0} ms (median of 5)",
        pauses.len(),
        median(pauses.clone()),
        pauses.last().copied().unwrap_or(f64::NAN),
        median(plain),
    );
}
