//! Delivery semantics over real gRPC and a real PostgreSQL: leases, fencing,
//! flow control, retries, dead letters, order, de-duplication, release on
//! disconnect, replicas, wake-ups.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use leaseq::pb;
use tonic::Code;

const S5: Duration = Duration::from_secs(5);

fn id_of(d: &pb::Delivery) -> String {
    d.job.as_ref().unwrap().id.clone()
}

async fn state_of(db: &TestDb, id: &str) -> Option<(String, i32)> {
    sqlx::query_as::<_, (String, i32)>("select state, attempt from leaseq.jobs where id = $1::uuid")
        .bind(id)
        .fetch_optional(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_carries_the_job_and_ack_is_final() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut req = job("mail", "body");
    req.headers
        .insert("content-type".into(), "text/plain".into());
    req.priority = 7;
    let id = c.enqueue(req).await.unwrap().into_inner().job_id;
    let mut s = subscribe(&mut c, &["mail"], 4, Some(Duration::from_secs(30))).await;
    let d = next_delivery(&mut s, S5).await;
    let j = d.job.clone().unwrap();
    assert_eq!(j.id, id);
    assert_eq!(j.queue, "mail");
    assert_eq!(j.payload, b"body");
    assert_eq!(
        j.headers.get("content-type").map(String::as_str),
        Some("text/plain")
    );
    assert_eq!(j.priority, 7);
    assert_eq!(j.attempt, 1);
    assert!(j.enqueued_at.is_some());
    let exp = d.lease_expires_at.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((exp.seconds - now - 30).abs() <= 2, "lease ~30s from now");
    ack(&mut c, &d).await.unwrap();
    assert_eq!(db.live_jobs().await, 0);
    assert!(
        try_next_delivery(&mut s, Duration::from_millis(700))
            .await
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_never_exceeds_max_in_flight() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    for i in 0..10 {
        enqueue(&mut c, "fc", &format!("{i}")).await;
    }
    let mut s = subscribe(&mut c, &["fc"], 3, Some(Duration::from_secs(60))).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(next_delivery(&mut s, S5).await);
    }
    assert!(
        try_next_delivery(&mut s, Duration::from_secs(1))
            .await
            .is_none(),
        "a 4th delivery with only 3 credits"
    );
    assert_eq!(
        db.count("select count(*) from leaseq.jobs where state = 'leased'")
            .await,
        3
    );
    ack(&mut c, &held.remove(0)).await.unwrap();
    held.push(next_delivery(&mut s, S5).await);
    assert!(
        try_next_delivery(&mut s, Duration::from_millis(700))
            .await
            .is_none()
    );
    assert_eq!(
        db.count("select count(*) from leaseq.jobs where state = 'leased'")
            .await,
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_is_redelivered_and_the_stale_token_is_fenced() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let id = enqueue(&mut c, "exp", "x").await;
    let mut s = subscribe(&mut c, &["exp"], 1, Some(Duration::from_secs(1))).await;
    let first = next_delivery(&mut s, S5).await;
    let started = Instant::now();
    let second = next_delivery(&mut s, S5).await;
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "not before the lease ran out"
    );
    assert_eq!(id_of(&second), id);
    assert_eq!(second.job.as_ref().unwrap().attempt, 2);
    assert_ne!(first.lease_token, second.lease_token);
    assert_eq!(second.job.as_ref().unwrap().last_error, "lease expired");
    let stale = ack(&mut c, &first).await.unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    assert!(
        state_of(&db, &id).await.is_some(),
        "a stale ack changes nothing"
    );
    ack(&mut c, &second).await.unwrap();
    assert!(state_of(&db, &id).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_lease_keeps_the_job_and_fences_stale_tokens() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    enqueue(&mut c, "ext", "x").await;
    let mut s = subscribe(&mut c, &["ext"], 2, Some(Duration::from_secs(1))).await;
    let d = next_delivery(&mut s, S5).await;
    let extend = |token: String, secs: u64| pb::ExtendLeaseRequest {
        job_id: id_of(&d),
        lease_token: token,
        lease: Some(dur(Duration::from_secs(secs))),
    };
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let r = c
            .extend_lease(extend(d.lease_token.clone(), 2))
            .await
            .unwrap();
        assert!(r.into_inner().lease_expires_at.is_some());
    }
    // 1.8 s after delivery with a 1 s lease: still ours, never redelivered.
    assert!(
        try_next_delivery(&mut s, Duration::from_millis(500))
            .await
            .is_none()
    );
    let bogus = uuid::Uuid::new_v4().to_string();
    let err = c.extend_lease(extend(bogus, 2)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    ack(&mut c, &d).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_retries_after_the_requested_delay() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    enqueue(&mut c, "nack", "x").await;
    let mut s = subscribe(&mut c, &["nack"], 1, None).await;
    let d = next_delivery(&mut s, S5).await;
    let nack = |d: &pb::Delivery, retry: Option<Duration>| pb::NackRequest {
        job_id: id_of(d),
        lease_token: d.lease_token.clone(),
        error: "boom".into(),
        retry_after: retry.map(dur),
        dead_letter: false,
    };
    let r = c
        .nack(nack(&d, Some(Duration::ZERO)))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.dead_lettered);
    let again = next_delivery(&mut s, Duration::from_secs(1)).await;
    assert_eq!(again.job.as_ref().unwrap().attempt, 2);
    assert_eq!(again.job.as_ref().unwrap().last_error, "boom");

    c.nack(nack(&again, Some(Duration::from_millis(1500))))
        .await
        .unwrap();
    let t = Instant::now();
    let third = next_delivery(&mut s, S5).await;
    assert!(
        t.elapsed() >= Duration::from_millis(1300),
        "retry_after honoured"
    );
    assert_eq!(third.job.as_ref().unwrap().attempt, 3);

    // No retry_after: the queue's backoff (base 1 s, attempt 3 → 4 s × [0.5, 1)).
    c.nack(nack(&third, None)).await.unwrap();
    let t = Instant::now();
    let fourth = next_delivery(&mut s, Duration::from_secs(6)).await;
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(1800) && waited <= Duration::from_millis(4500),
        "backoff {waited:?}"
    );
    ack(&mut c, &fourth).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_after_max_attempts_or_on_request() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut req = job("dlq", "x");
    req.max_attempts = 2;
    let id = c.enqueue(req).await.unwrap().into_inner().job_id;
    let give_up = enqueue(&mut c, "dlq", "y").await;
    let mut s = subscribe(&mut c, &["dlq"], 4, None).await;
    let mut dead = HashSet::new();
    while dead.len() < 2 {
        let d = next_delivery(&mut s, S5).await;
        let jid = id_of(&d);
        let r = c
            .nack(pb::NackRequest {
                job_id: jid.clone(),
                lease_token: d.lease_token.clone(),
                error: format!("fail {}", d.job.as_ref().unwrap().attempt),
                retry_after: Some(dur(Duration::ZERO)),
                dead_letter: jid == give_up,
            })
            .await
            .unwrap()
            .into_inner();
        if jid == id {
            assert_eq!(r.dead_lettered, d.job.as_ref().unwrap().attempt == 2);
        } else {
            assert!(r.dead_lettered);
        }
        if r.dead_lettered {
            dead.insert(jid);
        }
    }
    let rows: Vec<(String, String, i32, Option<String>)> = sqlx::query_as(
        "select id::text, reason, attempt, last_error from leaseq.dead_jobs order by reason",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            (id.clone(), "max_attempts".into(), 2, Some("fail 2".into())),
            (give_up.clone(), "nacked".into(), 1, Some("fail 1".into())),
        ]
    );
    assert_eq!(db.live_jobs().await, 0);
    assert!(
        try_next_delivery(&mut s, Duration::from_millis(500))
            .await
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_on_the_last_attempt_dead_letters() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut req = job("dlq2", "x");
    req.max_attempts = 1;
    c.enqueue(req).await.unwrap();
    let mut s = subscribe(&mut c, &["dlq2"], 1, Some(Duration::from_secs(1))).await;
    next_delivery(&mut s, S5).await;
    let deadline = Instant::now() + S5;
    while db.dead_jobs().await == 0 {
        assert!(
            Instant::now() < deadline,
            "dead-lettered after lease expiry"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(db.live_jobs().await, 0);
    assert!(
        try_next_delivery(&mut s, Duration::from_millis(300))
            .await
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_jobs_arrive_at_run_at_without_polling() {
    let db = TestDb::new().await;
    let broker = TestBroker::start_with(&db, |c| c.poll_interval = Duration::from_secs(60)).await;
    let mut c = broker.client().await;
    let mut s = subscribe(&mut c, &["later"], 4, None).await;
    let mut req = job("later", "delayed");
    req.delay = Some(dur(Duration::from_millis(1500)));
    let t = Instant::now();
    c.enqueue(req).await.unwrap();
    let mut past = job("later", "past");
    past.run_at = Some(prost_types::Timestamp {
        seconds: 1_000_000_000,
        nanos: 0,
    });
    c.enqueue(past).await.unwrap();
    let first = next_delivery(&mut s, S5).await;
    assert_eq!(first.job.as_ref().unwrap().payload, b"past");
    assert!(t.elapsed() < Duration::from_millis(1000));
    let d = next_delivery(&mut s, S5).await;
    let waited = t.elapsed();
    assert_eq!(d.job.as_ref().unwrap().payload, b"delayed");
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_millis(2600),
        "delivered at run_at, waited {waited:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_then_enqueue_order() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    for (p, name) in [(0, "p0"), (5, "p5a"), (1, "p1"), (5, "p5b"), (-1, "pm1")] {
        let mut r = job("prio", name);
        r.priority = p;
        c.enqueue(r).await.unwrap();
    }
    let mut s = subscribe(&mut c, &["prio"], 1, None).await;
    let mut order = Vec::new();
    for _ in 0..5 {
        let d = next_delivery(&mut s, S5).await;
        order.push(String::from_utf8(d.job.clone().unwrap().payload).unwrap());
        ack(&mut c, &d).await.unwrap();
    }
    assert_eq!(order, ["p5a", "p5b", "p1", "p0", "pm1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_queue_does_not_starve_a_quiet_one() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let batch = |q: &str, n: usize| pb::EnqueueBatchRequest {
        jobs: (0..n).map(|i| job(q, &format!("{q}{i}"))).collect(),
    };
    c.enqueue_batch(batch("busy", 50)).await.unwrap();
    c.enqueue_batch(batch("quiet", 5)).await.unwrap();
    let mut s = subscribe(&mut c, &["busy", "quiet"], 2, None).await;
    let mut quiet_seen = 0;
    for _ in 0..15 {
        let d = next_delivery(&mut s, S5).await;
        if d.job.as_ref().unwrap().queue == "quiet" {
            quiet_seen += 1;
        }
        ack(&mut c, &d).await.unwrap();
    }
    assert_eq!(quiet_seen, 5, "all of the quiet queue within the first 15");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_is_race_free_and_frees_the_key_when_settled() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let c = broker.client().await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..20 {
        let mut c = c.clone();
        calls.spawn(async move {
            let mut r = job("dd", &format!("{i}"));
            r.dedup_key = "order-42".into();
            c.enqueue(r).await.unwrap().into_inner()
        });
    }
    let mut ids = HashSet::new();
    let mut originals = 0;
    while let Some(r) = calls.join_next().await {
        let r = r.unwrap();
        ids.insert(r.job_id);
        originals += usize::from(!r.duplicate);
    }
    assert_eq!(ids.len(), 1);
    assert_eq!(originals, 1);
    assert_eq!(db.live_jobs().await, 1);

    // Same key in one batch, and in another queue.
    let mut c = c.clone();
    let with_key = |q: &str| {
        let mut r = job(q, "b");
        r.dedup_key = "k".into();
        r
    };
    let res = c
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: vec![with_key("dd2"), with_key("dd2"), with_key("dd3")],
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(res[1].job_id, res[0].job_id);
    assert!(!res[0].duplicate && res[1].duplicate && !res[2].duplicate);
    assert_ne!(res[2].job_id, res[0].job_id);

    // Once the job is settled, the key makes a new job.
    let original = ids.into_iter().next().unwrap();
    let mut s = subscribe(&mut c, &["dd"], 1, None).await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(id_of(&d), original);
    ack(&mut c, &d).await.unwrap();
    let mut r = job("dd", "again");
    r.dedup_key = "order-42".into();
    let fresh = c.enqueue(r).await.unwrap().into_inner();
    assert!(!fresh.duplicate);
    assert_ne!(fresh.job_id, original);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_batch_is_ordered_and_all_or_nothing() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let jobs: Vec<_> = (0..5).map(|i| job("batch", &format!("{i}"))).collect();
    let res = c
        .enqueue_batch(pb::EnqueueBatchRequest { jobs })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(res.len(), 5);
    let mut bad: Vec<_> = (0..4).map(|i| job("batch", &format!("{i}"))).collect();
    bad[2].queue = "no spaces".into();
    let err = c
        .enqueue_batch(pb::EnqueueBatchRequest { jobs: bad })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("jobs[2].queue"), "{}", err.message());
    assert_eq!(db.live_jobs().await, 5);
    let mut s = subscribe(&mut c, &["batch"], 10, None).await;
    for r in &res {
        let d = next_delivery(&mut s, S5).await;
        assert_eq!(&id_of(&d), &r.job_id, "delivered in enqueue order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stream_releases_its_jobs_at_once() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    for i in 0..3 {
        enqueue(&mut c, "rel", &format!("{i}")).await;
    }
    let mut gone = broker.client().await;
    let mut s = subscribe(&mut gone, &["rel"], 3, Some(Duration::from_secs(60))).await;
    let mut held = HashSet::new();
    for _ in 0..3 {
        held.insert(id_of(&next_delivery(&mut s, S5).await));
    }
    drop(s);
    drop(gone);
    let mut s2 = subscribe(&mut c, &["rel"], 3, Some(Duration::from_secs(60))).await;
    let t = Instant::now();
    let mut again = HashSet::new();
    for _ in 0..3 {
        let d = next_delivery(&mut s2, Duration::from_secs(3)).await;
        assert_eq!(d.job.as_ref().unwrap().attempt, 2);
        again.insert(id_of(&d));
    }
    assert_eq!(again, held);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "long before the 60 s lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_credit_and_wake_each_other() {
    let db = TestDb::new().await;
    let slow_poll = |c: &mut leaseq::config::ServeArgs| c.poll_interval = Duration::from_secs(60);
    let a = TestBroker::start_with(&db, slow_poll).await;
    let b = TestBroker::start_with(&db, slow_poll).await;
    let mut ca = a.client().await;
    let mut cb = b.client().await;
    let mut s = subscribe(&mut ca, &["rep"], 1, Some(Duration::from_secs(60))).await;
    // An enqueue on B wakes the stream on A through NOTIFY.
    let t = Instant::now();
    enqueue(&mut cb, "rep", "1").await;
    let d1 = next_delivery(&mut s, Duration::from_secs(2)).await;
    assert!(t.elapsed() < Duration::from_secs(1), "woken by NOTIFY");
    enqueue(&mut cb, "rep", "2").await;
    assert!(
        try_next_delivery(&mut s, Duration::from_millis(500))
            .await
            .is_none()
    );
    // Ack through B: the stream on A gets its credit back.
    ack(&mut cb, &d1).await.unwrap();
    let d2 = next_delivery(&mut s, Duration::from_secs(2)).await;
    assert_eq!(d2.job.as_ref().unwrap().payload, b"2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_past_their_ttl_are_dead_lettered_as_expired() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut r = job("ttl", "x");
    r.ttl = Some(dur(Duration::from_secs(1)));
    c.enqueue(r).await.unwrap();
    let deadline = Instant::now() + S5;
    while db.dead_jobs().await == 0 {
        assert!(Instant::now() < deadline, "expired within 5s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reason: String = sqlx::query_scalar("select reason from leaseq.dead_jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(reason, "expired");
    let mut s = subscribe(&mut c, &["ttl"], 1, None).await;
    assert!(
        try_next_delivery(&mut s, Duration::from_millis(500))
            .await
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_resumes_after_the_listen_connection_is_killed() {
    let db = TestDb::new().await;
    let a = TestBroker::start_with(&db, |c| c.poll_interval = Duration::from_secs(60)).await;
    let b = TestBroker::start(&db).await;
    let mut ca = a.client().await;
    let mut cb = b.client().await;
    let mut s = subscribe(&mut ca, &["listen"], 4, None).await;
    let killed: i64 = sqlx::query_scalar(
        "select count(pg_terminate_backend(pid)) from pg_stat_activity
         where datname = current_database() and query ilike 'listen%'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(killed >= 1, "found LISTEN connections to kill");
    // Give the listener a moment to notice and reconnect, then only NOTIFY
    // (from B) can wake A's stream.
    tokio::time::sleep(Duration::from_millis(500)).await;
    enqueue(&mut cb, "listen", "after").await;
    let d = next_delivery(&mut s, Duration::from_secs(3)).await;
    assert_eq!(d.job.as_ref().unwrap().payload, b"after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_streams_get_heartbeats() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut s = subscribe(&mut c, &["hb"], 1, None).await;
    let t = Instant::now();
    let mut beats = 0;
    while t.elapsed() < Duration::from_millis(1600) {
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(200), s.message())
            .await
            .unwrap_or(Ok(None))
            && matches!(m.kind, Some(pb::subscribe_response::Kind::Heartbeat(_)))
        {
            beats += 1;
        }
    }
    assert!(beats >= 2, "{beats} heartbeats in 1.6s at a 500ms interval");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_do_not_grow_with_streams() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut streams = Vec::new();
    for i in 0..50 {
        let mut c = broker.client().await;
        streams.push(subscribe(&mut c, &[&format!("q{}", i % 5)], 2, None).await);
    }
    let mut c = broker.client().await;
    enqueue(&mut c, "q0", "x").await;
    let conns = db
        .count("select count(*) from pg_stat_activity where datname = current_database()")
        .await;
    // Pool (5) + LISTEN (1) + this test's own pool (≤ 4).
    assert!(conns <= 10, "{conns} connections for 50 streams");
}
