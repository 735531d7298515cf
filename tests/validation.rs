//! The bad-input table: every field of every RPC at its limits and beyond.
//!
//! Each row is a request and what it must get: accepted (a boundary value), or
//! a status code plus a text the status message must contain that names the
//! offending field. Every rejected row must change nothing: the broker runs
//! with one real job leased on an open stream, Ack / Nack / ExtendLease rows
//! aim at that job's id and token wherever only one field is bad, and after
//! each row the whole database state (jobs, dead jobs, queues) is compared
//! with what it was before. After the table the held job is still leased under
//! its original token and deadline, acking it with that token succeeds, and a
//! normal enqueue + delivery still works. The AdminService's table runs on the
//! same fixture, its rows requiring the field to be named first.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use leaseq::pb::subscribe_response::Kind;
use prost_types::{Duration as PDuration, Timestamp};
use tokio::sync::oneshot;
use tonic::{Code, Status, Streaming};
use uuid::Uuid;

const INVALID: Code = Code::InvalidArgument;
const TOO_BIG: Code = Code::ResourceExhausted;
const STALE: Code = Code::FailedPrecondition;

const MIB: usize = 1024 * 1024;
/// Ten calendar years, well inside the documented "up to ten years" limit.
const TEN_YEARS_S: i64 = 10 * 365 * 24 * 3600;
/// Eleven years: beyond any reading of "ten years".
const ELEVEN_YEARS_S: i64 = 11 * 366 * 24 * 3600;
/// 9999-12-31T23:59:59Z, the last second PostgreSQL and the contract accept.
const YEAR_9999_END: i64 = 253_402_300_799;
const TWELVE_HOURS_S: i64 = 12 * 3600;

/// The implemented upper bound for delay / ttl / retry_after.
fn max_delay_s() -> i64 {
    leaseq_proto::limits::MAX_DELAY.as_secs() as i64
}

fn pd(seconds: i64, nanos: i32) -> Option<PDuration> {
    Some(PDuration { seconds, nanos })
}

fn ts(seconds: i64, nanos: i32) -> Option<Timestamp> {
    Some(Timestamp { seconds, nanos })
}

/// What a row expects.
#[derive(Clone, Debug)]
enum Want {
    /// Accepted; this many new live jobs appear.
    Ok(i64),
    /// Rejected with this code; the message contains this text.
    Err(Code, String),
    /// Rejected with this code; the message starts with this text (the
    /// offending field, named first).
    Starts(Code, String),
}

fn bad(code: Code, text: impl Into<String>) -> Want {
    Want::Err(code, text.into())
}

fn starts(code: Code, text: impl Into<String>) -> Want {
    Want::Starts(code, text.into())
}

struct Row<R> {
    name: String,
    req: R,
    want: Want,
}

fn row<R>(name: impl Into<String>, req: R, want: Want) -> Row<R> {
    Row {
        name: name.into(),
        req,
        want,
    }
}

/// The task reading the holding stream: returns what it saw that it should
/// not have, and the stream (kept open until the held job is acked).
type Reader = tokio::task::JoinHandle<(Vec<String>, Streaming<pb::SubscribeResponse>)>;

/// A broker with one job leased on an open stream, and the state to compare
/// every rejected row against.
struct Fixture {
    db: TestDb,
    broker: TestBroker,
    client: Client,
    held_id: String,
    held_token: String,
    /// `lease_expires_at` of the held job when the table starts (database text).
    held_expires: String,
    reader: Option<(oneshot::Sender<()>, Reader)>,
    live: i64,
    dead: i64,
    state: String,
    failures: Vec<String>,
    rows: usize,
}

impl Fixture {
    async fn new() -> Fixture {
        let db = TestDb::new().await;
        let broker = TestBroker::start(&db).await;
        let mut client = broker.client().await;
        // A long lease: the job stays leased for the whole table. The stream
        // opens first: `subscribe` expects its first message to be the
        // heartbeat, which a job already waiting can overtake.
        let mut stream = subscribe(&mut client, &["held"], 1, Some(Duration::from_secs(600))).await;
        enqueue(&mut client, "held", "held-payload").await;
        let d = next_delivery(&mut stream, Duration::from_secs(5)).await;
        let held_id = d.job.as_ref().unwrap().id.clone();
        let held_token = d.lease_token.clone();
        let (state, token, attempt, expires): (String, Option<String>, i32, Option<String>) =
            sqlx::query_as(
                "select state, lease_token::text, attempt, lease_expires_at::text
                 from leaseq.jobs where id = $1::uuid",
            )
            .bind(&held_id)
            .fetch_one(&db.pool)
            .await
            .expect("held job row");
        assert_eq!(state, "leased");
        assert_eq!(token.as_deref(), Some(held_token.as_str()));
        assert_eq!(attempt, 1);
        let held_expires = expires.expect("leased job has a deadline");

        // Keep reading the stream (heartbeats), recording anything that is
        // not a heartbeat: with max_in_flight 1 and nothing else waiting in
        // "held", nothing may be delivered while the table runs.
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let reader = tokio::spawn(async move {
            let mut unexpected = Vec::new();
            let mut open = true;
            loop {
                tokio::select! {
                    _ = &mut stop_rx => break,
                    m = stream.message(), if open => match m {
                        Ok(Some(msg)) => {
                            if let Some(Kind::Delivery(d)) = msg.kind {
                                unexpected.push(format!(
                                    "unexpected delivery of {:?} on the holding stream",
                                    d.job.map(|j| j.id)
                                ));
                            }
                        }
                        Ok(None) => {
                            unexpected.push("holding stream ended".to_owned());
                            open = false;
                        }
                        Err(s) => {
                            unexpected.push(format!("holding stream failed: {s:?}"));
                            open = false;
                        }
                    },
                }
            }
            (unexpected, stream)
        });

        let live = db.live_jobs().await;
        let dead = db.dead_jobs().await;
        let state = db.fingerprint().await;
        Fixture {
            db,
            broker,
            client,
            held_id,
            held_token,
            held_expires,
            reader: Some((stop_tx, reader)),
            live,
            dead,
            state,
            failures: Vec::new(),
            rows: 0,
        }
    }

    /// Takes the current database state as the one rejected rows must leave
    /// unchanged (after a test set up more than the held job).
    async fn rebase(&mut self) {
        self.live = self.db.live_jobs().await;
        self.dead = self.db.dead_jobs().await;
        self.state = self.db.fingerprint().await;
    }

    /// An id the broker never issued, and a token it never issued.
    fn unknown() -> (String, String) {
        (Uuid::now_v7().to_string(), Uuid::new_v4().to_string())
    }

    /// Runs every row through `call`, recording mismatches (so one run lists
    /// every broken row rather than the first).
    async fn run<R, F, Fut>(&mut self, rpc: &str, rows: Vec<Row<R>>, mut call: F)
    where
        F: FnMut(Client, R) -> Fut,
        Fut: Future<Output = Result<(), Status>>,
    {
        for Row { name, req, want } in rows {
            self.rows += 1;
            let label = format!("{rpc} / {name}");
            let res = tokio::time::timeout(Duration::from_secs(15), call(self.client.clone(), req))
                .await
                .unwrap_or_else(|_| panic!("{label}: no answer within 15s"));
            let live = self.db.live_jobs().await;
            let dead = self.db.dead_jobs().await;
            let state = self.db.fingerprint().await;
            match (&want, res) {
                (Want::Ok(n), Ok(())) => {
                    if live != self.live + n || dead != self.dead {
                        self.failures.push(format!(
                            "{label}: accepted, but live jobs {} -> {live} (want +{n}), dead {} -> {dead}",
                            self.live, self.dead
                        ));
                    }
                }
                (Want::Ok(_), Err(s)) => self.failures.push(format!(
                    "{label}: must be accepted, got {:?} {:?}",
                    s.code(),
                    s.message()
                )),
                (Want::Err(code, text) | Want::Starts(code, text), res) => {
                    let named = |m: &str| match &want {
                        Want::Starts(..) => m.starts_with(text.as_str()),
                        _ => m.contains(text.as_str()),
                    };
                    match res {
                        Ok(()) => self
                            .failures
                            .push(format!("{label}: accepted, want {code:?} naming {text:?}")),
                        Err(s) if s.code() != *code || !named(s.message()) => {
                            self.failures.push(format!(
                                "{label}: got {:?} {:?}, want {code:?} with {text:?}",
                                s.code(),
                                s.message()
                            ))
                        }
                        Err(_) => {}
                    }
                    if live != self.live || dead != self.dead {
                        self.failures.push(format!(
                            "{label}: rejected input changed counts: live {} -> {live}, dead {} -> {dead}",
                            self.live, self.dead
                        ));
                    } else if state != self.state {
                        self.failures.push(format!(
                            "{label}: rejected input changed the database:\n  before: {}\n  after:  {}",
                            abbreviate(&self.state),
                            abbreviate(&state)
                        ));
                    }
                }
            }
            // Rows that did damage or were accepted move the baseline, so one
            // broken row does not fail every later one.
            self.live = live;
            self.dead = dead;
            self.state = state;
        }
    }

    /// The held job survived the table untouched, can be acked with its
    /// token, and the broker still serves a normal enqueue + delivery.
    async fn finish(mut self) {
        let (stop, reader) = self.reader.take().unwrap();
        let _ = stop.send(());
        let (unexpected, stream) = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("reader stops")
            .expect("reader task");
        self.failures.extend(unexpected);

        let (state, token, attempt, expires, last_error): (
            String,
            Option<String>,
            i32,
            Option<String>,
            Option<String>,
        ) = sqlx::query_as(
            "select state, lease_token::text, attempt, lease_expires_at::text, last_error
             from leaseq.jobs where id = $1::uuid",
        )
        .bind(&self.held_id)
        .fetch_optional(&self.db.pool)
        .await
        .expect("held job query")
        .unwrap_or_else(|| panic!("held job {} is gone after the table", self.held_id));
        if state != "leased"
            || token.as_deref() != Some(self.held_token.as_str())
            || attempt != 1
            || expires.as_deref() != Some(self.held_expires.as_str())
            || last_error.is_some()
        {
            self.failures.push(format!(
                "held job changed by the table: state {state}, token {token:?} (was {}), attempt {attempt}, \
                 lease_expires_at {expires:?} (was {}), last_error {last_error:?}",
                self.held_token, self.held_expires
            ));
        }
        eprintln!("{} rows checked", self.rows);
        assert!(
            self.failures.is_empty(),
            "{} of {} rows failed:\n{}",
            self.failures.len(),
            self.rows,
            self.failures.join("\n")
        );

        let mut client = self.client.clone();
        client
            .ack(pb::AckRequest {
                job_id: self.held_id.clone(),
                lease_token: self.held_token.clone(),
                enqueue: Vec::new(),
                result: Vec::new(),
            })
            .await
            .expect("acking the held job with its own token after the table");
        drop(stream);

        // Still healthy: a normal enqueue is delivered and acked.
        let live_before = self.db.live_jobs().await;
        let id = enqueue(&mut client, "after-table", "still-alive").await;
        let mut s = subscribe(&mut client, &["after-table"], 1, None).await;
        let d = next_delivery(&mut s, Duration::from_secs(5)).await;
        let j = d.job.as_ref().unwrap();
        assert_eq!(j.id, id);
        assert_eq!(j.payload, b"still-alive");
        ack(&mut client, &d).await.expect("ack after the table");
        assert_eq!(self.db.live_jobs().await, live_before);
        assert_eq!(
            health(self.broker.addr, "").await,
            Some(tonic_health::pb::health_check_response::ServingStatus::Serving)
        );
        drop(s);
        self.broker.stop().await;
    }
}

fn abbreviate(s: &str) -> String {
    if s.len() <= 600 {
        s.to_owned()
    } else {
        format!("{}... ({} bytes)", &s[..600], s.len())
    }
}

impl<R> Row<R> {
    fn map<S>(self, f: impl FnOnce(R) -> S) -> Row<S> {
        row(self.name, f(self.req), self.want)
    }
}

/// One change to a valid request, named.
type Edit<'a, R> = (&'a str, &'a dyn Fn(&mut R));

/// A row per edit, each applied to a copy of `base`, all expecting `want`.
fn rows<R: Clone>(base: &R, want: Want, edits: &[Edit<R>]) -> Vec<Row<R>> {
    edits
        .iter()
        .map(|(name, edit)| {
            let mut req = base.clone();
            edit(&mut req);
            row(*name, req, want.clone())
        })
        .collect()
}

/// A row per value of one field (`set` stores it in a copy of `base`), all
/// expecting `want`; rows are named "`field` `value name`".
fn each<R: Clone, V>(
    field: &str,
    base: &R,
    values: Vec<(&str, V)>,
    set: impl Fn(&mut R, V),
    want: &Want,
) -> Vec<Row<R>> {
    values
        .into_iter()
        .map(|(name, v)| {
            let mut req = base.clone();
            set(&mut req, v);
            row(format!("{field} {name}"), req, want.clone())
        })
        .collect()
}

/// Durations that every Duration field with the ten-year limit (delay, ttl,
/// retry_after) rejects: they share one rule.
fn bad_durations() -> Vec<(&'static str, Option<PDuration>)> {
    vec![
        ("-1s", pd(-1, 0)),
        ("-1ns", pd(0, -1)),
        ("1s -1ns (mixed signs)", pd(1, -1)),
        ("nanos 1e9", pd(0, 1_000_000_000)),
        ("nanos i32::MAX", pd(0, i32::MAX)),
        ("11 years", pd(ELEVEN_YEARS_S, 0)),
        ("limit + 1ns", pd(max_delay_s(), 1)),
        ("i64::MAX s", pd(i64::MAX, 0)),
        ("i64::MIN s", pd(i64::MIN, 0)),
    ]
}

/// Durations those fields accept.
fn ok_durations() -> Vec<(&'static str, Option<PDuration>)> {
    vec![
        ("zero", pd(0, 0)),
        ("10 years", pd(TEN_YEARS_S, 0)),
        ("exactly the limit", pd(max_delay_s(), 0)),
    ]
}

/// Leases that every lease field (Subscribe, ExtendLease) rejects: outside
/// [1 s, 12 h]. The ones that would shorten a live lease come last, so that
/// if one were wrongly accepted on the held job, the rows before it still
/// see the job leased.
fn bad_leases() -> Vec<(&'static str, Option<PDuration>)> {
    vec![
        ("12h + 1s", pd(TWELVE_HOURS_S + 1, 0)),
        ("12h + 1ns", pd(TWELVE_HOURS_S, 1)),
        ("-1s", pd(-1, 0)),
        ("-1ns", pd(0, -1)),
        ("nanos 1e9", pd(0, 1_000_000_000)),
        ("i64::MAX", pd(i64::MAX, 0)),
        ("i64::MIN", pd(i64::MIN, 0)),
        ("zero", pd(0, 0)),
        ("999ms", pd(0, 999_000_000)),
        ("999ms + 1ns", pd(0, 999_000_001)),
        ("1ns under 1s", pd(0, 999_999_999)),
    ]
}

/// Leases those fields accept.
fn ok_leases() -> Vec<(&'static str, Option<PDuration>)> {
    vec![
        ("exactly 1s", pd(1, 0)),
        ("exactly 12h", pd(TWELVE_HOURS_S, 0)),
    ]
}

fn headers(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn many_headers(n: usize) -> HashMap<String, String> {
    (0..n).map(|i| (format!("h{i}"), "v".to_owned())).collect()
}

/// The held job's (id, lease token).
type Held = (String, String);

/// Runs one RPC's table on a fresh [`Fixture`]: `rows` is given the held
/// job, `call` sends one request.
async fn check_table<R, F, Fut>(rpc: &str, rows: impl FnOnce(&Held) -> Vec<Row<R>>, call: F)
where
    F: FnMut(Client, R) -> Fut,
    Fut: Future<Output = Result<(), Status>>,
{
    let mut fx = Fixture::new().await;
    let held = (fx.held_id.clone(), fx.held_token.clone());
    fx.run(rpc, rows(&held), call).await;
    fx.finish().await;
}

/// Enqueue cases: `queue` is where bad rows aim, accepted rows go to
/// `ok_queue` (each creates a job).
fn enqueue_rows(queue: &str, ok_queue: &str) -> Vec<Row<pb::EnqueueRequest>> {
    let bad_base = job(queue, "x");
    let ok_base = job(ok_queue, "x");
    let invalid = |text: &str| bad(INVALID, text);
    let long_key = "k".repeat(257);
    let mut out = Vec::new();
    out.extend(rows(
        &bad_base,
        invalid("queue:"),
        &[
            ("queue empty", &|r| r.queue.clear()),
            ("queue 129 chars", &|r| r.queue = "q".repeat(129)),
            ("queue 'a b'", &|r| r.queue = "a b".into()),
            ("queue 'é'", &|r| r.queue = "é".into()),
            ("queue 'aé'", &|r| r.queue = "aé".into()),
            ("queue 'a/b'", &|r| r.queue = "a/b".into()),
            ("queue '.a'", &|r| r.queue = ".a".into()),
            ("queue '-a'", &|r| r.queue = "-a".into()),
            ("queue '_a'", &|r| r.queue = "_a".into()),
            ("queue ':a'", &|r| r.queue = ":a".into()),
            ("queue with NUL", &|r| r.queue = "a\0b".into()),
            ("queue with newline", &|r| r.queue = "a\n".into()),
            ("queue 'a*'", &|r| r.queue = "a*".into()),
            ("queue 128 chars + 'é'", &|r| {
                r.queue = format!("{}é", "q".repeat(126))
            }),
        ],
    ));
    out.extend(rows(
        &bad_base,
        bad(TOO_BIG, "payload"),
        &[
            ("payload 1 MiB + 1", &|r| r.payload = vec![7; MIB + 1]),
            ("payload 2 MiB", &|r| r.payload = vec![7; 2 * MIB]),
        ],
    ));
    out.extend(rows(
        &bad_base,
        invalid("headers"),
        &[
            ("header empty key", &|r| r.headers = headers(&[("", "v")])),
            ("65 headers", &|r| r.headers = many_headers(65)),
        ],
    ));
    out.extend(rows(
        &bad_base,
        invalid("headers["),
        &[("header NUL in key", &|r| {
            r.headers = headers(&[("a\0b", "v")])
        })],
    ));
    out.extend(rows(
        &bad_base,
        invalid("headers[\"k\"]"),
        &[
            ("header NUL in value", &|r| {
                r.headers = headers(&[("k", "a\0b")])
            }),
            ("header value 16 KiB + 1", &|r| {
                r.headers = headers(&[("k", &"v".repeat(16 * 1024 + 1))])
            }),
        ],
    ));
    out.extend(rows(
        &bad_base,
        invalid(&format!("headers[\"{long_key}\"] key")),
        &[("header key 257 bytes", &|r| {
            r.headers = headers(&[(&long_key, "v")])
        })],
    ));
    let set_delay = |r: &mut pb::EnqueueRequest, d| r.delay = d;
    out.extend(each(
        "delay",
        &bad_base,
        bad_durations(),
        set_delay,
        &invalid("delay:"),
    ));
    out.extend(rows(
        &bad_base,
        invalid("delay, run_at"),
        &[
            ("delay and run_at", &|r| {
                r.delay = pd(1, 0);
                r.run_at = ts(0, 0);
            }),
            ("zero delay and run_at", &|r| {
                r.delay = pd(0, 0);
                r.run_at = ts(YEAR_9999_END, 0);
            }),
        ],
    ));
    out.extend(rows(
        &bad_base,
        invalid("run_at"),
        &[
            ("run_at nanos -1", &|r| r.run_at = ts(1_700_000_000, -1)),
            ("run_at nanos 1e9", &|r| {
                r.run_at = ts(1_700_000_000, 1_000_000_000)
            }),
            ("run_at year 10000", &|r| {
                r.run_at = ts(YEAR_9999_END + 1, 0)
            }),
            ("run_at i64::MAX", &|r| r.run_at = ts(i64::MAX, 0)),
            ("run_at -1s (1969)", &|r| r.run_at = ts(-1, 0)),
            ("run_at i64::MIN", &|r| r.run_at = ts(i64::MIN, 0)),
        ],
    ));
    out.extend(rows(
        &bad_base,
        invalid("dedup_key"),
        &[
            ("dedup_key 513 bytes", &|r| r.dedup_key = "k".repeat(513)),
            ("dedup_key 257 x 'é' (514 bytes)", &|r| {
                r.dedup_key = "é".repeat(257)
            }),
            ("dedup_key with NUL", &|r| r.dedup_key = "a\0b".into()),
        ],
    ));
    out.extend(rows(
        &bad_base,
        invalid("max_attempts"),
        &[
            ("max_attempts -1", &|r| r.max_attempts = -1),
            ("max_attempts i32::MIN", &|r| r.max_attempts = i32::MIN),
            ("max_attempts 1001", &|r| r.max_attempts = 1001),
            ("max_attempts i32::MAX", &|r| r.max_attempts = i32::MAX),
        ],
    ));
    let set_ttl = |r: &mut pb::EnqueueRequest, d| r.ttl = d;
    out.extend(each(
        "ttl",
        &bad_base,
        bad_durations(),
        set_ttl,
        &invalid("ttl"),
    ));

    // unique_for: a duration of at most 366 days, with a dedup key;
    // on_duplicate: KEEP or REPLACE, REPLACE with a dedup key.
    let keyed_bad = pb::EnqueueRequest {
        dedup_key: "uf".into(),
        ..bad_base.clone()
    };
    let set_unique_for = |r: &mut pb::EnqueueRequest, d| r.unique_for = d;
    let mut bad_windows = bad_durations();
    bad_windows.extend([
        ("367 days", pd(367 * 24 * 3600, 0)),
        ("366 days + 1ns", pd(366 * 24 * 3600, 1)),
    ]);
    out.extend(each(
        "unique_for",
        &keyed_bad,
        bad_windows,
        set_unique_for,
        &invalid("unique_for"),
    ));
    out.extend(rows(
        &bad_base,
        invalid("unique_for: needs a dedup_key"),
        &[("unique_for 1h without dedup_key", &|r| {
            r.unique_for = pd(3600, 0)
        })],
    ));
    out.extend(rows(
        &keyed_bad,
        invalid("on_duplicate"),
        &[
            ("on_duplicate 2", &|r| r.on_duplicate = 2),
            ("on_duplicate -1", &|r| r.on_duplicate = -1),
            ("on_duplicate i32::MAX", &|r| r.on_duplicate = i32::MAX),
        ],
    ));
    out.extend(rows(
        &bad_base,
        invalid("on_duplicate: REPLACE needs a dedup_key"),
        &[("on_duplicate REPLACE without dedup_key", &|r| {
            r.on_duplicate = pb::OnDuplicate::Replace as i32
        })],
    ));

    // Boundary values that must be accepted.
    out.extend(rows(
        &ok_base,
        Want::Ok(1),
        &[
            ("queue exactly 128 chars", &|r| r.queue = "q".repeat(128)),
            ("queue of every allowed class", &|r| {
                r.queue = "Az09.b_c:d-e".into()
            }),
            ("queue starting with a digit", &|r| {
                r.queue = "9lives".into()
            }),
            ("payload exactly 1 MiB", &|r| r.payload = vec![7; MIB]),
            ("empty payload", &|r| r.payload.clear()),
            ("64 headers", &|r| r.headers = many_headers(64)),
            ("header value exactly 16 KiB", &|r| {
                r.headers = headers(&[("k", &"v".repeat(16 * 1024))])
            }),
            ("header key exactly 256 bytes", &|r| {
                r.headers = headers(&[(&"k".repeat(256), "v")])
            }),
            ("header empty value, unicode", &|r| {
                r.headers = headers(&[("k", ""), ("ключ", "значение ✓")])
            }),
            ("delay 1ns", &|r| r.delay = pd(0, 1)),
            ("run_at 9999-12-31T23:59:59.999999999", &|r| {
                r.run_at = ts(YEAR_9999_END, 999_999_999)
            }),
            ("run_at 1970 (past)", &|r| r.run_at = ts(0, 0)),
            ("dedup_key exactly 512 bytes", &|r| {
                r.dedup_key = "k".repeat(512)
            }),
            ("dedup_key 256 x 'é' (512 bytes)", &|r| {
                r.dedup_key = "é".repeat(256)
            }),
            ("max_attempts 0 (default)", &|r| r.max_attempts = 0),
            ("max_attempts 1", &|r| r.max_attempts = 1),
            ("max_attempts 1000", &|r| r.max_attempts = 1000),
            ("priority i32::MIN", &|r| r.priority = i32::MIN),
            ("priority i32::MAX", &|r| r.priority = i32::MAX),
            // Each with a key of its own: every row makes a job.
            ("unique_for zero", &|r| {
                r.dedup_key = "uf-zero".into();
                r.unique_for = pd(0, 0)
            }),
            ("unique_for 1ns", &|r| {
                r.dedup_key = "uf-1ns".into();
                r.unique_for = pd(0, 1)
            }),
            ("unique_for exactly 366 days", &|r| {
                r.dedup_key = "uf-366d".into();
                r.unique_for = pd(366 * 24 * 3600, 0)
            }),
            ("on_duplicate KEEP without dedup_key", &|r| {
                r.on_duplicate = pb::OnDuplicate::Keep as i32
            }),
            ("on_duplicate REPLACE (no job of the key)", &|r| {
                r.dedup_key = "replace-new".into();
                r.on_duplicate = pb::OnDuplicate::Replace as i32
            }),
        ],
    ));
    out.extend(each(
        "delay",
        &ok_base,
        ok_durations(),
        set_delay,
        &Want::Ok(1),
    ));
    out.extend(each("ttl", &ok_base, ok_durations(), set_ttl, &Want::Ok(1)));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_bad_input_table() {
    check_table(
        "Enqueue",
        |_| {
            let mut rows = enqueue_rows("held", "accepted");
            // Past --max-message-bytes (4 MiB): refused before the message
            // is read, naming the limit, whatever the fields inside.
            rows.push(row(
                "a 4 MiB payload (a message past 4 MiB)",
                job("held", &"p".repeat(4 * MIB)),
                starts(TOO_BIG, "max-message-bytes:"),
            ));
            rows.push(row(
                "a message of 64 MiB (the limit before it was 4 MiB)",
                job("held", &"p".repeat(64 * MIB)),
                starts(TOO_BIG, "max-message-bytes:"),
            ));
            // The largest job is still accepted: a 1 MiB payload with 64
            // headers of the largest key and value (2.06 MiB).
            let mut largest = job("accepted", "");
            largest.payload = vec![7; MIB];
            largest.headers = (0..64)
                .map(|i| (format!("{i:0>256}"), "v".repeat(16 * 1024)))
                .collect();
            largest.dedup_key = "l".repeat(512);
            rows.push(row("the largest job (2.06 MiB)", largest, Want::Ok(1)));
            rows
        },
        |mut c, r| async move { c.enqueue(r).await.map(|_| ()) },
    )
    .await;
}

/// Enqueue's table again, every row a message on one Produce stream: each
/// refused job is answered with the unary call's status, its field named
/// as Enqueue names it (`queue: ...`), the stream goes on to the next row,
/// and nothing changes. A message past --max-message-bytes ends a stream
/// (tests/produce.rs), so those rows are left to the unary table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_bad_input_table() {
    use tokio::sync::Mutex;
    type Stream = (
        tokio::sync::mpsc::UnboundedSender<pb::ProduceRequest>,
        Streaming<pb::ProduceResponse>,
        u64,
    );
    let stream: std::sync::Arc<Mutex<Option<Stream>>> = Default::default();
    let rows: Vec<Row<pb::EnqueueRequest>> = enqueue_rows("held", "accepted");
    let rows_n = rows.len();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = answered.clone();
    check_table(
        "Produce",
        |_| rows,
        move |mut c, r| {
            let stream = stream.clone();
            let count = count.clone();
            async move {
                let mut guard = stream.lock().await;
                if guard.is_none() {
                    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                    let answers = c
                        .produce(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
                        .await?
                        .into_inner();
                    *guard = Some((tx, answers, 0));
                }
                let (tx, answers, next) = guard.as_mut().expect("opened above");
                *next += 1;
                let id = *next;
                tx.send(pb::ProduceRequest { id, job: Some(r) })
                    .map_err(|_| Status::internal("the request side closed"))?;
                let a = answers
                    .message()
                    .await?
                    .ok_or_else(|| Status::internal("the Produce stream ended"))?;
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if a.id != id {
                    return Err(Status::internal(format!("answer {} to request {id}", a.id)));
                }
                match a.code {
                    0 if a.enqueued.as_ref().is_some_and(|e| !e.job_id.is_empty()) => Ok(()),
                    0 => Err(Status::internal("OK without the job's id")),
                    code => Err(Status::new(Code::from(code), a.message)),
                }
            }
        },
    )
    .await;
    // Every row went over the one stream.
    assert_eq!(answered.load(std::sync::atomic::Ordering::SeqCst), rows_n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_batch_bad_input_table() {
    let batch = |jobs: Vec<pb::EnqueueRequest>| pb::EnqueueBatchRequest { jobs };
    let good = |n: usize, queue: &str| -> Vec<pb::EnqueueRequest> {
        (0..n).map(|i| job(queue, &format!("b{i}"))).collect()
    };
    let mut rows = vec![
        row("no jobs", batch(vec![]), bad(INVALID, "jobs")),
        row(
            "1001 jobs",
            batch(good(1001, "batch")),
            bad(TOO_BIG, "jobs"),
        ),
        row(
            "5000 jobs",
            batch(good(5000, "batch")),
            bad(TOO_BIG, "jobs"),
        ),
    ];

    // Every single-job rule, placed at some index k of a five-job batch: the
    // message is the single-job one prefixed with `jobs[k].`, and none of the
    // four good jobs is enqueued.
    for (i, single) in enqueue_rows("batch", "unused").into_iter().enumerate() {
        let Want::Err(code, text) = single.want else {
            continue;
        };
        let k = i % 5;
        let mut jobs = good(5, "batch");
        jobs[k] = single.req;
        rows.push(row(
            format!("jobs[{k}]: {}", single.name),
            batch(jobs),
            bad(code, format!("jobs[{k}].{text}")),
        ));
    }
    // Index at the far end of the largest batch.
    let mut jobs = good(1000, "batch");
    jobs[999].queue = "bad queue".into();
    rows.push(row(
        "jobs[999] bad queue in 1000",
        batch(jobs),
        bad(INVALID, "jobs[999].queue:"),
    ));
    // Two bad jobs: the first is named.
    let mut jobs = good(5, "batch");
    jobs[1].max_attempts = -1;
    jobs[3].queue.clear();
    rows.push(row(
        "jobs[1] and jobs[3] bad",
        batch(jobs),
        bad(INVALID, "jobs[1].max_attempts"),
    ));
    // Past --max-message-bytes (4 MiB) with every job valid: refused
    // whole, naming the limit; just under it, accepted.
    let payloads = |n: usize, size: usize| -> Vec<pb::EnqueueRequest> {
        (0..n)
            .map(|_| pb::EnqueueRequest {
                payload: vec![7; size],
                ..job("batch", "")
            })
            .collect()
    };
    rows.push(row(
        "4 jobs of 1 MiB (a message past 4 MiB)",
        batch(payloads(4, MIB)),
        starts(TOO_BIG, "max-message-bytes:"),
    ));
    rows.push(row("3 jobs of 1 MiB", batch(payloads(3, MIB)), Want::Ok(3)));
    // Accepted: one job, a batch of boundary values, and exactly the limit.
    rows.push(row("1 job", batch(good(1, "accepted")), Want::Ok(1)));
    let boundary: Vec<pb::EnqueueRequest> = enqueue_rows("unused", "accepted-batch")
        .into_iter()
        .filter(|r| matches!(r.want, Want::Ok(_)))
        // 1 MiB payloads in one message are fine, but keep it small.
        .filter(|r| r.req.payload.len() < 1024)
        .map(|r| r.req)
        .collect();
    let n = boundary.len() as i64;
    rows.push(row(
        "boundary values in one batch",
        batch(boundary),
        Want::Ok(n),
    ));
    rows.push(row(
        "exactly 1000 jobs",
        batch(good(1000, "accepted")),
        Want::Ok(1000),
    ));

    check_table(
        "EnqueueBatch",
        |_| rows,
        |mut c, r| async move {
            let want = r.jobs.len();
            let resp = c.enqueue_batch(r).await?.into_inner();
            if resp.results.len() != want {
                return Err(Status::internal(format!(
                    "{} results for {want} jobs",
                    resp.results.len()
                )));
            }
            Ok(())
        },
    )
    .await;
}

fn sub(queues: &[&str]) -> pb::SubscribeRequest {
    pb::SubscribeRequest {
        queues: queues.iter().map(|q| q.to_string()).collect(),
        consumer: "validation".into(),
        max_in_flight: 1,
        lease: None,
        accept: Vec::new(),
    }
}

fn subscribe_rows() -> Vec<Row<pb::SubscribeRequest>> {
    let bad_base = sub(&["held"]);
    // Accepted rows subscribe to an empty queue so they lease nothing.
    let ok_base = sub(&["empty"]);
    let names = |n: usize| (0..n).map(|i| format!("q{i}")).collect::<Vec<_>>();
    let queues = |qs: &[&str]| qs.iter().map(|q| q.to_string()).collect::<Vec<_>>();
    let invalid = |text: &str| bad(INVALID, text);
    let mut out = Vec::new();
    out.extend(rows(
        &bad_base,
        invalid("queues"),
        &[
            ("no queues", &|r| r.queues.clear()),
            ("65 queues", &|r| r.queues = names(65)),
        ],
    ));
    out.extend(rows(
        &bad_base,
        invalid("queues[0]"),
        &[
            ("queues[0] empty", &|r| r.queues = queues(&[""])),
            ("queues[0] '.a'", &|r| r.queues = queues(&[".a"])),
        ],
    ));
    out.extend(rows(
        &bad_base,
        invalid("queues[1]"),
        &[
            ("queues[1] 'a b'", &|r| r.queues = queues(&["held", "a b"])),
            ("queues[1] duplicate", &|r| {
                r.queues = queues(&["held", "held"])
            }),
        ],
    ));
    out.extend(rows(
        &bad_base,
        invalid("queues[2]"),
        &[
            ("queues[2] 129 chars", &|r| {
                r.queues = queues(&["held", "x", &"q".repeat(129)])
            }),
            ("queues[2] duplicate of [0]", &|r| {
                r.queues = queues(&["a", "b", "a"])
            }),
        ],
    ));
    out.extend(rows(
        &bad_base,
        invalid("queues[3]"),
        &[("queues[3] 'é'", &|r| {
            r.queues = queues(&["a", "b", "c", "é"])
        })],
    ));
    out.extend(rows(
        &bad_base,
        invalid("max_in_flight"),
        &[
            ("max_in_flight 10001", &|r| r.max_in_flight = 10_001),
            ("max_in_flight u32::MAX", &|r| r.max_in_flight = u32::MAX),
        ],
    ));
    let set_lease = |r: &mut pb::SubscribeRequest, l| r.lease = l;
    out.extend(each(
        "lease",
        &bad_base,
        bad_leases(),
        set_lease,
        &invalid("lease"),
    ));
    out.extend(rows(
        &bad_base,
        invalid("consumer"),
        &[
            ("consumer with NUL", &|r| r.consumer = "pod\0x".into()),
            ("consumer 257 bytes", &|r| r.consumer = "c".repeat(257)),
            ("consumer 129 x 'é' (258 bytes)", &|r| {
                r.consumer = "é".repeat(129)
            }),
        ],
    ));
    out.extend(rows(
        &bad_base,
        invalid("accept"),
        &[("accept 33 entries", &|r| {
            r.accept = (0..33).map(|i| format!("x{i}")).collect()
        })],
    ));
    out.extend(rows(
        &bad_base,
        invalid("accept[1]"),
        &[
            ("accept entry 65 bytes", &|r| {
                r.accept = vec!["deliveries".into(), "a".repeat(65)]
            }),
            ("accept entry with NUL", &|r| {
                r.accept = vec!["deliveries".into(), "a\0b".into()]
            }),
        ],
    ));
    // Accepted.
    out.extend(rows(
        &ok_base,
        Want::Ok(0),
        &[
            ("64 queues", &|r| r.queues = names(64)),
            ("max_in_flight 10000", &|r| r.max_in_flight = 10_000),
            ("max_in_flight 0 (default)", &|r| r.max_in_flight = 0),
            ("lease absent", &|r| r.lease = None),
            ("consumer exactly 256 bytes", &|r| {
                r.consumer = "c".repeat(256)
            }),
            ("consumer empty", &|r| r.consumer.clear()),
            (
                "accept 32 entries of 64 bytes, unknown ones ignored",
                &|r| r.accept = (0..32).map(|i| format!("{i:064}")).collect(),
            ),
            ("accept deliveries", &|r| {
                r.accept = vec!["deliveries".into()]
            }),
            ("queue exactly 128 chars", &|r| {
                r.queues = vec!["e".repeat(128)]
            }),
        ],
    ));
    out.extend(each(
        "lease",
        &ok_base,
        ok_leases(),
        set_lease,
        &Want::Ok(0),
    ));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_bad_input_table() {
    check_table(
        "Subscribe",
        |_| subscribe_rows(),
        |mut c, r| async move {
            // A bad request must fail the call itself; a stream that opens and
            // then fails is reported as UNKNOWN so the row's code check catches it.
            let mut s = c.subscribe(r).await?.into_inner();
            match tokio::time::timeout(Duration::from_secs(5), s.message()).await {
                Ok(Ok(Some(_))) => Ok(()),
                Ok(Ok(None)) => Err(Status::unknown("stream opened, then ended at once")),
                Ok(Err(e)) => Err(Status::unknown(format!(
                    "stream opened, then failed: {e:?}"
                ))),
                Err(_) => Err(Status::unknown("stream opened, no message within 5s")),
            }
        },
    )
    .await;
}

/// The (job_id, lease_token) rows common to Ack, Nack and ExtendLease.
/// `held` is a real leased job with its token: rows that pair it with a bad
/// or wrong other field could do damage if validation or fencing were broken.
fn id_token_rows((h, t): &Held) -> Vec<Row<Held>> {
    let (u, r) = Fixture::unknown();
    let ids = |name: &str, id: &str, token: &str, want: Want| {
        row(name, (id.to_owned(), token.to_owned()), want)
    };
    let invalid = |text: &str| bad(INVALID, text);
    let stale = || bad(STALE, "lease_token");
    vec![
        ids("job_id empty", "", t, invalid("job_id")),
        ids("job_id not a UUID", "not-a-uuid", t, invalid("job_id")),
        ids("job_id a number", "12345", t, invalid("job_id")),
        ids(
            "job_id UUID + garbage",
            &format!("{h}x"),
            t,
            invalid("job_id"),
        ),
        ids(
            "job_id UUID with NUL",
            &format!("{h}\0"),
            t,
            invalid("job_id"),
        ),
        ids("job_id and token empty", "", "", invalid("job_id")),
        ids("lease_token empty", h, "", invalid("lease_token")),
        ids(
            "lease_token not a UUID",
            h,
            "not-a-token",
            invalid("lease_token"),
        ),
        ids("lease_token truncated", h, &t[..30], invalid("lease_token")),
        ids(
            "lease_token with NUL",
            h,
            &format!("{t}\0"),
            invalid("lease_token"),
        ),
        // Well-formed but not the current lease: fencing.
        ids("unknown job id, unknown token", &u, &r, stale()),
        ids("unknown job id, the held job's token", &u, t, stale()),
        ids("held job id, wrong token", h, &r, stale()),
        ids("held job id, its job id as token", h, h, stale()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_bad_input_table() {
    check_table(
        "Ack",
        |held| {
            id_token_rows(held)
                .into_iter()
                .map(|r| {
                    r.map(|(job_id, lease_token)| pb::AckRequest {
                        job_id,
                        lease_token,
                        ..Default::default()
                    })
                })
                .chain(result_rows(held, "result"))
                .collect()
        },
        |mut c, r| async move { c.ack(r).await.map(|_| ()) },
    )
    .await;
}

/// The largest result the broker takes by default (`--max-result-bytes`).
const MAX_RESULT: usize = 64 * 1024;

/// Results of an ack (`AckRequest.result`) aimed at the held job with its
/// current token: one byte past the limit is refused naming the field
/// (`result`, or `acks[0].result` on a stream), and the job is not acked;
/// a good result with a stale token is refused as any stale ack.
fn result_rows((h, t): &Held, field: &str) -> Vec<Row<pb::AckRequest>> {
    let ack = |result: Vec<u8>| pb::AckRequest {
        job_id: h.clone(),
        lease_token: t.clone(),
        result,
        ..Default::default()
    };
    let (_, r) = Fixture::unknown();
    vec![
        row(
            "result one byte past the limit",
            ack(vec![b'r'; MAX_RESULT + 1]),
            bad(
                TOO_BIG,
                format!("{field}: is 65537 bytes, the limit is 65536"),
            ),
        ),
        row(
            "result of 1 MiB",
            ack(vec![0; MIB]),
            bad(TOO_BIG, format!("{field}: is 1048576 bytes")),
        ),
        row(
            "good result, held job with a wrong token",
            pb::AckRequest {
                lease_token: r,
                ..ack(vec![b'r'; MAX_RESULT])
            },
            bad(STALE, "lease_token"),
        ),
    ]
}

/// Follow-up jobs of an ack (`AckRequest.enqueue`) aimed at the held job
/// with its current token: every single-job rule at some index k of three
/// follow-ups, the count past the batch limit, and a stale token with good
/// follow-ups. Each is refused and changes nothing (the held job is not
/// acked, no follow-up is inserted). `prefix` is where the list sits
/// (`enqueue`, or `acks[0].enqueue` on a stream).
fn follow_up_rows((h, t): &Held, prefix: &str) -> Vec<Row<pb::AckRequest>> {
    let ack = |enqueue: Vec<pb::EnqueueRequest>| pb::AckRequest {
        job_id: h.clone(),
        lease_token: t.clone(),
        enqueue,
        ..Default::default()
    };
    let good = |n: usize| -> Vec<pb::EnqueueRequest> {
        (0..n).map(|i| job("follow", &format!("f{i}"))).collect()
    };
    let mut out = Vec::new();
    for (i, single) in enqueue_rows("follow", "unused").into_iter().enumerate() {
        let Want::Err(code, text) = single.want else {
            continue;
        };
        let k = i % 3;
        let mut jobs = good(3);
        jobs[k] = single.req;
        out.push(row(
            format!("{prefix}[{k}]: {}", single.name),
            ack(jobs),
            bad(code, format!("{prefix}[{k}].{text}")),
        ));
    }
    out.push(row(
        "1001 follow-ups",
        ack(good(1001)),
        bad(TOO_BIG, format!("{prefix}: 1001")),
    ));
    let (u, r) = Fixture::unknown();
    out.push(row(
        "good follow-ups, held job with a wrong token",
        pb::AckRequest {
            lease_token: r,
            ..ack(good(2))
        },
        bad(STALE, "lease_token"),
    ));
    out.push(row(
        "good follow-ups, unknown job",
        pb::AckRequest {
            job_id: u,
            ..ack(good(2))
        },
        bad(STALE, "lease_token"),
    ));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_follow_ups_bad_input_table() {
    check_table(
        "Ack (follow-ups)",
        |held| follow_up_rows(held, "enqueue"),
        |mut c, r| async move { c.ack(r).await.map(|_| ()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_batch_refuses_follow_ups() {
    check_table(
        "AckBatch (follow-ups)",
        |(h, t)| {
            let entry = |enqueue: Vec<pb::EnqueueRequest>| pb::AckRequest {
                job_id: h.clone(),
                lease_token: t.clone(),
                enqueue,
                ..Default::default()
            };
            let mut rows = vec![row(
                "an entry with a follow-up",
                pb::AckBatchRequest {
                    acks: vec![entry(vec![]), entry(vec![job("follow", "f")])],
                },
                bad(INVALID, "acks[1].enqueue: "),
            )];
            // A result past the limit in one entry fails the whole call,
            // naming the entry, and acks nothing.
            // (Not the stale-token row: the batch's good entry would ack.)
            let too_large = result_rows(&(h.clone(), t.clone()), "acks[1].result")
                .into_iter()
                .filter(|r| matches!(&r.want, Want::Err(TOO_BIG, _)));
            for r in too_large {
                rows.push(row(
                    format!("acks[1] {}", r.name),
                    pb::AckBatchRequest {
                        acks: vec![entry(vec![]), r.req],
                    },
                    r.want,
                ));
            }
            rows
        },
        |mut c, r| async move { c.ack_batch(r).await.map(|_| ()) },
    )
    .await;
}

fn nack_rows(held: &Held) -> Vec<Row<pb::NackRequest>> {
    let nack = |(job_id, lease_token): Held| pb::NackRequest {
        job_id,
        lease_token,
        error: "boom".into(),
        retry_after: None,
        dead_letter: false,
    };
    let mut out: Vec<Row<pb::NackRequest>> = id_token_rows(held)
        .into_iter()
        .map(|r| r.map(nack))
        .collect();
    // The same with dead_letter: a broken check would bury the held job.
    out.extend(id_token_rows(held).into_iter().map(|r| {
        let mut r = r.map(nack);
        r.name.push_str(" (dead_letter)");
        r.req.dead_letter = true;
        r
    }));
    // Bad fields with the held job's real id and token.
    let held_base = nack(held.clone());
    out.extend(rows(
        &held_base,
        bad(INVALID, "error"),
        &[
            ("error 64 KiB + 1", &|r| r.error = "e".repeat(64 * 1024 + 1)),
            ("error 1 MiB", &|r| r.error = "e".repeat(MIB)),
            ("error with NUL", &|r| r.error = "bad\0thing".into()),
            ("error with NUL, dead_letter", &|r| {
                r.error = "\0".into();
                r.dead_letter = true;
            }),
        ],
    ));
    let set_retry = |r: &mut pb::NackRequest, d| r.retry_after = d;
    let want = bad(INVALID, "retry_after");
    out.extend(each(
        "retry_after",
        &held_base,
        bad_durations(),
        set_retry,
        &want,
    ));
    // Boundary values pass validation: with an unknown id they reach the
    // fencing check (FAILED_PRECONDITION), not INVALID_ARGUMENT.
    let unknown_base = nack(Fixture::unknown());
    let stale = bad(STALE, "lease_token");
    out.extend(rows(
        &unknown_base,
        stale.clone(),
        &[
            ("error exactly 64 KiB (unknown id)", &|r| {
                r.error = "e".repeat(64 * 1024)
            }),
            ("error empty (unknown id)", &|r| r.error.clear()),
        ],
    ));
    out.extend(each(
        "retry_after (unknown id)",
        &unknown_base,
        ok_durations(),
        set_retry,
        &stale,
    ));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_bad_input_table() {
    check_table("Nack", nack_rows, |mut c, r| async move {
        c.nack(r).await.map(|_| ())
    })
    .await;
}

fn extend_rows(held: &Held) -> Vec<Row<pb::ExtendLeaseRequest>> {
    let extend = |(job_id, lease_token): Held| pb::ExtendLeaseRequest {
        job_id,
        lease_token,
        lease: pd(60, 0),
    };
    let mut out: Vec<Row<pb::ExtendLeaseRequest>> = id_token_rows(held)
        .into_iter()
        .map(|r| r.map(extend))
        .collect();
    let set_lease = |r: &mut pb::ExtendLeaseRequest, l| r.lease = l;
    let invalid = bad(INVALID, "lease");
    let stale = bad(STALE, "lease_token");
    // Validation comes before fencing: with an unknown id, a bad lease is
    // INVALID_ARGUMENT and a good one FAILED_PRECONDITION.
    let unknown_base = extend(Fixture::unknown());
    out.extend(each(
        "(unknown id) lease",
        &unknown_base,
        bad_leases(),
        set_lease,
        &invalid,
    ));
    out.extend(each(
        "(unknown id) lease",
        &unknown_base,
        ok_leases(),
        set_lease,
        &stale,
    ));
    // Only the long boundary: a fencing bug must not cut the held lease short.
    let mut wrong_token = extend((held.0.clone(), Fixture::unknown().1));
    wrong_token.lease = pd(TWELVE_HOURS_S, 0);
    out.push(row(
        "lease 12h, wrong token on the held job",
        wrong_token,
        stale,
    ));
    // Last, with the held job's id and token: if one of these is wrongly
    // accepted it changes the held job's lease.
    let held_base = extend(held.clone());
    out.push(row(
        "lease missing",
        pb::ExtendLeaseRequest {
            lease: None,
            ..held_base.clone()
        },
        invalid.clone(),
    ));
    out.extend(each("lease", &held_base, bad_leases(), set_lease, &invalid));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_lease_bad_input_table() {
    check_table("ExtendLease", extend_rows, |mut c, r| async move {
        c.extend_lease(r).await.map(|_| ())
    })
    .await;
}

/// ReportProgress (issue 34): every id and token rule, then the fraction's
/// and the message's, all aimed at the held job; each refused, nothing
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_progress_bad_input_table() {
    check_table(
        "ReportProgress",
        |held| {
            let req = |(job_id, lease_token): Held, fraction: f32, message: &str| {
                pb::ReportProgressRequest {
                    job_id,
                    lease_token,
                    fraction,
                    message: message.to_owned(),
                }
            };
            let mut rows: Vec<Row<pb::ReportProgressRequest>> = id_token_rows(held)
                .into_iter()
                .map(|r| r.map(|h| req(h, 0.5, "half")))
                .collect();
            let long = "m".repeat(257);
            for (name, fraction, message, text) in [
                ("fraction NaN", f32::NAN, "", "fraction: "),
                ("fraction below 0", -0.01, "", "fraction: "),
                ("fraction above 1", 1.01, "", "fraction: "),
                ("fraction infinite", f32::INFINITY, "", "fraction: "),
                ("message of 257 bytes", 0.5, long.as_str(), "message: "),
                ("message with NUL", 0.5, "a\0b", "message: "),
            ] {
                rows.push(row(
                    name,
                    req(held.clone(), fraction, message),
                    bad(INVALID, text),
                ));
            }
            rows
        },
        |mut c, r| async move { c.report_progress(r).await.map(|_| ()) },
    )
    .await;
}

/// WaitJob (issue 34): the id's rules and the timeout's; a wait on the
/// held job and one on an unknown id are accepted (the stream opens) and
/// change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_job_bad_input_table() {
    check_table(
        "WaitJob",
        |(h, _)| {
            let req = |job_id: &str, timeout: Option<PDuration>| pb::WaitJobRequest {
                job_id: job_id.to_owned(),
                timeout,
                changes: false,
            };
            let (u, _) = Fixture::unknown();
            vec![
                row("job_id empty", req("", None), bad(INVALID, "job_id")),
                row("job_id not a UUID", req("x", None), bad(INVALID, "job_id")),
                row(
                    "job_id with NUL",
                    req(&format!("{h}\0"), None),
                    bad(INVALID, "job_id"),
                ),
                row(
                    "timeout negative",
                    req(h, pd(-1, 0)),
                    bad(INVALID, "timeout: "),
                ),
                row(
                    "timeout nanos negative",
                    req(h, pd(0, -1)),
                    bad(INVALID, "timeout: "),
                ),
                row(
                    "timeout nanos 1e9",
                    req(h, pd(0, 1_000_000_000)),
                    bad(INVALID, "timeout: "),
                ),
                row(
                    "timeout over 1h",
                    req(h, pd(3601, 0)),
                    bad(INVALID, "timeout: "),
                ),
                row(
                    "timeout 1h + 1ns",
                    req(h, pd(3600, 1)),
                    bad(INVALID, "timeout: "),
                ),
                row("held job, 1 s", req(h, pd(1, 0)), Want::Ok(0)),
                row("held job, 1 h", req(h, pd(3600, 0)), Want::Ok(0)),
                row("held job, no timeout", req(h, None), Want::Ok(0)),
                row("unknown job", req(&u, None), Want::Ok(0)),
            ]
        },
        |mut c, r| async move { c.wait_job(r).await.map(|_| ()) },
    )
    .await;
}

/// One AdminService request: the admin table mixes every admin RPC.
enum AdminReq {
    GetQueue(pb::GetQueueRequest),
    ListQueues(pb::ListQueuesRequest),
    UpdateQueue(pb::UpdateQueueRequest),
    PauseQueue(pb::PauseQueueRequest),
    ResumeQueue(pb::ResumeQueueRequest),
    PurgeQueue(pb::PurgeQueueRequest),
    GetJob(pb::GetJobRequest),
    ListJobs(pb::ListJobsRequest),
    CancelJob(pb::CancelJobRequest),
    ListDeadLetters(pb::ListDeadLettersRequest),
    RequeueDeadLetters(pb::DeadLettersSelector),
    PurgeDeadLetters(pb::DeadLettersSelector),
    WatchQueues(pb::WatchQueuesRequest),
}

async fn send_admin(mut a: Admin, req: AdminReq) -> Result<(), Status> {
    match req {
        AdminReq::GetQueue(r) => a.get_queue(r).await.map(drop),
        AdminReq::ListQueues(r) => a.list_queues(r).await.map(drop),
        AdminReq::UpdateQueue(r) => a.update_queue(r).await.map(drop),
        AdminReq::PauseQueue(r) => a.pause_queue(r).await.map(drop),
        AdminReq::ResumeQueue(r) => a.resume_queue(r).await.map(drop),
        AdminReq::PurgeQueue(r) => a.purge_queue(r).await.map(drop),
        AdminReq::GetJob(r) => a.get_job(r).await.map(drop),
        AdminReq::ListJobs(r) => a.list_jobs(r).await.map(drop),
        AdminReq::CancelJob(r) => a.cancel_job(r).await.map(drop),
        AdminReq::ListDeadLetters(r) => a.list_dead_letters(r).await.map(drop),
        AdminReq::RequeueDeadLetters(r) => a.requeue_dead_letters(r).await.map(drop),
        AdminReq::PurgeDeadLetters(r) => a.purge_dead_letters(r).await.map(drop),
        AdminReq::WatchQueues(r) => a.watch_queues(r).await.map(drop),
    }
}

/// An UpdateQueue of queue "bi" with what `f` sets (no `create`).
fn upd(f: fn(&mut pb::UpdateQueueRequest)) -> pb::UpdateQueueRequest {
    let mut r = pb::UpdateQueueRequest {
        queue: "bi".into(),
        ..Default::default()
    };
    f(&mut r);
    r
}

/// AdminService cases: every one rejected, with the offending field named
/// first in the message. `live` is the id of a dead letter of queue "bi".
fn admin_rows(live: &str) -> Vec<Row<AdminReq>> {
    let live = live.to_owned();
    let unknown = Uuid::now_v7().to_string();
    let bad_q = "-bad".to_string();
    let long_q = "q".repeat(129);
    vec![
        row(
            "get_queue empty",
            AdminReq::GetQueue(pb::GetQueueRequest {
                queue: String::new(),
            }),
            starts(Code::InvalidArgument, "queue:"),
        ),
        row(
            "get_queue bad name",
            AdminReq::GetQueue(pb::GetQueueRequest {
                queue: bad_q.clone(),
            }),
            starts(Code::InvalidArgument, "queue:"),
        ),
        row(
            "get_queue long name",
            AdminReq::GetQueue(pb::GetQueueRequest {
                queue: long_q.clone(),
            }),
            starts(Code::InvalidArgument, "queue:"),
        ),
        row(
            "get_queue unknown",
            AdminReq::GetQueue(pb::GetQueueRequest {
                queue: "nope".into(),
            }),
            starts(Code::NotFound, "queue \"nope\""),
        ),
        row(
            "list_queues page_size",
            AdminReq::ListQueues(pb::ListQueuesRequest {
                page_size: 1001,
                page_token: String::new(),
            }),
            starts(Code::InvalidArgument, "page_size:"),
        ),
        row(
            "list_queues token",
            AdminReq::ListQueues(pb::ListQueuesRequest {
                page_size: 0,
                page_token: "zz".into(),
            }),
            starts(Code::InvalidArgument, "page_token:"),
        ),
        row(
            "update unknown",
            AdminReq::UpdateQueue(pb::UpdateQueueRequest {
                queue: "nope".into(),
                max_attempts: Some(3),
                ..Default::default()
            }),
            starts(Code::NotFound, "queue \"nope\""),
        ),
        row(
            "update bad name",
            AdminReq::UpdateQueue(pb::UpdateQueueRequest {
                queue: bad_q.clone(),
                create: true,
                ..Default::default()
            }),
            starts(Code::InvalidArgument, "queue:"),
        ),
        row(
            "update max_attempts 0",
            AdminReq::UpdateQueue(upd(|r| r.max_attempts = Some(0))),
            starts(Code::InvalidArgument, "max_attempts:"),
        ),
        row(
            "update max_attempts 1001",
            AdminReq::UpdateQueue(upd(|r| r.max_attempts = Some(1001))),
            starts(Code::InvalidArgument, "max_attempts:"),
        ),
        row(
            "update lease too short",
            AdminReq::UpdateQueue(upd(|r| {
                r.default_lease = Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 999_999_999,
                })
            })),
            starts(Code::InvalidArgument, "default_lease:"),
        ),
        row(
            "update lease too long",
            AdminReq::UpdateQueue(upd(|r| {
                r.default_lease = Some(prost_types::Duration {
                    seconds: 43201,
                    nanos: 0,
                })
            })),
            starts(Code::InvalidArgument, "default_lease:"),
        ),
        row(
            "update negative base",
            AdminReq::UpdateQueue(upd(|r| {
                r.backoff_base = Some(prost_types::Duration {
                    seconds: -1,
                    nanos: 0,
                })
            })),
            starts(Code::InvalidArgument, "backoff_base:"),
        ),
        row(
            "update bad nanos cap",
            AdminReq::UpdateQueue(upd(|r| {
                r.backoff_cap = Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 1_000_000_000,
                })
            })),
            starts(Code::InvalidArgument, "backoff_cap:"),
        ),
        row(
            "update base > cap",
            AdminReq::UpdateQueue(upd(|r| {
                r.backoff_base = Some(prost_types::Duration {
                    seconds: 10,
                    nanos: 0,
                });
                r.backoff_cap = Some(prost_types::Duration {
                    seconds: 5,
                    nanos: 0,
                });
            })),
            starts(Code::InvalidArgument, "backoff_base:"),
        ),
        row(
            "update retention too long",
            AdminReq::UpdateQueue(upd(|r| {
                r.completed_retention = Some(prost_types::Duration {
                    seconds: 400 * 86400 * 365,
                    nanos: 0,
                })
            })),
            starts(Code::InvalidArgument, "completed_retention:"),
        ),
        row(
            "update concurrency limit negative",
            AdminReq::UpdateQueue(upd(|r| r.concurrency_limit = Some(-1))),
            starts(Code::InvalidArgument, "concurrency_limit:"),
        ),
        row(
            "update concurrency limit too big",
            AdminReq::UpdateQueue(upd(|r| r.concurrency_limit = Some(1_000_001))),
            starts(Code::InvalidArgument, "concurrency_limit:"),
        ),
        row(
            "update rate limit negative",
            AdminReq::UpdateQueue(upd(|r| r.rate_limit = Some(-5.0))),
            starts(Code::InvalidArgument, "rate_limit:"),
        ),
        row(
            "update rate limit NaN",
            AdminReq::UpdateQueue(upd(|r| r.rate_limit = Some(f64::NAN))),
            starts(Code::InvalidArgument, "rate_limit:"),
        ),
        row(
            "update rate limit infinite",
            AdminReq::UpdateQueue(upd(|r| r.rate_limit = Some(f64::INFINITY))),
            starts(Code::InvalidArgument, "rate_limit:"),
        ),
        row(
            "update rate limit too slow",
            AdminReq::UpdateQueue(upd(|r| r.rate_limit = Some(0.0001))),
            starts(Code::InvalidArgument, "rate_limit:"),
        ),
        row(
            "update rate burst negative",
            AdminReq::UpdateQueue(upd(|r| r.rate_burst = Some(-1))),
            starts(Code::InvalidArgument, "rate_burst:"),
        ),
        row(
            "pause unknown",
            AdminReq::PauseQueue(pb::PauseQueueRequest {
                queue: "nope".into(),
            }),
            starts(Code::NotFound, "queue \"nope\""),
        ),
        row(
            "pause empty",
            AdminReq::PauseQueue(pb::PauseQueueRequest {
                queue: String::new(),
            }),
            starts(Code::InvalidArgument, "queue:"),
        ),
        row(
            "resume unknown",
            AdminReq::ResumeQueue(pb::ResumeQueueRequest {
                queue: "nope".into(),
            }),
            starts(Code::NotFound, "queue \"nope\""),
        ),
        row(
            "resume bad",
            AdminReq::ResumeQueue(pb::ResumeQueueRequest {
                queue: bad_q.clone(),
            }),
            starts(Code::InvalidArgument, "queue:"),
        ),
        row(
            "purge unknown",
            AdminReq::PurgeQueue(pb::PurgeQueueRequest {
                queue: "nope".into(),
            }),
            starts(Code::NotFound, "queue \"nope\""),
        ),
        row(
            "purge empty",
            AdminReq::PurgeQueue(pb::PurgeQueueRequest {
                queue: String::new(),
            }),
            starts(Code::InvalidArgument, "queue:"),
        ),
        row(
            "get_job empty",
            AdminReq::GetJob(pb::GetJobRequest {
                job_id: String::new(),
            }),
            starts(Code::InvalidArgument, "job_id:"),
        ),
        row(
            "get_job not a uuid",
            AdminReq::GetJob(pb::GetJobRequest {
                job_id: "123".into(),
            }),
            starts(Code::InvalidArgument, "job_id:"),
        ),
        row(
            "get_job unknown",
            AdminReq::GetJob(pb::GetJobRequest {
                job_id: unknown.clone(),
            }),
            starts(Code::NotFound, "job "),
        ),
        row(
            "list_jobs bad queue",
            AdminReq::ListJobs(pb::ListJobsRequest {
                queue: bad_q.clone(),
                ..Default::default()
            }),
            starts(Code::InvalidArgument, "queue:"),
        ),
        row(
            "list_jobs unknown queue",
            AdminReq::ListJobs(pb::ListJobsRequest {
                queue: "nope".into(),
                ..Default::default()
            }),
            starts(Code::NotFound, "queue \"nope\""),
        ),
        row(
            "list_jobs state",
            AdminReq::ListJobs(pb::ListJobsRequest {
                state: 99,
                ..Default::default()
            }),
            starts(Code::InvalidArgument, "state:"),
        ),
        row(
            "list_jobs page_size",
            AdminReq::ListJobs(pb::ListJobsRequest {
                page_size: 5000,
                ..Default::default()
            }),
            starts(Code::InvalidArgument, "page_size:"),
        ),
        row(
            "list_jobs token",
            AdminReq::ListJobs(pb::ListJobsRequest {
                page_token: "6a3a6e6f74".into(),
                ..Default::default()
            }),
            starts(Code::InvalidArgument, "page_token:"),
        ),
        row(
            "list_dead token kind",
            AdminReq::ListDeadLetters(pb::ListDeadLettersRequest {
                page_token: "713a6262".into(),
                ..Default::default()
            }),
            starts(Code::InvalidArgument, "page_token:"),
        ),
        row(
            "cancel empty",
            AdminReq::CancelJob(pb::CancelJobRequest {
                job_id: String::new(),
            }),
            starts(Code::InvalidArgument, "job_id:"),
        ),
        row(
            "cancel unknown",
            AdminReq::CancelJob(pb::CancelJobRequest {
                job_id: unknown.clone(),
            }),
            starts(Code::NotFound, "job "),
        ),
        row(
            "requeue nothing",
            AdminReq::RequeueDeadLetters(pb::DeadLettersSelector {
                queue: "bi".into(),
                ..Default::default()
            }),
            starts(Code::InvalidArgument, "ids, all:"),
        ),
        row(
            "requeue both",
            AdminReq::RequeueDeadLetters(pb::DeadLettersSelector {
                ids: vec![live.clone()],
                all: true,
                queue: "bi".into(),
            }),
            starts(Code::InvalidArgument, "ids, all:"),
        ),
        row(
            "requeue all no queue",
            AdminReq::RequeueDeadLetters(pb::DeadLettersSelector {
                all: true,
                ..Default::default()
            }),
            starts(Code::InvalidArgument, "queue:"),
        ),
        row(
            "requeue bad id",
            AdminReq::RequeueDeadLetters(pb::DeadLettersSelector {
                ids: vec![live.clone(), "x".into()],
                ..Default::default()
            }),
            starts(Code::InvalidArgument, "ids[1]:"),
        ),
        row(
            "requeue too many",
            AdminReq::RequeueDeadLetters(pb::DeadLettersSelector {
                ids: vec![live.clone(); 1001],
                ..Default::default()
            }),
            starts(Code::InvalidArgument, "ids:"),
        ),
        row(
            "requeue unknown queue",
            AdminReq::RequeueDeadLetters(pb::DeadLettersSelector {
                queue: "nope".into(),
                all: true,
                ..Default::default()
            }),
            starts(Code::NotFound, "queue \"nope\""),
        ),
        row(
            "purge dead nothing",
            AdminReq::PurgeDeadLetters(pb::DeadLettersSelector::default()),
            starts(Code::InvalidArgument, "ids, all:"),
        ),
        row(
            "purge dead all no queue",
            AdminReq::PurgeDeadLetters(pb::DeadLettersSelector {
                all: true,
                ..Default::default()
            }),
            starts(Code::InvalidArgument, "queue:"),
        ),
        row(
            "purge dead bad queue",
            AdminReq::PurgeDeadLetters(pb::DeadLettersSelector {
                all: true,
                queue: bad_q.clone(),
                ..Default::default()
            }),
            starts(Code::InvalidArgument, "queue:"),
        ),
        row(
            "watch bad queue",
            AdminReq::WatchQueues(pb::WatchQueuesRequest {
                queues: vec!["bi".into(), bad_q.clone()],
                interval: None,
            }),
            starts(Code::InvalidArgument, "queues[1]:"),
        ),
        row(
            "watch unknown queue",
            AdminReq::WatchQueues(pb::WatchQueuesRequest {
                queues: vec!["nope".into()],
                interval: None,
            }),
            starts(Code::NotFound, "queue \"nope\""),
        ),
        row(
            "watch interval short",
            AdminReq::WatchQueues(pb::WatchQueuesRequest {
                queues: vec![],
                interval: pd(0, 999_000_000),
            }),
            starts(Code::InvalidArgument, "interval:"),
        ),
        row(
            "watch interval long",
            AdminReq::WatchQueues(pb::WatchQueuesRequest {
                queues: vec![],
                interval: pd(3601, 0),
            }),
            starts(Code::InvalidArgument, "interval:"),
        ),
        row(
            "watch too many",
            AdminReq::WatchQueues(pb::WatchQueuesRequest {
                queues: vec!["bi".into(); 65],
                interval: None,
            }),
            starts(Code::InvalidArgument, "queues:"),
        ),
    ]
}

/// The AdminService's bad input, on the same fixture as the queue RPCs: each
/// row must get its code with the field named first, and change nothing in
/// the database (compared after every row), nor the held job. Queue "bi"
/// holds a dead letter and a job due in an hour, for the rows that aim at
/// existing things.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_bad_input_table() {
    let mut fx = Fixture::new().await;
    let mut c = fx.client.clone();
    // The waiting job is due in an hour: no stream can lease it while the
    // table runs (a stream of "bi" closing just before could otherwise
    // lease it and release it again, mid-table).
    c.enqueue(pb::EnqueueRequest {
        delay: Some(dur(Duration::from_secs(3600))),
        ..job("bi", "y")
    })
    .await
    .expect("enqueue y");
    let mut s = subscribe(&mut c, &["bi"], 1, None).await;
    let dead = enqueue(&mut c, "bi", "x").await;
    let d = next_delivery(&mut s, Duration::from_secs(5)).await;
    assert_eq!(id_of(&d), dead);
    nack_dead(&mut c, &d, "x").await;
    drop(s);
    fx.rebase().await;
    let a = admin(&fx.broker).await;
    assert_eq!(
        (fx.live, fx.dead),
        (2, 1),
        "held job + bi's waiting job; bi's dead letter"
    );
    fx.run("AdminService", admin_rows(&dead), |_, r| {
        send_admin(a.clone(), r)
    })
    .await;
    fx.finish().await;
}

// ---- Consume ----------------------------------------------------------------

/// Consume's first message: Subscribe's rows as its `subscribe` field (the
/// field names gain the `subscribe.` prefix), and the rows only Consume
/// has. Each row is the request stream's messages (none: the client
/// half-closes at once). A rejected opening must fail the call itself, and
/// settles it carries must not be applied; an accepted one opens a stream
/// that ends OK when the client half-closes.
fn consume_opening_rows((h, t): &Held) -> Vec<Row<Vec<pb::ConsumeRequest>>> {
    let open = |s: pb::SubscribeRequest| pb::ConsumeRequest {
        subscribe: Some(s),
        ..Default::default()
    };
    let held_ack = pb::AckRequest {
        job_id: h.clone(),
        lease_token: t.clone(),
        enqueue: Vec::new(),
        result: Vec::new(),
    };
    let mut out: Vec<Row<Vec<pb::ConsumeRequest>>> = subscribe_rows()
        .into_iter()
        .map(|r| {
            let want = match r.want {
                Want::Err(code, text) => Want::Err(code, format!("subscribe.{text}")),
                other => other,
            };
            row(r.name, vec![open(r.req)], want)
        })
        .collect();
    let invalid = |text: &str| starts(INVALID, text);
    out.push(row("no message at all", vec![], invalid("subscribe")));
    out.push(row(
        "an empty first message",
        vec![pb::ConsumeRequest::default()],
        invalid("subscribe"),
    ));
    out.push(row(
        "first message: the held job's ack, no subscribe",
        vec![pb::ConsumeRequest {
            acks: vec![held_ack.clone()],
            ..Default::default()
        }],
        invalid("subscribe"),
    ));
    out.push(row(
        "first message: the held job's dead-letter nack, no subscribe",
        vec![pb::ConsumeRequest {
            nacks: vec![pb::NackRequest {
                job_id: h.clone(),
                lease_token: t.clone(),
                error: "boom".into(),
                retry_after: None,
                dead_letter: true,
            }],
            confirm_settles: true,
            ..Default::default()
        }],
        invalid("subscribe"),
    ));
    out.push(row(
        "first message: a bad subscribe and the held job's ack",
        vec![pb::ConsumeRequest {
            acks: vec![held_ack],
            ..open(sub(&[".bad"]))
        }],
        invalid("subscribe.queues[0]"),
    ));
    out
}

/// Opens a Consume stream with `msgs` (the request side stays open until
/// the opening was answered): Ok when it opened (first message a
/// heartbeat) and then ended OK on a half-close; the call's status when
/// refused; UNKNOWN when it opened and then failed, so that the row's code
/// check catches a bad opening the broker let through.
async fn consume_opening(mut c: Client, msgs: Vec<pb::ConsumeRequest>) -> Result<(), Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let keep = if msgs.is_empty() {
        None
    } else {
        Some(tx.clone())
    };
    for m in msgs {
        tx.send(m).await.expect("receiver alive");
    }
    drop(tx);
    let mut s = consume::Consumer::start_with(&mut c, keep, rx).await?;
    s.opened(Duration::from_secs(5))
        .await
        .map_err(|e| Status::unknown(format!("stream opened, then: {e:?}")))?;
    s.half_close();
    let end = s.end(Duration::from_secs(5)).await;
    match end.status {
        Ok(()) if end.deliveries.is_empty() => Ok(()),
        other => Err(Status::unknown(format!(
            "after the half-close: {other:?}, {} deliveries",
            end.deliveries.len()
        ))),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_opening_bad_input_table() {
    check_table("Consume (opening)", consume_opening_rows, consume_opening).await;
}

/// Later messages of a Consume stream: every Ack, Nack and ExtendLease row
/// (the unary tables' rows) as one entry of a message, and rows of several
/// entries where only the last is bad. Each must get a settle result with
/// the unary call's code and a message naming the field with the entry's
/// place (`acks[0].job_id`, `nacks[2].retry_after`), change nothing, and
/// leave the stream open for the next row.
fn consume_settle_rows(held: &Held) -> Vec<Row<pb::ConsumeRequest>> {
    // Invalid fields are named with the entry's place; other texts (the
    // stale token's) are as the unary call's.
    fn placed(want: Want, place: &str) -> Want {
        match want {
            Want::Err(INVALID, text) => Want::Err(INVALID, format!("{place}.{text}")),
            other => other,
        }
    }
    let ack = |(job_id, lease_token): Held| pb::AckRequest {
        job_id,
        lease_token,
        ..Default::default()
    };
    let mut out: Vec<Row<pb::ConsumeRequest>> = Vec::new();
    for r in result_rows(held, "acks[0].result") {
        out.push(row(
            format!("acks[0] {}", r.name),
            pb::ConsumeRequest {
                acks: vec![r.req],
                ..Default::default()
            },
            r.want,
        ));
    }
    for r in follow_up_rows(held, "acks[0].enqueue") {
        out.push(row(
            format!("acks[0] {}", r.name),
            pb::ConsumeRequest {
                acks: vec![r.req],
                ..Default::default()
            },
            r.want,
        ));
    }
    for r in id_token_rows(held) {
        let want = placed(r.want, "acks[0]");
        out.push(row(
            format!("acks[0] {}", r.name),
            pb::ConsumeRequest {
                acks: vec![ack(r.req)],
                ..Default::default()
            },
            want,
        ));
    }
    // Progress reports (`progress`, issue 34): every id and token rule,
    // then the fraction's and the message's, all aimed at the held job.
    let progress = |(job_id, lease_token): Held, fraction: f32, message: &str| pb::Progress {
        job_id,
        lease_token,
        fraction,
        message: message.to_owned(),
    };
    for r in id_token_rows(held) {
        let want = placed(r.want, "progress[0]");
        out.push(row(
            format!("progress[0] {}", r.name),
            pb::ConsumeRequest {
                progress: vec![progress(r.req, 0.5, "half")],
                ..Default::default()
            },
            want,
        ));
    }
    let long = "m".repeat(257);
    let bad_progress: [(&str, f32, &str, &str); 7] = [
        ("fraction NaN", f32::NAN, "", "progress[0].fraction"),
        ("fraction below 0", -0.01, "", "progress[0].fraction"),
        ("fraction above 1", 1.01, "", "progress[0].fraction"),
        (
            "fraction infinite",
            f32::INFINITY,
            "",
            "progress[0].fraction",
        ),
        (
            "fraction -infinite",
            f32::NEG_INFINITY,
            "",
            "progress[0].fraction",
        ),
        ("message of 257 bytes", 0.5, &long, "progress[0].message"),
        ("message with NUL", 0.5, "a\0b", "progress[0].message"),
    ];
    for (name, fraction, message, text) in bad_progress {
        out.push(row(
            format!("progress[0] {name}"),
            pb::ConsumeRequest {
                progress: vec![progress(held.clone(), fraction, message)],
                ..Default::default()
            },
            bad(INVALID, text),
        ));
    }
    for r in nack_rows(held) {
        let want = placed(r.want, "nacks[0]");
        out.push(row(
            format!("nacks[0] {}", r.name),
            pb::ConsumeRequest {
                nacks: vec![r.req],
                ..Default::default()
            },
            want,
        ));
    }
    for r in extend_rows(held) {
        let want = placed(r.want, "extends[0]");
        out.push(row(
            format!("extends[0] {}", r.name),
            pb::ConsumeRequest {
                extends: vec![r.req],
                ..Default::default()
            },
            want,
        ));
    }
    // The place of a bad entry among good ones (unknown ids: stale).
    let unknown_ack = || ack(Fixture::unknown());
    let unknown_nack = || pb::NackRequest {
        job_id: Fixture::unknown().0,
        lease_token: Fixture::unknown().1,
        error: "boom".into(),
        retry_after: None,
        dead_letter: true,
    };
    let unknown_extend = || pb::ExtendLeaseRequest {
        job_id: Fixture::unknown().0,
        lease_token: Fixture::unknown().1,
        lease: pd(60, 0),
    };
    out.push(row(
        "acks[1] job_id not a UUID",
        pb::ConsumeRequest {
            acks: vec![
                unknown_ack(),
                pb::AckRequest {
                    job_id: "nope".into(),
                    lease_token: held.1.clone(),
                    enqueue: Vec::new(),
                    result: Vec::new(),
                },
            ],
            ..Default::default()
        },
        bad(INVALID, "acks[1].job_id"),
    ));
    out.push(row(
        "nacks[2] retry_after negative, held job",
        pb::ConsumeRequest {
            nacks: vec![
                unknown_nack(),
                unknown_nack(),
                pb::NackRequest {
                    job_id: held.0.clone(),
                    lease_token: held.1.clone(),
                    error: "boom".into(),
                    retry_after: pd(-1, 0),
                    dead_letter: false,
                },
            ],
            ..Default::default()
        },
        bad(INVALID, "nacks[2].retry_after"),
    ));
    out.push(row(
        "extends[1] lease zero, held job",
        pb::ConsumeRequest {
            extends: vec![
                unknown_extend(),
                pb::ExtendLeaseRequest {
                    job_id: held.0.clone(),
                    lease_token: held.1.clone(),
                    lease: pd(0, 0),
                },
            ],
            ..Default::default()
        },
        bad(INVALID, "extends[1].lease"),
    ));
    // A bad entry of each kind in one message, after good-looking ones.
    out.push(row(
        "acks, nacks and extends in one message, a bad extends[0]",
        pb::ConsumeRequest {
            acks: vec![unknown_ack()],
            nacks: vec![unknown_nack()],
            extends: vec![pb::ExtendLeaseRequest {
                lease: None,
                ..unknown_extend()
            }],
            ..Default::default()
        },
        bad(INVALID, "extends[0].lease"),
    ));
    // More entries than a batch may hold: every one refused, nothing done.
    let many = |n: usize| (0..n).map(|_| unknown_ack()).collect::<Vec<_>>();
    out.push(row(
        "1001 acks",
        pb::ConsumeRequest {
            acks: many(1001),
            ..Default::default()
        },
        bad(TOO_BIG, "acks"),
    ));
    // Dead-letter nacks, the held job's last: were the limit not
    // enforced, the held job would be buried.
    out.push(row(
        "1001 nacks, the held job's last",
        pb::ConsumeRequest {
            nacks: (0..1000)
                .map(|_| unknown_nack())
                .chain([pb::NackRequest {
                    job_id: held.0.clone(),
                    lease_token: held.1.clone(),
                    ..unknown_nack()
                }])
                .collect(),
            ..Default::default()
        },
        bad(TOO_BIG, "nacks"),
    ));
    out.push(row(
        "1001 extends",
        pb::ConsumeRequest {
            extends: (0..1001).map(|_| unknown_extend()).collect(),
            ..Default::default()
        },
        bad(TOO_BIG, "extends"),
    ));
    // Exactly the limit: each entry reaches the fencing check.
    out.push(row(
        "1000 acks (unknown ids)",
        pb::ConsumeRequest {
            acks: many(1000),
            ..Default::default()
        },
        bad(STALE, "lease_token"),
    ));
    out
}

/// Sends one message on the open stream and waits for the result of every
/// entry in it (the stream confirms settles, so accepted ones are answered
/// too). Returns the status of the message's last entry (acks, then nacks,
/// then extends), as the unary call would have returned it; UNKNOWN when
/// the results do not answer the entries sent, one for one.
async fn consume_settle(
    stream: &tokio::sync::Mutex<consume::Consumer>,
    req: pb::ConsumeRequest,
) -> Result<(), Status> {
    let mut sent: Vec<(i32, String)> = Vec::new();
    sent.extend(
        req.acks
            .iter()
            .map(|a| (pb::SettleOp::Ack as i32, a.job_id.clone())),
    );
    sent.extend(
        req.nacks
            .iter()
            .map(|n| (pb::SettleOp::Nack as i32, n.job_id.clone())),
    );
    sent.extend(
        req.extends
            .iter()
            .map(|x| (pb::SettleOp::Extend as i32, x.job_id.clone())),
    );
    sent.extend(
        req.progress
            .iter()
            .map(|p| (pb::SettleOp::Progress as i32, p.job_id.clone())),
    );
    let mut s = stream.lock().await;
    assert!(s.send(req).await, "the stream's request side is open");
    let results = s.results(sent.len(), Duration::from_secs(10)).await;
    let mut got: Vec<(i32, String)> = results.iter().map(|r| (r.op, r.job_id.clone())).collect();
    let mut want = sent.clone();
    got.sort();
    want.sort();
    if got != want {
        return Err(Status::unknown(format!(
            "results do not answer the entries one for one: {} sent, got {results:?}",
            sent.len()
        )));
    }
    let (op, id) = sent.last().expect("a row sends at least one entry");
    let last = results
        .iter()
        .rev()
        .find(|r| r.op == *op && &r.job_id == id)
        .expect("answered");
    consume::status_of(last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_settle_bad_input_table() {
    let mut fx = Fixture::new().await;
    let held = (fx.held_id.clone(), fx.held_token.clone());
    // One stream for every row: a bad entry must not end it. It serves the
    // held job's queue, where nothing else waits.
    let stream = std::sync::Arc::new(tokio::sync::Mutex::new(
        consume::Consumer::open(&mut fx.client.clone(), &["held"], 1, None, true).await,
    ));
    fx.rebase().await;
    let rows = consume_settle_rows(&held);
    fx.run("Consume (settles)", rows, |_, r| {
        let stream = stream.clone();
        async move { consume_settle(&stream, r).await }
    })
    .await;
    // Still open after every row: nothing was delivered on it, and a
    // half-close ends it OK.
    let mut s = stream.lock().await;
    s.half_close();
    let end = s.end(Duration::from_secs(5)).await;
    assert!(end.status.is_ok(), "{end:?}");
    assert!(
        end.deliveries.is_empty() && end.results.is_empty(),
        "{end:?}"
    );
    drop(s);
    fx.finish().await;
}

/// Requests a Consume stream cannot go on after: a second `subscribe`, a
/// credit out of range (in the first message or a later one). Each row runs
/// on a stream of its own (opened on the held job's queue): the stream
/// must end with the code, naming the field, without applying the settles
/// of that message; accepted credits keep it open until the half-close.
fn consume_stream_rows((h, t): &Held) -> Vec<Row<(pb::ConsumeRequest, pb::ConsumeRequest)>> {
    let first = || pb::ConsumeRequest {
        subscribe: Some(sub(&["held"])),
        confirm_settles: true,
        ..Default::default()
    };
    let held_ack = pb::AckRequest {
        job_id: h.clone(),
        lease_token: t.clone(),
        enqueue: Vec::new(),
        result: Vec::new(),
    };
    let held_dead = pb::NackRequest {
        job_id: h.clone(),
        lease_token: t.clone(),
        error: "boom".into(),
        retry_after: None,
        dead_letter: true,
    };
    let later = |f: &dyn Fn(&mut pb::ConsumeRequest)| {
        let mut r = pb::ConsumeRequest::default();
        f(&mut r);
        (first(), r)
    };
    let invalid = |text: &str| starts(INVALID, text);
    vec![
        row(
            "a second subscribe",
            later(&|r| r.subscribe = Some(sub(&["held"]))),
            invalid("subscribe"),
        ),
        row(
            "a second subscribe with the held job's ack",
            later(&|r| {
                r.subscribe = Some(sub(&["other"]));
                r.acks = vec![held_ack.clone()];
            }),
            invalid("subscribe"),
        ),
        row(
            "a second, malformed subscribe",
            later(&|r| r.subscribe = Some(sub(&[]))),
            invalid("subscribe"),
        ),
        row(
            "max_in_flight 10001",
            later(&|r| r.max_in_flight = 10_001),
            invalid("max_in_flight"),
        ),
        row(
            "max_in_flight u32::MAX",
            later(&|r| r.max_in_flight = u32::MAX),
            invalid("max_in_flight"),
        ),
        row(
            "max_in_flight 10001 with the held job's ack",
            later(&|r| {
                r.max_in_flight = 10_001;
                r.acks = vec![held_ack.clone()];
            }),
            invalid("max_in_flight"),
        ),
        row(
            "max_in_flight 10001 with the held job's dead-letter nack",
            later(&|r| {
                r.max_in_flight = 10_001;
                r.nacks = vec![held_dead.clone()];
            }),
            invalid("max_in_flight"),
        ),
        row(
            "first message: max_in_flight 10001 with the held job's ack",
            (
                pb::ConsumeRequest {
                    max_in_flight: 10_001,
                    acks: vec![held_ack.clone()],
                    ..first()
                },
                pb::ConsumeRequest::default(),
            ),
            invalid("max_in_flight"),
        ),
        // Past --max-message-bytes (4 MiB): the stream ends naming the
        // limit, and the held job's dead-letter nack inside is not applied.
        row(
            "a message past 4 MiB (the held job's nack with a 4 MiB error)",
            later(&|r| {
                r.nacks = vec![pb::NackRequest {
                    error: "e".repeat(4 * MIB),
                    ..held_dead.clone()
                }]
            }),
            starts(TOO_BIG, "max-message-bytes:"),
        ),
        // Accepted: the stream goes on (and ends OK at the half-close).
        row(
            "max_in_flight 10000",
            later(&|r| r.max_in_flight = 10_000),
            Want::Ok(0),
        ),
        row(
            "max_in_flight 1",
            later(&|r| r.max_in_flight = 1),
            Want::Ok(0),
        ),
        row(
            "max_in_flight 0 (unchanged)",
            later(&|r| r.max_in_flight = 0),
            Want::Ok(0),
        ),
        row(
            "an empty message",
            (first(), pb::ConsumeRequest::default()),
            Want::Ok(0),
        ),
    ]
}

/// Opens a stream with the row's first message, sends its second, then
/// half-closes: the stream's final status (Ok when it ended OK), UNKNOWN if
/// it carried a delivery or a settle result.
async fn consume_stream(
    mut c: Client,
    (first, then): (pb::ConsumeRequest, pb::ConsumeRequest),
) -> Result<(), Status> {
    let mut s = consume::Consumer::start(&mut c, first).await?;
    s.opened(Duration::from_secs(5)).await?;
    s.send(then).await;
    s.half_close();
    let end = s.end(Duration::from_secs(5)).await;
    if !end.deliveries.is_empty() || !end.results.is_empty() {
        return Err(Status::unknown(format!("the stream carried: {end:?}")));
    }
    end.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_stream_errors_table() {
    check_table("Consume (stream)", consume_stream_rows, consume_stream).await;
}
