//! A write to a file just made, while the only master replica its client reaches is a
//! shadow that has not applied the create (`Scenario::shadow_write`): a scripted phase
//! after healing, for a master group.
//!
//! A client with shadow reads on (as the CLI's are) takes a shadow's answer to a read
//! once it has asked every replica and none led it to an answer. A write must never: the
//! shadow may not know the file yet, and its "not found" would fail a write to a file
//! that exists (seen from outside as a put failing on the file it had just made, during
//! failovers). Random faults line that up too rarely to be seen (2 runs in 200 of the
//! group scenarios with the lookup planted back). The phase makes it certain:
//!
//! 1. a replica other than the leader is cut off from the group (it still reaches
//!    chunkservers and clients), so it falls behind;
//! 2. a client makes a file, which the leader and the rest commit;
//! 3. the client is cut off from every replica but the one behind: a read it makes
//!    with shadow reads on is answered by that shadow, which must say "not found" (else
//!    it was not behind, and the phase tested nothing);
//! 4. the client writes the file, and may fail for want of a leader, but not with "not
//!    found";
//! 5. everything mends, and the write must go through.

use std::time::Duration;

use tessera_core::FsError;

use crate::check::Shared;
use crate::cluster::Cluster;
use crate::run::fail;
use crate::workload::{self, patiently};

const DIR: &str = "/shadow-write";

fn rand() -> u64 {
    madsim::rand::random()
}

/// `op`, asked again while it fails for want of a master (for up to a minute).
async fn answered<T, F: std::future::Future<Output = Result<T, FsError>>>(
    mut op: impl FnMut() -> F,
) -> Result<T, FsError> {
    let give_up = madsim::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = op().await;
        if !matches!(r, Err(FsError::Unavailable(_) | FsError::NotLeader(_)))
            || madsim::time::Instant::now() >= give_up
        {
            return r;
        }
    }
}

pub async fn shadow_write(cluster: &Cluster, checks: &Shared) {
    let n = cluster.replicas.len();
    if n < 2 {
        fail(
            checks,
            cluster,
            "the shadow-write phase needs a master group".into(),
        );
        return;
    }
    let Some(leader) = cluster.leader_soon().await else {
        fail(
            checks,
            cluster,
            "the shadow-write phase found no leader".into(),
        );
        return;
    };
    let behind = (leader + 1 + (rand() % (n as u64 - 1)) as usize) % n;
    let others: Vec<usize> = (0..n).filter(|&i| i != behind).collect();
    let client = rand() as usize % cluster.clients.len();
    let node = cluster.clients[client].0.clone();
    let path = format!("{DIR}/f{client}");

    // 1 and 2.
    cluster.cut_replica(behind, &[]);
    let c = cluster.client(client);
    let p = path.clone();
    let made = node
        .spawn(async move {
            patiently(|| c.mkdir(DIR, true)).await?;
            workload::made(&c, &p).await
        })
        .await
        .expect("a client task of the shadow-write phase died");
    if let Err(e) = made {
        cluster.mend_replica(behind, &[], &[]);
        let what = format!("making {path} with a replica cut off failed: {e}");
        fail(checks, cluster, what);
        return;
    }

    // 3. A read, then a write, each asked until answered otherwise than "unavailable".
    cluster.cut_client(client, &others);
    // A call takes a shadow's answer only once it has waited as many times as there are
    // replicas, and each cut-off replica it asks costs a call timeout: a call that
    // starts at the shadow gets there within n + 1 timeouts, one that starts elsewhere
    // may run out first, and `answered` asks again (the CLI waits longer still).
    let patience = cluster.knobs.rpc_timeout * (n as u32 + 2) + Duration::from_secs(3);
    let c = cluster
        .client_with(client, Duration::from_secs(5), Some(patience))
        .with_shadow_reads(true);
    let p = path.clone();
    let (seen, wrote) = node
        .spawn(async move {
            let seen = answered(|| c.stat(&p)).await.map(|_| ());
            let data = workload::pattern(client, 8_000_000, 100);
            let wrote = answered(|| c.write(&p, 0, data.clone())).await;
            (seen, wrote)
        })
        .await
        .expect("a client task of the shadow-write phase died");
    cluster.mend_client(client, &others);
    cluster.mend_replica(behind, &[], &[]);
    let shadow = &cluster.replicas[behind].node;
    match seen {
        Err(FsError::NotFound(_)) => cluster.count_fault("shadow_behind_a_create", 1),
        other => {
            let what = format!(
                "{shadow}, cut off from the group, answered a read of {path} made after \
                 the cut with {other:?}, not \"not found\": nothing was tested"
            );
            fail(checks, cluster, what);
            return;
        }
    }
    if let Err(e @ FsError::NotFound(_)) = &wrote {
        let what = format!(
            "a write to {path} (made by its client) failed \"{e}\", though its client \
             knows the file is there: the lookup took the answer of {shadow}, behind"
        );
        fail(checks, cluster, what);
        return;
    }
    checks.lock().expect("checks").known_writes_checked += 1;

    // 5.
    let c = cluster.client(client).with_shadow_reads(true);
    let p = path.clone();
    let after = node
        .spawn(async move {
            let data = workload::pattern(client, 8_000_001, 100);
            patiently(|| c.write(&p, 0, data.clone())).await
        })
        .await
        .expect("a client task of the shadow-write phase died");
    if let Err(e) = after {
        let what = format!("after the shadow-write phase healed, writing {path} failed: {e}");
        fail(checks, cluster, what);
    }
}
