//! The shortest path through the broker, run the way CI runs it (with the
//! shared embedded cluster when DATABASE_URL is unset).

mod common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_deliver_ack_round_trip() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut client = broker.client().await;
    let mut stream = subscribe(&mut client, &["smoke"], 4, None).await;
    let id = enqueue(&mut client, "smoke", "hello").await;
    let d = next_delivery(&mut stream, Duration::from_secs(5)).await;
    let job = d.job.clone().unwrap();
    assert_eq!(job.id, id);
    assert_eq!(job.payload, b"hello");
    assert_eq!(job.attempt, 1);
    ack(&mut client, &d).await.expect("ack");
    assert_eq!(db.live_jobs().await, 0);
    let again = ack(&mut client, &d).await.expect_err("second ack");
    assert_eq!(again.code(), tonic::Code::FailedPrecondition);
    drop(stream);
    broker.stop().await;
}
