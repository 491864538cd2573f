//! Shared helpers for Tessera's benchmarks: a harness that drives the pure master state
//! machine the way its driver would, answering its calls to chunkservers at once; and,
//! for the benchmarks that start clusters of processes, credentials and the commands
//! that run as their holders.

use std::time::Duration;

use tessera_core::master::{Input, Master, MasterConfig, RequestId};
use tessera_core::pb::{self, master_request::Req, master_response::Resp};
use tessera_core::types::Time;

pub struct MasterHarness {
    pub master: Master,
    now: Time,
    next: RequestId,
}

impl MasterHarness {
    /// A master with `servers` live chunkservers on `racks` racks, past its start-up
    /// lease quiet period.
    pub fn new(servers: usize, racks: usize) -> MasterHarness {
        // Servers never time out here: the harness sends no heartbeats after the first.
        let cfg = MasterConfig {
            checkpoint_every: u64::MAX,
            creation_limit: u32::MAX,
            heartbeat_timeout: Duration::from_secs(u64::MAX / 4000),
            ..MasterConfig::default()
        };
        let mut h = MasterHarness {
            master: Master::new(cfg, Time(0)),
            now: Time(0),
            next: 1,
        };
        h.now = Time(0) + Duration::from_secs(120);
        for i in 0..servers {
            h.request(Req::Heartbeat(pb::HeartbeatRequest {
                address: format!("cs{i}"),
                rack: format!("rack{}", i % racks),
                capacity_bytes: 1 << 50,
                ..Default::default()
            }));
        }
        h
    }

    /// Sends a request, reports the log durable, answers every call with success, and
    /// returns the reply.
    pub fn request(&mut self, req: Req) -> pb::MasterResponse {
        let id = self.next;
        self.next += 1;
        let mut replies = Vec::new();
        let mut e = self.master.handle(
            self.now,
            Input::Request {
                id,
                req: pb::MasterRequest {
                    req: Some(req),
                    ..Default::default()
                },
                from: tessera_core::auth::Caller::Insecure,
            },
        );
        loop {
            replies.append(&mut e.replies);
            let calls = std::mem::take(&mut e.calls);
            if !e.log.is_empty() || !calls.is_empty() {
                for c in calls {
                    let ok = pb::ChunkResponse {
                        error: None,
                        resp: Some(pb::chunk_response::Resp::Empty(pb::Empty {})),
                        ..Default::default()
                    };
                    let mut more = self.master.handle(
                        self.now,
                        Input::CallResult {
                            id: c.id,
                            result: Ok(ok),
                        },
                    );
                    replies.append(&mut more.replies);
                    e.calls.append(&mut more.calls);
                    e.log.append(&mut more.log);
                }
                let through = self.master.last_seq();
                let mut synced = self.master.handle(self.now, Input::LogSynced { through });
                replies.append(&mut synced.replies);
                e = synced;
                if e.calls.is_empty() && e.log.is_empty() {
                    replies.append(&mut e.replies);
                    break;
                }
            } else {
                break;
            }
        }
        replies
            .into_iter()
            .find(|(i, _)| *i == id)
            .map(|(_, r)| r)
            .expect("a reply")
    }

    /// Lets `d` pass and ticks once: expired leases go, repair queues settle.
    pub fn tick(&mut self, d: Duration) {
        self.now = self.now + d;
        let e = self.master.handle(self.now, Input::Tick);
        assert!(
            e.calls.is_empty() && e.log.is_empty(),
            "unexpected work on tick: {e:?}"
        );
    }

    pub fn mkdir(&mut self, path: &str) {
        let r = self.request(Req::Mkdir(pb::MkdirRequest {
            mode: None,
            path: path.into(),
            parents: true,
        }));
        assert!(r.error.is_none(), "{r:?}");
    }

    pub fn create(&mut self, path: &str) {
        let r = self.request(Req::Create(pb::CreateRequest {
            mode: None,
            path: path.into(),
            replication: 3,
        }));
        assert!(r.error.is_none(), "{r:?}");
    }

    /// Allocates chunk `index` of `path` with a lease: the whole write-target path.
    pub fn allocate(&mut self, path: &str, index: u64) -> pb::WriteTarget {
        match self.request(Req::GetWriteTarget(pb::GetWriteTargetRequest {
            path: path.into(),
            chunk_index: index,
            append: false,
        })) {
            pb::MasterResponse {
                resp: Some(Resp::WriteTarget(t)),
                ..
            } => t,
            other => panic!("{other:?}"),
        }
    }

    pub fn locations(&mut self, path: &str) -> pb::GetChunksResponse {
        match self.request(Req::GetChunks(pb::GetChunksRequest {
            path: path.into(),
            first_index: 0,
            count: 0,
        })) {
            pb::MasterResponse {
                resp: Some(Resp::GetChunks(c)),
                ..
            } => c,
            other => panic!("{other:?}"),
        }
    }
}

/// The binary run as the holder of `who`'s credentials in `pki` (a secured cluster's
/// node or user, from [`make_pki`]), or as an insecure cluster's.
pub fn as_holder(
    bin: &std::path::Path,
    pki: Option<&std::path::Path>,
    who: &str,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin);
    match pki {
        Some(p) => {
            cmd.env("TESSERA_CERTS", p.join(who))
                .env_remove("TESSERA_INSECURE");
        }
        None => {
            cmd.env("TESSERA_INSECURE", "true")
                .env_remove("TESSERA_CERTS");
        }
    }
    cmd
}

/// A certificate authority in `dir/pki/ca`, and credentials from it for each of
/// `holders`, (role, name, directory under `dir/pki`) each, made with the binary's own
/// `admin certs` commands. Returns `dir/pki`.
pub fn make_pki(
    bin: &std::path::Path,
    dir: &std::path::Path,
    holders: &[(&str, String, String)],
) -> std::path::PathBuf {
    let pki = dir.join("pki");
    let ca = pki.join("ca");
    let run = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(bin)
            .args(args)
            .output()
            .expect("run tessera");
        assert!(out.status.success(), "tessera {args:?}: {out:?}");
    };
    run(&[
        "admin".as_ref(),
        "certs".as_ref(),
        "init".as_ref(),
        "--ca".as_ref(),
        ca.as_os_str(),
    ]);
    for (role, name, out) in holders {
        let out = pki.join(out);
        run(&[
            "admin".as_ref(),
            "certs".as_ref(),
            "issue".as_ref(),
            "--ca".as_ref(),
            ca.as_os_str(),
            "--role".as_ref(),
            role.as_ref(),
            "--name".as_ref(),
            name.as_ref(),
            "--out".as_ref(),
            out.as_os_str(),
        ]);
    }
    pki
}

/// CPU time (user and system) processes `pids` have used so far, in ms, read from /proc
/// (0 for one that cannot be read).
pub fn cpu_ms_of(pids: impl IntoIterator<Item = u32>) -> f64 {
    let ticks: f64 = pids
        .into_iter()
        .filter_map(|pid| stat_ticks(&format!("/proc/{pid}/stat"), 11))
        .sum();
    ticks * 1000.0 / clock_ticks()
}

/// CPU time (user and system) of this process's children that have ended and been
/// waited for, in ms: its change across one command run to completion is that
/// command's.
pub fn reaped_children_cpu_ms() -> f64 {
    stat_ticks("/proc/self/stat", 13).unwrap_or(0.0) * 1000.0 / clock_ticks()
}

/// The sum of the two /proc stat fields from the `at`th after the command's closing
/// parenthesis (11: utime and stime; 13: cutime and cstime), in clock ticks.
fn stat_ticks(path: &str, at: usize) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(at)?.parse::<f64>().ok()? + f.get(at + 1)?.parse::<f64>().ok()?)
}

/// Clock ticks per second, asked of `getconf` once: a process run at each reading would
/// count its own CPU time in the next one.
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .filter(|&t| t > 0.0)
            .unwrap_or(100.0)
    })
}
