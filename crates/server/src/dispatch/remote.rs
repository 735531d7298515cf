//! Hand-off across replicas: what brokers tell each other, by NOTIFY, so that
//! a job enqueued on one replica can be inserted already leased to an idle
//! stream of another (docs/ARCHITECTURE.md, "Hand-off").
//!
//! Without it, a job whose consumer sits on another replica than its
//! producer (as behind a load balancer) takes two durable commits before it
//! is pushed: the enqueue on replica A, then, after A's wake-up reaches
//! replica B, B's lease round. With it, A's enqueue statement leases the job
//! to B's stream and B pushes it as soon as it hears of it: one commit, as on
//! one broker.
//!
//! 1. **Offers.** A stream whose queues are all drained offers its free
//!    credit for hand-off in this process ([`super::offers`]); B also
//!    publishes that offer on [`OFFERS_CHANNEL`] ([`OfferNote`]). Every
//!    replica keeps the offers it hears for [`OFFER_TTL`], counting down its
//!    own claims. B publishes again when the stream's offer ends (a queue has
//!    jobs waiting, the credit ran out, the stream closed, the broker
//!    drains), when about half of what it published has been used, and
//!    every [`OFFER_REFRESH`] while it lasts.
//! 2. **The claim.** A's enqueue path claims its own streams' credit first,
//!    then another replica's, and inserts the job leased to that stream,
//!    stamped with that broker's id (`enqueue.sql`).
//! 3. **The hand-over.** A sends the whole job (it fits a NOTIFY payload:
//!    [`fits`]) on B's [`handed_channel`] ([`HandedNote`]): a one-job
//!    statement (light load) in the insert itself (`enqueue_handover.sql`,
//!    delivered by PostgreSQL at the commit), a batch from the Notifier
//!    after the commit. B pushes it if the stream is still open and has the
//!    credit; otherwise it releases the job at once, attempt given back, as
//!    for a stream that closed before its delivery.
//!
//! Offers are advice, not reservations: two replicas may claim the same
//! credit, and the loser's job is released and leased again (the price is a
//! statement, never a lost or doubly leased job: each lease has its own
//! token). What can be lost is a notification, like any NOTIFY: a hand-over
//! sent while B's LISTEN connection reconnects, or while B is killed, leaves
//! the job leased to B until its lease runs out, exactly as if B had
//! delivered it and died. A stale offer of a killed broker is claimed at most
//! for its credit's worth of jobs, for at most [`OFFER_TTL`].

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::DateTime;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::StreamId;
use crate::domain::{ClusterId, JobId, LeaseToken, Leased, NewJob};

/// Where brokers publish their streams' offers (payload: [`OfferNote`]).
pub const OFFERS_CHANNEL: &str = "leaseq_offers";

/// The channel one broker LISTENs on for jobs other replicas inserted leased
/// to its streams (payload: [`HandedNote`]).
pub fn handed_channel(broker: Uuid) -> String {
    format!("leaseq_handed_{}", broker.simple())
}

/// How long a heard offer is claimed without being published again.
pub const OFFER_TTL: Duration = Duration::from_secs(10);
/// How often a lasting offer is published again.
pub const OFFER_REFRESH: Duration = Duration::from_secs(5);

/// PostgreSQL's NOTIFY payloads must be shorter than 8000 bytes.
const MAX_PAYLOAD: usize = 7999;

/// Whether a job is small enough to be handed over in one NOTIFY: its
/// payload (base64) and headers, plus the fixed fields, stay well under the
/// limit. Bigger jobs take the wake-up and lease-round path.
pub fn fits(job: &NewJob) -> bool {
    job.payload.len() <= 3 * 1024 && job.headers_json.len() <= 1024
}

/// One stream's offer, as published: `credit` 0 withdraws it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferNote {
    #[serde(rename = "b")]
    pub broker: Uuid,
    #[serde(rename = "s")]
    pub stream: StreamId,
    #[serde(rename = "c")]
    pub credit: i32,
    #[serde(rename = "l", default)]
    pub lease_ms: Option<i64>,
    #[serde(rename = "n", default)]
    pub consumer: String,
    #[serde(rename = "q", default)]
    pub queues: Vec<String>,
}

impl OfferNote {
    /// The payload, or None if it would not fit (the stream then offers
    /// its credit to this replica's enqueues only).
    pub fn encode(&self) -> Option<String> {
        let s = serde_json::to_string(self).ok()?;
        (s.len() <= MAX_PAYLOAD).then_some(s)
    }

    pub fn parse(payload: &str) -> Option<OfferNote> {
        serde_json::from_str(payload).ok()
    }
}

/// A job inserted leased to stream `stream` of the receiving broker.
#[derive(Debug, Serialize, Deserialize)]
struct HandedWire {
    s: StreamId,
    id: Uuid,
    /// The lease token (its cluster is the one the note arrives on).
    t: Uuid,
    q: String,
    /// The lease, in ms, and when it ends (µs since the epoch, database time).
    l: i64,
    x: i64,
    /// Enqueued at, µs since the epoch.
    e: i64,
    pr: i32,
    /// The payload, base64.
    p: String,
    h: HashMap<String, String>,
}

/// A job handed to another replica's stream, on that replica's
/// [`handed_channel`].
#[derive(Debug)]
pub struct HandedNote {
    pub stream: StreamId,
    pub job: Leased,
}

impl HandedNote {
    /// The payload, or None if it would not fit (see [`fits`]).
    pub fn encode(stream: StreamId, job: &Leased) -> Option<String> {
        let wire = HandedWire {
            s: stream,
            id: job.id.0,
            t: job.token.0,
            q: job.queue.clone(),
            l: job.lease_ms,
            x: job.lease_expires_at.timestamp_micros(),
            e: job.enqueued_at.timestamp_micros(),
            pr: job.priority,
            p: BASE64.encode(&job.payload),
            h: job.headers.clone(),
        };
        let s = serde_json::to_string(&wire).ok()?;
        (s.len() <= MAX_PAYLOAD).then_some(s)
    }

    /// Reads a payload heard on `cluster`'s LISTEN connection.
    pub fn parse(payload: &str, cluster: ClusterId) -> Option<HandedNote> {
        let w: HandedWire = serde_json::from_str(payload).ok()?;
        let enqueued_at = DateTime::from_timestamp_micros(w.e)?;
        Some(HandedNote {
            stream: w.s,
            job: Leased {
                slot: 0,
                lease_ms: w.l,
                id: JobId(w.id),
                queue: w.q,
                payload: BASE64.decode(w.p).ok()?,
                headers: w.h,
                priority: w.pr,
                // Inserted leased: its first attempt.
                attempt: 1,
                enqueued_at,
                // Handed over at its insert: it was due at once.
                run_at: enqueued_at,
                last_error: None,
                token: LeaseToken(w.t, cluster),
                lease_expires_at: DateTime::from_timestamp_micros(w.x)?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    #[test]
    fn a_handed_job_arrives_as_it_was_sent() {
        let now = DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap();
        let job = Leased {
            slot: 3,
            lease_ms: 30_000,
            id: JobId(Uuid::now_v7()),
            queue: "q.1".into(),
            payload: vec![0, 255, b'"', b'\\', 7],
            headers: [("traceparent".to_owned(), "00-ab\"c".to_owned())].into(),
            priority: -4,
            attempt: 1,
            enqueued_at: now,
            run_at: now,
            last_error: None,
            token: LeaseToken(Uuid::new_v4(), ClusterId::HOME),
            lease_expires_at: now + chrono::Duration::seconds(30),
        };
        let p = HandedNote::encode(9, &job).unwrap();
        let got = HandedNote::parse(&p, ClusterId::HOME).unwrap();
        assert_eq!(got.stream, 9);
        let j = got.job;
        assert_eq!(
            (
                j.id, &j.queue, &j.payload, &j.headers, j.priority, j.attempt
            ),
            (job.id, &job.queue, &job.payload, &job.headers, -4, 1)
        );
        assert_eq!((j.token, j.lease_ms), (job.token, 30_000));
        assert_eq!(
            (j.enqueued_at, j.lease_expires_at),
            (job.enqueued_at, job.lease_expires_at)
        );
        assert!(HandedNote::parse("{\"s\":1}", ClusterId::HOME).is_none());
        assert!(HandedNote::parse("not json", ClusterId::HOME).is_none());
    }

    #[test]
    fn the_largest_job_that_fits_fits_in_one_notify() {
        let job = Leased {
            slot: 0,
            lease_ms: i64::MAX,
            id: JobId(Uuid::now_v7()),
            queue: "q".repeat(128),
            payload: vec![0xff; 3 * 1024],
            // 1 KiB of headers as JSON; escapes are already counted there.
            headers: [("h".to_owned(), "v".repeat(1024 - 10))].into(),
            priority: i32::MIN,
            attempt: 1,
            enqueued_at: Utc::now(),
            run_at: Utc::now(),
            last_error: None,
            token: LeaseToken(Uuid::new_v4(), ClusterId::HOME),
            lease_expires_at: Utc::now(),
        };
        let p = HandedNote::encode(u64::MAX, &job).expect("fits");
        assert!(p.len() < 8000, "{}", p.len());
        let big = Leased {
            payload: vec![0; 6000],
            ..job
        };
        assert!(HandedNote::encode(1, &big).is_none());
    }

    #[test]
    fn offers_round_trip_and_a_huge_one_is_not_published() {
        let o = OfferNote {
            broker: Uuid::new_v4(),
            stream: 4,
            credit: 12,
            lease_ms: None,
            consumer: "w-1".into(),
            queues: vec!["a".into(), "b".into()],
        };
        assert_eq!(OfferNote::parse(&o.encode().unwrap()), Some(o.clone()));
        let huge = OfferNote {
            queues: vec!["q".repeat(128); 100],
            ..o
        };
        assert_eq!(huge.encode(), None);
        assert_eq!(OfferNote::parse("{}"), None);
    }
}
