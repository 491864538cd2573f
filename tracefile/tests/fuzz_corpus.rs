//! Replays the `trace_file` fuzz target's committed corpus (`fuzz/corpus/trace_file/`),
//! so CI runs it without a fuzzer. `TF_WRITE_SEEDS=1` writes the seed inputs there (once,
//! when they change).

use std::path::Path;

use tessera_tracefile::fuzz;

#[test]
fn the_trace_file_corpus_runs_clean() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/trace_file");
    let scratch = std::env::temp_dir().join(format!("tessera-tf-seeds-{}", std::process::id()));
    let seeds = fuzz::seeds(&scratch);
    if std::env::var_os("TF_WRITE_SEEDS").is_some() {
        std::fs::create_dir_all(&dir).expect("the corpus directory");
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), s).expect("a corpus file");
        }
    }
    // The seeds read: the closed file whole, the open one whole and open, the cut one
    // short and cut, the raw one whole.
    let read: Vec<_> = seeds
        .iter()
        .map(|s| tessera_tracefile::parse_file("seed", s).expect("a seed reads"))
        .collect();
    assert_eq!(read[0].records.len(), 40);
    assert!(!read[0].open && read[0].cut.is_none());
    assert_eq!(read[1].records.len(), 40);
    assert!(read[1].open && read[1].cut.is_none());
    assert!(read[2].records.len() < 40 && read[2].cut.is_some());
    assert_eq!(read[3].records.len(), 5);
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    inputs.sort();
    assert!(inputs.len() >= 4, "{} inputs", inputs.len());
    for input in &inputs {
        let data = std::fs::read(input).expect("an input");
        let run = std::panic::catch_unwind(|| fuzz::run(&data));
        assert!(run.is_ok(), "{} fails", input.display());
    }
}
