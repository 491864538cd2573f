//! Revival among several demoted levels (`Scenario::last_copy_rot`, after the rot): a
//! scripted phase that makes the master choose which older copies of a chunk to revive
//! once every copy of its current version is gone (`master/fallback.rs`).
//!
//! A grant that leaves a copy behind while the chunk is short demotes it: kept, at the
//! version it holds, as a last resort. Two such grants in a row leave two levels, each
//! holding every write acknowledged up to its version. When the current copies are then
//! lost, only the newest level holds the writes acknowledged between the two grants;
//! reviving an older one, or whichever level happens to be up, loses them though a copy
//! that holds them is only down. The phase makes the state on purpose, on a cluster of
//! exactly R (3 or more) chunkservers:
//!
//! 1. a file of its own, written whole in one chunk on all R copies;
//! 2. one holder killed and a write taken by the others (the killed one's copy is
//!    demoted at the first version); then a second holder killed and a second write
//!    taken by the rest (that copy is demoted at the second version): the phase checks
//!    that the three versions are in that order;
//! 3. the holders of the current version killed and their chunk files lost; they and the
//!    holder of the oldest level started again, while the holder of the newest level
//!    stays down for a lease period and more: the master must revive nothing meanwhile
//!    (the newest level is on a server that may come back);
//! 4. that server started again: the file must read as written with the first write and
//!    without the second (which only the lost copies held), within a few minutes.
//!
//! The file stays out of the client's model (its second write is lost on purpose): the
//! phase judges it itself, and deletes it when done.

use std::time::Duration;

use crate::check::Shared;
use crate::cluster::Cluster;
use crate::rot::{every_copy_listed, on_client};
use crate::run::rand;
use crate::workload::{self, ClientRun};

fn fail(checks: &Shared, cluster: &Cluster, what: String) {
    crate::run::fail(checks, cluster, format!("revival: {what}"));
}

/// One small write of `d` at `off` into `path`, asked until it is acknowledged.
async fn write(
    cluster: &Cluster,
    run: &mut ClientRun,
    path: &str,
    off: u64,
    d: &bytes::Bytes,
) -> Result<(), tessera_core::FsError> {
    let (p, d) = (path.to_string(), d.clone());
    on_client(cluster, run, |c, run| async move {
        (
            workload::patiently(|| c.write(&p, off, d.clone())).await,
            run,
        )
    })
    .await
}

/// The phase (see the module's doc).
pub async fn revival(cluster: &mut Cluster, checks: &Shared, run: &mut ClientRun) {
    let path = format!("/c{}/revive", run.id);
    let r = cluster.knobs.replication as usize;
    assert!(
        r >= 3 && r == cluster.servers.len(),
        "the revival needs as many chunkservers as copies (3 or more), not {} for {r}",
        cluster.servers.len()
    );
    // 1. The file, whole in its first chunk on every copy.
    let len = 300 + rand() % (cluster.knobs.chunk_size - 300);
    let mut want = workload::pattern(run.id, 8_000_000, len).to_vec();
    let (p, d) = (path.clone(), bytes::Bytes::from(want.clone()));
    let dir = format!("/c{}", run.id);
    let made = on_client(cluster, run, |c, run| async move {
        let out = async {
            workload::patiently(|| c.mkdir(&dir, true)).await?;
            workload::made(&c, &p).await?;
            workload::patiently(|| c.write(&p, 0, d.clone())).await?;
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
    let (oldest, newest, current) = (holders[0], holders[1], holders[2..].to_vec());
    let version_of = |cluster: &Cluster, i: usize| {
        checks
            .lock()
            .expect("checks")
            .versions
            .server_version(&cluster.servers[i].addr, h)
    };

    // 2. Two levels: a write the oldest level misses, then one the newest misses. The
    // second write's bytes differ from what it overwrites, so its loss shows.
    let (w1, w2) = (
        workload::pattern(run.id, 8_000_001, 100),
        workload::pattern(run.id, 8_000_002, 100),
    );
    let (o1, o2) = (rand() % (len - 100), rand() % (len - 100));
    let mut versions = Vec::new();
    for (down, (off, d)) in [(oldest, (o1, &w1)), (newest, (o2, &w2))] {
        versions.push(version_of(cluster, down));
        cluster.kill_server(down);
        if let Err(e) = write(cluster, run, &path, off, d).await {
            cluster.restart_server(oldest);
            cluster.restart_server(newest);
            let e = format!("a write into {path} with {down} down failed: {e}");
            return fail(checks, cluster, e);
        }
        if versions.len() == 1 {
            want[off as usize..off as usize + 100].copy_from_slice(d);
        }
    }
    versions.push(version_of(cluster, current[0]));
    let levels: Vec<u64> = versions.iter().flatten().copied().collect();
    if levels.len() != 3 || levels[0] >= levels[1] || levels[1] >= levels[2] {
        cluster.restart_server(oldest);
        cluster.restart_server(newest);
        let e =
            format!("chunk {h}: versions {versions:?} (oldest, newest, current): no two levels");
        return fail(checks, cluster, e);
    }

    // 3. The current copies lost; they and the oldest level back, the newest level
    // down for a lease period and more.
    for &i in &current {
        cluster.kill_server(i);
        cluster.lose_chunk(i, h);
    }
    cluster.count_fault("revival_levels", 1);
    tracing::info!(
        t = cluster.true_ms(),
        "revival: chunk {h}'s current copies (v{}) lost; v{} back, v{} down",
        levels[2],
        levels[0],
        levels[1]
    );
    for &i in current.iter().chain([&oldest]) {
        cluster.restart_server(i);
    }
    madsim::time::sleep(cluster.knobs.lease + 4 * cluster.knobs.heartbeat_timeout).await;

    // 4. The newest level back: the file reads as written, the first write in it.
    cluster.restart_server(newest);
    let p = path.clone();
    let read = on_client(cluster, run, |c, run| async move {
        let give_up = madsim::time::Instant::now() + Duration::from_secs(300);
        let got = loop {
            match c.read(&p, 0, u64::MAX).await {
                Ok(got) if got.len() as u64 == len => break Ok(got),
                r if madsim::time::Instant::now() >= give_up => break r,
                _ => madsim::time::sleep(Duration::from_secs(1)).await,
            }
        };
        let _ = workload::patiently(|| c.delete(&p, false)).await;
        (got, run)
    })
    .await;
    match read {
        Ok(got) if got[..] == want[..] => {}
        Ok(got) => {
            let wrong = (0..want.len()).find(|&i| got.get(i) != want.get(i));
            let first_write = got.get(o1 as usize..o1 as usize + 100) == Some(&w1[..]);
            fail(
                checks,
                cluster,
                format!(
                    "{path} (chunk {h}, levels v{levels:?}) read back wrong from byte {wrong:?} \
                     after its current copies were lost (the write the oldest level missed \
                     is there: {first_write}): not revived from the newest level"
                ),
            );
        }
        Err(e) => fail(
            checks,
            cluster,
            format!(
                "{path} (chunk {h}, levels v{levels:?}) cannot be read within 300 s after its \
                 current copies were lost: {e}"
            ),
        ),
    }
}
