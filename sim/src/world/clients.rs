//! Clients of the in-process world: each operation speaks the mutation protocol as the
//! client library does (GFS §3.1 and §3.3): the master names the chunk's primary and
//! secondaries (a lease request), the data goes to every replica along a chain, the
//! primary orders the mutation and answers once every replica applied it, and the master
//! extends the file. A failure starts the operation over from the master, up to
//! `ATTEMPTS` times. Every operation is recorded for the consistency checkers: writes in
//! the file's `History`, record appends in its `AppendLog`.

use bytes::Bytes;
use tessera_core::error::RpcError;
use tessera_core::pb;
use tessera_core::pb::chunk_request::Req as CReq;
use tessera_core::pb::master_request::Req;
use tessera_core::pb::master_response::Resp;
use tessera_core::record;

use super::{Caller, Payload, World};

/// Tries of one operation before its client gives up, and how long it keeps trying
/// (true ms); it waits `BACKOFF_MS` between tries, doubling to at most a second, as the
/// client library does.
pub const ATTEMPTS: u32 = 40;
pub const RETRY_FOR_MS: i64 = 60_000;
pub const BACKOFF_MS: i64 = 50;

#[derive(Clone, Debug)]
pub enum OpKind {
    /// A write of `data` at file offset `off`, within one chunk; `n` is its number in
    /// the file's history.
    Write { off: u64, data: Bytes, n: usize },
    /// A record append of a frame carrying record `id`.
    Append { id: u64, frame: Bytes },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Target,
    Push,
    Mutate,
    Extend,
    /// Waiting to try again from the master (or, past `Extend`, to extend again).
    Backoff {
        until: i64,
        extend: bool,
    },
    Done,
}

#[derive(Clone, Debug)]
pub struct ClientOp {
    pub path: String,
    pub kind: OpKind,
    stage: Stage,
    /// The chunk the operation goes to (an append moves on past full chunks).
    index: u64,
    attempts: u32,
    /// When the operation began (true ms).
    began: i64,
    target: Option<pb::WriteTarget>,
    /// The master's retry-cache token of the current master call.
    token: u64,
    /// Where the mutation landed in the file, once the primary said.
    at: u64,
    /// Some(acknowledged) once over.
    pub outcome: Option<bool>,
}

/// An answer to a client's call.
pub enum Answer {
    Master(pb::MasterResponse),
    Chunk(pb::ChunkResponse),
}

impl ClientOp {
    pub fn done(&self) -> bool {
        self.stage == Stage::Done
    }
}

impl World {
    /// Starts a write of `data` at `off` of `path` (cut to end at its chunk's end).
    /// Returns the operation's number.
    pub fn start_write(&mut self, path: &str, off: u64, data: Bytes) -> usize {
        let chunk = self.settings.master.chunk_size;
        let room = chunk - off % chunk;
        let data = data.slice(..data.len().min(room as usize));
        let n = self
            .checks
            .histories
            .entry(path.to_string())
            .or_default()
            .begin(self.now, off, data.clone());
        self.start_op(path, off / chunk, OpKind::Write { off, data, n })
    }

    /// Starts a record append of `payload` to `path`.
    pub fn start_append(&mut self, path: &str, payload: &[u8]) -> usize {
        let id = self.next_token << 16 | self.clients.len() as u64;
        self.checks
            .appends
            .entry(path.to_string())
            .or_default()
            .attempted
            .insert(id, Bytes::copy_from_slice(payload));
        let frame = record::frame(id, payload);
        self.start_op(path, 0, OpKind::Append { id, frame })
    }

    fn start_op(&mut self, path: &str, index: u64, kind: OpKind) -> usize {
        let op = self.clients.len();
        self.clients.push(ClientOp {
            path: path.to_string(),
            kind,
            stage: Stage::Target,
            index,
            attempts: 1,
            began: self.now,
            target: None,
            token: 0,
            at: 0,
            outcome: None,
        });
        self.ask_target(op);
        op
    }

    /// Operations not yet over.
    pub fn active(&self) -> usize {
        self.clients.iter().filter(|c| !c.done()).count()
    }

    fn client_token(&mut self) -> u64 {
        self.next_token += 1;
        (self.next_token << 1) | 1
    }

    fn send(&mut self, op: usize, payload: Payload) {
        let token = self.token(Caller::Client(op));
        self.send_request(token, payload);
    }

    fn send_master(&mut self, op: usize, req: Req) {
        let token = self.clients[op].token;
        self.send(
            op,
            Payload::ToMaster(pb::MasterRequest {
                token,
                req: Some(req),
                ..Default::default()
            }),
        );
    }

    fn ask_target(&mut self, op: usize) {
        let c = &mut self.clients[op];
        c.stage = Stage::Target;
        c.target = None;
        let req = Req::GetWriteTarget(pb::GetWriteTargetRequest {
            path: c.path.clone(),
            chunk_index: c.index,
            append: matches!(c.kind, OpKind::Append { .. }),
        });
        self.clients[op].token = self.client_token();
        self.send_master(op, req);
    }

    /// The data goes to the first replica, which forwards it along the rest.
    fn push(&mut self, op: usize) {
        let c = &mut self.clients[op];
        c.stage = Stage::Push;
        let t = c.target.as_ref().expect("a target");
        let mut chain: Vec<String> = std::iter::once(t.primary.clone())
            .chain(t.secondaries.iter().cloned())
            .collect();
        chain.sort();
        let first = chain.remove(0);
        let data = match &c.kind {
            OpKind::Write { data, .. } => data.clone(),
            OpKind::Append { frame, .. } => frame.clone(),
        };
        let data_id = (op as u64 + 1) << 8 | u64::from(c.attempts);
        let req = CReq::Push(pb::PushDataRequest {
            data_id,
            offset: 0,
            total: data.len() as u64,
            piece: data,
            handle: t.handle,
            capabilities: std::iter::once(&first)
                .chain(&chain)
                .map(|a| capability_at(t, a))
                .collect(),
            chain,
        });
        self.send_chunk(op, &first, req);
    }

    fn send_chunk(&mut self, op: usize, to: &str, req: CReq) {
        match self.server_index(to) {
            Some(i) => self.send(
                op,
                Payload::ToServer(i, pb::ChunkRequest { req: Some(req) }),
            ),
            None => self.retry(op),
        }
    }

    fn mutate(&mut self, op: usize) {
        let c = &mut self.clients[op];
        c.stage = Stage::Mutate;
        let t = c.target.clone().expect("a target");
        let data_id = (op as u64 + 1) << 8 | u64::from(c.attempts);
        let capability = Some(capability_at(&t, &t.primary));
        let secondary_capabilities: Vec<_> =
            t.secondaries.iter().map(|a| capability_at(&t, a)).collect();
        let req = match &c.kind {
            OpKind::Write { off, .. } => CReq::Write(pb::WriteChunkRequest {
                handle: t.handle,
                version: t.version,
                offset: off % t.chunk_size.max(1),
                data: Bytes::new(),
                secondaries: t.secondaries.clone(),
                client_id: op as u64 + 1,
                // A number per attempt, as the client library gives.
                client_seq: u64::from(c.attempts) + 1,
                data_id,
                write_seq: 1,
                capability,
                secondary_capabilities,
            }),
            OpKind::Append { .. } => CReq::Append(pb::AppendChunkRequest {
                handle: t.handle,
                version: t.version,
                data: Bytes::new(),
                secondaries: t.secondaries.clone(),
                data_id,
                capability,
                secondary_capabilities,
            }),
        };
        self.send_chunk(op, &t.primary, req);
    }

    fn extend(&mut self, op: usize) {
        let c = &mut self.clients[op];
        let first = !matches!(c.stage, Stage::Backoff { extend: true, .. });
        c.stage = Stage::Extend;
        let t = c.target.as_ref().expect("a target");
        let len = match &c.kind {
            OpKind::Write { off, data, .. } => off + data.len() as u64,
            OpKind::Append { frame, .. } => c.at + frame.len() as u64,
        };
        let req = Req::ExtendFile(pb::ExtendFileRequest {
            path: c.path.clone(),
            length: len,
            first_index: t.chunk_index,
            handles: vec![t.handle],
        });
        // A retried extension carries its first attempt's token (the retry cache).
        if first {
            self.clients[op].token = self.client_token();
        }
        self.send_master(op, req);
    }

    /// Waits, then starts over from the master; or gives up.
    fn retry(&mut self, op: usize) {
        let now = self.now;
        let c = &mut self.clients[op];
        if c.attempts >= ATTEMPTS || now - c.began > RETRY_FOR_MS {
            self.finish(op, false);
            return;
        }
        let wait = (BACKOFF_MS << (c.attempts - 1).min(5)).min(1_000);
        c.attempts += 1;
        // Past the mutation, only the master's extension is to be asked again.
        let extend = c.stage == Stage::Extend;
        c.stage = Stage::Backoff {
            until: now + wait,
            extend,
        };
    }

    /// Operations whose wait is over try again.
    pub(super) fn wake_clients(&mut self) {
        for op in 0..self.clients.len() {
            if let Stage::Backoff { until, extend } = self.clients[op].stage
                && until <= self.now
            {
                if extend {
                    self.extend(op);
                } else {
                    self.ask_target(op);
                }
            }
        }
    }

    fn finish(&mut self, op: usize, ok: bool) {
        let now = self.now;
        let c = &mut self.clients[op];
        c.stage = Stage::Done;
        c.outcome = Some(ok);
        match &c.kind {
            OpKind::Write { n, .. } => {
                if let Some(h) = self.checks.histories.get_mut(&c.path) {
                    h.end(*n, now, ok);
                }
                if ok {
                    self.checks.writes_acked += 1;
                }
            }
            OpKind::Append { id, .. } => {
                if ok && let Some(log) = self.checks.appends.get_mut(&c.path) {
                    log.acked.push((*id, c.at, now));
                }
            }
        }
    }

    pub(super) fn client_result(&mut self, op: usize, result: Result<Answer, RpcError>) {
        let stage = self.clients[op].stage;
        let answer = match result {
            Ok(a) => a,
            Err(_) => return self.retry(op),
        };
        match (stage, answer) {
            (Stage::Target, Answer::Master(r)) => match (r.error, r.resp) {
                (None, Some(Resp::WriteTarget(t))) => {
                    let c = &mut self.clients[op];
                    if matches!(c.kind, OpKind::Append { .. }) {
                        c.index = t.chunk_index;
                    } else if t.chunk_index != c.index {
                        return self.retry(op);
                    }
                    c.target = Some(t);
                    self.push(op);
                }
                _ => self.retry(op),
            },
            (Stage::Push, Answer::Chunk(r)) => match r.error {
                None => self.mutate(op),
                Some(_) => self.retry(op),
            },
            (Stage::Mutate, Answer::Chunk(r)) => match (r.error, r.resp) {
                (None, Some(pb::chunk_response::Resp::Append(a))) if a.chunk_full => {
                    // Padded: the next chunk, not a failure.
                    let c = &mut self.clients[op];
                    c.index += 1;
                    self.ask_target(op);
                }
                (None, Some(pb::chunk_response::Resp::Append(a))) => {
                    let c = &mut self.clients[op];
                    let t = c.target.as_ref().expect("a target");
                    c.at = t.chunk_index * t.chunk_size + a.offset;
                    self.extend(op);
                }
                (None, _) if matches!(self.clients[op].kind, OpKind::Write { .. }) => {
                    self.extend(op)
                }
                _ => self.retry(op),
            },
            (Stage::Extend, Answer::Master(r)) => match r.error {
                None => self.finish(op, true),
                Some(_) => self.retry(op),
            },
            // An answer to an earlier stage's call, timed out since: ignored.
            _ => {}
        }
    }
}

/// The capability `t` carries for the replica at `addr` (its primary, then its
/// secondaries, in order), or none.
fn capability_at(t: &pb::WriteTarget, addr: &str) -> pb::Capability {
    std::iter::once(&t.primary)
        .chain(&t.secondaries)
        .position(|a| a == addr)
        .and_then(|i| t.capabilities.get(i).cloned())
        .unwrap_or_default()
}
