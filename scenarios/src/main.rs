//! The scenario runner.
//!
//! ```text
//! tessera-scenarios list
//! tessera-scenarios run <name|all> --seed <n>
//! tessera-scenarios run <name|all> --seeds <count> [--first <n>] [--check-determinism]
//! tessera-scenarios append-bench [--appenders 1,4,16] [--seconds 60] [--record 4096] [--seed 1]
//! ```
//! One line per run: `seed=<n> scenario=<name> result=ok trace=<hex>`, or `result=FAIL`
//! with the violated check and a command that replays it. Exits non-zero on any failure.

#[cfg(not(madsim))]
fn main() {
    eprintln!(
        "tessera-scenarios runs in the simulator: build it with RUSTFLAGS=\"--cfg madsim\" (see README.md)"
    );
    std::process::exit(2);
}

#[cfg(madsim)]
fn main() {
    std::process::exit(madsim_main::main());
}

#[cfg(madsim)]
mod madsim_main {
    use std::path::PathBuf;
    use std::time::Instant;

    use tessera_sim::run::{Outcome, Scenario, run_traced};

    /// Sweeps this long must see every fault kind of their mix happen.
    const MIN_SWEEP: usize = 20;
    const REPLAY: &str = "RUSTFLAGS=\"--cfg madsim\" CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/tessera/target-madsim} cargo run --release -p tessera-scenarios --";

    fn usage() -> i32 {
        eprintln!(
            "usage: tessera-scenarios list | run <name|all> (--seed N | --seeds COUNT [--first N]) [--check-determinism] [--verbose] [--trace-dir DIR]\n       tessera-scenarios replay TRACE_DIR... --scenario <name> (--seed N | --seeds COUNT [--first N]) [--check-determinism] [--verbose]\n       tessera-scenarios append-bench [--appenders 1,4,16] [--seconds 60] [--record 4096] [--seed 1]"
        );
        2
    }

    /// Runs one seed on a fresh thread, so no world state outlives its run.
    fn run_isolated(sc: Scenario, seed: u64, trace: Option<PathBuf>) -> Outcome {
        match std::thread::spawn(move || run_traced(&sc, seed, trace)).join() {
            Ok(o) => o,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                Outcome {
                    seed,
                    scenario: sc.name,
                    violations: vec![format!("panicked: {msg}")],
                    ..Outcome::default()
                }
            }
        }
    }

    pub fn main() -> i32 {
        // RUST_LOG=tessera_core=debug (for example) prints what every node does.
        if std::env::var_os("RUST_LOG").is_some() {
            madsim::runtime::init_logger();
        }
        let args: Vec<String> = std::env::args().skip(1).collect();
        match args.first().map(String::as_str) {
            Some("list") => {
                for s in tessera_scenarios::all() {
                    println!("{:<18} {:?}", s.name, s.faults);
                }
                0
            }
            Some("run") => run_cmd(&args[1..]),
            Some("replay") => replay_cmd(&args[1..]),
            Some("append-bench") => append_bench(&args[1..]),
            _ => usage(),
        }
    }

    fn flag(args: &[String], name: &str) -> Option<u64> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
    }

    /// Aggregate record-append throughput, one fault-free run per appender count.
    fn append_bench(args: &[String]) -> i32 {
        use tessera_sim::bench::{AppendBench, append_throughput};
        let counts: Vec<usize> = args
            .iter()
            .position(|a| a == "--appenders")
            .and_then(|i| args.get(i + 1))
            .map_or(Some(vec![1, 4, 16]), |v| {
                v.split(',').map(|x| x.parse().ok()).collect()
            })
            .unwrap_or_default();
        if counts.is_empty() || counts.contains(&0) {
            return usage();
        }
        let seconds = flag(args, "--seconds").unwrap_or(60);
        let record = flag(args, "--record").unwrap_or(4096) as usize;
        let seed = flag(args, "--seed").unwrap_or(1);
        let mut bad = 0;
        for n in counts {
            let b = AppendBench {
                appenders: n,
                duration: std::time::Duration::from_secs(seconds),
                record,
            };
            let started = Instant::now();
            let f = std::thread::spawn(move || append_throughput(seed, b))
                .join()
                .expect("benchmark thread");
            println!(
                "appenders={n} record={record}B records={} failed={} sim={}ms records_per_s={:.1} MB_per_s={:.3} read_back={} wall={:.1}s",
                f.records,
                f.failed,
                f.sim_ms,
                f.records_per_sec(),
                f.mb_per_sec(),
                f.found,
                started.elapsed().as_secs_f64()
            );
            for v in &f.violations {
                bad += 1;
                println!("  violated: {v}");
            }
        }
        i32::from(bad > 0)
    }

    /// `kind:count` pairs, comma-separated ("none" when no fault happened).
    fn fault_list(counts: &std::collections::BTreeMap<&str, u64>) -> String {
        if counts.is_empty() {
            return "none".into();
        }
        counts
            .iter()
            .map(|(k, n)| format!("{k}:{n}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn run_cmd(args: &[String]) -> i32 {
        let Some(name) = args.first() else {
            return usage();
        };
        let scenarios: Vec<Scenario> = if name == "all" {
            tessera_scenarios::all()
        } else {
            match tessera_scenarios::find(name) {
                Some(s) => vec![s],
                None => {
                    eprintln!("unknown scenario {name}; `list` shows them");
                    return 2;
                }
            }
        };
        sweep(&scenarios, args, &|sc: &str, seed: u64| {
            format!("{REPLAY} run {sc} --seed {seed}")
        })
    }

    /// `replay TRACE_DIR... --scenario S --seed N`: the client operations found in the
    /// traces (`tessera_tracefile::workload`) become the workload of scenario S, run
    /// under its faults with every checker.
    fn replay_cmd(args: &[String]) -> i32 {
        let paths: Vec<PathBuf> = args
            .iter()
            .take_while(|a| !a.starts_with("--"))
            .map(PathBuf::from)
            .collect();
        let name = args
            .iter()
            .position(|a| a == "--scenario")
            .and_then(|i| args.get(i + 1));
        let (Some(name), false) = (name, paths.is_empty()) else {
            return usage();
        };
        let Some(mut sc) = tessera_scenarios::find(name) else {
            eprintln!("unknown scenario {name}; `list` shows them");
            return 2;
        };
        let nodes = match tessera_tracefile::read_paths(&paths) {
            Ok(n) => n,
            Err(e) => {
                eprintln!("replay: {e}");
                return 2;
            }
        };
        let script = tessera_tracefile::workload::script(&nodes);
        eprintln!(
            "replay: {} nodes' traces: {}",
            nodes.len(),
            script.describe()
        );
        if script.steps.is_empty() {
            eprintln!("replay: no client operation in these traces");
            return 2;
        }
        // The script lives as long as the runs, which are `Copy` scenarios.
        let script: &'static tessera_tracefile::workload::Script = Box::leak(Box::new(script));
        sc.workload.kind = tessera_sim::workload::Kind::Replay(script);
        let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        let shown = shown.join(" ");
        sweep(&[sc], args, &|sc: &str, seed: u64| {
            format!("{REPLAY} replay {shown} --scenario {sc} --seed {seed}")
        })
    }

    /// Runs each scenario on the seeds `args` name; `how` gives a failing run's replay
    /// command.
    fn sweep(scenarios: &[Scenario], args: &[String], how: &dyn Fn(&str, u64) -> String) -> i32 {
        let seeds: Vec<u64> = match (flag(args, "--seed"), flag(args, "--seeds")) {
            (Some(s), _) => vec![s],
            (None, Some(n)) => {
                let first = flag(args, "--first").unwrap_or(1);
                (first..first + n).collect()
            }
            _ => return usage(),
        };
        let determinism = args.iter().any(|a| a == "--check-determinism");
        // Every node's trace, as real servers write them with --trace-dir: in DIR for one
        // seed, in DIR/<scenario>-<seed> for several.
        let trace_dir = args
            .iter()
            .position(|a| a == "--trace-dir")
            .map(|i| args.get(i + 1).map(PathBuf::from));
        let trace_dir = match trace_dir {
            Some(None) => return usage(),
            Some(Some(d)) => Some(d),
            None => None,
        };
        let one = seeds.len() == 1 && scenarios.len() == 1;
        let verbose = args.iter().any(|a| a == "--verbose");
        let mut failed = 0;
        let mut gaps = 0;
        for sc in scenarios {
            let started = Instant::now();
            let mut sim_ms = 0i64;
            let (mut records, mut reads, mut stale_runs, mut scrubbed) = (0, 0, 0, 0);
            let mut mends = [0u64; 2];
            let (mut listings, mut ns_ops, mut ns_writes, mut ns_files) = (0, 0, 0, 0);
            let (mut shadow_reads, mut group_checkpoints, mut from_parts) = (0, 0, 0);
            let mut known_writes = 0;
            let (mut copies_compared, mut copies_inconsistent) = (0, 0);
            let (mut leader_reads, mut authorities, mut locations) = (0, 0, 0);
            let (mut refusals, mut races, mut long_lived) = (0, 0, 0);
            let (mut declared_dead, mut clones_ordered) = (0, 0);
            let (mut master_checkpoints, mut checkpoint_parts, mut shrunk) = (0, 0, 0);
            let mut faults = std::collections::BTreeMap::<&str, u64>::new();
            for &seed in &seeds {
                let trace = trace_dir.as_ref().map(|d| {
                    if one {
                        d.clone()
                    } else {
                        d.join(format!("{}-{seed}", sc.name))
                    }
                });
                let o = run_isolated(*sc, seed, trace);
                sim_ms += o.sim_ms;
                records += o.records_checked;
                reads += o.reads_checked;
                listings += o.listings_checked;
                ns_ops += o.ns_ops_checked;
                ns_writes += o.ns_writes_checked;
                ns_files += o.ns_files_checked;
                races += o.ns_races_met;
                long_lived = long_lived.max(o.long_lived_max_ms);
                shadow_reads += o.shadow_reads_checked;
                known_writes += o.known_writes_checked;
                copies_compared += o.copies_compared;
                leader_reads += o.leader_reads_judged;
                authorities += o.authorities_judged;
                locations += o.locations_judged;
                refusals += o.refusals_judged;
                declared_dead += o.declared_dead;
                clones_ordered += o.clones_ordered;
                copies_inconsistent += o.copies_inconsistent;
                group_checkpoints += o.group_checkpoints;
                master_checkpoints += o.master_checkpoints;
                checkpoint_parts += o.master_checkpoint_parts;
                shrunk += o.master_checkpoints_shrunk;
                from_parts += o.snapshots_from_parts;
                stale_runs += usize::from(o.stale_seen > 0);
                scrubbed += o.scrub_found;
                mends[0] += o.mends[0];
                mends[1] += o.mends[1];
                for (k, n) in &o.fault_counts {
                    *faults.entry(k).or_default() += n;
                }
                let mut violations = o.violations.clone();
                // A failing seed is replayed at once: its replay command must show the
                // same run.
                if determinism || !o.passed() {
                    let again = run_isolated(*sc, seed, None);
                    if again.trace != o.trace {
                        violations.push(format!(
                            "nondeterministic: trace {:016x} then {:016x}",
                            o.trace, again.trace
                        ));
                    } else if !o.passed() {
                        violations.push(format!("replayed: the same trace {:016x}", o.trace));
                    }
                }
                if violations.is_empty() {
                    println!(
                        "seed={seed} scenario={} result=ok trace={:016x}",
                        sc.name, o.trace
                    );
                } else {
                    failed += 1;
                    println!(
                        "seed={seed} scenario={} result=FAIL trace={:016x}",
                        sc.name, o.trace
                    );
                    for v in &violations {
                        println!("  violated: {v}");
                    }
                    println!("  knobs: {}", o.knobs);
                    println!("  replay: {}", how(sc.name, seed));
                }
                if verbose {
                    println!(
                        "  sim={}ms steps={} ops_ok={} ops_failed={} ops_replayed={} ops_replay_skipped={} reads_checked={} records_checked={} stale_copies={} scrub_found={} mends={:?}",
                        o.sim_ms,
                        o.steps,
                        o.ops_ok,
                        o.ops_failed,
                        o.ops_replayed,
                        o.ops_replay_skipped,
                        o.reads_checked,
                        o.records_checked,
                        o.stale_seen,
                        o.scrub_found,
                        o.mends
                    );
                    println!("  faults={}", fault_list(&o.fault_counts));
                    for f in &o.faults {
                        println!("  fault: {f}");
                    }
                }
            }
            let wall = started.elapsed().as_secs_f64();
            let [mends_done, mends_failed] = mends;
            eprintln!(
                "scenario={} seeds={} wall={wall:.1}s seeds_per_min={:.1} sim_per_wall={:.0}x \
                 reads_checked={reads} records_checked={records} listings_checked={listings} \
                 ns_ops_checked={ns_ops} ns_writes_checked={ns_writes} ns_files_checked={ns_files} ns_races_met={races} long_lived_max_ms={long_lived} \
                 shadow_reads_checked={shadow_reads} known_writes_checked={known_writes} \
                 copies_compared={copies_compared} copies_inconsistent={copies_inconsistent} \
                 leader_reads_judged={leader_reads} authorities_judged={authorities} \
                 locations_judged={locations} refusals_judged={refusals} \
                 churn_declared_dead={declared_dead} churn_clones_ordered={clones_ordered} \
                 group_checkpoints={group_checkpoints} \
                 master_checkpoints={master_checkpoints} master_checkpoint_parts={checkpoint_parts} \
                 master_checkpoints_shrunk={shrunk} \
                 snapshots_from_parts={from_parts} \
                 runs_with_stale_copies={stale_runs} \
                 scrubber_finds={scrubbed} mends_done={mends_done} mends_failed={mends_failed} \
                 faults={}",
                sc.name,
                seeds.len(),
                seeds.len() as f64 * 60.0 / wall.max(1e-9) / if determinism { 2.0 } else { 1.0 },
                sim_ms as f64 / 1000.0 / wall.max(1e-9) * if determinism { 2.0 } else { 1.0 },
                fault_list(&faults),
            );
            // A fault is real only once it has happened: over a sweep long enough to
            // expect every kind in the mix, each must have.
            if seeds.len() >= MIN_SWEEP {
                for (flag, kinds) in sc.faults.kinds() {
                    if kinds.iter().all(|k| !faults.contains_key(k)) {
                        gaps += 1;
                        println!(
                            "scenario={} GAP: {} seeds and no {flag} fault happened (none of {kinds:?})",
                            sc.name,
                            seeds.len()
                        );
                    }
                }
            }
        }
        if failed > 0 {
            println!("{failed} runs FAILED");
            1
        } else if gaps > 0 {
            println!("{gaps} sweeps did not exercise what they claim");
            1
        } else {
            0
        }
    }
}
