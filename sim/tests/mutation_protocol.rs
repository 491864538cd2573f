//! The `mutation_protocol` fuzz target without a fuzzer: random inputs from a fixed
//! generator, each a whole run of the in-process world, must pass.

use tessera_sim::fuzz;

fn input(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn random_runs_pass() {
    let n: u64 = std::env::var("MP_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let first: u64 = std::env::var("MP_FIRST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let t = std::time::Instant::now();
    let mut total = fuzz::Report::default();
    for seed in first..first + n {
        let len = std::env::var("MP_LEN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(600);
        let data = input(seed, len);
        let r = std::panic::catch_unwind(|| fuzz::report(&data));
        let Ok(r) = r else {
            panic!("seed {seed} fails");
        };
        total.actions += r.actions;
        total.writes += r.writes;
        total.writes_acked += r.writes_acked;
        total.appends += r.appends;
        total.appends_acked += r.appends_acked;
        total.reads += r.reads;
        total.steps += r.steps;
        for (k, v) in r.faults {
            *total.faults.entry(k).or_default() += v;
        }
    }
    println!("{n} runs in {:?}: {total:?}", t.elapsed());
}

/// Every committed corpus input runs clean (a crash input, once its bug is fixed, goes
/// there), and so does every seed, each reaching what it was written for.
#[test]
fn the_corpus_and_the_seeds_run_clean() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/mutation_protocol");
    // `MP_WRITE_SEEDS=1` writes the seeds into the corpus (once, when they change).
    if std::env::var_os("MP_WRITE_SEEDS").is_some() {
        for (i, s) in fuzz::seeds().iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), s).expect("a corpus file");
        }
    }
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("an entry").path())
        .collect();
    inputs.sort();
    assert!(inputs.len() >= 8, "{} inputs", inputs.len());
    for p in &inputs {
        let data = std::fs::read(p).expect("an input");
        let r = std::panic::catch_unwind(|| fuzz::run(&data));
        assert!(r.is_ok(), "{} fails", p.display());
    }
    let seeds = fuzz::seeds();
    let r: Vec<fuzz::Report> = seeds.iter().map(|s| fuzz::report(s)).collect();
    for (i, r) in r.iter().enumerate() {
        println!("seed {i}: {r:?}");
    }
    assert!(r[0].writes_acked == 2 && r[0].reads >= 3, "{:?}", r[0]);
    assert!(r[1].appends_acked == 6 && r[1].reads >= 6, "{:?}", r[1]);
    assert!(
        r[2].faults.get("crash") == Some(&1) && r[2].writes_acked == 1,
        "{:?}",
        r[2]
    );
    assert!(
        r[3].faults.get("master_crash") == Some(&1) && r[3].appends_acked == 1,
        "{:?}",
        r[3]
    );
    assert!(
        r[4].faults.get("bit_flip") >= Some(&1) && r[4].writes_acked == 1,
        "{:?}",
        r[4]
    );
    assert!(r[5].faults.len() >= 3, "{:?}", r[5]);
    assert!(r[6].faults.get("full_disk") == Some(&1), "{:?}", r[6]);
    assert!(r[7].writes_acked == 2, "{:?}", r[7]);
}

/// `MP_INPUT=FILE cargo test -p tessera-sim --test mutation_protocol one_input -- --nocapture`
/// runs one input (a crash the fuzzer wrote, say) and prints what it did.
#[test]
fn one_input() {
    let Some(path) = std::env::var_os("MP_INPUT") else {
        return;
    };
    let data = std::fs::read(&path).expect("MP_INPUT names a file");
    println!("{:?}", fuzz::report(&data));
}
