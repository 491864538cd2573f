//! `oplog_roundtrip`: an arbitrary sequence of metadata operations, applied as the live
//! master applies them (a refused one is not logged and must change nothing),
//! checkpointed at arbitrary points as the driver does (in pieces, into sealed parts,
//! loaded again),
//! then recovered as a restarted master recovers (the latest checkpoint and the records
//! after it): the recovered state must be the state that applying every record gave.
//! Recovery from the whole log, without a checkpoint, must give it too.

use arbitrary::{Arbitrary, Unstructured};

use crate::driver::checkpoint::{self, Sealed};
use crate::driver::master::{seal, unseal};
use crate::master::{Master, MasterConfig, Meta, Node};
use crate::pb::{self, log_record::Op};
use crate::types::{LogSeq, Time};

/// Names the operations use: few, nested, so that they meet (a rename over a file, a
/// remove of a full directory, a create under a file).
const PATHS: &[&str] = &["/a", "/b", "/a/x", "/a/y", "/b/x", "/a/x/z", "/c", "/a b"];
const SERVERS: &[&str] = &["cs0:1", "cs1:1", "cs2:1"];

#[derive(Arbitrary, Debug)]
enum Step {
    Mkdir(u8),
    Create {
        path: u8,
        replication: u8,
        chunk_size: u8,
    },
    Rename(u8, u8),
    Remove(u8),
    AddChunk(u8),
    SetVersion {
        chunk: u8,
        up: u8,
        /// Servers (bits) whose copies the grant demotes, and those that took it.
        demoted: u8,
        holders: u8,
    },
    Fallback {
        chunk: u8,
        server: u8,
        kind: u8,
    },
    Reserve {
        chunk: u8,
        up: u8,
    },
    SetLength {
        path: u8,
        length: u32,
        append: Option<u32>,
    },
    Retire {
        chunk: u8,
        server: u8,
        lift: bool,
    },
    ClusterId(u64),
    /// A record no request makes: a token on it, or no op at all.
    Odd {
        token: u8,
    },
    Checkpoint,
}

#[derive(Arbitrary, Debug)]
struct Input {
    steps: Vec<(Step, Option<u8>)>,
}

/// The whole persistent state as text, read from the structures themselves rather than
/// through `Meta::checkpoint` (which recovery starts from): a checkpoint that left
/// something out would otherwise leave it out of both sides of the comparison. The
/// simulator compares each checkpoint a master writes by it too (`check::step`).
pub fn dump(meta: &Meta) -> String {
    let mut reserved: Vec<_> = meta.reserved.iter().collect();
    reserved.sort_unstable();
    // A directory's id is the namespace's own business: recovery numbers them afresh.
    // So are the ids of owner and group names: they are shown by name.
    let names = &meta.ns.names;
    let perms = |p: crate::master::perms::Perms| {
        let p = names.to_pb(p);
        format!("{}:{} {:o}", p.owner, p.group, p.mode)
    };
    let tree: Vec<String> = meta
        .ns
        .walk()
        .map(|(path, node)| match node {
            Node::Dir { mtime_ms, .. } => {
                format!("{path:?} dir {mtime_ms} {}", perms(node.perms()))
            }
            Node::File(f) => {
                let unnamed = crate::master::FileMeta {
                    perms: Default::default(),
                    ..f.clone()
                };
                format!("{path:?} {unnamed:?} {}", perms(f.perms))
            }
        })
        .collect();
    format!(
        "cluster {} secret {:?}\nnext handle {}\nroot {}\nnamespace {:?}\nchunks {:?}\nretired {:?}\n\
         reserved {:?}\ncompleted {:?}\nfallbacks {:?}\nfiles {}\nlease holders {:?}\n\
         leases settled in {}\nepoch {}",
        meta.cluster_id,
        meta.capability_secret,
        meta.next_handle,
        perms(meta.ns.root),
        tree,
        // Where replicas are is learned from heartbeats, not logged.
        meta.chunks
            .iter()
            .map(|(h, c)| (h, c.version, c.refcount, c.goal))
            .collect::<Vec<_>>(),
        meta.retired,
        reserved,
        meta.retries.iter().collect::<Vec<_>>(),
        meta.fallbacks,
        meta.ns.file_count(),
        meta.lease_holders,
        meta.leases_settled_in,
        meta.master_epoch,
    )
}

fn path(i: u8) -> String {
    PATHS[i as usize % PATHS.len()].to_string()
}

/// A chunk of the state, picked by `i`, or handle 0 (none) when there is none.
fn chunk(meta: &Meta, i: u8) -> (u64, u64) {
    let all: Vec<(u64, u64)> = meta.chunks.iter().map(|(h, c)| (h, c.version)).collect();
    if all.is_empty() {
        return (0, 0);
    }
    all[i as usize % all.len()]
}

fn op(meta: &Meta, step: &Step) -> Option<Op> {
    Some(match *step {
        Step::Mkdir(p) => Op::Mkdir(pb::MkdirOp {
            path: path(p),
            perms: None,
        }),
        Step::Create {
            path: p,
            replication,
            chunk_size,
        } => Op::Create(pb::CreateOp {
            path: path(p),
            replication: u32::from(replication % 6),
            // 0 is a record from before files kept their size.
            chunk_size: u64::from(chunk_size % 4) << 16,
            perms: None,
        }),
        Step::Rename(a, b) => Op::Rename(pb::RenameOp {
            src: path(a),
            dst: path(b),
        }),
        Step::Remove(p) => Op::Remove(pb::RemoveOp { path: path(p) }),
        Step::AddChunk(p) => Op::AddChunk(pb::AddChunkOp {
            path: path(p),
            handle: meta.next_handle,
        }),
        Step::SetVersion {
            chunk: c,
            up,
            demoted,
            holders,
        } => {
            let (handle, version) = chunk(meta, c);
            let servers = |bits: u8| {
                SERVERS
                    .iter()
                    .enumerate()
                    .filter(move |(i, _)| bits & (1 << i) != 0)
                    .map(|(_, a)| a.to_string())
            };
            Op::SetVersion(pb::SetVersionOp {
                handle,
                version: version + u64::from(up % 4),
                demoted: servers(demoted)
                    .map(|address| pb::DemotedCopy { address, version })
                    .collect(),
                holders: servers(holders).collect(),
                // A version adopted from a report (the high bit), every copy at the old
                // one demoted but those named by the high bits of `demoted`.
                demoted_any: if up & 0x80 != 0 { version } else { 0 },
                not_demoted: servers(demoted >> 4).collect(),
            })
        }
        Step::Fallback {
            chunk: c,
            server,
            kind,
        } => {
            let (handle, version) = chunk(meta, c);
            Op::Fallback(pb::FallbackOp {
                handle,
                address: SERVERS[server as usize % SERVERS.len()].into(),
                kind: i32::from(kind % 7),
                version: version.saturating_sub(1),
            })
        }
        Step::Reserve { chunk: c, up } => {
            let (handle, version) = chunk(meta, c);
            Op::ReserveVersion(pb::ReserveVersionOp {
                handle,
                version: version + u64::from(up % 4),
            })
        }
        Step::SetLength {
            path: p,
            length,
            append,
        } => Op::SetLength(pb::SetLengthOp {
            path: path(p),
            length: length.into(),
            append_offset: append.map_or(0, u64::from),
        }),
        Step::Retire {
            chunk: c,
            server,
            lift,
        } => {
            let (handle, version) = chunk(meta, c);
            Op::RetireReplica(pb::RetireReplicaOp {
                handle,
                address: SERVERS[server as usize % SERVERS.len()].into(),
                version,
                lift,
            })
        }
        Step::ClusterId(id) => Op::ClusterId(pb::ClusterIdOp {
            cluster_id: id,
            root: None,
        }),
        Step::Odd { .. } | Step::Checkpoint => return None,
    })
}

/// Returns the number of records applied (the cluster id's first record included).
pub fn run(data: &[u8]) -> usize {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return 0;
    };
    let cfg = MasterConfig::default();
    let mut meta = Meta::new(cfg.chunk_size);
    // The log as the store holds it: sealed values, and the latest checkpoint.
    let mut log: Vec<(LogSeq, bytes::Bytes)> = Vec::new();
    let mut stored_checkpoint: Option<(LogSeq, Sealed)> = None;
    let mut seq: LogSeq = 0;
    let mut append = |meta: &mut Meta, rec: pb::LogRecord, log: &mut Vec<_>| -> bool {
        let before = dump(meta);
        match meta.apply(&rec) {
            Ok(_) => {
                seq += 1;
                log.push((seq, seal(&rec)));
                true
            }
            Err(e) => {
                assert_eq!(dump(meta), before, "refused ({e}) yet changed");
                false
            }
        }
    };
    // A fresh log starts with the cluster's id and secret, as a fresh master writes it.
    let first = pb::LogRecord {
        time_ms: 0,
        token: 0,
        op: Some(Op::ClusterId(pb::ClusterIdOp {
            cluster_id: 7,
            root: None,
        })),
    };
    assert!(append(&mut meta, first, &mut log));
    // And its capability secret.
    let secret = pb::LogRecord {
        time_ms: 0,
        token: 0,
        op: Some(Op::CapabilitySecret(pb::CapabilitySecretOp {
            secret: vec![1; crate::capability::SECRET_BYTES].into(),
        })),
    };
    assert!(append(&mut meta, secret, &mut log));
    for (i, (step, token)) in input.steps.iter().enumerate() {
        let token = token.map_or(0, |t| u64::from(t) + 1);
        let time_ms = i as u64 + 1;
        match step {
            Step::Checkpoint => {
                let through = log.last().map_or(0, |(s, _)| *s);
                // In small parts, from the state's pieces, as the driver stores it; read
                // back at once, it must be the state's checkpoint.
                let sealed = Sealed::build(through, meta.checkpoint_pieces(through), 64);
                let back = checkpoint::load(sealed.values())
                    .expect("a checkpoint as stored")
                    .expect("one is stored");
                assert_eq!(back.checkpoint, meta.checkpoint(through), "read back");
                stored_checkpoint = Some((through, sealed));
            }
            Step::Odd { token: t } => {
                let rec = pb::LogRecord {
                    time_ms,
                    token: u64::from(*t),
                    op: (*t % 2 == 0).then(|| {
                        Op::RetireReplica(pb::RetireReplicaOp {
                            handle: 1,
                            address: SERVERS[0].into(),
                            version: 1,
                            lift: false,
                        })
                    }),
                };
                append(&mut meta, rec, &mut log);
            }
            step => {
                let rec = pb::LogRecord {
                    time_ms,
                    token,
                    op: op(&meta, step),
                };
                append(&mut meta, rec, &mut log);
            }
        }
    }
    let want = dump(&meta);
    let (through, checkpoint) = match &stored_checkpoint {
        Some((through, sealed)) => (
            *through,
            Some(sealed.read().expect("a checkpoint as stored")),
        ),
        None => (0, None),
    };
    let records = |after: LogSeq| -> Vec<(LogSeq, pb::LogRecord)> {
        log.iter()
            .filter(|(s, _)| *s > after)
            .map(|(s, v)| (*s, unseal(v).expect("a record as sealed")))
            .collect()
    };
    // The store holds the checkpoint and the records after it (the driver deletes the
    // ones it covers in the same batch); the whole log must recover the same.
    for (what, cp, tail) in [
        ("checkpoint + tail", checkpoint.as_ref(), records(through)),
        ("the whole log", None, records(0)),
    ] {
        let recovered = Master::recover(cfg.clone(), Time::ZERO, cp, tail)
            .unwrap_or_else(|e| panic!("{what}: a log the master wrote recovers: {e}"));
        let got = dump(recovered.meta());
        assert!(got == want, "recovered from {what}:\n{got}\nwant:\n{want}");
        assert_eq!(recovered.last_seq(), seq, "{what}");
        recovered
            .check_invariants()
            .unwrap_or_else(|e| panic!("invariants after recovery from {what}: {e}"));
    }
    seq as usize
}

/// Inputs to start a corpus from: operation sequences that build a small tree, with
/// chunks, versions, renames, removes and checkpoints between them.
pub fn seeds() -> Vec<Vec<u8>> {
    // `arbitrary` reads each step of the sequence after a byte whose low bit says one
    // follows, an enum's variant as a u32 `x` (variant `x * count >> 32`), then each
    // field; the steps below are written that way, one per entry.
    const VARIANTS: u64 = 13;
    let step = |variant: u64, fields: &[u8]| {
        let x = (variant << 32).div_ceil(VARIANTS) as u32;
        let mut v = vec![1];
        v.extend_from_slice(&x.to_le_bytes());
        v.extend_from_slice(fields);
        v.push(0); // no token
        v
    };
    let tree = [
        step(0, &[0]),                    // mkdir /a
        step(1, &[2, 3, 1]),              // create /a/x
        step(4, &[2]),                    // add a chunk to /a/x
        step(5, &[0, 1, 0, 0]),           // its version up by one
        step(7, &[0, 2]),                 // reserve a version above it
        step(12, &[]),                    // checkpoint
        step(5, &[0, 0x81, 0b1_0110, 1]), // adopted: cs1, cs2 demoted, cs0 took it
        step(6, &[0, 2, 1]),              // a clone to cs2: a holder
        step(6, &[0, 0, 5]),              // cs0 reports a copy at the old version
        step(12, &[]),                    // checkpoint
        step(8, &[2, 100, 0, 0, 0, 0]),   // length 100
        step(2, &[0, 1]),                 // rename /a to /b
        step(9, &[0, 1, 0]),              // retire a copy
        step(6, &[0, 1, 3]),              // cs1's demoted copy gone
        step(3, &[6]),                    // remove /c (none: refused)
        step(12, &[]),
    ];
    let mut out = vec![tree.concat()];
    for n in 1..tree.len() {
        out.push(tree[..n].concat());
    }
    out
}
