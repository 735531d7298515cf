//! The broker core that gRPC handlers call: validated requests in, results
//! out. It owns the group-commit batchers (one per kind of write) and talks to
//! the dispatcher for wake-ups and credit.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use crate::dispatch::{Dispatcher, SubscriptionStream, wakes_for};
use crate::domain::{
    AckReq, ExtendReq, JobId, LeaseToken, NackReq, NewJob, QueueName, Subscription,
};
use crate::error::{Error, Result};
use crate::store::batch::Batcher;
use crate::store::{Enqueued, FailReq, Store, Wake};

/// Most rows one group-commit statement carries.
const MAX_BATCH_ROWS: usize = 2000;
/// Statements in flight per batcher.
const BATCH_CONCURRENCY: usize = 4;

pub struct Broker {
    store: Store,
    dispatcher: Dispatcher,
    enqueue: Batcher<Vec<NewJob>, Vec<Enqueued>>,
    /// One request per Ack or AckBatch call; one result per ack in it.
    ack: Batcher<Vec<AckReq>, Vec<Result<()>>>,
    nack: Batcher<NackReq, bool>,
    extend: Batcher<ExtendReq, DateTime<Utc>>,
    /// Set at the first moment of a drain: new streams are refused.
    draining: AtomicBool,
}

impl Broker {
    pub fn new(store: Store, dispatcher: Dispatcher) -> Arc<Broker> {
        // Queue rows known to exist, so enqueues create them only once.
        let known: Arc<Mutex<HashSet<QueueName>>> = Default::default();
        let enqueue = {
            let store = store.clone();
            let dispatcher = dispatcher.clone();
            Batcher::spawn(
                "enqueue",
                MAX_BATCH_ROWS,
                BATCH_CONCURRENCY,
                |r: &Vec<NewJob>| r.len(),
                move |reqs: Vec<Vec<NewJob>>| {
                    let store = store.clone();
                    let dispatcher = dispatcher.clone();
                    let known = known.clone();
                    async move {
                        let sizes: Vec<usize> = reqs.iter().map(Vec::len).collect();
                        let jobs: Vec<NewJob> = reqs.into_iter().flatten().collect();
                        let new_queues: Vec<QueueName> = {
                            let known = known.lock().expect("poisoned");
                            let mut seen = HashSet::new();
                            jobs.iter()
                                .map(|j| &j.queue)
                                .filter(|q| !known.contains(*q) && seen.insert(*q))
                                .cloned()
                                .collect()
                        };
                        let (results, wakes) = store.enqueue(&jobs, &new_queues).await?;
                        store.metrics.on_enqueued(&results);
                        known.lock().expect("poisoned").extend(new_queues);
                        dispatcher.wake(wakes);
                        let mut it = results.into_iter();
                        Ok(sizes
                            .into_iter()
                            .map(|n| Ok(it.by_ref().take(n).collect()))
                            .collect())
                    }
                },
            )
        };
        let ack = {
            let store = store.clone();
            let dispatcher = dispatcher.clone();
            Batcher::spawn(
                "ack",
                MAX_BATCH_ROWS,
                BATCH_CONCURRENCY,
                |r: &Vec<AckReq>| r.len(),
                move |reqs: Vec<Vec<AckReq>>| {
                    let store = store.clone();
                    let dispatcher = dispatcher.clone();
                    async move {
                        let all: Vec<AckReq> = reqs.iter().flatten().copied().collect();
                        let done = store.ack(&all).await?;
                        store
                            .metrics
                            .on_settled(&store.metrics.acked, all.len(), done.len(), 0);
                        // Keyed by (job, token): two acks of one job with
                        // different tokens may share a statement, and only
                        // the current token's ack succeeded.
                        let acked: HashSet<(JobId, LeaseToken)> =
                            done.iter().map(|s| (s.id, s.token)).collect();
                        settle_credit(
                            &store,
                            &dispatcher,
                            done.iter().map(|s| (s.broker, s.id, s.token)),
                        )
                        .await;
                        // Queues with a concurrency limit have a free slot:
                        // wake their consumers on every replica.
                        let freed: HashSet<&QueueName> =
                            done.iter().filter_map(|s| s.slot_freed.as_ref()).collect();
                        if !freed.is_empty() {
                            let wakes: Vec<Wake> = freed
                                .into_iter()
                                .map(|q| Wake {
                                    queue: q.clone(),
                                    delay_ms: 0,
                                })
                                .collect();
                            if let Err(e) = store.notify_wake(&store.pool, &wakes).await {
                                tracing::warn!(error = %e, "wake notification failed");
                            }
                            dispatcher.wake(wakes);
                        }
                        Ok(reqs
                            .iter()
                            .map(|batch| {
                                Ok(batch
                                    .iter()
                                    .map(|r| {
                                        if acked.contains(&(r.job_id, r.token)) {
                                            Ok(())
                                        } else {
                                            Err(Error::StaleLease(r.job_id))
                                        }
                                    })
                                    .collect())
                            })
                            .collect())
                    }
                },
            )
        };
        let nack = {
            let store = store.clone();
            let dispatcher = dispatcher.clone();
            Batcher::spawn(
                "nack",
                MAX_BATCH_ROWS,
                BATCH_CONCURRENCY,
                |_| 1,
                move |reqs: Vec<NackReq>| {
                    let store = store.clone();
                    let dispatcher = dispatcher.clone();
                    async move {
                        let fails: Vec<FailReq> = reqs
                            .iter()
                            .map(|r| FailReq {
                                id: r.job_id,
                                token: r.token,
                                error: r.error.clone(),
                                retry_after_ms: r.retry_after_ms,
                                dead_letter: r.dead_letter,
                                refund: false,
                            })
                            .collect();
                        let done = store.fail(&fails).await?;
                        let dead = done.iter().filter(|f| f.death.is_some()).count();
                        store.metrics.on_settled(
                            &store.metrics.nacked,
                            reqs.len(),
                            done.len(),
                            dead,
                        );
                        let wakes = wakes_for(&done);
                        if let Err(e) = store.notify_wake(&store.pool, &wakes).await {
                            tracing::warn!(error = %e, "wake notification failed");
                        }
                        dispatcher.wake(wakes);
                        let tokens: HashMap<JobId, LeaseToken> =
                            reqs.iter().map(|r| (r.job_id, r.token)).collect();
                        settle_credit(
                            &store,
                            &dispatcher,
                            done.iter().map(|f| (f.broker, f.id, tokens[&f.id])),
                        )
                        .await;
                        let dead: HashMap<JobId, bool> =
                            done.iter().map(|f| (f.id, f.death.is_some())).collect();
                        Ok(reqs
                            .iter()
                            .map(|r| {
                                dead.get(&r.job_id)
                                    .copied()
                                    .ok_or(Error::StaleLease(r.job_id))
                            })
                            .collect())
                    }
                },
            )
        };
        let extend = {
            let store = store.clone();
            let dispatcher = dispatcher.clone();
            Batcher::spawn(
                "extend",
                MAX_BATCH_ROWS,
                BATCH_CONCURRENCY,
                |_| 1,
                move |reqs: Vec<ExtendReq>| {
                    let store = store.clone();
                    let dispatcher = dispatcher.clone();
                    async move {
                        let done = store.extend(&reqs).await?;
                        store.metrics.stale_tokens.add(reqs.len() - done.len());
                        // A broker whose stream holds a job extended on
                        // another replica learns the new deadline when it
                        // checks the lease at the old one.
                        for e in done.iter().filter(|e| e.broker == Some(store.broker_id)) {
                            dispatcher.extended(e.id, e.lease_ms);
                        }
                        let until: HashMap<JobId, DateTime<Utc>> =
                            done.iter().map(|e| (e.id, e.lease_expires_at)).collect();
                        Ok(reqs
                            .iter()
                            .map(|r| {
                                until
                                    .get(&r.job_id)
                                    .copied()
                                    .ok_or(Error::StaleLease(r.job_id))
                            })
                            .collect())
                    }
                },
            )
        };
        Arc::new(Broker {
            store,
            dispatcher,
            enqueue,
            ack,
            nack,
            extend,
            draining: AtomicBool::new(false),
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    pub async fn enqueue(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.enqueue.call(jobs).await
    }

    pub async fn subscribe(&self, sub: Subscription) -> Result<SubscriptionStream> {
        if self.is_draining() {
            return Err(Error::Draining);
        }
        // Queue rows carry the default lease; make sure they exist.
        Store::ensure_queues(&self.store.pool, &sub.queues).await?;
        Ok(self.dispatcher.subscribe(sub))
    }

    pub async fn ack(&self, req: AckReq) -> Result<()> {
        self.ack_many(vec![req])
            .await?
            .pop()
            .ok_or(Error::Internal("ack lost its result"))?
    }

    /// Acks many jobs in one group-commit unit; one result per ack, in order.
    pub async fn ack_many(&self, reqs: Vec<AckReq>) -> Result<Vec<Result<()>>> {
        self.ack.call(reqs).await
    }

    /// Returns whether the job was dead-lettered.
    pub async fn nack(&self, req: NackReq) -> Result<bool> {
        self.nack.call(req).await
    }

    pub async fn extend(&self, req: ExtendReq) -> Result<DateTime<Utc>> {
        self.extend.call(req).await
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Refuses new streams, then releases every unsettled job and ends every
    /// stream with UNAVAILABLE.
    pub async fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.dispatcher.drain().await;
    }
}

/// Gives streams their credit back: in-process for our own leases, by NOTIFY
/// for leases held by streams of other replicas.
async fn settle_credit(
    store: &Store,
    dispatcher: &Dispatcher,
    settled: impl Iterator<Item = (Option<uuid::Uuid>, JobId, LeaseToken)>,
) {
    let mut local = Vec::new();
    let mut remote = Vec::new();
    for (broker, id, token) in settled {
        match broker {
            Some(b) if b != store.broker_id => remote.push((b, id, token)),
            _ => local.push((id, token)),
        }
    }
    dispatcher.settled(local);
    if !remote.is_empty()
        && let Err(e) = store.notify_settled(&remote).await
    {
        tracing::warn!(error = %e, "settle notification failed; credit returns at lease expiry");
    }
}
