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

    /// On tokio's blocking threads: the workers that run every server's tasks in one
    /// process (`tessera dev`) go on meanwhile.
    fn run_blocking<F, T>(&self, f: F) -> impl Future<Output = T> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let done = tokio::task::spawn_blocking(f);
        async move {
            match done.await {
                Ok(v) => v,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // The runtime is shutting down: so is every task awaiting this.
                Err(e) => panic!("blocking work cancelled: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work run blocking holds up no task, even on a runtime of one thread; its result
    /// and its panic come back to the task that awaits it.
    #[test]
    fn blocking_work_holds_up_no_task() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // The work waits for word from a task that can run only if the work holds up
            // no thread the runtime needs.
            let (tx, rx) = std::sync::mpsc::channel();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                tx.send(()).unwrap()
            });
            let heard = TokioRuntime
                .run_blocking(move || rx.recv_timeout(Duration::from_secs(20)).is_ok())
                .await;
            assert!(heard, "the task waited for the work to end");
            let p = tokio::spawn(TokioRuntime.run_blocking(|| -> u32 { panic!("planted") }));
            let e = p.await.expect_err("the panic comes back");
            assert!(e.is_panic());
        });
    }
}
