//! One seeded run of a scenario: pick knobs, start the cluster, run the workload under
//! the fault mix, heal, demand liveness, and report.

use std::time::Duration;

use crate::check::{self, Shared};
use crate::cluster::{Cluster, Knobs, Shape};
use crate::faults::{FaultMix, Scheduler};
use crate::workload::{self, ClientRun, Workload};

/// A scenario: cluster shape, workload and fault mix. Small values, composed.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub shape: Shape,
    pub workload: Workload,
    pub faults: FaultMix,
    /// Adjusts the seed-picked knobs (e.g. a short GC delay for the gc scenario).
    pub tweak: fn(&mut Knobs),
    /// How long after healing the cluster has to be whole again.
    pub heal_within: Duration,
    /// After the workload, while the data lies idle and unread, flip bits in up to R−1
    /// servers' copies; the scrubber must report every one.
    pub silent_corruption: bool,
    /// After healing, the only current copy of a chunk rots in a block its older copies
    /// hold, and must be mended (`rot.rs`); then a chunk's current copies are lost with
    /// two demoted levels kept, and the newest must be revived (`revival.rs`).
    pub last_copy_rot: bool,
    /// After healing, one client outlives every replica of a file it knew, and must read
    /// and write it within a bound (`long_lived.rs`).
    pub long_lived: bool,
    /// After healing, the master (a single one, or a group's cut-off leader) loses the
    /// remove of a deleted file it took after its holders reported; the file, undeleted,
    /// must read back whole (`lost_remove.rs`).
    pub lost_remove: bool,
    /// After healing, a clone's source rots in a block as the clone reads it, and a
    /// write moves a chunk's version on while a clone of it is under way
    /// (`clone_race.rs`).
    pub clone_race: bool,
    /// After healing, a master group's client writes a file it just made while the only
    /// replica it reaches is a shadow behind the create (`shadow_write.rs`).
    pub shadow_write: bool,
    /// After healing, a client renames a file onto a name another client deleted a
    /// moment before, whose old file it still holds locations and write targets of, then
    /// reads and writes it (`rename_onto.rs`).
    pub rename_onto: bool,
    /// Healing also means every stale copy (a version below the master's) is deleted.
    pub stale_collected: bool,
    /// The seed also picks the cluster's shape (servers, racks, clients), its
    /// replication (1 to 5) and the kind of workload, in place of those given.
    pub vary: bool,
}

/// `sc` with the shape, replication and workload the seed picks (see
/// [`Scenario::vary`]); the replication is returned apart, as a knob.
fn varied(sc: Scenario) -> (Scenario, u32) {
    let mut sc = sc;
    let servers = 3 + (rand() % 7) as usize;
    let racks = 1 + (rand() % 4) as usize;
    let clients = 2 + (rand() % 4) as usize;
    sc.shape = Shape {
        // A master group of three in about a quarter of the runs, taken from the draws
        // above (a draw of its own would move every later one, for every seed).
        masters: if (servers + clients).is_multiple_of(4) {
            3
        } else {
            1
        },
        chunkservers: servers,
        racks,
        clients,
    };
    // A group's faults are its own: a single master's crashes, log damage and cuts
    // from chunkservers are not; a single master has no group.
    if sc.shape.masters > 1 {
        sc.faults.master_cut = false;
        sc.faults.master_restarts = false;
    } else {
        sc.faults.group_faults = false;
    }
    let replication = 1 + (rand() % 5.min(servers as u64)) as u32;
    // A replayed workload stays (the draw is made all the same, so the rest of the run
    // follows the seed as it would).
    let drawn = match rand() % 3 {
        0 => workload::Kind::Private,
        1 => workload::Kind::Shared { files: 2 },
        _ => workload::Kind::Appends { files: 2 },
    };
    if matches!(sc.workload.kind, workload::Kind::Replay(_)) {
        return (sc, replication);
    }
    sc.workload.kind = drawn;
    if sc.workload.kind != workload::Kind::Private {
        sc.workload.ops = 40;
        sc.workload.max_write = 64 << 10;
    }
    (sc, replication)
}

#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub seed: u64,
    pub scenario: &'static str,
    pub violations: Vec<String>,
    pub trace: u64,
    pub sim_ms: i64,
    pub steps: u64,
    pub reads_checked: u64,
    pub listings_checked: u64,
    pub ns_ops_checked: u64,
    /// Acknowledged writes into the shared directory's files found after healing.
    pub ns_writes_checked: u64,
    /// Files of the shared directory checked to end in the bytes of a write.
    pub ns_files_checked: u64,
    /// Races at one name that two clients or more struck at once.
    pub ns_races_met: u64,
    /// The longest operation of the long-lived client after its replicas went, in ms.
    pub long_lived_max_ms: u64,
    /// Reads of the shared directory a shadow master answered, judged as stale reads.
    pub shadow_reads_checked: u64,
    /// Writes to files their client knew were there, checked not to fail "not found".
    pub known_writes_checked: u64,
    /// Chunks whose listed copies were compared byte for byte after healing.
    pub copies_compared: u64,
    /// Reads leaders answered, and leaders' authorities, judged in true time against
    /// later elections (`check::authority`).
    pub leader_reads_judged: u64,
    pub authorities_judged: u64,
    /// Chunks of leaders' location answers judged against acknowledged writes.
    pub locations_judged: u64,
    /// Refusals for the state of a name judged against unsynced records (`check::refusals`).
    pub refusals_judged: u64,
    /// Churn: servers masters declared dead, and clones they ordered (`check::churn`).
    pub declared_dead: u64,
    pub clones_ordered: u64,
    /// Pairs of copies that differed only where failed mutations allow.
    pub copies_inconsistent: u64,
    /// Checkpoints master replicas built beside their event loops and took back.
    pub group_checkpoints: u64,
    /// Checkpoints a master alone's driver built beside it and wrote.
    pub master_checkpoints: u64,
    /// The parts they were stored in, and how many were in fewer than the last.
    pub master_checkpoint_parts: u64,
    pub master_checkpoints_shrunk: u64,
    /// Snapshots master replicas made whole from parts.
    pub snapshots_from_parts: u64,
    pub ops_ok: u64,
    pub ops_failed: u64,
    pub records_checked: u64,
    /// A replay's recorded operations: run, and left out (see `workload::replay_run`).
    pub ops_replayed: u64,
    pub ops_replay_skipped: u64,
    /// Distinct stale copies seen on chunkservers during the run.
    pub stale_seen: usize,
    pub scrub_found: usize,
    /// Corrupt last copies mended, and mends that failed.
    pub mends: [u64; 2],
    pub knobs: String,
    pub faults: Vec<String>,
    /// How often each kind of fault actually happened in the run.
    pub fault_counts: std::collections::BTreeMap<&'static str, u64>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Runs `sc` with `seed` on the current thread. Use a fresh thread per run (the runner
/// does) so nothing of one run's world leaks into the next.
pub fn run(sc: &Scenario, seed: u64) -> Outcome {
    run_traced(sc, seed, None)
}

/// As [`run`], every node recording its trace under `trace_dir` when given (one
/// directory per node, as real servers' `--trace-dir`). Recording changes nothing in the
/// simulated world: the run is the same as without it.
pub fn run_traced(sc: &Scenario, seed: u64, trace_dir: Option<std::path::PathBuf>) -> Outcome {
    let mut rt = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
    // A run that stops making progress fails rather than hanging CI.
    rt.set_time_limit(Duration::from_secs(3_600));
    let sc = *sc;
    rt.block_on(async move { world(sc, seed, trace_dir).await })
}

pub(crate) fn rand() -> u64 {
    madsim::rand::random()
}

async fn world(sc: Scenario, seed: u64, trace_dir: Option<std::path::PathBuf>) -> Outcome {
    let mut knobs = Knobs::pick(&mut rand);
    (sc.tweak)(&mut knobs);
    knobs.trace_dir = trace_dir;
    let sc = if sc.vary {
        let (sc, replication) = varied(sc);
        knobs.replication = replication;
        sc
    } else {
        sc
    };
    if sc.faults.clock_jumps {
        // Most of the bound to drift, or nearly half, the rest to jumps.
        knobs.clocks_near_the_bound(if rand().is_multiple_of(2) { 0.45 } else { 0.2 });
    }
    let checks = check::shared();
    // A copy lost by a server is listed until its report reaches the master: a heartbeat
    // or two (one may be lost), each within an RPC's time, and at most until the master
    // declares the server dead.
    checks.lock().expect("checks").missing.grace_ms =
        (knobs.heartbeat_timeout + 3 * knobs.heartbeat + 2 * knobs.rpc_timeout).as_millis() as i64
            + 1_000;
    checks.lock().expect("checks").lag_slack = (
        knobs.clock_drift_ppm,
        2 * knobs.clock_jump_ms + knobs.rpc_timeout.as_millis() as i64 + 100,
    );
    // Without faults, no server may be declared dead and no chunk cloned (churn).
    checks.lock().expect("checks").churn.fault_free = sc.faults.is_empty();
    let mut cluster = Cluster::start(sc.shape, knobs.clone(), checks.clone());
    madsim::time::sleep(Duration::from_secs(2)).await;

    // Readers of files others write see fresh locations (see `client_with_ttl`).
    let shared = matches!(
        sc.workload.kind,
        workload::Kind::Shared { .. } | workload::Kind::Appends { .. }
    );
    let client_for = |cluster: &Cluster, i: usize| {
        if shared {
            cluster.client_with_ttl(i, Duration::ZERO)
        } else {
            cluster.client(i)
        }
    };
    {
        let client = client_for(&cluster, 0);
        let (checks2, w) = (checks.clone(), sc.workload);
        let setup = cluster.clients[0]
            .0
            .spawn(async move { workload::setup(&client, &w, &checks2).await });
        if let Err(e) = setup.await {
            fail(
                &checks,
                &cluster,
                format!("setting up shared files failed: {e}"),
            );
        }
    }
    let mut handles = Vec::new();
    for i in 0..sc.shape.clients {
        let client = client_for(&cluster, i);
        let (checks, start, w) = (checks.clone(), cluster.start, sc.workload);
        handles.push(cluster.clients[i].0.spawn(workload::run(
            client,
            i,
            sc.shape.clients,
            w,
            checks,
            start,
            knobs.chunk_size,
        )));
    }

    // The fault phase lasts as long as the workload.
    let mut sched = Scheduler::new(sc.faults, sc.shape.chunkservers);
    while !handles.iter().all(|h| h.is_finished()) {
        let wait = Duration::from_millis(500 + rand() % 3_000);
        if sched.watches(&cluster) {
            // Watched in between, in slices (only where there is something to watch: a
            // task woken more often can change the order of others').
            let until = madsim::time::Instant::now() + wait;
            while madsim::time::Instant::now() < until {
                let left = until - madsim::time::Instant::now();
                // A crash to land mid-write is watched for every 2 ms (a write is in
                // flight for a few).
                let slice = if sched.arming() { 2 } else { 50 };
                madsim::time::sleep(left.min(Duration::from_millis(slice))).await;
                sched.watch(&mut cluster);
            }
        } else {
            madsim::time::sleep(wait).await;
        }
        if !sc.faults.is_empty() {
            sched.step(&mut cluster);
        }
    }
    let mut runs: Vec<ClientRun> = Vec::new();
    for h in handles {
        match h.await {
            Ok(r) => runs.push(r),
            Err(e) => fail(&checks, &cluster, format!("a client task died: {e}")),
        }
    }
    // Progress: with no fault in the mix, every client operation succeeds.
    let failed: u64 = runs.iter().map(|r| r.errors).sum();
    if sc.faults.is_empty() && failed > 0 {
        fail(
            &checks,
            &cluster,
            format!("a healthy cluster failed {failed} client operations"),
        );
    }
    if sc.silent_corruption {
        silent_corruption(&cluster, &checks).await;
    }
    sched.heal(&mut cluster);
    if let Err(e) = sched.settle(&mut cluster, sc.heal_within).await {
        fail(&checks, &cluster, e);
    }
    let healed = liveness(&cluster, &checks, &sc).await;
    // The scripted phases, on the healed cluster (`rot.rs`, `lost_remove.rs`,
    // `clone_race.rs`); then
    // healed again (every chunk back at its goal) before everything is read back.
    let healed = if healed && (sc.last_copy_rot || sc.lost_remove || sc.clone_race || sc.long_lived)
    {
        match runs.first_mut() {
            Some(run) if !shared => {
                if sc.last_copy_rot {
                    crate::rot::last_copy_rot(&mut cluster, &checks, run).await;
                    crate::revival::revival(&mut cluster, &checks, run).await;
                }
                if sc.lost_remove {
                    crate::lost_remove::lost_remove(&mut cluster, &checks, run).await;
                    crate::lost_remove::lost_rename(&mut cluster, &checks, run).await;
                }
                if sc.clone_race {
                    crate::clone_race::clone_race(&mut cluster, &checks, run).await;
                }
                if sc.long_lived {
                    crate::long_lived::long_lived(&mut cluster, &checks, run).await;
                }
                liveness(&cluster, &checks, &sc).await
            }
            _ => {
                fail(
                    &checks,
                    &cluster,
                    "the scripted phases need a private client's run".into(),
                );
                false
            }
        }
    } else {
        healed
    };
    let healed = if healed && sc.shadow_write && !cluster.replicas.is_empty() {
        crate::shadow_write::shadow_write(&cluster, &checks).await;
        liveness(&cluster, &checks, &sc).await
    } else {
        healed
    };
    let healed = if healed && sc.shadow_write && !cluster.replicas.is_empty() {
        crate::deposed_reads::deposed_reads(&cluster, &checks).await;
        liveness(&cluster, &checks, &sc).await
    } else {
        healed
    };
    let healed = if healed && sc.rename_onto {
        crate::rename_onto::rename_onto(&cluster, &checks).await;
        liveness(&cluster, &checks, &sc).await
    } else {
        healed
    };
    if healed && !sc.faults.beyond_claim && shared {
        if let Some(mut r) = runs.pop() {
            let client = client_for(&cluster, r.id);
            let (checks2, start, w) = (checks.clone(), cluster.start, sc.workload);
            let h = cluster.clients[r.id].0.spawn(async move {
                workload::verify_shared(&client, &mut r, &w, &checks2, start).await;
                r
            });
            match h.await {
                Ok(r) => runs.push(r),
                Err(e) => fail(&checks, &cluster, format!("a verifying client died: {e}")),
            }
        }
    } else if healed && !sc.faults.beyond_claim {
        for run in runs.iter_mut() {
            let client = cluster.client(run.id);
            let (checks2, start) = (checks.clone(), cluster.start);
            let mut r = std::mem::replace(run, ClientRun::new(run.id, run.chunk_size));
            let h = cluster.clients[r.id].0.spawn(async move {
                workload::verify_all(&client, &mut r, &checks2, start).await;
                r
            });
            match h.await {
                Ok(r) => *run = r,
                Err(e) => fail(&checks, &cluster, format!("a verifying client died: {e}")),
            }
        }
    }
    if healed && !sc.faults.beyond_claim {
        copies_identical(&cluster, &checks);
    }
    // A run that never exercised its subject fails rather than passes unseen.
    if healed && !sc.faults.beyond_claim {
        let c = checks.lock().expect("checks");
        let mut missing = Vec::new();
        if sc.workload.kind == workload::Kind::Private
            && c.listings_checked < sc.shape.clients as u64
        {
            missing.push(format!(
                "{} of {} clients' directories listed",
                c.listings_checked, sc.shape.clients
            ));
        }
        let replayed: u64 = runs.iter().map(|r| r.replayed).sum();
        if matches!(sc.workload.kind, workload::Kind::Replay(_)) && replayed == 0 {
            missing.push("no recorded operation replayed".into());
        }
        if matches!(sc.workload.kind, workload::Kind::Shared { .. }) && c.ns_ops_checked == 0 {
            missing.push("no namespace operation on the shared directory checked".into());
        }
        if sc.faults.replacements && c.faults.get("replica_replaced").copied().unwrap_or(0) == 0 {
            missing.push("no master replica replaced".into());
        }
        if sc.faults.replacements && c.snapshots_from_parts == 0 {
            missing.push("no snapshot sent in parts made whole".into());
        }
        if matches!(sc.workload.kind, workload::Kind::Shared { .. })
            && sc.shape.masters > 1
            && c.shadow_reads == 0
        {
            missing.push("no read a shadow master answered checked".into());
        }
        if sc.shape.masters > 1 && c.authority.reads_judged == 0 {
            missing.push("no read a leader answered judged against the elections".into());
        }
        if sc.faults.group_faults && c.leaders.len() > 1 && c.authority.authorities_judged == 0 {
            missing.push("no leader's authority judged against a later election".into());
        }
        let acked = c.appends.values().any(|a| !a.acked.is_empty());
        if matches!(sc.workload.kind, workload::Kind::Appends { .. })
            && acked
            && c.records_checked == 0
        {
            missing.push("no acknowledged record read back".to_string());
        }
        let files_left = runs.iter().any(|r| !r.model.files.is_empty());
        if c.reads_checked == 0 && files_left {
            missing.push("files left, but no read checked".to_string());
        }
        drop(c);
        if !missing.is_empty() {
            fail(
                &checks,
                &cluster,
                format!(
                    "the run did not exercise its subject: {}",
                    missing.join("; ")
                ),
            );
        }
    }
    let c = checks.lock().expect("checks");
    Outcome {
        seed,
        scenario: sc.name,
        violations: c.violations.clone(),
        trace: c.trace.value(),
        sim_ms: cluster.true_ms(),
        steps: c.steps,
        reads_checked: c.reads_checked,
        listings_checked: c.listings_checked,
        ns_ops_checked: c.ns_ops_checked,
        ns_writes_checked: c.ns_writes_checked,
        ns_files_checked: c.ns_files_checked,
        ns_races_met: c.ns_races.values().filter(|&&n| n >= 2).count() as u64,
        long_lived_max_ms: c.long_lived_max_ms,
        shadow_reads_checked: c.shadow_reads,
        known_writes_checked: c.known_writes_checked,
        copies_compared: c.copies_compared,
        leader_reads_judged: c.authority.reads_judged,
        authorities_judged: c.authority.authorities_judged,
        locations_judged: c.authority.located_judged,
        refusals_judged: c.refusals.judged,
        declared_dead: c.churn.declared_dead,
        clones_ordered: c.churn.clones_ordered,
        copies_inconsistent: c.copies_inconsistent,
        group_checkpoints: c.group_checkpoints,
        master_checkpoints: c.master_checkpoints,
        master_checkpoint_parts: c.master_checkpoint_parts,
        master_checkpoints_shrunk: c.master_checkpoints_shrunk,
        snapshots_from_parts: c.snapshots_from_parts,
        ops_ok: runs.iter().map(|r| r.ok).sum(),
        ops_failed: runs.iter().map(|r| r.errors).sum(),
        records_checked: c.records_checked,
        ops_replayed: runs.iter().map(|r| r.replayed).sum(),
        ops_replay_skipped: runs.iter().map(|r| r.replay_skipped).sum(),
        stale_seen: c.stale_seen.len(),
        scrub_found: c.scrub_found.len(),
        mends: c.mends,
        knobs: format!("{knobs:?} faults={:?}", sched.mix()),
        faults: sched.log.clone(),
        fault_counts: c.faults.clone(),
    }
}

/// After healing and reading back: every copy the master lists of a chunk, at the
/// chunk's version, is byte for byte the others, of the same length, padding and all,
/// except where a client's write or append of that chunk failed (GFS leaves such a
/// region inconsistent; `check::copies` says exactly which differences each failed
/// mutation accounts for). No copy may differ where no reader looks: past what a
/// client read back, or in a record append's padding.
fn copies_identical(cluster: &Cluster, checks: &Shared) {
    use crate::check::copies::{bad_blocks, unexplained, without};
    // Each listed chunk at the master's version, with its listed copies.
    let listed: Vec<(u64, u64, Vec<String>)> = {
        let c = checks.lock().expect("checks");
        let mut l: Vec<_> = c
            .listed
            .iter()
            .filter_map(|(h, a)| {
                let v = c.versions.master_version(*h).filter(|&v| v > 0)?;
                Some((*h, v, a.clone()))
            })
            .collect();
        l.sort_unstable();
        l
    };
    let (mut compared, mut inconsistent, mut several) = (0, 0, false);
    let mut found = Vec::new();
    for (h, version, addrs) in &listed {
        let (h, version) = (h, *version);
        several |= addrs.len() > 1;
        let corrupted = checks.lock().expect("checks").corrupted.clone();
        // Each copy: where, its bytes, and the ranges it may differ in for rot.
        type Copy<'a> = (&'a String, Vec<u8>, Vec<(u64, u64)>);
        let copies: Vec<Copy> = addrs
            .iter()
            .filter_map(|a| {
                let s = cluster.servers.iter().find(|s| s.alive && &s.addr == a)?;
                let meta = s.disk.meta(*h).filter(|m| m.version == version)?;
                let mut data = s.disk.written_data(*h)?;
                // Bytes past the recorded length were never acknowledged to anyone.
                data.truncate(meta.length as usize);
                // Where the run corrupted this copy on purpose, a block that fails its
                // checksum is never served: it may differ (its mending is checked apart).
                let rotted = if corrupted.contains(&(a.clone(), *h)) {
                    bad_blocks(&data, &meta.checksums)
                } else {
                    Vec::new()
                };
                Some((a, data, rotted))
            })
            .collect();
        let Some((first, want, rotted_first)) = copies.first() else {
            continue;
        };
        if copies.len() > 1 {
            compared += 1;
        }
        let decided = checks
            .lock()
            .expect("checks")
            .mutations
            .decided(*h)
            .to_vec();
        for (a, got, rotted) in &copies[1..] {
            if got == want {
                continue;
            }
            let left = unexplained(want, got, &decided);
            let left = without(&without(&left, rotted_first), rotted);
            inconsistent += u64::from(left.is_empty());
            if let Some(&(at, to)) = left.first() {
                let near: Vec<_> = decided
                    .iter()
                    .filter(|d| d.offset < to && d.offset.saturating_add(d.len.max(1)) > at)
                    .take(8)
                    .collect();
                let show = |d: &[u8]| {
                    let from = (at as usize).saturating_sub(8).min(d.len());
                    let to = (at as usize + 40).min(d.len());
                    format!("{from}: {:02x?}", &d[from..to])
                };
                tracing::warn!(
                    chunk = h,
                    "copies differ: {} has {}; {first} has {}",
                    a,
                    show(got),
                    show(want)
                );
                found.push(format!(
                    "chunk {h} at version {version}: the copy on {a} ({} bytes) differs from the one on {first} ({} bytes) from byte {at}",
                    got.len(),
                    want.len()
                ) + &format!(
                    "; differing at {:?}, which no failed mutation of it accounts for \
                     (of its {} decided, those there: {near:?})",
                    &left[..left.len().min(4)],
                    decided.len(),
                ));
            }
        }
    }
    let mut c = checks.lock().expect("checks");
    if several && compared == 0 {
        found.push(
            "the run did not exercise its subject: chunks are listed with several copies, \
             but no two were compared"
                .to_string(),
        );
    }
    c.copies_compared += compared;
    c.copies_inconsistent += inconsistent;
    for f in found {
        c.violation(cluster.true_ms(), f);
    }
}

pub(crate) fn fail(checks: &Shared, cluster: &Cluster, what: String) {
    checks
        .lock()
        .expect("checks")
        .violation(cluster.true_ms(), what);
}

/// After healing: every chunk of every live file back at its replication goal within
/// the scenario's `heal_within` (and, if it asks, every stale copy deleted). Beyond the
/// claim, chunks may be lost for good; only wrong data is an error.
async fn liveness(cluster: &Cluster, checks: &Shared, sc: &Scenario) -> bool {
    let (within, beyond_claim, stale_collected) =
        (sc.heal_within, sc.faults.beyond_claim, sc.stale_collected);
    let deadline = cluster.true_ms() + within.as_millis() as i64;
    let healed_at = cluster.true_ms();
    loop {
        madsim::time::sleep(Duration::from_secs(1)).await;
        let (r, stale) = {
            let c = checks.lock().expect("checks");
            let stale = if stale_collected {
                c.versions.stale_copies()
            } else {
                Vec::new()
            };
            (c.replication.clone(), stale)
        };
        let fresh = r.at_true_ms > healed_at;
        let chunks = fresh
            && r.under_replicated == 0
            && (r.missing == 0 || beyond_claim)
            && stale.is_empty();
        let group = if chunks {
            crate::replace::group_whole(cluster).await
        } else {
            Err("not asked".into())
        };
        if chunks && group.is_ok() {
            return true;
        }
        if cluster.true_ms() > deadline {
            fail(
                checks,
                cluster,
                format!(
                    "not healed {} s after faults stopped: {r:?}; stale copies left: {stale:?}; \
                     master group: {group:?}",
                    within.as_secs()
                ),
            );
            return false;
        }
    }
}

/// Flips a bit in a few idle copies on up to R−1 servers (one copy per chunk), then waits
/// for the scrubber to report each one. Nothing reads the data meanwhile, so only the
/// scrubber can find them.
async fn silent_corruption(cluster: &Cluster, checks: &Shared) {
    let n = cluster.servers.len();
    let victims = (cluster.knobs.replication as usize - 1).min(n);
    let first = (rand() % n as u64) as usize;
    let mut flipped: Vec<(String, u64)> = Vec::new();
    for k in 0..victims {
        let i = (first + k) % n;
        let s = &cluster.servers[i];
        let chunks: Vec<(u64, usize)> = s.disk.chunks().into_iter().filter(|c| c.1 > 0).collect();
        for _ in 0..3.min(chunks.len()) {
            let (h, len) = chunks[(rand() % chunks.len() as u64) as usize];
            // One bad copy per chunk: a second one could be found first by the clone
            // that repairs the first, which is a read, not the scrubber.
            if flipped.iter().any(|f| f.1 == h) {
                continue;
            }
            let off = (rand() % len as u64) as usize;
            if cluster.flip_bit(i, h, off, (rand() % 8) as u8) {
                tracing::info!(
                    t = cluster.true_ms(),
                    "flip a bit of chunk {h} at {off} on {}",
                    s.addr
                );
                flipped.push((s.addr.clone(), h));
            }
        }
    }
    if flipped.is_empty() {
        fail(
            checks,
            cluster,
            "silent corruption found no copy to flip: the scrubber was not tested".into(),
        );
        return;
    }
    let deadline = cluster.true_ms() + 120_000;
    loop {
        madsim::time::sleep(Duration::from_secs(1)).await;
        let missed: Vec<&(String, u64)> = {
            let c = checks.lock().expect("checks");
            flipped
                .iter()
                .filter(|f| !c.scrub_found.contains(f))
                // A copy deleted meanwhile (its file was removed) is not the scrubber's.
                .filter(|f| c.versions.server_version(&f.0, f.1).is_some())
                .collect()
        };
        if missed.is_empty() {
            return;
        }
        if cluster.true_ms() > deadline {
            fail(
                checks,
                cluster,
                format!("the scrubber did not find corrupted copies within 120 s: {missed:?}"),
            );
            return;
        }
    }
}
