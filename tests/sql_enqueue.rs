//! `leaseq.enqueue(...)`, the SQL function for transactional enqueue (the
//! outbox pattern): a job exists iff the caller's transaction commits, a
//! commit wakes live streams through NOTIFY (the fallback poll is an hour in
//! these tests, so nothing else could deliver), input is validated like the
//! gRPC API, and dedup keys behave the same.

use std::time::Duration;

use crate::common::*;
use sqlx::Row;
use uuid::Uuid;

const S5: Duration = Duration::from_secs(5);

/// A broker whose fallback poll never fires during a test: only a NOTIFY
/// can wake its streams.
async fn broker_without_poll(db: &TestDb) -> TestBroker {
    TestBroker::on(db)
        .config(|c| c.poll_interval = Duration::from_secs(3600))
        .start()
        .await
}

async fn business_table(db: &TestDb) {
    sqlx::query("create table orders (id serial primary key, item text not null)")
        .execute(&db.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn commit_wakes_a_live_stream_and_rollback_leaves_nothing() {
    let db = TestDb::new().await;
    business_table(&db).await;
    let broker = broker_without_poll(&db).await;
    let mut client = broker.client().await;
    let mut stream = subscribe(&mut client, &["emails"], 4, None).await;

    // Rolled back: neither the order nor the job remains, and no wake-up is
    // sent. (Subscribe created the queue row already.)
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("insert into orders (item) values ('lost')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let lost: Uuid = sqlx::query_scalar("select leaseq.enqueue('emails', 'lost'::bytea)")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.count("select count(*) from orders").await, 0);
    assert_eq!(db.live_jobs().await, 0);

    // Committed: delivered promptly, with every field as given.
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("insert into orders (item) values ('book')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let id: Uuid = sqlx::query_scalar(
        "select leaseq.enqueue(queue => 'emails', payload => 'hello'::bytea, \
         headers => '{\"content-type\":\"text/plain\"}'::jsonb, priority => 7, \
         delay => interval '0', dedup_key => null, max_attempts => null, ttl => null)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_ne!(id, lost);
    // Not visible before the commit.
    assert!(
        try_next_delivery(&mut stream, Duration::from_millis(300))
            .await
            .is_none(),
        "an uncommitted job must not be delivered"
    );
    tx.commit().await.unwrap();
    let d = next_delivery(&mut stream, S5).await;
    let job = d.job.as_ref().unwrap();
    assert_eq!(job.id, id.to_string());
    assert_eq!(job.queue, "emails");
    assert_eq!(job.payload, b"hello");
    assert_eq!(job.priority, 7);
    assert_eq!(job.attempt, 1);
    assert_eq!(job.headers.get("content-type").unwrap(), "text/plain");
    ack(&mut client, &d).await.expect("ack");
    assert_eq!(db.live_jobs().await, 0);
    assert_eq!(db.count("select count(*) from orders").await, 1);
    broker.stop().await;
}

#[tokio::test]
async fn delayed_job_wakes_the_stream_when_due() {
    let db = TestDb::new().await;
    let broker = broker_without_poll(&db).await;
    let mut client = broker.client().await;
    let mut stream = subscribe(&mut client, &["later"], 4, None).await;
    let id: Uuid =
        sqlx::query_scalar("select leaseq.enqueue('later', 'x'::bytea, delay => interval '1 s')")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let d = next_delivery(&mut stream, S5).await;
    assert_eq!(d.job.as_ref().unwrap().id, id.to_string());
    // Not before its run_at (database clock).
    let early: bool = sqlx::query_scalar("select run_at > now() from leaseq.jobs where id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(!early, "delivered before run_at");
    broker.stop().await;
}

#[tokio::test]
async fn options_are_stored_like_grpc_enqueue() {
    let db = TestDb::new().await;
    let id: Uuid = sqlx::query_scalar(
        "select leaseq.enqueue('opts', '\\x00ff'::bytea, headers => '{\"a\":\"b\"}', \
         priority => -3, delay => interval '1 hour', dedup_key => 'k', max_attempts => 4, \
         ttl => interval '2 hours')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let row = sqlx::query(
        "select queue, state, priority, payload, headers::text as headers, max_attempts, \
         dedup_key, attempt, \
         extract(epoch from run_at - enqueued_at)::float8 as delay_s, \
         extract(epoch from expires_at - enqueued_at)::float8 as ttl_s \
         from leaseq.jobs where id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>("queue"), "opts");
    assert_eq!(row.get::<String, _>("state"), "available");
    assert_eq!(row.get::<i32, _>("priority"), -3);
    assert_eq!(row.get::<Vec<u8>, _>("payload"), vec![0u8, 0xff]);
    assert_eq!(row.get::<String, _>("headers"), r#"{"a": "b"}"#);
    assert_eq!(row.get::<Option<i32>, _>("max_attempts"), Some(4));
    assert_eq!(
        row.get::<Option<String>, _>("dedup_key").as_deref(),
        Some("k")
    );
    assert_eq!(row.get::<i32, _>("attempt"), 0);
    assert_eq!(row.get::<f64, _>("delay_s"), 3600.0);
    assert_eq!(row.get::<f64, _>("ttl_s"), 7200.0);

    // Zero means "not set", as on the wire.
    let id: Uuid = sqlx::query_scalar(
        "select leaseq.enqueue('opts', ''::bytea, dedup_key => '', max_attempts => 0, \
         ttl => interval '0')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let (max_attempts, dedup, expires): (
        Option<i32>,
        Option<String>,
        Option<chrono::DateTime<chrono::Utc>>,
    ) = sqlx::query_as("select max_attempts, dedup_key, expires_at from leaseq.jobs where id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!((max_attempts, dedup, expires), (None, None, None));
    // The queue row was created once, with defaults.
    assert_eq!(
        db.count("select count(*) from leaseq.queues where name = 'opts' and max_attempts = 20")
            .await,
        1
    );
}

#[tokio::test]
async fn bad_arguments_raise_naming_the_argument_and_insert_nothing() {
    let db = TestDb::new().await;
    let cases: &[(&str, &str, &str)] = &[
        ("null, 'x'", "queue: must be", "22023"),
        ("'', 'x'", "queue: must be", "22023"),
        ("'.a', 'x'", "queue: must be", "22023"),
        ("'a b', 'x'", "queue: must be", "22023"),
        ("'é', 'x'", "queue: must be", "22023"),
        ("'a' || chr(10), 'x'", "queue: must be", "22023"),
        ("repeat('q', 129), 'x'", "queue: must be", "22023"),
        ("'q', null", "payload: is required", "22023"),
        (
            "'q', decode(repeat('00', 1048577), 'hex')",
            "payload: is 1048577 bytes, the limit is 1048576 bytes",
            "54000",
        ),
        (
            "'q', 'x', headers => '[]'",
            "headers: must be a JSON object",
            "22023",
        ),
        (
            "'q', 'x', headers => '{\"a\":1}'",
            "headers[\"a\"]: must be a string",
            "22023",
        ),
        (
            "'q', 'x', headers => '{\"\":\"v\"}'",
            "headers: keys must not be empty",
            "22023",
        ),
        (
            "'q', 'x', headers => (select jsonb_object_agg(i::text, 'v') from generate_series(1, 65) i)",
            "headers: at most 64 entries",
            "22023",
        ),
        (
            "'q', 'x', headers => jsonb_build_object(repeat('k', 257), 'v')",
            "key: must be at most 256 bytes",
            "22023",
        ),
        (
            "'q', 'x', headers => jsonb_build_object('k', repeat('v', 16385))",
            "headers[\"k\"]: must be at most 16384 bytes",
            "22023",
        ),
        (
            "'q', 'x', priority => null",
            "priority: must not be null",
            "22023",
        ),
        (
            "'q', 'x', delay => interval '1 s', run_at => now()",
            "delay, run_at: set at most one of them",
            "22023",
        ),
        (
            "'q', 'x', delay => interval '-1 s'",
            "delay: must not be negative",
            "22023",
        ),
        (
            "'q', 'x', delay => interval '11 years'",
            "delay: must be at most",
            "22023",
        ),
        (
            "'q', 'x', run_at => 'infinity'",
            "run_at: must be between",
            "22023",
        ),
        (
            "'q', 'x', run_at => '1960-01-01'",
            "run_at: must be between",
            "22023",
        ),
        (
            "'q', 'x', dedup_key => repeat('k', 513)",
            "dedup_key: must be at most 512 bytes",
            "22023",
        ),
        (
            "'q', 'x', max_attempts => 1001",
            "max_attempts: must be 0",
            "22023",
        ),
        (
            "'q', 'x', max_attempts => -1",
            "max_attempts: must be 0",
            "22023",
        ),
        (
            "'q', 'x', ttl => interval '-1 s'",
            "ttl: must not be negative",
            "22023",
        ),
        (
            "'q', 'x', ttl => interval '11 years'",
            "ttl: must be at most",
            "22023",
        ),
    ];
    for (args, message, code) in cases {
        let err = sqlx::query(sqlx::AssertSqlSafe(format!(
            "select leaseq.enqueue({args})"
        )))
        .execute(&db.pool)
        .await
        .expect_err(args);
        let db_err = err
            .as_database_error()
            .unwrap_or_else(|| panic!("{args}: {err}"));
        assert!(
            db_err.message().starts_with(message) || db_err.message().contains(message),
            "{args}: got {:?}, want {message:?}",
            db_err.message()
        );
        assert_eq!(db_err.code().as_deref(), Some(*code), "{args}");
    }
    assert_eq!(db.live_jobs().await, 0);
    assert_eq!(db.count("select count(*) from leaseq.queues").await, 0);
}

#[tokio::test]
async fn dedup_returns_the_live_job_until_it_is_acked() {
    let db = TestDb::new().await;
    let broker = broker_without_poll(&db).await;
    let enqueue = |queue: &'static str, payload: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, Uuid>(
                "select leaseq.enqueue($1, convert_to($2, 'UTF8'), dedup_key => 'invoice-7')",
            )
            .bind(queue)
            .bind(payload)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let first = enqueue("billing", "one").await;
    assert_eq!(
        enqueue("billing", "two").await,
        first,
        "same key, same queue"
    );
    assert_ne!(enqueue("other", "three").await, first, "keys are per queue");
    assert_eq!(
        db.count("select count(*) from leaseq.jobs where queue = 'billing'")
            .await,
        1
    );

    // Still a duplicate while leased; free again once acked.
    let mut client = broker.client().await;
    let mut stream = subscribe(&mut client, &["billing"], 1, None).await;
    let d = next_delivery(&mut stream, S5).await;
    assert_eq!(d.job.as_ref().unwrap().payload, b"one");
    assert_eq!(enqueue("billing", "four").await, first);
    ack(&mut client, &d).await.expect("ack");
    let again = enqueue("billing", "five").await;
    assert_ne!(again, first);
    let d = next_delivery(&mut stream, S5).await;
    assert_eq!(d.job.as_ref().unwrap().id, again.to_string());
    assert_eq!(d.job.as_ref().unwrap().payload, b"five");
    broker.stop().await;
}

#[tokio::test]
async fn ids_are_v7_and_sort_in_enqueue_order() {
    let db = TestDb::new().await;
    let broker = broker_without_poll(&db).await;
    let mut tx = db.pool.begin().await.unwrap();
    let mut ids = Vec::new();
    for i in 0..40 {
        let id: Uuid =
            sqlx::query_scalar("select leaseq.enqueue('ordered', convert_to($1, 'UTF8'))")
                .bind(i.to_string())
                .fetch_one(&mut *tx)
                .await
                .unwrap();
        assert_eq!(id.get_version_num(), 7, "{id}");
        ids.push(id);
    }
    tx.commit().await.unwrap();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, ids, "ids sort in the order the calls were made");
    // Its timestamp is the database's now, to the second.
    let skew: f64 =
        sqlx::query_scalar("select abs(extract(epoch from clock_timestamp()) * 1000 - $1::float8)")
            .bind(ids[0].get_timestamp().unwrap().to_unix().0 as f64 * 1000.0)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(skew < 60_000.0, "uuid timestamp off by {skew} ms");

    // Same priority and run_at (one transaction): delivered in id order.
    let mut client = broker.client().await;
    let mut stream = subscribe(&mut client, &["ordered"], 40, None).await;
    for (i, id) in ids.iter().enumerate() {
        let d = next_delivery(&mut stream, S5).await;
        assert_eq!(d.job.as_ref().unwrap().id, id.to_string(), "delivery {i}");
    }
    broker.stop().await;
}
