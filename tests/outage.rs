//! PostgreSQL becoming unreachable under a running broker: health follows it,
//! clients see UNAVAILABLE, and the broker recovers by itself.

mod common;

use std::time::Duration;

use common::*;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_is_not_serving_then_recovers() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut s = subscribe(&mut c, &["out"], 4, None).await;
    let name: String = sqlx::query_scalar("select current_database()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // An admin connection to another database of the same cluster.
    let admin = sqlx::PgPool::connect(&with_database(&db.url, "postgres"))
        .await
        .unwrap();
    let cut = |allow: bool| {
        let admin = admin.clone();
        let name = name.clone();
        async move {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "alter database {name} allow_connections {allow}"
            )))
            .execute(&admin)
            .await
            .unwrap();
            if !allow {
                sqlx::query(
                    "select pg_terminate_backend(pid) from pg_stat_activity
                     where datname = $1 and pid <> pg_backend_pid()",
                )
                .bind(&name)
                .execute(&admin)
                .await
                .unwrap();
            }
        }
    };
    cut(false).await;
    wait_health(
        broker.addr,
        "",
        ServingStatus::NotServing,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        health(broker.addr, "liveness").await,
        Some(ServingStatus::Serving),
        "liveness stays SERVING through a database outage"
    );
    let err = c.enqueue(job("out", "x")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    cut(true).await;
    wait_health(
        broker.addr,
        "",
        ServingStatus::Serving,
        Duration::from_secs(15),
    )
    .await;
    // Enqueues work again and the open stream is served again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let id = loop {
        match c.enqueue(job("out", "after")).await {
            Ok(r) => break r.into_inner().job_id,
            Err(e) if tokio::time::Instant::now() < deadline => {
                assert_eq!(e.code(), Code::Unavailable);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("enqueue still failing: {e:?}"),
        }
    };
    let d = next_delivery(&mut s, Duration::from_secs(15)).await;
    assert_eq!(d.job.unwrap().id, id);
}
