//! Keys inside a queue (issue 33): `EnqueueRequest.key` on every job, and
//! queues with `ordered_by_key`, whose jobs of one key are delivered in
//! enqueue order, at most `key_concurrency` of a key leased at once, a
//! retry keeping its place at the head of its key, a dead letter (or a
//! cancel) letting the key go on, and no key holding back another. Against
//! a real broker and PostgreSQL; the kill -9 case against the binary.

use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use tonic::Code;

fn keyed(queue: &str, key: &str, payload: &str) -> pb::EnqueueRequest {
    let mut r = job(queue, payload);
    r.key = key.into();
    r
}

async fn enqueue_keyed(c: &mut Client, queue: &str, key: &str, payload: &str) -> String {
    c.enqueue(keyed(queue, key, payload))
        .await
        .expect("enqueue")
        .into_inner()
        .job_id
}

async fn ordered(a: &mut Admin, queue: &str, n: i32) -> pb::QueueSettings {
    update(a, |r| {
        r.queue = queue.into();
        r.ordered_by_key = Some(true);
        r.key_concurrency = Some(n);
    })
    .await
}

async fn nack_after(c: &mut Client, d: &pb::Delivery, after: Duration) {
    c.nack(pb::NackRequest {
        job_id: id_of(d),
        lease_token: d.lease_token.clone(),
        error: "again".into(),
        retry_after: Some(dur(after)),
        dead_letter: false,
    })
    .await
    .expect("nack");
}

const S5: Duration = Duration::from_secs(5);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

async fn connect_admin(addr: std::net::SocketAddr) -> Admin {
    leaseq::pb::admin_service_client::AdminServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("admin connect")
}
const QUIET: Duration = Duration::from_millis(600);

/// One key at a time, in enqueue order, and the key's next job goes when
/// the one before is acked; a job without a key and another key's job are
/// not held back; the delivery names its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_jobs_go_one_at_a_time_in_enqueue_order() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let s = ordered(&mut a, "ord", 1).await;
    assert!(s.ordered_by_key);
    assert_eq!(s.key_concurrency, 1);
    for i in 1..=3 {
        enqueue_keyed(&mut c, "ord", "alice", &format!("a{i}")).await;
    }
    enqueue_keyed(&mut c, "ord", "bob", "b1").await;
    enqueue(&mut c, "ord", "nokey").await;
    let mut s = subscribe(&mut c, &["ord"], 10, Some(secs(30))).await;
    let first = take(&mut s, 3, S5).await;
    let mut got: Vec<String> = first.iter().map(payload_of).collect();
    got.sort();
    assert_eq!(got, ["a1", "b1", "nokey"]);
    let a1 = first.iter().find(|d| payload_of(d) == "a1").unwrap();
    assert_eq!(job_of(a1).key, "alice");
    assert_quiet(&mut s, QUIET, "a2 waits for a1").await;
    ack(&mut c, a1).await.unwrap();
    let a2 = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&a2), "a2");
    assert_quiet(&mut s, QUIET, "a3 waits for a2").await;
    ack(&mut c, &a2).await.unwrap();
    let a3 = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&a3), "a3");
}

/// A nacked job keeps its place at the head of its key: the next job of
/// the key waits through the retry's backoff, and the retry goes first.
/// So does a job whose lease expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_and_an_expired_lease_keep_their_place_at_the_head() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    ordered(&mut a, "retry", 1).await;
    enqueue_keyed(&mut c, "retry", "k", "k1").await;
    enqueue_keyed(&mut c, "retry", "k", "k2").await;
    let mut s = subscribe(&mut c, &["retry"], 10, Some(secs(30))).await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&d), "k1");
    nack_after(&mut c, &d, ms(1500)).await;
    assert_quiet(&mut s, ms(1000), "k2 waits behind k1's retry").await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!((payload_of(&d).as_str(), job_of(&d).attempt), ("k1", 2));
    ack(&mut c, &d).await.unwrap();
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&d), "k2");
    ack(&mut c, &d).await.unwrap();

    // A lease that runs out: the job comes back first.
    drop(s);
    enqueue_keyed(&mut c, "retry", "k", "k3").await;
    enqueue_keyed(&mut c, "retry", "k", "k4").await;
    let mut short = subscribe(&mut c, &["retry"], 10, Some(secs(1))).await;
    let d = next_delivery(&mut short, S5).await;
    assert_eq!(payload_of(&d), "k3");
    // Not acked: after its 1 s lease, k3 again, and only then k4. Attempt
    // 2, or later on a loaded host: a 1 s lease can end before its
    // delivery leaves the broker, which then drops it (never sent past its
    // lease) and the job comes back once more, still first of its key
    // (a clean-checkout run saw attempt 3).
    let d = next_delivery(&mut short, secs(10)).await;
    assert_eq!(payload_of(&d), "k3");
    assert!(job_of(&d).attempt >= 2, "attempt {}", job_of(&d).attempt);
    ack(&mut c, &d).await.unwrap();
    let d = next_delivery(&mut short, S5).await;
    assert_eq!(payload_of(&d), "k4");
}

/// A dead-lettered job and a cancelled one let their key go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_or_a_cancel_lets_the_key_go_on() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    ordered(&mut a, "dl", 1).await;
    for p in ["d1", "d2", "d3"] {
        enqueue_keyed(&mut c, "dl", "k", p).await;
    }
    let mut s = subscribe(&mut c, &["dl"], 10, Some(secs(30))).await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&d), "d1");
    nack_dead(&mut c, &d, "poison").await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&d), "d2");
    // Cancelled while leased: d3 goes at once (not at d2's lease end).
    a.cancel_job(pb::CancelJobRequest { job_id: id_of(&d) })
        .await
        .expect("cancel");
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&d), "d3");
    // The dead letter kept its key.
    let dead = a
        .list_dead_letters(pb::ListDeadLettersRequest {
            queue: "dl".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dead.jobs.len(), 1);
    assert_eq!(dead.jobs[0].key, "k");

    // Requeued while d3 is leased, d1 (its old id, ahead of d3) waits for
    // d3: never two of the key leased at once.
    enqueue_keyed(&mut c, "dl", "k", "d4").await;
    let r = a
        .requeue_dead_letters(pb::DeadLettersSelector {
            queue: "dl".into(),
            all: true,
            ..Default::default()
        })
        .await
        .expect("requeue")
        .into_inner();
    assert_eq!(r.requeued, 1);
    assert_quiet(&mut s, QUIET, "the requeued d1 waits for d3").await;
    ack(&mut c, &d).await.unwrap();
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&d), "d1");
    assert_quiet(&mut s, QUIET, "d4 waits for d1").await;
}

/// One key whose head is stuck (leased, never settled) holds back only
/// itself: a hundred other keys' jobs all go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_key_holds_back_only_itself() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    ordered(&mut a, "hol", 1).await;
    for i in 0..50 {
        enqueue_keyed(&mut c, "hol", "stuck", &format!("stuck{i}")).await;
    }
    let reqs: Vec<pb::EnqueueRequest> = (0..100)
        .map(|i| keyed("hol", &format!("key{i}"), &format!("other{i}")))
        .collect();
    c.enqueue_batch(pb::EnqueueBatchRequest { jobs: reqs })
        .await
        .unwrap();
    let mut s = subscribe(&mut c, &["hol"], 200, Some(secs(60))).await;
    let got = take(&mut s, 101, S5).await;
    let stuck: Vec<String> = got
        .iter()
        .map(payload_of)
        .filter(|p| p.starts_with("stuck"))
        .collect();
    assert_eq!(stuck, ["stuck0"]);
    assert_quiet(&mut s, QUIET, "the stuck key's second job").await;
}

/// key_concurrency 2: two of a key at once, the third when one settles;
/// the limit holds across two replicas, and an ack on one lets the key's
/// next job go to a stream of the other at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_concurrency_holds_across_replicas() {
    let db = TestDb::new().await;
    let b1 = TestBroker::start(&db).await;
    let b2 = TestBroker::start(&db).await;
    let mut c1 = b1.client().await;
    let mut c2 = b2.client().await;
    let mut a = admin(&b1).await;
    let s = ordered(&mut a, "two", 2).await;
    assert_eq!(s.key_concurrency, 2);
    for i in 1..=5 {
        enqueue_keyed(&mut c1, "two", "k", &format!("j{i}")).await;
    }
    let mut s1 = subscribe(&mut c1, &["two"], 10, Some(secs(30))).await;
    let mut s2 = subscribe(&mut c2, &["two"], 10, Some(secs(30))).await;
    // Two in all, over both streams.
    let mut held = Vec::new();
    let deadline = tokio::time::Instant::now() + S5;
    while held.len() < 2 && tokio::time::Instant::now() < deadline {
        tokio::select! {
            Some(d) = async { try_next_delivery(&mut s1, ms(200)).await } => held.push((1, d)),
            Some(d) = async { try_next_delivery(&mut s2, ms(200)).await } => held.push((2, d)),
            else => {}
        }
    }
    let mut names: Vec<String> = held.iter().map(|(_, d)| payload_of(d)).collect();
    names.sort();
    assert_eq!(names, ["j1", "j2"]);
    assert_quiet(&mut s1, QUIET, "a third of the key on replica 1").await;
    assert_quiet(&mut s2, ms(100), "a third of the key on replica 2").await;
    // Acked through replica 2 (whichever stream has it): j3 goes next.
    let (_, first) = held.remove(0);
    ack(&mut c2, &first).await.unwrap();
    let next = tokio::select! {
        Some(d) = async { try_next_delivery(&mut s1, S5).await } => d,
        Some(d) = async { try_next_delivery(&mut s2, S5).await } => d,
    };
    assert_eq!(payload_of(&next), "j3");
}

/// A queue not ordered by key carries the key and holds nothing back;
/// turning ordering off clears key_concurrency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unordered_queue_carries_keys_and_holds_nothing_back() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    for i in 0..3 {
        enqueue_keyed(&mut c, "plain", "k", &format!("p{i}")).await;
    }
    let mut s = subscribe(&mut c, &["plain"], 10, Some(secs(30))).await;
    let got = take(&mut s, 3, S5).await;
    assert!(got.iter().all(|d| job_of(d).key == "k"));
    let info = a
        .get_job(pb::GetJobRequest {
            job_id: id_of(&got[0]),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.key, "k");
    ordered(&mut a, "plain", 3).await;
    let s = update(&mut a, |r| {
        r.queue = "plain".into();
        r.ordered_by_key = Some(false);
    })
    .await;
    assert_eq!((s.ordered_by_key, s.key_concurrency), (false, 0));
}

/// Every bad input is INVALID_ARGUMENT naming its field, and changes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_key_settings_are_validated() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let e = c
        .enqueue(keyed("v", &"k".repeat(257), "x"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("key:"), "{}", e.message());
    enqueue_keyed(&mut c, "v", &"k".repeat(256), "fits").await;
    for (n, ordered_by_key, field) in [
        (1001, Some(true), "key_concurrency"),
        (-1, Some(true), "key_concurrency"),
    ] {
        let e = a
            .update_queue(pb::UpdateQueueRequest {
                queue: "v".into(),
                ordered_by_key,
                key_concurrency: Some(n),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{n}: {e:?}");
        assert!(e.message().starts_with(field), "{}", e.message());
    }
    let q = a
        .get_queue(pb::GetQueueRequest { queue: "v".into() })
        .await
        .unwrap()
        .into_inner();
    let s = q.settings.unwrap();
    assert_eq!((s.ordered_by_key, s.key_concurrency), (false, 0));
}

/// `leaseq.enqueue(..., key => ...)` in SQL stores the key, and checks it
/// as the gRPC API does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_enqueue_takes_a_key() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    ordered(&mut a, "sqlkey", 1).await;
    for p in ["s1", "s2"] {
        sqlx::query("select leaseq.enqueue('sqlkey', $1::bytea, key => 'acct-7')")
            .bind(p.as_bytes())
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let e = sqlx::query("select leaseq.enqueue('sqlkey', 'x'::bytea, key => repeat('k', 257))")
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("key: must be at most 256 bytes"),
        "{e}"
    );
    // The old arity still works.
    sqlx::query("select leaseq.enqueue('sqlkey', 'nokey'::bytea)")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut s = subscribe(&mut c, &["sqlkey"], 10, Some(secs(30))).await;
    let got = take(&mut s, 2, S5).await;
    let mut names: Vec<String> = got.iter().map(payload_of).collect();
    names.sort();
    assert_eq!(names, ["nokey", "s1"]);
    assert_quiet(&mut s, QUIET, "s2 waits for s1").await;
}

/// Order survives a kill -9 of the broker holding the key's head: the
/// head comes back (its lease runs out) before the next job of its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_survives_a_broker_killed_holding_the_head() {
    let db = TestDb::new().await;
    let mut b1 = BinaryBroker::start(&db, &[]).await;
    let mut c1 = b1.client().await;
    let mut a = connect_admin(b1.addr).await;
    ordered(&mut a, "kill", 1).await;
    for p in ["h1", "h2", "h3"] {
        enqueue_keyed(&mut c1, "kill", "k", p).await;
    }
    let mut s1 = subscribe(&mut c1, &["kill"], 10, Some(secs(2))).await;
    let d = next_delivery(&mut s1, S5).await;
    assert_eq!(payload_of(&d), "h1");
    b1.signal(libc::SIGKILL);
    b1.wait(S5).await;
    let b2 = BinaryBroker::start(&db, &[]).await;
    let mut c2 = b2.client().await;
    let mut s2 = subscribe(&mut c2, &["kill"], 10, Some(secs(30))).await;
    let d = next_delivery(&mut s2, secs(15)).await;
    assert_eq!((payload_of(&d).as_str(), job_of(&d).attempt), ("h1", 2));
    assert_quiet(&mut s2, QUIET, "h2 waits for h1").await;
    ack(&mut c2, &d).await.unwrap();
    assert_eq!(payload_of(&next_delivery(&mut s2, S5).await), "h2");
}

/// A job of a key whose id is stamped before another's but that commits
/// after the other was leased (here an Enqueue inside an application's
/// transaction; likewise two Enqueues of one key racing, or sent to brokers
/// whose clocks differ) must not go out beside it: one of a key at a time.
/// It did: lease.sql counted only the jobs with a smaller id ahead of a job
/// (docs/RELIABILITY.md, "Found: a key's job committed after a later one
/// was leased"); it counts the key's leased jobs too now. Once the later
/// one is acked, the early one goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_committed_late_is_not_leased_beside_a_later_one() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    ordered(&mut a, "late", 1).await;
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("select leaseq.enqueue('late', 'early'::bytea, key => 'k')")
        .execute(&mut *tx)
        .await
        .unwrap();
    enqueue_keyed(&mut c, "late", "k", "later").await;
    let mut s = subscribe(&mut c, &["late"], 10, Some(secs(30))).await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&d), "later");
    tx.commit().await.unwrap();
    assert_quiet(&mut s, QUIET, "'early' while 'later' of its key is leased").await;
    ack(&mut c, &d).await.unwrap();
    assert_eq!(payload_of(&next_delivery(&mut s, S5).await), "early");
}

fn us(t: &prost_types::Timestamp) -> i64 {
    t.seconds * 1_000_000 + i64::from(t.nanos) / 1000
}

/// Whether `d` was handed off at its enqueue: inserted already leased, its
/// lease began at the insert's very `now()` (as in tests/consume.rs).
fn handed_off(d: &pb::Delivery, lease: Duration) -> bool {
    let expires = us(d.lease_expires_at.as_ref().expect("lease_expires_at"));
    let enqueued = us(job_of(d).enqueued_at.as_ref().expect("enqueued_at"));
    expires - lease.as_micros() as i64 == enqueued
}

/// Hand-off in a queue ordered by key: a keyed job enqueued while a stream
/// waits idle goes to it at its insert when its key is free, and waits,
/// even for an idle stream, while a job of its key is in flight; a job of
/// another key is handed off past the held-back one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_gets_a_free_keys_job_at_its_enqueue_and_a_busy_keys_job_waits() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    ordered(&mut a, "ho", 1).await;
    let lease = secs(30);
    let mut s = subscribe(&mut c, &["ho"], 10, Some(lease)).await;
    // Once the dispatcher has learnt the queue (a round or two), its idle
    // stream offers: a free key's job goes at its insert.
    let mut handed = false;
    for i in 0..20 {
        tokio::time::sleep(ms(100)).await;
        enqueue_keyed(&mut c, "ho", &format!("warm{i}"), "w").await;
        let d = next_delivery(&mut s, S5).await;
        ack(&mut c, &d).await.unwrap();
        if handed_off(&d, lease) {
            handed = true;
            break;
        }
    }
    assert!(handed, "no keyed job was handed off to the idle stream");
    enqueue_keyed(&mut c, "ho", "alice", "a1").await;
    let a1 = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&a1), "a1");
    // The stream is idle again, with credit: a2 must wait all the same.
    tokio::time::sleep(ms(300)).await;
    enqueue_keyed(&mut c, "ho", "alice", "a2").await;
    assert_quiet(&mut s, QUIET, "a2 while a1 of its key is in flight").await;
    // Another key goes, at its insert, past a2 held back in the table.
    let mut b = None;
    for i in 0..20 {
        enqueue_keyed(&mut c, "ho", &format!("bob{i}"), "b").await;
        let d = next_delivery(&mut s, S5).await;
        assert_eq!(payload_of(&d), "b");
        ack(&mut c, &d).await.unwrap();
        if handed_off(&d, lease) {
            b = Some(d);
            break;
        }
        tokio::time::sleep(ms(100)).await;
    }
    assert!(
        b.is_some(),
        "no job of a free key handed off past a held-back one"
    );
    assert_quiet(&mut s, ms(100), "a2 still waits for a1").await;
    ack(&mut c, &a1).await.unwrap();
    let a2 = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&a2), "a2");
    assert!(!handed_off(&a2, lease), "a2 was inserted waiting");
}

/// Hand-offs racing on two replicas: producers enqueue the jobs of a few
/// keys through both brokers while idle streams on both wait; each key's
/// jobs are delivered in enqueue order, never two of a key held at once
/// (as the clients see it), and some went by hand-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_offs_racing_on_two_replicas_keep_each_key_in_order_and_one_at_a_time() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let db = TestDb::new().await;
    let b1 = TestBroker::start(&db).await;
    let b2 = TestBroker::start(&db).await;
    let mut a = admin(&b1).await;
    ordered(&mut a, "race", 1).await;
    let lease = secs(30);
    const KEYS: usize = 6;
    const PER_KEY: usize = 25;
    // Per key: (payload delivered, when it was received, when its ack went).
    type Seen = Arc<Mutex<HashMap<String, Vec<(usize, std::time::Instant, std::time::Instant)>>>>;
    let seen: Seen = Arc::default();
    let handed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = tokio_util::sync::CancellationToken::new();
    let mut consumers = Vec::new();
    for b in [&b1, &b2, &b1, &b2] {
        let mut c = b.client().await;
        let mut s = subscribe(&mut c, &["race"], 4, Some(lease)).await;
        let (seen, handed, done) = (seen.clone(), handed.clone(), done.clone());
        consumers.push(tokio::spawn(async move {
            while !done.is_cancelled() {
                let Some(d) = try_next_delivery(&mut s, ms(100)).await else {
                    continue;
                };
                let got = std::time::Instant::now();
                if handed_off(&d, lease) {
                    handed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                // Held a while: the key's next job is enqueued meanwhile,
                // to streams with credit to spare.
                tokio::time::sleep(ms(20)).await;
                let (key, n) = (job_of(&d).key.clone(), payload_of(&d).parse().unwrap());
                let sent = std::time::Instant::now();
                seen.lock()
                    .unwrap()
                    .entry(key)
                    .or_default()
                    .push((n, got, sent));
                ack(&mut c, &d).await.unwrap();
            }
        }));
    }
    tokio::time::sleep(ms(500)).await;
    let mut producers = Vec::new();
    for k in 0..KEYS {
        let mut cs = [b1.client().await, b2.client().await];
        producers.push(tokio::spawn(async move {
            for n in 0..PER_KEY {
                let c = &mut cs[(n + k) % 2];
                enqueue_keyed(c, "race", &format!("k{k}"), &n.to_string()).await;
                tokio::time::sleep(ms(2 * (n as u64 % 4))).await;
            }
        }));
    }
    for p in producers {
        p.await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + secs(30);
    while seen.lock().unwrap().values().map(Vec::len).sum::<usize>() < KEYS * PER_KEY {
        assert!(tokio::time::Instant::now() < deadline, "not all delivered");
        tokio::time::sleep(ms(50)).await;
    }
    done.cancel();
    for c in consumers {
        c.await.unwrap();
    }
    let seen = seen.lock().unwrap();
    for (key, got) in seen.iter() {
        let mut got = got.clone();
        got.sort_by_key(|g| g.1);
        let order: Vec<usize> = got.iter().map(|g| g.0).collect();
        assert_eq!(
            order,
            (0..PER_KEY).collect::<Vec<_>>(),
            "key {key} out of order"
        );
        for w in got.windows(2) {
            assert!(
                w[1].1 > w[0].2,
                "key {key}: {} received before {} was acked",
                w[1].0,
                w[0].0
            );
        }
    }
    let handed = handed.load(std::sync::atomic::Ordering::Relaxed);
    assert!(handed > 0, "no job went by hand-off: the race was not run");
}

/// A broker whose fallback poll never comes within a test: a job delivered
/// was woken by a settle or an enqueue, not by the poll.
async fn broker_without_poll(db: &TestDb) -> TestBroker {
    TestBroker::on(db)
        .config(|c| c.poll_interval = secs(600))
        .start()
        .await
}

/// The race an ack's wake-up must survive in a queue ordered by key, where
/// an ack wakes the queue only when another job of its key waits: j2 of
/// key k commits after the ack of j1 took its snapshot (so the ack does not
/// see it), and j2's own wake-up's round runs before the ack commits (so
/// the round sees j1 still leased). Nobody else wakes the queue: the
/// broker must look for k's jobs again once the ack committed
/// (`recheck_key`, settle.rs). The ack statement is held between its
/// snapshot and its commit by a lock on j1's row taken by the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_job_committed_during_the_ack_before_it_is_delivered_after_that_ack() {
    let db = TestDb::new().await;
    let broker = broker_without_poll(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    ordered(&mut a, "race", 1).await;
    let mut s = subscribe(&mut c, &["race"], 10, Some(secs(60))).await;
    enqueue_keyed(&mut c, "race", "k", "j1").await;
    let j1 = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&j1), "j1");

    let mut hold = db.pool.begin().await.unwrap();
    sqlx::query("select 1 from leaseq.jobs where id = $1::uuid for update")
        .bind(id_of(&j1))
        .execute(&mut *hold)
        .await
        .unwrap();
    let mut acker = broker.client().await;
    let acking = tokio::spawn(async move { ack(&mut acker, &j1).await });
    // The ack statement has its snapshot and waits for the row.
    let mut waiting = false;
    for _ in 0..200 {
        let n: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity \
             where wait_event_type = 'Lock' and query like '-- Completes jobs%'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if n > 0 {
            waiting = true;
            break;
        }
        tokio::time::sleep(ms(10)).await;
    }
    assert!(waiting, "the ack statement never waited for j1's row");
    // j2 commits now: its key is held (j1 is live), so it is inserted
    // waiting and its wake-up's round finds j1 leased.
    enqueue_keyed(&mut c, "race", "k", "j2").await;
    assert_quiet(&mut s, ms(300), "j2 while j1 of its key is leased").await;
    hold.commit().await.unwrap();
    acking.await.unwrap().expect("the ack of j1");
    let j2 = next_delivery(&mut s, secs(5)).await;
    assert_eq!(payload_of(&j2), "j2");
}

/// An ack in a queue ordered by key wakes it only when another job of its
/// key waits: otherwise the idle stream's offer stands, and the next job
/// of a free key enqueued straight after the ack goes by hand-off. (When
/// every ack woke the queue, the stream took its offer back until a lease
/// round had run, and such a job went through that round.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_with_nothing_of_its_key_waiting_leaves_the_idle_streams_offer() {
    let db = TestDb::new().await;
    let broker = broker_without_poll(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    ordered(&mut a, "offers", 1).await;
    let lease = secs(30);
    let mut s = subscribe(&mut c, &["offers"], 10, Some(lease)).await;
    let mut warm = false;
    for i in 0..20 {
        tokio::time::sleep(ms(100)).await;
        enqueue_keyed(&mut c, "offers", &format!("warm{i}"), "w").await;
        let d = next_delivery(&mut s, S5).await;
        ack(&mut c, &d).await.unwrap();
        if handed_off(&d, lease) {
            warm = true;
            break;
        }
    }
    assert!(warm, "no keyed job was handed off to the idle stream");
    tokio::time::sleep(ms(200)).await;
    let mut handed = 0;
    for i in 0..20 {
        enqueue_keyed(&mut c, "offers", &format!("k{i}"), "j").await;
        let d = next_delivery(&mut s, S5).await;
        if handed_off(&d, lease) {
            handed += 1;
        }
        ack(&mut c, &d).await.unwrap();
    }
    assert!(
        handed >= 18,
        "{handed} of 20 jobs of free keys, each enqueued right after the ack before it, went by hand-off"
    );
}
