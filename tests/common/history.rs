//! The history of one fault run, Jepsen style, and its checker.
//!
//! Clients record what they saw (never what they assume): every Enqueue
//! that returned OK or failed (with its dedup key, when it had one), every
//! delivery (job id, attempt, lease token, stream, broker, receive time, and
//! the `lease_expires_at` the broker sent, which is database time), every
//! Ack, Nack and ExtendLease with the time it was sent and its outcome,
//! streams opened (with their credit), dropped by the client or ended by the
//! broker, samples of how many jobs waited deliverable in the database, and
//! the faults the test injected. [`History::check`] then lists the
//! anomalies (docs/RELIABILITY.md has the table).
//!
//! Job keys (`EnqueueRequest.key`, issue 33): a producer records the key
//! of each Enqueue it sends ([`History::job_key`]), the test the queues it
//! ordered by key ([`History::ordered_by_key`]), and each delivery keeps
//! the key it names. The checker holds the keyed jobs of those queues to
//! the invariant of docs/design/stream-messages.md ("Issue 33: keys"): no
//! job of a key delivered while `key_concurrency` jobs of that key before
//! it (smaller id) were live, neither acked nor dead-lettered, and never
//! more than `key_concurrency` of a key leased at once (see
//! [`History::check`]).
//!
//! Two clocks appear:
//! - database time (`lease_expires_at`, and the lease start derived from it,
//!   `lease_expires_at - lease`): orders the leases of one job, since every
//!   lease statement's `now()` follows the commit that freed the job;
//! - the test process's monotonic clock (`t`, from one `Instant`): orders
//!   client actions (a Nack sent, a stream dropped, SIGTERM sent) before a
//!   later delivery was received.
//!
//! They are compared with each other only through [`History::db_at`]: the
//! wall clock at the history's start plus the monotonic time since, plus
//! the jumps the test made the database server's clock take
//! ([`History::db_clock_jump`]). The tests' PostgreSQL runs on this machine,
//! so without a jump the database clock is this process's wall clock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leaseq::pb;
use tonic::Code;

/// The broker of a settle sent through a balancer: which broker handled it
/// is not known (for the recovery after a fault, it may be any).
pub const UNKNOWN_BROKER: usize = usize::MAX - 1;

/// One delivery as the client received it.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub stream: u64,
    pub broker: usize,
    pub id: String,
    pub payload: String,
    pub attempt: i32,
    /// The job's key (`Job.key`; empty: none).
    pub key: String,
    pub token: String,
    /// Database time, microseconds since the epoch.
    pub expires_us: i64,
    /// `expires_us - lease`: the database's `now()` when it was leased.
    pub start_us: i64,
    /// The job's `enqueued_at`, database time: equal to `start_us` when the
    /// job was handed off at its insert (inserted already leased).
    pub enqueued_us: i64,
    /// A schedule's job: the schedule's name and its tick, as the job's
    /// `leaseq-schedule` and `leaseq-schedule-tick` headers name them.
    pub tick: Option<(String, String)>,
    /// Local receive time.
    pub t: Duration,
}

#[derive(Clone, Debug)]
pub struct Fault {
    pub kind: &'static str,
    /// The broker the fault hit, if one.
    pub broker: Option<usize>,
    pub injected: Duration,
    /// When the test undid it (restart, Postgres start, SIGCONT); None if
    /// it heals by itself.
    pub healed: Option<Duration>,
    /// Whether streams may receive nothing while it lasts: those of
    /// `broker`, or every stream when it hit no one broker. A client's own
    /// cut excuses nothing.
    pub excuses_stalls: bool,
    /// A client's own doing (a cut stream): nothing to recover from.
    pub by_client: bool,
}

/// A settle a client sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Ack,
    Nack,
    Extend,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Ack => "ack",
            Op::Nack => "nack",
            Op::Extend => "extend",
        }
    }
}

/// What became of a settle.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    /// Sent, never answered (the client stopped waiting).
    Pending,
    Ok,
    /// FAILED_PRECONDITION: the broker says the token was not current.
    Refused,
    /// Any other error: it may or may not have happened.
    Unknown(Code),
}

#[derive(Clone, Debug)]
struct Settle {
    op: Op,
    id: String,
    token: String,
    /// The broker it was sent to.
    broker: usize,
    sent: Duration,
    answered: Option<Duration>,
    outcome: Outcome,
    /// ExtendLease answered OK: the new expiry (database time, µs).
    expires_us: Option<i64>,
    /// An Ack's follow-up jobs (`AckRequest.enqueue`), by payload.
    follow_ups: Vec<String>,
    /// An Ack answered OK: the follow-ups' ids it answered
    /// (`AckResponse.enqueued`, `SettleResult.enqueued`).
    enqueued: Vec<String>,
}

impl Settle {
    /// Whether it may have released or completed its lease (it was not
    /// refused).
    fn may_have_released(&self) -> bool {
        matches!(self.op, Op::Ack | Op::Nack) && self.outcome != Outcome::Refused
    }
}

/// A handle on a recorded settle, for its outcome.
#[derive(Clone, Copy, Debug)]
pub struct Sent(usize);

#[derive(Clone, Debug)]
struct StreamRec {
    broker: usize,
    opened: Duration,
    /// The stream's credit (max_in_flight); 0: not checked for stalls.
    credit: u32,
    consume: bool,
}

/// One Enqueue with a dedup key.
#[derive(Clone, Debug)]
struct Keyed {
    key: String,
    payload: String,
    sent: Duration,
    /// None: it failed, and may or may not have created a job.
    answer: Option<(Duration, String, bool)>,
}

/// Bounds the checker holds the run to (stated per test, in its FAULTS
/// line and in docs/RELIABILITY.md).
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Every job enqueued OK is settled within this long of the end of the
    /// faults ([`History::faults_over`]), or of its Enqueue when later.
    pub settle: Duration,
    /// No stream with free credit goes this long without a delivery while
    /// jobs wait deliverable, outside the faults that excuse it.
    pub stall: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            settle: Duration::from_secs(15),
            stall: Duration::from_secs(5),
        }
    }
}

#[derive(Default)]
struct Inner {
    /// payload -> (id, local time answered)
    enq_ok: HashMap<String, (String, Duration)>,
    /// payload -> the broker its Enqueue went to, where known.
    enq_broker: HashMap<String, usize>,
    enq_err: HashMap<String, Code>,
    keyed: Vec<Keyed>,
    /// payload -> (queue, job key) of each Enqueue sent with a job key
    /// (`EnqueueRequest.key`), whatever its outcome.
    job_keys: HashMap<String, (String, String)>,
    /// Queues ordered by key, and their key_concurrency.
    ordered: HashMap<String, usize>,
    /// Queues with a per-key concurrency limit and no order.
    key_limited: HashMap<String, usize>,
    deliveries: Vec<Delivered>,
    settles: Vec<Settle>,
    streams: HashMap<u64, StreamRec>,
    /// stream -> local time the client dropped it, half-closed it, or its
    /// deadline passed (it releases its jobs).
    dropped: HashMap<u64, Duration>,
    /// Those of `dropped` the client half-closed (a Consume stream it then
    /// reads to its end), at that local time.
    half_closed: HashMap<u64, Duration>,
    /// stream -> (local time, end status) when the broker ended it.
    ended: HashMap<u64, (Duration, Option<Code>)>,
    /// broker -> times SIGTERM was sent (a drain releases its streams' jobs).
    drains: Vec<(usize, Duration)>,
    faults: Vec<Fault>,
    /// (local time, deliverable jobs waiting; None: the sample failed).
    ready: Vec<(Duration, Option<i64>)>,
    /// (local time, the database clock's offset from then on, µs).
    db_offsets: Vec<(Duration, i64)>,
    faults_over: Option<Duration>,
    bounds: Bounds,
    /// Every error a client saw: (operation, code, local time).
    errors: Vec<(&'static str, Code, Duration)>,
    next_stream: u64,
    /// Jobs still leased for a Consume stream when it had ended OK after
    /// its half-close, as the database showed then (see
    /// [`History::half_close_left`]).
    half_close_left: Vec<String>,
    /// Half-closes that ended OK and were checked so.
    half_closes_checked: usize,
    /// The database the consumers look at (set by `Load::watch`).
    db: Option<sqlx::PgPool>,
    /// Schedules whose ticks the checker holds to one job each, by name.
    schedules: BTreeMap<String, Ticks>,
}

/// A schedule firing every second (`* * * * * *`, catch-up `all`): what
/// the test knows of its ticks (database time, µs since the epoch).
#[derive(Clone, Debug)]
struct Ticks {
    /// Its first tick (`ScheduleInfo.next_run_at` when it was created).
    first_us: i64,
    /// Every tick up to this one must have fired (None: not stopped; the
    /// missed rule then reads nothing).
    due_us: Option<i64>,
    /// The database clock after it was deleted: no tick is later.
    deleted_us: Option<i64>,
}

impl Inner {
    /// What the history holds of one job, in local time order: its
    /// deliveries (with what became of their streams) and settles. For the
    /// post mortem of an anomaly.
    fn story(&self, id: &str) -> String {
        let mut events: Vec<(Duration, String)> = Vec::new();
        for d in self.deliveries.iter().filter(|d| d.id == id) {
            let stream = match (self.dropped.get(&d.stream), self.ended.get(&d.stream)) {
                (Some(t), _) => format!("dropped by the client at {t:.3?}"),
                (None, Some((t, code))) => format!("ended by the broker at {t:.3?} ({code:?})"),
                (None, None) => "open at the end".into(),
            };
            let kind = match self.streams.get(&d.stream) {
                Some(s) if s.consume => "Consume",
                _ => "Subscribe",
            };
            events.push((
                d.t,
                format!(
                    "delivered attempt {} token {} (leased {} to {}) on {kind} stream {} of broker {} ({stream})",
                    d.attempt, d.token, d.start_us, d.expires_us, d.stream, d.broker
                ),
            ));
        }
        for s in self.settles.iter().filter(|s| s.id == id) {
            let mut answered = s.answered.map_or("never answered".to_owned(), |t| {
                format!("answered at {t:.3?}")
            });
            if !s.follow_ups.is_empty() {
                answered += &format!(
                    ", carrying follow-ups {:?} (ids answered {:?})",
                    s.follow_ups, s.enqueued
                );
            }
            events.push((
                s.sent,
                format!(
                    "{} of token {} sent to broker {}: {:?}, {answered}",
                    s.op.name(),
                    s.token,
                    s.broker,
                    s.outcome
                ),
            ));
        }
        events.sort_by_key(|e| e.0);
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|f| format!("{} on {:?} at {:.3?}", f.kind, f.broker, f.injected))
            .collect();
        let lines: Vec<String> = events
            .into_iter()
            .map(|(t, e)| format!("{t:.3?} {e}"))
            .collect();
        format!("[{}] faults: [{}]", lines.join("; "), faults.join(", "))
    }
}

/// Shared by every client task of one run.
#[derive(Clone)]
pub struct History {
    start: Instant,
    /// The wall clock at `start`, µs since the epoch.
    wall0_us: i64,
    /// Set: local time is this, not the time since `start` (the checker's
    /// self-test plants events at chosen times).
    manual: Option<Arc<Mutex<Duration>>>,
    inner: Arc<Mutex<Inner>>,
}

/// A timestamp in µs since the epoch.
pub fn ts_us(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds * 1_000_000 + i64::from(ts.nanos) / 1000
}

fn micros(t: Duration) -> i64 {
    t.as_micros() as i64
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    pub fn new() -> History {
        let start = Instant::now();
        let wall0_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_micros() as i64;
        History {
            start,
            wall0_us,
            manual: None,
            inner: Default::default(),
        }
    }

    /// A history whose local clock stands still until [`History::set_now`]
    /// moves it, starting at 0, with the database clock at `wall0_us` then.
    pub fn manual(wall0_us: i64) -> History {
        History {
            wall0_us,
            manual: Some(Arc::new(Mutex::new(Duration::ZERO))),
            ..History::new()
        }
    }

    /// Moves a [`History::manual`] clock.
    pub fn set_now(&self, t: Duration) {
        *self
            .manual
            .as_ref()
            .expect("a manual clock")
            .lock()
            .unwrap() = t;
    }

    pub fn now(&self) -> Duration {
        match &self.manual {
            Some(t) => *t.lock().unwrap(),
            None => self.start.elapsed(),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().unwrap())
    }

    /// The bounds [`History::check`] holds the run to.
    pub fn set_bounds(&self, bounds: Bounds) {
        self.with(|h| h.bounds = bounds);
    }

    pub fn bounds(&self) -> Bounds {
        self.with(|h| h.bounds)
    }

    pub fn enqueue_ok(&self, payload: &str, id: &str) {
        let t = self.now();
        self.with(|h| h.enq_ok.insert(payload.to_owned(), (id.to_owned(), t)));
    }

    /// [`History::enqueue_ok`] through broker `broker`.
    pub fn enqueue_ok_via(&self, payload: &str, id: &str, broker: usize) {
        self.enqueue_ok(payload, id);
        self.with(|h| h.enq_broker.insert(payload.to_owned(), broker));
    }

    /// An Enqueue that failed: it may still have committed.
    pub fn enqueue_err(&self, payload: &str, code: Code) {
        let t = self.now();
        self.with(|h| {
            h.enq_err.insert(payload.to_owned(), code);
            h.errors.push(("enqueue", code, t));
        });
    }

    /// An Enqueue with dedup key `key`, sent at `sent`: its answer (job id,
    /// `duplicate`) or its error. Recorded as [`History::enqueue_ok`] or
    /// [`History::enqueue_err`] too.
    pub fn enqueue_keyed(
        &self,
        key: &str,
        payload: &str,
        sent: Duration,
        r: &Result<(String, bool), tonic::Status>,
    ) {
        match r {
            Ok((id, _)) => self.enqueue_ok(payload, id),
            Err(s) => self.enqueue_err(payload, s.code()),
        }
        let t = self.now();
        self.with(|h| {
            h.keyed.push(Keyed {
                key: key.to_owned(),
                payload: payload.to_owned(),
                sent,
                answer: r.as_ref().ok().map(|(id, dup)| (t, id.clone(), *dup)),
            })
        });
    }

    /// `queue` is ordered by key (`UpdateQueueRequest.ordered_by_key`), at
    /// most `key_concurrency` jobs of a key leased at once: the checker
    /// holds its keyed jobs to per-key order.
    pub fn ordered_by_key(&self, queue: &str, key_concurrency: usize) {
        self.with(|h| h.ordered.insert(queue.to_owned(), key_concurrency));
    }

    /// `queue` has a per-key concurrency limit without order: the checker
    /// holds it to at most `key_concurrency` jobs of a key leased at once.
    pub fn key_concurrency(&self, queue: &str, key_concurrency: usize) {
        self.with(|h| h.key_limited.insert(queue.to_owned(), key_concurrency));
    }

    /// The Enqueue of `payload` into `queue` carries the job key `key`
    /// (`EnqueueRequest.key`): recorded before it is sent, its outcome as
    /// any Enqueue's ([`History::enqueue_ok`] or [`History::enqueue_err`]).
    pub fn job_key(&self, payload: &str, queue: &str, key: &str) {
        self.with(|h| {
            h.job_keys
                .insert(payload.to_owned(), (queue.to_owned(), key.to_owned()))
        });
    }

    /// A stream the checker does not hold to the stall bound (its credit is
    /// not known to it).
    pub fn stream_opened(&self, broker: usize) -> u64 {
        self.consumer_stream(broker, 0, false)
    }

    /// A consumer's stream with `credit` (0: not checked for stalls), on
    /// Consume (settles on the stream) or Subscribe.
    pub fn consumer_stream(&self, broker: usize, credit: u32, consume: bool) -> u64 {
        let t = self.now();
        self.with(|h| {
            h.next_stream += 1;
            let id = h.next_stream;
            h.streams.insert(
                id,
                StreamRec {
                    broker,
                    opened: t,
                    credit,
                    consume,
                },
            );
            id
        })
    }

    /// The client drops `stream`, or half-closes it (before the drop, so
    /// that the time is a lower bound of the release).
    pub fn stream_dropped(&self, stream: u64) {
        self.stream_dropped_at(stream, self.now());
    }

    /// The client half-closed its Consume stream `stream` (and reads it to
    /// its end): as [`History::stream_dropped`], and what arrives after it
    /// the client ignores.
    pub fn stream_half_closed(&self, stream: u64) {
        let t = self.now();
        self.stream_dropped_at(stream, t);
        self.with(|h| {
            h.half_closed.entry(stream).or_insert(t);
        });
    }

    /// As [`History::stream_dropped`], at local time `t` (say when the
    /// call's deadline passed).
    pub fn stream_dropped_at(&self, stream: u64, t: Duration) {
        self.with(|h| {
            let e = h.dropped.entry(stream).or_insert(t);
            *e = (*e).min(t);
        });
    }

    /// The database the consumers may look at (their half-close check).
    pub fn set_db(&self, pool: &sqlx::PgPool) {
        self.with(|h| h.db = Some(pool.clone()));
    }

    pub fn db(&self) -> Option<sqlx::PgPool> {
        self.with(|h| h.db.clone())
    }

    /// Consume stream `stream` ended OK after its half-close while the
    /// database still showed `jobs` leased for it (none: it checked out).
    pub fn half_close_left(&self, stream: u64, jobs: Vec<String>) {
        self.with(|h| {
            h.half_closes_checked += 1;
            for job in jobs {
                h.half_close_left.push(format!(
                    "{job}: still leased for Consume call {stream}, which had ended OK"
                ));
            }
        });
    }

    pub fn stream_ended(&self, stream: u64, status: Option<Code>) {
        let t = self.now();
        self.with(|h| {
            h.ended.insert(stream, (t, status));
            if let Some(code) = status {
                h.errors.push(("stream", code, t));
            }
        });
    }

    pub fn subscribe_err(&self, code: Code) {
        let t = self.now();
        self.with(|h| h.errors.push(("subscribe", code, t)));
    }

    pub fn delivered(
        &self,
        stream: u64,
        broker: usize,
        lease: Duration,
        d: &pb::Delivery,
    ) -> Delivered {
        let job = d.job.as_ref().expect("delivery has a job");
        let expires_us = ts_us(d.lease_expires_at.as_ref().expect("lease_expires_at"));
        let tick = job.headers.get("leaseq-schedule").map(|name| {
            let at = job.headers.get("leaseq-schedule-tick");
            (name.clone(), at.cloned().unwrap_or_default())
        });
        let rec = Delivered {
            stream,
            broker,
            id: job.id.clone(),
            payload: String::from_utf8_lossy(&job.payload).into_owned(),
            attempt: job.attempt,
            key: job.key.clone(),
            token: d.lease_token.clone(),
            expires_us,
            start_us: expires_us - micros(lease),
            // Absent only from the checker's own planted deliveries.
            enqueued_us: job.enqueued_at.as_ref().map_or(i64::MIN, ts_us),
            tick,
            t: self.now(),
        };
        self.with(|h| h.deliveries.push(rec.clone()));
        rec
    }

    /// A settle of `d` is being sent to `broker`; [`History::answered`] (or
    /// [`History::extended`]) records its outcome.
    pub fn sent(&self, op: Op, d: &Delivered, broker: usize) -> Sent {
        self.sent_with(op, d, broker, Vec::new())
    }

    /// An Ack of `d` carrying the follow-up jobs `follow_ups` (their
    /// payloads, each unique in the run; `AckRequest.enqueue`) is being
    /// sent to `broker`; [`History::acked`] records its outcome.
    pub fn sent_ack_with(&self, d: &Delivered, broker: usize, follow_ups: Vec<String>) -> Sent {
        self.sent_with(Op::Ack, d, broker, follow_ups)
    }

    fn sent_with(&self, op: Op, d: &Delivered, broker: usize, follow_ups: Vec<String>) -> Sent {
        let t = self.now();
        self.with(|h| {
            h.settles.push(Settle {
                op,
                id: d.id.clone(),
                token: d.token.clone(),
                broker,
                sent: t,
                answered: None,
                outcome: Outcome::Pending,
                expires_us: None,
                follow_ups,
                enqueued: Vec::new(),
            });
            Sent(h.settles.len() - 1)
        })
    }

    /// The outcome of a settle: OK, FAILED_PRECONDITION (refused: the
    /// token was not current), or any other error (unknown).
    pub fn answered(&self, s: Sent, r: &Result<(), tonic::Status>) {
        self.answer(s, r.as_ref().map(|_| (None, Vec::new())));
    }

    /// The outcome of an ExtendLease: OK with the new expiry (database
    /// time, µs since the epoch), or as [`History::answered`].
    pub fn extended(&self, s: Sent, r: &Result<i64, tonic::Status>) {
        self.answer(s, r.as_ref().map(|e| (Some(*e), Vec::new())));
    }

    /// The outcome of an Ack: OK with the ids of its follow-up jobs the
    /// broker answered (`AckResponse.enqueued`, `SettleResult.enqueued`),
    /// or as [`History::answered`].
    pub fn acked(&self, s: Sent, r: &Result<Vec<String>, tonic::Status>) {
        self.answer(s, r.as_ref().map(|ids| (None, ids.clone())));
    }

    fn answer(&self, s: Sent, r: Result<(Option<i64>, Vec<String>), &tonic::Status>) {
        let t = self.now();
        self.with(|h| {
            let op = h.settles[s.0].op.name();
            let rec = &mut h.settles[s.0];
            rec.answered = Some(t);
            match r {
                Ok((e, ids)) => {
                    rec.outcome = Outcome::Ok;
                    rec.expires_us = e;
                    rec.enqueued = ids;
                }
                Err(st) if st.code() == Code::FailedPrecondition => rec.outcome = Outcome::Refused,
                Err(st) => {
                    rec.outcome = Outcome::Unknown(st.code());
                    h.errors.push((op, st.code(), t));
                }
            }
        });
    }

    /// The schedule `name` fires every second (`* * * * * *`, catch-up
    /// `all`) from its first tick `first_us` (database time, µs since the
    /// epoch): the checker holds every tick from it to the one
    /// [`History::schedule_stopped`] names to exactly one job.
    pub fn schedule_started(&self, name: &str, first_us: i64) {
        self.with(|h| {
            h.schedules.insert(
                name.to_owned(),
                Ticks {
                    first_us,
                    due_us: None,
                    deleted_us: None,
                },
            )
        });
    }

    /// The schedule `name` was deleted: every tick up to `due_us` must have
    /// its job, and none is later than `deleted_us` (the database clock
    /// once the delete was answered).
    pub fn schedule_stopped(&self, name: &str, due_us: i64, deleted_us: i64) {
        self.with(|h| {
            let s = h.schedules.get_mut(name).expect("a schedule started");
            s.due_us = Some(due_us);
            s.deleted_us = Some(deleted_us);
        });
    }

    /// SIGTERM is about to be sent to `broker`.
    pub fn drain(&self, broker: usize) {
        let t = self.now();
        self.with(|h| h.drains.push((broker, t)));
    }

    /// Records a fault; returns its index for [`History::healed`]. While
    /// it lasts (until healed), streams of `broker` (of every broker when
    /// None) are not held to the stall bound.
    pub fn fault(&self, kind: &'static str, broker: Option<usize>) -> usize {
        self.push_fault(kind, broker, true)
    }

    /// A fault that excuses no stream's stall (one that should not stop
    /// deliveries); returns its index for [`History::healed`].
    pub fn fault_excusing_nothing(&self, kind: &'static str, broker: Option<usize>) -> usize {
        self.push_fault(kind, broker, false)
    }

    /// A client cut its own stream mid-lease (a fault that excuses nothing,
    /// and that there is nothing to recover from).
    pub fn client_cut(&self, broker: usize) -> usize {
        let f = self.push_fault("client cut", Some(broker), false);
        self.with(|h| h.faults[f].by_client = true);
        f
    }

    fn push_fault(&self, kind: &'static str, broker: Option<usize>, excuses: bool) -> usize {
        let t = self.now();
        self.with(|h| {
            h.faults.push(Fault {
                kind,
                broker,
                injected: t,
                healed: None,
                excuses_stalls: excuses,
                by_client: false,
            });
            h.faults.len() - 1
        })
    }

    pub fn healed(&self, fault: usize) {
        let t = self.now();
        self.with(|h| h.faults[fault].healed = Some(t));
    }

    /// The fault phase is over (the test injects nothing more): every job
    /// must be settled within [`Bounds::settle`] of now, or of its Enqueue.
    /// [`crate::common::load::Load::finish`] calls it if the test did not.
    pub fn faults_over(&self) {
        let t = self.now();
        self.with(|h| {
            h.faults_over.get_or_insert(t);
        });
    }

    /// The database server's clock was just moved: it is now `total` ahead
    /// of this process's wall clock.
    pub fn db_clock_jump(&self, total: Duration) {
        let t = self.now();
        self.with(|h| h.db_offsets.push((t, micros(total))));
    }

    /// How many jobs waited deliverable (None: the sample failed).
    pub fn ready(&self, n: Option<i64>) {
        let t = self.now();
        self.with(|h| h.ready.push((t, n)));
    }

    /// The database clock at local time `t`, µs since the epoch.
    pub fn db_at(&self, t: Duration) -> i64 {
        self.with(|h| db_at(self.wall0_us, &h.db_offsets, t))
    }

    /// Waits for an Ack OK after `since` (on `broker` if given): the
    /// system works again after a fault. Returns the seconds it took from
    /// `since`; panics after `limit`.
    pub async fn wait_recovered(
        &self,
        broker: Option<usize>,
        since: Duration,
        limit: Duration,
    ) -> f64 {
        let deadline = Instant::now() + limit;
        loop {
            let first = self.with(|h| first_ack_after(h, since, broker));
            if let Some(t) = first {
                return (t - since).as_secs_f64();
            }
            assert!(
                Instant::now() < deadline,
                "no Ack OK (broker {broker:?}) within {limit:?} after the fault was healed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn acked_count(&self) -> usize {
        self.with(|h| {
            h.settles
                .iter()
                .filter(|s| s.op == Op::Ack && s.outcome == Outcome::Ok)
                .map(|s| &s.id)
                .collect::<HashSet<_>>()
                .len()
        })
    }

    /// How many streams clients opened (more than there are consumers:
    /// some re-subscribed).
    pub fn streams_opened(&self) -> usize {
        self.with(|h| h.streams.len())
    }

    /// Settles of `op` answered OK: (from their delivery to their send,
    /// from their send to their answer, whether on a Consume stream's
    /// delivery).
    pub fn settle_times(&self, op: Op) -> Vec<(Duration, Duration, bool)> {
        self.with(|h| {
            let by_token: HashMap<&str, &Delivered> =
                h.deliveries.iter().map(|d| (d.token.as_str(), d)).collect();
            h.settles
                .iter()
                .filter(|s| s.op == op && s.outcome == Outcome::Ok)
                .filter_map(|s| {
                    let d = by_token.get(s.token.as_str())?;
                    let consume = h.streams.get(&d.stream).is_some_and(|x| x.consume);
                    Some((
                        s.sent.saturating_sub(d.t),
                        s.answered?.saturating_sub(s.sent),
                        consume,
                    ))
                })
                .collect()
        })
    }

    pub fn deliveries(&self) -> Vec<Delivered> {
        self.with(|h| h.deliveries.clone())
    }

    /// Errors clients saw between `from` and `to` (local times).
    pub fn errors_between(&self, from: Duration, to: Duration) -> Vec<(&'static str, Code)> {
        self.with(|h| {
            h.errors
                .iter()
                .filter(|e| e.2 >= from && e.2 <= to)
                .map(|e| (e.0, e.1))
                .collect()
        })
    }

    /// Stream ends (status) of streams on `broker` open at `at`, but for
    /// those the client dropped before the broker ended them (their end is
    /// not known: a consumer away from home going back, say).
    pub fn ends_of_streams_open_at(&self, broker: usize, at: Duration) -> Vec<Option<Code>> {
        self.with(|h| {
            h.streams
                .iter()
                .filter(|(s, r)| {
                    r.broker == broker
                        && r.opened <= at
                        && h.dropped.get(s).is_none_or(|t| *t > at)
                        && h.ended.get(s).is_none_or(|e| e.0 > at)
                        && (h.ended.contains_key(s) || !h.dropped.contains_key(s))
                })
                .map(|(s, _)| h.ended.get(s).and_then(|e| e.1))
                .collect()
        })
    }

    /// Streams the broker ended with an error that no fault of their broker
    /// explains: a fault on that broker injected before the end, and not
    /// healed (restarted) before the stream was opened. A kill -9 or a drain
    /// of one replica must not fail the streams of another.
    pub fn unexplained_stream_failures(&self) -> Vec<String> {
        self.with(|h| {
            let mut out: Vec<String> = h
                .ended
                .iter()
                .filter_map(|(s, (ended, status))| {
                    let code = (*status)?;
                    let (broker, opened) = (h.streams[s].broker, h.streams[s].opened);
                    let explained = h.faults.iter().any(|f| {
                        f.broker == Some(broker)
                            && f.injected <= *ended
                            && f.healed.is_none_or(|healed| opened <= healed)
                    });
                    (!explained).then(|| {
                        format!("stream {s} on broker {broker}: {code:?} at {ended:?} (opened {opened:?})")
                    })
                })
                .collect();
            out.sort();
            out
        })
    }

    /// Checks the history against the invariants. `dead` are the ids in
    /// the dead letters at the end, `live` the ids still in the jobs table.
    pub fn check(&self, dead: &HashSet<String>, live: &HashSet<String>) -> Report {
        let h = self.inner.lock().unwrap();
        let db = |t: Duration| db_at(self.wall0_us, &h.db_offsets, t);
        let db_min = |t: Duration| db_at_lagging(self.wall0_us, &h.db_offsets, t, JUMP_SLACK);
        let mut r = Report {
            bounds: h.bounds,
            half_close_left: h.half_close_left.clone(),
            half_closes_checked: h.half_closes_checked,
            ..Report::default()
        };

        let acks_ok: Vec<&Settle> = h
            .settles
            .iter()
            .filter(|s| s.op == Op::Ack && s.outcome == Outcome::Ok)
            .collect();
        let mut acks_per_id: HashMap<&str, Vec<&str>> = HashMap::new();
        for s in &acks_ok {
            acks_per_id.entry(&s.id).or_default().push(&s.token);
        }
        let ack_unknown: Vec<&Settle> = h
            .settles
            .iter()
            .filter(|s| {
                s.op == Op::Ack && matches!(s.outcome, Outcome::Unknown(_) | Outcome::Pending)
            })
            .collect();
        let ack_unknown_ids: HashSet<&str> = ack_unknown.iter().map(|s| s.id.as_str()).collect();
        let by_token: HashMap<&str, &Delivered> =
            h.deliveries.iter().map(|d| (d.token.as_str(), d)).collect();
        let mut settles_of: HashMap<&str, Vec<&Settle>> = HashMap::new();
        for s in &h.settles {
            settles_of.entry(&s.token).or_default().push(s);
        }
        // A lease's end: its expiry, or the latest one an ExtendLease
        // answered OK gave it.
        let expiry = |d: &Delivered| -> i64 {
            settles_of
                .get(d.token.as_str())
                .into_iter()
                .flatten()
                .filter_map(|s| s.expires_us)
                .fold(d.expires_us, i64::max)
        };

        r.enqueued = h.enq_ok.len();
        r.enqueue_unknown = h.enq_err.len();
        r.deliveries = h.deliveries.len();
        r.ack_unknown = ack_unknown.len();
        let count = |op: Op, o: Outcome| {
            h.settles
                .iter()
                .filter(|s| s.op == op && s.outcome == o)
                .count()
        };
        r.ack_stale = count(Op::Ack, Outcome::Refused);
        r.nacks = count(Op::Nack, Outcome::Ok);
        r.extends = count(Op::Extend, Outcome::Ok);
        r.dead = dead.len();
        r.consume_acks = acks_ok
            .iter()
            .filter(|a| {
                by_token
                    .get(a.token.as_str())
                    .and_then(|d| h.streams.get(&d.stream))
                    .is_some_and(|s| s.consume)
            })
            .count();
        r.handed_across = h
            .deliveries
            .iter()
            .filter(|d| {
                d.attempt == 1
                    && d.start_us == d.enqueued_us
                    && h.enq_broker.get(&d.payload).is_some_and(|b| *b != d.broker)
            })
            .count();
        r.faults = h.faults.len();
        for f in &h.faults {
            *r.fault_kinds.entry(f.kind).or_default() += 1;
        }
        for (op, code, _) in &h.errors {
            *r.errors.entry(format!("{op} {code:?}")).or_default() += 1;
        }

        // The jobs that must be settled: (what names it, id, local time it
        // was enqueued). Those enqueued OK; and below the follow-ups of the
        // Acks that committed and the schedules' ticks' jobs.
        let mut must_settle: Vec<(String, &str, Duration)> = h
            .enq_ok
            .iter()
            .map(|(payload, (id, t))| (payload.clone(), id.as_str(), *t))
            .collect();
        let mut deliveries_of: HashMap<&str, Vec<&Delivered>> = HashMap::new();
        for d in &h.deliveries {
            deliveries_of.entry(&d.id).or_default().push(d);
        }
        follow_ups(&h, (dead, live), &deliveries_of, &mut must_settle, &mut r);
        ticks(&h, self.wall0_us, &mut must_settle, &mut r);

        // Lost; and settled in time after the faults.
        let mut settled_at: HashMap<&str, Duration> = HashMap::new();
        for s in &acks_ok {
            let t = s.answered.unwrap_or(s.sent);
            let e = settled_at.entry(&s.id).or_insert(t);
            *e = (*e).min(t);
        }
        for (payload, id, enq_t) in &must_settle {
            let id = *id;
            if dead.contains(id) {
                continue;
            }
            let at = if let Some(t) = settled_at.get(id) {
                Some(*t)
            } else if ack_unknown_ids.contains(id) && !live.contains(id) {
                // An Ack whose answer was lost, and the job is gone: it
                // committed. Not lost.
                r.acked_unanswered += 1;
                ack_unknown
                    .iter()
                    .filter(|s| s.id == *id)
                    .map(|s| s.answered.unwrap_or(s.sent))
                    .min()
            } else {
                r.lost.push(format!("{payload} ({id}): {}", h.story(id)));
                None
            };
            if let (Some(at), Some(over)) = (at, h.faults_over) {
                let from = over.max(*enq_t);
                let took = at.saturating_sub(from);
                r.settle_max_s = r.settle_max_s.max(took.as_secs_f64());
                if took > h.bounds.settle {
                    r.settled_late.push(format!(
                        "{payload} ({id}): settled {:.1}s after the faults ended (bound {:?}): {}",
                        took.as_secs_f64(),
                        h.bounds.settle,
                        h.story(id)
                    ));
                }
            }
        }
        for (id, tokens) in &acks_per_id {
            if tokens.len() > 1 {
                r.acked_twice.push(format!("{id}: {tokens:?}"));
            }
        }
        // Follow-ups are known whatever became of their Ack (one that
        // should not exist is reported above); a schedule's jobs by its
        // headers.
        let known: HashSet<&str> = h
            .enq_ok
            .keys()
            .chain(h.enq_err.keys())
            .chain(h.settles.iter().flat_map(|s| &s.follow_ups))
            .map(String::as_str)
            .collect();
        let scheduled = |d: &Delivered| {
            d.tick
                .as_ref()
                .is_some_and(|(name, _)| h.schedules.contains_key(name))
        };

        // Whether d came from a broker frozen (SIGSTOP) while d's lease was
        // live and arrived within a second of that broker's SIGCONT.
        let from_frozen = |d: &Delivered| -> bool {
            h.faults.iter().any(|f| {
                f.kind.starts_with("SIGSTOP")
                    && f.broker == Some(d.broker)
                    && f.injected <= d.t
                    && f.healed.is_some_and(|c| d.t <= c + Duration::from_secs(1))
                    && db_min(f.injected) <= d.expires_us
            })
        };
        // Deliveries of each job in lease order (database time).
        let mut per_job: BTreeMap<&str, Vec<&Delivered>> = BTreeMap::new();
        for d in &h.deliveries {
            if !known.contains(d.payload.as_str()) && !scheduled(d) {
                r.phantom.push(format!("{} ({})", d.payload, d.id));
            }
            // Received after its lease had run out (database clock).
            let received = db_min(d.t);
            if received > d.expires_us {
                let list = if from_frozen(d) {
                    &mut r.frozen_late
                } else {
                    &mut r.delivered_released
                };
                list.push(format!(
                    "{} attempt {} token {}: received {:.3}s after its lease expired: {}",
                    d.id,
                    d.attempt,
                    d.token,
                    (received - d.expires_us) as f64 / 1e6,
                    h.story(&d.id)
                ));
            }
            per_job.entry(&d.id).or_default().push(d);
        }
        let acked_tokens: HashSet<&str> = acks_ok.iter().map(|a| a.token.as_str()).collect();
        let stream_open = |s: u64| h.streams.get(&s).map(|s| s.opened).unwrap_or_default();
        // Whether a settle of d's lease that may have released or completed
        // it (an Ack or Nack not refused) was sent before local time t.
        let settled_before = |d: &Delivered, t: Duration| -> bool {
            settles_of
                .get(d.token.as_str())
                .into_iter()
                .flatten()
                .any(|s| s.may_have_released() && s.sent < t)
        };
        // Whether d's stream was closed: dropped or half-closed by the
        // client before local time `client`, or its broker (that one only)
        // draining since before `broker` (a drain races what is in flight:
        // a settle sent before SIGTERM may reach the broker after the
        // drain released its lease, so for a settle it is the answer's time).
        let closed_before = |d: &Delivered, client: Duration, broker: Duration| -> bool {
            if h.dropped.get(&d.stream).is_some_and(|x| *x < client) {
                return true;
            }
            let opened = stream_open(d.stream);
            h.drains
                .iter()
                .any(|(b, x)| *b == d.broker && *x >= opened && *x < broker)
        };
        for (id, ds) in per_job.iter_mut() {
            ds.sort_by_key(|d| (d.start_us, d.t));
            for pair in ds.windows(2) {
                let (d1, d2) = (pair[0], pair[1]);
                if d1.token == d2.token {
                    r.same_token_twice.push(format!("{id}: {}", d1.token));
                    continue;
                }
                // Received after the job was leased again. One that crossed
                // its stream's half-close on the wire is not: the client
                // half-closed before it arrived, ceding its jobs (the broker
                // releases them), and ignores what still comes (the Consume
                // contract in queue.proto). Seen under SIGTERM on two busy
                // cores: a pack written to the socket some ms after the
                // broker, hearing the half-close, released and re-leased it.
                let crossed_close = h.half_closed.get(&d1.stream).is_some_and(|t| *t < d1.t);
                if db_min(d1.t) > d2.start_us {
                    let list = if from_frozen(d1) {
                        &mut r.frozen_late
                    } else if crossed_close {
                        &mut r.after_half_close
                    } else {
                        &mut r.delivered_released
                    };
                    list.push(format!(
                        "{id} attempt {} token {}: received {:.3}s after attempt {} was leased: {}",
                        d1.attempt,
                        d1.token,
                        (db_min(d1.t) - d2.start_us) as f64 / 1e6,
                        d2.attempt,
                        h.story(id)
                    ));
                }
                if acked_tokens.contains(d1.token.as_str()) {
                    r.redelivered_after_ack.push(format!(
                        "{id} ({}): attempt {} delivered after the Ack of attempt {} returned OK",
                        d2.payload, d2.attempt, d1.attempt
                    ));
                    continue;
                }
                r.duplicates += 1;
                let expires = expiry(d1);
                if d2.start_us >= expires {
                    r.dup_expiry += 1;
                    continue;
                }
                let nacked = settles_of
                    .get(d1.token.as_str())
                    .into_iter()
                    .flatten()
                    .any(|s| s.op == Op::Nack && s.outcome != Outcome::Refused && s.sent < d2.t);
                if nacked {
                    r.dup_nack += 1;
                    continue;
                }
                if closed_before(d1, d2.t, d2.t) {
                    r.dup_closed += 1;
                    continue;
                }
                r.lease_overlap.push(format!(
                    "{id} ({}): attempt {} (stream {}, broker {}, lease to {}) and attempt {} \
                     (stream {}, broker {}) leased {:.3}s before the first lease ended, \
                     which was neither settled nor released before: {}",
                    d1.payload,
                    d1.attempt,
                    d1.stream,
                    d1.broker,
                    expires,
                    d2.attempt,
                    d2.stream,
                    d2.broker,
                    (expires - d2.start_us) as f64 / 1e6,
                    h.story(id)
                ));
            }
        }

        // Settles: refused while their lease was current, or answered OK
        // for a lease that was no longer current.
        for s in &h.settles {
            let Some(d) = by_token.get(s.token.as_str()) else {
                continue;
            };
            match s.outcome {
                Outcome::Refused => {
                    let answered = s.answered.unwrap_or(s.sent);
                    if db(answered) >= expiry(d) {
                        continue;
                    }
                    if settled_before(d, s.sent) || closed_before(d, s.sent, answered) {
                        continue;
                    }
                    r.refused_valid.push(format!(
                        "{}: {} of token {} refused {:.3}s before its lease's end, nothing \
                         having released it: {}",
                        s.id,
                        s.op.name(),
                        s.token,
                        (expiry(d) - db(answered)) as f64 / 1e6,
                        h.story(&s.id)
                    ));
                }
                Outcome::Ok => {
                    let later = per_job.get(s.id.as_str()).and_then(|ds| {
                        ds.iter()
                            .find(|d2| d2.start_us > d.start_us && d2.t < s.sent)
                    });
                    if let Some(d2) = later {
                        r.stale_ok.push(format!(
                            "{}: {} of token {} answered OK, sent after attempt {} (token {}) \
                             was delivered: {}",
                            s.id,
                            s.op.name(),
                            s.token,
                            d2.attempt,
                            d2.token,
                            h.story(&s.id)
                        ));
                    }
                }
                _ => {}
            }
        }

        // When a job's completion began (the first Ack of it sent that was
        // not refused), and when an Ack of it first returned OK.
        let mut completing: HashMap<&str, Duration> = HashMap::new();
        for s in h
            .settles
            .iter()
            .filter(|s| s.op == Op::Ack && s.outcome != Outcome::Refused)
        {
            let e = completing.entry(&s.id).or_insert(s.sent);
            *e = (*e).min(s.sent);
        }

        // Job keys (issue 33). Each delivery names the key its Enqueue sent.
        for d in &h.deliveries {
            let sent = h.job_keys.get(&d.payload).map_or("", |k| k.1.as_str());
            if known.contains(d.payload.as_str()) && d.key != sent {
                r.key_order.push(format!(
                    "{} ({}): attempt {} delivered with key {:?}, enqueued with key {:?}",
                    d.id, d.payload, d.attempt, d.key, sent
                ));
            }
        }
        // Per-key order in the queues ordered by key. The broker orders a
        // key's jobs by id (the UUIDv7 it stamps on an Enqueue) and leases
        // one only while fewer than key_concurrency jobs of its key with a
        // smaller id are in the jobs table (lease.sql): waiting, delayed
        // for a retry, or leased; an Ack or a dead letter takes one out.
        // What the checker assumes, and what it cannot see:
        // - An earlier job E (smaller id) was certainly in the table when a
        //   lease of J began only if E's Enqueue had been answered OK (the
        //   database clock at the answer, the latest it can read, before
        //   the lease's start) or E had been leased before. Nothing is
        //   assumed of how ids compare with the times Enqueues were sent:
        //   an id is stamped before its commit, so two Enqueues of a key
        //   racing (or sent to brokers whose clocks differ by more than the
        //   gap between them) may commit out of id order; the one with the
        //   smaller id committed later was no earlier job when J was leased.
        // - E may have left the table before J's lease began if an Ack of
        //   it that was not refused (answered OK, or not known) was sent
        //   before J's delivery arrived (as for the lease checks: the send
        //   is the earliest the broker could act on it), or if E is in the
        //   dead letters at the end (a Nack to the dead letters, or the
        //   broker's own once its last attempt's lease ran out, which no
        //   client sees) and no lease of E began after J's (a leased job is
        //   in the table). Cancels are not recorded: a run that cancels
        //   jobs of an ordered queue would need them.
        // - A lease is current from its start (database time) until its end
        //   as the lease overlap check models it: its expiry (extensions
        //   answered OK included), or before the later delivery arrived an
        //   Ack or Nack of it sent that was not refused, its stream dropped,
        //   its broker draining.
        // A lease no client received (its broker killed between the lease
        // and the send) is not seen, so not counted: each rule reports only
        // what the history shows, and may miss what it does not.
        let mut by_payload: HashMap<&str, Vec<&Delivered>> = HashMap::new();
        for d in &h.deliveries {
            by_payload.entry(&d.payload).or_default().push(d);
        }
        struct KeyJob<'a> {
            id: &'a str,
            payload: &'a str,
            /// From when (database time) it was certainly in the table.
            exists_us: i64,
            leases: Vec<&'a Delivered>,
        }
        let mut scopes: BTreeMap<(&str, &str), Vec<KeyJob>> = BTreeMap::new();
        for (payload, (queue, key)) in &h.job_keys {
            if !h.ordered.contains_key(queue) && !h.key_limited.contains_key(queue) {
                continue;
            }
            let answered = h.enq_ok.get(payload);
            let ds = by_payload.get(payload.as_str());
            let Some(id) = answered
                .map(|a| a.0.as_str())
                .or_else(|| ds.and_then(|ds| ds.first()).map(|d| d.id.as_str()))
            else {
                continue;
            };
            let leases: Vec<&Delivered> = ds
                .into_iter()
                .flatten()
                .filter(|d| d.id == id)
                .copied()
                .collect();
            let exists_us = answered
                .map(|a| db(a.1))
                .into_iter()
                .chain(leases.iter().map(|d| d.start_us))
                .min()
                .unwrap_or(i64::MAX);
            scopes.entry((queue, key)).or_default().push(KeyJob {
                id,
                payload,
                exists_us,
                leases,
            });
        }
        // Whether e was certainly in the table when a lease began at `at_us`
        // (database time) that was received at `seen` (local time).
        let live = |e: &KeyJob, at_us: i64, seen: Duration| -> bool {
            e.exists_us < at_us
                && (e.leases.iter().any(|l| l.start_us > at_us)
                    || (completing.get(e.id).is_none_or(|t| *t >= seen) && !dead.contains(e.id)))
        };
        for ((queue, key), jobs) in scopes.iter_mut() {
            // Ordered, or only limited (no order to check).
            let (n, ordered) = match h.ordered.get(*queue) {
                Some(n) => (*n, true),
                None => (h.key_limited[*queue], false),
            };
            jobs.sort_by(|a, b| a.id.cmp(b.id));
            for (i, j) in jobs.iter().enumerate() {
                if let Some((_, t)) = h.enq_ok.get(j.payload)
                    && jobs[..i].iter().any(|e| live(e, db(*t), *t))
                {
                    r.key_behind += 1;
                }
                for d in &j.leases {
                    r.keyed += 1;
                    let ahead: Vec<&KeyJob> = jobs[..i]
                        .iter()
                        .filter(|e| live(e, d.start_us, d.t))
                        .collect();
                    if ordered && ahead.len() >= n {
                        r.key_order.push(format!(
                            "{} ({}): attempt {} of key {key:?} in {queue} leased at {} while \
                             {} earlier job(s) of its key were live, neither acked nor \
                             dead-lettered (key_concurrency {n}): {:?}: {}; the first ahead: {}",
                            j.id,
                            j.payload,
                            d.attempt,
                            d.start_us,
                            ahead.len(),
                            ahead.iter().map(|e| e.id).collect::<Vec<_>>(),
                            h.story(j.id),
                            h.story(ahead[0].id)
                        ));
                    }
                    // Other jobs of the key with a lease current at d's start.
                    let beside: Vec<&Delivered> = jobs
                        .iter()
                        .filter(|o| o.id != j.id)
                        .filter_map(|o| {
                            o.leases.iter().copied().find(|l| {
                                l.start_us <= d.start_us
                                    && expiry(l) > d.start_us
                                    && !settled_before(l, d.t)
                                    && !closed_before(l, d.t, d.t)
                            })
                        })
                        .collect();
                    r.key_peak = r.key_peak.max(beside.len() + 1);
                    if beside.len() >= n {
                        r.key_over_limit.push(format!(
                            "{} ({}): attempt {} of key {key:?} in {queue} leased at {} while \
                             {} other job(s) of its key held a current lease (key_concurrency \
                             {n}): {:?}: {}; the first beside: {}",
                            j.id,
                            j.payload,
                            d.attempt,
                            d.start_us,
                            beside.len(),
                            beside
                                .iter()
                                .map(|l| format!("{} attempt {}", l.id, l.attempt))
                                .collect::<Vec<_>>(),
                            h.story(j.id),
                            h.story(&beside[0].id)
                        ));
                    }
                }
            }
        }

        // Dedup answers.
        let mut per_key: BTreeMap<&str, Vec<&Keyed>> = BTreeMap::new();
        for k in &h.keyed {
            per_key.entry(&k.key).or_default().push(k);
        }
        for (key, es) in &per_key {
            let created: Vec<(&str, Duration)> = es
                .iter()
                .filter_map(|e| match &e.answer {
                    Some((t, id, false)) => Some((id.as_str(), *t)),
                    _ => None,
                })
                .collect();
            for e in es {
                let Some((answered, id, dup)) = &e.answer else {
                    continue;
                };
                r.dedup_answers += 1;
                if *dup {
                    r.dedup_duplicates += 1;
                    let of_key = created.iter().any(|c| c.0 == id.as_str())
                        || es.iter().any(|o| o.answer.is_none() && o.sent < *answered);
                    let completed_before = settled_at.get(id.as_str()).is_some_and(|t| *t < e.sent);
                    if !of_key || completed_before {
                        r.dedup_inconsistent.push(format!(
                            "key {key}: {} answered duplicate of {id}, {}",
                            e.payload,
                            if of_key {
                                "a job whose Ack had returned OK before"
                            } else {
                                "which no Enqueue of the key created"
                            }
                        ));
                    }
                } else {
                    // Another job of the key live throughout this Enqueue.
                    let live_other = created.iter().find(|(other, t)| {
                        *other != id.as_str()
                            && *t < e.sent
                            && !dead.contains(*other)
                            && completing.get(other).is_none_or(|a| *a > *answered)
                    });
                    if let Some((other, _)) = live_other {
                        r.dedup_inconsistent.push(format!(
                            "key {key}: {} created {id} while {other} of the same key was live",
                            e.payload
                        ));
                    }
                }
            }
        }

        // Recovery: from a fault's healing (or its injection when it heals
        // by itself) to the first Ack OK after it, on its broker if it hit one.
        for f in h.faults.iter().filter(|f| !f.by_client) {
            let from = f.healed.unwrap_or(f.injected);
            if let Some(t) = first_ack_after(&h, from, f.broker) {
                r.recovery_max_s = r.recovery_max_s.max((t - from).as_secs_f64());
            } else {
                r.unrecovered.push(format!(
                    "{} on {:?} at {from:.3?}: no Ack OK after it",
                    f.kind, f.broker
                ));
            }
        }

        stalls(&h, self.wall0_us, &settles_of, &mut r);
        r
    }
}

/// The database clock at local time `t`: the wall clock then, plus the
/// offset of the last jump recorded before `t`. A jump is recorded right
/// after the server's clock was moved: this is the latest the database
/// clock can read at `t`.
fn db_at(wall0_us: i64, offsets: &[(Duration, i64)], t: Duration) -> i64 {
    db_at_lagging(wall0_us, offsets, t, Duration::ZERO)
}

/// How long after a jump was recorded the checker holds what a client
/// received to the new clock: a delivery the broker sent before the jump
/// may arrive just after it, with a lease the jump ended.
const JUMP_SLACK: Duration = Duration::from_millis(500);

/// As [`db_at`], with the jumps taking effect `lag` after they were
/// recorded: the earliest the database clock can read at `t` (for the
/// checks that find anomalies).
fn db_at_lagging(wall0_us: i64, offsets: &[(Duration, i64)], t: Duration, lag: Duration) -> i64 {
    let offset = offsets
        .iter()
        .take_while(|(at, _)| *at + lag <= t)
        .last()
        .map_or(0, |o| o.1);
    wall0_us + micros(t) + offset
}

/// The local time at which the database clock reaches `db_us` (the first
/// instant it is past it, when a jump skipped over it).
fn local_at(wall0_us: i64, offsets: &[(Duration, i64)], db_us: i64) -> Duration {
    let mut segments: Vec<(Duration, i64)> = vec![(Duration::ZERO, 0)];
    segments.extend_from_slice(offsets);
    for (i, (from, offset)) in segments.iter().enumerate() {
        let t = db_us - wall0_us - offset;
        let t = Duration::from_micros(t.max(0) as u64);
        let next = segments.get(i + 1).map(|s| s.0);
        if t < *from {
            return *from;
        }
        if next.is_none_or(|n| t < n) {
            return t;
        }
    }
    unreachable!("the last segment is open")
}

/// A time in µs since the epoch, RFC 3339 (for the reports).
fn rfc3339(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us).map_or_else(
        || us.to_string(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    )
}

/// The follow-up jobs of Acks (`AckRequest.enqueue`): they exist if and
/// only if their Ack committed, each once, under the ids the Ack answered.
/// Those that exist join `must_settle`.
///
/// Whether an Ack committed, as far as the history tells: answered OK,
/// yes; refused, no. Without an answer: no if another Ack of its lease was
/// answered OK, if its job was leased again later (a later lease's token
/// makes this one stale for good: fencing, which the other rules check),
/// or if the job is in the dead letters or still in the table at the end;
/// otherwise yes (the job is gone, and only an Ack of a lease took it
/// out). Two Acks of one lease both without an answer: one of them may
/// have committed, so each is held to all its follow-ups or none, and the
/// follow-ups of no two of them may exist.
///
/// A follow-up exists if a delivery carried its payload, or, for an Ack
/// answered OK, if the id it answered is in the dead letters or the table
/// at the end.
fn follow_ups<'a>(
    h: &'a Inner,
    (dead, live): (&HashSet<String>, &HashSet<String>),
    deliveries_of: &HashMap<&str, Vec<&'a Delivered>>,
    must_settle: &mut Vec<(String, &'a str, Duration)>,
    r: &mut Report,
) {
    // Follow-up payload -> the distinct job ids delivered with it.
    let mut ids_of: HashMap<&str, Vec<&str>> = HashMap::new();
    for d in &h.deliveries {
        let ids = ids_of.entry(&d.payload).or_default();
        if !ids.contains(&d.id.as_str()) {
            ids.push(&d.id);
        }
    }
    // Lease token -> the Acks of it without a known commit some of whose
    // follow-ups exist.
    let mut undecided_applied: BTreeMap<&str, Vec<&Settle>> = BTreeMap::new();
    let lease_start = |token: &str| {
        h.deliveries
            .iter()
            .find(|d| d.token == token)
            .map(|d| d.start_us)
    };
    for s in h.settles.iter().filter(|s| !s.follow_ups.is_empty()) {
        r.follow_ups += s.follow_ups.len();
        let id = s.id.as_str();
        let same_lease = h
            .settles
            .iter()
            .filter(|o| o.op == Op::Ack && o.token == s.token && !std::ptr::eq(*o, s));
        let (committed, why): (Option<bool>, &str) = match s.outcome {
            Outcome::Ok => (Some(true), "answered OK"),
            Outcome::Refused => (Some(false), "refused"),
            _ => {
                let start = lease_start(&s.token);
                let later = deliveries_of
                    .get(id)
                    .into_iter()
                    .flatten()
                    .any(|d| start.is_some_and(|st| d.start_us > st));
                if same_lease.clone().any(|o| o.outcome == Outcome::Ok) {
                    (
                        Some(false),
                        "no answer; another Ack of its lease answered OK",
                    )
                } else if later {
                    (Some(false), "no answer; its job leased again later")
                } else if dead.contains(id) || live.contains(id) {
                    (Some(false), "no answer; its job not gone at the end")
                } else if same_lease.clone().any(|o| o.outcome != Outcome::Refused) {
                    (
                        None,
                        "no answer; another Ack of its lease without one either",
                    )
                } else {
                    (Some(true), "no answer; its job gone and not leased again")
                }
            }
        };
        let ok = s.outcome == Outcome::Ok;
        if ok && s.enqueued.len() != s.follow_ups.len() {
            r.follow_up_ids.push(format!(
                "{id}: the Ack of token {} answered {} follow-up id(s) for {} follow-up(s): {:?}",
                s.token,
                s.enqueued.len(),
                s.follow_ups.len(),
                s.enqueued
            ));
        }
        let exists: Vec<bool> = s
            .follow_ups
            .iter()
            .enumerate()
            .map(|(i, p)| {
                ids_of.contains_key(p.as_str())
                    || (ok
                        && s.enqueued
                            .get(i)
                            .is_some_and(|x| dead.contains(x) || live.contains(x)))
            })
            .collect();
        let all_or_none = exists.iter().all(|e| *e) || !exists.iter().any(|e| *e);
        if committed.is_none() && exists.iter().any(|e| *e) {
            undecided_applied.entry(&s.token).or_default().push(s);
        }
        for (i, p) in s.follow_ups.iter().enumerate() {
            let ids = ids_of.get(p.as_str()).cloned().unwrap_or_default();
            let missing = !exists[i]
                && match committed {
                    Some(c) => c,
                    None => !all_or_none,
                };
            if missing {
                r.follow_up_missing.push(format!(
                    "{id}: follow-up {p} of the Ack of token {} ({why}) has no job, though {}: {}",
                    s.token,
                    if committed.is_some() {
                        "the Ack committed"
                    } else {
                        "another follow-up of the Ack has one"
                    },
                    h.story(id)
                ));
            }
            if exists[i] && committed == Some(false) {
                r.follow_up_unapplied.push(format!(
                    "{id}: follow-up {p} of the Ack of token {} ({why}) exists as {ids:?}, \
                     though the Ack did not commit: {}",
                    s.token,
                    h.story(id)
                ));
            }
            if ids.len() > 1 {
                r.follow_up_duplicated.push(format!(
                    "{id}: follow-up {p} of the Ack of token {} delivered as {} jobs: {ids:?}",
                    s.token,
                    ids.len()
                ));
            }
            let answered = if ok { s.enqueued.get(i) } else { None };
            if let Some(want) = answered
                && let Some(other) = ids.iter().find(|x| **x != want.as_str())
            {
                r.follow_up_ids.push(format!(
                    "{id}: follow-up {p} answered as {want}, delivered as {other}"
                ));
            }
            if exists[i] && committed != Some(false) {
                r.follow_ups_applied += 1;
                let job = ids.first().copied().or(answered.map(String::as_str));
                if let Some(job) = job {
                    must_settle.push((p.clone(), job, s.answered.unwrap_or(s.sent)));
                }
            }
        }
    }
    // Of the Acks of one lease whose commit the history cannot tell, one
    // at most committed: the follow-ups of two of them cannot both exist.
    for (token, acks) in undecided_applied {
        if acks.len() > 1 {
            let id = acks[0].id.as_str();
            let sets: Vec<&Vec<String>> = acks.iter().map(|a| &a.follow_ups).collect();
            r.follow_up_unapplied.push(format!(
                "{id}: {} Acks of token {token}, at most one of which can have committed, \
                 each have follow-ups that exist: {sets:?}: {}",
                acks.len(),
                h.story(id)
            ));
        }
    }
}

/// The schedules' ticks: every tick from a schedule's first to the last
/// one due when it was stopped has exactly one job, and no job names a
/// time that is not a tick of it (before its first, not on a whole second,
/// after it was deleted). A tick's job is seen by its deliveries (the
/// final drain delivers every job left). Each job joins `must_settle`,
/// enqueued when its `enqueued_at` says.
fn ticks<'a>(
    h: &'a Inner,
    wall0_us: i64,
    must_settle: &mut Vec<(String, &'a str, Duration)>,
    r: &mut Report,
) {
    const SECOND: i64 = 1_000_000;
    for (name, s) in &h.schedules {
        // Tick (µs) -> its jobs' distinct ids, with their first delivery.
        let mut jobs: BTreeMap<i64, Vec<&Delivered>> = BTreeMap::new();
        for d in &h.deliveries {
            let Some((n, header)) = &d.tick else { continue };
            if n != name {
                continue;
            }
            let Ok(at) = chrono::DateTime::parse_from_rfc3339(header) else {
                r.tick_unscheduled.push(format!(
                    "{name}: job {} names the tick {header:?}, not a time",
                    d.id
                ));
                continue;
            };
            let ds = jobs.entry(at.timestamp_micros()).or_default();
            if !ds.iter().any(|x| x.id == d.id) {
                ds.push(d);
            }
        }
        r.ticks += jobs.len();
        for (tick, ds) in &jobs {
            let ids: Vec<&str> = ds.iter().map(|d| d.id.as_str()).collect();
            if ids.len() > 1 {
                r.tick_doubled.push(format!(
                    "{name}: tick {} has {} jobs: {ids:?}",
                    rfc3339(*tick),
                    ids.len()
                ));
            }
            let on_cron = *tick >= s.first_us && (*tick - s.first_us) % SECOND == 0;
            if !on_cron || s.deleted_us.is_some_and(|x| *tick > x) {
                r.tick_unscheduled.push(format!(
                    "{name}: job(s) {ids:?} of tick {}, not a tick of the schedule (first {}, \
                     deleted by {})",
                    rfc3339(*tick),
                    rfc3339(s.first_us),
                    s.deleted_us.map_or("-".into(), rfc3339)
                ));
            }
            if let Some(d) = ds.first()
                && d.enqueued_us != i64::MIN
            {
                let late = (d.enqueued_us - tick) as f64 / 1e6;
                r.tick_late_max_s = r.tick_late_max_s.max(late);
            }
            for d in ds {
                let enqueued = if d.enqueued_us == i64::MIN {
                    d.t
                } else {
                    local_at(wall0_us, &h.db_offsets, d.enqueued_us)
                };
                must_settle.push((format!("{name}@{}", rfc3339(*tick)), &d.id, enqueued));
            }
        }
        if let Some(due) = s.due_us {
            let mut tick = s.first_us;
            while tick <= due {
                if !jobs.contains_key(&tick) {
                    r.tick_missed.push(format!(
                        "{name}: tick {} has no job (every tick from {} to {} must)",
                        rfc3339(tick),
                        rfc3339(s.first_us),
                        rfc3339(due)
                    ));
                }
                tick += SECOND;
            }
        }
    }
}

fn first_ack_after(h: &Inner, since: Duration, broker: Option<usize>) -> Option<Duration> {
    h.settles
        .iter()
        .filter(|s| s.op == Op::Ack && s.outcome == Outcome::Ok)
        .filter_map(|s| s.answered.map(|t| (t, s.broker)))
        .filter(|(t, b)| *t >= since && broker.is_none_or(|x| x == *b || *b == UNKNOWN_BROKER))
        .map(|(t, _)| t)
        .min()
}

/// The longest time each stream with credit went without a delivery while
/// it had credit free and jobs waited deliverable (every sample of the
/// database showing some), outside the faults that excuse it.
fn stalls(h: &Inner, wall0_us: i64, settles_of: &HashMap<&str, Vec<&Settle>>, r: &mut Report) {
    let mut samples = h.ready.clone();
    samples.sort_by_key(|s| s.0);
    let mut by_stream: HashMap<u64, Vec<&Delivered>> = HashMap::new();
    for d in &h.deliveries {
        by_stream.entry(d.stream).or_default().push(d);
    }
    let mut ids: Vec<&u64> = h.streams.keys().collect();
    ids.sort();
    for sid in ids {
        let s = &h.streams[sid];
        if s.credit == 0 {
            continue;
        }
        let closed = [h.dropped.get(sid), h.ended.get(sid).map(|e| &e.0)]
            .into_iter()
            .flatten()
            .min()
            .copied()
            .unwrap_or(Duration::MAX);
        let mut ds = by_stream.remove(sid).unwrap_or_default();
        ds.sort_by_key(|d| d.t);
        // The credit each delivery holds, from its receipt until its
        // settle was answered (OK or refused), its lease ran out, or the
        // stream closed. An outcome unknown holds it until the lease's end.
        let holds: Vec<(Duration, Duration)> = ds
            .iter()
            .map(|d| {
                let settles = settles_of.get(d.token.as_str());
                let expires = settles
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x.expires_us)
                    .fold(d.expires_us, i64::max);
                let settled = settles
                    .into_iter()
                    .flatten()
                    .filter(|x| {
                        matches!(x.op, Op::Ack | Op::Nack)
                            && matches!(x.outcome, Outcome::Ok | Outcome::Refused)
                    })
                    .filter_map(|x| x.answered)
                    .min()
                    .unwrap_or(Duration::MAX);
                let end = local_at(wall0_us, &h.db_offsets, expires)
                    .min(settled)
                    .min(closed);
                (d.t, end)
            })
            .collect();
        let excused = |t: Duration| -> Option<Duration> {
            // The end of the latest excusing fault of this stream's broker
            // begun by t; Duration::MAX while one lasts.
            h.faults
                .iter()
                .filter(|f| {
                    f.excuses_stalls && f.injected <= t && f.broker.is_none_or(|b| b == s.broker)
                })
                .map(|f| match f.healed {
                    Some(x) if x <= t => x,
                    Some(_) => Duration::MAX,
                    None => f.injected,
                })
                .max()
        };
        let mut since: Option<Duration> = None;
        let mut worst = Duration::ZERO;
        for (t, n) in &samples {
            let t = *t;
            let free = i64::from(s.credit)
                - holds.iter().filter(|(a, b)| *a <= t && t < *b).count() as i64;
            let waiting = n.is_some_and(|n| n > 0);
            let fault_end = excused(t);
            if t < s.opened
                || t >= closed
                || !waiting
                || free <= 0
                || fault_end == Some(Duration::MAX)
            {
                since = None;
                continue;
            }
            let first = *since.get_or_insert(t);
            let last_delivery = ds
                .iter()
                .take_while(|d| d.t <= t)
                .last()
                .map_or(Duration::ZERO, |d| d.t);
            let from = first.max(last_delivery).max(fault_end.unwrap_or_default());
            worst = worst.max(t.saturating_sub(from));
        }
        r.stall_max_s = r.stall_max_s.max(worst.as_secs_f64());
        if worst > h.bounds.stall {
            r.stalls.push(format!(
                "stream {sid} on broker {} (credit {}, opened at {:.3?}): {:.1}s without a \
                 delivery with credit free and jobs waiting (bound {:?})",
                s.broker,
                s.credit,
                s.opened,
                worst.as_secs_f64(),
                h.bounds.stall
            ));
        }
    }
}

#[derive(Debug, Default)]
pub struct Report {
    pub bounds: Bounds,
    pub enqueued: usize,
    pub enqueue_unknown: usize,
    pub deliveries: usize,
    pub faults: usize,
    pub fault_kinds: BTreeMap<&'static str, usize>,
    /// Errors clients saw, by "operation code".
    pub errors: BTreeMap<String, usize>,
    pub duplicates: usize,
    pub dup_expiry: usize,
    pub dup_nack: usize,
    pub dup_closed: usize,
    pub nacks: usize,
    /// ExtendLease calls (unary or on a stream) answered OK.
    pub extends: usize,
    /// Acks that returned OK for jobs delivered on Consume streams.
    pub consume_acks: usize,
    /// Deliveries handed off at their insert to a stream of another replica
    /// than the one the job was enqueued on (dispatch/remote.rs).
    pub handed_across: usize,
    pub dead: usize,
    pub ack_unknown: usize,
    /// Acks refused with FAILED_PRECONDITION (each explained, or it is in
    /// `refused_valid`).
    pub ack_stale: usize,
    pub acked_unanswered: usize,
    pub recovery_max_s: f64,
    /// The longest a job took to be settled after the faults ended.
    pub settle_max_s: f64,
    /// The longest a stream went without a delivery while it had credit
    /// free and jobs waited.
    pub stall_max_s: f64,
    /// Enqueues with a dedup key answered, and how many of them `duplicate`.
    pub dedup_answers: usize,
    pub dedup_duplicates: usize,
    /// Deliveries of keyed jobs in queues ordered by key (each checked
    /// against per-key order and key_concurrency).
    pub keyed: usize,
    /// Keyed jobs whose Enqueue was answered while an earlier job of their
    /// key was live: they had to wait their turn.
    pub key_behind: usize,
    /// The most leases of one key current at once, as far as the history
    /// shows.
    pub key_peak: usize,
    pub lost: Vec<String>,
    pub acked_twice: Vec<String>,
    pub lease_overlap: Vec<String>,
    pub redelivered_after_ack: Vec<String>,
    pub phantom: Vec<String>,
    pub same_token_twice: Vec<String>,
    /// Settles refused with FAILED_PRECONDITION while their lease was
    /// current and nothing had released it.
    pub refused_valid: Vec<String>,
    /// Settles answered OK though a later lease of the job had already
    /// been delivered when they were sent.
    pub stale_ok: Vec<String>,
    /// Deliveries received after their lease had expired, or after the job
    /// had been leased again.
    pub delivered_released: Vec<String>,
    /// The same, from a broker frozen (SIGSTOP) while the lease was live
    /// and received within a second of its SIGCONT: a delivery already on
    /// its way out (or a hand-over waiting in its socket) when the process
    /// stopped. Counted and printed, not an anomaly: an open finding of
    /// docs/RELIABILITY.md ("Open: late deliveries from a frozen broker").
    pub frozen_late: Vec<String>,
    /// Received after the job was leased again, on a stream the client had
    /// half-closed before it arrived (ignored by the client: not an
    /// anomaly).
    pub after_half_close: Vec<String>,
    /// Jobs settled later than [`Bounds::settle`] after the faults ended.
    pub settled_late: Vec<String>,
    /// Faults after which no Ack succeeded (on their broker) any more.
    pub unrecovered: Vec<String>,
    /// Dedup answers no single live job per key explains.
    pub dedup_inconsistent: Vec<String>,
    /// Streams that went longer than [`Bounds::stall`] without a delivery
    /// while they had credit free and jobs waited.
    pub stalls: Vec<String>,
    /// Keyed jobs of a queue ordered by key leased while key_concurrency
    /// earlier jobs of their key were live (neither acked nor
    /// dead-lettered); and deliveries naming another key than their
    /// Enqueue sent.
    pub key_order: Vec<String>,
    /// Keyed jobs leased while key_concurrency other jobs of their key held
    /// a current lease.
    pub key_over_limit: Vec<String>,
    /// Follow-up jobs Acks carried (`AckRequest.enqueue`), and how many of
    /// them exist (their Ack committed).
    pub follow_ups: usize,
    pub follow_ups_applied: usize,
    /// Follow-ups of an Ack that committed with no job.
    pub follow_up_missing: Vec<String>,
    /// Follow-ups with a job though their Ack did not commit.
    pub follow_up_unapplied: Vec<String>,
    /// Follow-ups with more than one job.
    pub follow_up_duplicated: Vec<String>,
    /// Acks answered OK whose follow-up ids are not those of the jobs
    /// delivered (or not one per follow-up).
    pub follow_up_ids: Vec<String>,
    /// The schedules' ticks that had a job.
    pub ticks: usize,
    /// The latest a tick's job was enqueued after its tick (its
    /// `enqueued_at`): past the broker's `--schedule-grace`, it was fired
    /// by the catch-up policy.
    pub tick_late_max_s: f64,
    /// Ticks with more than one job.
    pub tick_doubled: Vec<String>,
    /// Ticks due before the schedule was stopped without a job.
    pub tick_missed: Vec<String>,
    /// Jobs of a schedule naming a time that is not one of its ticks.
    pub tick_unscheduled: Vec<String>,
    /// Consume streams that ended OK after their half-close while a job
    /// leased for them by a lease round was still leased.
    pub half_close_left: Vec<String>,
    /// Half-closes that ended OK and were looked at in the database.
    pub half_closes_checked: usize,
}

impl Report {
    /// One line of figures, for the test output and docs/RELIABILITY.md.
    pub fn figures(&self, name: &str, wall: Duration) -> String {
        format!(
            "FAULTS {name}: jobs={} enqueue_unknown={} deliveries={} faults={} {:?} duplicates={} \
             (expiry={} nack={} closed={}) nacks={} extends={} consume_acks={} handed_across={} \
             dead={} ack_unknown={} ack_stale={} dedup={}/{} \
             lost={} acked_twice={} lease_overlap={} redelivered_after_ack={} refused_valid={} \
             stale_ok={} delivered_released={} frozen_late={} after_half_close={} settled_late={} unrecovered={} \
             dedup_inconsistent={} stalls={} keyed={} key_behind={} key_peak={} key_order={} \
             key_over_limit={} follow_ups={}/{} follow_up_missing={} follow_up_unapplied={} \
             follow_up_duplicated={} follow_up_ids={} ticks={} (late up to {:.2}s) tick_doubled={} tick_missed={} \
             tick_unscheduled={} half_close_left={}/{} recovery_max_s={:.2} settle_max_s={:.2} (bound {:?}) stall_max_s={:.2} (bound {:?}) \
             wall_s={:.1} client_errors={:?}",
            self.enqueued,
            self.enqueue_unknown,
            self.deliveries,
            self.faults,
            self.fault_kinds,
            self.duplicates,
            self.dup_expiry,
            self.dup_nack,
            self.dup_closed,
            self.nacks,
            self.extends,
            self.consume_acks,
            self.handed_across,
            self.dead,
            self.ack_unknown,
            self.ack_stale,
            self.dedup_duplicates,
            self.dedup_answers,
            self.lost.len(),
            self.acked_twice.len(),
            self.lease_overlap.len(),
            self.redelivered_after_ack.len(),
            self.refused_valid.len(),
            self.stale_ok.len(),
            self.delivered_released.len(),
            self.frozen_late.len(),
            self.after_half_close.len(),
            self.settled_late.len(),
            self.unrecovered.len(),
            self.dedup_inconsistent.len(),
            self.stalls.len(),
            self.keyed,
            self.key_behind,
            self.key_peak,
            self.key_order.len(),
            self.key_over_limit.len(),
            self.follow_ups_applied,
            self.follow_ups,
            self.follow_up_missing.len(),
            self.follow_up_unapplied.len(),
            self.follow_up_duplicated.len(),
            self.follow_up_ids.len(),
            self.ticks,
            self.tick_late_max_s,
            self.tick_doubled.len(),
            self.tick_missed.len(),
            self.tick_unscheduled.len(),
            self.half_close_left.len(),
            self.half_closes_checked,
            self.recovery_max_s,
            self.settle_max_s,
            self.bounds.settle,
            self.stall_max_s,
            self.bounds.stall,
            wall.as_secs_f64(),
            self.errors,
        )
    }

    /// Every kind of anomaly and its instances, in a fixed order.
    pub fn kinds(&self) -> [(&'static str, &Vec<String>); 23] {
        [
            ("lost", &self.lost),
            ("acked twice", &self.acked_twice),
            ("lease overlap", &self.lease_overlap),
            ("redelivered after ack", &self.redelivered_after_ack),
            ("delivered but never enqueued", &self.phantom),
            ("one lease token delivered twice", &self.same_token_twice),
            ("valid settle refused", &self.refused_valid),
            ("stale settle answered OK", &self.stale_ok),
            (
                "delivered after its lease expired or was released",
                &self.delivered_released,
            ),
            ("settled too late after the faults", &self.settled_late),
            ("fault never recovered from", &self.unrecovered),
            ("dedup answer inconsistent", &self.dedup_inconsistent),
            ("stream stalled while jobs waited", &self.stalls),
            ("key order broken", &self.key_order),
            (
                "more than key_concurrency of a key leased at once",
                &self.key_over_limit,
            ),
            (
                "follow-up missing though its Ack committed",
                &self.follow_up_missing,
            ),
            (
                "follow-up exists though its Ack did not commit",
                &self.follow_up_unapplied,
            ),
            (
                "follow-up with more than one job",
                &self.follow_up_duplicated,
            ),
            ("follow-up ids answered wrong", &self.follow_up_ids),
            ("schedule tick with more than one job", &self.tick_doubled),
            ("schedule tick missed", &self.tick_missed),
            ("schedule job of no tick", &self.tick_unscheduled),
            (
                "half-closed stream ended OK with a job still leased for it",
                &self.half_close_left,
            ),
        ]
    }

    /// Every invariant broken, one entry per kind (empty: all hold).
    pub fn anomalies(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (what, list) in self.kinds() {
            if !list.is_empty() {
                let shown: Vec<&String> = list.iter().take(10).collect();
                problems.push(format!("{} {what}: {shown:#?}", list.len()));
            }
        }
        problems
    }

    /// Client errors other than UNAVAILABLE (what clients retry on).
    pub fn errors_not_unavailable(&self) -> Vec<(&String, &usize)> {
        self.errors
            .iter()
            .filter(|(k, _)| !k.ends_with(" Unavailable"))
            .collect()
    }

    /// Panics with every anomaly found.
    pub fn assert_ok(&self) {
        let problems = self.anomalies();
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        assert!(self.enqueued > 0, "no job enqueued: nothing was tested");
    }
}
