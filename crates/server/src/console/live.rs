//! The live view's one sampler per broker.
//!
//! Every browser on `/api/events` is shown the same snapshots, so they share
//! one WatchQueues stream (the AdminService's own: a statistics query a
//! second, a message when counts change and at least every 5 s). Before,
//! each browser connection started a WatchQueues of its own: one full-backlog
//! count a second per browser, on the broker's small auxiliary pool that the
//! health ping and the reaper share, so a few tabs left open by any logged-in
//! token could starve them (issue 32).
//!
//! The sampler starts with the first browser and stops when the last one
//! leaves (a `watch` channel's receivers are the browsers). Each browser's
//! connection then filters the shared snapshot by its own token's grants.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_stream::StreamExt as _;

use super::Console;
use crate::pb;
use crate::pb::admin_service_server::AdminService;

/// What the browsers are shown.
#[derive(Clone, Debug)]
pub enum Snapshot {
    /// No sample yet.
    Pending,
    /// The latest sample, with the deployment's rates per queue at that moment.
    Queues(Arc<Sampled>),
    /// The sampler ended with this error (every cluster down, a drain); the
    /// next browser to connect starts another.
    Failed(String),
}

#[derive(Debug)]
pub struct Sampled {
    pub watch: pb::WatchQueuesResponse,
    /// Per queue, (enqueued, acked) per second over the whole deployment.
    pub rates: std::collections::HashMap<String, (f64, f64)>,
}

/// The shared sampler of one broker's console.
pub struct Live {
    tx: watch::Sender<Snapshot>,
    /// Whether a sampler task runs. Taken when a browser subscribes and when
    /// the task decides to stop, so that a browser arriving as the last one
    /// leaves is never left without a sampler.
    running: Mutex<bool>,
}

impl Default for Live {
    fn default() -> Self {
        Live {
            tx: watch::Sender::new(Snapshot::Pending),
            running: Mutex::new(false),
        }
    }
}

impl Live {
    /// A receiver of the snapshots, starting the sampler if none runs.
    pub fn subscribe(self: &Arc<Self>, console: &Console) -> watch::Receiver<Snapshot> {
        let mut running = self.running.lock().expect("poisoned");
        let rx = self.tx.subscribe();
        if !*running {
            *running = true;
            // A failure from the last sampler is not news to this browser.
            self.tx.send_replace(Snapshot::Pending);
            tokio::spawn(Arc::clone(self).sample(console.clone()));
        }
        rx
    }

    async fn sample(self: Arc<Self>, console: Console) {
        let ended = |live: &Live, why: Option<String>| {
            let mut running = live.running.lock().expect("poisoned");
            *running = false;
            if let Some(why) = why {
                live.tx.send_replace(Snapshot::Failed(why));
            }
        };
        let watch = console
            .api
            .watch_queues(tonic::Request::new(pb::WatchQueuesRequest {
                queues: Vec::new(),
                interval: Some(prost_types::Duration {
                    seconds: 5,
                    nanos: 0,
                }),
            }))
            .await;
        let watch = match watch {
            Ok(w) => w.into_inner(),
            Err(status) => return ended(&self, Some(status.message().to_owned())),
        };
        let mut watch = std::pin::pin!(watch);
        loop {
            let msg = tokio::select! {
                _ = console.shutdown.cancelled() => return ended(&self, None),
                _ = self.tx.closed() => {
                    // The last browser left; stop unless one arrived since.
                    let mut running = self.running.lock().expect("poisoned");
                    if self.tx.receiver_count() == 0 {
                        *running = false;
                        return;
                    }
                    continue;
                }
                m = watch.next() => m,
            };
            match msg {
                Some(Ok(m)) => {
                    let rates = tokio::time::timeout(Duration::from_secs(5), console.rates())
                        .await
                        .unwrap_or_default();
                    self.tx
                        .send_replace(Snapshot::Queues(Arc::new(Sampled { watch: m, rates })));
                }
                Some(Err(status)) => return ended(&self, Some(status.message().to_owned())),
                None => return ended(&self, Some("the broker is shutting down".into())),
            }
        }
    }
}
