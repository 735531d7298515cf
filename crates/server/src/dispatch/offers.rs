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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::StreamId;
use crate::domain::QueueName;
use crate::store::HandoffTo;

/// A claim on one credit of one stream, for one job about to be inserted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub stream: StreamId,
    /// What the enqueue statement needs to lease the job to that stream.
    pub to: HandoffTo,
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
    /// Rotates the first stream tried, so idle streams share the jobs.
    cursor: usize,
}

#[derive(Debug)]
struct Offer {
    credit: i32,
    lease_ms: Option<i64>,
    consumer: Arc<str>,
}

impl Offers {
    /// Takes one credit from a stream serving `queue`, if one offers any.
    pub fn claim(&self, queue: &QueueName) -> Option<Claim> {
        let mut book = self.0.lock().expect("poisoned");
        let book = &mut *book;
        if book.limited.contains(queue) {
            return None;
        }
        let ids = book.by_queue.get(queue)?;
        book.cursor = book.cursor.wrapping_add(1);
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
                    },
                });
            }
        }
        None
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

    /// Sets what a stream offers to `credit`; returns what it offered and
    /// nobody had claimed until now.
    pub(super) fn set(&self, id: StreamId, credit: i32) -> i32 {
        let mut book = self.0.lock().expect("poisoned");
        match book.streams.get_mut(&id) {
            Some(o) => std::mem::replace(&mut o.credit, credit.max(0)),
            None => 0,
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
        assert_eq!(o.claim(&q("a")), None, "nothing offered yet");
        assert_eq!(o.set(1, 2), 0);
        let c = o.claim(&q("b")).unwrap();
        assert_eq!(
            (c.stream, c.to.lease_ms, &*c.to.consumer),
            (1, Some(5000), "c1")
        );
        assert!(o.claim(&q("a")).is_some());
        assert_eq!(o.claim(&q("a")), None, "credit 2 is spent");
        assert_eq!(o.claim(&q("other")), None);
        assert_eq!(o.set(1, 3), 0);
        assert_eq!(o.set(1, 0), 3, "withdrawing returns the unclaimed credit");
    }

    #[test]
    fn limited_queues_and_closed_streams_are_never_claimed() {
        let o = Offers::default();
        o.open(1, &[q("a")], None, "c".into());
        o.set(1, 5);
        o.set_limited(&q("a"), true);
        assert_eq!(o.claim(&q("a")), None);
        o.set_limited(&q("a"), false);
        assert!(o.claim(&q("a")).is_some());
        assert_eq!(o.close(1, &[q("a")]), 4);
        assert_eq!(o.claim(&q("a")), None);
    }

    #[test]
    fn claims_rotate_over_idle_streams() {
        let o = Offers::default();
        o.open(1, &[q("a")], None, "c1".into());
        o.open(2, &[q("a")], None, "c2".into());
        o.set(1, 10);
        o.set(2, 10);
        let mut seen = HashSet::new();
        for _ in 0..4 {
            seen.insert(o.claim(&q("a")).unwrap().stream);
        }
        assert_eq!(seen.len(), 2, "both streams get jobs");
    }
}
