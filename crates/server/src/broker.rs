//! The broker core that gRPC handlers call: validated requests in, results
//! out. It owns the group-commit batchers (one per kind of write); what
//! happens after a lease ends is [`crate::settle`]'s, and streams and credit
//! are the dispatcher's.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use crate::dispatch::{DeliveryStream, Dispatcher, StreamId, SubscriptionStream};
use crate::domain::{
    AckReq, ClusterId, Enqueued, ExtendReq, FailReq, FastSet, JobId, NackReq, NewJob, ProgressReq,
    QueueName, Schedule, Subscription,
};
use crate::error::{Error, Result};
use crate::placement::Clusters;
use crate::settle::{Ending, Settle};
use crate::store::Store;
use crate::store::batch::Batcher;

/// Most rows one group-commit statement carries.
const MAX_BATCH_ROWS: usize = 2000;
/// With an insert statement running, a second one starts only once this
/// many rows wait (see [`Batcher::with_spill`]). Single Enqueue calls then
/// share one statement and one commit instead of splitting over two, which
/// on a 2-core machine cut PostgreSQL's work per job by a quarter for 64
/// single-Enqueue clients; EnqueueBatch calls of 100 jobs or more still
/// overlap (docs/BENCHMARKS.md, "Enqueue statements in flight").
const ENQUEUE_SPILL_ROWS: usize = 100;
pub struct Broker {
    clusters: Clusters,
    dispatcher: Dispatcher,
    /// One set of batchers per cluster: a statement never spans clusters,
    /// so a cluster that is down fails only its own callers
    /// (docs/SCALING.md). One database: one lane, as before.
    lanes: HashMap<ClusterId, Lane>,
    /// Cancelled at the first moment of a drain: new streams are refused,
    /// Produce streams stop reading.
    draining: tokio_util::sync::CancellationToken,
    /// How long a Consume stream's ack may wait for company.
    ack_linger: std::time::Duration,
}

/// The group-commit batchers of one cluster.
struct Lane {
    enqueue: Batcher<Vec<NewJob>, Vec<Enqueued>>,
    /// One request per Ack or AckBatch call; one result per ack in it.
    ack: Batcher<Vec<AckReq>, Vec<Result<()>>>,
    nack: Batcher<NackReq, bool>,
    extend: Batcher<ExtendReq, DateTime<Utc>>,
}

impl Lane {
    fn new(
        store: Store,
        dispatcher: &Dispatcher,
        batch_concurrency: usize,
        ack_linger: std::time::Duration,
    ) -> Lane {
        let settle = dispatcher.settle().clone();
        let enqueue = {
            let (dispatcher, store, known) =
                (dispatcher.clone(), store.clone(), KnownQueues::default());
            Batcher::new(
                "enqueue",
                MAX_BATCH_ROWS,
                batch_concurrency,
                |r: &Vec<NewJob>| r.len(),
                move |reqs| enqueue(dispatcher.clone(), store.clone(), known.clone(), reqs),
            )
            .with_spill(ENQUEUE_SPILL_ROWS)
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
            .with_linger(ack_linger)
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
            let dispatcher = dispatcher.clone();
            Batcher::new(
                "extend",
                MAX_BATCH_ROWS,
                batch_concurrency,
                |_| 1,
                move |reqs| extend(store.clone(), dispatcher.clone(), reqs),
            )
        };
        Lane {
            enqueue,
            ack,
            nack,
            extend,
        }
    }
}

impl Broker {
    /// `batch_concurrency` and `ack_linger` as in [`crate::Config`].
    pub fn new(
        clusters: Clusters,
        dispatcher: Dispatcher,
        batch_concurrency: usize,
        ack_linger: std::time::Duration,
    ) -> Arc<Broker> {
        let lanes = clusters
            .all()
            .iter()
            .map(|s| {
                (
                    s.cluster(),
                    Lane::new(s.clone(), &dispatcher, batch_concurrency, ack_linger),
                )
            })
            .collect();
        Arc::new(Broker {
            clusters,
            dispatcher,
            lanes,
            draining: tokio_util::sync::CancellationToken::new(),
            ack_linger,
        })
    }

    /// The home cluster's store (the only one of a single-database broker):
    /// the broker id and the metrics.
    pub fn store(&self) -> &Store {
        self.clusters.home()
    }

    pub fn clusters(&self) -> &Clusters {
        &self.clusters
    }

    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    pub fn settle(&self) -> &Settle {
        self.dispatcher.settle()
    }

    /// An outage of cluster `c` names it (several clusters only: one
    /// database answers as before).
    fn named<T>(&self, c: ClusterId, r: Result<T>) -> Result<T> {
        match (&r, self.clusters.is_single()) {
            (Err(e), false) if e.is_unavailable() => {
                let name = self
                    .clusters
                    .get(c)
                    .map_or_else(|| c.to_string(), |s| s.cluster_name().to_string());
                r.map_err(|e| e.on_cluster(&name))
            }
            _ => r,
        }
    }

    fn lane(&self, cluster: ClusterId) -> Result<&Lane> {
        self.lanes
            .get(&cluster)
            .ok_or(Error::ClusterUnknown(cluster.0))
    }

    /// Enqueues jobs, all or none, on their queues' cluster. Jobs whose
    /// queues live on different clusters are refused with INVALID_ARGUMENT
    /// naming the first one off (`jobs[3].queue`), and nothing is written:
    /// one transaction cannot span clusters (docs/SCALING.md).
    pub async fn enqueue(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        // One snapshot of the placement for the whole batch (several
        // clusters only): every job is judged by the same map.
        let map = (!self.clusters.is_single()).then(|| self.clusters.map());
        let cluster_of = |q: &QueueName| match &map {
            Some(m) => m.cluster_of(q.as_str()),
            None => self.clusters.cluster_of(q),
        };
        let cluster = match jobs.first() {
            Some(first) => cluster_of(&first.queue),
            None => ClusterId::HOME,
        };
        if map.is_some()
            && let Some(i) = jobs.iter().position(|j| cluster_of(&j.queue) != cluster)
        {
            return Err(Error::invalid(
                format!("jobs[{i}].queue"),
                format!(
                    "queue {:?} is on another PostgreSQL cluster than jobs[0].queue {:?}; a batch is one transaction on one cluster (pin the queues together, or send one batch per cluster)",
                    jobs[i].queue.as_str(),
                    jobs[0].queue.as_str()
                ),
            ));
        }
        let r = self.lane(cluster)?.enqueue.call(jobs).await;
        self.named(cluster, r)
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
        // Queue rows carry the default lease; make sure they exist, each on
        // its queue's cluster. A stream over several clusters opens while
        // one of them is down (its queues wait; a queue with jobs there has
        // its row already), unless all of them are.
        let mut opened = false;
        let mut down = None;
        for (c, queues) in self
            .clusters
            .group(sub.queues.iter().cloned(), |q| self.clusters.cluster_of(q))
        {
            let store = self.clusters.get(c).ok_or(Error::ClusterUnknown(c.0))?;
            match self.named(c, Store::ensure_queues(store.pool(), &queues).await) {
                Ok(()) => opened = true,
                Err(e) if e.is_unavailable() => down = down.or(Some(e)),
                Err(e) => return Err(e),
            }
        }
        match down {
            Some(e) if !opened => Err(e),
            _ => Ok(()),
        }
    }

    pub async fn ack(&self, req: AckReq) -> Result<()> {
        self.ack_many(vec![req])
            .await?
            .pop()
            .ok_or(Error::Internal("ack lost its result"))?
    }

    /// Acks many jobs; one result per ack, in order. Each cluster's acks
    /// are one group-commit unit of that cluster's batcher; with acks on
    /// several clusters, those of a cluster that failed get its error and
    /// the others their own results.
    pub async fn ack_many(&self, reqs: Vec<AckReq>) -> Result<Vec<Result<()>>> {
        self.ack_in_lanes(reqs, false).await
    }

    /// [`Broker::ack_many`] for acks whose sender does not wait on them
    /// (a Consume stream's): at light load they linger for company (see
    /// `Batcher::call_lingering`).
    pub async fn ack_streamed(&self, reqs: Vec<AckReq>) -> Result<Vec<Result<()>>> {
        self.ack_in_lanes(reqs, true).await
    }

    async fn ack_in_lanes(&self, reqs: Vec<AckReq>, linger: bool) -> Result<Vec<Result<()>>> {
        let first = reqs.first().map_or(ClusterId::HOME, |r| r.token.1);
        if reqs.iter().all(|r| r.token.1 == first) {
            return match self.lanes.get(&first) {
                Some(lane) => {
                    let r = if linger {
                        lane.ack.call_lingering(reqs).await
                    } else {
                        lane.ack.call(reqs).await
                    };
                    self.named(first, r)
                }
                None => Ok(reqs
                    .iter()
                    .map(|r| Err(Error::StaleLease(r.job_id.0)))
                    .collect()),
            };
        }
        let n = reqs.len();
        let groups = self
            .clusters
            .group(reqs.into_iter().enumerate(), |(_, r)| r.token.1);
        let runs = groups.into_iter().map(|(c, group)| async move {
            let (places, reqs): (Vec<usize>, Vec<AckReq>) = group.into_iter().unzip();
            let results: Vec<Result<()>> = match self.lanes.get(&c) {
                Some(lane) => match self.named(c, lane.ack.call(reqs).await) {
                    Ok(results) => results,
                    Err(e) => places.iter().map(|_| Err(e.clone())).collect(),
                },
                None => reqs
                    .iter()
                    .map(|r| Err(Error::StaleLease(r.job_id.0)))
                    .collect(),
            };
            places.into_iter().zip(results).collect::<Vec<_>>()
        });
        let mut out: Vec<Option<Result<()>>> = (0..n).map(|_| None).collect();
        for (i, r) in futures_util::future::join_all(runs)
            .await
            .into_iter()
            .flatten()
        {
            out[i] = Some(r);
        }
        Ok(out
            .into_iter()
            .map(|r| r.unwrap_or(Err(Error::Internal("ack lost its result"))))
            .collect())
    }

    /// Records progress reports (one per job) whose token is current, each
    /// on the cluster its token names. Returns, per report in order, whether
    /// it was written (false: the token is not the job's current lease).
    pub async fn progress(&self, reqs: &[ProgressReq]) -> Result<Vec<bool>> {
        let mut written: FastSet<JobId> = FastSet::default();
        for (c, group) in self.clusters.group(reqs.iter(), |r| r.token.1) {
            // A token naming a cluster this broker does not have is stale.
            if let Some(store) = self.clusters.get(c) {
                let ids = self.named(c, store.progress(&group).await)?;
                written.extend(ids.into_iter().map(JobId));
            }
        }
        Ok(reqs.iter().map(|r| written.contains(&r.job_id)).collect())
    }

    /// Acks a job and inserts its follow-up jobs in one transaction on the
    /// job's cluster (`AckRequest.enqueue`): the follow-ups exist if and
    /// only if the ack committed. Returns their results, in order. Not
    /// through the ack batcher: each such ack is a transaction of its own
    /// (BEGIN, ack.sql, the insert, COMMIT), so that acks without
    /// follow-ups keep their one-statement path. Follow-ups whose queue is
    /// on another cluster than the job are refused with INVALID_ARGUMENT
    /// naming the first (`enqueue[2].queue`): one transaction cannot span
    /// clusters. A stale token is FAILED_PRECONDITION, and nothing is
    /// inserted.
    pub async fn ack_enqueue(&self, req: AckReq, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        let (cluster, job_id) = (req.token.1, req.job_id);
        let Some(store) = self.clusters.get(cluster) else {
            return Err(Error::StaleLease(req.job_id.0));
        };
        if !self.clusters.is_single() {
            let map = self.clusters.map();
            if let Some(j) = jobs
                .iter()
                .position(|j| map.cluster_of(j.queue.as_str()) != cluster)
            {
                return Err(Error::invalid(
                    format!("enqueue[{j}].queue"),
                    format!(
                        "queue {:?} is on another PostgreSQL cluster than the acked job; the ack and its follow-ups are one transaction on one cluster (pin the queues together, or enqueue it apart)",
                        jobs[j].queue.as_str()
                    ),
                ));
            }
        }
        let mut queues: Vec<QueueName> = jobs.iter().map(|j| j.queue.clone()).collect();
        queues.sort_unstable();
        queues.dedup();
        let moving = moving_dedup(&self.clusters, cluster, &jobs);
        let r = store.ack_enqueue(req, &jobs, &queues, &moving).await;
        let settle = self.settle();
        match self.named(cluster, r)? {
            None => {
                settle.acked(cluster, 1, &[]);
                Err(Error::StaleLease(job_id.0))
            }
            Some((acked, out)) => {
                settle.acked(cluster, 1, std::slice::from_ref(&acked));
                store.metrics().on_enqueued(&jobs, &out.results);
                (store.metrics().clusters).on_enqueued(store.cluster_name(), out.results.len());
                settle.wake(out.wakes);
                Ok(out.results)
            }
        }
    }

    /// Returns whether the job was dead-lettered.
    pub async fn nack(&self, req: NackReq) -> Result<bool> {
        let c = req.token.1;
        match self.lanes.get(&c) {
            Some(lane) => self.named(c, lane.nack.call(req).await),
            None => Err(Error::StaleLease(req.job_id.0)),
        }
    }

    pub async fn extend(&self, req: ExtendReq) -> Result<DateTime<Utc>> {
        let c = req.token.1;
        match self.lanes.get(&c) {
            Some(lane) => self.named(c, lane.extend.call(req).await),
            None => Err(Error::StaleLease(req.job_id.0)),
        }
    }

    /// `--ack-linger`.
    pub fn ack_linger(&self) -> std::time::Duration {
        self.ack_linger
    }

    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// Resolves once a drain has begun.
    pub async fn drain_started(&self) {
        self.draining.cancelled().await
    }

    /// Refuses new streams, then releases every unsettled job and ends every
    /// stream with UNAVAILABLE.
    pub async fn drain(&self) {
        self.draining.cancel();
        self.dispatcher.drain().await;
    }
}

/// Queue rows known to exist on this lane's cluster, so enqueues create them
/// only once; forgotten when the placement changes (a bucket moved away
/// takes its queue rows with it, and may come back).
#[derive(Clone, Default)]
struct KnownQueues(Arc<Mutex<(i64, HashSet<QueueName>)>>);

/// An enqueue's claims, by where their stream is. Every claim on a stream
/// of ours is reported, used or not, so its credit is accounted for.
struct ClaimsBySide {
    /// A job's place in the request → its claim's in `used`.
    index: HashMap<usize, usize>,
    /// A job's place in the request → another replica's stream (that
    /// replica counts its credit when the job reaches it).
    remote: HashMap<usize, (uuid::Uuid, StreamId)>,
    /// The claims on streams of this broker.
    used: Vec<crate::dispatch::Claim>,
}

impl ClaimsBySide {
    /// `claims[i]`: the claim for the request's `i`th job, if any.
    fn of(claims: Vec<Option<crate::dispatch::Claim>>) -> ClaimsBySide {
        let mut index: HashMap<usize, usize> = HashMap::new();
        let mut remote: HashMap<usize, (uuid::Uuid, StreamId)> = HashMap::new();
        let mut used = Vec::new();
        for (i, c) in claims.into_iter().enumerate() {
            let Some(c) = c else { continue };
            match c.to.broker {
                Some(b) => {
                    remote.insert(i, (b, c.stream));
                }
                None => {
                    index.insert(i, used.len());
                    used.push(c);
                }
            }
        }
        ClaimsBySide {
            index,
            remote,
            used,
        }
    }
}

/// Hand-off claims for the jobs of one enqueue statement (see
/// `dispatch::offers`): jobs due now, when the batch is checked on one
/// cluster only (`single`: a move is rare, and simpler without).
fn claim_handoffs(
    offers: &crate::dispatch::Offers,
    jobs: &[NewJob],
    single: bool,
) -> Vec<Option<crate::dispatch::Claim>> {
    // (queue, key) of the keyed jobs met so far.
    let mut keyed: HashSet<(&QueueName, &str)> = HashSet::new();
    jobs.iter()
        .map(|j| {
            let first_of_key = j.key.as_deref().is_none_or(|k| keyed.insert((&j.queue, k)));
            match (&j.schedule, &j.key) {
                (Schedule::Now, None) if single => offers.claim(&j.queue, crate::channels::fits(j)),
                // A keyed job: in a queue ordered by key the statement
                // hands it off only while its key is free (enqueue.sql).
                // Only the first job of a key in the statement, delayed or
                // not: the later ones are behind it. Only to a stream of
                // this broker: a hand-over note carries no key.
                (Schedule::Now, Some(_)) if single && first_of_key => offers.claim(&j.queue, false),
                _ => None,
            }
        })
        .collect()
}

/// One enqueue statement for many requests. Jobs due now whose queue has an
/// idle stream here, or else on another replica, are handed off to it (see
/// `dispatch::offers` and `dispatch::remote`); the rest wake their queues
/// here and on every replica after the commit.
async fn enqueue(
    dispatcher: Dispatcher,
    store: Store,
    known: KnownQueues,
    reqs: Vec<Vec<NewJob>>,
) -> Result<Vec<Result<Vec<Enqueued>>>> {
    let sizes: Vec<usize> = reqs.iter().map(Vec::len).collect();
    let jobs: Vec<NewJob> = reqs.into_iter().flatten().collect();
    let epoch = dispatcher.settle().clusters().map().epoch;
    let new_queues: Vec<QueueName> = {
        let mut known = known.0.lock().expect("poisoned");
        if known.0 != epoch {
            *known = (epoch, HashSet::new());
        }
        let mut seen = HashSet::new();
        jobs.iter()
            .map(|j| &j.queue)
            .filter(|q| !known.1.contains(*q) && seen.insert(*q))
            .cloned()
            .collect()
    };
    let moving = moving_dedup(dispatcher.settle().clusters(), store.cluster(), &jobs);
    let claims = claim_handoffs(dispatcher.offers(), &jobs, moving.is_empty());
    let to: Vec<Option<crate::domain::HandoffTo>> = claims
        .iter()
        .map(|c| c.as_ref().map(|c| c.to.clone()))
        .collect();
    let settle = dispatcher.settle();
    let ClaimsBySide {
        index,
        remote,
        used,
    } = ClaimsBySide::of(claims);
    // From here on the claims are reported exactly once: with what the
    // statement did, or (an error, a panic, this future dropped) unused.
    let mut claims = {
        let dispatcher = dispatcher.clone();
        crate::dispatch::Claims::new(used, move |h| dispatcher.handed(h))
    };
    let out = store.enqueue(&jobs, &to, &new_queues, &moving).await?;
    let mut handed = Vec::with_capacity(out.handed.len());
    let mut across = Vec::new();
    for mut job in out.handed {
        let i = job.slot as usize;
        if let Some(&(broker, stream)) = remote.get(&i) {
            across.push((broker, stream, job));
        } else {
            // From the job's index in the request to its claim's.
            job.slot = index[&i] as i32;
            handed.push(job);
        }
    }
    claims.report(handed);
    for (broker, stream, job) in across {
        settle.hand_over(broker, stream, job).await;
    }
    store.metrics().on_enqueued(&jobs, &out.results);
    (store.metrics().clusters).on_enqueued(store.cluster_name(), out.results.len());
    {
        let mut known = known.0.lock().expect("poisoned");
        if known.0 == epoch {
            known.1.extend(new_queues);
        }
    }
    settle.wake(out.wakes);
    let mut it = out.results.into_iter();
    Ok(sizes
        .into_iter()
        .map(|n| Ok(it.by_ref().take(n).collect()))
        .collect())
}

/// Jobs with a dedup key whose queue's bucket is moving to `here` from
/// another cluster, grouped by that cluster (see `Store::dedup_elsewhere`).
fn moving_dedup(clusters: &Clusters, here: ClusterId, jobs: &[NewJob]) -> Vec<(Store, Vec<usize>)> {
    if clusters.is_single() {
        return Vec::new();
    }
    let map = clusters.map();
    if map.moving.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<(Store, Vec<usize>)> = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        if j.dedup_key.is_none() || map.pinned(j.queue.as_str()).is_some() {
            continue;
        }
        let bucket = crate::placement::bucket_of(j.queue.as_str());
        let from = map.buckets[bucket as usize];
        if map.moving.get(&bucket) != Some(&here) || from == here {
            continue;
        }
        let Some(source) = clusters.get(from) else {
            continue;
        };
        match out.iter_mut().find(|(s, _)| s.cluster() == from) {
            Some((_, idxs)) => idxs.push(i),
            None => out.push((source.clone(), vec![i])),
        }
    }
    out
}

async fn ack(settle: Settle, reqs: Vec<Vec<AckReq>>) -> Result<Vec<Result<Vec<Result<()>>>>> {
    let all: Vec<AckReq> = reqs.iter().flatten().cloned().collect();
    let done = settle.ack(&all).await?;
    let mut results = crate::settle::ack_results(&all, &done).into_iter();
    Ok(reqs
        .iter()
        .map(|batch| Ok(results.by_ref().take(batch.len()).collect()))
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
    Ok(crate::settle::nack_results(&fails, &done))
}

async fn extend(
    store: Store,
    dispatcher: Dispatcher,
    reqs: Vec<ExtendReq>,
) -> Result<Vec<Result<DateTime<Utc>>>> {
    let done = store.extend(&reqs).await?;
    store.metrics().stale_tokens.add(reqs.len() - done.len());
    // A broker whose stream holds a job extended on another replica learns
    // the new deadline when it checks the lease at the old one.
    for e in done.iter().filter(|e| e.broker == Some(store.broker_id())) {
        dispatcher.extended(e.id, e.lease_ms);
    }
    Ok(crate::settle::extend_results(&reqs, &done))
}
