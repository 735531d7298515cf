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
//!    publishes that offer on [`OFFERS`](crate::channels::OFFERS) ([`OfferNote`](crate::channels::OfferNote)). Every
//!    replica keeps the offers it hears for [`OFFER_TTL`], counting down its
//!    own claims. B publishes again when the stream's offer ends (a queue has
//!    jobs waiting, the credit ran out, the stream closed, the broker
//!    drains), when about half of what it published has been used, and
//!    every [`OFFER_REFRESH`] while it lasts.
//! 2. **The claim.** A's enqueue path claims its own streams' credit first,
//!    then another replica's, and inserts the job leased to that stream,
//!    stamped with that broker's id (`enqueue.sql`).
//! 3. **The hand-over.** A sends the whole job (it fits a NOTIFY payload:
//!    [`fits`](crate::channels::fits)) on B's [`handed`](crate::channels::handed) channel
//!    ([`HandedNote`](crate::channels::HandedNote)): a one-job
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
//!
//! The channels and payloads are [`crate::channels`]'; this module keeps the
//! timing of offers.

use std::time::Duration;

/// How long a heard offer is claimed without being published again.
pub const OFFER_TTL: Duration = Duration::from_secs(10);
/// How often a lasting offer is published again.
pub const OFFER_REFRESH: Duration = Duration::from_secs(5);
