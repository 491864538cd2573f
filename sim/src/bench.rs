//! Aggregate record-append throughput with many appenders on one file (GFS §3.3's
//! producer-consumer queue, QFS's concurrent append), in simulated time.
//!
//! The simulated network has latency (madsim's default: 1–10 ms per message) but no
//! bandwidth limit, and the simulated disk no delay, so the figures measure the protocol:
//! its round trips, and where it serializes (one mutation at a time per chunk at the
//! primary, one log sync at a time at the master). They are not a prediction of bytes
//! per second on hardware.

use std::time::Duration;

use bytes::Bytes;
use tessera_core::record;

use crate::check;
use crate::cluster::{Cluster, Knobs, Shape};
use crate::workload::{self, Kind, Workload};

#[derive(Clone, Copy, Debug)]
pub struct AppendBench {
    pub appenders: usize,
    /// How long the appenders run, in simulated time.
    pub duration: Duration,
    /// Payload bytes per record (the frame adds `record::HEADER`).
    pub record: usize,
}

#[derive(Clone, Debug, Default)]
pub struct AppendFigures {
    pub appenders: usize,
    pub records: u64,
    pub failed: u64,
    pub payload_bytes: u64,
    pub sim_ms: u64,
    /// Records found reading the file back (duplicates included) and any violation of
    /// the append rules among them.
    pub found: usize,
    pub violations: Vec<String>,
}

impl AppendFigures {
    pub fn records_per_sec(&self) -> f64 {
        self.records as f64 * 1000.0 / self.sim_ms.max(1) as f64
    }

    pub fn mb_per_sec(&self) -> f64 {
        self.payload_bytes as f64 / 1e6 * 1000.0 / self.sim_ms.max(1) as f64
    }
}

/// Runs the benchmark once with `seed`, on the current thread.
pub fn append_throughput(seed: u64, b: AppendBench) -> AppendFigures {
    let mut rt = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
    rt.set_time_limit(Duration::from_secs(3_600));
    rt.block_on(async move { world(b).await })
}

async fn world(b: AppendBench) -> AppendFigures {
    let mut knobs = Knobs::pick(&mut || madsim::rand::random());
    // A fixed, fault-free setting: production-like leases, no clock error.
    knobs.chunk_size = 4 << 20;
    knobs.lease = Duration::from_secs(60);
    knobs.max_clock_skew = Duration::from_millis(200);
    knobs.heartbeat = Duration::from_millis(500);
    knobs.heartbeat_timeout = Duration::from_secs(8);
    knobs.rpc_timeout = Duration::from_secs(3);
    knobs.clock_offset_ms = 0;
    knobs.clock_drift_ppm = 0;
    knobs.checkpoint_every = 100_000;
    let checks = check::shared();
    let shape = Shape {
        masters: 1,
        chunkservers: 5,
        racks: 3,
        clients: b.appenders,
    };
    let cluster = Cluster::start(shape, knobs.clone(), checks.clone());
    madsim::time::sleep(Duration::from_secs(2)).await;
    let w = Workload {
        kind: Kind::Appends { files: 1 },
        no_reads: false,
        ops: 0,
        max_files: 1,
        max_write: 0,
        max_file: 0,
        think: Duration::ZERO,
        delete_permille: 0,
    };
    let path = workload::shared_paths(&w)[0].clone();
    {
        let client = cluster.client(0);
        let checks = checks.clone();
        cluster.clients[0]
            .0
            .spawn(async move { workload::setup(&client, &w, &checks).await })
            .await
            .expect("setup");
    }
    // Bytes stored are not kept: a long run would hold every byte in memory.
    checks.lock().expect("checks").stored = None;
    let start = madsim::time::Instant::now();
    let until = start + b.duration;
    let mut tasks = Vec::new();
    for i in 0..b.appenders {
        let client = cluster.client(i);
        let (checks, path) = (checks.clone(), path.clone());
        tasks.push(cluster.clients[i].0.spawn(async move {
            let (mut ok, mut failed, mut bytes) = (0u64, 0u64, 0u64);
            let mut n = 0u64;
            while madsim::time::Instant::now() < until {
                n += 1;
                let payload: Bytes = (0..b.record)
                    .map(|k| (k as u64 ^ n ^ (i as u64) << 8) as u8)
                    .collect::<Vec<u8>>()
                    .into();
                let id = madsim::rand::random::<u64>();
                checks
                    .lock()
                    .expect("checks")
                    .appends
                    .get_mut(&path)
                    .expect("append file")
                    .attempted
                    .insert(id, payload.clone());
                match client
                    .record_append(&path, record::frame(id, &payload))
                    .await
                {
                    Ok(at) => {
                        ok += 1;
                        bytes += payload.len() as u64;
                        let t = cluster_ms(start);
                        checks
                            .lock()
                            .expect("checks")
                            .appends
                            .get_mut(&path)
                            .expect("append file")
                            .acked
                            .push((id, at, t));
                    }
                    Err(_) => failed += 1,
                }
            }
            (ok, failed, bytes)
        }));
    }
    let mut f = AppendFigures {
        appenders: b.appenders,
        ..Default::default()
    };
    for t in tasks {
        let (ok, failed, bytes) = t.await.expect("appender");
        f.records += ok;
        f.failed += failed;
        f.payload_bytes += bytes;
    }
    f.sim_ms = start.elapsed().as_millis() as u64;
    // Read it all back and judge it: every acknowledged record there, at its offset.
    let client = cluster.client(0);
    let (checks2, path2) = (checks.clone(), path.clone());
    let cs = knobs.chunk_size;
    let verdict = cluster.clients[0]
        .0
        .spawn(async move {
            let data = client.read(&path2, 0, u64::MAX).await?;
            let c = checks2.lock().expect("checks");
            Ok::<_, tessera_core::FsError>(c.appends[&path2].check(
                &data,
                0,
                u64::MAX,
                cs,
                i64::MAX,
                None,
                None,
            ))
        })
        .await
        .expect("reader");
    match verdict {
        Ok(Ok(n)) => f.found = n,
        Ok(Err(v)) => f.violations.push(v),
        Err(e) => f
            .violations
            .push(format!("reading the file back failed: {e}")),
    }
    f
}

fn cluster_ms(start: madsim::time::Instant) -> i64 {
    start.elapsed().as_millis() as i64
}
