//! `Runtime` on tokio and the system clock.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tessera_core::runtime::Runtime;
use tessera_core::types::Time;

#[derive(Clone, Copy, Debug, Default)]
pub struct TokioRuntime;

impl Runtime for TokioRuntime {
    fn now(&self) -> Time {
        // Milliseconds since the Unix epoch: every node's clock, within the skew the
        // master is configured to allow.
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        Time(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }

    fn spawn<F>(&self, f: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(f);
    }

    fn random_u64(&self) -> u64 {
        rand::random()
    }
}
