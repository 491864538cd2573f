//! A remove the master never made durable (`Scenario::lost_remove`): a scripted phase
//! after the workload that checks that the master orders no copy deleted on the strength
//! of a record a crash may still lose.
//!
//! Removing a deleted (hidden) file drops its chunks at once; their copies, now orphans,
//! are ordered deleted when their servers next report them. If the orders went out
//! before the record was durable, a crash that lost the record would bring the file back
//! with its copies gone: a remove nobody was told had happened would have destroyed the
//! data of a file that can still be read and undeleted. Random master crashes land in
//! that window (a few milliseconds after a heartbeat) too rarely to be seen. The phase
//! makes it wide:
//!
//! 1. a file of its own, written, its holders noted, and deleted (moved to its hidden
//!    name);
//! 2. the remove of the hidden file, sent once (never retried) and taken by a master
//!    that cannot make it durable:
//!    - a single master: its log disk slowed so that each sync outlasts a heartbeat
//!      interval but not a call's deadline; a mkdir first, and the remove arrives while
//!      the mkdir's sync lasts, as does a heartbeat of every holder: the master takes
//!      them in one batch;
//!    - a master group: the leader, cut off from the other replicas (it still reaches
//!      chunkservers and clients), takes the remove, which it can never commit, and
//!      hears every holder's heartbeat;
//! 3. the remove lost: the single master loses power halfway through the batch's sync and
//!    starts again on its log without it; the group's other replicas elect a leader
//!    without it, and the cut heals;
//! 4. the hidden file must still be there; renamed back (undeleted), it must read back
//!    whole.
//!
//! Right after the remove, other calls ask the same master, once each, about the hidden
//! file: a listing of the directory, a stat, and a rename of it (an undelete). None may
//! be answered as if the file were gone before the remove is durable (a listing waits
//! for the log; a stat and the rename wait for the remove's lock on the name), so none
//! is answered so before the crash. One answered without the file (listed without it,
//! "not found") showed a remove that was then lost: visibility ahead of durability.
//!
//! The run fails if the master did not log the remove, if it judged no heartbeat of some
//! holder after it did, or if the remove was not lost (the phase then tested nothing);
//! if a call showed the remove before it was durable; and if the file, back, does not
//! read as written.
//!
//! Then a rename is lost the same way ([`lost_rename`]): a file renamed onto a free name
//! by a master that cannot make the rename durable, while calls ask that master about
//! both names; none may show the rename, and after its loss the destination is absent
//! and the source reads back.

use std::collections::BTreeSet;
use std::time::Duration;

use tessera_core::pb;
use tessera_core::pb::master_request::Req as MReq;

use crate::check::Shared;
use crate::cluster::Cluster;
use crate::run::rand;
use crate::workload::{self, ClientRun};

fn fail(checks: &Shared, cluster: &Cluster, what: String) {
    crate::run::fail(checks, cluster, format!("lost remove: {what}"));
}

fn fail_rename(checks: &Shared, cluster: &Cluster, what: String) {
    crate::run::fail(checks, cluster, format!("lost rename: {what}"));
}

const DIR: &str = "/lost-remove";

/// One call to master `to`, sent once (no retry after a crash may make it happen), with
/// `patience` to answer: its answer, if one came.
pub(crate) async fn once(
    c: &workload::C,
    to: &str,
    req: MReq,
    patience: Duration,
) -> Option<pb::MasterResponse> {
    use prost::Message;
    use tessera_core::runtime::{Runtime, Transport};
    let (rt, net, _) = c.parts();
    let req = pb::MasterRequest {
        req: Some(req),
        ..Default::default()
    };
    let deadline = rt.now() + patience;
    let reply = net
        .call(
            to,
            tessera_core::auth::ServerRole::Master,
            req.encode_to_vec().into(),
            deadline,
        )
        .await
        .ok()?;
    pb::MasterResponse::decode(reply).ok()
}

/// What the calls that ask about the names a lost mutation changes were answered.
type Looks = std::sync::Arc<std::sync::Mutex<Vec<(&'static str, pb::MasterResponse)>>>;

/// A mutation a master takes and then loses (steps 2 and 3), sent once to the master
/// that takes it; and the calls that ask that master about the names it changes, sent
/// once each right after it.
struct Loss {
    /// The mutation, for messages: "the remove of /lost-remove/...".
    what: String,
    /// The fault's name in the run's counts.
    fault: &'static str,
    /// How the phase reports a failure.
    fail: fn(&Shared, &Cluster, String),
    req: MReq,
    looks: Vec<(&'static str, MReq)>,
    /// A directory a single master makes first: the mutation arrives during its sync.
    busy: String,
    /// Whether some master has logged the mutation.
    logged: Box<dyn Fn(&crate::check::Checks) -> bool>,
}

/// Sends `loss`'s calls to master `to`, once each, each given `patience`; their
/// answers go to the looks returned.
fn look(cluster: &Cluster, run: &ClientRun, to: &str, loss: &Loss, patience: Duration) -> Looks {
    let looks = Looks::default();
    let node = cluster.clients[run.id].0.clone();
    for (what, req) in loss.looks.iter().cloned() {
        let (c, to, looks) = (cluster.client(run.id), to.to_string(), looks.clone());
        node.spawn(async move {
            if let Some(r) = once(&c, &to, req, patience).await {
                looks.lock().expect("looks").push((what, r));
            }
        });
    }
    looks
}

/// The calls of `looks` answered as if `hidden` were gone: they saw its remove, which
/// the crash then lost.
fn saw_the_remove(looks: &Looks, hidden: &str) -> Vec<String> {
    let name = hidden.rsplit('/').next().unwrap_or(hidden);
    let not_found = pb::ErrorCode::NotFound as i32;
    let looks = looks.lock().expect("looks");
    looks
        .iter()
        .filter(|(_, r)| match (&r.error, &r.resp) {
            (Some(e), _) => e.code == not_found,
            (None, Some(pb::master_response::Resp::List(l))) => !listed(l, name),
            _ => false,
        })
        .map(|(what, r)| format!("{what} ({r:?})"))
        .collect()
}

fn listed(l: &pb::ListResponse, name: &str) -> bool {
    l.entries
        .iter()
        .any(|e| e.path.rsplit('/').next() == Some(name))
}

/// Steps 2 and 3 with a single master: its log slowed, and the power cut halfway
/// through the mutation's sync. Returns the master's node and what the calls asking
/// about its names were answered, or None if the mutation was not lost (reported).
async fn single(
    cluster: &mut Cluster,
    checks: &Shared,
    run: &ClientRun,
    loss: &Loss,
) -> Option<(String, Looks)> {
    let node = cluster.clients[run.id].0.clone();
    // 2. The log slow: each sync outlasts a heartbeat interval, but not a call's
    // deadline. A mkdir's sync first; while it lasts, the mutation arrives, sent once,
    // and every holder's heartbeat: all taken in the one batch after it.
    let k = &cluster.knobs;
    let slow = k.heartbeat + Duration::from_millis(200);
    if slow >= k.rpc_timeout {
        (loss.fail)(
            checks,
            cluster,
            format!("a sync of {slow:?} outlasts a call's {:?}", k.rpc_timeout),
        );
        return None;
    }
    cluster.master_store.set_delay(slow);
    let (c, busy) = (cluster.client(run.id), loss.busy.clone());
    node.spawn(async move {
        let _ = c.mkdir(&busy, false).await;
    });
    madsim::time::sleep(Duration::from_millis(20)).await;
    let (c, req, to) = (
        cluster.client(run.id),
        loss.req.clone(),
        cluster.master_addr.clone(),
    );
    node.spawn(async move {
        let _ = once(&c, &to, req, Duration::from_secs(30)).await;
    });
    // The calls that ask about its names: well after the mutation (a link's latency is
    // 10 ms at most), still during the mkdir's sync, so they are taken in the
    // mutation's batch, after it; given until shortly before the power goes.
    let gap = Duration::from_millis(50);
    madsim::time::sleep(gap).await;
    let looks = look(cluster, run, &cluster.master_addr, loss, slow + slow / 4);

    // 3. Halfway through the mutation's own sync, the power goes.
    madsim::time::sleep(slow + slow / 2 - gap).await;
    cluster.count_fault(loss.fault, 1);
    tracing::info!(
        t = cluster.true_ms(),
        "lost mutation: the master loses power with {} unsynced",
        loss.what
    );
    let lost = cluster.kill_master_losing_unsynced();
    cluster.master_store.set_delay(Duration::ZERO);
    cluster.restart_master();
    if lost == 0 {
        (loss.fail)(
            checks,
            cluster,
            format!(
                "{} was durable before the crash: nothing was tested",
                loss.what
            ),
        );
        return None;
    }

    Some(("master".to_string(), looks))
}

/// Steps 2 and 3 with a master group: the leader cut off from the other replicas (it
/// still reaches chunkservers and clients) takes the mutation, which it can never
/// commit, and hears every holder's heartbeat; the others elect a leader without it.
/// Returns the cut-off leader's node and what the calls asking about the mutation's
/// names were answered, or None (reported).
async fn group(
    cluster: &mut Cluster,
    checks: &Shared,
    run: &ClientRun,
    loss: &Loss,
) -> Option<(String, Looks)> {
    let node = cluster.clients[run.id].0.clone();
    let Some(l) = cluster.leader() else {
        (loss.fail)(checks, cluster, "no leader after healing".into());
        return None;
    };
    cluster.cut_replica(l, &[]);
    let (c, req, to) = (
        cluster.client(run.id),
        loss.req.clone(),
        cluster.replicas[l].addr.clone(),
    );
    node.spawn(async move {
        let _ = once(&c, &to, req, Duration::from_secs(30)).await;
    });
    // The calls that ask about its names once the leader has taken the mutation (or
    // after 200 ms, when the phase will find it did not), given until shortly before
    // the cut heals.
    let mut waited = Duration::ZERO;
    while waited < Duration::from_millis(200) && !(loss.logged)(&checks.lock().expect("checks")) {
        madsim::time::sleep(Duration::from_millis(5)).await;
        waited += Duration::from_millis(5);
    }
    let looks = look(
        cluster,
        run,
        &cluster.replicas[l].addr,
        loss,
        2 * cluster.knobs.heartbeat,
    );
    madsim::time::sleep(2 * cluster.knobs.heartbeat + Duration::from_millis(300)).await;
    cluster.count_fault(loss.fault, 1);
    tracing::info!(
        t = cluster.true_ms(),
        "lost mutation: {} is cut off from the other replicas with {} uncommitted",
        cluster.replicas[l].node,
        loss.what
    );
    let until = cluster.true_ms() + 60_000;
    while cluster.leader().is_none_or(|n| n == l) {
        if cluster.true_ms() > until {
            cluster.mend_replica(l, &[], &[]);
            (loss.fail)(
                checks,
                cluster,
                "the other replicas elected no leader within 60 s".into(),
            );
            return None;
        }
        madsim::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.mend_replica(l, &[], &[]);
    Some((cluster.replicas[l].node.clone(), looks))
}

/// Steps 2 and 3, by the master the cluster has (a single one, or a group).
async fn lose(
    cluster: &mut Cluster,
    checks: &Shared,
    run: &ClientRun,
    loss: &Loss,
) -> Option<(String, Looks)> {
    if cluster.replicas.is_empty() {
        single(cluster, checks, run, loss).await
    } else {
        group(cluster, checks, run, loss).await
    }
}

/// The phase (see the module's doc), on client `run`'s node.
pub async fn lost_remove(cluster: &mut Cluster, checks: &Shared, run: &ClientRun) {
    let node = cluster.clients[run.id].0.clone();
    let path = format!("{DIR}/f");
    let len = 1 + rand() % (3 * cluster.knobs.chunk_size);
    let data = workload::pattern(run.id, 9_000_000, len);

    // 1. Written, then deleted (hidden).
    let (c, p, d) = (cluster.client(run.id), path.clone(), data.clone());
    let hidden = node
        .spawn(async move {
            workload::patiently(|| c.mkdir(DIR, true)).await?;
            workload::made(&c, &p).await?;
            workload::patiently(|| c.write(&p, 0, d.clone())).await?;
            let info = workload::get_chunks(&c, &p)
                .await
                .map_err(tessera_core::FsError::Unavailable)?;
            let holders: BTreeSet<String> =
                info.chunks.into_iter().flat_map(|c| c.replicas).collect();
            workload::patiently(|| c.delete(&p, false)).await?;
            let entries = workload::patiently(|| c.list(DIR, true)).await?;
            let hidden: Vec<String> = entries
                .into_iter()
                .map(|e| e.path)
                .filter(|p| {
                    p.rsplit('/')
                        .next()
                        .is_some_and(|n| n.starts_with(tessera_core::master::DELETED_PREFIX))
                })
                .collect();
            match hidden.as_slice() {
                [one] if one.starts_with('/') => Ok((one.clone(), holders)),
                [one] => Ok((format!("{DIR}/{one}"), holders)),
                _ => Err(tessera_core::FsError::Internal(format!(
                    "{DIR} holds hidden names {hidden:?}"
                ))),
            }
        })
        .await
        .expect("a client task of the lost-remove phase died");
    let (hidden, holders) = match hidden {
        Ok(h) => h,
        Err(e) => {
            fail(
                checks,
                cluster,
                format!("writing and deleting {path} on a healthy cluster failed: {e}"),
            );
            return;
        }
    };

    // 2 and 3: the remove is lost, by the master node named. Right after it, calls ask
    // about the hidden file: a listing of the directory, a stat, and a rename of it (an
    // undelete).
    let loss = Loss {
        what: format!("the remove of {hidden}"),
        fault: "lost_remove",
        fail,
        req: MReq::Delete(pb::DeleteRequest {
            path: hidden.clone(),
            recursive: false,
        }),
        looks: vec![
            (
                "a listing",
                MReq::List(pb::ListRequest {
                    path: DIR.into(),
                    include_deleted: true,
                    ..Default::default()
                }),
            ),
            (
                "a stat",
                MReq::Stat(pb::StatRequest {
                    path: hidden.clone(),
                }),
            ),
            (
                "a rename back",
                MReq::Rename(pb::RenameRequest {
                    src: hidden.clone(),
                    dst: format!("{DIR}/early"),
                }),
            ),
        ],
        busy: format!("{DIR}/busy"),
        logged: {
            let h = hidden.clone();
            Box::new(move |c| c.removes_logged.contains_key(&h))
        },
    };
    let took = lose(cluster, checks, run, &loss).await;
    let Some((took, looks)) = took else {
        return;
    };
    let overtook = looks
        .lock()
        .expect("looks")
        .iter()
        .any(|(what, r)| *what == "a rename back" && r.error.is_none());
    if overtook {
        fail(
            checks,
            cluster,
            format!("the rename back of {hidden} overtook its remove: nothing was tested"),
        );
        return;
    }
    let saw = saw_the_remove(&looks, &hidden);
    if !saw.is_empty() {
        fail(
            checks,
            cluster,
            format!(
                "{took} answered before the remove of {hidden} was durable as if it were \
                 gone, and then lost the remove: {}",
                saw.join("; ")
            ),
        );
        return;
    }
    // It took the remove, and judged a heartbeat of every holder after: had it ordered
    // copies deleted then, they would be gone.
    let (logged, unheard): (Option<(String, u64)>, Vec<String>) = {
        let c = checks.lock().expect("checks");
        let logged = c.removes_logged.get(&hidden).cloned();
        let unheard = holders
            .iter()
            .filter(|a| {
                let heard = c.heartbeats_judged.get(&(took.clone(), (*a).clone()));
                logged
                    .as_ref()
                    .is_none_or(|(_, at)| heard.is_none_or(|h| h <= at))
            })
            .cloned()
            .collect();
        (logged, unheard)
    };
    if logged.as_ref().is_none_or(|(n, _)| *n != took) {
        fail(
            checks,
            cluster,
            format!("{took} did not log the remove of {hidden} ({logged:?}): nothing was tested"),
        );
        return;
    }
    if !unheard.is_empty() || holders.is_empty() {
        fail(
            checks,
            cluster,
            format!(
                "{took} judged no heartbeat of holders {unheard:?} (of {holders:?}) after it took the \
                 remove of {hidden}: nothing was tested"
            ),
        );
        return;
    }

    // 4. Back, and undeleted, it reads as written.
    let (c, p, h) = (cluster.client(run.id), path.clone(), hidden.clone());
    let back = node
        .spawn(async move {
            match workload::patiently(|| c.stat(&h)).await {
                Ok(_) => {}
                Err(e) => return Err(format!("{h} is gone after the crash lost its remove: {e}")),
            }
            workload::patiently(|| c.rename(&h, &p))
                .await
                .map_err(|e| format!("undeleting {h}: {e}"))?;
            workload::patiently(|| c.read(&p, 0, u64::MAX))
                .await
                .map_err(|e| {
                    format!("{p}, undeleted after its remove was lost, cannot be read: {e}")
                })
        })
        .await
        .expect("a client task of the lost-remove phase died");
    match back {
        Ok(got) if got == data => {}
        Ok(got) => fail(
            checks,
            cluster,
            format!(
                "{path}, undeleted after its remove was lost, reads {} bytes, not the {} written",
                got.len(),
                data.len()
            ),
        ),
        Err(e) => fail(checks, cluster, e),
    }
}

const RENAMED: &str = "/lost-rename";

/// The calls of `looks` answered as if `src` had been renamed to `dst` (both in
/// [`RENAMED`]): they saw the rename, which the crash then lost.
fn saw_the_rename(looks: &Looks) -> Vec<String> {
    use pb::ErrorCode as E;
    use pb::master_response::Resp;
    let looks = looks.lock().expect("looks");
    looks
        .iter()
        .filter(|(what, r)| {
            let code = r.error.as_ref().map(|e| e.code);
            match (*what, &r.resp) {
                ("a listing", Some(Resp::List(l))) => listed(l, "dst") || !listed(l, "src"),
                ("a stat of the source", _) => code == Some(E::NotFound as i32),
                ("a create of the destination", _) => code == Some(E::AlreadyExists as i32),
                ("a stat of the destination" | "the destination's chunks", _) => code.is_none(),
                _ => false,
            }
        })
        .map(|(what, r)| format!("{what} ({r:?})"))
        .collect()
}

/// A rename the master never made durable: the lost-remove phase's steps for a rename.
/// A file written at `src`, renamed to `dst` by a master that takes the rename and
/// loses it (steps 2 and 3 above), while calls ask the same master about both names
/// right after it: a listing of the directory, a stat of each, a create of the
/// destination, and its chunks. None may be answered as if the rename were done
/// before it is durable: each waits for the rename's locks (the listing for the log),
/// so none is answered so before the crash. After it, the destination must not
/// exist and the source must read back as written.
pub async fn lost_rename(cluster: &mut Cluster, checks: &Shared, run: &ClientRun) {
    let node = cluster.clients[run.id].0.clone();
    let (src, dst) = (format!("{RENAMED}/src"), format!("{RENAMED}/dst"));
    let len = 1 + rand() % (2 * cluster.knobs.chunk_size);
    let data = workload::pattern(run.id, 9_100_000, len);

    // 1. Written.
    let (c, p, d) = (cluster.client(run.id), src.clone(), data.clone());
    let written = node
        .spawn(async move {
            workload::patiently(|| c.mkdir(RENAMED, true)).await?;
            workload::made(&c, &p).await?;
            workload::patiently(|| c.write(&p, 0, d.clone())).await
        })
        .await
        .expect("a client task of the lost-rename phase died");
    if let Err(e) = written {
        fail_rename(
            checks,
            cluster,
            format!("writing {src} on a healthy cluster failed: {e}"),
        );
        return;
    }

    // 2 and 3: the rename is lost.
    let loss = Loss {
        what: format!("the rename of {src} to {dst}"),
        fault: "lost_rename",
        fail: fail_rename,
        req: MReq::Rename(pb::RenameRequest {
            src: src.clone(),
            dst: dst.clone(),
        }),
        looks: vec![
            (
                "a listing",
                MReq::List(pb::ListRequest {
                    path: RENAMED.into(),
                    ..Default::default()
                }),
            ),
            (
                "a stat of the source",
                MReq::Stat(pb::StatRequest { path: src.clone() }),
            ),
            (
                "a stat of the destination",
                MReq::Stat(pb::StatRequest { path: dst.clone() }),
            ),
            (
                "a create of the destination",
                MReq::Create(pb::CreateRequest {
                    path: dst.clone(),
                    ..Default::default()
                }),
            ),
            (
                "the destination's chunks",
                MReq::GetChunks(pb::GetChunksRequest {
                    path: dst.clone(),
                    ..Default::default()
                }),
            ),
        ],
        busy: format!("{RENAMED}/busy"),
        logged: {
            let s = src.clone();
            Box::new(move |c| c.renames_logged.contains_key(&s))
        },
    };
    let Some((took, looks)) = lose(cluster, checks, run, &loss).await else {
        return;
    };
    let logged = checks
        .lock()
        .expect("checks")
        .renames_logged
        .get(&src)
        .cloned();
    if logged.as_ref().is_none_or(|(n, _)| *n != took) {
        fail_rename(
            checks,
            cluster,
            format!("{took} did not log the rename of {src} ({logged:?}): nothing was tested"),
        );
        return;
    }
    let saw = saw_the_rename(&looks);
    if !saw.is_empty() {
        fail_rename(
            checks,
            cluster,
            format!(
                "{took} answered before the rename of {src} to {dst} was durable as if it \
                 were done, and then lost the rename: {}",
                saw.join("; ")
            ),
        );
        return;
    }

    // 4. The rename never happened: the destination is not there, and the source
    // reads as written.
    let (c, s, d) = (cluster.client(run.id), src.clone(), dst.clone());
    let back = node
        .spawn(async move {
            let stat = workload::patiently(|| async {
                match c.stat(&d).await {
                    Err(tessera_core::FsError::NotFound(_)) => Ok(None),
                    r => r.map(Some),
                }
            })
            .await;
            match stat {
                Ok(None) => {}
                Ok(Some(_)) => {
                    return Err(format!(
                        "{d} exists after the crash lost the rename onto it"
                    ));
                }
                Err(e) => return Err(format!("a stat of {d}: {e}")),
            }
            workload::patiently(|| c.read(&s, 0, u64::MAX))
                .await
                .map_err(|e| format!("{s}, whose rename was lost, cannot be read: {e}"))
        })
        .await
        .expect("a client task of the lost-rename phase died");
    match back {
        Ok(got) if got == data => {}
        Ok(got) => fail_rename(
            checks,
            cluster,
            format!(
                "{src}, whose rename was lost, reads {} bytes, not the {} written",
                got.len(),
                data.len()
            ),
        ),
        Err(e) => fail_rename(checks, cluster, e),
    }
}
