//! Drivers: the loops that run a state machine over the runtime traits. A driver is the
//! one place every input and every effect passes, so tracing and trace recording hook in
//! here (`Observer`), and the ordering rules of the effects are carried out here:
//! log records are written and synced before the master hears `LogSynced`, and storage
//! operations complete before the chunkserver hears `StoreDone`.

pub mod checkpoint;
pub mod chunkserver;
pub mod commit;
pub mod group;
pub mod master;
pub mod queues;

use crate::chunkserver as chunkserver_sm;
use crate::master as master_sm;

use crate::error::StoreError;
use crate::pb;
use crate::types::{LogSeq, Time};

/// What a master was rebuilt from: its settings (the random seed included) and the
/// durable state recovery read. Given these and the inputs that followed, the master's
/// every effect is determined.
#[derive(Clone, Copy, Debug)]
pub struct MasterStart<'a> {
    pub config: &'a master_sm::MasterConfig,
    pub checkpoint: Option<&'a pb::Checkpoint>,
    pub tail: &'a [(LogSeq, pb::LogRecord)],
    /// Nonzero: a master group's new leader took over in this term, from the
    /// checkpoint of its shadow state (`Master::take_over`), rather than recovering.
    pub epoch: u64,
}

/// What a chunkserver was rebuilt from: its settings and the chunk metadata it loaded
/// (its identity record included).
#[derive(Clone, Copy, Debug)]
pub struct ChunkserverStart<'a> {
    pub config: &'a chunkserver_sm::ChunkserverConfig,
    pub metas: &'a [pb::ChunkMeta],
}

/// Sees everything that reaches a node's state machine: what it was rebuilt from, then
/// every step (the input, the clock reading it was given, the effects, and the state
/// machine after it). Nothing changes a state machine except through these, so a record
/// of them replays the node. Tracing, trace recording and the simulator's invariant
/// checkers hook in here.
pub trait Observer: Send + 'static {
    /// The master was rebuilt from `start`; its first step follows.
    fn master_started(&mut self, _now: Time, _start: MasterStart<'_>) {}
    /// The chunkserver was rebuilt from `start`; its first step follows.
    fn chunkserver_started(&mut self, _now: Time, _start: ChunkserverStart<'_>) {}
    /// Request `id` came from `peer`, whole at `arrived`; its step (a `Request` or
    /// `Malformed` input) follows at once.
    fn request(&mut self, _id: u64, _peer: &str, _arrived: Time) {}
    /// In a master group: the master's next step ran knowing it leads until `until`
    /// (`Master::set_authority`, set between steps by its replica); that step follows.
    fn authority(&mut self, _until: Time) {}
    fn master_step(
        &mut self,
        _now: Time,
        _input: &master_sm::Input,
        _effects: &master_sm::Effects,
        _master: &master_sm::Master,
    ) {
    }
    /// A master alone's driver wrote checkpoint `cp`, built beside the master
    /// (`master::checkpointer`) and sealed for the store (`driver::checkpoint`); its
    /// master had logged through record `logged` by then. The master does not see it:
    /// it is no input.
    fn master_checkpointed(&mut self, _now: Time, _cp: &checkpoint::Sealed, _logged: LogSeq) {}
    fn chunkserver_step(
        &mut self,
        _now: Time,
        _input: &chunkserver_sm::Input,
        _effects: &chunkserver_sm::Effects,
        _cs: &chunkserver_sm::Chunkserver,
    ) {
    }
    /// A master replica took a step (its master's own steps, if it runs one, were
    /// reported by `master_step` just before).
    fn replica_step(
        &mut self,
        _now: Time,
        _input: &crate::group::Input,
        _effects: &crate::group::Effects,
        _replica: &crate::group::Replica,
    ) {
    }
    /// Whether this observer looks at a replica's master steps (copying them costs).
    fn watches_masters(&self) -> bool {
        true
    }
}

/// Observes nothing.
pub struct Quiet;
impl Observer for Quiet {
    fn watches_masters(&self) -> bool {
        false
    }
}

/// Logs every step at trace level.
pub struct Tracing(pub String);
impl Observer for Tracing {
    fn master_step(
        &mut self,
        now: Time,
        input: &master_sm::Input,
        effects: &master_sm::Effects,
        _: &master_sm::Master,
    ) {
        tracing::trace!(node = %self.0, now = now.0, ?input, ?effects, "master step");
    }
    fn chunkserver_step(
        &mut self,
        now: Time,
        input: &chunkserver_sm::Input,
        effects: &chunkserver_sm::Effects,
        _: &chunkserver_sm::Chunkserver,
    ) {
        tracing::trace!(node = %self.0, now = now.0, ?input, ?effects, "chunkserver step");
    }
}

/// Why a server stopped. Every stop is a crash: the next start recovers.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("storage failed: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Listen(#[from] crate::error::RpcError),
    #[error("recovery failed: {0}")]
    Recovery(String),
    /// A task the server runs beside its loop ended (a bug): the server stops, as at a
    /// crash, and its next start recovers from its store.
    #[error("{0}")]
    Stopped(String),
}
