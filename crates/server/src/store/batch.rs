//! Group commit: concurrent callers share one statement.
//!
//! A [`Batcher`] owns a task that takes every request queued while the previous
//! statements were running and executes them together. Up to `concurrency`
//! statements run at once; while they do, new requests pile up and form the
//! next, larger batch, so batch size adapts to load with no timer and no added
//! latency when idle. Each caller is answered only after the statement holding
//! its row has committed.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::error::{Error, Result};

type Reply<R> = oneshot::Sender<Result<R>>;

/// A handle to a batching task. Cheap to clone.
pub struct Batcher<Req, Resp> {
    /// Requests waiting for the next batch. Bounded so a stalled database
    /// pushes back on callers instead of growing memory without limit.
    tx: mpsc::Sender<(Req, Reply<Resp>)>,
}

impl<Req, Resp> Clone for Batcher<Req, Resp> {
    fn clone(&self) -> Self {
        Batcher {
            tx: self.tx.clone(),
        }
    }
}

impl<Req, Resp> Batcher<Req, Resp>
where
    Req: Send + 'static,
    Resp: Send + 'static,
{
    /// Spawns the batching task. `weight` is how many rows a request adds to a
    /// batch (an EnqueueBatch request carries many); a batch stops growing at
    /// `max_rows`. `exec` runs one batch and returns one result per request,
    /// in order. The task ends when every handle is dropped.
    pub fn spawn<F, Fut>(
        name: &'static str,
        max_rows: usize,
        concurrency: usize,
        weight: fn(&Req) -> usize,
        exec: F,
    ) -> Self
    where
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Result<Resp>>>> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::channel::<(Req, Reply<Resp>)>(max_rows.max(1) * 4);
        let exec = Arc::new(exec);
        // Bounds the statements in flight for this batcher (and so its share
        // of the connection pool).
        let permits = Arc::new(Semaphore::new(concurrency.max(1)));
        tokio::spawn(async move {
            let mut carry: Option<(Req, Reply<Resp>)> = None;
            loop {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let first = match carry.take() {
                    Some(item) => item,
                    None => match rx.recv().await {
                        Some(item) => item,
                        None => return,
                    },
                };
                let mut rows = weight(&first.0);
                let mut reqs = vec![first.0];
                let mut replies = vec![first.1];
                while rows < max_rows {
                    match rx.try_recv() {
                        Ok(item) => {
                            let w = weight(&item.0);
                            if rows + w > max_rows {
                                carry = Some(item);
                                break;
                            }
                            rows += w;
                            reqs.push(item.0);
                            replies.push(item.1);
                        }
                        Err(_) => break,
                    }
                }
                tracing::trace!(batcher = name, requests = reqs.len(), rows, "batch");
                let exec = exec.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    match exec(reqs).await {
                        Ok(results) => {
                            debug_assert_eq!(results.len(), replies.len());
                            for (reply, result) in replies.into_iter().zip(results) {
                                let _ = reply.send(result);
                            }
                        }
                        Err(e) => {
                            for reply in replies {
                                let _ = reply.send(Err(e.clone()));
                            }
                        }
                    }
                });
            }
        });
        Batcher { tx }
    }

    /// Queues one request and waits for its result.
    pub async fn call(&self, req: Req) -> Result<Resp> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((req, reply))
            .await
            .map_err(|_| Error::Internal("batcher stopped"))?;
        rx.await.map_err(|_| Error::Internal("batch dropped"))?
    }
}
