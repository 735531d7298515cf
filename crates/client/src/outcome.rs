//! What a handler's result means for its job: `Ok(())` acks it, and
//! `Ok(`[`Ack`]`)` acks it with follow-up jobs or says it was settled in
//! SQL already; an error nacks it, as [`Retry`] (with its delay),
//! [`DeadLetter`] (no more attempts), or anything else (the queue's
//! backoff, the error's text kept as the job's `last_error`).

use std::any::Any;
use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use leaseq_proto::limits::MAX_ERROR_LEN;

use crate::{Job, pb};

/// The error type handlers' errors are converted into. Anything that
/// converts into it works as a handler's error: `anyhow::Error`,
/// `Box<dyn Error + Send + Sync>`, `String`, `&'static str`, any
/// `std::error::Error + Send + Sync`, and [`Retry`] / [`DeadLetter`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// A handler error that nacks the job to be retried after `after` (None:
/// the queue's backoff; zero: at once).
///
/// ```
/// # use std::time::Duration;
/// use leaseq_client::{Delivery, Retry};
///
/// async fn handle(job: Delivery) -> anyhow::Result<()> {
///     if job.payload.is_empty() {
///         // Found through anyhow's chain too, under any `.context(..)`.
///         return Err(Retry::after(Duration::from_secs(30)).because("upstream busy").into());
///     }
///     Ok(())
/// }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retry {
    /// None = the queue's backoff policy; zero = retry at once.
    pub after: Option<Duration>,
    /// Kept as the job's `last_error` (with any context around it).
    pub reason: String,
}

impl Retry {
    /// Retry no earlier than `after` from now.
    pub fn after(after: Duration) -> Retry {
        Retry {
            after: Some(after),
            reason: String::new(),
        }
    }

    /// Retry after the queue's backoff.
    pub fn backoff() -> Retry {
        Retry::default()
    }

    /// The reason, kept as the job's `last_error`.
    pub fn because(mut self, reason: impl Into<String>) -> Retry {
        self.reason = reason.into();
        self
    }
}

impl fmt::Display for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.reason.is_empty() {
            f.write_str("retry requested")
        } else {
            f.write_str(&self.reason)
        }
    }
}

impl StdError for Retry {}

/// A handler error that moves the job to the dead letters at once, whatever
/// attempts it has left. The reason is kept as its `last_error`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadLetter(pub String);

impl DeadLetter {
    pub fn new(reason: impl Into<String>) -> DeadLetter {
        DeadLetter(reason.into())
    }
}

impl fmt::Display for DeadLetter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("dead-lettered by the handler")
        } else {
            f.write_str(&self.0)
        }
    }
}

impl StdError for DeadLetter {}

/// What a handler's success does with its job: `Ok(())` is
/// `Ok(Ack::new())`, a plain ack. Return an `Ack` to say more:
///
/// - [`then`](Ack::then): **follow-up jobs**, enqueued in the transaction
///   that acks this one (`AckRequest.enqueue`): they exist if and only if
///   the ack committed. A handler that fails (or panics, or times out)
///   enqueues none of them. Needs a broker that lists `"ack.enqueue"` in
///   its first heartbeat: against an older one the job is *nacked* with an
///   error saying so (never acked without its follow-ups), and counted in
///   [`WorkerStats::follow_ups_refused`](crate::WorkerStats). Their ids are
///   not handed back to the handler or its middleware (the ack is sent
///   after both return); the worker logs them at DEBUG.
/// - [`result`](Ack::result) (or [`Ack::json`]): the job's **result**
///   (`AckRequest.result`, at most the broker's `--max-result-bytes`, 64 KiB
///   by default), kept with its completed record and read back by
///   [`Client::wait_job`](crate::Client::wait_job) and `GetJob`. Needs a
///   broker that lists `"ack.result"`: against an older one the job is
///   *nacked* with an error saying so (never acked without its result),
///   and counted in [`WorkerStats::results_refused`](crate::WorkerStats).
/// - [`settled_in_sql`](Ack::settled_in_sql): the handler settled the job
///   itself, with `leaseq.ack(job_id, lease_token)` (or `leaseq.nack`) in
///   its own database transaction, beside its effect: the worker sends
///   nothing and frees the handler's slot; the broker gives the stream's
///   credit back when the commit's NOTIFY reaches it.
///
/// ```
/// use leaseq_client::{Ack, Delivery, Job};
///
/// async fn handle(order: Delivery) -> anyhow::Result<Ack> {
///     // ... charge the order ...
///     Ok(Ack::new()
///         .then(Job::new("emails", format!("receipt for {}", order.id)))
///         .then(Job::new("shipping", order.payload.clone())))
/// }
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[must_use = "an Ack not returned loses its follow-up jobs"]
pub struct Ack {
    pub(crate) follow_ups: Vec<pb::EnqueueRequest>,
    pub(crate) in_sql: bool,
    pub(crate) result: Vec<u8>,
}

// The requests hold no floating-point field: equality is an equivalence.
impl Eq for Ack {}

impl Ack {
    /// A plain ack (as `Ok(())`).
    pub fn new() -> Ack {
        Ack::default()
    }

    /// Adds a follow-up job, enqueued with the ack, in one transaction. A
    /// typed one: `.then(EMAILS.job(&email)?)` ([`Task::job`](crate::Task::job)).
    pub fn then(mut self, job: impl Into<Job>) -> Ack {
        self.follow_ups.push(job.into().into_pb());
        self
    }

    /// The handler settled its job in SQL (`select leaseq.ack($1, $2)` with
    /// the delivery's `id` and `lease_token`, or `leaseq.nack`) in the
    /// transaction of its effect, and that transaction committed: the
    /// worker sends no settle. Return it only after the commit: should the
    /// transaction roll back, return an error instead (the job is then
    /// nacked as usual). Follow-ups ([`then`](Ack::then)) cannot go with it
    /// (insert them in that transaction with `leaseq.enqueue`): the worker
    /// nacks a job whose handler asks for both.
    pub fn settled_in_sql() -> Ack {
        Ack {
            follow_ups: Vec::new(),
            in_sql: true,
            result: Vec::new(),
        }
    }

    /// Sets the job's result (empty: none), sent with the ack.
    pub fn result(mut self, result: impl Into<Vec<u8>>) -> Ack {
        self.result = result.into();
        self
    }

    /// An ack whose result is `value` as JSON (what
    /// [`Task::enqueue_and_wait`](crate::Task::enqueue_and_wait) reads back).
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Ack, serde_json::Error> {
        Ok(Ack::new().result(serde_json::to_vec(value)?))
    }

    /// The result's bytes (empty: none).
    pub fn result_bytes(&self) -> &[u8] {
        &self.result
    }

    /// The follow-up jobs, in order.
    pub fn follow_ups(&self) -> &[pb::EnqueueRequest] {
        &self.follow_ups
    }

    /// Whether [`settled_in_sql`](Ack::settled_in_sql) made it.
    pub fn is_settled_in_sql(&self) -> bool {
        self.in_sql
    }
}

impl From<()> for Ack {
    fn from((): ()) -> Ack {
        Ack::new()
    }
}

/// How a job is settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Ack, with its follow-ups; or nothing to send (settled in SQL).
    Ack(Ack),
    Nack(NackOutcome),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NackOutcome {
    /// The job's next `last_error`: no NUL, at most MAX_ERROR_LEN bytes.
    pub error: String,
    pub retry_after: Option<Duration>,
    pub dead_letter: bool,
    pub kind: NackKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NackKind {
    Failed,
    Retry,
    DeadLetter,
    Timeout,
    Panic,
}

impl NackKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NackKind::Failed => "failed",
            NackKind::Retry => "retry",
            NackKind::DeadLetter => "dead_letter",
            NackKind::Timeout => "timeout",
            NackKind::Panic => "panic",
        }
    }
}

impl Outcome {
    pub fn nack(kind: NackKind, error: &str) -> Outcome {
        Outcome::Nack(NackOutcome {
            error: error_text(error),
            retry_after: None,
            dead_letter: false,
            kind,
        })
    }

    /// The outcome of a handler's error: the first [`Retry`] or
    /// [`DeadLetter`] in its chain decides, else a plain failure. The text
    /// is the whole chain (anyhow's `{:#}`).
    pub fn of<E: Into<BoxError> + 'static>(e: E) -> Outcome {
        // anyhow's own chain: boxing an anyhow::Error hides the type of the
        // error it holds from `downcast_ref`.
        let mut slot = Some(e);
        if let Some(a) = (&mut slot as &mut dyn Any).downcast_mut::<Option<anyhow::Error>>() {
            let a = a.take().expect("set above");
            return Outcome::of_chain(format!("{a:#}"), a.chain());
        }
        let boxed: BoxError = slot.take().expect("set above").into();
        Outcome::of_error(&*boxed)
    }

    /// [`Outcome::of`] a `std::error::Error`.
    pub fn of_error(e: &(dyn StdError + 'static)) -> Outcome {
        Outcome::of_chain(chain_text(e), chain(e))
    }

    fn of_chain<'a>(
        text: String,
        chain: impl Iterator<Item = &'a (dyn StdError + 'static)>,
    ) -> Outcome {
        for cause in chain {
            // A middleware passing on (or wrapping) what the handler gave.
            if let Some(h) = cause.downcast_ref::<HandlerError>() {
                return h.0.clone();
            }
            if let Some(r) = cause.downcast_ref::<Retry>() {
                return Outcome::Nack(NackOutcome {
                    error: error_text(&text),
                    retry_after: r.after,
                    dead_letter: false,
                    kind: NackKind::Retry,
                });
            }
            if cause.downcast_ref::<DeadLetter>().is_some() {
                return Outcome::Nack(NackOutcome {
                    error: error_text(&text),
                    retry_after: None,
                    dead_letter: true,
                    kind: NackKind::DeadLetter,
                });
            }
        }
        Outcome::nack(NackKind::Failed, &text)
    }
}

fn chain<'a>(
    e: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(e), |e: &&'a (dyn StdError + 'static)| (*e).source())
}

/// `outer: inner: root`, skipping a cause whose text the message already
/// holds (errors that print their source themselves).
fn chain_text(e: &(dyn StdError + 'static)) -> String {
    let mut text = String::new();
    for cause in chain(e) {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !part.is_empty() && !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        if text.len() > MAX_ERROR_LEN {
            break;
        }
    }
    text
}

/// A Nack `error` the broker accepts: no NUL (PostgreSQL text cannot hold
/// it), at most 64 KiB (the start kept: it usually says what went wrong).
pub(crate) fn error_text(e: &str) -> String {
    let mut s = e.replace('\0', "\u{FFFD}");
    if s.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapped(&'static str, Box<dyn StdError + Send + Sync>);
    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl StdError for Wrapped {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.1)
        }
    }

    #[test]
    fn error_text_is_storable() {
        assert_eq!(error_text("a\0b"), "a\u{FFFD}b");
        let long = "é".repeat(MAX_ERROR_LEN);
        let t = error_text(&long);
        assert!(t.len() <= MAX_ERROR_LEN && t.len() >= MAX_ERROR_LEN - 1);
    }

    #[test]
    fn outcomes_from_errors() {
        let plain: BoxError = "disk full".into();
        assert_eq!(
            Outcome::of_error(&*plain),
            Outcome::nack(NackKind::Failed, "disk full")
        );

        let retry: BoxError = Box::new(Wrapped(
            "sending",
            Box::new(Retry::after(Duration::from_secs(5)).because("busy")),
        ));
        assert_eq!(
            Outcome::of_error(&*retry),
            Outcome::Nack(NackOutcome {
                error: "sending: busy".into(),
                retry_after: Some(Duration::from_secs(5)),
                dead_letter: false,
                kind: NackKind::Retry,
            })
        );

        let dead: BoxError = Box::new(DeadLetter::new("bad payload"));
        let Outcome::Nack(n) = Outcome::of_error(&*dead) else {
            panic!("nacked")
        };
        assert!(n.dead_letter && n.error == "bad payload" && n.kind == NackKind::DeadLetter);

        // A cause already printed by its wrapper is not repeated.
        let dup: BoxError = Box::new(Wrapped("io: gone", "gone".into()));
        assert_eq!(
            Outcome::of_error(&*dup),
            Outcome::nack(NackKind::Failed, "io: gone")
        );
    }

    #[test]
    fn anyhow_errors_keep_their_types_and_text() {
        let dead = anyhow::Error::new(DeadLetter::new("bad payload"));
        let Outcome::Nack(n) = Outcome::of(dead) else {
            panic!("nacked")
        };
        assert!(n.dead_letter && n.error == "bad payload");
        let retry = anyhow::Error::new(Retry::after(Duration::ZERO)).context("calling upstream");
        let Outcome::Nack(n) = Outcome::of(retry) else {
            panic!("nacked")
        };
        assert_eq!(n.kind, NackKind::Retry);
        assert_eq!(n.error, "calling upstream: retry requested");
        let plain = anyhow::anyhow!("disk full").context("writing report");
        assert_eq!(
            Outcome::of(plain),
            Outcome::nack(NackKind::Failed, "writing report: disk full")
        );
        assert_eq!(
            Outcome::of(String::from("text")),
            Outcome::nack(NackKind::Failed, "text")
        );
        assert_eq!(
            Outcome::of(DeadLetter::new("x")),
            Outcome::Nack(NackOutcome {
                error: "x".into(),
                retry_after: None,
                dead_letter: true,
                kind: NackKind::DeadLetter
            })
        );
    }

    #[test]
    fn long_chains_are_cut() {
        let big = "x".repeat(MAX_ERROR_LEN * 2);
        let e: BoxError = big.into();
        let Outcome::Nack(n) = Outcome::of_error(&*e) else {
            panic!("nacked")
        };
        assert_eq!(n.error.len(), MAX_ERROR_LEN);
    }
}

/// What a handler's error became (see [`Next::run`](crate::Next::run)): a
/// middleware may log it, count it, return it as is (the job is then
/// settled as the handler said), or return another error instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandlerError(pub(crate) Outcome);

impl HandlerError {
    /// The error text the job will be nacked with.
    pub fn message(&self) -> &str {
        match &self.0 {
            Outcome::Nack(n) => &n.error,
            Outcome::Ack(_) => "",
        }
    }

    /// The job goes to the dead letters ([`DeadLetter`]).
    pub fn dead_letter(&self) -> bool {
        matches!(&self.0, Outcome::Nack(n) if n.dead_letter)
    }

    /// The delay a [`Retry`] asked for.
    pub fn retry_after(&self) -> Option<Duration> {
        match &self.0 {
            Outcome::Nack(n) => n.retry_after,
            Outcome::Ack(_) => None,
        }
    }

    /// `timeout`, `panic`, `retry`, `dead_letter` or `failed`.
    pub fn kind(&self) -> &'static str {
        match &self.0 {
            Outcome::Nack(n) => n.kind.as_str(),
            Outcome::Ack(_) => "ack",
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl StdError for HandlerError {}
