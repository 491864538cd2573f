//! Replays every fuzz target's committed corpus (`fuzz/corpus/<target>/`), so CI runs
//! each target on its corpus without a fuzzer, and an input that once found a bug (a
//! crash file, once fixed, goes into the corpus) keeps being tried.

use std::path::Path;

use tessera_core::fuzz::TARGETS;

#[test]
fn every_targets_corpus_runs_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    for (name, target) in TARGETS {
        let dir = root.join(name);
        let mut inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        inputs.sort();
        assert!(
            inputs.len() >= 8,
            "{name}: only {} inputs in {}",
            inputs.len(),
            dir.display()
        );
        for input in &inputs {
            let data = std::fs::read(input).expect("an input");
            let run = std::panic::catch_unwind(|| target(&data));
            assert!(run.is_ok(), "{name}: {} fails", input.display());
        }
        println!("{name}: {} inputs", inputs.len());
    }
}

/// The seed inputs each target's corpus starts from run clean too, and every seed
/// reaches the decoder or operation it was written for (a seed that decodes to
/// nothing would exercise nothing).
#[test]
fn every_targets_seeds_run_clean() {
    for (name, target) in TARGETS {
        let seeds = tessera_core::fuzz::seeds(name);
        assert!(seeds.len() >= 8, "{name}: {} seeds", seeds.len());
        let reached: Vec<usize> = seeds.iter().map(|s| target(s)).collect();
        match *name {
            "decode" => assert!(reached.iter().all(|&n| n == 1), "{name}: {reached:?}"),
            // The longest seed builds the tree: most of its steps apply.
            _ => assert!(reached[0] >= 8, "{name}: {reached:?}"),
        }
    }
}

/// Writes the seeds into `fuzz/corpus/<target>/seed-<n>` (run by hand to start a
/// corpus: `cargo test -p tessera-core --test fuzz_corpus -- --ignored`).
#[test]
#[ignore]
fn write_seed_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    for (name, _) in TARGETS {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("corpus directory");
        for (i, s) in tessera_core::fuzz::seeds(name).iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), s).expect("a seed");
        }
    }
}
