//! Results, progress and waiting in the Rust client (issue 34 item 2, the
//! SDK side): a handler's `Ack::result` / `Ack::json` travels with its ack
//! (on Consume, and as a unary Ack on Subscribe) and is read back by
//! `Client::wait_job` and `GetJob`; `Task::enqueue_and_wait` returns a task
//! handler's JSON result, or ABORTED for a job that died; a broker without
//! "ack.result" (a proxy strips the heartbeat's features) gets a nack
//! saying why, never an ack without the result; `Client::report_progress`
//! is checked client-side and read back by `GetJob`. Against in-process
//! brokers over real gRPC and a real PostgreSQL; the broker's side is
//! tests/results.rs and tests/progress.rs.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{TestBroker, TestDb, until};
use leaseq_client::{
    Ack, AdminClient, BoxError, Client, DeadLetter, Delivery, Job, Task, Worker, pb,
};

const S20: Duration = Duration::from_secs(20);

use crate::common::serving::{Serving, n};

#[derive(serde::Serialize, serde::Deserialize)]
struct Pair {
    a: i64,
    b: i64,
}

const ADD: Task<Pair> = Task::new("add");

#[tokio::test]
async fn a_handlers_result_is_read_back_by_wait_job_and_get_job() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let client = Client::connect(broker.url()).await.unwrap();
    let admin = AdminClient::connect(broker.url()).await.unwrap();
    for stream_acks in [true, false] {
        let q = if stream_acks {
            "thumbs-consume"
        } else {
            "thumbs-subscribe"
        };
        let worker = Worker::builder(client.clone())
            .stream_acks(stream_acks)
            .handle(q, |job: Delivery| async move {
                let mut result = b"done:".to_vec();
                result.extend_from_slice(&job.payload);
                Ok::<_, anyhow::Error>(Ack::new().result(result))
            });
        let serving = Serving::start(worker);
        let mut ids = Vec::new();
        for i in 0..3 {
            ids.push(
                client
                    .enqueue(Job::new(q, format!("p{i}")))
                    .await
                    .unwrap()
                    .job_id,
            );
        }
        for (i, id) in ids.iter().enumerate() {
            let o = client.wait_job(id, Some(S20)).await.unwrap();
            assert_eq!(o.state, pb::WaitState::Completed as i32, "{o:?}");
            assert_eq!(o.result, format!("done:p{i}").into_bytes());
            let info = admin.get_job(id).await.unwrap();
            assert_eq!(info.result, format!("done:p{i}").into_bytes());
        }
        let stats = serving.stop().await;
        assert_eq!(
            (n(&stats.acked), n(&stats.nacked), n(&stats.results_refused)),
            (3, 0, 0),
            "{stats:?}"
        );
        if stream_acks {
            assert_eq!(n(&stats.settled_on_stream), 3, "{stats:?}");
        } else {
            // AckBatch is kept for plain acks: each went by a unary Ack.
            assert_eq!(
                (n(&stats.settled_unary), n(&stats.settled_batched)),
                (3, 0),
                "{stats:?}"
            );
        }
    }
    broker.stop().await;
}

#[tokio::test]
async fn enqueue_and_wait_returns_a_task_handlers_json_result_or_aborted() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let client = Client::connect(broker.url()).await.unwrap();
    let worker = Worker::builder(client.clone()).task(ADD, |p: Pair, _job: Delivery| async move {
        if p.a < 0 {
            return Err::<Ack, BoxError>(DeadLetter::new("negative").into());
        }
        Ok(Ack::json(&(p.a + p.b))?)
    });
    let serving = Serving::start(worker);
    let sum: i64 = ADD
        .enqueue_and_wait(&client, &Pair { a: 2, b: 3 }, Some(S20))
        .await
        .unwrap();
    assert_eq!(sum, 5);
    let e = ADD
        .enqueue_and_wait::<i64>(&client, &Pair { a: -1, b: 0 }, Some(S20))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Aborted, "{e:?}");
    assert!(e.message().ends_with("is dead (nacked): negative"), "{e:?}");
    serving.stop().await;
    // Nobody consumes now: the wait runs out.
    let e = ADD
        .enqueue_and_wait::<i64>(
            &client,
            &Pair { a: 1, b: 1 },
            Some(Duration::from_millis(500)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
    broker.stop().await;
}

/// A broker that does not list "ack.result" would ack and drop the result:
/// the worker nacks the job instead, saying why; a plain ack still works.
#[tokio::test]
async fn a_result_against_a_broker_without_ack_result_nacks_the_job() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let proxy = crate::client::start_featureless_proxy(broker.addr).await;
    let old = Client::connect(format!("http://{proxy}")).await.unwrap();
    let client = Client::connect(broker.url()).await.unwrap();
    let with_result = client
        .enqueue(Job::new("thumbs", "with a result").max_attempts(1))
        .await
        .unwrap()
        .job_id;
    client.enqueue(Job::new("thumbs", "plain")).await.unwrap();
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = errors.clone();
    let worker = Worker::builder(old.clone()).handle("thumbs", move |job: Delivery| {
        let seen = seen.clone();
        async move {
            if let Err(e) = leaseq_client::progress(0.5, "never").await {
                seen.lock().unwrap().push(e);
            }
            if job.payload == b"plain" {
                return Ok::<_, anyhow::Error>(Ack::new());
            }
            Ok(Ack::new().result("lost"))
        }
    });
    let serving = Serving::start(worker);
    let o = client.wait_job(&with_result, Some(S20)).await.unwrap();
    assert_eq!(o.state, pb::WaitState::Dead as i32, "{o:?}");
    assert!(
        o.last_error
            .starts_with("ack.result: the broker did not list \"ack.result\""),
        "{o:?}"
    );
    until(
        &db,
        "select not exists (select 1 from leaseq.jobs where queue = 'thumbs')",
        S20,
    )
    .await;
    let stats = serving.stop().await;
    assert_eq!(
        (n(&stats.acked), n(&stats.nacked), n(&stats.results_refused)),
        (1, 1, 1),
        "{stats:?}"
    );
    let errors = std::mem::take(&mut *errors.lock().unwrap());
    assert_eq!(errors.len(), 2, "{errors:?}");
    for e in errors.iter() {
        assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
        assert!(
            e.message().starts_with("progress: the broker did not list"),
            "{e:?}"
        );
    }
    broker.stop().await;
}

/// `leaseq_client::progress` from a handler: on the Consume stream, and
/// by ReportProgress on Subscribe; read back by GetJob while the job is
/// held; checked first; refused outside a handler.
#[tokio::test]
async fn progress_from_a_handler_is_read_back_by_get_job_while_the_job_is_held() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let client = Client::connect(broker.url()).await.unwrap();
    let admin = AdminClient::connect(broker.url()).await.unwrap();
    let e = leaseq_client::progress(0.5, "").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    for stream_acks in [true, false] {
        let q = if stream_acks {
            "p-consume"
        } else {
            "p-subscribe"
        };
        let (release, released) = tokio::sync::watch::channel(false);
        let refusals = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = refusals.clone();
        let worker = Worker::builder(client.clone())
            .stream_acks(stream_acks)
            .handle(q, move |_job: Delivery| {
                let (seen, mut released) = (seen.clone(), released.clone());
                async move {
                    for (fraction, message) in [(1.5, ""), (0.5, &*"x".repeat(257))] {
                        let e = leaseq_client::progress(fraction, message)
                            .await
                            .unwrap_err();
                        seen.lock()
                            .unwrap()
                            .push((e.code(), e.message().to_owned()));
                    }
                    leaseq_client::progress(0.25, "first").await?;
                    leaseq_client::progress(0.5, "half way").await?;
                    let _ = released.wait_for(|r| *r).await;
                    Ok::<_, anyhow::Error>(())
                }
            });
        let serving = Serving::start(worker);
        let id = client.enqueue(Job::new(q, "x")).await.unwrap().job_id;
        let deadline = tokio::time::Instant::now() + S20;
        let info = loop {
            let info = admin.get_job(&id).await.unwrap();
            if info.progress_at.is_some() && info.progress_message == "half way" {
                break info;
            }
            assert!(tokio::time::Instant::now() < deadline, "{info:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(info.progress, 0.5);
        assert_eq!(info.state, pb::JobState::Leased as i32, "{info:?}");
        release.send(true).unwrap();
        let stats = serving.stop().await;
        assert_eq!(n(&stats.acked), 1, "{stats:?}");
        let refusals = std::mem::take(&mut *refusals.lock().unwrap());
        assert_eq!(refusals.len(), 2);
        assert_eq!(refusals[0].0, tonic::Code::InvalidArgument);
        assert!(refusals[0].1.starts_with("fraction:"), "{refusals:?}");
        assert!(refusals[1].1.starts_with("message:"), "{refusals:?}");
    }
    broker.stop().await;
}

#[tokio::test]
async fn report_progress_is_checked_here_read_back_by_get_job_and_fenced() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let client = Client::connect(broker.url()).await.unwrap();
    let admin = AdminClient::connect(broker.url()).await.unwrap();
    let id = client.enqueue(Job::new("p", "x")).await.unwrap().job_id;
    let mut consumer = client
        .consume(leaseq_client::ConsumeOptions::new(["p"]))
        .await
        .unwrap();
    let job = tokio::time::timeout(S20, consumer.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(job.id, id);
    client
        .report_progress(&job.id, &job.lease_token, 0.75, "unary")
        .await
        .unwrap();
    let info = admin.get_job(&id).await.unwrap();
    assert_eq!(
        (info.progress, info.progress_message.as_str()),
        (0.75, "unary")
    );
    for (fraction, message, field) in [
        (1.5, "", "fraction:"),
        (f32::NAN, "", "fraction:"),
        (0.5, &*"x".repeat(257), "message:"),
        (0.5, "a\0b", "message:"),
    ] {
        let e = client
            .report_progress(&job.id, &job.lease_token, fraction, message)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().starts_with(field), "{e:?}");
    }
    assert_eq!(admin.get_job(&id).await.unwrap().progress, 0.75);
    consumer.settler().ack(&job).await.unwrap();
    let e = client
        .report_progress(&job.id, &job.lease_token, 0.8, "")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    broker.stop().await;
}
