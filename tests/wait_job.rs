//! WaitJob (issue 34): a producer waits for its job's outcome on a
//! server stream, without polling: completed (with its result), dead (with
//! its reason and last error: nacked, or expired by its ttl), unknown
//! (cancelled, or acked without a record, or never enqueued); answered at
//! once for a job that already ended; across two brokers on one database
//! (the wait on one, the ack on the other); bounded by a timeout and by
//! `--max-waiters`.

use std::time::{Duration, Instant};

use crate::common::consume::ack_of;
use crate::common::*;
use leaseq::pb;
use tonic::{Code, Streaming};

const S5: Duration = Duration::from_secs(5);

async fn wait(
    c: &mut Client,
    id: &str,
    changes: bool,
    timeout: Option<Duration>,
) -> Result<Streaming<pb::WaitJobResponse>, tonic::Status> {
    c.wait_job(pb::WaitJobRequest {
        job_id: id.into(),
        timeout: timeout.map(dur),
        changes,
    })
    .await
    .map(|r| r.into_inner())
}

/// The next message of a wait, within `limit`.
async fn next(w: &mut Streaming<pb::WaitJobResponse>, limit: Duration) -> pb::WaitJobResponse {
    tokio::time::timeout(limit, w.message())
        .await
        .expect("a WaitJob message in time")
        .expect("an OK message")
        .expect("a message, not the end")
}

/// The wait's last message: a final state, then the end of the stream (OK).
async fn outcome(w: &mut Streaming<pb::WaitJobResponse>, limit: Duration) -> pb::WaitJobResponse {
    let m = next(w, limit).await;
    let end = tokio::time::timeout(S5, w.message())
        .await
        .expect("the stream ends after the outcome");
    assert!(matches!(end, Ok(None)), "{end:?}");
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_job_reports_each_outcome() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|cfg| cfg.reap_interval = Duration::from_millis(200))
        .start()
        .await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let mut s = subscribe(&mut c, &["w"], 1, None).await;

    // Completed, with its result; with `changes`, the live states first.
    let id = enqueue(&mut c, "w-idle", "x").await;
    let mut w = wait(&mut c, &id, true, None).await.unwrap();
    assert_eq!(next(&mut w, S5).await.state(), pb::WaitState::Available);
    // Move it to the consumed queue's stream: enqueue there instead.
    let id = enqueue(&mut c, "w", "done").await;
    let mut w = wait(&mut c, &id, true, None).await.unwrap();
    let first = next(&mut w, S5).await;
    assert!(
        matches!(
            first.state(),
            pb::WaitState::Available | pb::WaitState::Leased
        ),
        "{first:?}"
    );
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(id_of(&d), id);
    if first.state() == pb::WaitState::Available {
        assert_eq!(next(&mut w, S5).await.state(), pb::WaitState::Leased);
    }
    c.ack(pb::AckRequest {
        result: b"42".to_vec(),
        ..ack_of(&d)
    })
    .await
    .unwrap();
    let o = outcome(&mut w, S5).await;
    assert_eq!(o.state(), pb::WaitState::Completed, "{o:?}");
    assert_eq!(o.job_id, id);
    assert_eq!(o.result, b"42");
    assert!(o.finished_at.is_some());

    // Already finished when the wait starts: answered at once, from the
    // record (and again, as often as asked).
    for _ in 0..2 {
        let mut w = wait(&mut c, &id, false, None).await.unwrap();
        let o = outcome(&mut w, S5).await;
        assert_eq!(
            (o.state(), o.result.as_slice()),
            (pb::WaitState::Completed, &b"42"[..])
        );
    }

    // Dead: nacked to the dead letters, with its error.
    let id = enqueue(&mut c, "w", "bad").await;
    let mut w = wait(&mut c, &id, false, None).await.unwrap();
    let d = next_delivery(&mut s, S5).await;
    nack_dead(&mut c, &d, "no such customer").await;
    let o = outcome(&mut w, S5).await;
    assert_eq!(o.state(), pb::WaitState::Dead, "{o:?}");
    assert_eq!(
        (o.dead_reason.as_str(), o.last_error.as_str()),
        ("nacked", "no such customer")
    );

    // Expired: its ttl passed before anyone took it (the reaper's dead
    // letter, reason `expired`).
    let id = c
        .enqueue(pb::EnqueueRequest {
            ttl: Some(dur(Duration::from_secs(1))),
            ..job("w-nobody", "late")
        })
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let mut w = wait(&mut c, &id, false, None).await.unwrap();
    let o = outcome(&mut w, Duration::from_secs(10)).await;
    assert_eq!(
        (o.state(), o.dead_reason.as_str()),
        (pb::WaitState::Dead, "expired")
    );

    // Cancelled: CANCELLED, at once (this broker cancelled it), and to a
    // wait that starts afterwards.
    let id = enqueue(&mut c, "w-nobody", "cancel me").await;
    let mut w = wait(&mut c, &id, false, None).await.unwrap();
    let asked = Instant::now();
    a.cancel_job(pb::CancelJobRequest { job_id: id.clone() })
        .await
        .unwrap();
    let o = outcome(&mut w, S5).await;
    assert_eq!(o.state(), pb::WaitState::Cancelled, "{o:?}");
    assert!(o.finished_at.is_some());
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    let mut w = wait(&mut c, &id, false, None).await.unwrap();
    assert_eq!(outcome(&mut w, S5).await.state(), pb::WaitState::Cancelled);

    // Acked without a result in a queue without retention: UNKNOWN too.
    let id = enqueue(&mut c, "w", "plain").await;
    let mut w = wait(&mut c, &id, false, None).await.unwrap();
    let d = next_delivery(&mut s, S5).await;
    ack(&mut c, &d).await.unwrap();
    assert_eq!(outcome(&mut w, S5).await.state(), pb::WaitState::Unknown);

    // Never enqueued: UNKNOWN at once.
    let mut w = wait(&mut c, &uuid::Uuid::now_v7().to_string(), false, None)
        .await
        .unwrap();
    assert_eq!(outcome(&mut w, S5).await.state(), pb::WaitState::Unknown);

    // A job that does not end in time: DEADLINE_EXCEEDED after the timeout.
    let id = enqueue(&mut c, "w-nobody", "forever").await;
    let started = Instant::now();
    let mut w = wait(&mut c, &id, false, Some(Duration::from_millis(500)))
        .await
        .unwrap();
    let e = tokio::time::timeout(S5, w.message())
        .await
        .expect("the wait ends")
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(started.elapsed() >= Duration::from_millis(500));
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_job_refuses_bad_input() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let id = enqueue(&mut c, "v", "x").await;
    let rows: Vec<(&str, pb::WaitJobRequest, &str)> = vec![
        ("empty id", pb::WaitJobRequest::default(), "job_id"),
        (
            "not a UUID",
            pb::WaitJobRequest {
                job_id: "nope".into(),
                ..Default::default()
            },
            "job_id",
        ),
        (
            "negative timeout",
            pb::WaitJobRequest {
                job_id: id.clone(),
                timeout: Some(prost_types::Duration {
                    seconds: -1,
                    nanos: 0,
                }),
                ..Default::default()
            },
            "timeout: must not be negative",
        ),
        (
            "timeout over an hour",
            pb::WaitJobRequest {
                job_id: id.clone(),
                timeout: Some(prost_types::Duration {
                    seconds: 3601,
                    nanos: 0,
                }),
                ..Default::default()
            },
            "timeout: must be at most 3600s",
        ),
    ];
    for (name, req, text) in rows {
        let e = c
            .wait_job(req)
            .await
            .err()
            .unwrap_or_else(|| panic!("{name}: accepted"));
        assert_eq!(e.code(), Code::InvalidArgument, "{name}: {e:?}");
        assert!(e.message().starts_with(text), "{name}: {e:?}");
    }
    assert!(db.live_row(&id).await.is_some());
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_one_broker_learns_of_an_ack_on_another() {
    let db = TestDb::new().await;
    // The waiter's broker polls every 100 ms (the default); the other one
    // never hears of the wait.
    let waiting = TestBroker::start(&db).await;
    let acking = TestBroker::start(&db).await;
    let mut cw = waiting.client().await;
    let mut ca = acking.client().await;
    let mut s = subscribe(&mut ca, &["x"], 1, None).await;
    let mut worst = Duration::ZERO;
    for i in 0..5 {
        let id = enqueue(&mut ca, "x", &format!("j{i}")).await;
        let mut w = wait(&mut cw, &id, false, None).await.unwrap();
        let d = next_delivery(&mut s, S5).await;
        assert_eq!(id_of(&d), id);
        ca.ack(pb::AckRequest {
            result: format!("r{i}").into_bytes(),
            ..ack_of(&d)
        })
        .await
        .unwrap();
        let acked = Instant::now();
        let o = outcome(&mut w, S5).await;
        worst = worst.max(acked.elapsed());
        assert_eq!(o.state(), pb::WaitState::Completed);
        assert_eq!(o.result, format!("r{i}").into_bytes());
    }
    // One poll interval and a statement, with room for a loaded machine.
    assert!(worst < Duration::from_secs(2), "worst {worst:?}");

    // The other way round, and a dead letter: the nack on the waiter's
    // broker's peer.
    let id = enqueue(&mut cw, "x", "dies").await;
    let mut w = wait(&mut cw, &id, false, None).await.unwrap();
    let d = next_delivery(&mut s, S5).await;
    nack_dead(&mut ca, &d, "boom").await;
    let o = outcome(&mut w, S5).await;
    assert_eq!(
        (o.state(), o.last_error.as_str()),
        (pb::WaitState::Dead, "boom")
    );

    // A cancel on the other broker: CANCELLED too.
    let id = enqueue(&mut cw, "x-idle", "cancel me").await;
    let mut w = wait(&mut cw, &id, false, None).await.unwrap();
    admin(&acking)
        .await
        .cancel_job(pb::CancelJobRequest { job_id: id.clone() })
        .await
        .unwrap();
    assert_eq!(outcome(&mut w, S5).await.state(), pb::WaitState::Cancelled);
    waiting.stop().await;
    acking.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_past_the_brokers_limit_are_refused() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|cfg| cfg.max_waiters = 2)
        .start()
        .await;
    let mut c = broker.client().await;
    let id = enqueue(&mut c, "lim", "x").await;
    let w1 = wait(&mut c, &id, false, None).await.unwrap();
    let _w2 = wait(&mut c, &id, false, None).await.unwrap();
    let e = wait(&mut c, &id, false, None).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().starts_with("max-waiters: "), "{e:?}");
    // A wait answered at once holds no place.
    let gone = uuid::Uuid::now_v7().to_string();
    let mut w = wait(&mut c, &gone, false, None).await.unwrap();
    assert_eq!(outcome(&mut w, S5).await.state(), pb::WaitState::Unknown);
    // A client that goes gives its place back.
    drop(w1);
    eventually(S5, "a place freed", || {
        let mut c = c.clone();
        let id = id.clone();
        async move { wait(&mut c, &id, false, None).await.is_ok() }
    })
    .await;
    broker.stop().await;
}

/// A cancel is remembered for --result-retention, then the job is UNKNOWN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_is_remembered_for_the_result_retention() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|cfg| {
            cfg.retention_interval = Duration::from_millis(100);
            cfg.result_retention = Duration::from_secs(1);
        })
        .start()
        .await;
    let mut c = broker.client().await;
    let id = enqueue(&mut c, "cr", "x").await;
    admin(&broker)
        .await
        .cancel_job(pb::CancelJobRequest { job_id: id.clone() })
        .await
        .unwrap();
    let cancelled = Instant::now();
    let mut w = wait(&mut c, &id, false, None).await.unwrap();
    assert_eq!(outcome(&mut w, S5).await.state(), pb::WaitState::Cancelled);
    eventually(Duration::from_secs(10), "the cancel forgotten", || {
        let mut c = c.clone();
        let id = id.clone();
        async move {
            let mut w = wait(&mut c, &id, false, None).await.unwrap();
            outcome(&mut w, S5).await.state() == pb::WaitState::Unknown
        }
    })
    .await;
    assert!(cancelled.elapsed() >= Duration::from_millis(900));
    broker.stop().await;
}
