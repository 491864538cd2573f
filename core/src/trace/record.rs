//! Between a driver's steps and trace records. Recording keeps everything a master's
//! step carries (none of it is file data) and a chunkserver's with its file data
//! replaced by length and CRC32C; reading a master's records back gives the inputs
//! that replay feeds it.

use crate::auth::Caller;
use std::time::Duration;

use bytes::Bytes;

use crate::chunkserver::{self as cs, ChunkserverConfig};
use crate::driver::{ChunkserverStart, MasterStart};
use crate::error::{RpcError, StoreError};
use crate::master::{self as ms, MasterConfig};
use crate::pb::{
    self, chunk_request::Req as CReq, chunk_response::Resp as CResp,
    trace_chunkserver_call_result::Result as CsResult, trace_chunkserver_step::Input as CsIn,
    trace_master_call_result::Result as MsResult, trace_master_step::Input as MsIn,
    trace_record::Kind, trace_rpc_error::Kind as RpcKind, trace_store_done::Result as DoneResult,
    trace_store_error::Kind as StoreKind, trace_store_op::Kind as OpKind,
};
use crate::types::Time;

/// Length and CRC32C of `b`.
pub fn data_ref(b: &[u8]) -> pb::DataRef {
    pb::DataRef {
        len: b.len() as u64,
        crc: crc32c::crc32c(b),
    }
}

/// Lengths and CRCs of the buffers of file data a node's trace met lately, by the
/// buffers' identity (address and length): the same bytes met again in the node's next
/// steps (a pushed piece passed on down the chain, a read's data in its reply) are not
/// read again. Each buffer is held while remembered, so its memory cannot be reused for
/// other bytes meanwhile.
#[derive(Default)]
pub struct DataRefs {
    recent: std::collections::VecDeque<(Bytes, u32)>,
}

/// Buffers a [`DataRefs`] remembers.
const RECENT: usize = 8;

impl DataRefs {
    /// Length and CRC32C of `b`.
    pub fn of(&mut self, b: &Bytes) -> pb::DataRef {
        let len = b.len() as u64;
        if b.is_empty() {
            return data_ref(b);
        }
        let same = |k: &Bytes| k.as_ptr() == b.as_ptr() && k.len() == b.len();
        if let Some(&(_, crc)) = self.recent.iter().find(|(k, _)| same(k)) {
            return pb::DataRef { len, crc };
        }
        let r = data_ref(b);
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((b.clone(), r.crc));
        r
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn dur(n: u64) -> Duration {
    Duration::from_nanos(n)
}

// ---- start records ------------------------------------------------------------------

pub fn master_settings(c: &MasterConfig) -> pb::MasterSettings {
    pb::MasterSettings {
        chunk_size: c.chunk_size,
        default_replication: u32::from(c.default_replication),
        lease_duration_ns: ns(c.lease_duration),
        max_clock_skew_ns: ns(c.max_clock_skew),
        heartbeat_timeout_ns: ns(c.heartbeat_timeout),
        gc_delay_ns: ns(c.gc_delay),
        gc_scan_batch: c.gc_scan_batch as u64,
        creation_window_ns: ns(c.creation_window),
        creation_limit: c.creation_limit,
        clones_per_server: c.clones_per_server,
        clones_cluster: c.clones_cluster,
        clone_timeout_ns: ns(c.clone_timeout),
        checkpoint_every: c.checkpoint_every,
        rng_seed: c.rng_seed,
        max_queued: c.max_queued as u64,
        call_timeout_ns: ns(c.call_timeout),
        late_delivery_ns: ns(c.late_delivery),
        max_new_chunks: c.max_new_chunks,
        max_servers: c.max_servers as u64,
        capability_secret: bytes::Bytes::copy_from_slice(&c.capability_secret),
        root: Some(c.root.clone()),
    }
}

/// The settings a master start record holds, checked as far as the master needs.
pub fn master_config(s: &pb::MasterSettings) -> Result<MasterConfig, String> {
    let small = |v: u64, what: &str| {
        usize::try_from(v).map_err(|_| format!("{what} {v} does not fit this machine"))
    };
    Ok(MasterConfig {
        chunk_size: s.chunk_size,
        default_replication: u8::try_from(s.default_replication)
            .map_err(|_| format!("replication {}", s.default_replication))?,
        lease_duration: dur(s.lease_duration_ns),
        max_clock_skew: dur(s.max_clock_skew_ns),
        heartbeat_timeout: dur(s.heartbeat_timeout_ns),
        gc_delay: dur(s.gc_delay_ns),
        gc_scan_batch: small(s.gc_scan_batch, "gc scan batch")?,
        creation_window: dur(s.creation_window_ns),
        creation_limit: s.creation_limit,
        clones_per_server: s.clones_per_server,
        clones_cluster: s.clones_cluster,
        clone_timeout: dur(s.clone_timeout_ns),
        checkpoint_every: s.checkpoint_every,
        rng_seed: s.rng_seed,
        max_queued: small(s.max_queued, "max queued")?,
        call_timeout: dur(s.call_timeout_ns),
        // Older traces were made under a model of no late delivery.
        late_delivery: dur(s.late_delivery_ns),
        // Older traces had no bound.
        // Older traces were made before capabilities: any secret replays them.
        capability_secret: match s.capability_secret.len() {
            0 => MasterConfig::default().capability_secret,
            _ => s.capability_secret.as_ref().try_into().map_err(|_| {
                format!("a capability secret of {} bytes", s.capability_secret.len())
            })?,
        },
        root: match &s.root {
            Some(r) => r.clone(),
            None => MasterConfig::default().root,
        },
        max_new_chunks: match s.max_new_chunks {
            0 => u64::MAX,
            n => n,
        },
        max_servers: match s.max_servers {
            0 => usize::MAX,
            n => small(n, "max servers")?,
        },
    })
}

pub fn chunkserver_settings(c: &ChunkserverConfig) -> pb::ChunkserverSettings {
    pb::ChunkserverSettings {
        address: c.address.clone(),
        rack: c.rack.clone(),
        capacity_bytes: c.capacity_bytes,
        clone_piece: c.clone_piece,
        scrub_interval_ns: ns(c.scrub_interval),
        scrub_idle_ns: ns(c.scrub_idle),
        push_buffer_bytes: c.push_buffer_bytes,
        push_buffer_ttl_ns: ns(c.push_buffer_ttl),
        apply_hold_ns: ns(c.apply_hold),
        read_cache_bytes: c.read_cache_bytes,
        max_queued_per_chunk: c.max_queued_per_chunk as u64,
        max_queued: c.max_queued as u64,
        boot: c.boot,
    }
}

pub fn master_start(now: Time, start: MasterStart<'_>) -> pb::TraceRecord {
    pb::TraceRecord {
        seq: 0,
        now_ms: now.0,
        kind: Some(Kind::MasterStart(pb::TraceMasterStart {
            config: Some(master_settings(start.config)),
            checkpoint: start.checkpoint.cloned(),
            tail: start
                .tail
                .iter()
                .map(|(seq, r)| pb::TraceLogEntry {
                    seq: *seq,
                    record: Some(r.clone()),
                })
                .collect(),
            epoch: start.epoch,
        })),
    }
}

pub fn chunkserver_start(now: Time, start: ChunkserverStart<'_>) -> pb::TraceRecord {
    pb::TraceRecord {
        seq: 0,
        now_ms: now.0,
        kind: Some(Kind::ChunkserverStart(pb::TraceChunkserverStart {
            config: Some(chunkserver_settings(start.config)),
            metas: start.metas.to_vec(),
        })),
    }
}

// ---- errors -----------------------------------------------------------------------------

pub fn rpc_error(e: &RpcError) -> pb::TraceRpcError {
    let (kind, detail, size) = match e {
        RpcError::Deadline(s) => (RpcKind::Deadline, s.clone(), 0),
        RpcError::Unreachable(s) => (RpcKind::Unreachable, s.clone(), 0),
        RpcError::Decode(s) => (RpcKind::Decode, s.clone(), 0),
        RpcError::TooLarge(n) => (RpcKind::TooLarge, String::new(), *n as u64),
        RpcError::Listen(s) => (RpcKind::Listen, s.clone(), 0),
    };
    pb::TraceRpcError {
        kind: kind as i32,
        detail,
        size,
    }
}

pub fn rpc_error_back(e: &pb::TraceRpcError) -> Result<RpcError, String> {
    Ok(match RpcKind::try_from(e.kind) {
        Ok(RpcKind::Deadline) => RpcError::Deadline(e.detail.clone()),
        Ok(RpcKind::Unreachable) => RpcError::Unreachable(e.detail.clone()),
        Ok(RpcKind::Decode) => RpcError::Decode(e.detail.clone()),
        Ok(RpcKind::TooLarge) => RpcError::TooLarge(usize::try_from(e.size).unwrap_or(usize::MAX)),
        Ok(RpcKind::Listen) => RpcError::Listen(e.detail.clone()),
        _ => return Err(format!("unknown call error kind {}", e.kind)),
    })
}

fn store_error(e: &StoreError) -> pb::TraceStoreError {
    let (kind, detail) = match e {
        StoreError::NoSpace => (StoreKind::NoSpace, String::new()),
        StoreError::NotFound => (StoreKind::NotFound, String::new()),
        StoreError::Corrupt(s) => (StoreKind::Corrupt, s.clone()),
        StoreError::Io(s) => (StoreKind::Io, s.clone()),
    };
    pb::TraceStoreError {
        kind: kind as i32,
        detail,
    }
}

// ---- master steps -----------------------------------------------------------------------

/// A master's step as a record. `origin` is where a request input came from.
pub fn master_step(
    now: Time,
    origin: Option<pb::TraceOrigin>,
    input: &ms::Input,
    effects: &ms::Effects,
) -> pb::TraceRecord {
    let input = match input {
        ms::Input::Request { id, req, from } => MsIn::Request(pb::TraceMasterRequest {
            id: *id,
            req: Some(req.clone()),
            caller: from.label(),
        }),
        ms::Input::CallResult { id, result } => MsIn::CallResult(pb::TraceMasterCallResult {
            id: *id,
            result: Some(match result {
                Ok(r) => MsResult::Ok(r.clone()),
                Err(e) => MsResult::Err(rpc_error(e)),
            }),
        }),
        ms::Input::LogSynced { through } => MsIn::LogSynced(*through),
        ms::Input::Tick => MsIn::Tick(pb::Empty {}),
        ms::Input::Malformed { id, error } => MsIn::Malformed(pb::TraceMalformed {
            id: *id,
            error: error.clone(),
        }),
    };
    let mut step = master_effects(effects);
    step.origin = origin;
    step.input = Some(input);
    pb::TraceRecord {
        seq: 0,
        now_ms: now.0,
        kind: Some(Kind::Master(step)),
    }
}

/// A master step's effects as a record holds them (its input left out).
pub fn master_effects(effects: &ms::Effects) -> pb::TraceMasterStep {
    pb::TraceMasterStep {
        origin: None,
        input: None,
        authority_ms: None,
        log: effects
            .log
            .iter()
            .map(|(seq, r)| pb::TraceLogEntry {
                seq: *seq,
                record: Some(r.clone()),
            })
            .collect(),
        replies: effects
            .replies
            .iter()
            .map(|(id, r)| pb::TraceMasterReply {
                id: *id,
                resp: Some(r.clone()),
            })
            .collect(),
        calls: effects
            .calls
            .iter()
            .map(|c| pb::TraceMasterCall {
                id: c.id,
                to: c.to.clone(),
                req: Some(c.req.clone()),
                timeout_ns: c.timeout.map(ns),
            })
            .collect(),
        checkpoint_through: effects.checkpoint_due.unwrap_or(0),
        checkpoint: None,
    }
}

/// The input a master step record holds.
pub fn master_input(step: &pb::TraceMasterStep) -> Result<ms::Input, String> {
    Ok(
        match step
            .input
            .as_ref()
            .ok_or("a master step without an input")?
        {
            MsIn::Request(r) => ms::Input::Request {
                id: r.id,
                req: r.req.clone().ok_or("a request without its message")?,
                from: Caller::parse(&r.caller)
                    .map_err(|e| format!("a request from an unknown caller: {e}"))?,
            },
            MsIn::CallResult(r) => ms::Input::CallResult {
                id: r.id,
                result: match r.result.as_ref().ok_or("a call result without a result")? {
                    MsResult::Ok(resp) => Ok(resp.clone()),
                    MsResult::Err(e) => Err(rpc_error_back(e)?),
                },
            },
            MsIn::LogSynced(through) => ms::Input::LogSynced { through: *through },
            MsIn::Tick(_) => ms::Input::Tick,
            MsIn::Malformed(m) => ms::Input::Malformed {
                id: m.id,
                error: m.error.clone(),
            },
        },
    )
}

// ---- chunkserver steps ------------------------------------------------------------------

/// `req` with its file data emptied, and that data's length and CRC.
pub fn strip_request(req: &pb::ChunkRequest) -> (pb::ChunkRequest, Option<pb::DataRef>) {
    strip_request_in(req, &mut DataRefs::default())
}

fn strip_request_in(
    req: &pb::ChunkRequest,
    refs: &mut DataRefs,
) -> (pb::ChunkRequest, Option<pb::DataRef>) {
    let mut req = req.clone();
    let data = match req.req.as_mut() {
        Some(CReq::Write(w)) => Some(&mut w.data),
        Some(CReq::Push(p)) => Some(&mut p.piece),
        Some(CReq::Append(a)) => Some(&mut a.data),
        Some(CReq::Apply(a)) => Some(&mut a.data),
        _ => None,
    };
    let r = data.map(|d| {
        let r = refs.of(d);
        *d = Bytes::new();
        r
    });
    (req, r)
}

/// `resp` with a read's data emptied, and that data's length and CRC.
pub fn strip_response(resp: &pb::ChunkResponse) -> (pb::ChunkResponse, Option<pb::DataRef>) {
    strip_response_in(resp, &mut DataRefs::default())
}

fn strip_response_in(
    resp: &pb::ChunkResponse,
    refs: &mut DataRefs,
) -> (pb::ChunkResponse, Option<pb::DataRef>) {
    let mut resp = resp.clone();
    let r = match resp.resp.as_mut() {
        Some(CResp::Read(r)) => {
            let d = refs.of(&r.data);
            r.data = Bytes::new();
            Some(d)
        }
        _ => None,
    };
    (resp, r)
}

fn chunk_request(
    id: u64,
    req: &pb::ChunkRequest,
    arrived: Time,
    refs: &mut DataRefs,
) -> pb::TraceChunkRequest {
    let (req, data) = strip_request_in(req, refs);
    pb::TraceChunkRequest {
        id,
        req: Some(req),
        data,
        arrived_ms: arrived.0,
        caller: String::new(),
    }
}

fn chunk_reply(id: u64, resp: &pb::ChunkResponse, refs: &mut DataRefs) -> pb::TraceChunkReply {
    let (resp, data) = strip_response_in(resp, refs);
    pb::TraceChunkReply {
        id,
        resp: Some(resp),
        data,
    }
}

fn store_op(id: u64, op: &cs::StoreOp, refs: &mut DataRefs) -> pb::TraceStoreOp {
    let meta = |m: &pb::ChunkMeta| Some(data_ref(&prost::Message::encode_to_vec(m)));
    let mut t = pb::TraceStoreOp {
        id,
        handle: op.handle(),
        ..Default::default()
    };
    match op {
        cs::StoreOp::Read { ranges, .. } => {
            t.kind = OpKind::Read as i32;
            t.ranges = ranges.iter().flat_map(|&(o, l)| [o, l]).collect();
        }
        cs::StoreOp::Write {
            offset,
            data,
            meta: m,
            intent,
            ..
        } => {
            t.kind = OpKind::Write as i32;
            t.offset = *offset;
            t.data = Some(refs.of(data));
            t.meta = meta(m);
            t.intent = intent.as_ref().and_then(meta);
        }
        cs::StoreOp::Replace { data, meta: m, .. } => {
            t.kind = OpKind::Replace as i32;
            t.data = Some(refs.of(data));
            t.meta = meta(m);
        }
        cs::StoreOp::WriteMeta { meta: m, .. } => {
            t.kind = OpKind::WriteMeta as i32;
            t.meta = meta(m);
        }
        cs::StoreOp::Delete { .. } => t.kind = OpKind::Delete as i32,
    }
    t
}

/// A chunkserver's step as a record, its file data as length and CRC.
pub fn chunkserver_step(
    now: Time,
    origin: Option<pb::TraceOrigin>,
    input: &cs::Input,
    effects: &cs::Effects,
) -> pb::TraceRecord {
    chunkserver_step_in(now, origin, input, effects, &mut DataRefs::default())
}

/// [`chunkserver_step`], the CRCs of buffers met lately taken from `refs`.
pub fn chunkserver_step_in(
    now: Time,
    origin: Option<pb::TraceOrigin>,
    input: &cs::Input,
    effects: &cs::Effects,
    refs: &mut DataRefs,
) -> pb::TraceRecord {
    let input = match input {
        cs::Input::Request {
            id,
            req,
            arrived,
            from,
        } => {
            let mut r = chunk_request(*id, req, *arrived, refs);
            r.caller = from.label();
            CsIn::Request(r)
        }
        cs::Input::CallResult { id, result } => CsIn::CallResult(pb::TraceChunkserverCallResult {
            id: *id,
            result: Some(match result {
                Ok(cs::Reply::Master(r)) => CsResult::Master(r.clone()),
                Ok(cs::Reply::Chunk(r)) => CsResult::Chunk(chunk_reply(0, r, refs)),
                Err(e) => CsResult::Err(rpc_error(e)),
            }),
        }),
        cs::Input::StoreDone { id, result } => CsIn::StoreDone(pb::TraceStoreDone {
            id: *id,
            result: Some(match result {
                Ok(cs::StoreOutput::Data(pieces)) => DoneResult::Data(pb::TraceDataList {
                    pieces: pieces.iter().map(|p| refs.of(p)).collect(),
                }),
                Ok(cs::StoreOutput::Done) => DoneResult::Done(pb::Empty {}),
                Err(e) => DoneResult::Err(store_error(e)),
            }),
        }),
        cs::Input::Tick => CsIn::Tick(pb::Empty {}),
        cs::Input::DiskSpace { free } => CsIn::DiskSpace(pb::TraceDiskSpace { free: *free }),
        cs::Input::Malformed { id, error } => CsIn::Malformed(pb::TraceMalformed {
            id: *id,
            error: error.clone(),
        }),
    };
    let step = pb::TraceChunkserverStep {
        origin,
        input: Some(input),
        replies: effects
            .replies
            .iter()
            .map(|(id, r)| chunk_reply(*id, r, refs))
            .collect(),
        calls: effects
            .calls
            .iter()
            .map(|c| {
                let to = match &c.to {
                    cs::Dest::Master => String::new(),
                    cs::Dest::Peer(a) => a.clone(),
                };
                let (master, chunk) = match &c.req {
                    cs::Outgoing::Master(r) => (Some(r.clone()), None),
                    cs::Outgoing::Chunk(r) => (None, Some(chunk_request(0, r, Time::ZERO, refs))),
                };
                pb::TraceChunkserverCall {
                    id: c.id,
                    to,
                    master,
                    chunk,
                }
            })
            .collect(),
        store: effects
            .store
            .iter()
            .map(|(id, op)| store_op(*id, op, refs))
            .collect(),
    };
    pb::TraceRecord {
        seq: 0,
        now_ms: now.0,
        kind: Some(Kind::Chunkserver(step)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Remembered CRCs are those of the very bytes asked about: a buffer met again, a
    /// clone of it, a slice of it from the same address, and more buffers than are
    /// remembered.
    #[test]
    fn remembered_crcs_are_the_bytes_own() {
        let mut refs = DataRefs::default();
        let whole = Bytes::from((0..10_000u32).map(|i| (i * 7) as u8).collect::<Vec<u8>>());
        let mut asked = vec![whole.clone(), whole.clone(), whole.slice(..5_000)];
        asked.extend((0..RECENT * 2).map(|i| whole.slice(i..i + 100)));
        asked.push(whole.slice(..5_000));
        asked.push(whole.clone());
        for b in &asked {
            assert_eq!(
                refs.of(b),
                data_ref(b),
                "{} bytes at {:p}",
                b.len(),
                b.as_ptr()
            );
        }
    }
}
