//! Drivers: the loops that run a state machine over the runtime traits. A driver is the
//! one place every input and every effect passes, so tracing and trace recording hook in
//! here (`Observer`), and the ordering rules of the effects are carried out here:
//! log records are written and synced before the master hears `LogSynced`, and storage
//! operations complete before the chunkserver hears `StoreDone`.

pub mod chunkserver;
pub mod master;

use crate::chunkserver as chunkserver_sm;
use crate::master as master_sm;

use crate::error::StoreError;
use crate::types::Time;

/// Sees every step a driver takes: the input, the effects, and the state machine after
/// it. Tracing, trace recording and the simulator's invariant checkers hook in here.
pub trait Observer: Send + 'static {
    fn master_step(
        &mut self,
        _now: Time,
        _input: &master_sm::Input,
        _effects: &master_sm::Effects,
        _master: &master_sm::Master,
    ) {
    }
    fn chunkserver_step(
        &mut self,
        _now: Time,
        _input: &chunkserver_sm::Input,
        _effects: &chunkserver_sm::Effects,
        _cs: &chunkserver_sm::Chunkserver,
    ) {
    }
}

/// Observes nothing.
pub struct Quiet;
impl Observer for Quiet {}

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
}
