//! `tessera bench meta`: the master's metadata operations over RPC from C concurrent
//! clients, as QFS's mstress measures its metaserver. Each client makes a directory of
//! its own under one root, then, phase by phase (each phase starts when every client
//! finished the one before): creates N empty files in it, stats each, lists the
//! directory, renames each file and deletes each. Each phase reports operations per
//! second over all clients and the latency percentiles of one operation. Every create
//! and rename is acknowledged only once its log record is durable (on a master group,
//! on a majority), as always.
//!
//! The root is removed at the end. The files are empty: no chunkserver takes part.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use tessera_core::client::{Client, ClientConfig};
use tessera_core::error::FsError;

use crate::rt::TokioRuntime;
use crate::transport::GrpcTransport;

/// One phase's figures.
#[derive(Clone, Debug)]
pub struct Phase {
    pub op: &'static str,
    pub clients: usize,
    pub ops: u64,
    pub wall: Duration,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
}

impl Phase {
    pub fn per_sec(&self) -> f64 {
        self.ops as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

type C = Client<TokioRuntime, GrpcTransport>;

#[derive(Clone, Copy, Debug)]
enum Op {
    Create,
    Stat,
    List,
    Rename,
    Delete,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Stat => "stat",
            Op::List => "list",
            Op::Rename => "rename",
            Op::Delete => "delete",
        }
    }
}

/// Lists per client in the list phase (a listing is one RPC per 1,000 entries).
const LISTS: usize = 10;

/// Runs the phases with each number of clients in `clients`, `files` files per client.
pub async fn run(
    master: &str,
    clients: &[usize],
    files: usize,
    net: &GrpcTransport,
) -> Result<Vec<Phase>, String> {
    if clients.is_empty() || clients.contains(&0) || files == 0 {
        return Err("give at least one client and one file".into());
    }
    let root = format!("/bench-meta-{:08x}", rand::random::<u32>());
    let admin = client(master, net);
    admin
        .mkdir(&root, false)
        .await
        .map_err(|e| format!("mkdir {root}: {e}"))?;
    let mut out = Vec::new();
    for (round, &n) in clients.iter().enumerate() {
        let cs: Vec<C> = (0..n).map(|_| client(master, net)).collect();
        let dirs: Vec<String> = (0..n).map(|i| format!("{root}/r{round}c{i}")).collect();
        for (c, d) in cs.iter().zip(&dirs) {
            c.mkdir(d, false)
                .await
                .map_err(|e| format!("mkdir {d}: {e}"))?;
        }
        for op in [Op::Create, Op::Stat, Op::List, Op::Rename, Op::Delete] {
            out.push(phase(&cs, &dirs, op, files).await?);
        }
    }
    admin
        .delete(&root, true)
        .await
        .map_err(|e| format!("removing {root}: {e}"))?;
    Ok(out)
}

fn client(master: &str, net: &GrpcTransport) -> C {
    let mut cfg = ClientConfig::new(master);
    cfg.retry_for = Duration::from_secs(30);
    // A benchmark measures the leader; a shadow's answer would flatter the reads.
    cfg.shadow_reads = false;
    // Each client its own connections, as separate processes would have.
    Client::new(TokioRuntime, net.fresh(), cfg)
}

async fn phase(cs: &[C], dirs: &[String], op: Op, files: usize) -> Result<Phase, String> {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (c, d) in cs.iter().zip(dirs) {
        let (c, d) = (c.clone(), d.clone());
        tasks.spawn(async move { one_client(&c, &d, op, files).await });
    }
    let mut lat = Vec::new();
    while let Some(r) = tasks.join_next().await {
        lat.extend(r.map_err(|e| format!("a client task failed: {e}"))??);
    }
    let wall = start.elapsed();
    lat.sort_unstable();
    let pct = |p: usize| lat[(lat.len() * p / 100).min(lat.len() - 1)];
    Ok(Phase {
        op: op.name(),
        clients: cs.len(),
        ops: lat.len() as u64,
        wall,
        p50: pct(50),
        p90: pct(90),
        p99: pct(99),
    })
}

async fn one_client(c: &C, dir: &str, op: Op, files: usize) -> Result<Vec<Duration>, String> {
    let name = |i: usize| format!("{dir}/f{i:07}");
    let moved = |i: usize| format!("{dir}/g{i:07}");
    let count = if matches!(op, Op::List) { LISTS } else { files };
    let mut lat = Vec::with_capacity(count);
    for i in 0..count {
        let t = Instant::now();
        let r: Result<(), FsError> = match op {
            Op::Create => c.create(&name(i), 1).await,
            Op::Stat => c.stat(&name(i)).await.map(|_| ()),
            Op::List => match c.list(dir, false).await {
                Ok(es) if es.len() == files => Ok(()),
                Ok(es) => Err(FsError::Internal(format!(
                    "{dir} lists {} entries, not {files}",
                    es.len()
                ))),
                Err(e) => Err(e),
            },
            Op::Rename => c.rename(&name(i), &moved(i)).await,
            Op::Delete => c.delete(&moved(i), false).await,
        };
        lat.push(t.elapsed());
        r.map_err(|e| format!("{} {}: {e}", op.name(), name(i)))?;
    }
    Ok(lat)
}

/// One line per phase.
pub fn text(phases: &[Phase]) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut out = String::new();
    for p in phases {
        let _ = writeln!(
            out,
            "{:<7} clients={:<3} ops={:<7} ops/s={:<9.0} p50={:.2}ms p90={:.2}ms p99={:.2}ms",
            p.op,
            p.clients,
            p.ops,
            p.per_sec(),
            ms(p.p50),
            ms(p.p90),
            ms(p.p99)
        );
    }
    out
}
