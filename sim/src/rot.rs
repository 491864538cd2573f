//! The last copy of a version rots (`Scenario::last_copy_rot`): a scripted phase after
//! the workload that puts the master's mending (`master/mend.rs`) to work on every seed.
//!
//! The state it needs is rare under random faults: a chunk whose only copy of the
//! current version is corrupt, while older copies survive that still hold the corrupt
//! block intact. It arises when a mutation reaches one copy (the others down), those come
//! back stale, and the one current copy then rots in a block the mutation never touched.
//! Deleting that copy, as any other corrupt one is, would fall the chunk back to its
//! older copies and lose the acknowledged mutation. The phase makes the state on purpose:
//!
//! 1. a file of its own, written whole on all R copies (more than two blocks), on a
//!    cluster of exactly R chunkservers (with a spare, the goal would be restored from
//!    the one current copy before it rots);
//! 2. the other R−1 holders of its first chunk killed: with two or more, one first,
//!    and a small write into the first block taken by the rest; then the rest, and one
//!    small write acknowledged into its second block, by the one copy left (so the older
//!    copies hold two versions, and only the newer one the first block as it is now: the
//!    mend must judge each source's bytes by the copy's own checksums);
//! 3. a bit of the first block flipped on that copy (the older copies hold that block as
//!    it was) while its server is down (so its read cache no longer hides the rot); the
//!    killed servers started again, stale, and then it;
//! 4. the file read back whole: the read (or the clone that restores the chunk's goal)
//!    finds the rot, and the master must have the copy mended from the older ones.
//!
//! The run fails if the state could not be made, if that copy is not answered mended
//! within two minutes, or if the file reads back anything but what was acknowledged.
//! The file stays in the client's model, so the checks after healing judge it (and each
//! of its replicas) too.

use std::time::Duration;

use tessera_core::types::BLOCK_SIZE;

use crate::check::Shared;
use crate::cluster::Cluster;
use crate::run::rand;
use crate::workload::{self, ClientRun};

fn fail(checks: &Shared, cluster: &Cluster, what: String) {
    crate::run::fail(checks, cluster, format!("last copy rot: {what}"));
}

/// Starts servers `which` again.
fn restart(cluster: &mut Cluster, which: &[usize]) {
    for &i in which {
        cluster.restart_server(i);
    }
}

/// Runs `op` on client `run`'s node, with the run (its model) lent to it and given back.
pub(crate) async fn on_client<T, F, Fut>(cluster: &Cluster, run: &mut ClientRun, op: F) -> T
where
    T: Send + 'static,
    F: FnOnce(workload::C, ClientRun) -> Fut,
    Fut: std::future::Future<Output = (T, ClientRun)> + Send + 'static,
{
    let r = std::mem::replace(run, ClientRun::new(run.id, run.chunk_size));
    let h = cluster.clients[r.id].0.spawn(op(cluster.client(r.id), r));
    let (out, r) = h.await.expect("a client task of the rot phase died");
    *run = r;
    out
}

/// Makes the file `path` (and its directory) and writes `data` into it whole, patiently,
/// the file joining `run`'s model.
pub(crate) async fn made_whole(
    c: &workload::C,
    run: &mut ClientRun,
    path: &str,
    data: &bytes::Bytes,
) -> Result<(), tessera_core::FsError> {
    let dir = path.rsplit_once('/').map_or("/", |x| x.0).to_string();
    workload::patiently(|| c.mkdir(&dir, true)).await?;
    workload::made(c, path).await?;
    run.model.files.insert(path.to_string(), Default::default());
    let wrote = workload::patiently(|| c.write(path, 0, data.clone())).await;
    let f = run.model.files.get_mut(path).expect("just made");
    match wrote {
        Ok(()) => f.write_ok(0, data),
        Err(e) => {
            f.write_failed(0, data);
            return Err(e);
        }
    }
    Ok(())
}

/// The first chunk of `path` once all `r` of its copies are listed (`info` is what the
/// master answered first): a copy that failed to be made with the chunk (a slow disk, a
/// call timed out) is made by re-replication, within two minutes. Gives the chunk and
/// the indices of its holders among the cluster's chunkservers.
pub(crate) async fn every_copy_listed(
    cluster: &Cluster,
    run: &mut ClientRun,
    path: &str,
    mut info: tessera_core::pb::GetChunksResponse,
    r: usize,
) -> Result<(tessera_core::pb::ChunkLocation, Vec<usize>), String> {
    let deadline = cluster.true_ms() + 120_000;
    let index = |addr: &str| cluster.servers.iter().position(|s| s.addr == addr);
    loop {
        let chunk = info.chunks.iter().find(|c| c.index == 0).cloned();
        let holders: Vec<usize> = chunk
            .iter()
            .flat_map(|c| c.replicas.iter().filter_map(|a| index(a)))
            .collect();
        if let Some(chunk) = chunk
            && holders.len() == r
        {
            return Ok((chunk, holders));
        }
        if cluster.true_ms() > deadline {
            return Err(format!(
                "{path}'s first chunk has not {r} copies listed within 120 s: {info:?}"
            ));
        }
        madsim::time::sleep(Duration::from_secs(1)).await;
        let p = path.to_string();
        if let Ok(i) = on_client(cluster, run, |c, run| async move {
            (workload::get_chunks(&c, &p).await, run)
        })
        .await
        {
            info = i;
        }
    }
}

/// The phase (see the module's doc). `run` is a client's run whose model the file joins,
/// so the checks after healing judge it too.
pub async fn last_copy_rot(cluster: &mut Cluster, checks: &Shared, run: &mut ClientRun) {
    let path = format!("/c{}/rot", run.id);
    let r = cluster.knobs.replication as usize;
    // Exactly R servers: with a spare, the chunk's goal would be restored from the one
    // current copy before it rots.
    assert!(
        r >= 2 && r == cluster.servers.len(),
        "the last copy rot needs as many chunkservers as copies (2 or more), not {} for {r}",
        cluster.servers.len()
    );
    // 1. The file, whole on every copy: two blocks and more, in its first chunk (the
    // write goes into the second block and on, the rot into the first).
    let len = (2 * BLOCK_SIZE + 1 + rand() % BLOCK_SIZE).min(cluster.knobs.chunk_size);
    assert!(
        len > 2 * BLOCK_SIZE,
        "chunks of {} bytes are too small for the last copy rot",
        cluster.knobs.chunk_size
    );
    let data = workload::pattern(run.id, 7_000_000, len);
    let (p, d) = (path.clone(), data.clone());
    let made = on_client(cluster, run, |c, mut run| async move {
        let out = async {
            made_whole(&c, &mut run, &p, &d).await?;
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
            fail(
                checks,
                cluster,
                format!("writing {path} on a healthy cluster failed: {e}"),
            );
            return;
        }
    };
    let (chunk, holders) = match every_copy_listed(cluster, run, &path, info, r).await {
        Ok(x) => x,
        Err(e) => {
            fail(checks, cluster, e);
            return;
        }
    };
    let h = chunk.handle;
    let keep = holders[(rand() % r as u64) as usize];
    let others: Vec<usize> = holders.iter().copied().filter(|&i| i != keep).collect();

    // 2. The others down, in two steps when there are two or more: the first misses a
    // write into the first block, which the rest take; then the rest go down too and one
    // write into the second block is taken by the one copy left. The older copies then
    // hold two versions, and only the newer holds the first block as it is now.
    // Their versions as they go down (a crashed server's word is forgotten).
    let oldest = if others.len() >= 2 { 1 } else { 0 };
    let version_of = |cluster: &Cluster, i: usize| {
        checks
            .lock()
            .expect("checks")
            .versions
            .server_version(&cluster.servers[i].addr, h)
    };
    let mut older: Vec<Option<u64>> = Vec::new();
    let mut wrote = Ok(());
    for (step, down) in [&others[..oldest], &others[oldest..]]
        .into_iter()
        .enumerate()
    {
        for &i in down {
            older.push(version_of(cluster, i));
            cluster.kill_server(i);
        }
        if down.is_empty() || wrote.is_err() {
            continue;
        }
        let (off, seq) = if step == 0 {
            (rand() % (BLOCK_SIZE - 100), 7_000_002)
        } else {
            (BLOCK_SIZE + rand() % (len - BLOCK_SIZE - 100), 7_000_001)
        };
        let d = workload::pattern(run.id, seq, 100);
        let p = path.clone();
        wrote = on_client(cluster, run, |c, mut run| async move {
            let wrote = workload::patiently(|| c.write(&p, off, d.clone())).await;
            let f = run.model.files.get_mut(&p).expect("modelled");
            match &wrote {
                Ok(()) => f.write_ok(off, &d),
                Err(_) => f.write_failed(off, &d),
            }
            (wrote, run)
        })
        .await;
    }
    let kept = cluster.servers[keep].addr.clone();
    let current = checks
        .lock()
        .expect("checks")
        .versions
        .server_version(&kept, h);
    if let Err(e) = wrote {
        restart(cluster, &others);
        fail(
            checks,
            cluster,
            format!("with one copy of chunk {h} up ({kept}), a write failed: {e}"),
        );
        return;
    }
    if older.iter().any(|v| v.is_none() || *v >= current) || current.is_none() {
        restart(cluster, &others);
        fail(
            checks,
            cluster,
            format!(
                "chunk {h}: {kept} holds v{current:?}, the others {older:?}: the write did not leave one current copy"
            ),
        );
        return;
    }

    // 3. The one current copy rots in its first block, which the newer older copies
    // hold as it is (checked byte for byte); then the older copies come back.
    let ours = cluster.servers[keep]
        .disk
        .durable_data(h)
        .unwrap_or_default();
    let first = 0..BLOCK_SIZE as usize;
    let same = others[oldest..].iter().all(|&i| {
        cluster.servers[i].disk.durable_data(h).is_some_and(|d| {
            d.len() >= first.end
                && ours.len() >= first.end
                && d[first.clone()] == ours[first.clone()]
        })
    });
    if !same {
        restart(cluster, &others);
        fail(
            checks,
            cluster,
            format!("chunk {h}: the newer older copies' first block differs from {kept}'s"),
        );
        return;
    }
    let at = (rand() % BLOCK_SIZE) as usize;
    // Its server restarts too, so that its read cache (which holds what was just
    // written) no longer hides the rot: reads and clones of the block come from disk.
    cluster.kill_server(keep);
    if !cluster.flip_bit(keep, h, at, (rand() % 8) as u8) {
        restart(cluster, &holders);
        fail(
            checks,
            cluster,
            format!("chunk {h}: no byte {at} to flip on {kept}"),
        );
        return;
    }
    cluster.count_fault("last_copy_rot", 1);
    tracing::info!(
        t = cluster.true_ms(),
        "last copy rot: chunk {h} v{current:?} on {kept} flipped at {at}; older copies v{older:?} restart"
    );
    // The older copies first, and heard by the master, so that they answer the mend's
    // reads when it comes (a source that does not answer is skipped).
    restart(cluster, &others);
    madsim::time::sleep(2 * cluster.knobs.heartbeat + Duration::from_millis(500)).await;
    cluster.restart_server(keep);

    // 4. Read back: the acknowledged write must be there, and the copy mended.
    let p = path.clone();
    let read = on_client(cluster, run, |c, run| async move {
        (workload::patiently(|| c.read(&p, 0, u64::MAX)).await, run)
    })
    .await;
    let model = run.model.files[&path].clone();
    match read {
        Ok(got) => {
            if let Err(e) = model.check_read(0, u64::MAX, &got) {
                fail(
                    checks,
                    cluster,
                    format!("{path} (chunk {h}) read back wrong: {e}"),
                );
            }
        }
        Err(e) => fail(
            checks,
            cluster,
            format!("{path} (chunk {h}) cannot be read: {e}"),
        ),
    }
    let deadline = cluster.true_ms() + 120_000;
    loop {
        let (mended, counts) = {
            let c = checks.lock().expect("checks");
            (c.mended.contains(&(kept.clone(), h)), c.mends)
        };
        if mended {
            return;
        }
        if cluster.true_ms() > deadline {
            fail(
                checks,
                cluster,
                format!(
                    "chunk {h}'s one current copy on {kept} rotted in a block its older copies hold; \
                     not mended within 120 s (mends in the run, ok/failed: {counts:?})"
                ),
            );
            return;
        }
        madsim::time::sleep(Duration::from_secs(1)).await;
    }
}
