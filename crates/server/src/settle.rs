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
//! A queue's wakes go to the other replicas at most once per
//! [`WAKE_EVERY`] (2 ms): the first at once, the rest of the interval's
//! together at its end.

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
    /// leases simply expire. Returns whether the release committed.
    pub async fn release(&self, leases: Vec<(JobId, LeaseToken)>, why: &str, refund: bool) -> bool {
        let reqs = (leases.into_iter())
            .map(|l| FailReq::ended(l, why, refund))
            .collect();
        self.release_all(reqs).await
    }

    /// Releases these leases in one statement, as they say (each its own
    /// reason and refund), retrying as [`Settle::release`] does. Returns
    /// whether the release committed (nothing to release: true).
    pub async fn release_all(&self, reqs: Vec<FailReq>) -> bool {
        if reqs.is_empty() {
            return true;
        }
        const ATTEMPTS: u32 = 5;
        for attempt in 0..ATTEMPTS {
            match self.fail(&reqs, Ending::Released).await {
                Ok(_) => return true,
                Err(e) if attempt + 1 < ATTEMPTS => {
                    warn!(error = %e, attempt, "releasing leases failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(200 << attempt)).await;
                }
                Err(e) => {
                    warn!(error = %e, "releasing leases failed; they come back when their leases run out");
                }
            }
        }
        false
    }

    /// Ends expired leases: each job is retried at once (or dead-lettered on
    /// its last attempt, or when its ttl passed). Returns how many.
    pub async fn reap(&self, expired: Vec<(JobId, LeaseToken)>) -> Result<usize> {
        let reqs: Vec<FailReq> = (expired.into_iter())
            .map(|l| FailReq::ended(l, "lease expired", false))
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

/// A queue's wake goes to the other replicas at most once per this long
/// (per kind: now, or after a delay). The first goes at once; those that
/// come within the interval after it go together at its end. A producer
/// enqueueing one job at a time otherwise sent one NOTIFY per job, each a
/// statement on PostgreSQL and a wake-up of every replica's listener, for
/// replicas whose streams are busy (no credit: a wake tells them nothing)
/// or idle (they offer and take new jobs by hand-off, `dispatch::remote`):
/// measured, a sequential producer ran 10-14 % faster without them
/// (docs/BENCHMARKS.md). A replica's stream that missed a job in the round
/// the first wake started learns of it at most this much later. This
/// broker's own dispatcher is woken at once, whatever this says.
pub(crate) const WAKE_EVERY: std::time::Duration = std::time::Duration::from_millis(2);

/// Which wakes go out now, and which wait for their queue's interval to
/// end ([`WAKE_EVERY`]).
#[derive(Default)]
pub(crate) struct WakeThrottle {
    /// When each (queue, delayed) last went out, within the last interval.
    sent: HashMap<(QueueName, bool), tokio::time::Instant>,
    /// Wakes waiting for their interval's end (the shortest delay asked).
    held: HashMap<(QueueName, bool), i64>,
}

impl WakeThrottle {
    /// The wakes to send now, of `wakes` asked at `now` and of those held
    /// whose interval has ended.
    pub(crate) fn admit(
        &mut self,
        now: tokio::time::Instant,
        wakes: HashMap<(QueueName, bool), i64>,
    ) -> Vec<Wake> {
        let mut out: HashMap<(QueueName, bool), i64> = HashMap::new();
        for (key, delay_ms) in wakes {
            let recent = self
                .sent
                .get(&key)
                .is_some_and(|at| now.duration_since(*at) < WAKE_EVERY);
            let to = if recent { &mut self.held } else { &mut out };
            let e = to.entry(key).or_insert(delay_ms);
            *e = (*e).min(delay_ms);
        }
        let ended: Vec<(QueueName, bool)> = self
            .held
            .keys()
            .filter(|k| {
                self.sent
                    .get(*k)
                    .is_none_or(|at| now.duration_since(*at) >= WAKE_EVERY)
            })
            .cloned()
            .collect();
        for key in ended {
            if let Some(d) = self.held.remove(&key) {
                let e = out.entry(key).or_insert(d);
                *e = (*e).min(d);
            }
        }
        self.sent
            .retain(|_, at| now.duration_since(*at) < WAKE_EVERY);
        for key in out.keys() {
            self.sent.insert(key.clone(), now);
        }
        out.into_iter()
            .map(|((queue, _), delay_ms)| Wake { queue, delay_ms })
            .collect()
    }

    /// When the first held wake's interval ends (None: nothing held).
    pub(crate) fn due(&self) -> Option<tokio::time::Instant> {
        self.held
            .keys()
            .filter_map(|k| self.sent.get(k))
            .min()
            .map(|at| *at + WAKE_EVERY)
    }

    /// Everything held, at once (the task is ending).
    fn flush(&mut self) -> Vec<Wake> {
        self.held
            .drain()
            .map(|((queue, _), delay_ms)| Wake { queue, delay_ms })
            .collect()
    }
}

async fn notify_loop(store: Store, mut rx: mpsc::UnboundedReceiver<Note>) {
    let mut throttle = WakeThrottle::default();
    loop {
        let due = throttle.due();
        let first = tokio::select! {
            note = rx.recv() => match note {
                Some(n) => Some(n),
                None => break,
            },
            () = async {
                if let Some(at) = due {
                    tokio::time::sleep_until(at).await;
                }
            }, if due.is_some() => None,
        };
        let mut wakes: HashMap<(QueueName, bool), i64> = HashMap::new();
        let mut settled: Vec<(Uuid, JobId, LeaseToken)> = Vec::new();
        let mut raw: Vec<(String, String)> = Vec::new();
        let mut next = first.or_else(|| rx.try_recv().ok());
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
        let wakes = throttle.admit(tokio::time::Instant::now(), wakes);
        if wakes.is_empty() && settled.is_empty() && raw.is_empty() {
            continue;
        }
        if let Err(e) = store.notify(&wakes, &settled, raw).await {
            // Other replicas find these jobs at their fallback poll, and
            // their streams' credit at the lease check.
            warn!(error = %e, "notification failed");
        }
    }
    let wakes = throttle.flush();
    if !wakes.is_empty()
        && let Err(e) = store.notify(&wakes, &[], Vec::new()).await
    {
        warn!(error = %e, "notification failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str) -> QueueName {
        QueueName::parse(name).expect("a queue name")
    }

    fn asked(list: &[(&str, i64)]) -> HashMap<(QueueName, bool), i64> {
        let mut m = HashMap::new();
        for (name, d) in list {
            let e = m.entry((q(name), *d > 0)).or_insert(*d);
            *e = (*e).min(*d);
        }
        m
    }

    fn names(mut w: Vec<Wake>) -> Vec<(String, i64)> {
        w.sort_by(|a, b| (a.queue.as_str(), a.delay_ms).cmp(&(b.queue.as_str(), b.delay_ms)));
        w.into_iter()
            .map(|w| (w.queue.as_str().to_owned(), w.delay_ms))
            .collect()
    }

    /// The first wake of a queue goes at once; the ones within the next
    /// WAKE_EVERY wait, and go together (the shortest delay kept) when it
    /// ends, whether or not another wake comes then. Other queues, and a
    /// queue's delayed wakes, have their own intervals. Nothing is lost.
    #[test]
    fn a_queue_wakes_the_replicas_at_most_once_an_interval_and_nothing_is_lost() {
        let t0 = tokio::time::Instant::now();
        let mut t = WakeThrottle::default();
        assert_eq!(names(t.admit(t0, asked(&[("a", 0)]))), [("a".into(), 0)]);
        assert_eq!(t.due(), None);
        let half = t0 + WAKE_EVERY / 2;
        // a again: held; b and a's delayed kind: at once.
        assert_eq!(
            names(t.admit(half, asked(&[("a", 0), ("b", 0), ("a", 500)]))),
            [("a".into(), 500), ("b".into(), 0)]
        );
        assert_eq!(t.due(), Some(t0 + WAKE_EVERY));
        // Before the interval ends: still held, nothing sent.
        assert!(t.admit(half, asked(&[("a", 0)])).is_empty());
        // Its end, with nothing new: the held wake goes.
        assert_eq!(
            names(t.admit(t0 + WAKE_EVERY, HashMap::new())),
            [("a".into(), 0)]
        );
        assert_eq!(t.due(), None);
        // A delayed wake held twice keeps the shorter delay.
        let t1 = t0 + WAKE_EVERY * 10;
        assert_eq!(
            names(t.admit(t1, asked(&[("c", 900)]))),
            [("c".into(), 900)]
        );
        assert!(t.admit(t1, asked(&[("c", 300)])).is_empty());
        assert!(t.admit(t1, asked(&[("c", 700)])).is_empty());
        assert_eq!(names(t.flush()), [("c".into(), 300)]);
        // Long after: a wake goes at once again.
        let t2 = t1 + WAKE_EVERY * 10;
        assert_eq!(names(t.admit(t2, asked(&[("a", 0)]))), [("a".into(), 0)]);
    }
}
