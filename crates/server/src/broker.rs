//! The broker core that gRPC handlers call: validated requests in, results
//! out. It owns the group-commit batchers (one per kind of write); what
//! happens after a lease ends is [`crate::settle`]'s, and streams and credit
//! are the dispatcher's.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use crate::dispatch::{DeliveryStream, Dispatcher, Handoff, StreamId, SubscriptionStream};
use crate::domain::{
    AckReq, ExtendReq, JobId, LeaseToken, NackReq, NewJob, QueueName, Schedule, Subscription,
};
use crate::error::{Error, Result};
use crate::settle::{Ending, Settle};
use crate::store::batch::Batcher;
use crate::store::{Enqueued, FailReq, Store};

/// Most rows one group-commit statement carries.
const MAX_BATCH_ROWS: usize = 2000;
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
    pub fn new(store: Store, dispatcher: Dispatcher, batch_concurrency: usize) -> Arc<Broker> {
        let settle = dispatcher.settle().clone();
        let enqueue = {
            let (dispatcher, known) = (dispatcher.clone(), KnownQueues::default());
            Batcher::new(
                "enqueue",
                MAX_BATCH_ROWS,
                batch_concurrency,
                |r: &Vec<NewJob>| r.len(),
                move |reqs| enqueue(dispatcher.clone(), known.clone(), reqs),
            )
        };
        let ack = {
            let settle = settle.clone();
            Batcher::new(
                "ack",
                MAX_BATCH_ROWS,
                batch_concurrency,
                |r: &Vec<AckReq>| r.len(),
                move |reqs| ack(settle.clone(), reqs),
            )
        };
        let nack = {
            let settle = settle.clone();
            Batcher::new(
                "nack",
                MAX_BATCH_ROWS,
                batch_concurrency,
                |_| 1,
                move |reqs| nack(settle.clone(), reqs),
            )
        };
        let extend = {
            let (store, dispatcher) = (store.clone(), dispatcher.clone());
            Batcher::new(
                "extend",
                MAX_BATCH_ROWS,
                batch_concurrency,
                |_| 1,
                move |reqs| extend(store.clone(), dispatcher.clone(), reqs),
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

    pub fn settle(&self) -> &Settle {
        self.dispatcher.settle()
    }

    pub async fn enqueue(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.enqueue.call(jobs).await
    }

    pub async fn subscribe(&self, sub: Subscription) -> Result<SubscriptionStream> {
        self.ready_to_stream(&sub).await?;
        Ok(self.dispatcher.subscribe(sub))
    }

    /// Opens a Consume stream: its id (to change its credit or close it) and
    /// its deliveries.
    pub async fn consume(&self, sub: Subscription) -> Result<(StreamId, DeliveryStream)> {
        self.ready_to_stream(&sub).await?;
        Ok(self.dispatcher.open_consumer(sub))
    }

    async fn ready_to_stream(&self, sub: &Subscription) -> Result<()> {
        if self.is_draining() {
            return Err(Error::Draining);
        }
        // Queue rows carry the default lease; make sure they exist.
        Store::ensure_queues(&self.store.pool, &sub.queues).await
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

/// Queue rows known to exist, so enqueues create them only once.
#[derive(Clone, Default)]
struct KnownQueues(Arc<Mutex<HashSet<QueueName>>>);

/// One enqueue statement for many requests. Jobs due now whose queue has an
/// idle stream here are handed off to it (see `dispatch::offers`); the rest
/// wake their queues here and on every replica after the commit.
async fn enqueue(
    dispatcher: Dispatcher,
    known: KnownQueues,
    reqs: Vec<Vec<NewJob>>,
) -> Result<Vec<Result<Vec<Enqueued>>>> {
    let sizes: Vec<usize> = reqs.iter().map(Vec::len).collect();
    let jobs: Vec<NewJob> = reqs.into_iter().flatten().collect();
    let new_queues: Vec<QueueName> = {
        let known = known.0.lock().expect("poisoned");
        let mut seen = HashSet::new();
        jobs.iter()
            .map(|j| &j.queue)
            .filter(|q| !known.contains(*q) && seen.insert(*q))
            .cloned()
            .collect()
    };
    let offers = dispatcher.offers();
    let claims: Vec<Option<crate::dispatch::Claim>> = jobs
        .iter()
        .map(|j| match j.schedule {
            Schedule::Now => offers.claim(&j.queue),
            _ => None,
        })
        .collect();
    let to: Vec<Option<crate::store::HandoffTo>> = claims
        .iter()
        .map(|c| c.as_ref().map(|c| c.to.clone()))
        .collect();
    let settle = dispatcher.settle();
    let result = settle.store().enqueue(&jobs, &to, &new_queues).await;
    // Every claim is reported, used or not, so its credit is accounted for.
    // `index` maps a job's place in the request to its claim's.
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut used = Vec::new();
    for (i, c) in claims.into_iter().enumerate() {
        if let Some(c) = c {
            index.insert(i, used.len());
            used.push(c);
        }
    }
    let claims = used;
    let out = match result {
        Ok(out) => out,
        Err(e) => {
            dispatcher.handed(Handoff {
                claims,
                leased: Vec::new(),
            });
            return Err(e);
        }
    };
    let mut handed = out.handed;
    for job in &mut handed {
        // From the job's index in the request to its claim's.
        job.slot = index[&(job.slot as usize)] as i32;
    }
    dispatcher.handed(Handoff {
        claims,
        leased: handed,
    });
    settle.store().metrics.on_enqueued(&jobs, &out.results);
    known.0.lock().expect("poisoned").extend(new_queues);
    settle.wake(out.wakes);
    let mut it = out.results.into_iter();
    Ok(sizes
        .into_iter()
        .map(|n| Ok(it.by_ref().take(n).collect()))
        .collect())
}

async fn ack(settle: Settle, reqs: Vec<Vec<AckReq>>) -> Result<Vec<Result<Vec<Result<()>>>>> {
    let all: Vec<AckReq> = reqs.iter().flatten().copied().collect();
    let done = settle.ack(&all).await?;
    // Keyed by (job, token): two acks of one job with different tokens may
    // share a statement, and only the current token's ack succeeded.
    let acked: HashSet<(JobId, LeaseToken)> = done.iter().map(|s| (s.id, s.token)).collect();
    Ok(reqs
        .iter()
        .map(|batch| {
            Ok(batch
                .iter()
                .map(|r| {
                    if acked.contains(&(r.job_id, r.token)) {
                        Ok(())
                    } else {
                        Err(Error::StaleLease(r.job_id.0))
                    }
                })
                .collect())
        })
        .collect())
}

async fn nack(settle: Settle, reqs: Vec<NackReq>) -> Result<Vec<Result<bool>>> {
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
    let done = settle.fail(&fails, Ending::Nacked).await?;
    let dead: HashMap<JobId, bool> = done.iter().map(|f| (f.id, f.death.is_some())).collect();
    Ok(reqs
        .iter()
        .map(|r| {
            dead.get(&r.job_id)
                .copied()
                .ok_or(Error::StaleLease(r.job_id.0))
        })
        .collect())
}

async fn extend(
    store: Store,
    dispatcher: Dispatcher,
    reqs: Vec<ExtendReq>,
) -> Result<Vec<Result<DateTime<Utc>>>> {
    let done = store.extend(&reqs).await?;
    store.metrics.stale_tokens.add(reqs.len() - done.len());
    // A broker whose stream holds a job extended on another replica learns
    // the new deadline when it checks the lease at the old one.
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
                .ok_or(Error::StaleLease(r.job_id.0))
        })
        .collect())
}
