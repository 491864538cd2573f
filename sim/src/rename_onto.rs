//! A client's rename onto a name that meant another file a moment before
//! (`Scenario::rename_onto`): a scripted phase after healing.
//!
//! A client caches what it learns of a file by its name: where its chunks are, for reads
//! (`ClientConfig::location_ttl`), and the lease holders to write to, while the lease
//! lasts. A name can come to mean another file: deleted by another client, then taken by
//! a rename. The client that renames knows the name changed and must forget what it
//! holds of both names; else it reads the deleted file's chunks (kept until collected)
//! and writes into them. Random workloads line that up too rarely to be seen (with the
//! destination's cache kept, planted, 20 seeds each of concurrent-writers, all-faults
//! and master-failover passed). The phase makes it certain:
//!
//! 1. client A makes `x`, writes it and reads it back (A now holds its locations and its
//!    write targets);
//! 2. client B deletes `x`; A reads `x` again and must be answered from what it holds
//!    (the old bytes, as GFS's cache allows), else nothing was tested;
//! 3. A makes `y`, writes other bytes to it, and renames `y` onto `x`;
//! 4. A reads `x`: it must read `y`'s bytes;
//! 5. A overwrites the start of `x`, and B reads `x`: it must read that write.

use bytes::Bytes;
use tessera_core::FsError;

use crate::check::Shared;
use crate::cluster::Cluster;
use crate::run::fail;
use crate::workload::{self, patiently};

const DIR: &str = "/rename-onto";
/// Within one chunk of every scenario's chunk size.
const LEN: u64 = 20_000;

pub async fn rename_onto(cluster: &Cluster, checks: &Shared) {
    if cluster.clients.len() < 2 {
        fail(
            checks,
            cluster,
            "the rename-onto phase needs two clients".into(),
        );
        return;
    }
    let (x, y) = (format!("{DIR}/x"), format!("{DIR}/y"));
    let old = workload::pattern(0, 9_000_000, LEN);
    let new = workload::pattern(0, 9_000_001, LEN);
    let over = workload::pattern(0, 9_000_002, LEN / 2);
    let a = cluster.client(0);
    let b = cluster.client(1);
    let (node_a, node_b) = (cluster.clients[0].0.clone(), cluster.clients[1].0.clone());

    // 1.
    let (c, p, d) = (a.clone(), x.clone(), old.clone());
    let made = node_a
        .spawn(async move {
            patiently(|| c.mkdir(DIR, true)).await?;
            workload::made(&c, &p).await?;
            patiently(|| c.write(&p, 0, d.clone())).await?;
            patiently(|| c.read(&p, 0, u64::MAX)).await
        })
        .await
        .expect("a client task of the rename-onto phase died");
    match made {
        Ok(got) if got == old => {}
        Ok(got) => {
            let what = format!(
                "{x}, written by its only writer, read back {} bytes unlike those written",
                got.len()
            );
            return fail(checks, cluster, what);
        }
        Err(e) => return fail(checks, cluster, format!("making {x} failed: {e}")),
    }

    // 2.
    let (c, p) = (b.clone(), x.clone());
    let deleted = node_b
        .spawn(async move { patiently(|| c.delete(&p, false)).await })
        .await
        .expect("a client task of the rename-onto phase died");
    if let Err(e) = deleted {
        return fail(checks, cluster, format!("deleting {x} failed: {e}"));
    }
    let (c, p) = (a.clone(), x.clone());
    let cached = node_a
        .spawn(async move { c.read(&p, 0, u64::MAX).await })
        .await
        .expect("a client task of the rename-onto phase died");
    if cached.as_ref().ok() != Some(&old) {
        let what = format!(
            "after another client deleted {x}, its reader read it again and got {}, not \
             the old bytes from what it held: nothing was tested",
            brief(&cached)
        );
        return fail(checks, cluster, what);
    }

    // 3 and 4.
    let (c, px, py, d) = (a.clone(), x.clone(), y.clone(), new.clone());
    let read = node_a
        .spawn(async move {
            workload::made(&c, &py).await?;
            patiently(|| c.write(&py, 0, d.clone())).await?;
            patiently(|| c.rename(&py, &px)).await?;
            c.read(&px, 0, u64::MAX).await
        })
        .await
        .expect("a client task of the rename-onto phase died");
    match &read {
        Ok(got) if *got == new => {}
        _ => {
            let what = format!(
                "a client renamed {y} onto {x} (deleted by another client a moment before) \
                 and read {x}: {}, not {y}'s {LEN} bytes{}",
                brief(&read),
                if read.as_ref().ok() == Some(&old) {
                    " but the deleted file's"
                } else {
                    ""
                }
            );
            return fail(checks, cluster, what);
        }
    }

    // 5.
    let (c, p, d) = (a.clone(), x.clone(), over.clone());
    let wrote = node_a
        .spawn(async move { c.write(&p, 0, d.clone()).await })
        .await
        .expect("a client task of the rename-onto phase died");
    if let Err(e) = wrote {
        // A failure is no loss; but the phase then tested nothing of writes.
        return fail(
            checks,
            cluster,
            format!("overwriting {x} after the rename failed: {e}"),
        );
    }
    let (c, p) = (b.clone(), x.clone());
    let seen = node_b
        .spawn(async move { patiently(|| c.read(&p, 0, u64::MAX)).await })
        .await
        .expect("a client task of the rename-onto phase died");
    let mut want = over.to_vec();
    want.extend_from_slice(&new[over.len()..]);
    if seen.as_ref().ok().map(|b| b.as_ref()) != Some(&want[..]) {
        let what = format!(
            "a client renamed {y} onto {x}, overwrote its first {} bytes and was answered \
             Ok, but another client then read {x}: {}{}",
            over.len(),
            brief(&seen),
            if seen.as_ref().ok() == Some(&new) {
                ", without the write (it went elsewhere)"
            } else {
                ""
            }
        );
        return fail(checks, cluster, what);
    }
    checks.lock().expect("checks").known_writes_checked += 1;
    cluster.count_fault("rename_onto_a_deleted_name", 1);
}

fn brief(r: &Result<Bytes, FsError>) -> String {
    match r {
        Ok(b) => format!("{} bytes", b.len()),
        Err(e) => format!("{e:?}"),
    }
}
