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
//! normal enqueue + delivery still works.

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use common::*;
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
    leaseq::domain::MAX_DELAY.as_secs() as i64
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
}

fn bad(code: Code, text: impl Into<String>) -> Want {
    Want::Err(code, text.into())
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

/// Everything a request could have changed, as one comparable string.
async fn fingerprint(db: &TestDb) -> String {
    sqlx::query_scalar::<_, String>(
        r#"select concat_ws(E'\n--\n',
            (select coalesce(string_agg(concat_ws('|', name, default_lease_ms, max_attempts, paused), ',' order by name), '')
               from leaseq.queues),
            (select coalesce(string_agg(concat_ws('|', id, queue, state, priority, run_at, attempt,
                        coalesce(max_attempts::text, '-'), coalesce(dedup_key, '-'),
                        coalesce(expires_at::text, '-'), coalesce(last_error, '-'),
                        coalesce(lease_token::text, '-'), coalesce(lease_expires_at::text, '-'),
                        coalesce(leased_by, '-'), md5(payload), headers::text), ',' order by id), '')
               from leaseq.jobs),
            (select coalesce(string_agg(concat_ws('|', id, reason, attempt, coalesce(last_error, '-')), ',' order by id), '')
               from leaseq.dead_jobs))"#,
    )
    .fetch_one(&db.pool)
    .await
    .expect("fingerprint")
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
        enqueue(&mut client, "held", "held-payload").await;
        // A long lease: the job stays leased for the whole table.
        let mut stream = subscribe(&mut client, &["held"], 1, Some(Duration::from_secs(600))).await;
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
        let state = fingerprint(&db).await;
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
            let state = fingerprint(&self.db).await;
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
                (Want::Err(code, text), res) => {
                    match res {
                        Ok(()) => self
                            .failures
                            .push(format!("{label}: accepted, want {code:?} naming {text:?}")),
                        Err(s) if s.code() != *code || !s.message().contains(text.as_str()) => {
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

fn headers(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn many_headers(n: usize) -> HashMap<String, String> {
    (0..n).map(|i| (format!("h{i}"), "v".to_owned())).collect()
}

/// Enqueue cases: `queue` is where bad rows aim, accepted rows go to
/// `ok_queue` (distinct dedup keys so each creates a job).
fn enqueue_rows(queue: &str, ok_queue: &str) -> Vec<Row<pb::EnqueueRequest>> {
    let base = |q: &str| job(q, "x");
    let bad_req = |f: &dyn Fn(&mut pb::EnqueueRequest)| {
        let mut r = base(queue);
        f(&mut r);
        r
    };
    let ok_req = |f: &dyn Fn(&mut pb::EnqueueRequest)| {
        let mut r = base(ok_queue);
        f(&mut r);
        r
    };
    let q = |s: &str| s.to_owned();
    let mut rows = vec![
        // queue
        row(
            "queue empty",
            bad_req(&|r| r.queue.clear()),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue 129 chars",
            bad_req(&|r| r.queue = "q".repeat(129)),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue 'a b'",
            bad_req(&|r| r.queue = q("a b")),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue 'é'",
            bad_req(&|r| r.queue = q("é")),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue 'aé'",
            bad_req(&|r| r.queue = q("aé")),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue 'a/b'",
            bad_req(&|r| r.queue = q("a/b")),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue '.a'",
            bad_req(&|r| r.queue = q(".a")),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue '-a'",
            bad_req(&|r| r.queue = q("-a")),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue '_a'",
            bad_req(&|r| r.queue = q("_a")),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue ':a'",
            bad_req(&|r| r.queue = q(":a")),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue with NUL",
            bad_req(&|r| r.queue = q("a\0b")),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue with newline",
            bad_req(&|r| r.queue = q("a\n")),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue 'a*'",
            bad_req(&|r| r.queue = q("a*")),
            bad(INVALID, "queue:"),
        ),
        row(
            "queue 128 chars + 'é'",
            bad_req(&|r| r.queue = format!("{}é", "q".repeat(126))),
            bad(INVALID, "queue:"),
        ),
        // payload
        row(
            "payload 1 MiB + 1",
            bad_req(&|r| r.payload = vec![7; MIB + 1]),
            bad(TOO_BIG, "payload"),
        ),
        row(
            "payload 2 MiB",
            bad_req(&|r| r.payload = vec![7; 2 * MIB]),
            bad(TOO_BIG, "payload"),
        ),
        // headers
        row(
            "header empty key",
            bad_req(&|r| r.headers = headers(&[("", "v")])),
            bad(INVALID, "headers"),
        ),
        row(
            "header NUL in key",
            bad_req(&|r| r.headers = headers(&[("a\0b", "v")])),
            bad(INVALID, "headers["),
        ),
        row(
            "header NUL in value",
            bad_req(&|r| r.headers = headers(&[("k", "a\0b")])),
            bad(INVALID, "headers[\"k\"]"),
        ),
        row(
            "65 headers",
            bad_req(&|r| r.headers = many_headers(65)),
            bad(INVALID, "headers"),
        ),
        row(
            "header value 16 KiB + 1",
            bad_req(&|r| r.headers = headers(&[("k", &"v".repeat(16 * 1024 + 1))])),
            bad(INVALID, "headers[\"k\"]"),
        ),
        row(
            "header key 257 bytes",
            bad_req(&|r| r.headers = headers(&[(&"k".repeat(257), "v")])),
            bad(INVALID, format!("headers[\"{}\"] key", "k".repeat(257))),
        ),
        // delay
        row(
            "delay -1s",
            bad_req(&|r| r.delay = pd(-1, 0)),
            bad(INVALID, "delay:"),
        ),
        row(
            "delay -1ns",
            bad_req(&|r| r.delay = pd(0, -1)),
            bad(INVALID, "delay:"),
        ),
        row(
            "delay 1s -1ns (mixed signs)",
            bad_req(&|r| r.delay = pd(1, -1)),
            bad(INVALID, "delay:"),
        ),
        row(
            "delay nanos 1e9",
            bad_req(&|r| r.delay = pd(0, 1_000_000_000)),
            bad(INVALID, "delay:"),
        ),
        row(
            "delay nanos i32::MAX",
            bad_req(&|r| r.delay = pd(0, i32::MAX)),
            bad(INVALID, "delay:"),
        ),
        row(
            "delay 11 years",
            bad_req(&|r| r.delay = pd(ELEVEN_YEARS_S, 0)),
            bad(INVALID, "delay:"),
        ),
        row(
            "delay limit + 1ns",
            bad_req(&|r| r.delay = pd(max_delay_s(), 1)),
            bad(INVALID, "delay:"),
        ),
        row(
            "delay i64::MAX s",
            bad_req(&|r| r.delay = pd(i64::MAX, 0)),
            bad(INVALID, "delay:"),
        ),
        row(
            "delay i64::MIN s",
            bad_req(&|r| r.delay = pd(i64::MIN, 0)),
            bad(INVALID, "delay:"),
        ),
        // delay and run_at
        row(
            "delay and run_at",
            bad_req(&|r| {
                r.delay = pd(1, 0);
                r.run_at = ts(0, 0);
            }),
            bad(INVALID, "delay, run_at"),
        ),
        row(
            "zero delay and run_at",
            bad_req(&|r| {
                r.delay = pd(0, 0);
                r.run_at = ts(YEAR_9999_END, 0);
            }),
            bad(INVALID, "delay, run_at"),
        ),
        // run_at
        row(
            "run_at nanos -1",
            bad_req(&|r| r.run_at = ts(1_700_000_000, -1)),
            bad(INVALID, "run_at"),
        ),
        row(
            "run_at nanos 1e9",
            bad_req(&|r| r.run_at = ts(1_700_000_000, 1_000_000_000)),
            bad(INVALID, "run_at"),
        ),
        row(
            "run_at year 10000",
            bad_req(&|r| r.run_at = ts(YEAR_9999_END + 1, 0)),
            bad(INVALID, "run_at"),
        ),
        row(
            "run_at i64::MAX",
            bad_req(&|r| r.run_at = ts(i64::MAX, 0)),
            bad(INVALID, "run_at"),
        ),
        row(
            "run_at -1s (1969)",
            bad_req(&|r| r.run_at = ts(-1, 0)),
            bad(INVALID, "run_at"),
        ),
        row(
            "run_at i64::MIN",
            bad_req(&|r| r.run_at = ts(i64::MIN, 0)),
            bad(INVALID, "run_at"),
        ),
        // dedup_key
        row(
            "dedup_key 513 bytes",
            bad_req(&|r| r.dedup_key = "k".repeat(513)),
            bad(INVALID, "dedup_key"),
        ),
        row(
            "dedup_key 257 x 'é' (514 bytes)",
            bad_req(&|r| r.dedup_key = "é".repeat(257)),
            bad(INVALID, "dedup_key"),
        ),
        row(
            "dedup_key with NUL",
            bad_req(&|r| r.dedup_key = q("a\0b")),
            bad(INVALID, "dedup_key"),
        ),
        // max_attempts
        row(
            "max_attempts -1",
            bad_req(&|r| r.max_attempts = -1),
            bad(INVALID, "max_attempts"),
        ),
        row(
            "max_attempts i32::MIN",
            bad_req(&|r| r.max_attempts = i32::MIN),
            bad(INVALID, "max_attempts"),
        ),
        row(
            "max_attempts 1001",
            bad_req(&|r| r.max_attempts = 1001),
            bad(INVALID, "max_attempts"),
        ),
        row(
            "max_attempts i32::MAX",
            bad_req(&|r| r.max_attempts = i32::MAX),
            bad(INVALID, "max_attempts"),
        ),
        // ttl
        row(
            "ttl -1s",
            bad_req(&|r| r.ttl = pd(-1, 0)),
            bad(INVALID, "ttl"),
        ),
        row(
            "ttl -1ns",
            bad_req(&|r| r.ttl = pd(0, -1)),
            bad(INVALID, "ttl"),
        ),
        row(
            "ttl nanos 1e9",
            bad_req(&|r| r.ttl = pd(0, 1_000_000_000)),
            bad(INVALID, "ttl"),
        ),
        row(
            "ttl 11 years",
            bad_req(&|r| r.ttl = pd(ELEVEN_YEARS_S, 0)),
            bad(INVALID, "ttl"),
        ),
        row(
            "ttl i64::MAX s",
            bad_req(&|r| r.ttl = pd(i64::MAX, 0)),
            bad(INVALID, "ttl"),
        ),
    ];
    // Boundary values that must be accepted.
    let ok = |name: &str, r: pb::EnqueueRequest| row(name, r, Want::Ok(1));
    rows.extend([
        ok(
            "queue exactly 128 chars",
            ok_req(&|r| r.queue = "q".repeat(128)),
        ),
        ok(
            "queue of every allowed class",
            ok_req(&|r| r.queue = q("Az09.b_c:d-e")),
        ),
        ok(
            "queue starting with a digit",
            ok_req(&|r| r.queue = q("9lives")),
        ),
        ok(
            "payload exactly 1 MiB",
            ok_req(&|r| r.payload = vec![7; MIB]),
        ),
        ok("empty payload", ok_req(&|r| r.payload.clear())),
        ok("64 headers", ok_req(&|r| r.headers = many_headers(64))),
        ok(
            "header value exactly 16 KiB",
            ok_req(&|r| r.headers = headers(&[("k", &"v".repeat(16 * 1024))])),
        ),
        ok(
            "header key exactly 256 bytes",
            ok_req(&|r| r.headers = headers(&[(&"k".repeat(256), "v")])),
        ),
        ok(
            "header empty value, unicode",
            ok_req(&|r| r.headers = headers(&[("k", ""), ("ключ", "значение ✓")])),
        ),
        ok("delay zero", ok_req(&|r| r.delay = pd(0, 0))),
        ok("delay 1ns", ok_req(&|r| r.delay = pd(0, 1))),
        ok("delay 10 years", ok_req(&|r| r.delay = pd(TEN_YEARS_S, 0))),
        ok(
            "delay exactly the limit",
            ok_req(&|r| r.delay = pd(max_delay_s(), 0)),
        ),
        ok(
            "run_at 9999-12-31T23:59:59.999999999",
            ok_req(&|r| r.run_at = ts(YEAR_9999_END, 999_999_999)),
        ),
        ok("run_at 1970 (past)", ok_req(&|r| r.run_at = ts(0, 0))),
        ok(
            "dedup_key exactly 512 bytes",
            ok_req(&|r| r.dedup_key = "k".repeat(512)),
        ),
        ok(
            "dedup_key 256 x 'é' (512 bytes)",
            ok_req(&|r| r.dedup_key = "é".repeat(256)),
        ),
        ok("max_attempts 0 (default)", ok_req(&|r| r.max_attempts = 0)),
        ok("max_attempts 1", ok_req(&|r| r.max_attempts = 1)),
        ok("max_attempts 1000", ok_req(&|r| r.max_attempts = 1000)),
        ok("ttl zero (never)", ok_req(&|r| r.ttl = pd(0, 0))),
        ok("ttl 10 years", ok_req(&|r| r.ttl = pd(TEN_YEARS_S, 0))),
        ok("priority i32::MIN", ok_req(&|r| r.priority = i32::MIN)),
        ok("priority i32::MAX", ok_req(&|r| r.priority = i32::MAX)),
    ]);
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_bad_input_table() {
    let mut fx = Fixture::new().await;
    let rows = enqueue_rows("held", "accepted");
    fx.run("Enqueue", rows, |mut c, r| async move {
        c.enqueue(r).await.map(|_| ())
    })
    .await;
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_batch_bad_input_table() {
    let mut fx = Fixture::new().await;
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

    fx.run("EnqueueBatch", rows, |mut c, r| async move {
        let want = r.jobs.len();
        let resp = c.enqueue_batch(r).await?.into_inner();
        if resp.results.len() != want {
            return Err(Status::internal(format!(
                "{} results for {want} jobs",
                resp.results.len()
            )));
        }
        Ok(())
    })
    .await;
    fx.finish().await;
}

fn sub(queues: &[&str]) -> pb::SubscribeRequest {
    pb::SubscribeRequest {
        queues: queues.iter().map(|q| q.to_string()).collect(),
        consumer: "validation".into(),
        max_in_flight: 1,
        lease: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_bad_input_table() {
    let mut fx = Fixture::new().await;
    let with = |f: &dyn Fn(&mut pb::SubscribeRequest)| {
        let mut r = sub(&["held"]);
        f(&mut r);
        r
    };
    // Accepted rows subscribe to empty queues so they lease nothing.
    let ok_with = |f: &dyn Fn(&mut pb::SubscribeRequest)| {
        let mut r = sub(&["empty"]);
        f(&mut r);
        r
    };
    let names = |n: usize| (0..n).map(|i| format!("q{i}")).collect::<Vec<_>>();
    let rows = vec![
        row(
            "no queues",
            with(&|r| r.queues.clear()),
            bad(INVALID, "queues"),
        ),
        row(
            "queues[0] empty",
            with(&|r| r.queues = vec![String::new()]),
            bad(INVALID, "queues[0]"),
        ),
        row(
            "queues[0] '.a'",
            with(&|r| r.queues = vec![".a".into()]),
            bad(INVALID, "queues[0]"),
        ),
        row(
            "queues[1] 'a b'",
            with(&|r| r.queues = vec!["held".into(), "a b".into()]),
            bad(INVALID, "queues[1]"),
        ),
        row(
            "queues[2] 129 chars",
            with(&|r| r.queues = vec!["held".into(), "x".into(), "q".repeat(129)]),
            bad(INVALID, "queues[2]"),
        ),
        row(
            "queues[3] 'é'",
            with(&|r| r.queues = vec!["a".into(), "b".into(), "c".into(), "é".into()]),
            bad(INVALID, "queues[3]"),
        ),
        row(
            "queues[1] duplicate",
            with(&|r| r.queues = vec!["held".into(), "held".into()]),
            bad(INVALID, "queues[1]"),
        ),
        row(
            "queues[2] duplicate of [0]",
            with(&|r| r.queues = vec!["a".into(), "b".into(), "a".into()]),
            bad(INVALID, "queues[2]"),
        ),
        row(
            "65 queues",
            with(&|r| r.queues = names(65)),
            bad(INVALID, "queues"),
        ),
        row(
            "max_in_flight 10001",
            with(&|r| r.max_in_flight = 10_001),
            bad(INVALID, "max_in_flight"),
        ),
        row(
            "max_in_flight u32::MAX",
            with(&|r| r.max_in_flight = u32::MAX),
            bad(INVALID, "max_in_flight"),
        ),
        row(
            "lease zero",
            with(&|r| r.lease = pd(0, 0)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease 999ms",
            with(&|r| r.lease = pd(0, 999_000_000)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease 1ns under 1s",
            with(&|r| r.lease = pd(0, 999_999_999)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease 999ms + 1ns",
            with(&|r| r.lease = pd(0, 999_000_001)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease 12h + 1s",
            with(&|r| r.lease = pd(TWELVE_HOURS_S + 1, 0)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease 12h + 1ns",
            with(&|r| r.lease = pd(TWELVE_HOURS_S, 1)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease -1s",
            with(&|r| r.lease = pd(-1, 0)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease -1ns",
            with(&|r| r.lease = pd(0, -1)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease nanos 1e9",
            with(&|r| r.lease = pd(0, 1_000_000_000)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease i64::MAX",
            with(&|r| r.lease = pd(i64::MAX, 0)),
            bad(INVALID, "lease"),
        ),
        row(
            "consumer with NUL",
            with(&|r| r.consumer = "pod\0x".into()),
            bad(INVALID, "consumer"),
        ),
        row(
            "consumer 257 bytes",
            with(&|r| r.consumer = "c".repeat(257)),
            bad(INVALID, "consumer"),
        ),
        row(
            "consumer 129 x 'é' (258 bytes)",
            with(&|r| r.consumer = "é".repeat(129)),
            bad(INVALID, "consumer"),
        ),
        // Accepted.
        row("64 queues", ok_with(&|r| r.queues = names(64)), Want::Ok(0)),
        row(
            "max_in_flight 10000",
            ok_with(&|r| r.max_in_flight = 10_000),
            Want::Ok(0),
        ),
        row(
            "max_in_flight 0 (default)",
            ok_with(&|r| r.max_in_flight = 0),
            Want::Ok(0),
        ),
        row(
            "lease exactly 1s",
            ok_with(&|r| r.lease = pd(1, 0)),
            Want::Ok(0),
        ),
        row(
            "lease exactly 12h",
            ok_with(&|r| r.lease = pd(TWELVE_HOURS_S, 0)),
            Want::Ok(0),
        ),
        row("lease absent", ok_with(&|r| r.lease = None), Want::Ok(0)),
        row(
            "consumer exactly 256 bytes",
            ok_with(&|r| r.consumer = "c".repeat(256)),
            Want::Ok(0),
        ),
        row(
            "consumer empty",
            ok_with(&|r| r.consumer.clear()),
            Want::Ok(0),
        ),
        row(
            "queue exactly 128 chars",
            ok_with(&|r| r.queues = vec!["e".repeat(128)]),
            Want::Ok(0),
        ),
    ];
    fx.run("Subscribe", rows, |mut c, r| async move {
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
    })
    .await;
    fx.finish().await;
}

/// The (job_id, lease_token) rows common to Ack, Nack and ExtendLease.
/// `held` is a real leased job with its token: rows that pair it with a bad
/// or wrong other field could do damage if validation or fencing were broken.
fn id_token_rows(held: &(String, String)) -> Vec<(String, String, String, Want)> {
    let (h, t) = held.clone();
    let (u, r) = Fixture::unknown();
    let s = |x: &str| x.to_owned();
    vec![
        (s("job_id empty"), s(""), t.clone(), bad(INVALID, "job_id")),
        (
            s("job_id not a UUID"),
            s("not-a-uuid"),
            t.clone(),
            bad(INVALID, "job_id"),
        ),
        (
            s("job_id a number"),
            s("12345"),
            t.clone(),
            bad(INVALID, "job_id"),
        ),
        (
            s("job_id UUID + garbage"),
            format!("{h}x"),
            t.clone(),
            bad(INVALID, "job_id"),
        ),
        (
            s("job_id UUID with NUL"),
            format!("{h}\0"),
            t.clone(),
            bad(INVALID, "job_id"),
        ),
        (
            s("job_id and token empty"),
            s(""),
            s(""),
            bad(INVALID, "job_id"),
        ),
        (
            s("lease_token empty"),
            h.clone(),
            s(""),
            bad(INVALID, "lease_token"),
        ),
        (
            s("lease_token not a UUID"),
            h.clone(),
            s("not-a-token"),
            bad(INVALID, "lease_token"),
        ),
        (
            s("lease_token truncated"),
            h.clone(),
            t[..30].to_owned(),
            bad(INVALID, "lease_token"),
        ),
        (
            s("lease_token with NUL"),
            h.clone(),
            format!("{t}\0"),
            bad(INVALID, "lease_token"),
        ),
        // Well-formed but not the current lease: fencing.
        (
            s("unknown job id, unknown token"),
            u.clone(),
            r.clone(),
            bad(STALE, "lease_token"),
        ),
        (
            s("unknown job id, the held job's token"),
            u.clone(),
            t.clone(),
            bad(STALE, "lease_token"),
        ),
        (
            s("held job id, wrong token"),
            h.clone(),
            r.clone(),
            bad(STALE, "lease_token"),
        ),
        (
            s("held job id, its job id as token"),
            h.clone(),
            h.clone(),
            bad(STALE, "lease_token"),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_bad_input_table() {
    let mut fx = Fixture::new().await;
    let held = (fx.held_id.clone(), fx.held_token.clone());
    let rows = id_token_rows(&held)
        .into_iter()
        .map(|(name, job_id, lease_token, want)| {
            row(
                name,
                pb::AckRequest {
                    job_id,
                    lease_token,
                },
                want,
            )
        })
        .collect();
    fx.run(
        "Ack",
        rows,
        |mut c, r| async move { c.ack(r).await.map(|_| ()) },
    )
    .await;
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_bad_input_table() {
    let mut fx = Fixture::new().await;
    let (h, t) = (fx.held_id.clone(), fx.held_token.clone());
    let nack = |job_id: &str, lease_token: &str| pb::NackRequest {
        job_id: job_id.to_owned(),
        lease_token: lease_token.to_owned(),
        error: "boom".into(),
        retry_after: None,
        dead_letter: false,
    };
    let mut rows: Vec<Row<pb::NackRequest>> = id_token_rows(&(h.clone(), t.clone()))
        .into_iter()
        .map(|(name, id, token, want)| row(name, nack(&id, &token), want))
        .collect();
    // The same with dead_letter: a broken check would bury the held job.
    rows.extend(id_token_rows(&(h.clone(), t.clone())).into_iter().map(
        |(name, id, token, want)| {
            let mut r = nack(&id, &token);
            r.dead_letter = true;
            row(format!("{name} (dead_letter)"), r, want)
        },
    ));
    // Bad fields with the held job's real id and token.
    let with = |f: &dyn Fn(&mut pb::NackRequest)| {
        let mut r = nack(&h, &t);
        f(&mut r);
        r
    };
    rows.extend([
        row(
            "error 64 KiB + 1",
            with(&|r| r.error = "e".repeat(64 * 1024 + 1)),
            bad(INVALID, "error"),
        ),
        row(
            "error 1 MiB",
            with(&|r| r.error = "e".repeat(MIB)),
            bad(INVALID, "error"),
        ),
        row(
            "error with NUL",
            with(&|r| r.error = "bad\0thing".into()),
            bad(INVALID, "error"),
        ),
        row(
            "error with NUL, dead_letter",
            with(&|r| {
                r.error = "\0".into();
                r.dead_letter = true;
            }),
            bad(INVALID, "error"),
        ),
        row(
            "retry_after -1s",
            with(&|r| r.retry_after = pd(-1, 0)),
            bad(INVALID, "retry_after"),
        ),
        row(
            "retry_after -1ns",
            with(&|r| r.retry_after = pd(0, -1)),
            bad(INVALID, "retry_after"),
        ),
        row(
            "retry_after nanos 1e9",
            with(&|r| r.retry_after = pd(0, 1_000_000_000)),
            bad(INVALID, "retry_after"),
        ),
        row(
            "retry_after 11 years",
            with(&|r| r.retry_after = pd(ELEVEN_YEARS_S, 0)),
            bad(INVALID, "retry_after"),
        ),
        row(
            "retry_after i64::MAX",
            with(&|r| r.retry_after = pd(i64::MAX, 0)),
            bad(INVALID, "retry_after"),
        ),
    ]);
    // Boundary values pass validation: with an unknown id they reach the
    // fencing check (FAILED_PRECONDITION), not INVALID_ARGUMENT.
    let (u, r) = Fixture::unknown();
    let unknown_with = |f: &dyn Fn(&mut pb::NackRequest)| {
        let mut req = nack(&u, &r);
        f(&mut req);
        req
    };
    rows.extend([
        row(
            "error exactly 64 KiB (unknown id)",
            unknown_with(&|r| r.error = "e".repeat(64 * 1024)),
            bad(STALE, "lease_token"),
        ),
        row(
            "error empty (unknown id)",
            unknown_with(&|r| r.error.clear()),
            bad(STALE, "lease_token"),
        ),
        row(
            "retry_after zero (unknown id)",
            unknown_with(&|r| r.retry_after = pd(0, 0)),
            bad(STALE, "lease_token"),
        ),
        row(
            "retry_after 10 years (unknown id)",
            unknown_with(&|r| r.retry_after = pd(TEN_YEARS_S, 0)),
            bad(STALE, "lease_token"),
        ),
        row(
            "retry_after exactly the limit (unknown id)",
            unknown_with(&|r| r.retry_after = pd(max_delay_s(), 0)),
            bad(STALE, "lease_token"),
        ),
    ]);
    fx.run("Nack", rows, |mut c, r| async move {
        c.nack(r).await.map(|_| ())
    })
    .await;
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_lease_bad_input_table() {
    let mut fx = Fixture::new().await;
    let (h, t) = (fx.held_id.clone(), fx.held_token.clone());
    let extend = |job_id: &str, lease_token: &str| pb::ExtendLeaseRequest {
        job_id: job_id.to_owned(),
        lease_token: lease_token.to_owned(),
        lease: pd(60, 0),
    };
    let mut rows: Vec<Row<pb::ExtendLeaseRequest>> = id_token_rows(&(h.clone(), t.clone()))
        .into_iter()
        .map(|(name, id, token, want)| row(name, extend(&id, &token), want))
        .collect();
    let with = |f: &dyn Fn(&mut pb::ExtendLeaseRequest)| {
        let mut r = extend(&h, &t);
        f(&mut r);
        r
    };
    rows.extend([
        row(
            "lease missing",
            with(&|r| r.lease = None),
            bad(INVALID, "lease"),
        ),
        row(
            "lease zero",
            with(&|r| r.lease = pd(0, 0)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease 999ms",
            with(&|r| r.lease = pd(0, 999_000_000)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease 12h + 1s",
            with(&|r| r.lease = pd(TWELVE_HOURS_S + 1, 0)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease 12h + 1ns",
            with(&|r| r.lease = pd(TWELVE_HOURS_S, 1)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease -1s",
            with(&|r| r.lease = pd(-1, 0)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease -1ns",
            with(&|r| r.lease = pd(0, -1)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease nanos 1e9",
            with(&|r| r.lease = pd(0, 1_000_000_000)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease i64::MAX",
            with(&|r| r.lease = pd(i64::MAX, 0)),
            bad(INVALID, "lease"),
        ),
        row(
            "lease i64::MIN",
            with(&|r| r.lease = pd(i64::MIN, 0)),
            bad(INVALID, "lease"),
        ),
    ]);
    let (u, r) = Fixture::unknown();
    rows.extend([
        row(
            "lease exactly 1s (unknown id)",
            pb::ExtendLeaseRequest {
                lease: pd(1, 0),
                ..extend(&u, &r)
            },
            bad(STALE, "lease_token"),
        ),
        row(
            "lease exactly 12h (unknown id)",
            pb::ExtendLeaseRequest {
                lease: pd(TWELVE_HOURS_S, 0),
                ..extend(&u, &r)
            },
            bad(STALE, "lease_token"),
        ),
        row(
            "lease 12h, wrong token on the held job",
            pb::ExtendLeaseRequest {
                lease: pd(TWELVE_HOURS_S, 0),
                ..extend(&h, &r)
            },
            bad(STALE, "lease_token"),
        ),
        // Just under the 1 s minimum: validation must reject it before the
        // fencing check is reached.
        row(
            "lease 1ns under 1s (unknown id)",
            pb::ExtendLeaseRequest {
                lease: pd(0, 999_999_999),
                ..extend(&u, &r)
            },
            bad(INVALID, "lease"),
        ),
        row(
            "lease 999ms + 1ns (unknown id)",
            pb::ExtendLeaseRequest {
                lease: pd(0, 999_000_001),
                ..extend(&u, &r)
            },
            bad(INVALID, "lease"),
        ),
        // Last, because if it is wrongly accepted it cuts the held job's
        // lease to 1 s and later rows would see an expired lease.
        row(
            "lease 1ns under 1s (held job, its token)",
            with(&|r| r.lease = pd(0, 999_999_999)),
            bad(INVALID, "lease"),
        ),
    ]);
    fx.run("ExtendLease", rows, |mut c, r| async move {
        c.extend_lease(r).await.map(|_| ())
    })
    .await;
    fx.finish().await;
}
