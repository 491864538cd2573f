//! `tessera trace summary`: what a cluster's traces say about its traffic. Per method,
//! calls, failures, bytes and latency (from a request's arrival to its reply, on the
//! serving node's clock); and the GFS paper's §6.3 breakdowns: reads, writes and record
//! appends by size (Tables 4 and 5: operations and bytes per size bucket), and master
//! requests by type (Table 6).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use serde::Serialize;
use tessera_core::pb::{
    chunk_request::Req as CReq, trace_chunkserver_step::Input as CsIn,
    trace_master_step::Input as MsIn, trace_record::Kind,
};
use tessera_core::trace::{self, TraceFile};

/// Size buckets of the GFS paper's Tables 4 and 5 (upper bounds, exclusive).
const BUCKETS: &[(&str, u64)] = &[
    ("0", 1),
    ("1B..1K", 1 << 10),
    ("1K..8K", 8 << 10),
    ("8K..64K", 64 << 10),
    ("64K..128K", 128 << 10),
    ("128K..256K", 256 << 10),
    ("256K..512K", 512 << 10),
    ("512K..1M", 1 << 20),
    ("1M..inf", u64::MAX),
];

#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub nodes: usize,
    pub runs: u64,
    pub records: u64,
    /// Files cut short by a stop while writing (their records before the cut count).
    pub cut_files: Vec<String>,
    pub methods: BTreeMap<String, Method>,
    /// "read", "write", "record_append": operations and bytes per size bucket.
    pub sizes: BTreeMap<String, Vec<Bucket>>,
    /// Client requests to the master by type: count and percent of all (chunkservers'
    /// heartbeats and corruption reports left out, as in the paper's table).
    pub master_requests: BTreeMap<String, Share>,
}

#[derive(Debug, Default, Serialize)]
pub struct Method {
    pub calls: u64,
    /// Answered with an error.
    pub errors: u64,
    /// Not answered within the trace (the node stopped, or the trace ends first).
    pub unanswered: u64,
    /// Encoded request and reply bytes, file data included.
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub latency_ms: Latency,
    #[serde(skip)]
    samples: Vec<u64>,
}

#[derive(Debug, Default, Serialize, Clone, Copy)]
pub struct Latency {
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

#[derive(Debug, Default, Serialize, Clone)]
pub struct Bucket {
    pub size: String,
    pub ops: u64,
    pub bytes: u64,
}

#[derive(Debug, Default, Serialize, Clone, Copy)]
pub struct Share {
    pub count: u64,
    pub percent: f64,
}

/// A request waiting for its reply.
struct Open {
    method: String,
    arrived: u64,
    /// Size bucket to count the reply's data in (reads).
    read: bool,
}

#[derive(Default)]
struct Builder {
    s: Summary,
    sizes: BTreeMap<&'static str, Vec<(u64, u64)>>,
}

impl Builder {
    fn method(&mut self, name: &str) -> &mut Method {
        self.s.methods.entry(name.to_string()).or_default()
    }

    fn size(&mut self, op: &'static str, bytes: u64) {
        let b = self
            .sizes
            .entry(op)
            .or_insert_with(|| vec![(0, 0); BUCKETS.len()]);
        let i = BUCKETS
            .iter()
            .position(|(_, hi)| bytes < *hi)
            .unwrap_or(BUCKETS.len() - 1);
        b[i].0 += 1;
        b[i].1 = b[i].1.saturating_add(bytes);
    }

    fn answered(&mut self, open: Option<Open>, now: u64, error: bool, bytes: u64, data: u64) {
        let Some(o) = open else { return };
        if o.read && !error {
            self.size("read", data);
        }
        let m = self.method(&o.method);
        m.errors += u64::from(error);
        m.bytes_out = m.bytes_out.saturating_add(bytes.saturating_add(data));
        m.samples.push(now.saturating_sub(o.arrived));
    }

    fn node(&mut self, files: &[(String, TraceFile)]) {
        let mut open: HashMap<u64, Open> = HashMap::new();
        // Pushed data: id to its whole length, for the writes and appends that use it.
        let mut pushed: HashMap<u64, u64> = HashMap::new();
        let close = |b: &mut Builder, open: &mut HashMap<u64, Open>| {
            for o in open.drain().map(|(_, o)| o) {
                b.method(&o.method).unanswered += 1;
            }
        };
        for (name, f) in files {
            if f.cut.is_some() {
                self.s.cut_files.push(name.clone());
            }
            for rec in &f.records {
                self.s.records += 1;
                let now = rec.now_ms;
                match &rec.kind {
                    Some(Kind::MasterStart(_)) | Some(Kind::ChunkserverStart(_)) => {
                        self.s.runs += 1;
                        close(self, &mut open);
                        pushed.clear();
                    }
                    Some(Kind::Master(step)) => {
                        let arrived = step.origin.as_ref().map_or(now, |o| o.arrived_ms);
                        match &step.input {
                            Some(MsIn::Request(r)) => {
                                let name = r
                                    .req
                                    .as_ref()
                                    .and_then(|q| q.req.as_ref())
                                    .map_or("empty", trace::master_method);
                                let bytes = r.req.as_ref().map_or(0, prost::Message::encoded_len);
                                let method = format!("master.{name}");
                                let m = self.method(&method);
                                m.calls += 1;
                                m.bytes_in = m.bytes_in.saturating_add(bytes as u64);
                                // Table 6 counts what clients ask; chunkservers'
                                // heartbeats and corruption reports are not among them.
                                if !matches!(name, "heartbeat" | "report_corrupt" | "empty") {
                                    self.s
                                        .master_requests
                                        .entry(name.to_string())
                                        .or_default()
                                        .count += 1;
                                }
                                open.insert(
                                    r.id,
                                    Open {
                                        method,
                                        arrived,
                                        read: false,
                                    },
                                );
                            }
                            Some(MsIn::Malformed(m)) => {
                                self.method("master.malformed").calls += 1;
                                open.insert(
                                    m.id,
                                    Open {
                                        method: "master.malformed".into(),
                                        arrived,
                                        read: false,
                                    },
                                );
                            }
                            _ => {}
                        }
                        for r in &step.replies {
                            let resp = r.resp.as_ref();
                            let error = resp.is_some_and(|r| r.error.is_some());
                            let bytes = resp.map_or(0, prost::Message::encoded_len) as u64;
                            let o = open.remove(&r.id);
                            self.answered(o, now, error, bytes, 0);
                        }
                    }
                    Some(Kind::Chunkserver(step)) => {
                        match &step.input {
                            Some(CsIn::Request(r)) => {
                                let req = r.req.as_ref().and_then(|q| q.req.as_ref());
                                let name = req.map_or("empty", trace::chunk_method);
                                let data = r.data.as_ref().map_or(0, |d| d.len);
                                let bytes = (r.req.as_ref().map_or(0, prost::Message::encoded_len)
                                    as u64)
                                    .saturating_add(data);
                                let method = format!("chunk.{name}");
                                let m = self.method(&method);
                                m.calls += 1;
                                m.bytes_in = m.bytes_in.saturating_add(bytes);
                                // A mutation's size: its pushed data's, or its own.
                                let size = |data_id: u64| match data_id {
                                    0 => data,
                                    id => pushed.get(&id).copied().unwrap_or(0),
                                };
                                match req {
                                    Some(CReq::Push(p)) if p.offset == 0 => {
                                        pushed.insert(p.data_id, p.total);
                                    }
                                    Some(CReq::Write(w)) => self.size("write", size(w.data_id)),
                                    Some(CReq::Append(a)) => {
                                        self.size("record_append", size(a.data_id))
                                    }
                                    _ => {}
                                }
                                open.insert(
                                    r.id,
                                    Open {
                                        method,
                                        arrived: r.arrived_ms,
                                        read: matches!(req, Some(CReq::Read(_))),
                                    },
                                );
                            }
                            Some(CsIn::Malformed(m)) => {
                                self.method("chunk.malformed").calls += 1;
                                open.insert(
                                    m.id,
                                    Open {
                                        method: "chunk.malformed".into(),
                                        arrived: step.origin.as_ref().map_or(now, |o| o.arrived_ms),
                                        read: false,
                                    },
                                );
                            }
                            _ => {}
                        }
                        for r in &step.replies {
                            let resp = r.resp.as_ref();
                            let error = resp.is_some_and(|r| r.error.is_some());
                            let bytes = resp.map_or(0, prost::Message::encoded_len) as u64;
                            let data = r.data.as_ref().map_or(0, |d| d.len);
                            let o = open.remove(&r.id);
                            self.answered(o, now, error, bytes, data);
                        }
                    }
                    None => {}
                }
            }
        }
        close(self, &mut open);
    }

    fn finish(mut self) -> Summary {
        for m in self.s.methods.values_mut() {
            m.samples.sort_unstable();
            let n = m.samples.len();
            if n > 0 {
                let at = |q: f64| m.samples[((n as f64 * q).ceil() as usize).clamp(1, n) - 1];
                m.latency_ms = Latency {
                    p50: at(0.50),
                    p99: at(0.99),
                    max: m.samples[n - 1],
                };
            }
        }
        let total: u64 = self.s.master_requests.values().map(|s| s.count).sum();
        for s in self.s.master_requests.values_mut() {
            s.percent = (s.count as f64 * 1000.0 / total as f64).round() / 10.0;
        }
        for (op, counts) in self.sizes {
            self.s.sizes.insert(
                op.to_string(),
                BUCKETS
                    .iter()
                    .zip(counts)
                    .map(|((name, _), (ops, bytes))| Bucket {
                        size: name.to_string(),
                        ops,
                        bytes,
                    })
                    .collect(),
            );
        }
        self.s
    }
}

/// The summary of the nodes' traces (each node's files in order).
pub fn summary(nodes: &[Vec<(String, TraceFile)>]) -> Summary {
    let mut b = Builder::default();
    b.s.nodes = nodes.len();
    for n in nodes {
        b.node(n);
    }
    b.finish()
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}", part as f64 * 100.0 / whole as f64)
    }
}

impl Summary {
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a summary serialises")
    }

    /// The summary as tables for a terminal.
    pub fn table(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "{} nodes, {} runs, {} records",
            self.nodes, self.runs, self.records
        );
        for f in &self.cut_files {
            let _ = writeln!(o, "cut short (the node stopped while writing): {f}");
        }
        let _ = writeln!(
            o,
            "\n{:<24} {:>9} {:>7} {:>8} {:>14} {:>14} {:>8} {:>8} {:>8}",
            "method",
            "calls",
            "errors",
            "unansw.",
            "bytes in",
            "bytes out",
            "p50 ms",
            "p99 ms",
            "max ms"
        );
        for (name, m) in &self.methods {
            let _ = writeln!(
                o,
                "{:<24} {:>9} {:>7} {:>8} {:>14} {:>14} {:>8} {:>8} {:>8}",
                name,
                m.calls,
                m.errors,
                m.unanswered,
                m.bytes_in,
                m.bytes_out,
                m.latency_ms.p50,
                m.latency_ms.p99,
                m.latency_ms.max
            );
        }
        if !self.sizes.is_empty() {
            let ops = ["read", "write", "record_append"];
            let _ = writeln!(
                o,
                "\nOperations by size, % of operations (GFS Table 4) and % of bytes (Table 5)"
            );
            let _ = write!(o, "{:<12}", "size");
            for op in ops {
                let _ = write!(o, " {:>15} {:>7}", format!("{op} ops%"), "bytes%");
            }
            let _ = writeln!(o);
            for (i, (bucket, _)) in BUCKETS.iter().enumerate() {
                let _ = write!(o, "{bucket:<12}");
                for op in ops {
                    match self.sizes.get(op) {
                        Some(b) => {
                            let (n, by): (u64, u64) = b
                                .iter()
                                .fold((0, 0), |(n, by), x| (n + x.ops, by + x.bytes));
                            let _ =
                                write!(o, " {:>15} {:>7}", pct(b[i].ops, n), pct(b[i].bytes, by));
                        }
                        None => {
                            let _ = write!(o, " {:>15} {:>7}", "-", "-");
                        }
                    }
                }
                let _ = writeln!(o);
            }
        }
        if !self.master_requests.is_empty() {
            let _ = writeln!(
                o,
                "\nClient requests to the master by type (GFS Table 6; heartbeats not counted)"
            );
            let mut by: Vec<_> = self.master_requests.iter().collect();
            by.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
            for (name, s) in by {
                let _ = writeln!(o, "{name:<24} {:>9} {:>6.1}%", s.count, s.percent);
            }
        }
        o
    }
}
