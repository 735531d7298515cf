//! The history of one fault run, Jepsen style, and its checker.
//!
//! Clients record what they saw (never what they assume): every Enqueue
//! that returned OK or failed, every delivery (job id, attempt, lease token,
//! stream, broker, receive time, and the `lease_expires_at` the broker sent,
//! which is database time), every Ack / Nack sent and its outcome, streams
//! opened, dropped by the client, or ended by the broker, and the faults the
//! test injected. [`History::check`] then counts the anomalies.
//!
//! Two clocks appear, and each is compared only with itself:
//! - database time (`lease_expires_at`, and the lease start derived from it,
//!   `lease_expires_at - lease`): orders the leases of one job, since every
//!   lease statement's `now()` follows the commit that freed the job;
//! - the test process's monotonic clock (`t`, from one `Instant`): orders
//!   client actions (a Nack sent, a stream dropped, SIGTERM sent) before a
//!   later delivery was received.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leaseq::pb;
use tonic::Code;

/// One delivery as the client received it.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub stream: u64,
    pub broker: usize,
    pub id: String,
    pub payload: String,
    pub attempt: i32,
    pub token: String,
    /// Database time, microseconds since the epoch.
    pub expires_us: i64,
    /// `expires_us - lease`: the database's `now()` when it was leased.
    pub start_us: i64,
    /// The job's `enqueued_at`, database time: equal to `start_us` when the
    /// job was handed off at its insert (inserted already leased).
    pub enqueued_us: i64,
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
}

#[derive(Default)]
struct Inner {
    enq_ok: HashMap<String, String>,
    /// payload -> the broker its Enqueue went to, where known.
    enq_broker: HashMap<String, usize>,
    enq_err: HashMap<String, Code>,
    deliveries: Vec<Delivered>,
    /// (id, token, broker, t answered)
    ack_ok: Vec<(String, String, usize, Duration)>,
    /// Acks whose outcome is unknown (transport error, UNAVAILABLE, ...).
    ack_unknown: Vec<(String, String, Code)>,
    /// Acks refused with FAILED_PRECONDITION (stale token: fine):
    /// (id, token, broker, t answered).
    ack_stale: Vec<(String, String, usize, Duration)>,
    /// token -> local time the Nack was sent.
    nack_sent: HashMap<String, Duration>,
    nack_ok: usize,
    /// stream -> (broker, opened at)
    streams: HashMap<u64, (usize, Duration)>,
    /// Streams opened with Consume (settles on the stream); the others
    /// are Subscribe streams.
    consume_streams: HashSet<u64>,
    /// stream -> local time the client dropped it (it releases its jobs).
    dropped: HashMap<u64, Duration>,
    /// stream -> (local time, end status) when the broker ended it.
    ended: HashMap<u64, (Duration, Option<Code>)>,
    /// broker -> times SIGTERM was sent (a drain releases its streams' jobs).
    drains: Vec<(usize, Duration)>,
    faults: Vec<Fault>,
    /// Every error a client saw: (operation, code, local time).
    errors: Vec<(&'static str, Code, Duration)>,
    next_stream: u64,
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
            let kind = if self.consume_streams.contains(&d.stream) {
                "Consume"
            } else {
                "Subscribe"
            };
            events.push((
                d.t,
                format!(
                    "delivered attempt {} token {} on {kind} stream {} of broker {} ({stream})",
                    d.attempt, d.token, d.stream, d.broker
                ),
            ));
            if let Some(t) = self.nack_sent.get(&d.token) {
                events.push((*t, format!("nack sent for token {}", d.token)));
            }
        }
        for (i, tok, b, t) in &self.ack_stale {
            if i == id {
                events.push((
                    *t,
                    format!("ack of token {tok} via broker {b}: FAILED_PRECONDITION"),
                ));
            }
        }
        for (i, tok, code) in &self.ack_unknown {
            if i == id {
                events.push((
                    Duration::MAX,
                    format!("ack of token {tok}: unknown ({code:?})"),
                ));
            }
        }
        for (i, tok, b, t) in &self.ack_ok {
            if i == id {
                events.push((*t, format!("ack of token {tok} via broker {b}: OK")));
            }
        }
        events.sort_by_key(|e| e.0);
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|f| format!("{} on {:?} at {:.3?}", f.kind, f.broker, f.injected))
            .collect();
        let lines: Vec<String> = events
            .into_iter()
            .map(|(t, e)| match t {
                Duration::MAX => format!("(time unknown) {e}"),
                t => format!("{t:.3?} {e}"),
            })
            .collect();
        format!("[{}] faults: [{}]", lines.join("; "), faults.join(", "))
    }
}

/// Shared by every client task of one run.
#[derive(Clone)]
pub struct History {
    start: Instant,
    inner: Arc<Mutex<Inner>>,
}

fn ts_us(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds * 1_000_000 + i64::from(ts.nanos) / 1000
}

impl History {
    pub fn new() -> History {
        History {
            start: Instant::now(),
            inner: Default::default(),
        }
    }

    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().unwrap())
    }

    pub fn enqueue_ok(&self, payload: &str, id: &str) {
        self.with(|h| h.enq_ok.insert(payload.to_owned(), id.to_owned()));
    }

    /// [`History::enqueue_ok`] through broker `broker`.
    pub fn enqueue_ok_via(&self, payload: &str, id: &str, broker: usize) {
        self.with(|h| {
            h.enq_ok.insert(payload.to_owned(), id.to_owned());
            h.enq_broker.insert(payload.to_owned(), broker);
        });
    }

    /// An Enqueue that failed: it may still have committed.
    pub fn enqueue_err(&self, payload: &str, code: Code) {
        let t = self.now();
        self.with(|h| {
            h.enq_err.insert(payload.to_owned(), code);
            h.errors.push(("enqueue", code, t));
        });
    }

    pub fn stream_opened(&self, broker: usize) -> u64 {
        let t = self.now();
        self.with(|h| {
            h.next_stream += 1;
            let id = h.next_stream;
            h.streams.insert(id, (broker, t));
            id
        })
    }

    /// A Consume stream was opened (settles go on it).
    pub fn consume_opened(&self, broker: usize) -> u64 {
        let id = self.stream_opened(broker);
        self.with(|h| h.consume_streams.insert(id));
        id
    }

    /// The client drops `stream`, or half-closes it (before the drop, so
    /// that the time is a lower bound of the release).
    pub fn stream_dropped(&self, stream: u64) {
        let t = self.now();
        self.with(|h| {
            h.dropped.entry(stream).or_insert(t);
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
        let rec = Delivered {
            stream,
            broker,
            id: job.id.clone(),
            payload: String::from_utf8_lossy(&job.payload).into_owned(),
            attempt: job.attempt,
            token: d.lease_token.clone(),
            expires_us,
            start_us: expires_us - lease.as_micros() as i64,
            // Absent only from the checker's own planted deliveries.
            enqueued_us: job.enqueued_at.as_ref().map_or(i64::MIN, ts_us),
            t: self.now(),
        };
        self.with(|h| h.deliveries.push(rec.clone()));
        rec
    }

    pub fn ack_result(&self, d: &Delivered, broker: usize, r: &Result<(), tonic::Status>) {
        let t = self.now();
        self.with(|h| match r {
            Ok(()) => h.ack_ok.push((d.id.clone(), d.token.clone(), broker, t)),
            Err(s) if s.code() == Code::FailedPrecondition => {
                h.ack_stale.push((d.id.clone(), d.token.clone(), broker, t))
            }
            Err(s) => {
                h.ack_unknown
                    .push((d.id.clone(), d.token.clone(), s.code()));
                h.errors.push(("ack", s.code(), t));
            }
        });
    }

    pub fn nack_sent(&self, d: &Delivered) {
        let t = self.now();
        self.with(|h| h.nack_sent.insert(d.token.clone(), t));
    }

    pub fn nack_result(&self, d: &Delivered, r: &Result<(), tonic::Status>) {
        let t = self.now();
        self.with(|h| match r {
            Ok(()) => h.nack_ok += 1,
            // Refused: it released nothing, so it explains no redelivery.
            Err(s) if s.code() == Code::FailedPrecondition => {
                h.nack_sent.remove(&d.token);
            }
            // Outcome unknown: it may have released the job.
            Err(s) => h.errors.push(("nack", s.code(), t)),
        });
    }

    /// SIGTERM is about to be sent to `broker`.
    pub fn drain(&self, broker: usize) {
        let t = self.now();
        self.with(|h| h.drains.push((broker, t)));
    }

    /// Records a fault; returns its index for [`History::healed`].
    pub fn fault(&self, kind: &'static str, broker: Option<usize>) -> usize {
        let t = self.now();
        self.with(|h| {
            h.faults.push(Fault {
                kind,
                broker,
                injected: t,
                healed: None,
            });
            h.faults.len() - 1
        })
    }

    pub fn healed(&self, fault: usize) {
        let t = self.now();
        self.with(|h| h.faults[fault].healed = Some(t));
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
            let first = self.with(|h| {
                h.ack_ok
                    .iter()
                    .filter(|a| a.3 >= since && broker.is_none_or(|b| b == a.2))
                    .map(|a| a.3)
                    .min()
            });
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
        self.with(|h| h.ack_ok.iter().map(|a| &a.0).collect::<HashSet<_>>().len())
    }

    /// How many streams clients opened (more than there are consumers:
    /// some re-subscribed).
    pub fn streams_opened(&self) -> usize {
        self.with(|h| h.streams.len())
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

    /// Stream ends (status) of streams on `broker` open at `at`.
    pub fn ends_of_streams_open_at(&self, broker: usize, at: Duration) -> Vec<Option<Code>> {
        self.with(|h| {
            h.streams
                .iter()
                .filter(|(s, (b, opened))| {
                    *b == broker
                        && *opened <= at
                        && h.dropped.get(s).is_none_or(|t| *t > at)
                        && h.ended.get(s).is_none_or(|e| e.0 > at)
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
                    let (broker, opened) = h.streams[s];
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
        let mut r = Report::default();

        let mut acks_per_id: HashMap<&str, Vec<&str>> = HashMap::new();
        for (id, token, _, _) in &h.ack_ok {
            acks_per_id.entry(id).or_default().push(token);
        }
        let ack_unknown: HashSet<&str> = h.ack_unknown.iter().map(|a| a.0.as_str()).collect();

        r.enqueued = h.enq_ok.len();
        r.enqueue_unknown = h.enq_err.len();
        r.deliveries = h.deliveries.len();
        r.ack_unknown = h.ack_unknown.len();
        r.ack_stale = h.ack_stale.len();
        r.nacks = h.nack_ok;
        r.dead = dead.len();
        let stream_of: HashMap<&str, u64> = h
            .deliveries
            .iter()
            .map(|d| (d.token.as_str(), d.stream))
            .collect();
        r.consume_acks = h
            .ack_ok
            .iter()
            .filter(|a| {
                stream_of
                    .get(a.1.as_str())
                    .is_some_and(|s| h.consume_streams.contains(s))
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

        for (payload, id) in &h.enq_ok {
            if acks_per_id.contains_key(id.as_str()) || dead.contains(id) {
                continue;
            }
            if ack_unknown.contains(id.as_str()) && !live.contains(id) {
                // An Ack whose answer was lost, and the job is gone: it
                // committed. Not lost.
                r.acked_unanswered += 1;
                continue;
            }
            r.lost.push(format!("{payload} ({id}): {}", h.story(id)));
        }
        for (id, tokens) in &acks_per_id {
            if tokens.len() > 1 {
                r.acked_twice.push(format!("{id}: {tokens:?}"));
            }
        }
        let known: HashSet<&str> = h
            .enq_ok
            .keys()
            .chain(h.enq_err.keys())
            .map(String::as_str)
            .collect();

        // Deliveries of each job in lease order (database time).
        let mut per_job: BTreeMap<&str, Vec<&Delivered>> = BTreeMap::new();
        for d in &h.deliveries {
            if !known.contains(d.payload.as_str()) {
                r.phantom.push(format!("{} ({})", d.payload, d.id));
            }
            per_job.entry(&d.id).or_default().push(d);
        }
        let acked_token: HashMap<&str, &str> = h
            .ack_ok
            .iter()
            .map(|a| (a.1.as_str(), a.0.as_str()))
            .collect();
        for (id, ds) in per_job.iter_mut() {
            ds.sort_by_key(|d| (d.start_us, d.t));
            for pair in ds.windows(2) {
                let (d1, d2) = (pair[0], pair[1]);
                if d1.token == d2.token {
                    r.same_token_twice.push(format!("{id}: {}", d1.token));
                    continue;
                }
                if acked_token.contains_key(d1.token.as_str()) {
                    r.redelivered_after_ack.push(format!(
                        "{id} ({}): attempt {} delivered after the Ack of attempt {} returned OK",
                        d2.payload, d2.attempt, d1.attempt
                    ));
                    continue;
                }
                r.duplicates += 1;
                // The test's consumers never extend a lease.
                let expires = d1.expires_us;
                if d2.start_us >= expires {
                    r.dup_expiry += 1;
                    continue;
                }
                if h.nack_sent.get(&d1.token).is_some_and(|t| *t < d2.t) {
                    r.dup_nack += 1;
                    continue;
                }
                let opened = h.streams.get(&d1.stream).map(|s| s.1).unwrap_or_default();
                let drained = h
                    .drains
                    .iter()
                    .any(|(b, t)| *b == d1.broker && *t >= opened && *t < d2.t);
                let dropped = h.dropped.get(&d1.stream).is_some_and(|t| *t < d2.t);
                if drained || dropped {
                    r.dup_closed += 1;
                    continue;
                }
                r.lease_overlap.push(format!(
                    "{id} ({}): attempt {} (stream {}, broker {}, lease to {}) and attempt {} \
                     (stream {}, broker {}) leased {:.3}s before the first lease ended, \
                     which was neither settled nor released before",
                    d1.payload,
                    d1.attempt,
                    d1.stream,
                    d1.broker,
                    d1.expires_us,
                    d2.attempt,
                    d2.stream,
                    d2.broker,
                    (expires - d2.start_us) as f64 / 1e6
                ));
            }
        }

        // Recovery: from a fault's healing (or its injection when it heals
        // by itself) to the first Ack OK after it, on its broker if it hit one.
        for f in &h.faults {
            let from = f.healed.unwrap_or(f.injected);
            let first = h
                .ack_ok
                .iter()
                .filter(|a| a.3 >= from && f.broker.is_none_or(|b| b == a.2))
                .map(|a| a.3)
                .min();
            if let Some(t) = first {
                let secs = (t - from).as_secs_f64();
                r.recovery_max_s = r.recovery_max_s.max(secs);
            } else {
                r.unrecovered += 1;
            }
        }
        r
    }
}

#[derive(Debug, Default)]
pub struct Report {
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
    /// Acks that returned OK for jobs delivered on Consume streams.
    pub consume_acks: usize,
    /// Deliveries handed off at their insert to a stream of another replica
    /// than the one the job was enqueued on (dispatch/remote.rs).
    pub handed_across: usize,
    pub dead: usize,
    pub ack_unknown: usize,
    pub ack_stale: usize,
    pub acked_unanswered: usize,
    pub recovery_max_s: f64,
    /// Faults after which no Ack succeeded (on their broker) any more.
    pub unrecovered: usize,
    pub lost: Vec<String>,
    pub acked_twice: Vec<String>,
    pub lease_overlap: Vec<String>,
    pub redelivered_after_ack: Vec<String>,
    pub phantom: Vec<String>,
    pub same_token_twice: Vec<String>,
}

impl Report {
    /// One line of figures, for the test output and docs/RELIABILITY.md.
    pub fn figures(&self, name: &str, wall: Duration) -> String {
        format!(
            "FAULTS {name}: jobs={} enqueue_unknown={} deliveries={} faults={} {:?} duplicates={} \
             (expiry={} nack={} closed={}) nacks={} consume_acks={} handed_across={} dead={} ack_unknown={} ack_stale={} \
             lost={} acked_twice={} lease_overlap={} redelivered_after_ack={} \
             recovery_max_s={:.2} wall_s={:.1} client_errors={:?}",
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
            self.consume_acks,
            self.handed_across,
            self.dead,
            self.ack_unknown,
            self.ack_stale,
            self.lost.len(),
            self.acked_twice.len(),
            self.lease_overlap.len(),
            self.redelivered_after_ack.len(),
            self.recovery_max_s,
            wall.as_secs_f64(),
            self.errors,
        )
    }

    /// Every invariant broken, one entry per kind (empty: all hold).
    pub fn anomalies(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (what, list) in [
            ("lost", &self.lost),
            ("acked twice", &self.acked_twice),
            ("lease overlap", &self.lease_overlap),
            ("redelivered after ack", &self.redelivered_after_ack),
            ("delivered but never enqueued", &self.phantom),
            ("one lease token delivered twice", &self.same_token_twice),
        ] {
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
