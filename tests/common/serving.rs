//! A Rust SDK worker serving in the test process until told to stop
//! (tests/client_effects.rs, tests/client_results.rs).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leaseq_client::{Worker, WorkerStats};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A worker serving until [`Serving::stop`].
pub struct Serving {
    stop: oneshot::Sender<()>,
    handle: JoinHandle<Result<(), tonic::Status>>,
    stats: Arc<WorkerStats>,
}

impl Serving {
    pub fn start(worker: Worker) -> Serving {
        let stats = worker.stats();
        let (stop, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(worker.serve(async move {
            let _ = rx.await;
        }));
        Serving {
            stop,
            handle,
            stats,
        }
    }

    /// Stops the worker (within 20 s, cleanly) and returns its counters.
    pub async fn stop(self) -> Arc<WorkerStats> {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(20), self.handle)
            .await
            .expect("the worker stops")
            .expect("the worker's task")
            .expect("the worker ends cleanly");
        self.stats
    }
}

/// A counter's value.
pub fn n(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}
