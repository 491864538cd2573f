//! The `trace_file` fuzz target's body (`fuzz/fuzz_targets/trace_file.rs`): a trace file
//! as a disk holds it, of either format, from arbitrary bytes. An error, never a panic,
//! never more memory than the file's size justifies; and what reads is well formed.
//! `tests/fuzz_corpus.rs` replays the committed corpus (`fuzz/corpus/trace_file/`).

use std::path::Path;

use tessera_core::trace::{MAGIC, RAW_FORMAT, Sink};

use crate::{FileSink, Rotation, parse_file};

/// One input.
pub fn run(data: &[u8]) {
    if let Ok(f) = parse_file("fuzz", data) {
        assert!(f.records.iter().all(|r| r.seq != 0 && r.kind.is_some()));
        assert!(
            f.header.format == 0 || data.starts_with(MAGIC),
            "a file without the magic read"
        );
    }
}

/// Seed inputs: files as nodes write them (closed, open after a flush, cut inside a
/// block), and one of format 1.
pub fn seeds(scratch: &Path) -> Vec<Vec<u8>> {
    use tessera_core::pb;
    let record = |seq: u64| {
        let mut out = Vec::new();
        tessera_core::trace::frame(
            &pb::TraceRecord {
                seq,
                now_ms: 1000 + seq * 7,
                kind: Some(pb::trace_record::Kind::Master(pb::TraceMasterStep {
                    origin: Some(pb::TraceOrigin {
                        peer: "10.0.2.1:40000".into(),
                        arrived_ms: 1000 + seq * 7,
                    }),
                    input: Some(pb::trace_master_step::Input::LogSynced(seq)),
                    ..Default::default()
                })),
            },
            &mut out,
        );
        out
    };
    let _ = std::fs::remove_dir_all(scratch);
    let mut sink =
        FileSink::open(scratch, "master", "m:1", Rotation::default()).expect("a scratch directory");
    let dir = sink.dir().to_path_buf();
    let file = dir.join("000001.trace");
    for seq in 1..=40 {
        sink.record(seq, &record(seq));
        if seq % 10 == 0 {
            sink.flush();
        }
    }
    let open = std::fs::read(&file).expect("the file");
    drop(sink);
    let closed = std::fs::read(&file).expect("the file");
    let cut = open[..open.len() - 4].to_vec();
    let mut raw = MAGIC.to_vec();
    tessera_core::trace::frame(
        &tessera_core::trace::header(RAW_FORMAT, "m:1", "master", 1, 1),
        &mut raw,
    );
    for seq in 1..=5 {
        raw.extend(record(seq));
    }
    let _ = std::fs::remove_dir_all(scratch);
    vec![closed, open, cut, raw]
}
