//! `QueueService.Consume`: a stream of deliveries whose client settles them
//! on the same call (in the manner of Pub/Sub's StreamingPull).
//!
//! The first request opens the subscription as Subscribe does. A task reads
//! the later ones: each entry of `acks`, `nacks` and `extends` is validated on
//! its own (a malformed one is answered with a SettleResult naming its field
//! and changes nothing) and handed to the same group-commit batchers as the
//! unary calls, so a stream's acks share statements with everyone else's;
//! `max_in_flight` changes the stream's credit. The response interleaves the
//! dispatcher's deliveries and heartbeats with the settle results.
//!
//! When the client half-closes, the stream takes no new jobs, every settle
//! it sent is finished (and reported), then its unsettled jobs are released
//! and the response ends with OK (UNAVAILABLE when the release could not
//! commit: the jobs then come back when their leases run out). A request the stream cannot go on after (a
//! second `subscribe`, a credit out of range) ends it with INVALID_ARGUMENT,
//! and one past a limit (`--max-message-bytes`, the connection's request
//! bytes or credit: `crate::conn_limit`) with RESOURCE_EXHAUSTED; its
//! unsettled jobs are released as when any stream closes. Each message's
//! charge on its connection's request budget is held by its settles until
//! their results are handed to the response, and the next message is read
//! only once the connection has room for one of the largest size. When the
//! dispatcher ends the stream (a drain), no more requests are read, and the
//! settles already under way are finished and reported before the response
//! ends with the dispatcher's status, as a unary Ack in flight during a
//! drain is answered.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures_core::Stream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use crate::auth::Identity;
use crate::broker::Broker;
use crate::config::RequestLimits;
use crate::conn_limit::RequestCharge;
use crate::dispatch::{DeliveryStream, Event, Input, StreamId};
use crate::domain::{
    AckReq, ExtendReq, JobId, LeaseToken, MAX_IN_FLIGHT, NackReq, NewJob, ProgressReq, Subscription,
};
use crate::error::{Error, Result};
use crate::pb;
use crate::pb::SettleOp;
use crate::request_limit::StreamBudget;
use crate::stream_limit::Limited;
use crate::telemetry::{Settle, Traced, Traces};

/// Settle results waiting to be sent, per stream. Bounded: a client that
/// stops reading responses stops having its requests read.
const RESULTS_BACKLOG: usize = 256;
/// Settle tasks one stream may have under way; past it the stream's next
/// request is read only when one finishes.
const MAX_PENDING_SETTLES: usize = 1024;

/// A stream writes its progress reports at most this often (the latest per
/// job since the last write, in one statement): progress is advice, and a
/// report not yet written is replaced by the next.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// An ack's credit goes back to the dispatcher as the ack arrives once the
/// stream's acks not yet committed hold 1/EARLY_CREDIT_SHARE of its credit
/// (`Reader::acks`; docs/BENCHMARKS.md, "Credit back when the ack arrives").
const EARLY_CREDIT_SHARE: u64 = 16;

/// A settle result (or the error that ends the stream) on its way to the
/// response, with the charge of the message it answers: the connection's
/// request budget counts a message until its results are sent.
type Outgoing = (
    Result<pb::SettleResults, Status>,
    Option<Arc<RequestCharge>>,
);

/// How many jobs a stream has been sent and how many of them its client has
/// settled on it since: what the stream holds, as the reader can tell it,
/// and what its acks do as they arrive ([`Held::acks_arrive`]). It counts
/// high when a lease runs out or a job is settled by a unary call (those
/// never come back down), which only makes acks linger less. Sans-IO: the
/// simulation (`crate::sim`) keeps one per stream too.
#[derive(Default)]
pub(crate) struct Held {
    /// Whether the stream's acks may linger at all (see [`may_linger`]).
    may_linger: bool,
    /// Deliveries the response has passed on.
    delivered: AtomicU64,
    /// Jobs the client acked or nacked on the stream (well-formed entries
    /// only, whatever their outcome).
    settled: AtomicU64,
    /// Jobs acked on the stream whose ack statement has not answered yet:
    /// the dispatcher counts them against the stream's credit until then.
    acking: AtomicU64,
}

/// What acks arriving on a stream do (see [`Held::acks_arrive`]).
#[derive(Debug)]
pub(crate) struct AckPlan {
    /// They may wait for company (the ack linger).
    pub linger: bool,
    /// What the dispatcher hears now, before the acks commit, if anything.
    pub tell: Option<Input>,
}

/// Whether acks of a stream whose leases last `lease_ms` (None: each
/// queue's default, at least [`leaseq_proto::limits::MIN_LEASE`]) may wait
/// `linger` for company: only when the lease is long beside it (ten
/// lingers). Leases are 1 s at least and the linger at most 1 s, so an ack
/// sent half-way through a 1 s lease could otherwise linger past its end:
/// the lease ran out, the job went back, and the ack was refused (found by
/// the simulation, seed 103336 of a soak).
pub(crate) fn may_linger(lease_ms: Option<i64>, linger: std::time::Duration) -> bool {
    let lease = lease_ms.unwrap_or(leaseq_proto::limits::MIN_LEASE.as_millis() as i64);
    !linger.is_zero() && lease >= 10 * linger.as_millis() as i64
}

impl Held {
    /// The ledger of a new stream (`may_linger`: see [`may_linger`]).
    pub fn new(may_linger: bool) -> Held {
        Held {
            may_linger,
            ..Held::default()
        }
    }

    fn jobs(&self) -> u64 {
        let settled = self.settled.load(Ordering::Relaxed);
        self.delivered
            .load(Ordering::Relaxed)
            .saturating_sub(settled)
    }

    /// `n` deliveries went out on the stream.
    pub fn delivered(&self, n: u64) {
        self.delivered.fetch_add(n, Ordering::Relaxed);
    }

    /// Well-formed acks of `leases` arrive on a stream whose credit is
    /// `credit`. An ack may wait for company (the ack linger) only while
    /// the stream has credit to spare: a consumer with all its credit in
    /// use (one taking one job at a time, say) has its acks confirmed at
    /// once, not a linger later. Its next delivery does not wait for
    /// either: the consumer is done with these jobs, so their credit comes
    /// back now, not when the ack commits, as a RabbitMQ channel frees a
    /// prefetch slot when the ack arrives (a lingering ack would otherwise
    /// hold it 12 ms more; flat out, the streams then fall behind and a
    /// backlog builds up in the table: docs/BENCHMARKS.md, "Credit back
    /// when the ack arrives"). Only while the acks not yet committed hold a
    /// sixteenth of the stream's credit or more: below that the
    /// dispatcher's count is nearly right, and at light load an early
    /// return would cost it a wake-up per ack. (Waiting until half the
    /// credit is taken instead lost the gain flat out.) The dispatcher
    /// keeps the leases until the acks commit (`Input::Acking`): a lease
    /// forgotten before its ack committed looked lost to the poll's sweep,
    /// which released it (a valid ack refused: issue 32's first case).
    /// Credit is kept per lease token, so an ack with a stale token frees
    /// nothing.
    pub fn acks_arrive(&self, credit: u32, leases: Vec<(JobId, LeaseToken)>) -> AckPlan {
        let linger = self.may_linger && self.jobs() < u64::from(credit);
        let n = leases.len() as u64;
        self.settled.fetch_add(n, Ordering::Relaxed);
        let acking = self.acking.fetch_add(n, Ordering::Relaxed) + n;
        let tell = (EARLY_CREDIT_SHARE * acking >= u64::from(credit) && !leases.is_empty())
            .then(|| Input::Acking(leases));
        AckPlan { linger, tell }
    }

    /// `n` acks of the stream answered (committed or failed).
    pub fn acks_answered(&self, n: u64) {
        self.acking.fetch_sub(n, Ordering::Relaxed);
    }

    /// A job the stream held was cancelled (its client is told).
    pub fn cancelled(&self) {
        self.settled.fetch_add(1, Ordering::Relaxed);
    }

    /// A well-formed nack arrived on the stream.
    fn nacked(&self) {
        self.settled.fetch_add(1, Ordering::Relaxed);
    }
}

/// The first request, parsed: the subscription and its options.
pub(super) struct Opening {
    pub sub: Subscription,
    pub confirm: bool,
    /// Settles and credit the first message carried besides `subscribe`.
    pub rest: pb::ConsumeRequest,
    /// What the stream holds of its connection's budgets (none until the
    /// handler sets it).
    pub budget: StreamBudget,
}

impl Opening {
    pub fn parse(mut first: pb::ConsumeRequest) -> Result<Opening> {
        let sub = first.subscribe.take().ok_or_else(|| {
            Error::invalid(
                "subscribe",
                "the first message must open the subscription (queues, consumer, credit, lease)",
            )
        })?;
        let sub = Subscription::parse(sub).map_err(|e| e.in_field("subscribe"))?;
        Ok(Opening {
            sub,
            confirm: first.confirm_settles,
            rest: first,
            budget: StreamBudget::default(),
        })
    }
}

/// Starts the stream: the reader task, and the response it feeds.
#[allow(clippy::too_many_arguments)]
pub(super) fn start(
    broker: Arc<Broker>,
    limits: RequestLimits,
    traces: Traces,
    who: Identity,
    id: StreamId,
    deliveries: DeliveryStream,
    opening: Opening,
    requests: Streaming<pb::ConsumeRequest>,
) -> ConsumeStream {
    let mut budget = opening.budget;
    let (tx, rx) = mpsc::channel(RESULTS_BACKLOG);
    let ended = CancellationToken::new();
    let held = Arc::new(Held::new(may_linger(
        opening.sub.lease_ms,
        broker.ack_linger(),
    )));
    let reader = Reader {
        broker,
        limits,
        traces,
        who,
        id,
        confirm: opening.confirm,
        credit: opening.sub.max_in_flight,
        held: held.clone(),
        results: tx,
        settles: JoinSet::new(),
        ended: ended.clone(),
        charge: budget.opening(),
        budget,
        progress: std::collections::HashMap::new(),
        progress_due: None,
        progress_written: None,
    };
    tokio::spawn(reader.run(opening.rest, requests));
    ConsumeStream {
        deliveries: Some(deliveries),
        results: rx,
        ending: None,
        ended,
        held,
    }
}

struct Reader {
    broker: Arc<Broker>,
    limits: RequestLimits,
    /// Spans of the settles (off by default).
    traces: Traces,
    /// The caller: follow-up jobs need the enqueue permission on their
    /// queues.
    who: Identity,
    id: StreamId,
    confirm: bool,
    /// The stream's max_in_flight, as last set.
    credit: u32,
    /// What the stream holds (shared with the response).
    held: Arc<Held>,
    /// To the response stream: settle results, or the error that ends it.
    results: mpsc::Sender<Outgoing>,
    /// Settles under way (their results go to `results` when done).
    settles: JoinSet<()>,
    /// Cancelled by the response when the dispatcher ended the stream (a
    /// drain): read no more, finish the settles under way, and end.
    ended: CancellationToken,
    /// The connection's budgets: room for the next message, its charge,
    /// the stream's credit (`crate::conn_limit`).
    budget: StreamBudget,
    /// The charge of the message being applied; its settles hold it until
    /// their results are sent.
    charge: Option<Arc<RequestCharge>>,
    /// Progress reports not yet written: the latest per job, with the
    /// (job id, lease token) as sent.
    progress: std::collections::HashMap<JobId, ((String, String), ProgressReq)>,
    /// When the pending reports are written (Some while any is pending).
    progress_due: Option<tokio::time::Instant>,
    /// When the last write started: the next waits [`PROGRESS_EVERY`].
    progress_written: Option<tokio::time::Instant>,
}

impl Reader {
    async fn run(mut self, first: pb::ConsumeRequest, mut requests: Streaming<pb::ConsumeRequest>) {
        let mut next = Some(first);
        loop {
            if let Some(msg) = next.take() {
                let applied = self.apply(msg);
                self.charge = None;
                if let Err(e) = applied {
                    // The stream cannot go on: end it with this status.
                    // The settles already started run to their end (see
                    // below).
                    let _ = self.results.send((Err(e.into()), None)).await;
                    self.settles.detach_all();
                    return;
                }
            }
            while self.settles.len() >= MAX_PENDING_SETTLES {
                self.settles.join_next().await;
            }
            // Due progress goes before the next message: a client that
            // keeps sending would otherwise keep the select's first arms
            // ready and the write waiting.
            if self
                .progress_due
                .is_some_and(|at| at <= tokio::time::Instant::now())
            {
                self.write_progress();
            }
            let progress_due = self.progress_due;
            tokio::select! {
                biased;
                // The dispatcher ended the stream (and released its jobs):
                // the settles already sent are answered, nothing more is read.
                _ = self.ended.cancelled() => {
                    while self.settles.join_next().await.is_some() {}
                    return;
                }
                // The next message once the connection has room for it.
                msg = self.budget.read(&mut requests) => match msg {
                    Ok(Some((msg, charge))) => {
                        self.charge = charge;
                        next = Some(msg);
                    }
                    // Half-close: finish what was sent, then end the stream.
                    Ok(None) => break,
                    // A message past a limit: the stream ends with its
                    // status. Or the client is gone (reset, connection
                    // lost): then the response is gone too (the send fails
                    // at once), and dropping it releases the jobs.
                    //
                    // The settles it sent and that are running are not
                    // dropped with it: an ack dropped half-way rolled back,
                    // and its lease, left to the ack by the stream's
                    // release (`Core::close`), stayed until it ran out
                    // (tests/ack_enqueue.rs, a reset during an ack).
                    Err(status) => {
                        let _ = self.results.send((Err(status), None)).await;
                        self.settles.detach_all();
                        return;
                    }
                },
                // Reap finished settles as they go.
                Some(_) = self.settles.join_next(), if !self.settles.is_empty() => {}
                // The pending progress reports, a second after the last.
                () = async {
                    if let Some(at) = progress_due {
                        tokio::time::sleep_until(at).await;
                    }
                }, if progress_due.is_some() => self.write_progress(),
            }
        }
        // Half-closed: what the client reported last is written too.
        if !self.progress.is_empty() {
            self.write_progress();
        }
        let dispatcher = self.broker.dispatcher();
        dispatcher.set_credit(self.id, 0);
        while self.settles.join_next().await.is_some() {}
        // The response ends when this task drops its sender, so the client
        // sees OK only after the release has committed; when it could not
        // commit, UNAVAILABLE says so.
        if !dispatcher.finish(self.id).await {
            let status = Status::unavailable(
                "the stream's unsettled jobs could not be released (the database could not \
                 be reached): they come back when their leases run out",
            );
            let _ = self.results.send((Err(status), None)).await;
        }
    }

    /// Validates and starts what one request asks for. An error here ends the
    /// stream; per-entry problems are reported as settle results instead.
    fn apply(&mut self, msg: pb::ConsumeRequest) -> Result<()> {
        if msg.subscribe.is_some() {
            return Err(Error::invalid(
                "subscribe",
                "only the first message may carry it; open another stream for another subscription",
            ));
        }
        if msg.max_in_flight != 0 {
            if msg.max_in_flight > MAX_IN_FLIGHT {
                return Err(Error::invalid(
                    "max_in_flight",
                    format!("must be 1 to {MAX_IN_FLIGHT} (0 leaves the credit as it is)"),
                ));
            }
            self.budget.raise_credit(msg.max_in_flight)?;
            self.broker
                .dispatcher()
                .set_credit(self.id, msg.max_in_flight);
            self.credit = msg.max_in_flight;
        }
        self.acks(msg.acks);
        self.nacks(msg.nacks);
        self.extends(msg.extends);
        self.report_progress(msg.progress);
        Ok(())
    }

    /// Validates progress reports: a malformed one is answered at once
    /// (SETTLE_OP_PROGRESS, naming `progress[i].field`); the others replace
    /// the pending report of their job, to be written at most once a
    /// second ([`PROGRESS_EVERY`]).
    fn report_progress(&mut self, items: Vec<pb::Progress>) {
        if items.is_empty()
            || self.too_many("progress", SettleOp::Progress, &items, |p| {
                (&p.job_id, &p.lease_token)
            })
        {
            return;
        }
        let mut refused = Vec::new();
        for (i, p) in items.into_iter().enumerate() {
            match ProgressReq::parse(&p.job_id, &p.lease_token, p.fraction, p.message) {
                Ok(req) => {
                    self.progress
                        .insert(req.job_id, ((p.job_id, p.lease_token), req));
                }
                Err(e) => refused.push(failure(
                    (&p.job_id, &p.lease_token),
                    SettleOp::Progress,
                    e.in_field(&format!("progress[{i}]")),
                )),
            }
        }
        if !refused.is_empty() {
            let (tx, charge) = (self.results.clone(), self.charge.clone());
            self.settles
                .spawn(async move { send(&tx, refused, charge).await });
        }
        if !self.progress.is_empty() && self.progress_due.is_none() {
            let now = tokio::time::Instant::now();
            let next = self.progress_written.map_or(now, |t| t + PROGRESS_EVERY);
            self.progress_due = Some(next.max(now));
        }
    }

    /// Writes the pending progress reports in one statement and answers
    /// them: a stale token FAILED_PRECONDITION, a written one only with
    /// `confirm_settles`.
    fn write_progress(&mut self) {
        self.progress_due = None;
        self.progress_written = Some(tokio::time::Instant::now());
        let (sent, reqs): (Vec<(String, String)>, Vec<ProgressReq>) =
            std::mem::take(&mut self.progress).into_values().unzip();
        let (broker, tx, confirm) = (self.broker.clone(), self.results.clone(), self.confirm);
        self.settles.spawn(async move {
            let results: Vec<pb::SettleResult> = match broker.progress(&reqs).await {
                Ok(written) => sent
                    .iter()
                    .zip(reqs.iter().zip(written))
                    .filter_map(|((id, token), (req, ok))| match ok {
                        true if confirm => Some(success((id, token), SettleOp::Progress)),
                        true => None,
                        false => Some(failure(
                            (id, token),
                            SettleOp::Progress,
                            Error::StaleLease(req.job_id.0),
                        )),
                    })
                    .collect(),
                Err(e) => sent
                    .iter()
                    .map(|(id, token)| failure((id, token), SettleOp::Progress, e.clone()))
                    .collect(),
            };
            send(&tx, results, None).await;
        });
    }

    /// Checks a list's length: past the batch limit, every entry is refused.
    fn too_many<T>(
        &self,
        field: &str,
        op: SettleOp,
        items: &[T],
        key: impl Fn(&T) -> (&str, &str),
    ) -> bool {
        let max = self.limits.max_batch_jobs;
        if items.len() <= max {
            return false;
        }
        let e = Error::too_large(
            field,
            format!("{} entries in one message, the limit is {max}", items.len()),
        );
        let results = items
            .iter()
            .map(|i| failure(key(i), op, e.clone()))
            .collect();
        let _ = self
            .results
            .try_send((Ok(pb::SettleResults { results }), self.charge.clone()));
        true
    }

    fn acks(&mut self, acks: Vec<pb::AckRequest>) {
        if acks.is_empty()
            || self.too_many("acks", SettleOp::Ack, &acks, |a| {
                (&a.job_id, &a.lease_token)
            })
        {
            return;
        }
        let mut results = Vec::new();
        // (job id, lease token) as sent, and the parsed request.
        let mut valid: Vec<((String, String), AckReq)> = Vec::new();
        // Acks with follow-up jobs: each a transaction of its own.
        let mut with_jobs: Vec<((String, String), AckReq, Vec<NewJob>)> = Vec::new();
        for (i, a) in acks.into_iter().enumerate() {
            let parsed = AckReq::parse(&a, &self.limits).and_then(|r| {
                super::queue::follow_ups(a.enqueue, &self.limits, &self.who).map(|j| (r, j))
            });
            match parsed {
                Ok((r, jobs)) if jobs.is_empty() => valid.push(((a.job_id, a.lease_token), r)),
                Ok((r, jobs)) => with_jobs.push(((a.job_id, a.lease_token), r, jobs)),
                Err(e) => results.push(failure(
                    (&a.job_id, &a.lease_token),
                    SettleOp::Ack,
                    e.in_field(&format!("acks[{i}]")),
                )),
            }
        }
        let n = (valid.len() + with_jobs.len()) as u64;
        let plan = self.held.acks_arrive(
            self.credit,
            valid
                .iter()
                .map(|(_, r)| r)
                .chain(with_jobs.iter().map(|(_, r, _)| r))
                .map(|r| (r.job_id, r.token))
                .collect(),
        );
        let linger = plan.linger;
        if let Some(input) = plan.tell {
            self.broker.dispatcher().tell(input);
        }
        let held = self.held.clone();
        let (broker, tx, confirm) = (self.broker.clone(), self.results.clone(), self.confirm);
        let charge = self.charge.clone();
        let spans = self.traces.settles(
            "Consume",
            Settle::Ack,
            valid.iter().map(|((id, _), _)| id.as_str()),
        );
        let traces = self.traces.clone();
        self.settles.spawn(async move {
            // Acks with follow-ups, at once beside the others'.
            let follow =
                futures_util::future::join_all(with_jobs.into_iter().map(|(sent, req, jobs)| {
                    ack_enqueue(&broker, &traces, confirm, sent, req, jobs)
                }));
            let plain = ack_plain(&broker, linger, confirm, valid, spans);
            let (plain, follow) = futures_util::join!(plain, follow);
            held.acks_answered(n);
            results.extend(plain);
            results.extend(follow.into_iter().flatten());
            send(&tx, results, charge).await;
        });
    }

    fn nacks(&mut self, nacks: Vec<pb::NackRequest>) {
        if nacks.is_empty()
            || self.too_many("nacks", SettleOp::Nack, &nacks, |n| {
                (&n.job_id, &n.lease_token)
            })
        {
            return;
        }
        for (i, n) in nacks.into_iter().enumerate() {
            let (id, token) = (n.job_id.clone(), n.lease_token.clone());
            let (broker, tx, confirm) = (self.broker.clone(), self.results.clone(), self.confirm);
            let (traces, charge) = (self.traces.clone(), self.charge.clone());
            let parsed = NackReq::parse(n);
            if parsed.is_ok() {
                self.held.nacked();
            }
            self.settles.spawn(async move {
                let result = match parsed {
                    Err(e) => Some(failure(
                        (&id, &token),
                        SettleOp::Nack,
                        e.in_field(&format!("nacks[{i}]")),
                    )),
                    Ok(req) => match nack(&broker, &traces, &id, req).await {
                        Ok(dead) if confirm => Some(pb::SettleResult {
                            dead_lettered: dead,
                            ..success((&id, &token), SettleOp::Nack)
                        }),
                        Ok(_) => None,
                        Err(e) => Some(failure((&id, &token), SettleOp::Nack, e)),
                    },
                };
                send(&tx, result.into_iter().collect(), charge).await;
            });
        }
    }

    fn extends(&mut self, extends: Vec<pb::ExtendLeaseRequest>) {
        if extends.is_empty()
            || self.too_many("extends", SettleOp::Extend, &extends, |x| {
                (&x.job_id, &x.lease_token)
            })
        {
            return;
        }
        for (i, x) in extends.into_iter().enumerate() {
            let (broker, tx, confirm) = (self.broker.clone(), self.results.clone(), self.confirm);
            let (traces, charge) = (self.traces.clone(), self.charge.clone());
            self.settles.spawn(async move {
                let result = match ExtendReq::parse(&x) {
                    Err(e) => Some(failure(
                        (&x.job_id, &x.lease_token),
                        SettleOp::Extend,
                        e.in_field(&format!("extends[{i}]")),
                    )),
                    Ok(req) => match extend(&broker, &traces, &x.job_id, req).await {
                        Ok(at) if confirm => Some(pb::SettleResult {
                            lease_expires_at: Some(std::time::SystemTime::from(at).into()),
                            ..success((&x.job_id, &x.lease_token), SettleOp::Extend)
                        }),
                        Ok(_) => None,
                        Err(e) => Some(failure((&x.job_id, &x.lease_token), SettleOp::Extend, e)),
                    },
                };
                send(&tx, result.into_iter().collect(), charge).await;
            });
        }
    }
}

/// The stream's acks without follow-ups, through the ack batcher (one
/// group-commit unit): the results to send (failures, and successes when
/// confirmed).
async fn ack_plain(
    broker: &Broker,
    linger: bool,
    confirm: bool,
    valid: Vec<((String, String), AckReq)>,
    spans: Vec<crate::telemetry::JobSpan>,
) -> Vec<pb::SettleResult> {
    let mut results = Vec::new();
    if valid.is_empty() {
        return results;
    }
    let (keys, reqs): (Vec<(String, String)>, Vec<AckReq>) = valid.into_iter().unzip();
    let outcomes = if linger {
        broker.ack_streamed(reqs).await
    } else {
        broker.ack_many(reqs).await
    };
    match &outcomes {
        Ok(r) => spans
            .into_iter()
            .zip(r)
            .for_each(|(s, r)| s.settled(r.as_ref().err())),
        Err(e) => spans.into_iter().for_each(|s| s.settled(Some(e))),
    }
    match outcomes {
        Ok(outcomes) => {
            for ((id, token), r) in keys.iter().zip(outcomes) {
                match r {
                    Ok(()) if confirm => results.push(success((id, token), SettleOp::Ack)),
                    Ok(()) => {}
                    Err(e) => results.push(failure((id, token), SettleOp::Ack, e)),
                }
            }
        }
        Err(e) => results.extend(
            keys.iter()
                .map(|(id, token)| failure((id, token), SettleOp::Ack, e.clone())),
        ),
    }
    results
}

/// An ack with follow-up jobs on the stream, in its span: its result
/// (with the follow-ups' ids when confirmed), if one is to be sent.
async fn ack_enqueue(
    broker: &Broker,
    traces: &Traces,
    confirm: bool,
    (id, token): (String, String),
    req: AckReq,
    jobs: Vec<NewJob>,
) -> Option<pb::SettleResult> {
    let span = traces.settle("Consume", Settle::Ack, &id);
    let r = broker.ack_enqueue(req, jobs).await;
    span.settled(r.as_ref().err());
    match r {
        Ok(ids) if confirm => Some(pb::SettleResult {
            enqueued: ids.iter().map(|e| e.job_id.to_string()).collect(),
            ..success((&id, &token), SettleOp::Ack)
        }),
        Ok(_) => None,
        Err(e) => Some(failure((&id, &token), SettleOp::Ack, e)),
    }
}

/// A nack on the stream, in its span.
async fn nack(broker: &Broker, traces: &Traces, id: &str, req: NackReq) -> Result<bool> {
    let span = traces.settle("Consume", Settle::Nack, id);
    let r = broker.nack(req).await;
    span.nacked(r.as_ref().copied());
    r
}

/// A lease extension on the stream, in its span.
async fn extend(
    broker: &Broker,
    traces: &Traces,
    id: &str,
    req: ExtendReq,
) -> Result<chrono::DateTime<chrono::Utc>> {
    let span = traces.settle("Consume", Settle::Extend, id);
    let r = broker.extend(req).await;
    span.settled(r.as_ref().err());
    r
}

/// A settle as the client sent it: (job id, lease token), echoed in its
/// result so that two settles of one job can be told apart.
type Sent<'a> = (&'a str, &'a str);

fn success((job_id, token): Sent<'_>, op: SettleOp) -> pb::SettleResult {
    pb::SettleResult {
        job_id: job_id.to_owned(),
        lease_token: token.to_owned(),
        op: op as i32,
        ..Default::default()
    }
}

/// The result the unary call would have given, as a settle result.
fn failure((job_id, token): Sent<'_>, op: SettleOp, e: Error) -> pb::SettleResult {
    let status = Status::from(e);
    pb::SettleResult {
        job_id: job_id.to_owned(),
        lease_token: token.to_owned(),
        op: op as i32,
        code: status.code() as i32,
        message: status.message().to_owned(),
        ..Default::default()
    }
}

async fn send(
    tx: &mpsc::Sender<Outgoing>,
    results: Vec<pb::SettleResult>,
    charge: Option<Arc<RequestCharge>>,
) {
    if !results.is_empty() {
        let _ = tx.send((Ok(pb::SettleResults { results }), charge)).await;
    }
}

/// The response of one Consume call: deliveries and heartbeats from the
/// dispatcher, settle results from the reader.
pub struct ConsumeStream {
    /// None once the dispatcher ended the stream (closed or drained).
    deliveries: Option<DeliveryStream>,
    results: mpsc::Receiver<Outgoing>,
    /// The status the dispatcher ended the stream with, sent once the
    /// reader has reported the settles it had under way.
    ending: Option<Status>,
    /// Tells the reader the dispatcher ended the stream.
    ended: CancellationToken,
    /// Counts the deliveries passed on (for the reader).
    held: Arc<Held>,
}

impl Stream for ConsumeStream {
    type Item = Result<pb::ConsumeResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        use pb::consume_response::Kind;
        let this = &mut *self;
        if let Some(d) = this.deliveries.as_mut() {
            match Pin::new(d).poll_next(cx) {
                Poll::Ready(Some(Ok(event))) => {
                    let kind = match event {
                        Event::Delivery(d) => {
                            this.held.delivered(1);
                            Kind::Delivery(d)
                        }
                        Event::Deliveries(d) => {
                            this.held.delivered(d.len() as u64);
                            Kind::Deliveries(pb::Deliveries { deliveries: d })
                        }
                        Event::Cancelled(c) => {
                            // Its credit is back: it counts as settled.
                            this.held.cancelled();
                            Kind::Cancelled(c)
                        }
                        Event::Heartbeat(h) => Kind::Heartbeat(h),
                    };
                    return Poll::Ready(Some(Ok(pb::ConsumeResponse { kind: Some(kind) })));
                }
                // Ended by the dispatcher (a drain): first the results of
                // the settles under way, then this status.
                Poll::Ready(Some(Err(status))) => {
                    this.deliveries = None;
                    this.ending = Some(status);
                    this.ended.cancel();
                }
                // Closed after a half-close: send what results are left.
                Poll::Ready(None) => this.deliveries = None,
                Poll::Pending => {}
            }
        }
        match this.results.poll_recv(cx) {
            Poll::Ready(Some((Ok(results), _charge))) => {
                Poll::Ready(Some(Ok(pb::ConsumeResponse {
                    kind: Some(Kind::Settled(results)),
                })))
            }
            Poll::Ready(Some((Err(status), _))) => Poll::Ready(Some(Err(status))),
            // The reader is done; end once the deliveries have ended too.
            Poll::Ready(None) if this.deliveries.is_none() => {
                Poll::Ready(this.ending.take().map(Err))
            }
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

/// What the Consume handler returns: the stream (its deliveries traced when
/// tracing is on), holding its place under the broker's stream cap while it
/// lives.
pub type ConsumeResponse = Limited<Traced<ConsumeStream>>;
