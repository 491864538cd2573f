//! The client workload in a cluster's traces, for the simulator to run again
//! (`tessera-scenarios replay`): which files were made, renamed and deleted, and where
//! they were written, appended to and read, in the order and at the relative times the
//! traces show. Traces hold no file data, so the replay writes bytes of its own of the
//! recorded lengths, and judges every read by its own model.
//!
//! Where each operation comes from:
//! - namespace operations (mkdir, create, delete, rename): the master's requests; a
//!   retried request carries its first attempt's token and counts once;
//! - writes, record appends and reads: the chunkservers' requests, a write counted once
//!   per (writer, write number) however many attempts of it arrived (traces of a build
//!   whose attempts had no write number: per attempt number, which retries then shared),
//!   an append once per pushed record, placed in their
//!   files by the chunk handles the master's replies named (write targets, chunk lists),
//!   following renames made since.
//!
//! Operations on a file are kept in order on one replay client; files are grouped by
//! directory (a rename joins its two directories), so each group has one client and its
//! model stays sound, and groups are spread over the replay's clients.

use std::collections::{BTreeMap, HashMap};

use tessera_core::pb::{
    self, chunk_request::Req as CReq, master_request::Req as MReq, master_response::Resp as MResp,
    trace_chunkserver_step::Input as CsIn, trace_master_step::Input as MsIn, trace_record::Kind,
};
use tessera_core::trace::TraceFile;

/// The longest pause between two operations the script keeps (see [`script`]).
pub const MAX_IDLE_MS: u64 = 10_000;

/// One client operation found in the traces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientOp {
    Mkdir { path: String },
    Create { path: String },
    Delete { path: String },
    Rename { from: String, to: String },
    Write { path: String, offset: u64, len: u64 },
    Append { path: String, len: u64 },
    Read { path: String, offset: u64, len: u64 },
}

impl ClientOp {
    pub fn name(&self) -> &'static str {
        match self {
            ClientOp::Mkdir { .. } => "mkdir",
            ClientOp::Create { .. } => "create",
            ClientOp::Delete { .. } => "delete",
            ClientOp::Rename { .. } => "rename",
            ClientOp::Write { .. } => "write",
            ClientOp::Append { .. } => "append",
            ClientOp::Read { .. } => "read",
        }
    }

    /// The directory whose group runs this operation (a mkdir: the one it makes, whose
    /// files the same group makes).
    fn dir(&self) -> String {
        match self {
            ClientOp::Mkdir { path } => path.clone(),
            ClientOp::Create { path }
            | ClientOp::Delete { path }
            | ClientOp::Write { path, .. }
            | ClientOp::Append { path, .. }
            | ClientOp::Read { path, .. } => parent(path),
            ClientOp::Rename { from, .. } => parent(from),
        }
    }
}

/// An operation, when it began (milliseconds after the first), and its group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub at_ms: u64,
    pub group: usize,
    pub op: ClientOp,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Script {
    /// In order of time.
    pub steps: Vec<Step>,
    /// Groups of directories (see the module comment), numbered from 0.
    pub groups: usize,
    /// Operations found but not replayed, by reason.
    pub skipped: BTreeMap<String, u64>,
}

impl Script {
    /// Operations by kind, for the report.
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        let mut m = BTreeMap::new();
        for s in &self.steps {
            *m.entry(s.op.name()).or_default() += 1;
        }
        m
    }

    /// One line: what the script holds and what was left out.
    pub fn describe(&self) -> String {
        let ops: Vec<String> = self
            .counts()
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        let skipped: Vec<String> = self
            .skipped
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        format!(
            "replayed_ops={} groups={} ops={} skipped={}",
            self.steps.len(),
            self.groups,
            if ops.is_empty() {
                "none".into()
            } else {
                ops.join(",")
            },
            if skipped.is_empty() {
                "none".into()
            } else {
                skipped.join(",")
            }
        )
    }
}

fn parent(path: &str) -> String {
    match path.rsplit_once('/') {
        Some(("", _)) | None => "/".to_string(),
        Some((d, _)) => d.to_string(),
    }
}

/// Where a chunk lies: its file (as named when the master said so), index, chunk size.
#[derive(Clone, Debug)]
struct Place {
    path: String,
    index: u64,
    chunk_size: u64,
    /// The master's clock when it said so.
    at: u64,
}

/// An operation found, before ordering: its time, and its op.
struct Found {
    at: u64,
    op: ClientOp,
}

/// The script of the client operations in `nodes` (each a node's trace files in order).
pub fn script(nodes: &[Vec<(String, TraceFile)>]) -> Script {
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    let mut skip = |why: &str| *skipped.entry(why.to_string()).or_default() += 1;
    let mut found: Vec<Found> = Vec::new();
    // Every place the master named for each chunk, in the order named.
    let mut places: HashMap<u64, Vec<Place>> = HashMap::new();
    // Namespace: from the masters' requests.
    let mut tokens: std::collections::HashSet<u64> = Default::default();
    let mut renames: Vec<(u64, String, String)> = Vec::new();
    let mut dirs: std::collections::HashSet<String> = Default::default();
    // Hosts of the chunkservers, and of the clients that asked the master.
    let host = |peer: &str| peer.rsplit_once(':').map_or(peer, |(h, _)| h).to_string();
    let servers: std::collections::HashSet<String> = nodes
        .iter()
        .filter_map(|files| files.first())
        .filter(|(_, f)| f.header.role == "chunkserver")
        .map(|(_, f)| host(&f.header.node))
        .collect();
    let mut clients: std::collections::HashSet<String> = Default::default();
    for files in nodes {
        let mut asked: HashMap<u64, pb::MasterRequest> = HashMap::new();
        for (_, f) in files {
            for rec in &f.records {
                let step = match &rec.kind {
                    Some(Kind::MasterStart(_)) => {
                        asked.clear();
                        continue;
                    }
                    Some(Kind::Master(step)) => step,
                    _ => continue,
                };
                let now = rec.now_ms;
                if let Some(MsIn::Request(r)) = &step.input
                    && let Some(req) = &r.req
                {
                    asked.insert(r.id, req.clone());
                    if !matches!(
                        req.req,
                        Some(MReq::Heartbeat(_)) | Some(MReq::ReportCorrupt(_)) | None
                    ) && let Some(o) = &step.origin
                    {
                        clients.insert(host(&o.peer));
                    }
                    let fresh = req.token == 0 || tokens.insert(req.token);
                    let op = match &req.req {
                        Some(MReq::Mkdir(m)) => Some(ClientOp::Mkdir {
                            path: m.path.clone(),
                        }),
                        Some(MReq::Create(c)) => Some(ClientOp::Create {
                            path: c.path.clone(),
                        }),
                        Some(MReq::Delete(d)) => Some(ClientOp::Delete {
                            path: d.path.clone(),
                        }),
                        Some(MReq::Rename(r)) => Some(ClientOp::Rename {
                            from: r.src.clone(),
                            to: r.dst.clone(),
                        }),
                        _ => None,
                    };
                    if let Some(op) = op {
                        if !fresh {
                            skip("retried namespace request");
                        } else {
                            if let ClientOp::Mkdir { path } = &op {
                                dirs.insert(path.clone());
                            }
                            found.push(Found { at: now, op });
                        }
                    }
                }
                for reply in &step.replies {
                    let Some(req) = asked.remove(&reply.id) else {
                        continue;
                    };
                    let Some(resp) = reply
                        .resp
                        .as_ref()
                        .filter(|r| r.error.is_none())
                        .and_then(|r| r.resp.as_ref())
                    else {
                        continue;
                    };
                    match (&req.req, resp) {
                        // Chunks are followed only through renames that were done.
                        (Some(MReq::Rename(r)), MResp::Empty(_)) => {
                            renames.push((now, r.src.clone(), r.dst.clone()));
                        }
                        (Some(MReq::GetWriteTarget(q)), MResp::WriteTarget(t)) => {
                            places.entry(t.handle).or_default().push(Place {
                                path: q.path.clone(),
                                index: t.chunk_index,
                                chunk_size: t.chunk_size,
                                at: now,
                            });
                        }
                        (Some(MReq::GetChunks(q)), MResp::GetChunks(c)) => {
                            for l in &c.chunks {
                                places.entry(l.handle).or_default().push(Place {
                                    path: q.path.clone(),
                                    index: l.index,
                                    chunk_size: c.chunk_size,
                                    at: now,
                                });
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    // By time, and in the order the master answered within a millisecond.
    renames.sort_by_key(|r| r.0);
    for ps in places.values_mut() {
        ps.sort_by_key(|p| p.at);
    }
    // The file a chunk lay in at `t`: the name the master gave last before `t`, moved by
    // the renames since; or, if it named none before, the first name it gave, moved back
    // through the renames between.
    let at_time = |ps: &[Place], t: u64| -> Option<(String, u64, u64)> {
        let (p, forward) = match ps.iter().rev().find(|p| p.at <= t) {
            Some(p) => (p, true),
            None => (ps.first()?, false),
        };
        let mut path = p.path.clone();
        let moved = |path: &str, from: &str, to: &str| -> Option<String> {
            if path == from {
                Some(to.to_string())
            } else {
                path.strip_prefix(&format!("{from}/"))
                    .map(|rest| format!("{to}/{rest}"))
            }
        };
        if forward {
            for (when, from, to) in renames.iter().filter(|r| r.0 >= p.at && r.0 <= t) {
                let _ = when;
                if let Some(n) = moved(&path, from, to) {
                    path = n;
                }
            }
        } else {
            for (_, from, to) in renames.iter().rev().filter(|r| r.0 > t && r.0 <= p.at) {
                if let Some(n) = moved(&path, to, from) {
                    path = n;
                }
            }
        }
        Some((path, p.index, p.chunk_size))
    };
    // Data: from the chunkservers' requests.
    let mut pushed: HashMap<u64, u64> = HashMap::new();
    for files in nodes {
        for (_, f) in files {
            for rec in &f.records {
                if let Some(Kind::Chunkserver(step)) = &rec.kind
                    && let Some(CsIn::Request(r)) = &step.input
                    && let Some(CReq::Push(p)) = r.req.as_ref().and_then(|q| q.req.as_ref())
                {
                    pushed.insert(p.data_id, p.total);
                }
            }
        }
    }
    let mut writes_seen: std::collections::HashSet<(u64, (u64, bool))> = Default::default();
    let mut appends_seen: std::collections::HashSet<u64> = Default::default();
    for files in nodes {
        for (_, f) in files {
            for rec in &f.records {
                let Some(Kind::Chunkserver(step)) = &rec.kind else {
                    continue;
                };
                let Some(CsIn::Request(r)) = &step.input else {
                    continue;
                };
                let now = rec.now_ms;
                // Where clients run on hosts of their own, a request from a
                // chunkserver's host is a server's (a clone reads its source).
                let from_server = clients.is_disjoint(&servers)
                    && step
                        .origin
                        .as_ref()
                        .is_some_and(|o| servers.contains(&host(&o.peer)));
                let inline = r.data.as_ref().map_or(0, |d| d.len);
                let size = |data_id: u64| match data_id {
                    0 => Some(inline),
                    id => pushed.get(&id).copied(),
                };
                let placed = |h: u64, off: u64| {
                    places.get(&h).and_then(|ps| at_time(ps, now)).and_then(
                        |(path, index, chunk_size)| {
                            let at = index.checked_mul(chunk_size)?.checked_add(off)?;
                            Some((path, at))
                        },
                    )
                };
                let op = match r.req.as_ref().and_then(|q| q.req.as_ref()) {
                    Some(CReq::Write(w)) => {
                        let seq = if w.write_seq != 0 {
                            (w.write_seq, true)
                        } else {
                            (w.client_seq, false)
                        };
                        if w.client_id != 0 && !writes_seen.insert((w.client_id, seq)) {
                            skip("retried write");
                            continue;
                        }
                        match (placed(w.handle, w.offset), size(w.data_id)) {
                            (Some((path, offset)), Some(len)) => {
                                Some(ClientOp::Write { path, offset, len })
                            }
                            (None, _) => {
                                skip("write to a chunk no master reply placed");
                                None
                            }
                            (_, None) => {
                                skip("write of data not in the traces");
                                None
                            }
                        }
                    }
                    Some(CReq::Append(a)) => {
                        if a.data_id != 0 && !appends_seen.insert(a.data_id) {
                            skip("retried append");
                            continue;
                        }
                        match (placed(a.handle, 0), size(a.data_id)) {
                            (Some((path, _)), Some(len)) => Some(ClientOp::Append { path, len }),
                            (None, _) => {
                                skip("append to a chunk no master reply placed");
                                None
                            }
                            (_, None) => {
                                skip("append of data not in the traces");
                                None
                            }
                        }
                    }
                    Some(CReq::Read(_)) if from_server => {
                        skip("read by a chunkserver (a clone)");
                        None
                    }
                    Some(CReq::Read(q)) => match placed(q.handle, q.offset) {
                        Some((path, offset)) => Some(ClientOp::Read {
                            path,
                            offset,
                            len: q.length,
                        }),
                        None => {
                            skip("read of a chunk no master reply placed");
                            None
                        }
                    },
                    _ => None,
                };
                if let Some(op) = op {
                    found.push(Found { at: now, op });
                }
            }
        }
    }
    // A directory rename moves whole subtrees: not replayed (see the module comment).
    found.retain(|f| match &f.op {
        ClientOp::Rename { from, .. } if dirs.contains(from) => {
            *skipped.entry("directory rename".into()).or_default() += 1;
            false
        }
        _ => true,
    });
    found.sort_by_key(|f| f.at);
    // Groups: directories joined by renames between them.
    let mut group_of: BTreeMap<String, usize> = BTreeMap::new();
    let mut parent_of: Vec<usize> = Vec::new();
    fn root(p: &mut [usize], mut i: usize) -> usize {
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    let mut id = |d: String, p: &mut Vec<usize>| -> usize {
        *group_of.entry(d).or_insert_with(|| {
            p.push(p.len());
            p.len() - 1
        })
    };
    let mut step_dirs = Vec::with_capacity(found.len());
    for f in &found {
        let a = id(f.op.dir(), &mut parent_of);
        if let ClientOp::Rename { to, .. } = &f.op {
            let b = id(parent(to), &mut parent_of);
            let (ra, rb) = (root(&mut parent_of, a), root(&mut parent_of, b));
            parent_of[ra.max(rb)] = ra.min(rb);
        }
        step_dirs.push(a);
    }
    // Groups numbered densely, in order of first use. Times from the first operation,
    // with idle stretches longer than `MAX_IDLE_MS` cut to it: a trace of days replays
    // in what its activity needs.
    let mut dense: HashMap<usize, usize> = HashMap::new();
    let (mut last, mut at) = (found.first().map_or(0, |f| f.at), 0u64);
    let steps = found
        .into_iter()
        .zip(step_dirs)
        .map(|(f, d)| {
            let r = root(&mut parent_of, d);
            let n = dense.len();
            let group = *dense.entry(r).or_insert(n);
            at += f.at.saturating_sub(last).min(MAX_IDLE_MS);
            last = f.at;
            Step {
                at_ms: at,
                group,
                op: f.op,
            }
        })
        .collect();
    Script {
        steps,
        groups: dense.len(),
        skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(node: &str, role: &str, records: Vec<pb::TraceRecord>) -> Vec<(String, TraceFile)> {
        let header = pb::TraceHeader {
            node: node.into(),
            role: role.into(),
            ..Default::default()
        };
        let f = TraceFile {
            header,
            records,
            cut: None,
            open: false,
        };
        vec![(node.to_string(), f)]
    }

    fn origin(peer: &str) -> Option<pb::TraceOrigin> {
        Some(pb::TraceOrigin {
            peer: peer.into(),
            arrived_ms: 0,
        })
    }

    /// A master that made /f and placed chunk 5 as its first chunk.
    fn master() -> Vec<(String, TraceFile)> {
        // Request `id` (also the record's seq) at `now_ms`, and its replies.
        let step = |id: u64, now_ms, req, replies| pb::TraceRecord {
            seq: id,
            now_ms,
            kind: Some(Kind::Master(pb::TraceMasterStep {
                origin: origin("10.0.2.1:1"),
                input: Some(MsIn::Request(pb::TraceMasterRequest {
                    id,
                    req: Some(pb::MasterRequest {
                        req: Some(req),
                        ..Default::default()
                    }),
                    caller: String::new(),
                })),
                replies,
                ..Default::default()
            })),
        };
        let create = MReq::Create(pb::CreateRequest {
            path: "/f".into(),
            ..Default::default()
        });
        let target = MReq::GetWriteTarget(pb::GetWriteTargetRequest {
            path: "/f".into(),
            chunk_index: 0,
            ..Default::default()
        });
        let placed = pb::TraceMasterReply {
            id: 2,
            resp: Some(pb::MasterResponse {
                resp: Some(MResp::WriteTarget(pb::WriteTarget {
                    handle: 5,
                    chunk_index: 0,
                    chunk_size: 1 << 20,
                    ..Default::default()
                })),
                ..Default::default()
            }),
        };
        let records = vec![
            step(1, 10, create, vec![]),
            step(2, 20, target, vec![placed]),
        ];
        file("10.0.0.1:7000", "master", records)
    }

    /// A chunkserver that got these writes of chunk 5, 10 bytes at `offset`, each as
    /// (offset, client_id, client_seq, write_seq).
    fn chunkserver(writes: &[(u64, u64, u64, u64)]) -> Vec<(String, TraceFile)> {
        let records = writes
            .iter()
            .enumerate()
            .map(
                |(i, &(offset, client_id, client_seq, write_seq))| pb::TraceRecord {
                    seq: i as u64 + 1,
                    now_ms: 30 + i as u64,
                    kind: Some(Kind::Chunkserver(pb::TraceChunkserverStep {
                        origin: origin("10.0.2.1:2"),
                        input: Some(CsIn::Request(pb::TraceChunkRequest {
                            id: i as u64 + 1,
                            req: Some(pb::ChunkRequest {
                                req: Some(CReq::Write(pb::WriteChunkRequest {
                                    handle: 5,
                                    version: 1,
                                    offset,
                                    client_id,
                                    client_seq,
                                    write_seq,
                                    ..Default::default()
                                })),
                            }),
                            data: Some(pb::DataRef { len: 10, crc: 0 }),
                            arrived_ms: 30 + i as u64,
                            caller: String::new(),
                        })),
                        ..Default::default()
                    })),
                },
            )
            .collect();
        file("10.0.1.1:7000", "chunkserver", records)
    }

    fn writes(s: &Script) -> Vec<u64> {
        s.steps
            .iter()
            .filter_map(|st| match &st.op {
                ClientOp::Write { path, offset, len } => {
                    assert_eq!((path.as_str(), *len), ("/f", 10));
                    Some(*offset)
                }
                _ => None,
            })
            .collect()
    }

    /// A write retried (attempts 3 and 4 of write 2, which arrived both) replays once; a
    /// write of another writer, or the same writer's next write, each once; and a trace
    /// whose attempts carry no write number still merges attempts sharing theirs.
    #[test]
    fn a_retried_write_is_one_write() {
        let cs = chunkserver(&[
            (0, 7, 3, 2),
            (0, 7, 4, 2),
            (100, 8, 3, 2),
            (200, 7, 6, 5),
            (300, 9, 1, 0),
            (300, 9, 1, 0),
        ]);
        let s = script(&[master(), cs]);
        assert_eq!(writes(&s), vec![0, 100, 200, 300], "{s:?}");
        assert_eq!(s.skipped.get("retried write"), Some(&2), "{s:?}");
    }
}
