//! A client that lives long (`Scenario::long_lived`): a scripted phase after healing in
//! which one client, holding what it learnt of a file (its chunk's locations, cached for
//! an hour, and a write target), outlives every replica it knew.
//!
//! Short-lived clients never show a cache kept past its truth: a new one asks the master
//! afresh. The phase keeps one client for its whole length:
//!
//! 1. a file of its own in one chunk, written whole, written again and read by that
//!    client (its cache now holds the chunk's R holders, and its write target);
//! 2. the holders taken down one at a time, for good as far as the client can tell,
//!    each once the master lists the chunk on servers none of which is down (the last
//!    leaves fewer than R copies, all on servers the client never heard of);
//! 3. the client reads the file whole, writes into it and reads the write back: each
//!    operation must end within a bound (a read: a few calls' deadlines; a write: a lease
//!    period more, as the old primary's lease may still be out), and its latency is
//!    counted (`RunOutcome::long_lived_max_ms`);
//! 4. the holders come back with the file's chunk gone from their disks (replaced
//!    disks), and the cluster heals around them.
//!
//! The file is in the client's model, so the checks after healing judge it too.

use std::time::Duration;

use crate::check::Shared;
use crate::cluster::Cluster;
use crate::rot::{every_copy_listed, made_whole};
use crate::run::rand;
use crate::workload::{self, ClientRun};

fn fail(checks: &Shared, cluster: &Cluster, what: String) {
    crate::run::fail(checks, cluster, format!("long-lived client: {what}"));
}

/// How long the long-lived client keeps a chunk's locations: longer than the phase.
const TTL: Duration = Duration::from_secs(3600);

/// Runs `op` with the long-lived client on its node, the run lent to it.
async fn with<T, F, Fut>(cluster: &Cluster, c: &workload::C, run: &mut ClientRun, op: F) -> T
where
    T: Send + 'static,
    F: FnOnce(workload::C, ClientRun) -> Fut,
    Fut: std::future::Future<Output = (T, ClientRun)> + Send + 'static,
{
    let r = std::mem::replace(run, ClientRun::new(run.id, run.chunk_size));
    let h = cluster.clients[r.id].0.spawn(op(c.clone(), r));
    let (out, r) = h.await.expect("a client task of the long-lived phase died");
    *run = r;
    out
}

/// The phase (see the module's doc).
pub async fn long_lived(cluster: &mut Cluster, checks: &Shared, run: &mut ClientRun) {
    let path = format!("/c{}/long-lived", run.id);
    let r = cluster.knobs.replication as usize;
    assert!(
        cluster.servers.len() > r,
        "the long-lived client needs a spare chunkserver"
    );
    let client = cluster.client_with_ttl(run.id, TTL);

    // 1. Written, read and written again by the one client.
    let len = 200 + rand() % (cluster.knobs.chunk_size - 200);
    let data = workload::pattern(run.id, 10_000_000, len);
    let (p, d) = (path.clone(), data.clone());
    let made = with(cluster, &client, run, |c, mut run| async move {
        let out = async {
            made_whole(&c, &mut run, &p, &d).await?;
            let w = workload::pattern(run.id, 10_000_001, 100);
            let off = rand() % (len - 100);
            let wrote = workload::patiently(|| c.write(&p, off, w.clone())).await;
            let f = run.model.files.get_mut(&p).expect("just made");
            match &wrote {
                Ok(()) => f.write_ok(off, &w),
                Err(_) => f.write_failed(off, &w),
            }
            wrote?;
            // Last, a read: a write forgets the file's locations, a read caches them.
            workload::patiently(|| c.read(&p, 0, u64::MAX)).await?;
            workload::get_chunks(&c, &p)
                .await
                .map_err(tessera_core::FsError::Unavailable)
        }
        .await;
        (out, run)
    })
    .await;
    let info = match made {
        Ok(info) => info,
        Err(e) => {
            let e = format!("writing {path} on a healthy cluster failed: {e}");
            return fail(checks, cluster, e);
        }
    };
    let (chunk, holders) = match every_copy_listed(cluster, run, &path, info, r).await {
        Ok(x) => x,
        Err(e) => return fail(checks, cluster, e),
    };
    let h = chunk.handle;

    // 2. The holders down, one at a time, each once the chunk is listed on servers that
    // are all up (as many as it can be).
    let mut down = Vec::new();
    for &i in &holders {
        cluster.kill_server(i);
        down.push(i);
        let want = r.min(cluster.servers.len() - down.len());
        let deadline = cluster.true_ms() + 120_000;
        loop {
            let p = path.clone();
            let fresh = cluster.client(run.id);
            let listed = with(cluster, &fresh, run, |c, run| async move {
                (workload::get_chunks(&c, &p).await, run)
            })
            .await;
            let on: Vec<String> = listed
                .iter()
                .flat_map(|l| l.chunks.iter().filter(|c| c.index == 0))
                .flat_map(|c| c.replicas.clone())
                .collect();
            let up = |a: &String| !down.iter().any(|&d: &usize| cluster.servers[d].addr == *a);
            if on.len() == want && on.iter().all(up) {
                break;
            }
            if cluster.true_ms() > deadline {
                for &d in &down {
                    cluster.restart_server(d);
                }
                let e = format!(
                    "chunk {h} not listed on {want} servers that are up within 120 s of \
                     {} going down: {on:?}",
                    cluster.servers[i].addr
                );
                return fail(checks, cluster, e);
            }
            madsim::time::sleep(Duration::from_millis(500)).await;
        }
    }
    cluster.count_fault("long_lived_holders_replaced", down.len() as u64);
    tracing::info!(
        t = cluster.true_ms(),
        "long-lived client: every holder of chunk {h} it knew is down"
    );

    // 3. The client, its cache as it was: a read, a write, a read of the write. Each
    // within its bound.
    let k = &cluster.knobs;
    let calls = k.rpc_timeout * (r as u32 + 2) + Duration::from_secs(5);
    let bounds = [calls, k.lease + calls, calls];
    let p = path.clone();
    let timed = with(cluster, &client, run, |c, mut run| async move {
        let mut took = Vec::new();
        let at = madsim::time::Instant::now();
        let read = c.read(&p, 0, u64::MAX).await;
        took.push(at.elapsed());
        let f = run.model.files.get(&p).expect("modelled").clone();
        let mut out = match read {
            Ok(got) => f.check_read(0, u64::MAX, &got),
            Err(e) => Err(format!("the read failed: {e}")),
        };
        let w = workload::pattern(run.id, 10_000_002, 100);
        let off = rand() % (len - 100);
        let at = madsim::time::Instant::now();
        let wrote = c.write(&p, off, w.clone()).await;
        took.push(at.elapsed());
        let f = run.model.files.get_mut(&p).expect("modelled");
        match &wrote {
            Ok(()) => f.write_ok(off, &w),
            Err(_) => f.write_failed(off, &w),
        }
        if let (Ok(()), Err(e)) = (&out, &wrote) {
            out = Err(format!("the write failed: {e}"));
        }
        let at = madsim::time::Instant::now();
        let back = c.read(&p, off, 100).await;
        took.push(at.elapsed());
        if out.is_ok() {
            out = match back {
                Ok(got) if got[..] == w[..] => Ok(()),
                Ok(got) => Err(format!("the write read back as {} other bytes", got.len())),
                Err(e) => Err(format!("the read of the write failed: {e}")),
            };
        }
        ((out, took), run)
    })
    .await;

    // 4. The holders back, their copies of the chunk gone.
    for &i in &down {
        cluster.lose_chunk(i, h);
        cluster.restart_server(i);
    }
    let (out, took) = timed;
    let most = took.iter().max().copied().unwrap_or_default();
    {
        let mut c = checks.lock().expect("checks");
        c.long_lived_max_ms = c.long_lived_max_ms.max(most.as_millis() as u64);
    }
    if let Err(e) = out {
        let e = format!("after every holder of {path} (chunk {h}) it knew went down: {e}");
        return fail(checks, cluster, e);
    }
    let ops = ["the read", "the write", "the read of the write"];
    for ((op, t), bound) in ops.iter().zip(&took).zip(bounds) {
        if *t > bound {
            fail(
                checks,
                cluster,
                format!(
                    "after every holder of {path} (chunk {h}) it knew went down, {op} took \
                     {t:?}, past its bound of {bound:?}"
                ),
            );
        }
    }
}
