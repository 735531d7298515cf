//! Progress (issue 34): a held job's progress, reported on its Consume
//! stream (`ConsumeRequest.progress`) or with the unary ReportProgress,
//! fenced by the lease token like an extend, kept as the latest report per
//! job (written at most once a second per stream), and read back by
//! GetJob. It changes neither the lease nor the stream's credit. The
//! malformed rows are in tests/validation.rs (consume_settle_rows).

use std::time::{Duration, Instant};

use crate::common::consume::{Consumer, status_of};
use crate::common::*;
use leaseq::pb;
use tonic::Code;

const S5: Duration = Duration::from_secs(5);

fn report(d: &pb::Delivery, fraction: f32, message: &str) -> pb::Progress {
    pb::Progress {
        job_id: id_of(d),
        lease_token: d.lease_token.clone(),
        fraction,
        message: message.into(),
    }
}

async fn get(a: &mut Admin, id: &str) -> pb::JobInfo {
    a.get_job(pb::GetJobRequest { job_id: id.into() })
        .await
        .unwrap()
        .into_inner()
}

async fn progress_rows(db: &TestDb) -> i64 {
    sqlx::query_scalar("select count(*) from leaseq.job_progress")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_on_a_stream_is_fenced_kept_latest_and_read_by_get_job() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|cfg| cfg.retention_interval = Duration::from_millis(100))
        .start()
        .await;
    let mut client = broker.client().await;
    let mut a = admin(&broker).await;
    let mut c = Consumer::open(&mut client, &["p"], 1, None, true).await;
    let id = enqueue(&mut client, "p", "work").await;
    let d = c.next_delivery(S5).await;
    assert_eq!(id_of(&d), id);
    let before = get(&mut a, &id).await;
    assert!(before.progress_at.is_none(), "{before:?}");

    // The first report is written at once, and confirmed.
    assert!(
        c.send(pb::ConsumeRequest {
            progress: vec![report(&d, 0.25, "a quarter")],
            ..Default::default()
        })
        .await
    );
    let r = c.result(S5).await;
    let first_written = Instant::now();
    assert_eq!(r.op(), pb::SettleOp::Progress, "{r:?}");
    assert!(status_of(&r).is_ok(), "{r:?}");
    let j = get(&mut a, &id).await;
    assert_eq!(
        (j.progress, j.progress_message.as_str()),
        (0.25, "a quarter")
    );
    assert!(j.progress_at.is_some());

    // Two reports in quick succession: the latest is written, a second
    // after the last write, once.
    for (f, m) in [(0.5, "half"), (0.75, "three quarters")] {
        assert!(
            c.send(pb::ConsumeRequest {
                progress: vec![report(&d, f, m)],
                ..Default::default()
            })
            .await
        );
    }
    let r = c.result(S5).await;
    assert!(status_of(&r).is_ok(), "{r:?}");
    let gap = first_written.elapsed();
    assert!(
        gap >= Duration::from_millis(900),
        "written {gap:?} after the last"
    );
    c.assert_no_results(
        Duration::from_millis(1500),
        "the replaced report has no result of its own",
    )
    .await;
    let j = get(&mut a, &id).await;
    assert_eq!(
        (j.progress, j.progress_message.as_str()),
        (0.75, "three quarters")
    );

    // Neither the lease nor the credit moved: same expiry, nothing more
    // delivered to the stream of credit 1 (another job waits).
    assert_eq!(j.lease_expires_at, before.lease_expires_at);
    assert_eq!(j.state(), pb::JobState::Leased);
    enqueue(&mut client, "p", "next").await;
    c.assert_quiet(Duration::from_millis(500), "credit 1 is still in use")
        .await;

    // A stale token: refused, nothing written.
    let stale = pb::Progress {
        lease_token: uuid::Uuid::new_v4().to_string(),
        ..report(&d, 1.0, "not mine")
    };
    assert!(
        c.send(pb::ConsumeRequest {
            progress: vec![stale],
            ..Default::default()
        })
        .await
    );
    let r = c.result(S5).await;
    let e = status_of(&r).unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let j = get(&mut a, &id).await;
    assert_eq!(
        (j.progress, j.progress_message.as_str()),
        (0.75, "three quarters")
    );

    // Acked: the job is gone, and so, by the retention loop, is its report.
    c.ack(&d).await;
    assert!(status_of(&c.result(S5).await).is_ok());
    eventually(S5, "the gone job's report deleted", || async {
        progress_rows(&db).await == 0
    })
    .await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_progress_is_the_unary_form() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut client = broker.client().await;
    let mut a = admin(&broker).await;
    let mut s = subscribe(&mut client, &["pu"], 1, None).await;
    let id = enqueue(&mut client, "pu", "x").await;
    let d = next_delivery(&mut s, S5).await;
    let req = |token: &str, fraction: f32, message: &str| pb::ReportProgressRequest {
        job_id: id.clone(),
        lease_token: token.into(),
        fraction,
        message: message.into(),
    };
    client
        .report_progress(req(&d.lease_token, 1.0, "done soon"))
        .await
        .unwrap();
    let j = get(&mut a, &id).await;
    assert_eq!(
        (j.progress, j.progress_message.as_str()),
        (1.0, "done soon")
    );
    // At once again: the unary call has no once-a-second bound.
    client
        .report_progress(req(&d.lease_token, 0.0, ""))
        .await
        .unwrap();
    assert_eq!(get(&mut a, &id).await.progress, 0.0);

    let stale = uuid::Uuid::new_v4().to_string();
    let e = client
        .report_progress(req(&stale, 0.5, "x"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    for (fraction, message, field) in [
        (f32::NAN, "", "fraction"),
        (2.0, "", "fraction"),
        (0.5, &"m".repeat(257)[..], "message"),
    ] {
        let e = client
            .report_progress(req(&d.lease_token, fraction, message))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().starts_with(field), "{e:?}");
    }
    let j = get(&mut a, &id).await;
    assert_eq!((j.progress, j.progress_message.as_str()), (0.0, ""));
    assert!(j.progress_at.is_some());
    broker.stop().await;
}
