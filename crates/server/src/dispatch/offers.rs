//! Hand-off: credit that idle streams offer to jobs not enqueued yet.
//!
//! A job enqueued while a stream of this broker waits on its queue with free
//! credit need not wait for a lease round: the enqueue statement can insert it
//! already leased to that stream (`enqueue.sql`), and the dispatcher pushes it
//! as soon as the insert commits. That saves a statement, a commit and a WAL
//! flush on the path of every job at light load (docs/BENCHMARKS.md).
//!
//! The dispatcher owns all credit; this book is the one piece of its state
//! that the enqueue path reads, so it sits behind a mutex (held for a few
//! hash lookups; the dispatcher's own state stays lock-free). The dispatcher
//! puts a stream's free credit here only while every queue the stream serves
//! is drained (nothing waiting in the database that this broker knows of),
//! so a handed-off job never overtakes a waiting one; it takes the credit
//! back the moment one of those queues has jobs again, the stream's credit
//! shrinks, or the stream closes. The enqueue path [`Offers::claim`]s credit
//! one job at a time and reports every claim back (`Msg::Handed`), used or
//! not, so the dispatcher's count stays exact.
//!
//! The book also holds what idle streams of other replicas offer
//! ([`super::remote`]): a claim takes this broker's own streams' credit
//! first, and only then another replica's. Those offers are counted down
//! here by each claim and replaced whenever their broker publishes again;
//! they are forgotten after [`OFFER_TTL`](super::remote::OFFER_TTL).

use crate::domain::{FastMap as HashMap, FastSet as HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::StreamId;
use super::remote::OFFER_TTL;
use crate::channels::OfferNote;
use crate::domain::HandoffTo;
use crate::domain::QueueName;

/// A claim on one credit of one stream, for one job about to be inserted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub stream: StreamId,
    /// What the enqueue statement needs to lease the job to that stream.
    pub to: HandoffTo,
}

/// Hand-off claims of this broker's streams taken for one enqueue
/// statement. Each is reported to the dispatcher once, used or not: by
/// [`Claims::report`], or unused when dropped unreported. The batcher runs
/// a statement to its end even when its caller goes away, but a claim
/// never reported would hold its stream's credit for good (the stream
/// received nothing more: issue 32's second case), so this type makes it
/// impossible.
pub(crate) struct Claims {
    claims: Vec<Claim>,
    /// When they were taken, just before their statement was sent: the
    /// leases it makes begin later (see `Core::assign`).
    taken: Instant,
    /// Where the report goes (the dispatcher's inbox, or the simulation's).
    sink: Box<dyn FnMut(super::Handoff) + Send>,
}

impl Claims {
    pub fn new(claims: Vec<Claim>, sink: impl FnMut(super::Handoff) + Send + 'static) -> Claims {
        Claims {
            claims,
            taken: Instant::now(),
            sink: Box::new(sink),
        }
    }

    /// The statement committed: `leased` were inserted leased (their
    /// `slot` indexes the claims); the other claims' credit returns.
    pub fn report(&mut self, leased: Vec<crate::domain::Leased>) {
        let claims = std::mem::take(&mut self.claims);
        if !claims.is_empty() {
            (self.sink)(super::Handoff {
                claims,
                leased,
                sent: self.taken,
            });
        }
    }
}

impl Drop for Claims {
    fn drop(&mut self) {
        self.report(Vec::new());
    }
}

/// The shared book. Cheap to clone.
#[derive(Clone, Default, Debug)]
pub struct Offers(Arc<Mutex<Book>>);

#[derive(Default, Debug)]
struct Book {
    streams: HashMap<StreamId, Offer>,
    /// The streams serving each queue, in the order they subscribed.
    by_queue: HashMap<QueueName, Vec<StreamId>>,
    /// Queues whose jobs must not be handed off (they have concurrency or
    /// rate limits, which only the lease path enforces).
    limited: HashSet<QueueName>,
    /// Wake-ups sent to the dispatcher for jobs due now in each queue,
    /// not yet taken in (see [`Offers::waking`]): no hand-off on these.
    waking: HashMap<QueueName, u32>,
    /// Rotates the first stream tried, so idle streams share the jobs.
    cursor: usize,
    /// Other replicas' offers, by (broker, stream).
    remote: HashMap<(Uuid, StreamId), Remote>,
    /// The remote offers serving each queue.
    remote_by_queue: HashMap<QueueName, Vec<(Uuid, StreamId)>>,
    /// Whether other replicas' offers are heard (one cluster only).
    remote_on: bool,
    /// When offers past their time may next be dropped.
    next_prune: Option<Instant>,
}

impl Book {
    /// Drops another replica's offer, if the book holds it.
    fn forget_remote(&mut self, key: (Uuid, StreamId)) {
        let Some(old) = self.remote.remove(&key) else {
            return;
        };
        for q in &old.queues {
            if let Some(ids) = self.remote_by_queue.get_mut(q) {
                ids.retain(|k| *k != key);
                if ids.is_empty() {
                    self.remote_by_queue.remove(q);
                }
            }
        }
    }
}

#[derive(Debug)]
struct Remote {
    credit: i32,
    lease_ms: Option<i64>,
    consumer: Arc<str>,
    queues: Vec<QueueName>,
    until: Instant,
}

#[derive(Debug)]
struct Offer {
    credit: i32,
    lease_ms: Option<i64>,
    consumer: Arc<str>,
}

impl Offers {
    /// Takes one credit from a stream serving `queue`, if one offers any: a
    /// stream of this broker, or else (if `remote`) of another replica.
    pub fn claim(&self, queue: &QueueName, remote: bool) -> Option<Claim> {
        let mut book = self.0.lock().expect("poisoned");
        let book = &mut *book;
        if book.limited.contains(queue) || book.waking.contains_key(queue) {
            return None;
        }
        book.cursor = book.cursor.wrapping_add(1);
        if let Some(ids) = book.by_queue.get(queue) {
            let n = ids.len();
            for i in 0..n {
                let id = ids[(book.cursor + i) % n];
                if let Some(offer) = book.streams.get_mut(&id)
                    && offer.credit > 0
                {
                    offer.credit -= 1;
                    return Some(Claim {
                        stream: id,
                        to: HandoffTo {
                            lease_ms: offer.lease_ms,
                            consumer: offer.consumer.clone(),
                            broker: None,
                            stream: id,
                        },
                    });
                }
            }
        }
        if !remote {
            return None;
        }
        let ids = book.remote_by_queue.get(queue)?;
        let now = Instant::now();
        let n = ids.len();
        for i in 0..n {
            let key = ids[(book.cursor + i) % n];
            if let Some(offer) = book.remote.get_mut(&key)
                && offer.credit > 0
                && offer.until > now
            {
                offer.credit -= 1;
                return Some(Claim {
                    stream: key.1,
                    to: HandoffTo {
                        lease_ms: offer.lease_ms,
                        consumer: offer.consumer.clone(),
                        broker: Some(key.0),
                        stream: key.1,
                    },
                });
            }
        }
        None
    }

    /// Other replicas' offers are heard from now on (see [`Offers::heard`]).
    pub(super) fn hear_remote(&self) {
        self.0.lock().expect("poisoned").remote_on = true;
    }

    /// Another replica published an offer: it replaces what that stream
    /// offered before (credit 0 withdraws it).
    pub fn heard(&self, note: OfferNote, now: Instant) {
        let mut book = self.0.lock().expect("poisoned");
        let book = &mut *book;
        if !book.remote_on {
            return;
        }
        let key = (note.broker, note.stream);
        book.forget_remote(key);
        // Offers past their time are dropped here too (at most once a
        // second, not at every note), so a book that hears anything at all
        // does not keep dead brokers' offers.
        if book.next_prune.is_none_or(|t| t <= now) {
            book.next_prune = Some(now + Duration::from_secs(1));
            let dead: Vec<(Uuid, StreamId)> = (book.remote.iter())
                .filter(|(_, o)| o.until <= now)
                .map(|(k, _)| *k)
                .collect();
            for k in dead {
                book.forget_remote(k);
            }
        }
        if note.credit <= 0 {
            return;
        }
        let queues: Vec<QueueName> = note
            .queues
            .iter()
            .filter_map(|q| QueueName::parse(q))
            .collect();
        for q in &queues {
            book.remote_by_queue.entry(q.clone()).or_default().push(key);
        }
        book.remote.insert(
            key,
            Remote {
                credit: note.credit,
                lease_ms: note.lease_ms,
                consumer: note.consumer.into(),
                queues,
                until: now + OFFER_TTL,
            },
        );
    }

    /// A stream opens: it may offer credit for these queues (none yet).
    pub(super) fn open(
        &self,
        id: StreamId,
        queues: &[QueueName],
        lease_ms: Option<i64>,
        consumer: Arc<str>,
    ) {
        let mut book = self.0.lock().expect("poisoned");
        book.streams.insert(
            id,
            Offer {
                credit: 0,
                lease_ms,
                consumer,
            },
        );
        for q in queues {
            book.by_queue.entry(q.clone()).or_default().push(id);
        }
    }

    /// A stream closes. Returns the credit it still offered.
    pub(super) fn close(&self, id: StreamId, queues: &[QueueName]) -> i32 {
        let mut book = self.0.lock().expect("poisoned");
        for q in queues {
            if let Some(ids) = book.by_queue.get_mut(q) {
                ids.retain(|s| *s != id);
                if ids.is_empty() {
                    book.by_queue.remove(q);
                }
            }
        }
        book.streams.remove(&id).map_or(0, |o| o.credit)
    }

    /// Sets what a stream offers, in one step: `target` gets what it offered
    /// and nobody has claimed yet, and returns the new offer. Returns
    /// `(unclaimed before, offered now)`.
    pub(super) fn adjust(&self, id: StreamId, target: impl FnOnce(i32) -> i32) -> (i32, i32) {
        let mut book = self.0.lock().expect("poisoned");
        match book.streams.get_mut(&id) {
            Some(o) => {
                let before = o.credit;
                o.credit = target(before).max(0);
                (before, o.credit)
            }
            None => (0, 0),
        }
    }

    /// What a stream offers and nobody has claimed (the simulation's
    /// credit audit).
    /// Queues a wake-up not yet taken in still keeps from hand-off.
    #[cfg(test)]
    pub(crate) fn waking_queues(&self) -> Vec<QueueName> {
        let book = self.0.lock().expect("poisoned");
        book.waking.keys().cloned().collect()
    }

    #[cfg(test)]
    pub(crate) fn unclaimed(&self, id: StreamId) -> i32 {
        let book = self.0.lock().expect("poisoned");
        book.streams.get(&id).map_or(0, |o| o.credit)
    }

    #[cfg(test)]
    fn set(&self, id: StreamId, credit: i32) -> i32 {
        self.adjust(id, |_| credit).0
    }

    /// Jobs due now were made available in these queues here (inserted
    /// without a hand-off, nacked, freed by a limit) and the dispatcher is
    /// about to hear it. Until it has ([`Offers::woken`]) no job is handed
    /// off on them: the dispatcher withdraws offers when it hears a queue
    /// has jobs, and a job enqueued between could take an offer made when
    /// the queue looked drained and overtake the waiting one (CI,
    /// 2026-11-28: with credit 1, a job enqueued after another was answered
    /// went out first).
    pub(crate) fn waking(&self, wakes: &[crate::domain::Wake]) {
        let mut book = self.0.lock().expect("poisoned");
        for w in wakes.iter().filter(|w| w.delay_ms <= 0) {
            *book.waking.entry(w.queue.clone()).or_default() += 1;
        }
    }

    /// The dispatcher took these in (its offers on their queues are
    /// withdrawn): see [`Offers::waking`].
    pub(crate) fn woken(&self, wakes: &[crate::domain::Wake]) {
        let mut book = self.0.lock().expect("poisoned");
        for w in wakes.iter().filter(|w| w.delay_ms <= 0) {
            if let Some(n) = book.waking.get_mut(&w.queue) {
                *n -= 1;
                if *n == 0 {
                    book.waking.remove(&w.queue);
                }
            }
        }
    }

    /// Whether a queue's jobs may be handed off.
    pub(super) fn set_limited(&self, queue: &QueueName, limited: bool) {
        let mut book = self.0.lock().expect("poisoned");
        if limited {
            book.limited.insert(queue.clone());
        } else {
            book.limited.remove(queue);
        }
    }

    /// Withdraws everything (drain).
    pub(super) fn clear(&self) {
        let mut book = self.0.lock().expect("poisoned");
        book.streams.clear();
        book.by_queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> QueueName {
        QueueName::parse(s).unwrap()
    }

    #[test]
    fn claims_take_offered_credit_only() {
        let o = Offers::default();
        o.open(1, &[q("a"), q("b")], Some(5000), "c1".into());
        assert_eq!(o.claim(&q("a"), false), None, "nothing offered yet");
        assert_eq!(o.set(1, 2), 0);
        let c = o.claim(&q("b"), false).unwrap();
        assert_eq!(
            (c.stream, c.to.lease_ms, &*c.to.consumer),
            (1, Some(5000), "c1")
        );
        assert!(o.claim(&q("a"), false).is_some());
        assert_eq!(o.claim(&q("a"), false), None, "credit 2 is spent");
        assert_eq!(o.claim(&q("other"), false), None);
        assert_eq!(o.set(1, 3), 0);
        assert_eq!(o.set(1, 0), 3, "withdrawing returns the unclaimed credit");
    }

    #[test]
    fn limited_queues_and_closed_streams_are_never_claimed() {
        let o = Offers::default();
        o.open(1, &[q("a")], None, "c".into());
        o.set(1, 5);
        o.set_limited(&q("a"), true);
        assert_eq!(o.claim(&q("a"), false), None);
        o.set_limited(&q("a"), false);
        assert!(o.claim(&q("a"), false).is_some());
        assert_eq!(o.close(1, &[q("a")]), 4);
        assert_eq!(o.claim(&q("a"), false), None);
    }

    fn note(broker: Uuid, stream: StreamId, credit: i32, queues: &[&str]) -> OfferNote {
        OfferNote {
            broker,
            stream,
            credit,
            lease_ms: Some(7000),
            consumer: "far".into(),
            queues: queues.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn other_replicas_offers_are_claimed_after_our_own_and_only_while_fresh() {
        let o = Offers::default();
        let b = Uuid::new_v4();
        o.heard(note(b, 7, 2, &["a"]), Instant::now());
        assert_eq!(o.claim(&q("a"), true), None, "not heard before hear_remote");
        o.hear_remote();
        o.heard(note(b, 7, 2, &["a"]), Instant::now());
        o.open(1, &[q("a")], None, "near".into());
        o.set(1, 1);
        let c = o.claim(&q("a"), true).unwrap();
        assert_eq!((c.stream, c.to.broker), (1, None), "our own stream first");
        assert_eq!(
            o.claim(&q("a"), false),
            None,
            "remote claims only when asked"
        );
        let c = o.claim(&q("a"), true).unwrap();
        assert_eq!(
            (c.stream, c.to.broker, c.to.lease_ms, &*c.to.consumer),
            (7, Some(b), Some(7000), "far")
        );
        assert!(o.claim(&q("a"), true).is_some());
        assert_eq!(o.claim(&q("a"), true), None, "its credit 2 is spent");
        // Published again: the new credit replaces the count.
        o.heard(note(b, 7, 1, &["a"]), Instant::now());
        assert!(o.claim(&q("a"), true).is_some());
        o.heard(note(b, 7, 5, &["a"]), Instant::now());
        o.heard(note(b, 7, 0, &["a"]), Instant::now());
        assert_eq!(o.claim(&q("a"), true), None, "withdrawn");
        o.heard(note(b, 7, 5, &["a"]), Instant::now());
        tokio::time::advance(OFFER_TTL).await;
        assert_eq!(o.claim(&q("a"), true), None, "expired");
        o.set_limited(&q("a"), true);
        o.heard(note(b, 7, 5, &["a"]), Instant::now());
        assert_eq!(
            o.claim(&q("a"), true),
            None,
            "a limited queue is never handed off"
        );
    }

    #[test]
    fn claims_rotate_over_idle_streams() {
        let o = Offers::default();
        o.open(1, &[q("a")], None, "c1".into());
        o.open(2, &[q("a")], None, "c2".into());
        o.set(1, 10);
        o.set(2, 10);
        let mut seen = HashSet::default();
        for _ in 0..4 {
            seen.insert(o.claim(&q("a"), false).unwrap().stream);
        }
        assert_eq!(seen.len(), 2, "both streams get jobs");
    }
}
