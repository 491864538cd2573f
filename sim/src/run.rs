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
}

#[derive(Clone, Debug)]
pub struct Outcome {
    pub seed: u64,
    pub scenario: &'static str,
    pub violations: Vec<String>,
    pub trace: u64,
    pub sim_ms: i64,
    pub steps: u64,
    pub reads_checked: u64,
    pub ops_ok: u64,
    pub ops_failed: u64,
    pub knobs: String,
    pub faults: Vec<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Runs `sc` with `seed` on the current thread. Use a fresh thread per run (the runner
/// does) so nothing of one run's world leaks into the next.
pub fn run(sc: &Scenario, seed: u64) -> Outcome {
    let mut rt = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
    // A run that stops making progress fails rather than hanging CI.
    rt.set_time_limit(Duration::from_secs(3_600));
    let sc = *sc;
    rt.block_on(async move { world(sc, seed).await })
}

fn rand() -> u64 {
    madsim::rand::random()
}

async fn world(sc: Scenario, seed: u64) -> Outcome {
    let mut knobs = Knobs::pick(&mut rand);
    (sc.tweak)(&mut knobs);
    let checks = check::shared();
    let mut cluster = Cluster::start(sc.shape, knobs.clone(), checks.clone());
    madsim::time::sleep(Duration::from_secs(2)).await;

    let mut handles = Vec::new();
    for i in 0..sc.shape.clients {
        let client = cluster.client(i);
        let (checks, start, w) = (checks.clone(), cluster.start, sc.workload);
        handles.push(
            cluster.clients[i]
                .0
                .spawn(workload::run(client, i, w, checks, start)),
        );
    }

    // The fault phase lasts as long as the workload.
    let mut sched = Scheduler::new(sc.faults, sc.shape.chunkservers);
    while !handles.iter().all(|h| h.is_finished()) {
        madsim::time::sleep(Duration::from_millis(500 + rand() % 3_000)).await;
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
    sched.heal(&mut cluster);
    let healed = liveness(&cluster, &checks, sc.heal_within, sc.faults.beyond_claim).await;
    if healed && !sc.faults.beyond_claim {
        for run in runs.iter_mut() {
            let client = cluster.client(run.id);
            let (checks2, start) = (checks.clone(), cluster.start);
            let mut r = std::mem::replace(
                run,
                ClientRun {
                    id: run.id,
                    model: Default::default(),
                    ok: 0,
                    errors: 0,
                },
            );
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
    let c = checks.lock().expect("checks");
    Outcome {
        seed,
        scenario: sc.name,
        violations: c.violations.clone(),
        trace: c.trace.value(),
        sim_ms: cluster.true_ms(),
        steps: c.steps,
        reads_checked: c.reads_checked,
        ops_ok: runs.iter().map(|r| r.ok).sum(),
        ops_failed: runs.iter().map(|r| r.errors).sum(),
        knobs: format!("{knobs:?} faults={:?}", sched.mix()),
        faults: sched.log.clone(),
    }
}

fn fail(checks: &Shared, cluster: &Cluster, what: String) {
    checks
        .lock()
        .expect("checks")
        .violation(cluster.true_ms(), what);
}

/// After healing: every chunk of every live file back at its replication goal within
/// `within`. Beyond the claim, chunks may be lost for good; only wrong data is an error.
async fn liveness(
    cluster: &Cluster,
    checks: &Shared,
    within: Duration,
    beyond_claim: bool,
) -> bool {
    let deadline = cluster.true_ms() + within.as_millis() as i64;
    let healed_at = cluster.true_ms();
    loop {
        madsim::time::sleep(Duration::from_secs(1)).await;
        let r = checks.lock().expect("checks").replication.clone();
        let fresh = r.at_true_ms > healed_at;
        if fresh && r.under_replicated == 0 && (r.missing == 0 || beyond_claim) {
            return true;
        }
        if cluster.true_ms() > deadline {
            fail(
                checks,
                cluster,
                format!(
                    "not healed {} s after faults stopped: {r:?}",
                    within.as_secs()
                ),
            );
            return false;
        }
    }
}
