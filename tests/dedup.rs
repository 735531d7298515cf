//! Unique for a window and debounce (issue 34, item 4): a dedup key held
//! for `unique_for` after its job completes, and `on_duplicate = REPLACE`
//! replacing a waiting job's payload. Real gRPC to in-process brokers, a
//! real PostgreSQL, a fresh database per test.
//!
//! The rules (README "Semantics", De-duplication): only a completed job
//! holds its key after it ends (a dead letter, a cancel or an expiry frees
//! it); the window counts from the ack; PurgeQueue drops the queue's holds;
//! a REPLACE changes a waiting job only, never a leased one. Windows that
//! must pass are passed by moving the hold's `until` in the database, or,
//! where the real clock is the point, by polling with a bounded deadline:
//! no assertion depends on how fast the machine is.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use uuid::Uuid;

/// How long a delivery may take on a loaded machine (a bound, not a timing).
const WAIT: Duration = Duration::from_secs(15);
const HOUR: Duration = Duration::from_secs(3600);

fn keyed(queue: &str, payload: &str, key: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        dedup_key: key.into(),
        ..job(queue, payload)
    }
}

fn windowed(queue: &str, payload: &str, key: &str, window: Duration) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        unique_for: Some(dur(window)),
        ..keyed(queue, payload, key)
    }
}

fn replacing(queue: &str, payload: &str, key: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        on_duplicate: pb::OnDuplicate::Replace as i32,
        ..keyed(queue, payload, key)
    }
}

async fn enq(c: &mut Client, r: pb::EnqueueRequest) -> pb::EnqueueResponse {
    c.enqueue(r).await.expect("enqueue").into_inner()
}

/// The hold of (queue, key): (holding job, seconds left).
async fn hold(db: &TestDb, queue: &str, key: &str) -> Option<(Uuid, f64)> {
    sqlx::query_as(
        "select job_id, extract(epoch from until - now())::float8 from leaseq.dedup_holds \
         where queue = $1 and dedup_key = $2",
    )
    .bind(queue)
    .bind(key)
    .fetch_optional(&db.pool)
    .await
    .unwrap()
}

/// Ends a hold's window now, as if it had passed.
async fn pass_window(db: &TestDb, queue: &str, key: &str) {
    let n = sqlx::query(
        "update leaseq.dedup_holds set until = now() - interval '1 millisecond' \
         where queue = $1 and dedup_key = $2",
    )
    .bind(queue)
    .bind(key)
    .execute(&db.pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(n, 1, "a hold of {queue}/{key}");
}

async fn db_now(db: &TestDb) -> f64 {
    sqlx::query_scalar("select extract(epoch from clock_timestamp())::float8")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

async fn get_job(a: &mut Admin, id: &str) -> pb::JobInfo {
    a.get_job(pb::GetJobRequest { job_id: id.into() })
        .await
        .expect("get_job")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_job_holds_its_key_for_the_window_then_frees_it() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|c| c.retention_interval = Duration::from_millis(100))
        .start()
        .await;
    let mut c = broker.client().await;
    let first = enq(&mut c, windowed("uw", "first", "order-7", HOUR)).await;
    assert!(!first.duplicate && !first.replaced);
    let mut s = subscribe(&mut c, &["uw"], 1, Some(Duration::from_secs(30))).await;
    let d = next_delivery(&mut s, WAIT).await;
    assert_eq!(id_of(&d), first.job_id);
    assert!(
        hold(&db, "uw", "order-7").await.is_none(),
        "no hold while live"
    );

    let before = db_now(&db).await;
    ack(&mut c, &d).await.unwrap();
    let after = db_now(&db).await;
    let (holder, _) = hold(&db, "uw", "order-7")
        .await
        .expect("a hold after the ack");
    assert_eq!(holder.to_string(), first.job_id);
    // The window counts from the ack: until = ack + 1 h.
    let until_at: f64 =
        sqlx::query_scalar("select extract(epoch from until)::float8 from leaseq.dedup_holds")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        until_at >= before + 3600.0 - 0.01 && until_at <= after + 3600.0 + 0.01,
        "until {until_at} not 1 h after the ack ({before}..{after})"
    );

    // Held: a duplicate answered with the completed job's id, nothing new.
    for payload in ["again", "and again"] {
        let r = enq(&mut c, keyed("uw", payload, "order-7")).await;
        assert!(r.duplicate, "{payload}: the key is held");
        assert!(!r.replaced);
        assert_eq!(r.job_id, first.job_id);
    }
    // REPLACE meets a held key as KEEP does: there is no waiting job.
    let r = enq(&mut c, replacing("uw", "replace", "order-7")).await;
    assert!(r.duplicate && !r.replaced);
    assert_eq!(r.job_id, first.job_id);
    // In a batch, and through the one-job statement with a stream waiting
    // (the hand-off path): the same.
    let b = c
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: vec![keyed("uw", "b0", "order-7"), keyed("uw", "b1", "other")],
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert!(b[0].duplicate);
    assert_eq!(b[0].job_id, first.job_id);
    assert!(!b[1].duplicate, "another key is not held");
    let other = next_delivery(&mut s, WAIT).await;
    assert_eq!(payload_of(&other), "b1");
    ack(&mut c, &other).await.unwrap();
    assert!(
        hold(&db, "uw", "other").await.is_none(),
        "a job without a window holds nothing"
    );
    // Another queue's key of the same name is not held.
    let r = enq(&mut c, keyed("uw2", "elsewhere", "order-7")).await;
    assert!(!r.duplicate);
    assert_eq!(db.live_jobs().await, 1);

    // The window passes: the key is free, and the retention loop deletes
    // the hold.
    pass_window(&db, "uw", "order-7").await;
    let fresh = enq(&mut c, keyed("uw", "after the window", "order-7")).await;
    assert!(!fresh.duplicate);
    assert_ne!(fresh.job_id, first.job_id);
    until(
        &db,
        "select not exists (select 1 from leaseq.dedup_holds)",
        Duration::from_secs(10),
    )
    .await;
    let d = next_delivery(&mut s, WAIT).await;
    assert_eq!(payload_of(&d), "after the window");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_window_ends_by_the_database_clock() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let first = enq(
        &mut c,
        windowed("us", "first", "k", Duration::from_millis(300)),
    )
    .await;
    let mut s = subscribe(&mut c, &["us"], 1, Some(Duration::from_secs(30))).await;
    let d = next_delivery(&mut s, WAIT).await;
    ack(&mut c, &d).await.unwrap();
    let (_, left) = hold(&db, "us", "k").await.expect("held");
    assert!(left <= 0.3, "{left}s left of a 300 ms window");
    // Free within a bounded time; until then every answer is the holder.
    eventually(Duration::from_secs(10), "the 300 ms window ended", || {
        let mut c = c.clone();
        let first = first.job_id.clone();
        async move {
            let r = enq(&mut c, keyed("us", "next", "k")).await;
            if r.duplicate {
                assert_eq!(r.job_id, first);
            }
            !r.duplicate
        }
    })
    .await;
    let d = next_delivery(&mut s, WAIT).await;
    assert_eq!(payload_of(&d), "next");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_cancels_and_expiries_free_the_key() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let mut s = subscribe(&mut c, &["ud"], 1, Some(Duration::from_secs(30))).await;

    // A retry keeps the job live: still a duplicate; a dead letter frees it.
    let j = enq(&mut c, windowed("ud", "dlq", "k-dlq", HOUR)).await;
    let d = next_delivery(&mut s, WAIT).await;
    c.nack(crate::common::consume::nack_of(
        &d,
        "retry",
        Some(Duration::from_millis(1)),
        false,
    ))
    .await
    .unwrap();
    let r = enq(&mut c, keyed("ud", "x", "k-dlq")).await;
    assert!(r.duplicate, "a job waiting to retry is live");
    let d = next_delivery(&mut s, WAIT).await;
    assert_eq!(id_of(&d), j.job_id);
    nack_dead(&mut c, &d, "bad input").await;
    assert!(hold(&db, "ud", "k-dlq").await.is_none());
    let r = enq(&mut c, windowed("ud", "corrected", "k-dlq", HOUR)).await;
    assert!(!r.duplicate, "a dead letter holds nothing");
    let d = next_delivery(&mut s, WAIT).await;
    assert_eq!(payload_of(&d), "corrected");
    ack(&mut c, &d).await.unwrap();
    assert!(hold(&db, "ud", "k-dlq").await.is_some());

    // Cancelled, waiting: frees the key.
    let j = enq(
        &mut c,
        pb::EnqueueRequest {
            delay: Some(dur(HOUR)),
            ..windowed("ud", "cancel me", "k-cancel", HOUR)
        },
    )
    .await;
    a.cancel_job(pb::CancelJobRequest {
        job_id: j.job_id.clone(),
    })
    .await
    .unwrap();
    assert!(hold(&db, "ud", "k-cancel").await.is_none());
    let r = enq(&mut c, keyed("ud", "after cancel", "k-cancel")).await;
    assert!(!r.duplicate, "a cancelled job holds nothing");

    // Expired (ttl): dead-lettered with reason `expired`, holds nothing.
    drop(s);
    let j = enq(
        &mut c,
        pb::EnqueueRequest {
            ttl: Some(dur(Duration::from_millis(200))),
            ..windowed("ue", "too late", "k-ttl", HOUR)
        },
    )
    .await;
    eventually(Duration::from_secs(15), "the job expired", || {
        let db = &db;
        let id = j.job_id.clone();
        async move { db.dead_row(&id).await.is_some() }
    })
    .await;
    assert!(hold(&db, "ue", "k-ttl").await.is_none());
    let r = enq(&mut c, keyed("ue", "after expiry", "k-ttl")).await;
    assert!(!r.duplicate, "an expired job holds nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_queue_drops_the_holds() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    enq(&mut c, windowed("up", "p", "k", HOUR)).await;
    enq(&mut c, windowed("up-other", "p", "k", HOUR)).await;
    let mut s = subscribe(
        &mut c,
        &["up", "up-other"],
        2,
        Some(Duration::from_secs(30)),
    )
    .await;
    for d in take(&mut s, 2, WAIT).await {
        ack(&mut c, &d).await.unwrap();
    }
    assert!(enq(&mut c, keyed("up", "held", "k")).await.duplicate);
    a.purge_queue(pb::PurgeQueueRequest { queue: "up".into() })
        .await
        .unwrap();
    assert!(hold(&db, "up", "k").await.is_none());
    assert!(
        hold(&db, "up-other", "k").await.is_some(),
        "another queue's hold stays"
    );
    assert!(!enq(&mut c, keyed("up", "after purge", "k")).await.duplicate);
}

/// The ack and the follow-ups of an ack carry the window: leaseq.ack() in
/// SQL writes the hold as the broker's ack does, and a follow-up
/// (AckRequest.enqueue) with `unique_for` holds its key once acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_ack_and_follow_ups_hold_keys_too() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let j = enq(&mut c, windowed("uq", "by sql", "k-sql", HOUR)).await;
    let mut s = subscribe(&mut c, &["uq"], 1, Some(Duration::from_secs(30))).await;
    let d = next_delivery(&mut s, WAIT).await;
    sqlx::query("select leaseq.ack($1::uuid, $2)")
        .bind(&j.job_id)
        .bind(&d.lease_token)
        .execute(&db.pool)
        .await
        .unwrap();
    let (holder, _) = hold(&db, "uq", "k-sql")
        .await
        .expect("held by leaseq.ack()");
    assert_eq!(holder.to_string(), j.job_id);

    enq(&mut c, job("uq", "parent")).await;
    let d = next_delivery(&mut s, WAIT).await;
    let resp = c
        .ack(pb::AckRequest {
            job_id: id_of(&d),
            lease_token: d.lease_token.clone(),
            enqueue: vec![
                windowed("uq", "child", "k-child", HOUR),
                // Held by the SQL-acked job: the follow-up is that job.
                keyed("uq", "dup child", "k-sql"),
            ],
            result: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.enqueued[1], j.job_id);
    let d = next_delivery(&mut s, WAIT).await;
    assert_eq!(payload_of(&d), "child");
    assert_eq!(id_of(&d), resp.enqueued[0]);
    ack(&mut c, &d).await.unwrap();
    assert!(enq(&mut c, keyed("uq", "again", "k-child")).await.duplicate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_gives_a_waiting_job_the_new_payload_and_resets_its_delay() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let first = enq(
        &mut c,
        pb::EnqueueRequest {
            delay: Some(dur(Duration::from_secs(600))),
            headers: HashMap::from([("v".into(), "1".into())]),
            max_attempts: 7,
            ..keyed("ur", "v1", "doc-1")
        },
    )
    .await;
    assert!(!first.duplicate);
    let before = get_job(&mut a, &first.job_id).await;
    assert_eq!(before.payload, b"v1");

    // Trailing-edge debounce: the job now runs `delay` after this enqueue.
    let t0 = db_now(&db).await;
    let r = enq(
        &mut c,
        pb::EnqueueRequest {
            delay: Some(dur(Duration::from_secs(1200))),
            headers: HashMap::from([("v".into(), "2".into())]),
            priority: 5,
            ..replacing("ur", "v2", "doc-1")
        },
    )
    .await;
    let t1 = db_now(&db).await;
    assert!(r.duplicate && r.replaced, "{r:?}");
    assert_eq!(r.job_id, first.job_id);
    let after = get_job(&mut a, &first.job_id).await;
    assert_eq!(after.payload, b"v2");
    assert_eq!(after.headers.get("v").map(String::as_str), Some("2"));
    assert_eq!(after.priority, 5);
    assert_eq!(after.max_attempts, 7, "max_attempts is the first job's");
    let run_at = after.run_at.expect("run_at");
    let run_at = run_at.seconds as f64 + f64::from(run_at.nanos) / 1e9;
    assert!(
        run_at >= t0 + 1200.0 - 0.01 && run_at <= t1 + 1200.0 + 0.01,
        "run_at {run_at} is not 1200 s after the replace ({t0}..{t1})"
    );
    assert_eq!(db.live_jobs().await, 1);

    // Replaced to run now: the consumer gets the new payload at once.
    let mut s = subscribe(&mut c, &["ur"], 1, Some(Duration::from_secs(30))).await;
    assert_quiet(&mut s, Duration::from_millis(300), "the job is delayed").await;
    let r = enq(&mut c, replacing("ur", "v3", "doc-1")).await;
    assert!(r.replaced);
    let d = next_delivery(&mut s, WAIT).await;
    assert_eq!(id_of(&d), first.job_id);
    assert_eq!(payload_of(&d), "v3");
    assert!(
        job_of(&d).headers.is_empty(),
        "the headers are the new ones"
    );

    // Leased: left as it is, answered as KEEP (replaced = false).
    let r = enq(&mut c, replacing("ur", "v4", "doc-1")).await;
    assert!(r.duplicate && !r.replaced, "{r:?}");
    assert_eq!(r.job_id, first.job_id);
    let leased = get_job(&mut a, &first.job_id).await;
    assert_eq!(leased.payload, b"v3", "a leased job keeps its payload");
    ack(&mut c, &d).await.unwrap();
    assert_eq!(db.live_jobs().await, 0, "the refused payload made no job");
    assert_quiet(&mut s, Duration::from_millis(300), "nothing else").await;

    // No job of the key: REPLACE inserts one.
    let r = enq(&mut c, replacing("ur", "v5", "doc-1")).await;
    assert!(!r.duplicate && !r.replaced);
    assert_ne!(r.job_id, first.job_id);
    assert_eq!(payload_of(&next_delivery(&mut s, WAIT).await), "v5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_resolves_its_jobs_of_one_key_in_order() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let res = c
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: vec![
                keyed("ub", "a1", "k"),
                replacing("ub", "a2", "k"),
                keyed("ub", "a3", "k"),
                replacing("ub", "a4", "k"),
                replacing("ub", "b1", "other"),
            ],
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    let id = res[0].job_id.clone();
    assert!(!res[0].duplicate);
    for (i, want_replaced) in [(1, true), (2, false), (3, true)] {
        assert_eq!(res[i].job_id, id, "jobs[{i}]");
        assert!(res[i].duplicate, "jobs[{i}]");
        assert_eq!(res[i].replaced, want_replaced, "jobs[{i}]");
    }
    assert!(!res[4].duplicate && !res[4].replaced);
    assert_eq!(
        get_job(&mut a, &id).await.payload,
        b"a4",
        "the last REPLACE wins"
    );
    assert_eq!(db.live_jobs().await, 2);
}

/// Many REPLACE enqueues of one key at once, with and without a job of the
/// key to begin with: every call answers, one job exists, and it holds one
/// of the payloads sent; exactly one call created it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replaces_of_one_key_make_one_job() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let c = broker.client().await;
    let mut a = admin(&broker).await;
    for round in 0..3 {
        let queue = format!("uc{round}");
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..32 {
            let mut c = c.clone();
            let queue = queue.clone();
            calls.spawn(async move {
                let mut r = replacing(&queue, &format!("p{i}"), "k");
                // Delayed: no stream leases it meanwhile.
                r.delay = Some(dur(HOUR));
                enq(&mut c, r).await
            });
        }
        let mut ids = HashSet::new();
        let mut created = 0;
        while let Some(r) = calls.join_next().await {
            let r = r.unwrap();
            ids.insert(r.job_id.clone());
            if r.duplicate {
                assert!(r.replaced, "a waiting job is always replaced: {r:?}");
            } else {
                created += 1;
            }
        }
        assert_eq!(ids.len(), 1, "{ids:?}");
        assert_eq!(created, 1);
        let id = ids.into_iter().next().unwrap();
        let payload = String::from_utf8(get_job(&mut a, &id).await.payload).unwrap();
        assert!(payload.starts_with('p'), "{payload}");
    }
    assert_eq!(db.live_jobs().await, 3);
}

/// A writer replacing one key's payload with 1, 2, 3, ... (each after the
/// last answered, each with a new delay: a debounce) while a consumer
/// leases and acks the key's jobs as fast as they come. A job's delivered payload is always the last one a
/// replace of that job answered OK for (or that created it): no lease
/// carries a payload older than a replace that answered, and once a job
/// is leased no replace answers `replaced` for it. Every job created is
/// delivered once (nothing is lost); a payload sent while the key's job
/// was leased is answered `replaced = false` and makes no job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaces_racing_leases_never_deliver_a_stale_payload() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut s = subscribe(&mut c, &["ul"], 4, Some(Duration::from_secs(30))).await;
    const N: u32 = 300;
    let mut writer = c.clone();
    let mut write = tokio::spawn(async move {
        // job id -> the payloads answered for it, in order.
        let mut written: HashMap<String, Vec<u32>> = HashMap::new();
        let mut refused = 0;
        for n in 1..=N {
            // Mostly short delays (0-20 ms: the job is leased between two
            // writes, or as one replaces it); ten writes in fifty with an
            // hour, so that some replaces surely find the job waiting.
            let delay = if (1..=10).contains(&(n % 50)) {
                HOUR
            } else {
                Duration::from_millis(u64::from(n % 5) * 5)
            };
            let r = enq(
                &mut writer,
                pb::EnqueueRequest {
                    delay: Some(dur(delay)),
                    ..replacing("ul", &n.to_string(), "k")
                },
            )
            .await;
            if !r.duplicate || r.replaced {
                written.entry(r.job_id).or_default().push(n);
            } else {
                refused += 1;
            }
        }
        (written, refused)
    });
    let mut delivered: HashMap<String, u32> = HashMap::new();
    let mut written = None;
    let mut acks = tokio::task::JoinSet::new();
    loop {
        if let Some((w, _)) = &written
            && delivered.len() >= HashMap::len(w)
        {
            break;
        }
        tokio::select! {
            d = try_next_delivery(&mut s, Duration::from_secs(30)) => {
                let d = d.expect("a delivery within 30 s");
                let n: u32 = payload_of(&d).parse().unwrap();
                assert!(delivered.insert(id_of(&d), n).is_none(), "a job delivered twice");
                // Acks race the next replaces.
                let mut c = c.clone();
                acks.spawn(async move { ack(&mut c, &d).await.unwrap() });
            }
            w = &mut write, if written.is_none() => written = Some(w.unwrap()),
        }
    }
    while let Some(r) = acks.join_next().await {
        r.unwrap();
    }
    let (written, refused) = written.unwrap();
    for (id, n) in &delivered {
        let w = written.get(id).expect("a delivered job was answered for");
        assert_eq!(
            n,
            w.last().unwrap(),
            "job {id}: delivered payload {n}, but replaces answered {w:?}"
        );
    }
    assert_eq!(
        delivered.len(),
        written.len(),
        "every job created was delivered"
    );
    let answered: usize = written.values().map(Vec::len).sum();
    assert_eq!(answered + refused, N as usize);
    assert!(
        answered > written.len(),
        "some replaces found a waiting job ({answered} answers, {} jobs)",
        written.len()
    );
    assert_eq!(db.live_jobs().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_enqueue_function_takes_unique_for_and_on_duplicate() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let sql_enqueue = |payload: &'static str, opts: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, Uuid>(sqlx::AssertSqlSafe(format!(
                "select leaseq.enqueue('uf', convert_to($1, 'UTF8'), dedup_key => 'k'{opts})"
            )))
            .bind(payload)
            .fetch_one(&pool)
            .await
        }
    };
    let first = sql_enqueue("s1", ", delay => '1 hour', unique_for => '1 hour'")
        .await
        .unwrap();
    // on_duplicate null is 'keep': a waiting job is answered, unchanged.
    let kept = sql_enqueue("s1b", ", on_duplicate => null").await.unwrap();
    assert_eq!(kept, first);
    let same = sql_enqueue("s2", ", on_duplicate => 'replace'")
        .await
        .unwrap();
    assert_eq!(same, first, "replaced in place");
    let (payload, delayed): (Vec<u8>, bool) =
        sqlx::query_as("select payload, run_at > now() from leaseq.jobs where id = $1")
            .bind(first)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(payload, b"s2");
    assert!(!delayed, "no delay on the replace: runs now");
    let mut s = subscribe(&mut c, &["uf"], 1, Some(Duration::from_secs(30))).await;
    let d = next_delivery(&mut s, WAIT).await;
    assert_eq!(payload_of(&d), "s2");
    ack(&mut c, &d).await.unwrap();
    let held = sql_enqueue("s3", ", on_duplicate => null").await.unwrap();
    assert_eq!(
        held, first,
        "the window the first job asked for holds the key"
    );
    assert_eq!(db.live_jobs().await, 0);

    for (opts, text) in [
        (
            ", unique_for => '-1 second'",
            "unique_for: must not be negative",
        ),
        (", unique_for => '367 days'", "unique_for: must be at most"),
        (", on_duplicate => 'merge'", "on_duplicate: must be"),
    ] {
        let e = sql_enqueue("bad", opts).await.expect_err(opts);
        let d = e.as_database_error().unwrap();
        assert_eq!(d.code().as_deref(), Some("22023"), "{opts}");
        assert!(d.message().contains(text), "{opts}: {}", d.message());
    }
    for (call, text) in [
        (
            "select leaseq.enqueue('uf', ''::bytea, unique_for => '1 hour')",
            "unique_for: needs a dedup_key",
        ),
        (
            "select leaseq.enqueue('uf', ''::bytea, on_duplicate => 'replace')",
            "on_duplicate: replace needs a dedup_key",
        ),
    ] {
        let e = sqlx::query(call).execute(&db.pool).await.expect_err(call);
        assert!(e.to_string().contains(text), "{call}: {e}");
    }
}

/// An enqueue whose insert waits for the ack of the job holding its key
/// (the ack's transaction deleted the row and wrote the hold, and has not
/// committed): when the ack commits, the insert finds the key free in
/// jobs_dedup, but its snapshot is older than the hold. The enqueue still
/// answers with the completed job and leaves no new job (the check after
/// the insert, enqueue_held.sql), through gRPC and through
/// leaseq.enqueue().
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_waiting_on_the_ack_sees_the_hold_it_wrote() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    for via_sql in [false, true] {
        let queue = if via_sql { "uh-sql" } else { "uh" };
        let first = enq(&mut c, windowed(queue, "first", "k", HOUR)).await;
        let mut s = subscribe(&mut c, &[queue], 1, Some(Duration::from_secs(30))).await;
        let d = next_delivery(&mut s, WAIT).await;
        let mut tx = db.pool.begin().await.unwrap();
        sqlx::query("select leaseq.ack($1::uuid, $2)")
            .bind(&first.job_id)
            .bind(&d.lease_token)
            .execute(&mut *tx)
            .await
            .unwrap();
        let waiting = {
            let mut c = c.clone();
            let pool = db.pool.clone();
            let queue = queue.to_owned();
            tokio::spawn(async move {
                if via_sql {
                    let id: Uuid = sqlx::query_scalar(
                        "select leaseq.enqueue($1, 'second'::bytea, dedup_key => 'k')",
                    )
                    .bind(&queue)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                    (id.to_string(), None)
                } else {
                    let r = enq(&mut c, keyed(&queue, "second", "k")).await;
                    (r.job_id.clone(), Some(r))
                }
            })
        };
        eventually(
            WAIT,
            "the enqueue waits for the ack's transaction",
            || async { db.lock_waiters().await > 0 },
        )
        .await;
        tx.commit().await.unwrap();
        let (id, r) = waiting.await.unwrap();
        assert_eq!(
            id, first.job_id,
            "via_sql {via_sql}: answered with the holder"
        );
        if let Some(r) = r {
            assert!(r.duplicate);
        }
        assert_eq!(db.live_jobs().await, 0, "via_sql {via_sql}: no new job");
        assert_quiet(&mut s, Duration::from_millis(300), "no second job").await;
    }
}
