//! Clones racing rot and version bumps (`Scenario::clone_race`): a scripted phase after
//! the workload that builds, on every seed, two states random faults reach rarely.
//!
//! A clone reads its source in pieces (`cluster::CLONE_PIECE`) and stores what it read
//! under fresh checksums of its own, so whatever bytes the source hands over become a
//! copy the new holder vouches for; and it copies one version while writes go on, so
//! the chunk may have moved on by the time it is done. Either way the copy must never
//! be listed serving bytes the chunk's other copies do not hold. The phase:
//!
//! 1. writes a file of its own, one chunk (longer than a clone piece where chunks are),
//!    on R copies, on a
//!    cluster of R+2 servers or more;
//! 2. **rot as the clone reads**: restarts every holder (so no read cache hides the
//!    disk), kills one for good, and arms the rot (`check::clones`): the first read of
//!    the chunk from a holder's disk past the clone's first piece has a bit of the range
//!    it reads flipped at the step that reads it. The source must refuse the piece, and
//!    the chunk be restored from its good copy, within two minutes;
//! 3. **a version bump racing the clone**: kills another holder for good; the first
//!    clone of the chunk to start storing its copy on a spare has that disk stuck past
//!    the clone's timeout, its server is cut off from the master, and the phase writes
//!    into the chunk at once. The master grants no lease while it restores the chunk,
//!    so the write waits until the master gives the clone up and restores the chunk
//!    elsewhere, then takes a new version there; the clone's copy, of the old version,
//!    is stored after that, and its server heard again. A second write follows at once.
//!
//! The run fails if either state could not be made, if the chunk is not back at R
//! copies within two minutes after each, or if the file reads back anything but what
//! was acknowledged. The file stays in the client's model, so the checks after healing
//! judge it and compare its copies byte for byte (`check::copies`).

use std::collections::HashMap;
use std::time::Duration;

use tessera_core::pb::ChunkLocation;

use crate::check::Shared;
use crate::check::clones::{ArmedHold, ArmedRot, CloneWatch, Flip, Stick};
use crate::cluster::{CLONE_PIECE, Cluster};
use crate::rot::{made_whole, on_client};
use crate::run::rand;
use crate::workload::{self, ClientRun};

fn fail(checks: &Shared, cluster: &Cluster, what: String) {
    crate::run::fail(checks, cluster, format!("clone race: {what}"));
}

/// Waits (two minutes at most) until the file's chunk lists exactly R copies, none on
/// `not`; its location and the holders' indexes.
async fn listed(
    cluster: &Cluster,
    run: &mut ClientRun,
    path: &str,
    not: &[usize],
) -> Result<(ChunkLocation, Vec<usize>), String> {
    let r = cluster.knobs.replication as usize;
    let deadline = cluster.true_ms() + 120_000;
    let index = |addr: &str| cluster.servers.iter().position(|s| s.addr == addr);
    let mut last = None;
    loop {
        let p = path.to_string();
        let got = on_client(cluster, run, |c, run| async move {
            (workload::get_chunks(&c, &p).await, run)
        })
        .await;
        if let Ok(info) = got {
            let chunk = info.chunks.iter().find(|c| c.index == 0).cloned();
            if let Some(chunk) = chunk {
                let holders: Vec<usize> = chunk.replicas.iter().filter_map(|a| index(a)).collect();
                if holders.len() == r && holders.iter().all(|i| !not.contains(i)) {
                    return Ok((chunk, holders));
                }
                last = Some(chunk);
            }
        }
        if cluster.true_ms() > deadline {
            return Err(format!(
                "{path}'s chunk has not {r} copies listed (none on {not:?}) within 120 s: {last:?}"
            ));
        }
        madsim::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Writes `data` at `off` of the file, patiently, and keeps the model.
async fn write(
    cluster: &Cluster,
    run: &mut ClientRun,
    path: &str,
    off: u64,
    data: bytes::Bytes,
) -> Result<(), tessera_core::FsError> {
    let p = path.to_string();
    on_client(cluster, run, |c, mut run| async move {
        let wrote = workload::patiently(|| c.write(&p, off, data.clone())).await;
        let f = run.model.files.get_mut(&p).expect("modelled");
        match &wrote {
            Ok(()) => f.write_ok(off, &data),
            Err(_) => f.write_failed(off, &data),
        }
        (wrote, run)
    })
    .await
}

/// Reads the file back whole against the model.
async fn read_back(
    cluster: &Cluster,
    checks: &Shared,
    run: &mut ClientRun,
    path: &str,
    when: &str,
) {
    let p = path.to_string();
    let read = on_client(cluster, run, |c, run| async move {
        (workload::patiently(|| c.read(&p, 0, u64::MAX)).await, run)
    })
    .await;
    let model = run.model.files[path].clone();
    match read {
        Ok(got) => {
            if let Err(e) = model.check_read(0, u64::MAX, &got) {
                fail(
                    checks,
                    cluster,
                    format!("{path} read back wrong {when}: {e}"),
                );
            }
        }
        Err(e) => fail(
            checks,
            cluster,
            format!("{path} cannot be read {when}: {e}"),
        ),
    }
}

/// Polls the watch every millisecond until `f` finds something, or `within` passed.
async fn watch_for<T>(
    checks: &Shared,
    within: Duration,
    f: impl Fn(&CloneWatch) -> Option<T>,
) -> Option<T> {
    let until = madsim::time::Instant::now() + within;
    loop {
        if let Some(t) = checks.lock().expect("checks").clones.as_ref().and_then(&f) {
            return Some(t);
        }
        if madsim::time::Instant::now() > until {
            return None;
        }
        madsim::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The phase (see the module's doc). `run` is a client's run whose model the file joins.
pub async fn clone_race(cluster: &mut Cluster, checks: &Shared, run: &mut ClientRun) {
    let path = format!("/c{}/clone-race", run.id);
    let r = cluster.knobs.replication as usize;
    assert!(
        r >= 2 && cluster.servers.len() >= r + 2,
        "the clone race needs R+2 chunkservers or more (a holder down, a source rotten, \
         and still room for R copies), not {} for {r}",
        cluster.servers.len()
    );
    // One chunk, longer than a clone piece where the chunk size allows (a clone then
    // reads it in two pieces, and the rot lands in the second).
    let chunk_size = cluster.knobs.chunk_size;
    let (lo, rot_from) = if chunk_size > CLONE_PIECE {
        (CLONE_PIECE + 1, CLONE_PIECE)
    } else {
        (chunk_size / 2 + 1, 0)
    };
    let len = lo + rand() % (chunk_size - lo + 1);
    let data = workload::pattern(run.id, 8_000_000, len);
    let (p, d) = (path.clone(), data.clone());
    let made = on_client(cluster, run, |c, mut run| async move {
        let out = made_whole(&c, &mut run, &p, &d).await;
        (out, run)
    })
    .await;
    if let Err(e) = made {
        return fail(
            checks,
            cluster,
            format!("writing {path} on a healthy cluster failed: {e}"),
        );
    }
    let (chunk, holders) = match listed(cluster, run, &path, &[]).await {
        Ok(x) => x,
        Err(e) => return fail(checks, cluster, e),
    };
    let h = chunk.handle;

    // 2. Rot as the clone reads. Every holder restarted first: its read cache, which
    // holds what was just written, would answer the clone without the disk.
    for &i in &holders {
        cluster.kill_server(i);
        cluster.restart_server(i);
    }
    madsim::time::sleep(2 * cluster.knobs.heartbeat + Duration::from_millis(500)).await;
    let gone = holders[(rand() % r as u64) as usize];
    let disks: HashMap<String, Flip> = holders
        .iter()
        .filter(|&&i| i != gone)
        .map(|&i| {
            let disk = cluster.servers[i].disk.clone();
            let flip: Flip = Box::new(move |at, bit| disk.flip_bit(h, at, bit));
            (cluster.servers[i].addr.clone(), flip)
        })
        .collect();
    checks.lock().expect("checks").clones = Some(CloneWatch {
        rot: Some(ArmedRot {
            disks,
            from: rot_from,
            pick: rand(),
        }),
        ..CloneWatch::new(h)
    });
    cluster.kill_server(gone);
    tracing::info!(
        t = cluster.true_ms(),
        "clone race: chunk {h} on {holders:?}, {} down for good; rot armed",
        cluster.servers[gone].addr
    );
    // The clone comes once the master declared the server dead, and once the lease the
    // file's write took has ended.
    let within = cluster.knobs.lease + Duration::from_secs(60);
    let rotted = watch_for(checks, within, |w| w.rotted.clone()).await;
    let Some((source, at)) = rotted else {
        let seen = checks.lock().expect("checks").clones.take();
        cluster.restart_server(gone);
        return fail(
            checks,
            cluster,
            format!(
                "no clone of chunk {h} read a holder's disk past its first piece within {within:?} \
                 (the state was not made; orders seen: {:?})",
                seen.map(|w| w.ordered)
            ),
        );
    };
    // The source refused the piece and told the master at once; its copy is deleted,
    // and the server may take a fresh one when the chunk is restored.
    madsim::time::sleep(2 * cluster.knobs.heartbeat).await;
    if let Err(e) = listed(cluster, run, &path, &[gone]).await {
        cluster.restart_server(gone);
        return fail(
            checks,
            cluster,
            format!("after chunk {h} rotted on {source} at byte {at} as it was cloned: {e}"),
        );
    }
    read_back(
        cluster,
        checks,
        run,
        &path,
        "after the rot at a clone's read",
    )
    .await;
    cluster.restart_server(gone);
    // Its copy, one too many now, removed (else it makes up for the next loss).
    let deadline = cluster.true_ms() + 120_000;
    loop {
        let (_, holders) = match listed(cluster, run, &path, &[]).await {
            Ok(x) => x,
            Err(e) => return fail(checks, cluster, format!("after the rot: {e}")),
        };
        let extra: Vec<&str> = (0..cluster.servers.len())
            .filter(|i| !holders.contains(i) && cluster.servers[*i].disk.meta(h).is_some())
            .map(|i| cluster.servers[i].addr.as_str())
            .collect();
        if extra.is_empty() {
            break;
        }
        if cluster.true_ms() > deadline {
            return fail(
                checks,
                cluster,
                format!("chunk {h}'s copies beyond its goal on {extra:?} not removed within 120 s"),
            );
        }
        madsim::time::sleep(Duration::from_secs(1)).await;
    }

    // 3. A version bump racing a clone. The master grants no lease on a chunk while it
    // restores the chunk's copies, so the version moves on under a clone only once the
    // master gave it up: the first clone of the chunk that starts to store its copy on
    // a spare has that disk stuck past the clone's timeout, and its server is cut off
    // from the master (heard again once the copy is stored). The write waiting for its
    // lease then takes a new version where the master restored the chunk, and the
    // clone's copy, of the old one, lands after it.
    let (_, holders) = match listed(cluster, run, &path, &[]).await {
        Ok(x) => x,
        Err(e) => return fail(checks, cluster, format!("before the version race: {e}")),
    };
    let disks: HashMap<String, Stick> = (0..cluster.servers.len())
        .filter(|i| !holders.contains(i) && cluster.servers[*i].alive)
        .map(|i| {
            let disk = cluster.servers[i].disk.clone();
            let stick: Stick = Box::new(move |d| disk.stick(d));
            (cluster.servers[i].addr.clone(), stick)
        })
        .collect();
    // Past the clone's timeout and the server's being declared dead, whichever ends the
    // clone at the master, and the clone elsewhere that restores the chunk.
    let time =
        cluster.knobs.clone_timeout + cluster.knobs.heartbeat_timeout + Duration::from_secs(5);
    checks.lock().expect("checks").clones = Some(CloneWatch {
        hold: Some(ArmedHold { disks, time }),
        ..CloneWatch::new(h)
    });
    let spares: Vec<usize> = (0..cluster.servers.len())
        .filter(|i| !holders.contains(i))
        .collect();
    let unstick = |cluster: &Cluster| {
        for &i in &spares {
            cluster.servers[i].disk.stick(Duration::ZERO);
        }
    };
    let gone = holders[(rand() % r as u64) as usize];
    cluster.kill_server(gone);
    tracing::info!(
        t = cluster.true_ms(),
        "clone race: chunk {h} on {holders:?}, {} down for good; the next clone held",
        cluster.servers[gone].addr
    );
    let Some(order) = watch_for(checks, Duration::from_secs(120), |w| {
        let (target, _, _) = w.held.as_ref()?;
        w.ordered
            .iter()
            .rev()
            .find(|o| &o.target == target)
            .cloned()
    })
    .await
    else {
        let seen = checks.lock().expect("checks").clones.take();
        unstick(cluster);
        cluster.restart_server(gone);
        return fail(
            checks,
            cluster,
            format!(
                "no clone of chunk {h} started storing its copy on a spare within 120 s of a \
                 holder's loss (the state was not made; orders seen: {:?})",
                seen.map(|w| w.ordered)
            ),
        );
    };
    // Its server cut off from the master: the master gives the clone up and restores
    // the chunk elsewhere; the write then takes a new version there.
    let held = cluster.servers.iter().position(|s| s.addr == order.target);
    if let Some(i) = held {
        cluster.cut_from_master(i);
    }
    let off = rand() % (len - 100);
    let first = write(
        cluster,
        run,
        &path,
        off,
        workload::pattern(run.id, 8_000_001, 100),
    )
    .await;
    let stored = watch_for(checks, time + Duration::from_secs(10), |w| w.stored).await;
    unstick(cluster);
    if let Some(i) = held {
        cluster.mend_from_master(i);
    }
    // At once: a new grant, while the master may hear of the clone's copy.
    let off2 = rand() % (len - 100);
    let second = write(
        cluster,
        run,
        &path,
        off2,
        workload::pattern(run.id, 8_000_002, 100),
    )
    .await;
    cluster.restart_server(gone);
    let raced = match (&first, stored) {
        (Err(e), _) => Err(format!("the write racing the clone failed: {e}")),
        (Ok(()), None) => Err(format!(
            "the clone's copy on {} was never stored",
            order.target
        )),
        (Ok(()), Some((_, false, _))) => Err(format!(
            "the clone's copy on {} failed to be stored",
            order.target
        )),
        (Ok(()), Some((_, true, v))) if v <= Some(order.version) => Err(format!(
            "the clone to {} of version {} was stored before the write moved the chunk on \
             (masters at {v:?})",
            order.target, order.version
        )),
        (Ok(()), Some((at, true, v))) => Ok((at, v)),
    };
    match raced {
        Ok((at, v)) => {
            cluster.count_fault("clone_outraced", 1);
            tracing::info!(
                t = cluster.true_ms(),
                "clone race: clone of chunk {h} v{} to {} stored at v{v:?}, {} ms after its order",
                order.version,
                order.target,
                at - order.at
            );
        }
        Err(e) => {
            checks.lock().expect("checks").clones = None;
            return fail(
                checks,
                cluster,
                format!("chunk {h}: {e} (the state was not made)"),
            );
        }
    }
    if let Err(e) = second {
        fail(
            checks,
            cluster,
            format!("chunk {h}: the write after the outraced clone failed: {e}"),
        );
    }
    checks.lock().expect("checks").clones = None;
    if let Err(e) = listed(cluster, run, &path, &[]).await {
        return fail(checks, cluster, format!("after the version race: {e}"));
    }
    read_back(cluster, checks, run, &path, "after the version race").await;
}
