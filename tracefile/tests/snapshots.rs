//! The trace format pinned: the encoding of a few records (their frames, as a format 2
//! file holds them once inflated), and the summary of a trace recorded by the simulator
//! (`tessera-scenarios run steady --seed 1 --trace-dir`, committed under
//! `tests/fixtures/` in format 1, so old files are shown to read; one recorded now is in
//! format 2, and reads the same). A change to either is a change of format: bump
//! `TRACE_FORMAT` when old files no longer read, re-record the fixture, and review the
//! snapshots (`cargo insta review`).

use std::path::PathBuf;

use tessera_core::pb::{self, trace_master_step::Input as M, trace_record::Kind};
use tessera_core::trace::{self, record};
use tessera_tracefile::summary::summary;

fn hex(b: &[u8]) -> String {
    b.chunks(32)
        .map(|l| l.iter().map(|x| format!("{x:02x}")).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_encoding_of_records() {
    let mut out = Vec::new();
    trace::frame(
        &pb::TraceHeader {
            protocol: 0x0123_4567_89ab_cdef,
            build: "0.1.0".into(),
            ..trace::header(trace::TRACE_FORMAT, "10.0.0.1:7000", "master", 3, 17)
        },
        &mut out,
    );
    let mkdir = pb::MasterRequest {
        token: 5,
        req: Some(pb::master_request::Req::Mkdir(pb::MkdirRequest {
            mode: None,
            path: "/a".into(),
            parents: true,
        })),
        ..Default::default()
    };
    trace::frame(
        &pb::TraceRecord {
            seq: 17,
            now_ms: 123_456,
            kind: Some(Kind::Master(pb::TraceMasterStep {
                origin: Some(pb::TraceOrigin {
                    peer: "10.0.2.1:40000".into(),
                    arrived_ms: 123_450,
                }),
                input: Some(M::Request(pb::TraceMasterRequest {
                    id: 9,
                    req: Some(mkdir),
                    caller: String::new(),
                })),
                ..Default::default()
            })),
        },
        &mut out,
    );
    let write = pb::ChunkRequest {
        req: Some(pb::chunk_request::Req::Write(pb::WriteChunkRequest {
            handle: 4,
            version: 2,
            offset: 65536,
            data: vec![7u8; 1000].into(),
            ..Default::default()
        })),
    };
    let effects = tessera_core::chunkserver::Effects::default();
    let rec = record::chunkserver_step(
        tessera_core::Time(99),
        None,
        &tessera_core::chunkserver::Input::Request {
            id: 3,
            req: write,
            arrived: tessera_core::Time(98),
            from: tessera_core::auth::Caller::Insecure,
        },
        &effects,
    );
    trace::frame(&rec, &mut out);
    insta::assert_snapshot!(hex(&out));
}

#[test]
fn the_summary_of_a_recorded_simulator_run() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/steady-1");
    let nodes = tessera_tracefile::read_paths(&[dir]).expect("the fixture reads");
    assert_eq!(nodes.len(), 6);
    let s = summary(&nodes);
    insta::assert_snapshot!(s.table());
}

/// The client workload of a recorded simulator run (the `steady` scenario, seed 1: two
/// clients, each in its own directory, creating, writing, reading, renaming and
/// deleting), as `tessera-scenarios replay` would run it again.
#[test]
fn the_workload_of_a_recorded_simulator_run() {
    use tessera_tracefile::workload::{ClientOp, script};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/steady-1");
    let nodes = tessera_tracefile::read_paths(&[dir]).expect("the fixture reads");
    let s = script(&nodes);
    assert!(s.steps.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    // Every file written, appended to or read was made by a create the script holds,
    // under its name then or a later one (renames followed).
    let mut names: std::collections::HashSet<String> = Default::default();
    for st in &s.steps {
        match &st.op {
            ClientOp::Create { path } => {
                names.insert(path.clone());
            }
            ClientOp::Rename { to, .. } => {
                names.insert(to.clone());
            }
            ClientOp::Write { path, .. } | ClientOp::Read { path, .. } => {
                assert!(
                    names.contains(path),
                    "{path} used before it was made: {st:?}"
                )
            }
            _ => {}
        }
    }
    // Each client works in its own directory: two groups.
    assert_eq!(s.groups, 2, "{}", s.describe());
    insta::assert_snapshot!(s.describe());
}
