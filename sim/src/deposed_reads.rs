//! Reads sent to a leader cut off from its group, on and on, while the others elect a
//! successor (`Scenario::shadow_write`'s group scenarios): a scripted phase after
//! healing.
//!
//! A leader answers reads without `stale_ok` only while no other replica can have been
//! elected (`core/src/group/lease.rs`); the check of that (`check::authority`) judges
//! every read a leader answers against the elections before it arrived. Random faults
//! seldom put a client's read at a deposed leader in the moment between a successor's
//! election and the old leader's stepping down (its quorum check comes one election
//! timeout after it lost touch, the successor's election as soon as a randomized timeout
//! runs out, so either may come first): with locations answered without authority
//! (planted), one master-failover-5 seed in 30 was caught. The phase makes the window
//! busy:
//!
//! 1. a file made and written, so its chunks have locations;
//! 2. the leader cut off from the other replicas (it still reaches chunkservers and
//!    clients);
//! 3. a client asks that leader, directly and once each, every 20 ms: a stat of the file,
//!    a listing of its directory and the file's chunk locations, until 2 s after the
//!    others' new leader is seen leading;
//! 4. the cut heals.
//!
//! The run fails if no successor was elected within a minute, or if no read was sent to
//! the old leader after the successor was seen (the phase tested nothing).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tessera_core::pb;
use tessera_core::pb::master_request::Req as MReq;

use crate::check::Shared;
use crate::cluster::Cluster;
use crate::lost_remove::once;
use crate::run::fail;
use crate::workload::{self, patiently};

const DIR: &str = "/deposed-reads";

pub async fn deposed_reads(cluster: &Cluster, checks: &Shared) {
    let Some(leader) = cluster.leader_soon().await else {
        fail(
            checks,
            cluster,
            "deposed reads: no leader after healing".into(),
        );
        return;
    };
    let client = madsim::rand::random::<u64>() as usize % cluster.clients.len();
    let node = cluster.clients[client].0.clone();
    let path = format!("{DIR}/f{client}");

    // 1.
    let (c, p) = (cluster.client(client), path.clone());
    let made = node
        .spawn(async move {
            patiently(|| c.mkdir(DIR, true)).await?;
            workload::made(&c, &p).await?;
            let data = workload::pattern(client, 7_000_000, 5_000);
            patiently(|| c.write(&p, 0, data.clone())).await
        })
        .await
        .expect("a client task of the deposed-reads phase died");
    if let Err(e) = made {
        fail(
            checks,
            cluster,
            format!("deposed reads: making and writing {path} failed: {e}"),
        );
        return;
    }

    // 2 and 3.
    let old = cluster.replicas[leader].node.clone();
    cluster.cut_replica(leader, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let after = Arc::new(AtomicU64::new(0));
    let successor = Arc::new(AtomicBool::new(false));
    let (c, to) = (
        cluster.client(client),
        cluster.replicas[leader].addr.clone(),
    );
    let (stop2, after2, successor2, p) =
        (stop.clone(), after.clone(), successor.clone(), path.clone());
    let reader = node.spawn(async move {
        while !stop2.load(Ordering::Relaxed) {
            let asks = [
                MReq::Stat(pb::StatRequest { path: p.clone() }),
                MReq::List(pb::ListRequest {
                    path: DIR.into(),
                    ..Default::default()
                }),
                MReq::GetChunks(pb::GetChunksRequest {
                    path: p.clone(),
                    ..Default::default()
                }),
            ];
            for req in asks {
                let late = successor2.load(Ordering::Relaxed);
                let (c, to) = (c.clone(), to.clone());
                madsim::task::spawn(async move {
                    let _ = once(&c, &to, req, Duration::from_millis(300)).await;
                });
                if late {
                    after2.fetch_add(1, Ordering::Relaxed);
                }
            }
            madsim::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let until = madsim::time::Instant::now() + Duration::from_secs(60);
    while cluster.leader().is_none_or(|l| l == leader) {
        if madsim::time::Instant::now() >= until {
            break;
        }
        madsim::time::sleep(Duration::from_millis(5)).await;
    }
    let elected = cluster.leader().is_some_and(|l| l != leader);
    successor.store(true, Ordering::Relaxed);
    madsim::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let _ = reader.await;
    // 4.
    cluster.mend_replica(leader, &[], &[]);
    let sent = after.load(Ordering::Relaxed);
    cluster.count_fault("deposed_leader_reads", sent);
    tracing::info!(
        t = cluster.true_ms(),
        "deposed reads: {sent} reads sent to {old} after a successor was seen leading"
    );
    if !elected {
        fail(
            checks,
            cluster,
            format!(
                "deposed reads: {old} cut off from the group, and no other replica led within 60 s"
            ),
        );
    } else if sent == 0 {
        fail(
            checks,
            cluster,
            format!(
                "deposed reads: no read sent to {old} after a successor led: nothing was tested"
            ),
        );
    }
}
