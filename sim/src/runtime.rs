//! `Runtime` over madsim: its time, tasks and seeded random source, plus this node's
//! clock error. madsim has one global clock; each node's clock here reads it through a
//! fixed offset and a rate error (drift), both chosen by the seed. Leases measure
//! durations on one node's clock, so offsets cancel and only drift matters; the
//! cluster's `max_clock_skew` must cover drift over one lease period, plus any step the
//! clock takes: a node's clock can also jump forward or back (as a system clock stepped
//! by NTP does), by an amount the fault scheduler sets in its `jump`.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use madsim::time::Instant;
use tessera_core::runtime::Runtime;
use tessera_core::types::Time;

/// Where every node's clock starts, so a negative offset still reads as a valid `Time`.
const EPOCH_MS: i64 = 1_000_000;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Clock {
    /// Constant offset from true time, in milliseconds.
    pub offset_ms: i64,
    /// Rate error in parts per million (+100: the clock runs 0.01% fast).
    pub drift_ppm: i64,
}

impl Clock {
    /// This clock's reading at true elapsed time `true_ms`.
    pub fn local(&self, true_ms: i64) -> i64 {
        EPOCH_MS + self.offset_ms + true_ms + true_ms * self.drift_ppm / 1_000_000
    }

    /// The true elapsed time at which this clock reads `local_ms`.
    pub fn true_time(&self, local_ms: i64) -> i64 {
        (local_ms - EPOCH_MS - self.offset_ms) * 1_000_000 / (1_000_000 + self.drift_ppm)
    }
}

/// How far a node's clock has been stepped (ms, + is ahead), shared by the node's
/// runtime, its observer and the fault scheduler. It outlives the node's restarts, as a
/// machine's clock does.
#[derive(Clone, Debug, Default)]
pub struct Jump(Arc<AtomicI64>);

impl Jump {
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }

    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::Relaxed);
    }
}

#[derive(Clone)]
pub struct SimRuntime {
    start: Instant,
    pub clock: Clock,
    pub jump: Jump,
}

impl SimRuntime {
    /// `start` is the world's start, shared by every node.
    pub fn new(start: Instant, clock: Clock) -> SimRuntime {
        SimRuntime::with_jump(start, clock, Jump::default())
    }

    /// A runtime whose clock is also stepped by `jump`.
    pub fn with_jump(start: Instant, clock: Clock, jump: Jump) -> SimRuntime {
        SimRuntime { start, clock, jump }
    }

    pub fn true_ms(&self) -> i64 {
        self.start.elapsed().as_millis() as i64
    }
}

impl Runtime for SimRuntime {
    fn now(&self) -> Time {
        Time((self.clock.local(self.true_ms()) + self.jump.get()).max(0) as u64)
    }

    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send {
        madsim::time::sleep(d)
    }

    fn spawn<F>(&self, f: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        madsim::task::spawn(f);
    }

    fn random_u64(&self) -> u64 {
        madsim::rand::random()
    }
}
