//! Exactly-once effects in the Rust client (issue 34 item 5, the SDK
//! side): a handler's `Ack::then` follow-ups travel with its ack
//! (`AckRequest.enqueue`), and `Ack::settled_in_sql` says the handler acked
//! its job in SQL itself (`leaseq.ack`), so the worker sends nothing and the
//! broker gives the credit back on its settle notice. Against in-process
//! brokers over real gRPC and a real PostgreSQL; the broker's side is
//! tests/ack_enqueue.rs and tests/sql_ack.rs (kill -9 between every two
//! steps of an SQL ack).

use std::time::Duration;

use crate::common::{TestBroker, TestDb, until};
use leaseq_client::{Ack, Client, DeadLetter, Delivery, Job, Task, Worker};

/// The crate's exactly_once example, compiled into this test.
#[allow(dead_code)]
mod example {
    include!("../crates/client/examples/exactly_once.rs");
}

const S20: Duration = Duration::from_secs(20);

use crate::common::serving::{Serving, n};

async fn count(db: &TestDb, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&db.pool).await.unwrap()
}

fn text(job: &Delivery) -> String {
    String::from_utf8_lossy(&job.payload).into_owned()
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    order: String,
}

const RECEIPTS: Task<Receipt> = Task::new("receipts");

/// Follow-ups on the Consume stream, and through the Subscribe + unary
/// fallback (`stream_acks(false)`: AckBatch cannot carry them, so the
/// worker sends those acks as unary Acks).
#[tokio::test]
async fn follow_ups_exist_once_the_handler_returns_and_the_parent_is_gone() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let client = Client::connect(broker.url()).await.unwrap();
    for stream_acks in [true, false] {
        sqlx::query("delete from leaseq.jobs")
            .execute(&db.pool)
            .await
            .unwrap();
        client
            .enqueue_batch((0..5).map(|i| Job::new("orders", format!("o-{i}"))))
            .await
            .unwrap();
        // A plain ack beside them keeps the batched path.
        client.enqueue(Job::new("orders", "plain")).await.unwrap();
        let worker = Worker::builder(client.clone())
            .stream_acks(stream_acks)
            .handle("orders", |job: Delivery| async move {
                let order = text(&job);
                if order == "plain" {
                    return Ok::<_, anyhow::Error>(Ack::new());
                }
                Ok(Ack::new()
                    .then(Job::new("emails", format!("mail {order}")))
                    .then(RECEIPTS.job(&Receipt { order })?))
            });
        let serving = Serving::start(worker);
        until(
            &db,
            "select not exists (select 1 from leaseq.jobs where queue = 'orders')",
            S20,
        )
        .await;
        let stats = serving.stop().await;
        // Every follow-up, once, and nothing else.
        assert_eq!(
            count(
                &db,
                "select count(*) from leaseq.jobs where queue = 'emails'"
            )
            .await,
            5
        );
        let receipts: Vec<serde_json::Value> = sqlx::query_scalar(
            "select r from (select convert_from(payload, 'UTF8')::jsonb as r from leaseq.jobs \
             where queue = 'receipts') j order by r->>'order'",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap();
        assert_eq!(receipts.len(), 5);
        assert_eq!(receipts[0], serde_json::json!({"order": "o-0"}));
        assert_eq!(
            (n(&stats.acked), n(&stats.follow_ups), n(&stats.nacked)),
            (6, 10, 0),
            "stream_acks {stream_acks}: {stats:?}"
        );
        if stream_acks {
            assert_eq!(n(&stats.settled_on_stream), 6, "{stats:?}");
        } else {
            // The five with follow-ups by unary Ack, the plain one batched.
            assert_eq!(
                (n(&stats.settled_unary), n(&stats.settled_batched)),
                (5, 1),
                "{stats:?}"
            );
        }
    }
    broker.stop().await;
}

/// An Ack made and then dropped for an error (or a panic) enqueues nothing:
/// the follow-ups go only with the ack.
#[tokio::test]
async fn a_handler_that_fails_after_asking_for_follow_ups_enqueues_none() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let client = Client::connect(broker.url()).await.unwrap();
    for p in ["error", "panic"] {
        client
            .enqueue(Job::new("orders", p).max_attempts(1))
            .await
            .unwrap();
    }
    let worker = Worker::builder(client.clone()).handle("orders", |job: Delivery| async move {
        let ack = Ack::new().then(Job::new("emails", "must not exist"));
        assert_eq!(ack.follow_ups().len(), 1);
        if text(&job) == "panic" {
            panic!("after the follow-ups");
        }
        drop(ack);
        Err::<Ack, _>(DeadLetter::new("failed after the follow-ups"))
    });
    let serving = Serving::start(worker);
    until(
        &db,
        "select count(*) = 2 from leaseq.dead_jobs where queue = 'orders'",
        S20,
    )
    .await;
    let stats = serving.stop().await;
    assert_eq!(count(&db, "select count(*) from leaseq.jobs").await, 0);
    assert_eq!(n(&stats.follow_ups), 0);
    assert_eq!(n(&stats.nacked), 2);
    broker.stop().await;
}

/// Thirty jobs acked in SQL by a worker with two slots and a credit of
/// two: each effect once, nothing sent for them, no redelivery, and the
/// worker keeps receiving (the broker gives the credit back on each SQL
/// ack's notice; a lost credit would stall it after two jobs).
#[tokio::test]
async fn sql_acks_free_the_slot_and_the_stream_keeps_its_credit() {
    let db = TestDb::new().await;
    sqlx::query("create table effects (job uuid not null)")
        .execute(&db.pool)
        .await
        .unwrap();
    // Leases far longer than the test, and no fallback poll: only the
    // settle notices can give the credit back in time.
    let broker = TestBroker::on(&db)
        .config(|c| c.poll_interval = Duration::from_secs(3600))
        .start()
        .await;
    let client = Client::connect(broker.url()).await.unwrap();
    client
        .enqueue_batch((0..30).map(|i| Job::new("work", format!("{i}"))))
        .await
        .unwrap();
    let pool = db.pool.clone();
    let worker = Worker::builder(client.clone())
        .concurrency(2)
        .lease(Duration::from_secs(120))
        .handle("work", move |job: Delivery| {
            let pool = pool.clone();
            async move {
                let mut tx = pool.begin().await?;
                sqlx::query("insert into effects values ($1::uuid)")
                    .bind(&job.id)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("select leaseq.ack($1::uuid, $2)")
                    .bind(&job.id)
                    .bind(&job.lease_token)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok::<_, anyhow::Error>(Ack::settled_in_sql())
            }
        });
    let serving = Serving::start(worker);
    until(
        &db,
        "select (select count(*) from effects) = 30 \
         and not exists (select 1 from leaseq.jobs)",
        S20,
    )
    .await;
    let stats = serving.stop().await;
    assert_eq!(
        count(&db, "select count(distinct job) from effects").await,
        30,
        "each effect once"
    );
    assert_eq!(
        (
            n(&stats.delivered),
            n(&stats.settled_in_sql),
            n(&stats.acked),
            n(&stats.nacked),
            n(&stats.lease_lost),
            n(&stats.settled_on_stream),
        ),
        (30, 30, 0, 0, 0, 0),
        "no redelivery, no settle sent: {stats:?}"
    );
    broker.stop().await;
}

/// A broker that does not list "ack.enqueue" (a proxy strips its
/// heartbeat's features) would ack and drop the follow-ups: the worker
/// nacks the job instead, saying why, and a plain ack still works. The raw
/// stream's `ack_with` refuses UNIMPLEMENTED and sends nothing.
#[tokio::test]
async fn follow_ups_against_a_broker_without_ack_enqueue_nack_the_job() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let proxy = crate::client::start_featureless_proxy(broker.addr).await;
    let client = Client::connect(format!("http://{proxy}")).await.unwrap();
    client
        .enqueue(Job::new("orders", "with follow-ups").max_attempts(1))
        .await
        .unwrap();
    client.enqueue(Job::new("orders", "plain")).await.unwrap();
    let worker = Worker::builder(client.clone()).handle("orders", |job: Delivery| async move {
        if text(&job) == "plain" {
            return Ok::<_, anyhow::Error>(Ack::new());
        }
        Ok(Ack::new().then(Job::new("emails", "never")))
    });
    let serving = Serving::start(worker);
    until(
        &db,
        "select not exists (select 1 from leaseq.jobs where queue = 'orders') \
         and exists (select 1 from leaseq.dead_jobs where queue = 'orders')",
        S20,
    )
    .await;
    let stats = serving.stop().await;
    let error: String = sqlx::query_scalar("select last_error from leaseq.dead_jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        error.starts_with("ack.enqueue: the broker did not list"),
        "{error}"
    );
    assert_eq!(
        count(
            &db,
            "select count(*) from leaseq.jobs where queue = 'emails'"
        )
        .await,
        0
    );
    assert_eq!(
        (
            n(&stats.acked),
            n(&stats.nacked),
            n(&stats.follow_ups_refused)
        ),
        (1, 1, 1),
        "{stats:?}"
    );

    // The raw stream: refused before anything is sent; the job stays leased.
    let id = client.enqueue(Job::new("raw", "x")).await.unwrap().job_id;
    let mut consumer = client
        .consume(leaseq_client::ConsumeOptions::new(["raw"]))
        .await
        .unwrap();
    let job = tokio::time::timeout(S20, consumer.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(job.id, id);
    let e = consumer
        .settler()
        .ack_with(&job, [Job::new("emails", "never")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    assert!(e.message().starts_with("ack.enqueue:"), "{e:?}");
    assert_eq!(
        count(
            &db,
            "select count(*) from leaseq.jobs where queue = 'emails'"
        )
        .await,
        0
    );
    consumer.settler().ack(&job).await.unwrap();
    broker.stop().await;
}

/// The raw stream's `ack_with` on a broker that has "ack.enqueue": the
/// follow-ups' ids come back (the stream confirms its settles).
#[tokio::test]
async fn the_raw_stream_acks_with_follow_ups_and_returns_their_ids() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let client = Client::connect(broker.url()).await.unwrap();
    client.enqueue(Job::new("raw", "x")).await.unwrap();
    let mut consumer = client
        .consume(leaseq_client::ConsumeOptions::new(["raw"]))
        .await
        .unwrap();
    let job = tokio::time::timeout(S20, consumer.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let ids = consumer
        .settler()
        .ack_with(&job, [Job::new("next", "a"), Job::new("next", "b")])
        .await
        .unwrap();
    assert_eq!(ids.len(), 2);
    let stored: Vec<String> = sqlx::query_scalar(
        "select id::text from leaseq.jobs where queue = 'next' order by payload",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(stored, ids);
    assert!(db.live_row(&job.id).await.is_none());
    broker.stop().await;
}

/// crates/client/examples/exactly_once.rs against a broker: each order
/// shipped once (its row, its shipping job and its ack in one transaction),
/// each shipping job acked with its email.
#[tokio::test]
async fn the_exactly_once_example_ships_each_order_once() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let client = Client::connect(broker.url()).await.unwrap();
    example::create_table(&db.pool).await.unwrap();
    for order in ["order-1", "order-2", "order-3"] {
        client.enqueue(Job::new("orders", order)).await.unwrap();
    }
    let serving = Serving::start(example::worker(client.clone(), db.pool.clone()));
    until(
        &db,
        "select (select count(*) from shipments) = 3 \
         and (select count(*) from leaseq.jobs where queue = 'emails') = 3 \
         and not exists (select 1 from leaseq.jobs where queue in ('orders', 'shipping'))",
        S20,
    )
    .await;
    let stats = serving.stop().await;
    assert_eq!(
        (
            n(&stats.settled_in_sql),
            n(&stats.acked),
            n(&stats.follow_ups)
        ),
        (3, 3, 3),
        "{stats:?}"
    );
    let mails: Vec<String> = sqlx::query_scalar(
        "select convert_from(payload, 'UTF8') from leaseq.jobs where queue = 'emails' order by 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(mails[0], "your order-1 has shipped");
    broker.stop().await;
}
