//! `decode`: every decoder Tessera runs on bytes from a network or a disk, fed arbitrary
//! bytes, and what the decoded value is handed to next: a master or chunkserver request
//! to the state machine that serves it, a heartbeat reply to the chunkserver that asked,
//! a log record to `Meta::apply`, a checkpoint to `Meta::restore`, chunk metadata to a
//! chunkserver's recovery, a stored value to `unseal`, file bytes to the record scanner,
//! a request (replica messages above all) to a master replica of a group, and the
//! values of a replica's store, or of a master alone's (its checkpoint in parts and its
//! log), to its start-up.
//! Each must answer with an error, never panic, and the state machines must still pass
//! their own invariants afterwards.
//!
//! The first byte picks the decoder; the rest is its input.

use crate::auth::Caller;
use bytes::Bytes;
use prost::Message;

use crate::chunkserver::{self, Chunkserver, ChunkserverConfig};
use crate::master::{self, Master, MasterConfig, Meta};
use crate::pb::{self, log_record::Op};
use crate::runtime::{Parts, PartsReader};
use crate::types::Time;

/// The cluster id of the master and chunkserver the decoded messages are fed to.
pub const CLUSTER_ID: u64 = 7;

/// The decoders, in the order the first byte picks them (modulo their count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    MasterRequest,
    ChunkRequest,
    HeartbeatReply,
    ChunkResponse,
    LogRecord,
    Checkpoint,
    SealedValue,
    ChunkMetas,
    Records,
    Trace,
    GroupRequest,
    GroupStore,
    MasterStore,
}

pub const KINDS: [Kind; 13] = [
    Kind::MasterRequest,
    Kind::ChunkRequest,
    Kind::HeartbeatReply,
    Kind::ChunkResponse,
    Kind::LogRecord,
    Kind::Checkpoint,
    Kind::SealedValue,
    Kind::ChunkMetas,
    Kind::Records,
    Kind::Trace,
    Kind::GroupRequest,
    Kind::GroupStore,
    Kind::MasterStore,
];

/// The input that feeds `body` to the decoder of `kind` (for seeding a corpus).
pub fn input(kind: Kind, body: &[u8]) -> Vec<u8> {
    let k = KINDS.iter().position(|&x| x == kind).expect("a kind") as u8;
    let mut v = vec![k];
    v.extend_from_slice(body);
    v
}

/// Returns 1 when the input decoded and was handed on, else 0.
pub fn run(data: &[u8]) -> usize {
    let Some((&k, body)) = data.split_first() else {
        return 0;
    };
    let handed_on = match KINDS[k as usize % KINDS.len()] {
        Kind::MasterRequest => master_request(body),
        Kind::ChunkRequest => chunk_request(body),
        Kind::HeartbeatReply => heartbeat_reply(body),
        Kind::ChunkResponse => pb::ChunkResponse::decode(body).is_ok(),
        Kind::LogRecord => log_record(body),
        Kind::Checkpoint => checkpoint(body),
        Kind::SealedValue => sealed_value(body),
        Kind::ChunkMetas => chunk_metas(body),
        Kind::Records => records(body),
        Kind::Trace => trace_file(body),
        Kind::GroupRequest => group_request(body),
        Kind::GroupStore => group_store(body),
        Kind::MasterStore => master_store(body),
    };
    usize::from(handed_on)
}

/// A trace file: read, and every record turned back into what replay would feed a
/// master (its settings, its inputs). An error, never a panic.
fn trace_file(body: &[u8]) -> bool {
    use crate::pb::trace_record::Kind as T;
    let Ok(f) = crate::trace::parse("fuzz", body) else {
        return false;
    };
    for r in &f.records {
        match &r.kind {
            Some(T::MasterStart(s)) => {
                if let Some(c) = &s.config {
                    let _ = crate::trace::record::master_config(c);
                }
            }
            Some(T::Master(step)) => {
                let _ = crate::trace::record::master_input(step);
            }
            _ => {}
        }
        let _ = crate::trace::describe(r);
    }
    !f.records.is_empty()
}

fn sealed_value(body: &[u8]) -> bool {
    use crate::driver::master::{seal, unseal};
    // Whatever `unseal` accepts must be what was sealed: sealing it again and opening
    // that gives the same message.
    let record = unseal::<pb::LogRecord>(body).inspect(|r| {
        assert_eq!(unseal::<pb::LogRecord>(&seal(r)).as_ref(), Ok(r));
    });
    let checkpoint = unseal::<pb::Checkpoint>(body).inspect(|c| {
        assert_eq!(unseal::<pb::Checkpoint>(&seal(c)).as_ref(), Ok(c));
    });
    record.is_ok() || checkpoint.is_ok()
}

/// A master holding `/d/f` (one chunk of 100 bytes at version 1) in a cluster of its own.
pub fn small_master() -> Master {
    let recs = [
        Op::ClusterId(pb::ClusterIdOp {
            cluster_id: CLUSTER_ID,
            root: None,
        }),
        Op::Mkdir(pb::MkdirOp {
            path: "/d".into(),
            perms: None,
        }),
        Op::Create(pb::CreateOp {
            path: "/d/f".into(),
            replication: 3,
            chunk_size: 1 << 20,
            perms: None,
        }),
        Op::AddChunk(pb::AddChunkOp {
            path: "/d/f".into(),
            handle: 1,
        }),
        Op::SetVersion(pb::SetVersionOp {
            handle: 1,
            version: 1,
            ..Default::default()
        }),
        Op::SetLength(pb::SetLengthOp {
            path: "/d/f".into(),
            length: 100,
            append_offset: 0,
        }),
    ];
    let tail = recs.into_iter().zip(1..).map(|(op, seq)| {
        (
            seq,
            pb::LogRecord {
                time_ms: seq,
                token: 0,
                op: Some(op),
            },
        )
    });
    Master::recover(MasterConfig::default(), Time::ZERO, None, tail).expect("a sound log")
}

/// A chunkserver of [`CLUSTER_ID`] holding chunk 1 (100 zero bytes at version 1).
pub fn small_chunkserver() -> Chunkserver {
    let metas = vec![
        pb::ChunkMeta {
            handle: chunkserver::IDENTITY_HANDLE,
            server_id: 11,
            cluster_id: CLUSTER_ID,
            ..Default::default()
        },
        pb::ChunkMeta {
            handle: 1,
            version: 1,
            length: 100,
            checksums: vec![crc32c::crc32c(&[0; 100])],
            ..Default::default()
        },
    ];
    let cfg = ChunkserverConfig {
        address: "cs0".into(),
        ..Default::default()
    };
    Chunkserver::recover(cfg, Time::ZERO, metas)
}

/// The members of the group the replica of [`group_request`] belongs to.
fn group_members() -> std::collections::BTreeMap<u64, String> {
    (1..=3).map(|i| (i, format!("m{i}:1"))).collect()
}

/// Replica 2 of a group of three, as just formed, on `store`.
fn replica_on(store: crate::group::store::LogStore) -> Result<crate::group::Replica, String> {
    let mut cfg = crate::group::GroupConfig::new(2, group_members());
    cfg.seed = 3;
    let mcfg = MasterConfig {
        chunk_size: 1 << 20,
        ..MasterConfig::default()
    };
    crate::group::Replica::start(cfg, mcfg, Time::from_millis(1_000), store)
}

/// A request to a follower of a freshly formed group of three: replica messages
/// (a `RaftBatch` or one `RaftMessage`, as any peer could forge them), membership
/// changes, status, a chunkserver's heartbeat. Refused or taken, never a panic; then
/// its timers run, so what it took is acted on.
fn group_request(body: &[u8]) -> bool {
    use crate::group::{Input as G, store::LogStore};
    let Ok(req) = pb::MasterRequest::decode(body) else {
        return false;
    };
    let store = LogStore::fresh(group_members());
    let values = store
        .format()
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)));
    let store = LogStore::load(values).expect("a fresh store loads");
    let mut r = replica_on(store).expect("a fresh replica starts");
    let now = Time::from_millis(2_000);
    // The same messages, as another replica's answer may carry them (`group::answers`).
    let answer = match &req.req {
        Some(pb::master_request::Req::RaftBatch(b)) => Some(b.clone()),
        _ => None,
    };
    let _ = r.handle(
        now,
        G::Request {
            id: 1,
            req,
            arrived: now,
            from: Caller::Insecure,
        },
    );
    if let Some(batch) = answer {
        let _ = r.handle(
            now,
            G::Answer {
                batch,
                arrived: now,
            },
        );
    }
    for i in 1..=3 {
        let _ = r.handle(now + std::time::Duration::from_millis(100 * i), G::RaftTick);
    }
    let _ = r.handle(now, G::Tick);
    true
}

/// The values a replica's store holds (framed: a key length byte, the key, a 4-byte
/// little-endian value length, the value; repeated), loaded and started on: an error
/// naming what is damaged, never a panic.
fn group_store(body: &[u8]) -> bool {
    let Ok(store) = crate::group::store::LogStore::load(unframe(body)) else {
        return false;
    };
    let _ = replica_on(store);
    true
}

/// The values a master alone's store holds (framed as [`group_store`] reads them),
/// loaded and recovered from: an error naming what is damaged, never a panic.
fn master_store(body: &[u8]) -> bool {
    use crate::runtime::MetaStore;
    let store = crate::testkit::MemMetaStore::default();
    futures::executor::block_on(async {
        let mut s = store.clone();
        s.write(
            unframe(body)
                .into_iter()
                .map(|(k, v)| (k, Some(v)))
                .collect(),
        )
        .await
        .expect("an in-memory store");
        let Ok(durable) = crate::driver::master::load(&mut s).await else {
            return false;
        };
        let cfg = MasterConfig::default();
        let Ok((mut m, _)) = crate::driver::master::rebuild(cfg, Time(1), &durable) else {
            return false;
        };
        // What it recovered it serves from.
        let _ = m.handle(Time(2), master::Input::Tick);
        true
    })
}

/// Framed store values, as [`frame_store`] writes them; a value cut short is taken as
/// far as it goes.
fn unframe(body: &[u8]) -> Vec<(Vec<u8>, Bytes)> {
    let mut values = Vec::new();
    let mut rest = body;
    while let Some((&klen, r)) = rest.split_first() {
        let Some((key, r)) = r.split_at_checked(usize::from(klen)) else {
            break;
        };
        let Some((len, r)) = r.split_first_chunk::<4>() else {
            break;
        };
        let n = (u32::from_le_bytes(*len) as usize).min(r.len());
        let (v, r) = r.split_at(n);
        values.push((key.to_vec(), Bytes::copy_from_slice(v)));
        rest = r;
    }
    values
}

/// A store's values framed as [`group_store`] and [`master_store`] read them.
pub fn frame_store(values: &[(Vec<u8>, Bytes)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in values {
        out.push(k.len() as u8);
        out.extend_from_slice(k);
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
    }
    out
}

fn master_request(body: &[u8]) -> bool {
    let Ok(req) = pb::MasterRequest::decode(body) else {
        return false;
    };
    let mut m = small_master();
    let now = Time::from_millis(1_000);
    let mut effects = m.handle(
        now,
        master::Input::Request {
            id: 1,
            req,
            from: Caller::Insecure,
        },
    );
    // Whatever it logged becomes durable, so held replies and queued requests go on.
    while let Some(&(through, _)) = effects.log.last() {
        effects = m.handle(now, master::Input::LogSynced { through });
    }
    m.handle(now, master::Input::Tick);
    m.check_invariants()
        .expect("master invariants after a decoded request");
    true
}

fn chunk_request(body: &[u8]) -> bool {
    // The transport hands a request over in the pieces it arrived in: split it where the
    // first two bytes say, and demand the same message as from one piece.
    let Some((split, body)) = body.split_first_chunk::<2>() else {
        return false;
    };
    let whole = pb::ChunkRequest::decode(body);
    let at = usize::from(u16::from_le_bytes(*split)).min(body.len());
    let bytes = Bytes::copy_from_slice(body);
    let parts = Parts(vec![bytes.slice(..at), bytes.slice(at..)]);
    let pieces = pb::ChunkRequest::decode(PartsReader::from(parts));
    assert_eq!(whole.is_ok(), pieces.is_ok(), "split at {at}");
    let Ok(req) = pieces else {
        return false;
    };
    assert_eq!(Ok(&req), whole.as_ref().map_err(|_| ()));
    let mut cs = small_chunkserver();
    let now = Time::from_millis(1_000);
    cs.handle(
        now,
        chunkserver::Input::Request {
            id: 1,
            req,
            arrived: now,
            from: Caller::Insecure,
        },
    );
    cs.handle(now, chunkserver::Input::Tick);
    cs.check_invariants()
        .expect("chunkserver invariants after a decoded request");
    true
}

fn heartbeat_reply(body: &[u8]) -> bool {
    let Ok(resp) = pb::MasterResponse::decode(body) else {
        return false;
    };
    let mut cs = small_chunkserver();
    let now = Time::from_millis(1_000);
    let effects = cs.handle(now, chunkserver::Input::Tick);
    for call in effects.calls {
        if matches!(call.req, chunkserver::Outgoing::Master(_)) {
            cs.handle(
                now,
                chunkserver::Input::CallResult {
                    id: call.id,
                    result: Ok(chunkserver::Reply::Master(resp.clone())),
                },
            );
        }
    }
    cs.handle(now, chunkserver::Input::Tick);
    cs.check_invariants()
        .expect("chunkserver invariants after a heartbeat reply");
    true
}

fn log_record(body: &[u8]) -> bool {
    let Ok(rec) = pb::LogRecord::decode(body) else {
        return false;
    };
    let m = small_master();
    let mut meta = Meta::restore(&m.meta().checkpoint(m.last_seq()), m.config().chunk_size)
        .expect("a checkpoint of a sound state");
    let before = super::oplog::dump(&meta);
    if meta.apply(&rec).is_err() {
        // A refused record changes nothing: on the live path it is never logged.
        assert_eq!(
            super::oplog::dump(&meta),
            before,
            "a refused record changed the state"
        );
    } else {
        // An accepted one leaves a state a checkpoint carries whole.
        let again = Meta::restore(&meta.checkpoint(m.last_seq() + 1), m.config().chunk_size)
            .expect("a checkpoint of a state the log made");
        assert_eq!(super::oplog::dump(&again), super::oplog::dump(&meta));
    }
    true
}

fn checkpoint(body: &[u8]) -> bool {
    let Ok(cp) = pb::Checkpoint::decode(body) else {
        return false;
    };
    let default = MasterConfig::default().chunk_size;
    let Ok(meta) = Meta::restore(&cp, default) else {
        return false;
    };
    // What restore accepted, checkpointed again, restores to the same state.
    let again = meta.checkpoint(cp.through_seq);
    let meta2 = Meta::restore(&again, default).expect("a checkpoint the master wrote");
    assert_eq!(super::oplog::dump(&meta2), super::oplog::dump(&meta));
    true
}

fn chunk_metas(mut body: &[u8]) -> bool {
    // As the stores load them: a record that does not decode is passed over, the rest
    // are recovered from.
    let mut metas = Vec::new();
    while let Ok(len) = prost::encoding::decode_varint(&mut body) {
        let len = usize::try_from(len).unwrap_or(usize::MAX).min(body.len());
        let (one, rest) = body.split_at(len);
        if let Ok(m) = pb::ChunkMeta::decode(one) {
            metas.push(m);
        }
        body = rest;
    }
    let mut cs = Chunkserver::recover(ChunkserverConfig::default(), Time::ZERO, metas);
    let now = Time::from_millis(1_000);
    cs.handle(now, chunkserver::Input::Tick);
    cs.check_invariants()
        .expect("chunkserver invariants after recovery");
    true
}

fn records(body: &[u8]) -> bool {
    let Some((size, body)) = body.split_first_chunk::<2>() else {
        return false;
    };
    let chunk_size = u64::from(u16::from_le_bytes(*size)).max(1);
    let data = Bytes::copy_from_slice(body);
    let found = crate::record::scan(&data, 0, chunk_size);
    for r in &found {
        // A frame found lies in the data and within one chunk.
        let len = crate::record::framed_len(r.payload.len()) as u64;
        assert!(r.offset + len <= data.len() as u64);
        assert_eq!(r.offset / chunk_size, (r.offset + len - 1) / chunk_size);
    }
    let any = !found.is_empty();
    let _ = crate::record::dedup(found);
    any
}

/// Inputs to start a corpus from: one sound encoding of each kind the decoders take.
pub fn seeds() -> Vec<Vec<u8>> {
    use pb::master_request::Req as M;
    let master = |req: M, token: u64| pb::MasterRequest {
        token,
        req: Some(req),
        stale_ok: token.is_multiple_of(2),
    };
    let chunk = |req: pb::chunk_request::Req| {
        let mut v = vec![0, 0];
        v.extend(pb::ChunkRequest { req: Some(req) }.encode_to_vec());
        v
    };
    let mut out = vec![];
    for req in [
        master(
            M::Mkdir(pb::MkdirRequest {
                path: "/d/e".into(),
                parents: true,
                mode: Some(0o750),
            }),
            0,
        ),
        master(
            M::Create(pb::CreateRequest {
                path: "/d/g".into(),
                replication: 2,
                mode: None,
            }),
            5,
        ),
        master(
            M::Rename(pb::RenameRequest {
                src: "/d/f".into(),
                dst: "/d/h".into(),
            }),
            6,
        ),
        master(
            M::Delete(pb::DeleteRequest {
                path: "/d".into(),
                recursive: true,
            }),
            7,
        ),
        master(
            M::GetWriteTarget(pb::GetWriteTargetRequest {
                path: "/d/f".into(),
                chunk_index: 0,
                append: false,
            }),
            0,
        ),
        master(
            M::ExtendFile(pb::ExtendFileRequest {
                path: "/d/f".into(),
                length: 200,
                first_index: 0,
                handles: vec![1],
            }),
            0,
        ),
        master(
            M::ReserveAppend(pb::ReserveAppendRequest {
                path: "/d/f".into(),
                length: 10,
            }),
            9,
        ),
        master(
            M::SetPermissions(pb::SetPermissionsRequest {
                path: "/d".into(),
                owner: "alice".into(),
                group: "staff".into(),
                mode: Some(0o1770),
            }),
            0,
        ),
        master(
            M::Heartbeat(pb::HeartbeatRequest {
                address: "cs1:1".into(),
                rack: "r".into(),
                capacity_bytes: 1 << 30,
                chunks: vec![pb::ChunkReport {
                    handle: 1,
                    version: 1,
                    length: 100,
                }],
                server_id: 3,
                cluster_id: CLUSTER_ID,
                ..Default::default()
            }),
            0,
        ),
    ] {
        out.push(input(Kind::MasterRequest, &req.encode_to_vec()));
    }
    use pb::chunk_request::Req as C;
    for body in [
        chunk(C::Read(pb::ReadChunkRequest {
            handle: 1,
            version: 1,
            offset: 10,
            length: 50,
            capability: Some(pb::Capability {
                key_id: 1,
                handle: 1,
                version: 1,
                ops: crate::capability::READ,
                subject: "client:fuzz".into(),
                expires_ms: 60_000,
                mac: vec![7; 32].into(),
                secondaries: vec!["10.0.0.2:7001".into()],
            }),
        })),
        chunk(C::Push(pb::PushDataRequest {
            data_id: 4,
            offset: 0,
            total: 5,
            piece: b"hello".to_vec().into(),
            chain: vec!["cs1:1".into()],
            handle: 1,
            capabilities: vec![pb::Capability::default(); 2],
        })),
        chunk(C::Write(pb::WriteChunkRequest {
            handle: 1,
            version: 1,
            offset: 20,
            secondaries: vec!["cs1:1".into()],
            client_id: 2,
            client_seq: 1,
            data_id: 4,
            ..Default::default()
        })),
        chunk(C::SetVersion(pb::SetVersionRequest {
            secondaries: vec!["cs1:1".into()],
            names_secondaries: true,
            epoch: 0,
            handle: 1,
            version: 2,
            create: false,
            lease_ms: 60_000,
            valid_ms: 60_000,
            chunk_size: 1 << 20,
            cluster_id: CLUSTER_ID,
        })),
        chunk(C::Apply(pb::ApplyMutationRequest {
            handle: 1,
            version: 1,
            serial: 1,
            offset: 0,
            data_id: 4,
            ..Default::default()
        })),
        chunk(C::Mend(pb::MendChunkRequest {
            handle: 1,
            version: 1,
            sources: vec![pb::MendSource {
                address: "cs1:1".into(),
                version: 1,
                capability: None,
            }],
            cluster_id: CLUSTER_ID,
            epoch: 0,
        })),
    ] {
        out.push(input(Kind::ChunkRequest, &body));
    }
    // A leader's heartbeat and append to a follower, batched as peers send them.
    let leader = |t: u32, index: u64, entries: Vec<pb::RaftEntry>| pb::RaftMessage {
        msg_type: t,
        to: 2,
        from: 1,
        term: 2,
        log_term: u64::from(index > 0),
        index,
        entries,
        ..Default::default()
    };
    let batch = pb::MasterRequest {
        req: Some(pb::master_request::Req::RaftBatch(pb::RaftBatch {
            messages: vec![
                leader(8, 0, vec![]),
                leader(
                    3,
                    0,
                    vec![pb::RaftEntry {
                        entry_type: 0,
                        term: 2,
                        index: 1,
                        ..Default::default()
                    }],
                ),
            ],
            snapshot_parts: Vec::new(),
            answers: true,
        })),
        ..Default::default()
    };
    out.push(input(Kind::GroupRequest, &batch.encode_to_vec()));
    // A part of a leader's snapshot, as a large one goes.
    let mut snap = leader(7, 0, vec![]);
    snap.snapshot = Some(pb::RaftSnapshot {
        data: Bytes::new(),
        metadata: Some(pb::RaftSnapshotMeta {
            index: 5,
            term: 2,
            conf_state: None,
        }),
        ..Default::default()
    });
    let part = pb::MasterRequest {
        req: Some(pb::master_request::Req::RaftBatch(pb::RaftBatch {
            messages: Vec::new(),
            snapshot_parts: vec![pb::RaftSnapshotPart {
                message: Some(snap),
                offset: 4,
                total: 8,
                data: Bytes::from_static(b"part"),
            }],
            answers: true,
        })),
        ..Default::default()
    };
    out.push(input(Kind::GroupRequest, &part.encode_to_vec()));
    let store = crate::group::store::LogStore::fresh(group_members());
    let values: Vec<(Vec<u8>, Bytes)> = store
        .format()
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();
    out.push(input(Kind::GroupStore, &frame_store(&values)));
    // A master alone's store: a checkpoint in parts and a record after it.
    let mut m = small_master();
    let cp = m.checkpoint_now();
    let mut values: Vec<(Vec<u8>, Bytes)> = crate::driver::checkpoint::Sealed::new(cp, 64)
        .values()
        .collect();
    let fx = m.handle(Time(5), master::Input::Tick);
    values.extend(fx.log.iter().map(|(seq, r)| {
        (
            crate::driver::master::log_key(*seq),
            crate::driver::master::seal(r),
        )
    }));
    out.push(input(Kind::MasterStore, &frame_store(&values)));
    let reply = pb::MasterResponse {
        shadow: None,
        error: None,
        resp: Some(pb::master_response::Resp::Heartbeat(
            pb::HeartbeatResponse {
                epoch: 0,
                delete_chunks: vec![pb::ChunkVersion {
                    handle: 1,
                    version: 1,
                }],
                extended_leases: vec![1],
                lease_duration_ms: 60_000,
                cluster_id: CLUSTER_ID,
                capability_key: Some(pb::CapabilityKey {
                    id: 1,
                    secret: vec![3; crate::capability::SECRET_BYTES].into(),
                }),
            },
        )),
    };
    out.push(input(Kind::HeartbeatReply, &reply.encode_to_vec()));
    let read = pb::ChunkResponse {
        error: None,
        resp: Some(pb::chunk_response::Resp::Read(pb::ReadChunkResponse {
            data: vec![1; 30].into(),
            chunk_length: 100,
        })),
        ..Default::default()
    };
    out.push(input(Kind::ChunkResponse, &read.encode_to_vec()));
    let rec = pb::LogRecord {
        time_ms: 9,
        token: 3,
        op: Some(Op::Rename(pb::RenameOp {
            src: "/d/f".into(),
            dst: "/d/g".into(),
        })),
    };
    out.push(input(Kind::LogRecord, &rec.encode_to_vec()));
    // A record of every other kind, against the small master's state.
    for op in [
        Op::Mkdir(pb::MkdirOp {
            path: "/e".into(),
            perms: Some(pb::Permissions {
                owner: "alice".into(),
                group: "staff".into(),
                mode: 0o1777,
            }),
        }),
        Op::Create(pb::CreateOp {
            path: "/d/g".into(),
            replication: 2,
            chunk_size: 1 << 16,
            perms: None,
        }),
        Op::SetPermissions(pb::SetPermissionsOp {
            path: "/d/f".into(),
            owner: "bob".into(),
            group: String::new(),
            mode: Some(0o600),
        }),
        Op::Remove(pb::RemoveOp {
            path: "/d/f".into(),
        }),
        Op::AddChunk(pb::AddChunkOp {
            path: "/d/f".into(),
            handle: 2,
        }),
        Op::SetVersion(pb::SetVersionOp {
            handle: 1,
            version: 2,
            demoted: vec![pb::DemotedCopy {
                address: "cs1:7000".into(),
                version: 1,
            }],
            holders: vec!["cs0:7000".into()],
            ..Default::default()
        }),
        Op::Fallback(pb::FallbackOp {
            handle: 1,
            address: "cs2:7000".into(),
            kind: pb::Fallback::Holder as i32,
            version: 0,
        }),
        Op::ReserveVersion(pb::ReserveVersionOp {
            handle: 1,
            version: 3,
        }),
        Op::SetLength(pb::SetLengthOp {
            path: "/d/f".into(),
            length: 150,
            append_offset: 100,
        }),
        Op::RetireReplica(pb::RetireReplicaOp {
            handle: 1,
            address: "cs1:1".into(),
            version: 1,
            lift: false,
        }),
        Op::ClusterId(pb::ClusterIdOp {
            cluster_id: 8,
            root: None,
        }),
    ] {
        let rec = pb::LogRecord {
            time_ms: 10,
            token: 0,
            op: Some(op),
        };
        out.push(input(Kind::LogRecord, &rec.encode_to_vec()));
    }
    out.push(input(Kind::SealedValue, &crate::driver::master::seal(&rec)));
    let cp = small_master().meta().checkpoint(6);
    out.push(input(Kind::Checkpoint, &cp.encode_to_vec()));
    out.push(input(Kind::SealedValue, &crate::driver::master::seal(&cp)));
    let mut metas = Vec::new();
    for m in [
        pb::ChunkMeta {
            handle: chunkserver::IDENTITY_HANDLE,
            server_id: 11,
            cluster_id: CLUSTER_ID,
            ..Default::default()
        },
        pb::ChunkMeta {
            handle: 2,
            version: 3,
            length: 100,
            checksums: vec![crc32c::crc32c(&[0; 100])],
            writing: Some(pb::WriteIntent {
                offset: 10,
                length: 20,
            }),
            ..Default::default()
        },
    ] {
        m.encode_length_delimited(&mut metas)
            .expect("a vector grows");
    }
    out.push(input(Kind::ChunkMetas, &metas));
    let mut file = 128u16.to_le_bytes().to_vec();
    file.extend_from_slice(&crate::record::frame(1, b"first"));
    file.extend_from_slice(&[0; 7]);
    file.extend_from_slice(&crate::record::frame(2, b"second record"));
    out.push(input(Kind::Records, &file));
    out.push(input(Kind::Trace, &trace_seed()));
    out
}

/// A trace file of a few records: a master's start and steps, a chunkserver's step
/// with data.
fn trace_seed() -> Vec<u8> {
    use crate::trace::{self, record};
    let mut file = trace::MAGIC.to_vec();
    trace::frame(
        &trace::header(trace::RAW_FORMAT, "m", "master", 1, 1),
        &mut file,
    );
    let cfg = MasterConfig::default();
    let cp = small_master().meta().checkpoint(6);
    let mut start = record::master_start(
        Time(5),
        crate::driver::MasterStart {
            config: &cfg,
            checkpoint: Some(&cp),
            tail: &[],
            epoch: 0,
        },
    );
    start.seq = 1;
    trace::frame(&start, &mut file);
    let effects = master::Effects::default();
    for (seq, input) in [
        (2, master::Input::Tick),
        (3, master::Input::LogSynced { through: 6 }),
        (
            4,
            master::Input::Malformed {
                id: 1,
                error: "bad".into(),
            },
        ),
    ] {
        let mut r = record::master_step(Time(seq * 10), None, &input, &effects);
        r.seq = seq;
        trace::frame(&r, &mut file);
    }
    file
}
