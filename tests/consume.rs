//! The Consume RPC (settles on the delivery stream) as a client sees it:
//! real gRPC to brokers in process (and the real binary for the SIGTERM
//! drain), a real PostgreSQL, a fresh database per test. Acks, nacks and
//! lease extensions on the stream and their results; stale and unknown
//! settles failing alone with the unary call's code; credit changes;
//! half-close (settles applied, the rest released at once) and a dropped
//! call; settles for jobs another replica delivered; a drain with a stream
//! open; the first message's rules; and hand-off at enqueue next to paused
//! and limited queues and a higher-priority backlog.
//!
//! The bad-input rows of Consume are in tests/validation.rs; Consume
//! consumers under faults in tests/faults.rs and behind HAProxy in
//! tests/lb.rs (tests/common/load.rs).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::common::consume::*;
use crate::common::*;
use leaseq::pb;
use leaseq_server::Config;
use tonic::Code;
use uuid::Uuid;

const S5: Duration = Duration::from_secs(5);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// No fallback poll within a test: only NOTIFY (or a due time) wakes a stream.
fn no_poll(c: &mut Config) {
    c.poll_interval = secs(60);
}

fn us(t: &prost_types::Timestamp) -> i64 {
    t.seconds * 1_000_000 + i64::from(t.nanos) / 1000
}

/// Whether `d` was handed off at its enqueue: inserted already leased, so
/// its lease began at the very `now()` of the insert. A job leased by a
/// later lease round has a later lease start.
fn handed_off(d: &pb::Delivery, lease: Duration) -> bool {
    let expires = us(d.lease_expires_at.as_ref().expect("lease_expires_at"));
    let enqueued = us(job_of(d).enqueued_at.as_ref().expect("enqueued_at"));
    expires - lease.as_micros() as i64 == enqueued
}

fn with_priority(queue: &str, payload: &str, priority: i32) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        priority,
        ..job(queue, payload)
    }
}

/// Deliveries by payload.
fn by_payload(ds: Vec<pb::Delivery>) -> HashMap<String, pb::Delivery> {
    ds.into_iter().map(|d| (payload_of(&d), d)).collect()
}

/// A job id and a lease token the broker never issued.
fn unknown_ack() -> pb::AckRequest {
    pb::AckRequest {
        job_id: Uuid::now_v7().to_string(),
        lease_token: Uuid::new_v4().to_string(),
        enqueue: Vec::new(),
        result: Vec::new(),
    }
}

/// (state, attempt, last_error, run_at - now() in ms, lease_expires_at -
/// now() in ms) of a live job.
async fn row(db: &TestDb, id: &str) -> Option<(String, i32, Option<String>, i64, Option<i64>)> {
    sqlx::query_as(
        "select state, attempt, last_error,
                (extract(epoch from run_at - now()) * 1000)::int8,
                (extract(epoch from lease_expires_at - now()) * 1000)::int8
         from leaseq.jobs where id = $1::uuid",
    )
    .bind(id)
    .fetch_optional(&db.pool)
    .await
    .expect("job row")
}

// ---------------------------------------------------------------------------
// Settles on the stream.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_nacks_and_extensions_on_the_stream_are_applied_and_confirmed() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut s = Consumer::open(&mut c, &["cs"], 3, Some(secs(30)), true).await;
    for p in ["a", "b", "c"] {
        enqueue(&mut c, "cs", p).await;
    }
    let d = by_payload(s.take(3, S5).await);
    let (a, b, cc) = (&d["a"], &d["b"], &d["c"]);

    // One message: an ack, a nack with a delay, an extension.
    let sent_at = Instant::now();
    s.send(pb::ConsumeRequest {
        acks: vec![ack_of(a)],
        nacks: vec![nack_of(b, "b failed", Some(secs(2)), false)],
        extends: vec![extend_of(cc, secs(120))],
        ..Default::default()
    })
    .await;
    let results: HashMap<i32, pb::SettleResult> = s
        .results(3, S5)
        .await
        .into_iter()
        .map(|r| (r.op, r))
        .collect();
    let ack_r = &results[&(pb::SettleOp::Ack as i32)];
    let nack_r = &results[&(pb::SettleOp::Nack as i32)];
    let ext_r = &results[&(pb::SettleOp::Extend as i32)];
    for (r, d) in [(ack_r, a), (nack_r, b), (ext_r, cc)] {
        assert_eq!((r.code, r.message.as_str()), (0, ""), "{r:?}");
        assert_eq!(r.job_id, id_of(d));
    }
    assert!(!nack_r.dead_lettered);
    assert!(ack_r.lease_expires_at.is_none() && nack_r.lease_expires_at.is_none());

    // a is done; b waits two seconds with its error; c's lease is 120 s long,
    // exactly what the result said.
    assert_eq!(db.live_row(&id_of(a)).await, None);
    assert_eq!(db.dead_row(&id_of(a)).await, None);
    let (state, attempt, err, run_in, _) = row(&db, &id_of(b)).await.expect("b is live");
    assert_eq!((state.as_str(), attempt), ("available", 1));
    assert_eq!(err.as_deref(), Some("b failed"));
    assert!(run_in <= 2000, "b runs again in {run_in} ms");
    let (state, _, _, _, lease_left) = row(&db, &id_of(cc)).await.expect("c is live");
    assert_eq!(state, "leased");
    assert!(
        lease_left.unwrap() > 100_000,
        "c's lease: {lease_left:?} ms left"
    );
    let db_expiry: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("select lease_expires_at from leaseq.jobs where id = $1::uuid")
            .bind(id_of(cc))
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        us(ext_r
            .lease_expires_at
            .as_ref()
            .expect("extend result has the expiry")),
        db_expiry.timestamp_micros()
    );

    // b comes back to this stream (the ack freed a credit) after its delay.
    let again = s.next_delivery(S5).await;
    assert_eq!(id_of(&again), id_of(b));
    assert_eq!(job_of(&again).attempt, 2);
    assert_eq!(job_of(&again).last_error, "b failed");
    assert!(
        sent_at.elapsed() >= ms(1900),
        "redelivered {:?} after a 2 s retry_after",
        sent_at.elapsed()
    );

    // Dead-lettered on request, and the result says so.
    s.nack(&again, "give up", None, true).await;
    let r = s.result(S5).await;
    assert_eq!((r.code, r.dead_lettered), (0, true), "{r:?}");
    let (reason, attempt, err) = db.dead_row(&id_of(b)).await.expect("b is dead");
    assert_eq!((reason.as_str(), attempt), ("nacked", 2));
    assert_eq!(err.as_deref(), Some("give up"));

    s.ack(cc).await;
    assert_eq!(s.result(S5).await.code, 0);
    assert_eq!(db.live_jobs().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_confirm_settles_only_failures_are_reported() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut s = Consumer::open(&mut c, &["quiet"], 2, Some(secs(30)), false).await;
    enqueue(&mut c, "quiet", "0").await;
    enqueue(&mut c, "quiet", "1").await;
    let d = by_payload(s.take(2, S5).await);
    let wrong = pb::AckRequest {
        lease_token: Uuid::new_v4().to_string(),
        ..ack_of(&d["1"])
    };
    s.send(pb::ConsumeRequest {
        acks: vec![ack_of(&d["0"]), wrong],
        ..Default::default()
    })
    .await;
    let r = s.result(S5).await;
    assert_eq!(r.job_id, id_of(&d["1"]));
    assert_eq!(r.op, pb::SettleOp::Ack as i32);
    assert_eq!(r.code, Code::FailedPrecondition as i32, "{r:?}");
    s.assert_no_results(ms(300), "a successful ack is not reported")
        .await;
    assert_eq!(db.live_row(&id_of(&d["0"])).await, None);
    assert_eq!(db.leased_in("quiet").await, 1);
    // The right token, unconfirmed: applied all the same.
    s.ack(&d["1"]).await;
    until(&db, "select count(*) = 0 from leaseq.jobs", S5).await;
    s.assert_no_results(ms(200), "a successful ack is not reported")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_and_unknown_settles_fail_alone_with_the_unary_code_and_the_stream_goes_on() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut s = Consumer::open(&mut c, &["stale"], 1, Some(secs(30)), true).await;
    let id = enqueue(&mut c, "stale", "j").await;
    let first = s.next_delivery(S5).await;
    // Nacked for an immediate retry: the job comes back under a new token,
    // and the first one is stale.
    s.nack(&first, "again", Some(Duration::ZERO), false).await;
    assert_eq!(s.result(S5).await.code, 0);
    let second = s.next_delivery(S5).await;
    assert_eq!(id_of(&second), id);
    assert_ne!(second.lease_token, first.lease_token);

    let unknown = unknown_ack();
    let stale_ack = ack_of(&first);
    let stale_nack = nack_of(&first, "late", None, true);
    let stale_extend = extend_of(&first, secs(60));
    s.send(pb::ConsumeRequest {
        acks: vec![stale_ack.clone(), unknown.clone()],
        nacks: vec![stale_nack.clone()],
        extends: vec![stale_extend.clone()],
        ..Default::default()
    })
    .await;
    let results = s.results(4, S5).await;
    // What the unary calls answer to the same requests.
    let unary = [
        (
            pb::SettleOp::Ack,
            &stale_ack.job_id,
            c.ack(stale_ack.clone()).await.map(|_| ()),
        ),
        (
            pb::SettleOp::Ack,
            &unknown.job_id,
            c.ack(unknown.clone()).await.map(|_| ()),
        ),
        (
            pb::SettleOp::Nack,
            &stale_nack.job_id,
            c.nack(stale_nack.clone()).await.map(|_| ()),
        ),
        (
            pb::SettleOp::Extend,
            &stale_extend.job_id,
            c.extend_lease(stale_extend.clone()).await.map(|_| ()),
        ),
    ];
    for (op, job_id, want) in &unary {
        let want = want.as_ref().expect_err("the unary call refuses it");
        assert_eq!(want.code(), Code::FailedPrecondition, "{want:?}");
        let got = results
            .iter()
            .find(|r| r.op == *op as i32 && &r.job_id == *job_id)
            .unwrap_or_else(|| panic!("no {op:?} result for {job_id}: {results:?}"));
        assert_eq!(got.code, want.code() as i32, "{op:?} {job_id}: {got:?}");
        assert!(got.message.contains("lease_token"), "{got:?}");
        assert!(!got.dead_lettered && got.lease_expires_at.is_none());
    }
    // Nothing changed: the job is leased under the second token.
    let (state, attempt, token) = db.live_row(&id).await.expect("live");
    assert_eq!((state.as_str(), attempt), ("leased", 2));
    assert_eq!(
        token.map(|t| t.to_string()),
        Some(second.lease_token.clone())
    );
    assert_eq!(db.dead_jobs().await, 0);

    // Two acks of the job in one message, with the stale token and the
    // current one: results come in no set order, and each names its token,
    // so a client tells them apart. The stream goes on.
    s.send(pb::ConsumeRequest {
        acks: vec![ack_of(&first), ack_of(&second)],
        ..Default::default()
    })
    .await;
    let both = s.results(2, S5).await;
    let of = |token: &str| {
        both.iter()
            .find(|r| r.lease_token == token)
            .unwrap_or_else(|| panic!("no result for token {token}: {both:?}"))
            .code
    };
    assert_eq!(of(&first.lease_token), Code::FailedPrecondition as i32);
    assert_eq!(of(&second.lease_token), 0);
    enqueue(&mut c, "stale", "k").await;
    let k = s.next_delivery(S5).await;
    assert_eq!(payload_of(&k), "k");
    s.ack(&k).await;
    assert_eq!(s.result(S5).await.code, 0);
    assert_eq!(db.live_jobs().await, 0);
}

// ---------------------------------------------------------------------------
// Credit.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credit_changes_on_the_stream_are_honoured() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    c.enqueue_batch(pb::EnqueueBatchRequest {
        jobs: (0..5).map(|i| job("credit", &i.to_string())).collect(),
    })
    .await
    .unwrap();
    let mut s = Consumer::open(&mut c, &["credit"], 1, Some(secs(30)), true).await;
    let mut held = s.take(1, S5).await;
    s.assert_quiet(ms(400), "one credit").await;

    // Raised to 3: two more.
    s.credit(3).await;
    held.extend(s.take(2, S5).await);
    s.assert_quiet(ms(400), "three credits, three held").await;

    // 0 leaves the credit as it is (3): an ack makes room for one more.
    s.send(pb::ConsumeRequest {
        max_in_flight: 0,
        acks: vec![ack_of(&held[0])],
        ..Default::default()
    })
    .await;
    assert_eq!(s.result(S5).await.code, 0);
    held.push(s.next_delivery(S5).await);
    s.assert_quiet(ms(300), "three held").await;

    // Lowered to 1 with three held: nothing new until all but none are
    // settled. Nothing delivered is taken back.
    s.send(pb::ConsumeRequest {
        max_in_flight: 1,
        acks: vec![ack_of(&held[1])],
        ..Default::default()
    })
    .await;
    assert_eq!(s.result(S5).await.code, 0);
    s.assert_quiet(ms(400), "credit 1, two held").await;
    s.ack(&held[2]).await;
    assert_eq!(s.result(S5).await.code, 0);
    s.assert_quiet(ms(400), "credit 1, one held").await;
    assert_eq!(db.leased_in("credit").await, 1);
    s.ack(&held[3]).await;
    assert_eq!(s.result(S5).await.code, 0);
    let last = s.next_delivery(S5).await;
    assert_eq!(payload_of(&last), "4");

    // The queue is drained now. Raised to 2 (one free credit, which an idle
    // stream offers to new jobs), then lowered to 1 again: jobs enqueued
    // after that are not handed to this full stream.
    s.credit(2).await;
    tokio::time::sleep(ms(300)).await;
    s.send(pb::ConsumeRequest {
        max_in_flight: 1,
        acks: vec![unknown_ack()],
        ..Default::default()
    })
    .await;
    // The unknown ack's answer comes after the credit change was handed
    // to the dispatcher.
    assert_eq!(s.result(S5).await.code, Code::FailedPrecondition as i32);
    tokio::time::sleep(ms(100)).await;
    enqueue(&mut c, "credit", "5").await;
    enqueue(&mut c, "credit", "6").await;
    s.assert_quiet(ms(500), "credit 1, one held, after lowering")
        .await;
    assert_eq!(db.leased_in("credit").await, 1, "{:?}", db.job_rows().await);
    s.ack(&last).await;
    assert_eq!(s.result(S5).await.code, 0);
    let d5 = s.next_delivery(S5).await;
    assert_eq!(payload_of(&d5), "5");
    s.assert_quiet(ms(300), "credit 1 again").await;
    s.credit(5).await;
    assert_eq!(payload_of(&s.next_delivery(S5).await), "6");
}

/// A stream's credit comes back when its ack arrives, not when the ack
/// commits: with one credit, the next job is delivered while the ack of the
/// first is still held up (here by a row lock a test transaction holds on
/// it). The ack then commits as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credit_comes_back_when_the_ack_arrives_not_when_it_commits() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    c.enqueue_batch(pb::EnqueueBatchRequest {
        jobs: (0..2).map(|i| job("early", &i.to_string())).collect(),
    })
    .await
    .unwrap();
    let mut s = Consumer::open(&mut c, &["early"], 1, Some(secs(30)), true).await;
    let first = s.next_delivery(S5).await;
    s.assert_quiet(ms(300), "one credit").await;

    let mut lock = db.pool.begin().await.unwrap();
    sqlx::query("select 1 from leaseq.jobs where id = $1::uuid for update")
        .bind(id_of(&first))
        .execute(&mut *lock)
        .await
        .unwrap();
    s.ack(&first).await;
    let second = s.next_delivery(S5).await;
    assert_ne!(id_of(&second), id_of(&first));
    // The first job's ack is still waiting for the lock: not committed.
    let still: i64 = sqlx::query_scalar("select count(*) from leaseq.jobs where id = $1::uuid")
        .bind(id_of(&first))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        still, 1,
        "the first ack committed before the lock was let go"
    );

    lock.rollback().await.unwrap();
    let r = s.result(S5).await;
    assert_eq!((r.code, r.job_id.as_str()), (0, id_of(&first).as_str()));
    s.ack(&second).await;
    assert_eq!(s.result(S5).await.code, 0);
    assert_eq!(db.live_jobs().await, 0);
}

/// The ack linger (a second here) holds a stream's ack for company only
/// while the stream has credit to spare. An ack that frees a stream's last
/// credit commits at once: a consumer taking one job at a time would
/// otherwise see each ack confirmed a linger later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_waits_for_company_only_while_its_stream_has_credit_to_spare() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|c| c.ack_linger = secs(1))
        .start()
        .await;
    let mut c = broker.client().await;
    c.enqueue_batch(pb::EnqueueBatchRequest {
        jobs: (0..8).map(|i| job("linger", &i.to_string())).collect(),
    })
    .await
    .unwrap();
    let mut s = Consumer::open(&mut c, &["linger"], 1, Some(secs(30)), true).await;
    let started = Instant::now();
    for _ in 0..5 {
        let d = s.next_delivery(S5).await;
        s.ack(&d).await;
        assert_eq!(s.result(S5).await.code, 0);
    }
    // The acks came well within two lingers of each other: had the last
    // four lingered, this would have taken four seconds.
    assert!(
        started.elapsed() < secs(3),
        "five jobs one at a time took {:?}",
        started.elapsed()
    );

    // Five credits, three held: acks leave credit to spare. The first
    // lingering one after a pause commits at once (it could not tell how
    // far apart acks come); the next waits for company.
    s.credit(5).await;
    let held = s.take(3, S5).await;
    s.ack(&held[0]).await;
    assert_eq!(s.result(S5).await.code, 0);
    let acked = Instant::now();
    s.ack(&held[1]).await;
    assert_eq!(s.result(S5).await.code, 0);
    assert!(
        acked.elapsed() >= ms(900),
        "the ack was confirmed after {:?}, without lingering",
        acked.elapsed()
    );
    assert_eq!(db.live_jobs().await, 1);
}

// ---------------------------------------------------------------------------
// The end of a stream.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_applies_the_settles_sent_then_releases_the_rest_at_once() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    for i in 0..4 {
        enqueue(&mut c, "hc", &i.to_string()).await;
    }
    let mut s = Consumer::open(&mut c, &["hc"], 4, Some(secs(60)), true).await;
    let d = by_payload(s.take(4, S5).await);
    // Another consumer waits; every job is leased, so it gets nothing yet.
    let mut other = broker.client().await;
    let mut waiting = subscribe(&mut other, &["hc"], 4, Some(secs(60))).await;
    assert_quiet(&mut waiting, ms(300), "everything is leased").await;

    // An ack and a nack, and at once the half-close: no answer awaited.
    s.send(pb::ConsumeRequest {
        acks: vec![ack_of(&d["0"])],
        nacks: vec![nack_of(
            &d["1"],
            "nacked before closing",
            Some(secs(60)),
            false,
        )],
        ..Default::default()
    })
    .await;
    let closed = Instant::now();
    s.half_close();
    let end = s.end(S5).await;
    assert!(end.status.is_ok(), "a half-closed stream ends OK: {end:?}");
    assert!(end.deliveries.is_empty(), "{end:?}");
    let mut codes: Vec<(i32, i32)> = end.results.iter().map(|r| (r.op, r.code)).collect();
    codes.sort();
    assert_eq!(
        codes,
        [
            (pb::SettleOp::Ack as i32, 0),
            (pb::SettleOp::Nack as i32, 0)
        ],
        "both settles answered before the end: {end:?}"
    );

    // When the stream has ended, everything is done (no waiting here): the
    // ack and the nack applied, the other two released for an immediate
    // retry (the waiting stream may have them already). The release counts as an attempt (ARCHITECTURE.md: a stream
    // closing counts as a failed attempt).
    assert_eq!(db.live_row(&id_of(&d["0"])).await, None);
    let (state, attempt, err, run_in, _) = row(&db, &id_of(&d["1"])).await.unwrap();
    assert_eq!((state.as_str(), attempt), ("available", 1));
    assert_eq!(err.as_deref(), Some("nacked before closing"));
    assert!(run_in > 50_000, "the nack's retry_after holds: {run_in} ms");
    for p in ["2", "3"] {
        // Available now, or already leased again by the waiting stream.
        let (state, attempt, err, run_in, _) = row(&db, &id_of(&d[p])).await.unwrap();
        assert!(
            [("available", 1), ("leased", 2)].contains(&(state.as_str(), attempt)),
            "job {p}: {state} attempt {attempt}"
        );
        assert_eq!(
            err.as_deref(),
            Some("consumer stream closed before settling")
        );
        assert!(run_in <= 0, "job {p} runs again in {run_in} ms");
    }
    // The waiting consumer gets them long before their 60 s leases end.
    let again: HashSet<String> = take(&mut waiting, 2, secs(3))
        .await
        .iter()
        .map(|d| {
            assert_eq!(job_of(d).attempt, 2);
            payload_of(d)
        })
        .collect();
    assert_eq!(again, HashSet::from(["2".to_owned(), "3".to_owned()]));
    assert!(closed.elapsed() < secs(3), "{:?}", closed.elapsed());
    assert_quiet(&mut waiting, ms(300), "the nacked job waits").await;
}

/// A TCP relay to `to` on a loopback port of its own; aborting the task it
/// returns closes both sides at once, as a crashed client's connection is
/// lost. Serves one connection.
async fn relay(to: std::net::SocketAddr) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut inbound, _) = listener.accept().await.unwrap();
        let mut outbound = tokio::net::TcpStream::connect(to).await.unwrap();
        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
    });
    (addr, task)
}

/// The client's connection is lost with the call open (no half-close, no
/// reset of the call): the broker releases the stream's jobs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_releases_its_jobs_at_once_and_an_ack_in_flight_is_never_both() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    for i in 0..3 {
        enqueue(&mut c, "drop", &i.to_string()).await;
    }
    let (via, cut) = relay(broker.addr).await;
    let mut gone = connect(via).await;
    let mut s = Consumer::open(&mut gone, &["drop"], 3, Some(secs(60)), false).await;
    let d = by_payload(s.take(3, S5).await);
    // An ack sent, then the connection is lost.
    s.ack(&d["0"]).await;
    cut.abort();
    let t = Instant::now();
    let mut waiting = subscribe(&mut c, &["drop"], 3, Some(secs(60))).await;
    let mut again: HashSet<String> = take(&mut waiting, 2, secs(3))
        .await
        .iter()
        .map(|d| {
            assert_eq!(job_of(d).attempt, 2, "{d:?}");
            payload_of(d)
        })
        .collect();
    assert!(t.elapsed() < secs(3), "released after {:?}", t.elapsed());
    // The ack raced the release: the job was either acked (gone, and not
    // delivered again) or released (delivered again, its ack refused). The
    // release of the three was one statement, so by now it is one or the
    // other.
    let all = |ps: &[&str]| ps.iter().map(|p| p.to_string()).collect::<HashSet<_>>();
    if db.live_row(&id_of(&d["0"])).await.is_some() {
        // Released before its ack ran (which then failed): delivered again.
        again.insert(payload_of(&next_delivery(&mut waiting, secs(3)).await));
        assert_eq!(again, all(&["0", "1", "2"]));
    } else {
        // Acked before the release: never delivered again.
        assert_eq!(again, all(&["1", "2"]));
        assert_quiet(&mut waiting, ms(500), "job 0 was acked").await;
    }
}

// ---------------------------------------------------------------------------
// Replicas.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_sent_to_one_replica_for_jobs_another_delivered() {
    let db = TestDb::new().await;
    let a = TestBroker::on(&db).config(no_poll).start().await;
    let b = TestBroker::on(&db).config(no_poll).start().await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    for i in 1..=3 {
        enqueue(&mut cb, "rep", &i.to_string()).await;
    }
    // Jobs delivered by A's stream, settled on a stream to B.
    let mut on_a = Consumer::open(&mut ca, &["rep"], 1, Some(secs(30)), true).await;
    let d1 = on_a.next_delivery(S5).await;
    assert_eq!(payload_of(&d1), "1");
    on_a.assert_quiet(ms(500), "one credit").await;
    let mut on_b = Consumer::open(&mut cb, &["rep-side"], 1, None, true).await;

    on_b.extend(&d1, secs(40)).await;
    let r = on_b.result(S5).await;
    assert_eq!(r.code, 0, "{r:?}");
    let (_, _, _, _, left) = row(&db, &id_of(&d1)).await.unwrap();
    assert!(left.unwrap() > 35_000, "extended on B: {left:?} ms left");
    on_b.ack(&d1).await;
    assert_eq!(on_b.result(S5).await.code, 0);
    // A's stream gets its credit back from B's settle (NOTIFY).
    let t = Instant::now();
    let d2 = on_a.next_delivery(secs(3)).await;
    assert!(t.elapsed() < secs(2), "credit back after {:?}", t.elapsed());
    assert_eq!(payload_of(&d2), "2");

    on_b.nack(&d2, "dead on B", None, true).await;
    let r = on_b.result(S5).await;
    assert_eq!((r.code, r.dead_lettered), (0, true), "{r:?}");
    let d3 = on_a.next_delivery(secs(3)).await;
    assert_eq!(payload_of(&d3), "3");
    // Fencing holds across replicas.
    on_b.ack(&d1).await;
    let r = on_b.result(S5).await;
    assert_eq!(r.code, Code::FailedPrecondition as i32, "{r:?}");

    // The other way round: a job a Subscribe stream on B holds, acked on
    // A's Consume stream; B's stream gets its credit back.
    // y is enqueued once x is delivered: enqueued back to back on A, y could
    // be handed over to B's stream on an offer B published before it heard
    // of x (ordering across replicas is as good as the wake-ups,
    // docs/ARCHITECTURE.md), and this test is about settles, not that.
    let mut sub_b = subscribe(&mut cb, &["rep2"], 1, Some(secs(30))).await;
    enqueue(&mut ca, "rep2", "x").await;
    let x = next_delivery(&mut sub_b, S5).await;
    assert_eq!(payload_of(&x), "x");
    enqueue(&mut ca, "rep2", "y").await;
    assert_quiet(&mut sub_b, ms(300), "one credit").await;
    on_a.ack(&x).await;
    assert_eq!(on_a.result(S5).await.code, 0);
    let y = next_delivery(&mut sub_b, secs(3)).await;
    assert_eq!(payload_of(&y), "y");

    on_a.send(pb::ConsumeRequest {
        acks: vec![ack_of(&d3), ack_of(&y)],
        ..Default::default()
    })
    .await;
    let codes: Vec<i32> = on_a.results(2, S5).await.iter().map(|r| r.code).collect();
    assert_eq!(codes, [0, 0]);
    assert_eq!(db.live_jobs().await, 0);
    assert_eq!(db.dead_jobs().await, 1);
}

// ---------------------------------------------------------------------------
// Drain.

/// SIGTERM to the real binary while a Consume stream holds jobs and has
/// acks in flight: the stream ends with UNAVAILABLE, the broker exits 0,
/// every ack it applied was answered first (and every ack answered OK was
/// applied), and every other job is available again (attempt given back)
/// for another broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_consume_stream_open_loses_nothing() {
    let db = TestDb::new().await;
    let mut broker = BinaryBroker::start(&db, &[]).await;
    let mut c = broker.client().await;
    for i in 0..6 {
        enqueue(&mut c, "drain-c", &i.to_string()).await;
    }
    let mut s = Consumer::open(&mut c, &["drain-c"], 6, Some(secs(60)), true).await;
    let d = by_payload(s.take(6, S5).await);
    let ids: Vec<String> = (0..6).map(|i| id_of(&d[&i.to_string()])).collect();
    // Two acks answered before the drain, two in flight when it begins.
    s.send(pb::ConsumeRequest {
        acks: vec![ack_of(&d["0"]), ack_of(&d["1"])],
        ..Default::default()
    })
    .await;
    let codes: Vec<i32> = s.results(2, S5).await.iter().map(|r| r.code).collect();
    assert_eq!(codes, [0, 0]);
    s.send(pb::ConsumeRequest {
        acks: vec![ack_of(&d["2"]), ack_of(&d["3"])],
        ..Default::default()
    })
    .await;
    let signalled = Instant::now();
    broker.signal(libc::SIGTERM);
    let end = s.end(secs(8)).await;
    let status = end
        .status
        .as_ref()
        .expect_err("a drain ends the stream with a status");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(end.deliveries.is_empty(), "{end:?}");
    let exit = broker.wait(secs(10)).await;
    assert!(exit.success(), "exit after SIGTERM: {exit:?}");
    assert!(signalled.elapsed() < ms(6500), "{:?}", signalled.elapsed());
    assert_eq!(db.live_row(&ids[0]).await, None);
    assert_eq!(db.live_row(&ids[1]).await, None);
    let mut outcomes = Vec::new();
    for (i, id) in ids.iter().enumerate().skip(2) {
        let answered = end.results.iter().find(|r| &r.job_id == id);
        let live = db.live_row(id).await;
        outcomes.push(format!(
            "job {i}: answer {:?}, {}",
            answered.map(|r| Code::from(r.code)),
            if live.is_some() { "live" } else { "gone" }
        ));
        match (answered.map(|r| r.code), &live) {
            // An ack the broker applied was answered, as a unary Ack in
            // flight during a drain is: settles sent before the drain are
            // finished and reported before the stream ends.
            (Some(0), None) if i < 4 => {}
            // Released by the drain before its ack ran (refused, or not
            // read before the stream ended), or never acked: the attempt
            // is given back.
            (Some(9) | None, Some((state, attempt, token))) => {
                assert_eq!(state, "available", "job {i}");
                assert_eq!(*attempt, 0, "job {i}: the drain refunds the attempt");
                assert!(token.is_none());
            }
            other => panic!("job {i}: answer and row disagree: {other:?}"),
        }
    }
    eprintln!("acks in flight at SIGTERM: {outcomes:?}");
    assert_eq!(db.dead_jobs().await, 0);

    // Nothing lost: another broker delivers every job left, first attempts.
    let left = db.live_jobs().await as usize;
    assert!(left >= 2, "the two unsettled jobs are left");
    let next = TestBroker::start(&db).await;
    let mut c = next.client().await;
    let mut s = Consumer::open(&mut c, &["drain-c"], 6, None, true).await;
    for d in s.take(left, S5).await {
        assert_eq!(job_of(&d).attempt, 1, "{d:?}");
        s.ack(&d).await;
        assert_eq!(s.result(S5).await.code, 0);
    }
    assert_eq!(db.live_jobs().await, 0);
    s.half_close();
    assert!(s.end(S5).await.status.is_ok());
    next.stop().await;
}

/// Settles the broker read before a drain ended the stream are answered
/// before the stream's UNAVAILABLE, as a unary call in flight during a
/// drain is. Made deterministic with a row lock the test holds on the two
/// jobs: the drain's release queues on it first, the acks sent after
/// SIGTERM queue behind it, so the release wins and each ack is answered
/// FAILED_PRECONDITION (the job is back, attempt given back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_under_way_when_a_drain_ends_the_stream_are_answered() {
    let db = TestDb::new().await;
    let mut broker = BinaryBroker::start(&db, &[]).await;
    let mut c = broker.client().await;
    for i in 0..2 {
        enqueue(&mut c, "drain-r", &i.to_string()).await;
    }
    let mut s = Consumer::open(&mut c, &["drain-r"], 2, Some(secs(60)), true).await;
    let d = s.take(2, S5).await;
    let mut lock = db.pool.begin().await.unwrap();
    sqlx::query("select 1 from leaseq.jobs where queue = 'drain-r' for update")
        .execute(&mut *lock)
        .await
        .unwrap();
    broker.signal(libc::SIGTERM);
    eventually(S5, "the drain's release waits for the lock", || async {
        db.lock_waiters().await >= 1
    })
    .await;
    s.send(pb::ConsumeRequest {
        acks: d.iter().map(ack_of).collect(),
        ..Default::default()
    })
    .await;
    eventually(S5, "the acks wait for the lock too", || async {
        db.lock_waiters().await >= 2
    })
    .await;
    lock.rollback().await.unwrap();
    let end = s.end(secs(8)).await;
    let status = end.status.as_ref().expect_err("a drain ends the stream");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let mut answered: Vec<(String, i32)> = end
        .results
        .iter()
        .map(|r| (r.job_id.clone(), r.code))
        .collect();
    answered.sort();
    let mut want: Vec<(String, i32)> = d
        .iter()
        .map(|d| (id_of(d), Code::FailedPrecondition as i32))
        .collect();
    want.sort();
    assert_eq!(answered, want, "both acks answered before the end: {end:?}");
    for d in &d {
        let (state, attempt, token) = db.live_row(&id_of(d)).await.expect("released");
        assert_eq!((state.as_str(), attempt, token), ("available", 0, None));
    }
    assert!(broker.wait(secs(10)).await.success());
}

// ---------------------------------------------------------------------------
// The first message, and messages the stream cannot go on after.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_message_opens_the_stream_and_no_later_one_may() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;

    // A first message without `subscribe`: the call fails.
    let e = Consumer::start(
        &mut c,
        pb::ConsumeRequest {
            acks: vec![unknown_ack()],
            ..Default::default()
        },
    )
    .await
    .err()
    .expect("refused");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("subscribe"), "{e:?}");
    // No message at all.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    drop(tx);
    let e = Consumer::start_with(&mut c, None, rx)
        .await
        .err()
        .expect("refused");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("subscribe"), "{e:?}");

    // A second `subscribe` ends the stream; an ack in the same message is
    // not applied, and the stream's job is released at once.
    let id = enqueue(&mut c, "twice", "held").await;
    let mut s = Consumer::open(&mut c, &["twice"], 1, Some(secs(60)), true).await;
    let held = s.next_delivery(S5).await;
    let mut waiting = subscribe(&mut c, &["twice"], 1, Some(secs(60))).await;
    s.send(pb::ConsumeRequest {
        acks: vec![ack_of(&held)],
        ..opening(&["twice"], 1, None, false)
    })
    .await;
    let end = s.end(S5).await;
    let e = end.status.expect_err("ends with a status");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("subscribe"), "{e:?}");
    assert!(end.results.is_empty(), "{:?}", end.results);
    let again = next_delivery(&mut waiting, secs(3)).await;
    assert_eq!(id_of(&again), id, "released, not acked");
    assert_eq!(job_of(&again).attempt, 2);

    // A credit out of range ends the stream the same way, settles unapplied.
    drop(waiting); // releases the job again
    let mut s = Consumer::open(&mut c, &["twice"], 1, Some(secs(60)), true).await;
    let held = s.next_delivery(S5).await;
    assert_eq!(id_of(&held), id);
    s.send(pb::ConsumeRequest {
        max_in_flight: 10_001,
        acks: vec![ack_of(&held)],
        ..Default::default()
    })
    .await;
    let end = s.end(S5).await;
    let e = end.status.expect_err("ends with a status");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("max_in_flight"), "{e:?}");
    assert!(end.results.is_empty(), "{:?}", end.results);
    // Not acked: released when the stream ended.
    until(
        &db,
        "select count(*) = 1 from leaseq.jobs where state = 'available'",
        S5,
    )
    .await;
}

// ---------------------------------------------------------------------------
// Hand-off at enqueue.

/// Enqueues `{prefix}N` into `queue` until one is handed off to `s` at its
/// insert (the stream's queue must be empty and the stream idle); acks
/// each. Panics after 20 tries.
async fn until_handed_off(
    c: &mut Client,
    s: &mut Consumer,
    queue: &str,
    prefix: &str,
    lease: Duration,
) {
    for i in 0..20 {
        tokio::time::sleep(ms(100)).await;
        enqueue(c, queue, &format!("{prefix}{i}")).await;
        let d = s.next_delivery(S5).await;
        s.ack(&d).await;
        assert_eq!(s.result(S5).await.code, 0);
        if handed_off(&d, lease) {
            return;
        }
    }
    panic!("no job was handed off to the idle stream in 20 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_off_skips_a_paused_queue_and_its_waiting_jobs_go_first_after_resume() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db).config(no_poll).start().await;
    let mut c = broker.client().await;
    let mut adm = admin(&broker).await;
    let lease = secs(30);
    let mut s = Consumer::open(&mut c, &["ho-p"], 4, Some(lease), true).await;
    // The stream is idle: new jobs are handed to it.
    until_handed_off(&mut c, &mut s, "ho-p", "warm-", lease).await;

    adm.pause_queue(pb::PauseQueueRequest {
        queue: "ho-p".into(),
    })
    .await
    .unwrap();
    for (p, prio) in [("L1", 0), ("H1", 5), ("L2", 0), ("H2", 5)] {
        c.enqueue(with_priority("ho-p", p, prio)).await.unwrap();
    }
    s.assert_quiet(ms(500), "the queue is paused").await;
    assert_eq!(db.leased_in("ho-p").await, 0, "{:?}", db.job_rows().await);

    adm.resume_queue(pb::ResumeQueueRequest {
        queue: "ho-p".into(),
    })
    .await
    .unwrap();
    // Enqueued right after the resume: it must not overtake the four.
    c.enqueue(with_priority("ho-p", "L3", 0)).await.unwrap();
    let mut order = Vec::new();
    for _ in 0..5 {
        let d = s.next_delivery(S5).await;
        order.push(payload_of(&d));
        s.ack(&d).await;
        assert_eq!(s.result(S5).await.code, 0);
    }
    assert_eq!(order, ["H1", "H2", "L1", "L2", "L3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_off_skips_a_queue_with_limits() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db).config(no_poll).start().await;
    let mut c = broker.client().await;
    let mut adm = admin(&broker).await;
    update(&mut adm, |r| {
        r.queue = "ho-l".into();
        r.concurrency_limit = Some(1);
    })
    .await;
    let lease = secs(30);
    let mut s = Consumer::open(&mut c, &["ho-l"], 4, Some(lease), true).await;
    tokio::time::sleep(ms(300)).await;
    for i in 0..3 {
        enqueue(&mut c, "ho-l", &i.to_string()).await;
    }
    for i in 0..3 {
        let d = s.next_delivery(S5).await;
        assert_eq!(payload_of(&d), i.to_string());
        assert!(!handed_off(&d, lease), "job {i} handed off past the limit");
        s.assert_quiet(ms(400), "concurrency limit 1").await;
        assert_eq!(db.leased_in("ho-l").await, 1);
        s.ack(&d).await;
        assert_eq!(s.result(S5).await.code, 0);
    }
    // Without the limit, the same stream takes new jobs at their insert:
    // the checks above were not vacuous.
    update(&mut adm, |r| {
        r.queue = "ho-l".into();
        r.concurrency_limit = Some(0);
    })
    .await;
    until_handed_off(&mut c, &mut s, "ho-l", "free-", lease).await;
}

/// A backlog waits while the stream has no credit. As credit comes back
/// (an ack at a time, or raised), the backlog goes in priority order, and
/// a lower-priority job enqueued meanwhile is never handed off ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handed_off_jobs_never_overtake_a_waiting_higher_priority_backlog() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db).config(no_poll).start().await;
    let mut c = broker.client().await;
    let mut c2 = broker.client().await;
    let lease = secs(30);
    let mut s = Consumer::open(&mut c, &["ho-b"], 1, Some(lease), true).await;
    until_handed_off(&mut c, &mut s, "ho-b", "warm-", lease).await;

    // Credit 1, held: the backlog waits.
    enqueue(&mut c, "ho-b", "J0").await;
    let mut current = s.next_delivery(S5).await;
    assert_eq!(payload_of(&current), "J0");
    for (p, prio) in [("L1", 0), ("H1", 5), ("L2", 0), ("H2", 5)] {
        c.enqueue(with_priority("ho-b", p, prio)).await.unwrap();
    }
    s.assert_quiet(ms(300), "no credit").await;
    // Each ack races a new low-priority enqueue (N1..N4).
    let mut order = Vec::new();
    for i in 1..=4 {
        let ack = pb::ConsumeRequest {
            acks: vec![ack_of(&current)],
            ..Default::default()
        };
        let (_, enq) = tokio::join!(
            s.send(ack),
            c2.enqueue(with_priority("ho-b", &format!("N{i}"), 0))
        );
        enq.unwrap();
        assert_eq!(s.result(S5).await.code, 0);
        current = s.next_delivery(S5).await;
        order.push(payload_of(&current));
    }
    assert_eq!(order, ["H1", "H2", "L1", "L2"]);

    // A raised credit takes the backlog in one round, in order; a job
    // enqueued after that may be handed off.
    c.enqueue(with_priority("ho-b", "H3", 5)).await.unwrap();
    s.send(pb::ConsumeRequest {
        max_in_flight: 10,
        acks: vec![ack_of(&current)],
        ..Default::default()
    })
    .await;
    assert_eq!(s.result(S5).await.code, 0);
    let got: Vec<String> = s.take(5, S5).await.iter().map(payload_of).collect();
    assert_eq!(got, ["H3", "N1", "N2", "N3", "N4"]);
    tokio::time::sleep(ms(300)).await;
    enqueue(&mut c, "ho-b", "last").await;
    let last = s.next_delivery(S5).await;
    assert_eq!(payload_of(&last), "last");
    assert!(
        handed_off(&last, lease),
        "an idle stream with free credit takes a new job at its insert"
    );
}

// ---------------------------------------------------------------------------
// Hand-off across replicas (dispatch/remote.rs).

/// The producer on one replica, the consumer on another (as behind a load
/// balancer): an idle stream's offer reaches the producer's replica, which
/// inserts new jobs already leased to that stream. Past the stream's credit
/// nothing is pushed, and nothing is lost: jobs the producer's replica
/// handed over beyond it are released and come once credit returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_enqueued_on_one_replica_is_handed_to_an_idle_stream_of_another() {
    let db = TestDb::new().await;
    let a = TestBroker::on(&db).config(no_poll).start().await;
    let b = TestBroker::on(&db).config(no_poll).start().await;
    let mut ca = a.client().await;
    let mut cb = b.client().await;
    let lease = secs(30);
    let mut s = Consumer::open(&mut cb, &["ho-x"], 3, Some(lease), true).await;
    // No stream on A: a job handed off at its insert went to B's.
    until_handed_off(&mut ca, &mut s, "ho-x", "warm-", lease).await;

    // Credit 3, all held; A may still think some is free.
    let held = {
        for i in 0..3 {
            enqueue(&mut ca, "ho-x", &format!("H{i}")).await;
        }
        s.take(3, S5).await
    };
    for i in 0..3 {
        enqueue(&mut ca, "ho-x", &format!("W{i}")).await;
    }
    s.assert_quiet(ms(500), "no credit left").await;
    for d in &held {
        s.ack(d).await;
        assert_eq!(s.result(S5).await.code, 0);
    }
    let rest = s.take(3, S5).await;
    let mut got: Vec<String> = rest.iter().map(payload_of).collect();
    got.sort();
    assert_eq!(got, ["W0", "W1", "W2"]);
    assert!(rest.iter().all(|d| job_of(d).attempt == 1), "{rest:?}");
    for d in &rest {
        s.ack(d).await;
        assert_eq!(s.result(S5).await.code, 0);
    }
    s.assert_quiet(ms(300), "each job once").await;
    assert_eq!(db.live_jobs().await, 0);
}

/// What the producer's replica does with another replica's offer, seen from
/// outside: the test plays a broker that offers one credit and never takes
/// the job (as if killed). The job is inserted leased to that broker's
/// stream, stamped with its id and consumer; its hand-over notification
/// carries the job and the lease token; the offer is spent after one job,
/// a job too big for a notification is never handed over; and the job comes
/// back when its lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_handed_to_a_replica_that_never_takes_it_comes_back_when_its_lease_runs_out() {
    let db = TestDb::new().await;
    let a = TestBroker::on(&db).config(no_poll).start().await;
    let mut c = a.client().await;
    let ghost = Uuid::new_v4();
    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.unwrap();
    let channel = format!("leaseq_handed_{}", ghost.simple());
    listener.listen(&channel).await.unwrap();
    let offer = |queue: &str, credit: i32| {
        serde_json::json!({
            "b": ghost, "s": 5, "c": credit, "l": 1000, "n": "ghost", "q": [queue],
        })
        .to_string()
    };
    let leased_to = |id: String| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_as::<_, (String, i32, Option<Uuid>, Option<String>, Option<Uuid>)>(
                "select state, attempt, lease_broker, leased_by, lease_token
                 from leaseq.jobs where id = $1::uuid",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    // Until A has heard the offer (each try on a queue of its own).
    let mut handed = None;
    for i in 0..30 {
        let queue = format!("ho-g{i}");
        sqlx::query("select pg_notify('leaseq_offers', $1)")
            .bind(offer(&queue, 2))
            .execute(&db.pool)
            .await
            .unwrap();
        tokio::time::sleep(ms(100)).await;
        let id = enqueue(&mut c, &queue, "g").await;
        let row = leased_to(id.clone()).await;
        if row.0 == "leased" {
            handed = Some((queue, id, row));
            break;
        }
    }
    let (queue, id, row) = handed.expect("A heard the offer within 30 tries");
    assert_eq!(
        (row.1, row.2, row.3.as_deref()),
        (1, Some(ghost), Some("ghost"))
    );
    let note = tokio::time::timeout(S5, listener.recv())
        .await
        .expect("the hand-over within 5s")
        .unwrap();
    let note: serde_json::Value = serde_json::from_str(note.payload()).unwrap();
    assert_eq!(note["s"], 5);
    assert_eq!(note["id"], id);
    assert_eq!(note["t"], row.4.unwrap().to_string());
    assert_eq!(note["q"], queue);
    assert_eq!(note["p"], "Zw==", "the payload, base64");
    // One credit left: a job too big for a notification is not handed over,
    // the next one is, and the one after that finds the offer spent.
    let big = c
        .enqueue(pb::EnqueueRequest {
            queue: queue.clone(),
            payload: vec![b'x'; 4096],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .job_id;
    assert_eq!(leased_to(big.clone()).await.0, "available");
    let second = enqueue(&mut c, &queue, "g2").await;
    assert_eq!(leased_to(second.clone()).await.3.as_deref(), Some("ghost"));
    let third = enqueue(&mut c, &queue, "g3").await;
    assert_eq!(
        leased_to(third.clone()).await.0,
        "available",
        "the offer is spent"
    );

    // A consumer here gets the two never handed over at once, and the two
    // handed to the ghost once their 1 s leases run out.
    let mut s = Consumer::open(&mut c, &[&queue], 10, Some(secs(30)), true).await;
    let first = s.take(2, S5).await;
    let mut ids: Vec<String> = first.iter().map(id_of).collect();
    ids.sort();
    let mut want = vec![big, third];
    want.sort();
    assert_eq!(ids, want);
    let back = s.take(2, S5).await;
    let mut ids: Vec<String> = back.iter().map(id_of).collect();
    ids.sort();
    let mut want = vec![id, second];
    want.sort();
    assert_eq!(ids, want);
    assert!(back.iter().all(|d| job_of(d).attempt == 2), "{back:?}");
}

/// Subscribe and Consume responses name the broker process serving the
/// stream (`leaseq-broker`, docs/DEPLOYMENT.md): the id its leases carry in
/// `lease_broker`, one per process, another for another broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_names_the_broker_that_serves_it() {
    let db = TestDb::new().await;
    let b0 = TestBroker::start(&db).await;
    let b1 = TestBroker::start(&db).await;
    let header = |md: &tonic::metadata::MetadataMap| {
        md.get("leaseq-broker")
            .expect("leaseq-broker metadata")
            .to_str()
            .unwrap()
            .to_owned()
    };
    let mut c = b0.client().await;
    let sub = c
        .subscribe(pb::SubscribeRequest {
            queues: vec!["named".into()],
            max_in_flight: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let id0 = header(sub.metadata());
    assert_eq!(id0.len(), 32, "{id0}");
    let mut s = sub.into_inner();
    let job_id = enqueue(&mut c, "named", "j").await;
    let d = next_delivery(&mut s, S5).await;
    let leased_by: Option<Uuid> =
        sqlx::query_scalar("select lease_broker from leaseq.jobs where id = $1::uuid")
            .bind(&job_id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(leased_by.map(|u| u.simple().to_string()), Some(id0.clone()));
    ack(&mut c, &d).await.unwrap();

    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(opening(&["named"], 1, None, false)).await.unwrap();
    let consumer = c
        .consume(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap();
    assert_eq!(header(consumer.metadata()), id0, "the same process");
    let mut c1 = b1.client().await;
    let other = c1
        .subscribe(pb::SubscribeRequest {
            queues: vec!["named".into()],
            max_in_flight: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_ne!(header(other.metadata()), id0, "another process");
}

// ---------------------------------------------------------------------------
// Packed deliveries (`accept: ["deliveries"]`).

/// Every message of `stream` until `n` deliveries came: (deliveries per
/// message, the first message's heartbeat features).
async fn read_packs(
    stream: &mut tonic::Streaming<pb::ConsumeResponse>,
    n: usize,
) -> (Vec<usize>, Vec<String>, HashSet<String>) {
    use pb::consume_response::Kind;
    let (mut packs, mut features, mut ids) = (Vec::new(), None, HashSet::new());
    while ids.len() < n {
        let msg = tokio::time::timeout(S5, stream.message())
            .await
            .expect("a message within 5 s")
            .expect("stream ok")
            .expect("stream open");
        let ds = match msg.kind {
            Some(Kind::Heartbeat(h)) => {
                features.get_or_insert(h.features);
                continue;
            }
            Some(Kind::Delivery(d)) => vec![d],
            Some(Kind::Deliveries(d)) => d.deliveries,
            other => panic!("unexpected {other:?}"),
        };
        packs.push(ds.len());
        for d in ds {
            assert!(ids.insert(id_of(&d)), "delivered twice: {}", id_of(&d));
        }
    }
    (packs, features.expect("a first heartbeat"), ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_comes_packed_to_a_stream_that_accepts_packs_and_one_by_one_to_others() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    for (queue, accept) in [("packed", true), ("single", false)] {
        for chunk in 0..6 {
            let jobs = (0..100)
                .map(|i| job(queue, &format!("{chunk}-{i}")))
                .collect();
            c.enqueue_batch(pb::EnqueueBatchRequest { jobs })
                .await
                .expect("enqueue");
        }
        let mut first = opening(&[queue], 1000, Some(secs(60)), false);
        if !accept {
            first.subscribe.as_mut().expect("subscribe").accept.clear();
        }
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(first).await.expect("open");
        let mut stream = c
            .consume(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("consume")
            .into_inner();
        let (packs, features, ids) = read_packs(&mut stream, 600).await;
        // The broker says what it understands, whatever the client accepts.
        assert!(features.contains(&"deliveries".to_owned()), "{features:?}");
        assert_eq!(ids.len(), 600);
        assert!(packs.iter().all(|&n| n <= 256), "{packs:?}");
        if accept {
            // The leases of a round reach the stream together: far fewer
            // messages than jobs.
            assert!(packs.len() <= 60, "{} messages: {packs:?}", packs.len());
        } else {
            assert!(packs.iter().all(|&n| n == 1), "{packs:?}");
        }
        drop(tx);
    }
}

/// CancelJob on a job a Consume stream holds: the stream gets a
/// `Cancelled` naming the lease (after the delivery), its credit back at
/// once, and an ack of the cancelled lease is refused. On a replica other
/// than the one that cancels too (told by NOTIFY).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_job_is_announced_on_the_stream_that_holds_it_on_any_replica() {
    let db = TestDb::new().await;
    let here = TestBroker::start(&db).await;
    let there = TestBroker::start(&db).await;
    let mut c = here.client().await;
    let mut other_admin = admin(&there).await;
    for (cancel_by, queue) in [(None, "cx.here"), (Some(&mut other_admin), "cx.there")] {
        enqueue(&mut c, queue, "first").await;
        enqueue(&mut c, queue, "second").await;
        let mut s = Consumer::open(&mut c, &[queue], 1, Some(secs(600)), true).await;
        let d = s.next_delivery(S5).await;
        assert_eq!(payload_of(&d), "first");
        let mut own = admin(&here).await;
        let a = cancel_by.unwrap_or(&mut own);
        let r = a
            .cancel_job(pb::CancelJobRequest { job_id: id_of(&d) })
            .await
            .unwrap()
            .into_inner();
        assert!(r.was_leased);
        let cancel = s.try_next_cancel(S5).await.expect("a Cancelled");
        assert_eq!(
            (cancel.job_id.as_str(), cancel.lease_token.as_str()),
            (id_of(&d).as_str(), d.lease_token.as_str())
        );
        // The only credit came back: the second job, long before 600 s.
        let d2 = s.next_delivery(S5).await;
        assert_eq!(payload_of(&d2), "second");
        s.ack(&d).await;
        let r = s.result(S5).await;
        assert_eq!(r.code, Code::FailedPrecondition as i32, "{r:?}");
        s.ack(&d2).await;
        assert_eq!(s.result(S5).await.code, 0);
    }
}
