//! Drivers: the loops that run a state machine over the runtime traits. A driver is the
//! one place every input and every effect passes, so tracing and trace recording hook in
//! here (`Observer`), and the ordering rules of the effects are carried out here:
//! log records are written and synced before the master hears `LogSynced`, and storage
//! operations complete before the chunkserver hears `StoreDone`.

pub mod chunkserver;
pub mod master;

use std::fmt::Debug;

use crate::error::StoreError;
use crate::types::Time;

/// Sees every input a driver feeds its state machine, and every effect it gets back.
pub trait Observer: Send + 'static {
    fn input(&mut self, _now: Time, _input: &dyn Debug) {}
    fn effects(&mut self, _now: Time, _effects: &dyn Debug) {}
}

/// Observes nothing.
pub struct Quiet;
impl Observer for Quiet {}

/// Logs every input and effect at trace level.
pub struct Tracing(pub String);
impl Observer for Tracing {
    fn input(&mut self, now: Time, input: &dyn Debug) {
        tracing::trace!(node = %self.0, now = now.0, ?input, "input");
    }
    fn effects(&mut self, now: Time, effects: &dyn Debug) {
        tracing::trace!(node = %self.0, now = now.0, ?effects, "effects");
    }
}

/// Why a server stopped. Every stop is a crash: the next start recovers.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("storage failed: {0}")]
    Store(#[from] StoreError),
    #[error("cannot listen: {0}")]
    Listen(#[from] crate::error::RpcError),
    #[error("recovery failed: {0}")]
    Recovery(String),
}
