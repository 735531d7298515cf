//! Ending leases and waking queues: the one place that runs the settle
//! statements (`ack.sql`, `fail.sql`) and then tells everyone who must know.
//!
//! After a lease ends, three parties may care:
//! - the stream that held it wants its credit back: in this process through
//!   [`Local::settled`], on another replica by a NOTIFY on that broker's
//!   settle channel;
//! - consumers of the job's queue, here and on every replica, when the job is
//!   available again (a nack, a release, an expired lease) or a slot of a
//!   concurrency-limited queue freed: [`Local::wake`] here, a NOTIFY on
//!   [`channels::WAKE`] for the others;
//! - the metrics.
//!
//! Every caller (Ack and Nack from clients, a stream's release on close or
//! drain, the lease reaper, the admin API) goes through [`Settle`], so none
//! of that is written twice.
//!
//! NOTIFYs are sent by the [`Notifier`] task, after the statement that made
//! them necessary has committed and in a statement of their own. PostgreSQL
//! takes a database-wide lock in a transaction that notifies and holds it
//! through that transaction's commit, WAL flush included, so a NOTIFY inside
//! the enqueue or settle statement serialised all of those commits
//! (measured: docs/BENCHMARKS.md). A transaction that only notifies writes
//! nothing to the WAL and holds that lock for microseconds. The price: a
//! broker that dies between the commit and the NOTIFY leaves the other
//! replicas to find the job at their fallback poll (`--poll-interval`).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::warn;
use uuid::Uuid;

use crate::channels;
use crate::domain::{
    AckReq, ClusterId, FailReq, Failed, FastMap, FastSet, JobId, LeaseToken, Leased, QueueName,
    Settled, StreamId, Wake,
};
use crate::error::{Error, Result};
use crate::placement::Clusters;
use crate::store::Store;
use crate::waits::Waits;

/// How the settle path reaches this process's dispatcher.
pub trait Local: Send + Sync + 'static {
    /// Jobs may be waiting now (`delay_ms` 0), or will be then.
    fn wake(&self, wakes: Vec<Wake>);
    /// These leases ended: the streams holding them get their credit back.
    fn settled(&self, leases: Vec<(JobId, LeaseToken)>);
    /// These leases' jobs were cancelled: as [`Local::settled`], and the
    /// streams tell their clients.
    fn cancelled(&self, leases: Vec<(JobId, LeaseToken)>);
}

/// Why a lease ended without an ack (picks the metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The consumer nacked the job.
    Nacked,
    /// The broker let go of it: its stream closed, or the broker drains.
    Released,
    /// Its lease ran out.
    Expired,
}

/// Ends leases and wakes queues. Cheap to clone.
#[derive(Clone)]
pub struct Settle {
    clusters: Clusters,
    local: Arc<dyn Local>,
    notifiers: Notifiers,
    /// WaitJob's waits: a job that ended here pokes their poll.
    waits: Arc<Waits>,
}

impl Settle {
    pub fn new(clusters: Clusters, local: Arc<dyn Local>, notifiers: Notifiers) -> Settle {
        Settle {
            clusters,
            local,
            notifiers,
            waits: Arc::default(),
        }
    }

    /// The home cluster's store: the broker id and the metrics (shared by
    /// every cluster's store).
    pub fn store(&self) -> &Store {
        self.clusters.home()
    }

    pub fn clusters(&self) -> &Clusters {
        &self.clusters
    }

    /// WaitJob's waits on this broker.
    pub fn waits(&self) -> &Arc<Waits> {
        &self.waits
    }

    /// Completes jobs whose token is current (ack.sql), each on the cluster
    /// its token names. Returns those. With several clusters, the ones that
    /// answered are settled (credit, wake-ups) even if another failed, and
    /// the error is returned.
    pub async fn ack(&self, reqs: &[AckReq]) -> Result<Vec<Settled>> {
        let mut groups = self.clusters.group(reqs.iter().cloned(), |r| r.token.1);
        if groups.len() == 1 {
            // Every batch of the ack batcher: it is per cluster.
            let (c, reqs) = groups.pop().expect("one group");
            return self.ack_on(c, &reqs).await;
        }
        let runs = groups.iter().map(|(c, reqs)| self.ack_on(*c, reqs));
        merge(futures_util::future::join_all(runs).await)
    }

    async fn ack_on(&self, cluster: ClusterId, reqs: &[AckReq]) -> Result<Vec<Settled>> {
        // A token naming a cluster this broker does not have is stale.
        let done = match self.clusters.get(cluster) {
            Some(store) => store.ack(reqs).await?,
            None => Vec::new(),
        };
        self.acked(cluster, reqs.len(), &done);
        Ok(done)
    }

    /// What follows `asked` acks on `cluster` of which `done` committed
    /// (however they were run: the ack batcher's statement, or an ack with
    /// follow-up jobs in a transaction of its own): the metrics, the credit
    /// back, and a wake-up for the queues whose concurrency slot freed.
    pub fn acked(&self, cluster: ClusterId, asked: usize, done: &[Settled]) {
        let m = &self.store().metrics();
        if let Some(store) = self.clusters.get(cluster) {
            m.clusters.on_acked(store.cluster_name(), done.len());
        }
        m.on_acked(asked, done);
        if !done.is_empty() {
            self.waits.poke();
        }
        self.return_credit(done.iter().map(|s| (s.broker, s.id, s.token)));
        // Queues with a concurrency limit have a free slot: wake their
        // consumers on every replica.
        let mut freed: Vec<&QueueName> =
            done.iter().filter_map(|s| s.slot_freed.as_ref()).collect();
        freed.sort_unstable();
        freed.dedup();
        self.wake(
            freed
                .into_iter()
                .map(|q| Wake {
                    queue: q.clone(),
                    delay_ms: 0,
                })
                .collect(),
        );
        // Queues ordered by key whose acked job's key had no other job in
        // the ack statement's snapshot: look again now that the acks
        // committed (ack.sql says why), and wake those where one waits.
        let mut recheck: Vec<(String, String)> = done
            .iter()
            .filter(|s| s.slot_freed.is_none())
            .filter_map(|s| Some((s.queue.clone(), s.recheck_key.clone()?)))
            .collect();
        if recheck.is_empty() {
            return;
        }
        recheck.sort_unstable();
        recheck.dedup();
        let Some(store) = self.clusters.get(cluster).cloned() else {
            return;
        };
        let me = self.clone();
        tokio::spawn(async move {
            let queues = match store.keys_waiting(&recheck).await {
                Ok(queues) => queues,
                // Not known: wake them all (a round that finds the key
                // still held costs one statement; a missed wake-up, a
                // job waiting for the fallback poll).
                Err(e) => {
                    tracing::debug!(error = %e, "recheck of acked keys failed: waking their queues");
                    let mut all: Vec<QueueName> = recheck
                        .iter()
                        .filter_map(|(q, _)| QueueName::parse(q))
                        .collect();
                    all.dedup();
                    all
                }
            };
            me.wake(
                queues
                    .into_iter()
                    .map(|queue| Wake { queue, delay_ms: 0 })
                    .collect(),
            );
        });
    }

    /// Ends leases unsuccessfully (fail.sql): the jobs are retried or
    /// dead-lettered. Returns the ones whose token was current.
    pub async fn fail(&self, reqs: &[FailReq], ending: Ending) -> Result<Vec<Failed>> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let mut groups = self.clusters.group(reqs.iter().cloned(), |r| r.token.1);
        if groups.len() == 1 {
            let (c, reqs) = groups.pop().expect("one group");
            return self.fail_on(c, &reqs, ending).await;
        }
        // A stream's release or a reap over several clusters: one statement
        // per cluster, at once, so one that is down delays no other.
        let runs = groups
            .iter()
            .map(|(c, reqs)| self.fail_on(*c, reqs, ending));
        merge(futures_util::future::join_all(runs).await)
    }

    async fn fail_on(
        &self,
        cluster: ClusterId,
        reqs: &[FailReq],
        ending: Ending,
    ) -> Result<Vec<Failed>> {
        let done = match self.clusters.get(cluster) {
            Some(store) => store.fail(reqs).await?,
            None => Vec::new(),
        };
        let m = &self.store().metrics();
        match ending {
            Ending::Nacked => m.on_nacked(reqs.len(), &done),
            Ending::Expired => m.on_expired(&done),
            // A release whose token is no longer current lost a race with a
            // settle: nobody sent a stale token.
            Ending::Released => m.on_released(&done),
        }
        self.wake(wakes_for(&done));
        if done.iter().any(|f| f.death.is_some()) {
            self.waits.poke();
        }
        self.return_credit(done.iter().map(|f| (f.broker, f.id, f.token)));
        Ok(done)
    }

    /// Makes leases available again at once (retry 0), giving the attempt
    /// back when `refund` (the broker, not the consumer, ended them).
    /// Retries while the database is unreachable; if it stays down the
    /// leases simply expire.
    pub async fn release(&self, leases: Vec<(JobId, LeaseToken)>, why: &str, refund: bool) {
        if leases.is_empty() {
            return;
        }
        let reqs: Vec<FailReq> = leases
            .into_iter()
            .map(|(id, token)| FailReq {
                id,
                token,
                error: why.to_owned(),
                retry_after_ms: Some(0),
                dead_letter: false,
                refund,
            })
            .collect();
        for attempt in 0..5u32 {
            match self.fail(&reqs, Ending::Released).await {
                Ok(_) => return,
                Err(e) => {
                    warn!(error = %e, attempt, "releasing leases failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(200 << attempt)).await;
                }
            }
        }
    }

    /// Ends expired leases: each job is retried at once (or dead-lettered on
    /// its last attempt, or when its ttl passed). Returns how many.
    pub async fn reap(&self, expired: Vec<(JobId, LeaseToken)>) -> Result<usize> {
        let reqs: Vec<FailReq> = expired
            .into_iter()
            .map(|(id, token)| FailReq {
                id,
                token,
                error: "lease expired".to_owned(),
                retry_after_ms: Some(0),
                dead_letter: false,
                refund: false,
            })
            .collect();
        Ok(self.fail(&reqs, Ending::Expired).await?.len())
    }

    /// Jobs are available (or will be at `delay_ms`) in these queues: wakes
    /// this process's dispatcher at once and the other replicas by NOTIFY.
    pub fn wake(&self, wakes: Vec<Wake>) {
        if wakes.is_empty() {
            return;
        }
        self.notifiers.wake(&self.clusters, &wakes);
        self.local.wake(wakes);
    }

    /// Another replica's idle streams offer these (payloads on
    /// [`channels::OFFERS`]); sent on the home cluster, where
    /// every replica listens.
    pub fn publish_offers(&self, payloads: Vec<String>) {
        let home = self.store().cluster();
        for p in payloads {
            self.notifiers.raw(home, channels::OFFERS.to_owned(), p);
        }
    }

    /// A job this replica inserted leased to stream `stream` of broker
    /// `broker` goes to that broker (on the job's cluster). One that does
    /// not fit a notification is released at once instead, so it is leased
    /// again the usual way (the enqueue path only hands over jobs that fit).
    pub async fn hand_over(&self, broker: Uuid, stream: StreamId, job: Leased) {
        match channels::HandedNote::encode(stream, &job) {
            Some(p) => {
                self.notifiers.raw(job.token.1, channels::handed(broker), p);
            }
            None => {
                let lease = vec![(job.id, job.token)];
                self.release(lease, "too large to hand over", true).await;
            }
        }
    }

    /// A job was cancelled under this lease: the stream holding it (here,
    /// or on the replica `broker` by NOTIFY) gets the credit back and
    /// sends its client a `Cancelled`.
    pub fn cancelled(&self, broker: Option<Uuid>, id: JobId, token: LeaseToken) {
        match broker {
            Some(b) if b != self.store().broker_id() => {
                self.notifiers
                    .raw(token.1, channels::settle(b), channels::cancelled(id, token));
            }
            _ => self.local.cancelled(vec![(id, token)]),
        }
    }

    /// Gives streams their credit back: in-process for our own leases, by
    /// NOTIFY for leases held by streams of other replicas (`broker` is the
    /// job's `lease_broker`).
    pub fn return_credit(&self, settled: impl Iterator<Item = (Option<Uuid>, JobId, LeaseToken)>) {
        let me = self.store().broker_id();
        let mut local = Vec::new();
        for (broker, id, token) in settled {
            match broker {
                Some(b) if b != me => self.notifiers.settled(b, id, token),
                _ => local.push((id, token)),
            }
        }
        if !local.is_empty() {
            self.local.settled(local);
        }
    }
}

/// One result per ack of a statement, in order: OK for those the statement
/// completed. Matched by (job, token): two acks of one job with different
/// tokens (an expired lease's and the current one's) may share a
/// statement, and only the current token's succeeded.
pub(crate) fn ack_results(reqs: &[AckReq], done: &[Settled]) -> Vec<Result<()>> {
    let acked: FastSet<(JobId, LeaseToken)> = done.iter().map(|s| (s.id, s.token)).collect();
    reqs.iter()
        .map(|r| {
            if acked.contains(&(r.job_id, r.token)) {
                Ok(())
            } else {
                Err(Error::StaleLease(r.job_id.0))
            }
        })
        .collect()
}

/// One result per nack of a statement, in order: whether it dead-lettered
/// the job. Matched by (job, token), as acks are: a stale Nack sharing the
/// statement with the current holder's is refused, not answered with the
/// other's outcome (as it was once, keyed by job id alone).
pub(crate) fn nack_results(reqs: &[FailReq], done: &[Failed]) -> Vec<Result<bool>> {
    let dead: FastMap<(JobId, LeaseToken), bool> = done
        .iter()
        .map(|f| ((f.id, f.token), f.death.is_some()))
        .collect();
    reqs.iter()
        .map(|r| {
            dead.get(&(r.id, r.token))
                .copied()
                .ok_or(Error::StaleLease(r.id.0))
        })
        .collect()
}

/// One result per lease extension of a statement, in order: the new
/// expiry. Matched by (job, token): see [`nack_results`].
pub(crate) fn extend_results(
    reqs: &[crate::domain::ExtendReq],
    done: &[crate::domain::Extended],
) -> Vec<Result<chrono::DateTime<chrono::Utc>>> {
    let until: FastMap<(JobId, LeaseToken), chrono::DateTime<chrono::Utc>> = done
        .iter()
        .map(|e| ((e.id, e.token), e.lease_expires_at))
        .collect();
    reqs.iter()
        .map(|r| {
            until
                .get(&(r.job_id, r.token))
                .copied()
                .ok_or(Error::StaleLease(r.job_id.0))
        })
        .collect()
}

/// The results of one statement per cluster: all of them, or the first
/// error (the clusters that answered were settled all the same).
fn merge<T>(results: Vec<Result<Vec<T>>>) -> Result<Vec<T>> {
    let mut out = Vec::new();
    let mut failed = None;
    for r in results {
        match r {
            Ok(v) => out.extend(v),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// One [`Notifier`] per cluster: a wake-up goes out on the queue's cluster,
/// a settle on the cluster of the lease (every broker LISTENs on all).
#[derive(Clone)]
pub struct Notifiers(Arc<HashMap<ClusterId, Notifier>>);

impl Notifiers {
    /// Spawns one notifier task per cluster.
    pub fn spawn(clusters: &Clusters) -> Notifiers {
        Notifiers(Arc::new(
            clusters
                .all()
                .iter()
                .map(|s| (s.cluster(), Notifier::spawn(s.clone())))
                .collect(),
        ))
    }

    fn wake(&self, clusters: &Clusters, wakes: &[Wake]) {
        for w in wakes {
            if let Some(n) = self.0.get(&clusters.cluster_of(&w.queue)) {
                n.wake(std::slice::from_ref(w));
            }
        }
    }

    fn settled(&self, broker: Uuid, id: JobId, token: LeaseToken) {
        if let Some(n) = self.0.get(&token.1) {
            n.settled(broker, id, token);
        }
    }

    fn raw(&self, cluster: ClusterId, channel: String, payload: String) {
        if let Some(n) = self.0.get(&cluster) {
            let _ = n.tx.send(Note::Raw(channel, payload));
        }
    }
}

/// One wake per queue that got a job back (at the earliest retry), and an
/// immediate one per queue with a concurrency limit or ordered by key (a
/// slot, or a dead-lettered job's key, freed). Both when both: the
/// immediate one alone would leave the retry to the fallback poll (found
/// by keys::a_retry_and_an_expired_lease_keep_their_place_at_the_head).
pub(crate) fn wakes_for(done: &[Failed]) -> Vec<Wake> {
    let mut retry: HashMap<&QueueName, i64> = HashMap::new();
    let mut freed: Vec<&QueueName> = Vec::new();
    for f in done {
        if f.slot_freed && !freed.contains(&&f.queue) {
            freed.push(&f.queue);
        }
        if f.death.is_none() {
            let e = retry.entry(&f.queue).or_insert(f.retry_ms);
            *e = (*e).min(f.retry_ms);
        }
    }
    let mut out: Vec<Wake> = freed
        .iter()
        .map(|q| Wake {
            queue: (*q).clone(),
            delay_ms: 0,
        })
        .collect();
    for (q, ms) in retry {
        if ms > 0 || !freed.contains(&q) {
            out.push(Wake {
                queue: q.clone(),
                delay_ms: ms,
            });
        }
    }
    out
}

enum Note {
    Wake(Wake),
    Settled(Uuid, JobId, LeaseToken),
    /// A payload for a channel, as is (hand-off across replicas).
    Raw(String, String),
}

/// Sends NOTIFYs from a task of its own: whatever was asked for while the
/// previous statement ran goes out coalesced in the next one (one wake per
/// queue and kind, settles packed per broker). Cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    /// Unbounded: callers never wait for a notification; volume is bounded
    /// by the statements that produce them.
    tx: mpsc::UnboundedSender<Note>,
}

impl Notifier {
    /// Spawns the task; it ends when every handle is dropped.
    pub fn spawn(store: Store) -> Notifier {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(notify_loop(store, rx));
        Notifier { tx }
    }

    pub fn wake(&self, wakes: &[Wake]) {
        for w in wakes {
            let _ = self.tx.send(Note::Wake(w.clone()));
        }
    }

    pub fn settled(&self, broker: Uuid, id: JobId, token: LeaseToken) {
        let _ = self.tx.send(Note::Settled(broker, id, token));
    }
}

async fn notify_loop(store: Store, mut rx: mpsc::UnboundedReceiver<Note>) {
    while let Some(first) = rx.recv().await {
        let mut wakes: HashMap<(QueueName, bool), i64> = HashMap::new();
        let mut settled: Vec<(Uuid, JobId, LeaseToken)> = Vec::new();
        let mut raw: Vec<(String, String)> = Vec::new();
        let mut next = Some(first);
        while let Some(note) = next {
            match note {
                Note::Wake(w) => {
                    let e = wakes.entry((w.queue, w.delay_ms > 0)).or_insert(w.delay_ms);
                    *e = (*e).min(w.delay_ms);
                }
                Note::Settled(b, id, token) => settled.push((b, id, token)),
                Note::Raw(channel, payload) => raw.push((channel, payload)),
            }
            next = rx.try_recv().ok();
        }
        let wakes: Vec<Wake> = wakes
            .into_iter()
            .map(|((queue, _), delay_ms)| Wake { queue, delay_ms })
            .collect();
        if let Err(e) = store.notify(&wakes, &settled, raw).await {
            // Other replicas find these jobs at their fallback poll, and
            // their streams' credit at the lease check.
            warn!(error = %e, "notification failed");
        }
    }
}
