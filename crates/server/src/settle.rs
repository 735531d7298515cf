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
//!   [`WAKE_CHANNEL`](crate::store::WAKE_CHANNEL) for the others;
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

use crate::domain::{AckReq, JobId, LeaseToken, QueueName};
use crate::error::Result;
use crate::store::{FailReq, Failed, Settled, Store, Wake};

/// How the settle path reaches this process's dispatcher.
pub trait Local: Send + Sync + 'static {
    /// Jobs may be waiting now (`delay_ms` 0), or will be then.
    fn wake(&self, wakes: Vec<Wake>);
    /// These leases ended: the streams holding them get their credit back.
    fn settled(&self, leases: Vec<(JobId, LeaseToken)>);
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
    store: Store,
    local: Arc<dyn Local>,
    notifier: Notifier,
}

impl Settle {
    pub fn new(store: Store, local: Arc<dyn Local>, notifier: Notifier) -> Settle {
        Settle {
            store,
            local,
            notifier,
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Completes jobs whose token is current (ack.sql). Returns those.
    pub async fn ack(&self, reqs: &[AckReq]) -> Result<Vec<Settled>> {
        let done = self.store.ack(reqs).await?;
        let m = &self.store.metrics;
        m.on_acked(reqs.len(), &done);
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
        Ok(done)
    }

    /// Ends leases unsuccessfully (fail.sql): the jobs are retried or
    /// dead-lettered. Returns the ones whose token was current.
    pub async fn fail(&self, reqs: &[FailReq], ending: Ending) -> Result<Vec<Failed>> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let done = self.store.fail(reqs).await?;
        let m = &self.store.metrics;
        match ending {
            Ending::Nacked => m.on_nacked(reqs.len(), &done),
            Ending::Expired => m.on_expired(&done),
            // A release whose token is no longer current lost a race with a
            // settle: nobody sent a stale token.
            Ending::Released => m.on_released(&done),
        }
        self.wake(wakes_for(&done));
        let tokens: HashMap<JobId, LeaseToken> = reqs.iter().map(|r| (r.id, r.token)).collect();
        self.return_credit(done.iter().map(|f| (f.broker, f.id, tokens[&f.id])));
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
        self.notifier.wake(&wakes);
        self.local.wake(wakes);
    }

    /// Gives streams their credit back: in-process for our own leases, by
    /// NOTIFY for leases held by streams of other replicas (`broker` is the
    /// job's `lease_broker`).
    pub fn return_credit(&self, settled: impl Iterator<Item = (Option<Uuid>, JobId, LeaseToken)>) {
        let me = self.store.broker_id;
        let mut local = Vec::new();
        for (broker, id, token) in settled {
            match broker {
                Some(b) if b != me => self.notifier.settled(b, id, token),
                _ => local.push((id, token)),
            }
        }
        if !local.is_empty() {
            self.local.settled(local);
        }
    }
}

/// One wake per queue that got a job back (the earliest), and an immediate
/// one per queue with a concurrency limit (a slot freed, whatever became of
/// the job).
fn wakes_for(done: &[Failed]) -> Vec<Wake> {
    let mut min: HashMap<&QueueName, i64> = HashMap::new();
    for f in done {
        let ms = if f.slot_freed {
            0
        } else if f.death.is_none() {
            f.retry_ms
        } else {
            continue;
        };
        let e = min.entry(&f.queue).or_insert(ms);
        *e = (*e).min(ms);
    }
    min.into_iter()
        .map(|(q, ms)| Wake {
            queue: q.clone(),
            delay_ms: ms,
        })
        .collect()
}

enum Note {
    Wake(Wake),
    Settled(Uuid, JobId, LeaseToken),
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
        let mut next = Some(first);
        while let Some(note) = next {
            match note {
                Note::Wake(w) => {
                    let e = wakes.entry((w.queue, w.delay_ms > 0)).or_insert(w.delay_ms);
                    *e = (*e).min(w.delay_ms);
                }
                Note::Settled(b, id, token) => settled.push((b, id, token)),
            }
            next = rx.try_recv().ok();
        }
        let wakes: Vec<Wake> = wakes
            .into_iter()
            .map(|((queue, _), delay_ms)| Wake { queue, delay_ms })
            .collect();
        if let Err(e) = store.notify(&wakes, &settled).await {
            // Other replicas find these jobs at their fallback poll, and
            // their streams' credit at the lease check.
            warn!(error = %e, "notification failed");
        }
    }
}
