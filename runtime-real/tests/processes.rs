//! The `tessera` binary as an operator runs it: a master and four chunkservers as
//! separate processes on loopback, with short timeouts, driven through the CLI. Servers
//! are stopped with SIGKILL only: every stop is a crash, and start-up is recovery.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tessera");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Timing flags every server gets: short, so failures are noticed within seconds.
const KNOBS: &[&str] = &[
    "--chunk-size",
    "4194304",
    "--lease",
    "4s",
    "--max-clock-skew",
    "200ms",
    "--heartbeat",
    "200ms",
    "--dead-after",
    "2s",
    "--rpc-timeout",
    "3s",
    "--tick",
    "100ms",
    "--clone-timeout",
    "30s",
    "--gc-delay",
    "2s",
];

struct Cluster {
    root: PathBuf,
    master_addr: String,
    master: Option<Child>,
    servers: Vec<(String, Option<Child>)>,
}

impl Cluster {
    fn start(root: &Path, n: usize) -> Cluster {
        let master_addr = format!("127.0.0.1:{}", free_port());
        let mut c = Cluster {
            root: root.to_path_buf(),
            master_addr,
            master: None,
            servers: (0..n)
                .map(|_| (format!("127.0.0.1:{}", free_port()), None))
                .collect(),
        };
        c.start_master();
        for i in 0..n {
            c.start_server(i);
        }
        c
    }

    fn log(&self, name: &str) -> Stdio {
        let f = std::fs::File::create(self.root.join(format!("{name}.log"))).expect("log file");
        Stdio::from(f)
    }

    fn start_master(&mut self) {
        let child = Command::new(BIN)
            .args(["master", "--data-dir"])
            .arg(self.root.join("master"))
            .args(["--listen", &self.master_addr])
            .args(KNOBS)
            .stdout(Stdio::null())
            .stderr(self.log("master"))
            .spawn()
            .expect("start master");
        self.master = Some(child);
    }

    fn start_server(&mut self, i: usize) {
        let addr = self.servers[i].0.clone();
        let child = Command::new(BIN)
            .args(["chunkserver", "--master", &self.master_addr, "--data-dir"])
            .arg(self.root.join(format!("cs{i}")))
            .args(["--listen", &addr, "--rack", &format!("rack{}", i % 2)])
            .args(KNOBS)
            .stdout(Stdio::null())
            .stderr(self.log(&format!("cs{i}")))
            .spawn()
            .expect("start chunkserver");
        self.servers[i].1 = Some(child);
    }

    fn kill_master(&mut self) {
        if let Some(mut c) = self.master.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    fn kill_server(&mut self, i: usize) {
        if let Some(mut c) = self.servers[i].1.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .env("TESSERA_MASTER", &self.master_addr)
            .output()
            .expect("run tessera")
    }

    fn ok(&self, args: &[&str]) -> Output {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "tessera {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Retries a command until it succeeds (the cluster settling after a restart).
    fn eventually(&self, args: &[&str], within: Duration) -> Output {
        let until = Instant::now() + within;
        loop {
            let out = self.cli(args);
            if out.status.success() || Instant::now() > until {
                return out;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_master();
        for i in 0..self.servers.len() {
            self.kill_server(i);
        }
    }
}

fn random_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    // xorshift: fast, and random enough that no two chunks compress alike.
    let mut x = seed | 1;
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(len);
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(&data))
        .expect("write local file");
    data
}

#[test]
fn a_cluster_of_processes_survives_kills_and_keeps_the_data() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    let mut c = Cluster::start(root, 4);
    std::thread::sleep(Duration::from_secs(2));

    // A file of many chunks, in and out byte for byte.
    let len = 40 << 20;
    let want = random_file(&root.join("in"), len, 7);
    let r#in = root.join("in");
    let out1 = root.join("out1");
    c.eventually(&["mkdir", "-p", "/data"], Duration::from_secs(20));
    c.ok(&["put", r#in.to_str().unwrap(), "/data/big"]);
    c.ok(&["get", "/data/big", out1.to_str().unwrap()]);
    assert!(
        std::fs::read(&out1).unwrap() == want,
        "get differs from put"
    );
    let stat = String::from_utf8(c.ok(&["stat", "/data/big"]).stdout).unwrap();
    assert!(stat.contains(&format!("length: {len}")), "{stat}");

    // A chunkserver dies in the middle of a get: the get finishes from other replicas.
    let out2 = root.join("out2");
    let get = Command::new(BIN)
        .args(["get", "/data/big", out2.to_str().unwrap()])
        .env("TESSERA_MASTER", &c.master_addr)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    c.kill_server(0);
    let got = get.wait_with_output().unwrap();
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert!(
        std::fs::read(&out2).unwrap() == want,
        "get during a kill differs"
    );

    // Written while cs0 is down: cs0 misses it.
    let small = root.join("small");
    let want_small = random_file(&small, 3 << 20, 9);
    c.ok(&["put", small.to_str().unwrap(), "/data/small"]);

    // The master dies and comes back: namespace and contents intact.
    c.kill_master();
    c.start_master();
    let ls = c.eventually(&["ls", "/data"], Duration::from_secs(20));
    let ls = String::from_utf8(ls.stdout).unwrap();
    assert!(
        ls.contains("/data/big") && ls.contains("/data/small"),
        "{ls}"
    );
    let out3 = root.join("out3");
    let r = c.eventually(
        &["get", "/data/big", out3.to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(std::fs::read(&out3).unwrap() == want);

    // cs0 comes back with whatever it had; reads stay correct (its stale copies, if any,
    // are not served).
    c.start_server(0);
    std::thread::sleep(Duration::from_secs(3));
    let out4 = root.join("out4");
    c.ok(&["get", "/data/small", out4.to_str().unwrap()]);
    assert!(std::fs::read(&out4).unwrap() == want_small);

    // Appends, cat, mv, rm.
    let tail = root.join("tail");
    std::fs::write(&tail, b"the end\n").unwrap();
    c.ok(&["append", tail.to_str().unwrap(), "/data/small"]);
    let cat = c.ok(&["cat", "/data/small"]).stdout;
    assert_eq!(&cat[..want_small.len()], &want_small[..]);
    assert_eq!(&cat[want_small.len()..], b"the end\n");
    c.ok(&["mv", "/data/small", "/data/moved"]);
    c.ok(&["rm", "/data/moved"]);
    let ls = String::from_utf8(c.ok(&["ls", "/data"]).stdout).unwrap();
    assert!(
        !ls.contains("/data/moved") && ls.contains("/data/big"),
        "{ls}"
    );
}

#[test]
fn bad_input_gets_a_clear_error_and_a_nonzero_exit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    // No master at all.
    let nobody = format!("127.0.0.1:{}", free_port());
    let out = Command::new(BIN)
        .args(["ls", "/", "--master", &nobody])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not answering") || err.contains("reach"),
        "{err}"
    );

    let c = Cluster::start(root, 3);
    std::thread::sleep(Duration::from_secs(2));
    // A path that does not exist.
    let out = c.cli(&["get", "/no/such/file", root.join("x").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    // A local file that does not exist.
    let out = c.cli(&["put", root.join("missing").to_str().unwrap(), "/f"]);
    assert!(!out.status.success());

    // Random bytes to every server's port: no crash, and the cluster keeps serving.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let addrs: Vec<String> = std::iter::once(c.master_addr.clone())
        .chain(c.servers.iter().map(|s| s.0.clone()))
        .collect();
    for a in &addrs {
        for _ in 0..5 {
            if let Ok(mut s) = std::net::TcpStream::connect(a) {
                let junk: Vec<u8> = (0..4096)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                let _ = s.write_all(&junk);
            }
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let f = root.join("f");
    let want = random_file(&f, 100_000, 3);
    c.eventually(
        &["put", f.to_str().unwrap(), "/after-junk"],
        Duration::from_secs(20),
    );
    let got = c.ok(&["cat", "/after-junk"]).stdout;
    assert!(got == want);
}
