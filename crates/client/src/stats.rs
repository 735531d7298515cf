//! [`WorkerStats`]: the counters a [`Worker`](crate::Worker) and its
//! streams' settlers keep.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one worker since it was built (read them with
/// `load(Ordering::Relaxed)`; get them with [`Worker::stats`] before
/// running it).
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Jobs delivered to this worker (started or not).
    pub delivered: AtomicU64,
    pub acked: AtomicU64,
    /// Every nack: handler errors, `Retry`, `DeadLetter`, timeouts, panics.
    pub nacked: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Handlers cancelled by their timeout.
    pub timed_out: AtomicU64,
    /// Jobs whose lease was lost (a settle or an extension refused with
    /// `FAILED_PRECONDITION`); their handlers were cancelled if running.
    pub lease_lost: AtomicU64,
    /// Jobs the broker said were cancelled while their handlers ran (or
    /// waited): stopped, not settled.
    pub cancelled: AtomicU64,
    /// Follow-up jobs ([`Ack::then`](crate::Ack::then)) enqueued with
    /// their jobs' acks.
    pub follow_ups: AtomicU64,
    /// Jobs nacked instead of acked with follow-ups: the broker did not
    /// list `"ack.enqueue"` (or the handler also said
    /// [`settled_in_sql`](crate::Ack::settled_in_sql)).
    pub follow_ups_refused: AtomicU64,
    /// Jobs nacked instead of acked with a result
    /// ([`Ack::result`](crate::Ack::result)): the broker did not list
    /// `"ack.result"` (or, not nacked, the handler also said
    /// [`settled_in_sql`](crate::Ack::settled_in_sql)).
    pub results_refused: AtomicU64,
    /// Jobs their handlers settled in SQL
    /// ([`Ack::settled_in_sql`](crate::Ack::settled_in_sql)): nothing sent.
    pub settled_in_sql: AtomicU64,
    /// Acks and nacks sent on a Consume stream...
    pub settled_on_stream: AtomicU64,
    /// ... acks sent in AckBatch calls ...
    pub settled_batched: AtomicU64,
    /// ... and nacks sent as unary calls (Subscribe fallback, or a job whose
    /// stream had ended).
    pub settled_unary: AtomicU64,
    /// Consume streams opened.
    pub consume_streams: AtomicU64,
    /// Subscribe streams opened (the fallback).
    pub subscribe_streams: AtomicU64,
}

impl WorkerStats {
    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
