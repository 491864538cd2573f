//! The bodies of the fuzz targets in `fuzz/` (cargo-fuzz). They live here, in the
//! workspace, so `cargo test` replays every target's committed corpus
//! (`core/tests/fuzz_corpus.rs`) without a fuzzer, and the targets themselves are one
//! line each. Each body panics only on a bug: a decoder or state machine that panicked
//! on its input, or a property the target checks that did not hold.

pub mod decode;
pub mod oplog;

/// A target's body: its input, and how much of it reached its subject.
pub type Target = fn(&[u8]) -> usize;

/// The targets, by the name of their file in `fuzz/fuzz_targets/` and corpus folder.
/// Each returns how much of its input it got to exercise (decode: 1 when the input
/// decoded and was handed on; oplog_roundtrip: the records applied), so tests can tell a
/// seed that reaches its subject from one that is turned away at the door.
pub const TARGETS: &[(&str, Target)] = &[("decode", decode::run), ("oplog_roundtrip", oplog::run)];

/// Each target's seed inputs, by name: what a corpus starts from.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "decode" => decode::seeds(),
        "oplog_roundtrip" => oplog::seeds(),
        _ => Vec::new(),
    }
}
