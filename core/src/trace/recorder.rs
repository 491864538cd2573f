//! The observer that writes a node's trace: each start and step becomes a record,
//! framed, handed to a [`Sink`] that puts it in files.

use std::sync::{Arc, Mutex};

use super::record;
use crate::chunkserver as cs;
use crate::driver::checkpoint::Sealed;
use crate::driver::{ChunkserverStart, MasterStart, Observer};
use crate::group;
use crate::master as ms;
use crate::pb;
use crate::types::{LogSeq, Time};

/// Where framed records go: files, rotated (`tessera-tracefile`), or memory.
pub trait Sink: Send + 'static {
    /// One framed record, the `seq`th of its run (1: a start record, which begins a run).
    fn record(&mut self, seq: u64, frame: &[u8]);
    /// What was written so far should reach its file now (called at a node's ticks, so
    /// a crash loses at most the last second or so of its trace).
    fn flush(&mut self);
}

/// Records every start and step of one node to a [`Sink`].
pub struct Recorder<S: Sink> {
    sink: S,
    seq: u64,
    origin: Option<pb::TraceOrigin>,
    authority: Option<Time>,
    buf: Vec<u8>,
    /// CRCs of the file data met lately (a chunkserver's pushed piece is met again as
    /// it is passed on, a read's data again in its reply).
    refs: record::DataRefs,
    /// Records and bytes written, for the cost of tracing.
    pub records: u64,
    pub bytes: u64,
}

impl<S: Sink> Recorder<S> {
    pub fn new(sink: S) -> Recorder<S> {
        Recorder {
            sink,
            seq: 0,
            origin: None,
            authority: None,
            buf: Vec::new(),
            refs: record::DataRefs::default(),
            records: 0,
            bytes: 0,
        }
    }

    pub fn sink(&self) -> &S {
        &self.sink
    }

    fn write(&mut self, mut rec: pb::TraceRecord) {
        self.seq += 1;
        rec.seq = self.seq;
        self.buf.clear();
        super::frame(&rec, &mut self.buf);
        self.records += 1;
        self.bytes += self.buf.len() as u64;
        self.sink.record(self.seq, &self.buf);
        // A start record holds a whole checkpoint: its buffer is not kept for ever.
        if self.buf.capacity() > 1 << 20 {
            self.buf = Vec::new();
        }
    }
}

impl<S: Sink> Observer for Recorder<S> {
    fn master_started(&mut self, now: Time, start: MasterStart<'_>) {
        self.seq = 0;
        self.write(record::master_start(now, start));
        self.sink.flush();
    }

    fn chunkserver_started(&mut self, now: Time, start: ChunkserverStart<'_>) {
        self.seq = 0;
        self.write(record::chunkserver_start(now, start));
        self.sink.flush();
    }

    fn request(&mut self, _id: u64, peer: &str, arrived: Time) {
        self.origin = Some(pb::TraceOrigin {
            peer: peer.to_string(),
            arrived_ms: arrived.0,
        });
    }

    fn authority(&mut self, until: Time) {
        self.authority = Some(until);
    }

    fn master_step(&mut self, now: Time, input: &ms::Input, effects: &ms::Effects, _: &ms::Master) {
        let origin = self.origin.take();
        let mut rec = record::master_step(now, origin, input, effects);
        if let Some(pb::trace_record::Kind::Master(step)) = rec.kind.as_mut() {
            step.authority_ms = self.authority.take().map(|t| t.0);
        }
        self.write(rec);
        if matches!(input, ms::Input::Tick) {
            self.sink.flush();
        }
    }

    fn chunkserver_step(
        &mut self,
        now: Time,
        input: &cs::Input,
        effects: &cs::Effects,
        _: &cs::Chunkserver,
    ) {
        let origin = self.origin.take();
        let rec = record::chunkserver_step_in(now, origin, input, effects, &mut self.refs);
        self.write(rec);
        if matches!(input, cs::Input::Tick) {
            self.sink.flush();
        }
    }
}

/// Two observers, each seeing everything, the first first.
impl<A: Observer, B: Observer> Observer for (A, B) {
    fn master_started(&mut self, now: Time, start: MasterStart<'_>) {
        self.0.master_started(now, start);
        self.1.master_started(now, start);
    }
    fn chunkserver_started(&mut self, now: Time, start: ChunkserverStart<'_>) {
        self.0.chunkserver_started(now, start);
        self.1.chunkserver_started(now, start);
    }
    fn request(&mut self, id: u64, peer: &str, arrived: Time) {
        self.0.request(id, peer, arrived);
        self.1.request(id, peer, arrived);
    }
    fn authority(&mut self, until: Time) {
        self.0.authority(until);
        self.1.authority(until);
    }
    fn master_step(&mut self, now: Time, i: &ms::Input, e: &ms::Effects, m: &ms::Master) {
        self.0.master_step(now, i, e, m);
        self.1.master_step(now, i, e, m);
    }
    fn master_checkpointed(&mut self, now: Time, cp: &Sealed, logged: LogSeq) {
        self.0.master_checkpointed(now, cp, logged);
        self.1.master_checkpointed(now, cp, logged);
    }
    fn chunkserver_step(&mut self, now: Time, i: &cs::Input, e: &cs::Effects, c: &cs::Chunkserver) {
        self.0.chunkserver_step(now, i, e, c);
        self.1.chunkserver_step(now, i, e, c);
    }
    fn replica_step(
        &mut self,
        now: Time,
        i: &group::Input,
        e: &group::Effects,
        r: &group::Replica,
    ) {
        self.0.replica_step(now, i, e, r);
        self.1.replica_step(now, i, e, r);
    }
    fn watches_masters(&self) -> bool {
        self.0.watches_masters() || self.1.watches_masters()
    }
}

/// Either observer, or none: an optional trace beside a node's other observer.
impl<A: Observer> Observer for Option<A> {
    fn master_started(&mut self, now: Time, start: MasterStart<'_>) {
        if let Some(o) = self {
            o.master_started(now, start);
        }
    }
    fn chunkserver_started(&mut self, now: Time, start: ChunkserverStart<'_>) {
        if let Some(o) = self {
            o.chunkserver_started(now, start);
        }
    }
    fn request(&mut self, id: u64, peer: &str, arrived: Time) {
        if let Some(o) = self {
            o.request(id, peer, arrived);
        }
    }
    fn authority(&mut self, until: Time) {
        if let Some(o) = self {
            o.authority(until);
        }
    }
    fn master_step(&mut self, now: Time, i: &ms::Input, e: &ms::Effects, m: &ms::Master) {
        if let Some(o) = self {
            o.master_step(now, i, e, m);
        }
    }
    fn master_checkpointed(&mut self, now: Time, cp: &Sealed, logged: LogSeq) {
        if let Some(o) = self {
            o.master_checkpointed(now, cp, logged);
        }
    }
    fn chunkserver_step(&mut self, now: Time, i: &cs::Input, e: &cs::Effects, c: &cs::Chunkserver) {
        if let Some(o) = self {
            o.chunkserver_step(now, i, e, c);
        }
    }
    fn replica_step(
        &mut self,
        now: Time,
        i: &group::Input,
        e: &group::Effects,
        r: &group::Replica,
    ) {
        if let Some(o) = self {
            o.replica_step(now, i, e, r);
        }
    }
    fn watches_masters(&self) -> bool {
        self.as_ref().is_some_and(|o| o.watches_masters())
    }
}

/// A trace kept in memory as one file (tests, the fuzzer, the simulator's own checks).
#[derive(Clone)]
pub struct MemSink {
    pub file: Arc<Mutex<Vec<u8>>>,
}

impl MemSink {
    pub fn new(node: &str, role: &str) -> MemSink {
        let mut file = super::MAGIC.to_vec();
        super::frame(
            &super::header(super::RAW_FORMAT, node, role, 1, 1),
            &mut file,
        );
        MemSink {
            file: Arc::new(Mutex::new(file)),
        }
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.file.lock().expect("trace lock").clone()
    }
}

impl Sink for MemSink {
    fn record(&mut self, _seq: u64, frame: &[u8]) {
        self.file
            .lock()
            .expect("trace lock")
            .extend_from_slice(frame);
    }
    fn flush(&mut self) {}
}
