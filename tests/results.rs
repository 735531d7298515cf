//! A job's result (`AckRequest.result`, issue 34): an ack may carry it on
//! every path (unary Ack, AckBatch, a Consume stream, an ack with
//! follow-ups); it is kept on the job's completed record, whatever the
//! queue's completed retention, for the longer of that retention and the
//! broker's `--result-retention`, and read back by GetJob. A result past
//! `--max-result-bytes` is refused and acks nothing. The bad-input rows are
//! in tests/validation.rs (`result_rows`).

use std::time::Duration;

use crate::common::consume::{Consumer, ack_of, status_of};
use crate::common::*;
use leaseq::pb;
use tonic::Code;

const S5: Duration = Duration::from_secs(5);

fn with_result(d: &pb::Delivery, result: &[u8]) -> pb::AckRequest {
    pb::AckRequest {
        result: result.to_vec(),
        ..ack_of(d)
    }
}

async fn get(a: &mut Admin, id: &str) -> Result<pb::JobInfo, tonic::Status> {
    a.get_job(pb::GetJobRequest { job_id: id.into() })
        .await
        .map(|r| r.into_inner())
}

/// The job is kept as completed, with this result.
async fn assert_result(a: &mut Admin, id: &str, want: &[u8]) {
    let j = get(a, id)
        .await
        .expect("GetJob of a job acked with a result");
    assert_eq!(j.state(), pb::JobState::Completed, "{j:?}");
    assert_eq!(j.result, want, "{id}");
}

/// Whether `leaseq.completed_jobs` holds the job (the database's view).
async fn kept(db: &TestDb, id: &str) -> bool {
    sqlx::query_scalar("select exists (select 1 from leaseq.completed_jobs where id = $1::uuid)")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

async fn completed_at(a: &mut Admin, id: &str) -> chrono::DateTime<chrono::Utc> {
    let t = get(a, id)
        .await
        .unwrap()
        .completed_at
        .expect("completed_at");
    chrono::DateTime::from_timestamp(t.seconds, t.nanos as u32).unwrap()
}

/// Seconds since `t` by the database's clock (the one retention uses).
async fn age(db: &TestDb, t: chrono::DateTime<chrono::Utc>) -> f64 {
    sqlx::query_scalar("select extract(epoch from now() - $1)::float8")
        .bind(t)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_sent_on_every_ack_path_is_read_back_by_get_job() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut client = broker.client().await;
    let mut a = admin(&broker).await;
    // The queue keeps no completed jobs (no completed_retention): only
    // those acked with a result are kept.
    let mut s = subscribe(&mut client, &["res"], 8, None).await;

    // Unary Ack.
    let id = enqueue(&mut client, "res", "unary").await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(id_of(&d), id);
    client.ack(with_result(&d, b"unary-result")).await.unwrap();
    assert!(db.live_row(&id).await.is_none(), "the acked job is gone");
    assert_result(&mut a, &id, b"unary-result").await;
    // Its completed record is whole: payload and consumer as for retention.
    let j = get(&mut a, &id).await.unwrap();
    assert_eq!(j.payload, b"unary");
    assert!(j.completed_at.is_some());

    // The largest result the broker takes, and any bytes (not UTF-8).
    let id = enqueue(&mut client, "res", "largest").await;
    let d = next_delivery(&mut s, S5).await;
    let big: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    client.ack(with_result(&d, &big)).await.unwrap();
    assert_result(&mut a, &id, &big).await;

    // AckBatch: entries with and without a result in one statement; only
    // those with one are kept.
    let ids: Vec<String> = {
        let mut v = Vec::new();
        for i in 0..4 {
            v.push(enqueue(&mut client, "res", &format!("b{i}")).await);
        }
        v
    };
    let ds = take(&mut s, 4, S5).await;
    let acks = ds
        .iter()
        .map(|d| {
            let n: usize = payload_of(d)[1..].parse().unwrap();
            if n.is_multiple_of(2) {
                with_result(d, format!("batch-{n}").as_bytes())
            } else {
                ack_of(d)
            }
        })
        .collect();
    let r = client
        .ack_batch(pb::AckBatchRequest { acks })
        .await
        .unwrap()
        .into_inner();
    assert!(r.results.iter().all(|r| r.code == 0), "{r:?}");
    for (n, id) in ids.iter().enumerate() {
        assert!(db.live_row(id).await.is_none());
        if n.is_multiple_of(2) {
            assert_result(&mut a, id, format!("batch-{n}").as_bytes()).await;
        } else {
            // No result, no retention: nothing kept, as before.
            assert_eq!(get(&mut a, id).await.unwrap_err().code(), Code::NotFound);
            assert!(!kept(&db, id).await);
        }
    }

    // An ack with follow-ups and a result: both, in one transaction.
    let id = enqueue(&mut client, "res", "with-follow-ups").await;
    let d = next_delivery(&mut s, S5).await;
    let resp = client
        .ack(pb::AckRequest {
            enqueue: vec![job("res-next", "next")],
            ..with_result(&d, b"and-follow-ups")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.enqueued.len(), 1);
    assert_result(&mut a, &id, b"and-follow-ups").await;

    // A stale token: refused, and no record is written for it.
    let e = client.ack(with_result(&d, b"late")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_result(&mut a, &id, b"and-follow-ups").await;

    // ListJobs of completed jobs carries results with the payloads only.
    let page = a
        .list_jobs(pb::ListJobsRequest {
            queue: "res".into(),
            state: pb::JobState::Completed as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.jobs.len(), 5, "{page:?}");
    assert!(page.jobs.iter().all(|j| j.result.is_empty()));
    let page = a
        .list_jobs(pb::ListJobsRequest {
            queue: "res".into(),
            state: pb::JobState::Completed as i32,
            include_payload: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(page.jobs.iter().all(|j| !j.result.is_empty()), "{page:?}");
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consume_stream_ack_carries_a_result_and_the_first_heartbeat_lists_it() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut client = broker.client().await;
    let mut a = admin(&broker).await;
    let mut raw = client
        .subscribe(pb::SubscribeRequest {
            queues: vec!["res-features".into()],
            ..Default::default()
        })
        .await
        .expect("subscribe")
        .into_inner();
    let first = tokio::time::timeout(S5, raw.message())
        .await
        .expect("a first message")
        .expect("ok")
        .expect("open");
    let Some(pb::subscribe_response::Kind::Heartbeat(h)) = first.kind else {
        panic!("the first message is a heartbeat: {first:?}");
    };
    for f in [pb::features::ACK_RESULT, pb::features::PROGRESS] {
        assert!(h.features.contains(&f.to_owned()), "{f}: {:?}", h.features);
    }
    drop(raw);

    let mut c = Consumer::open(&mut client, &["res-stream"], 4, None, true).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(enqueue(&mut client, "res-stream", &format!("s{i}")).await);
    }
    let ds = c.take(3, S5).await;
    // Three acks in one message, two with results.
    assert!(
        c.send(pb::ConsumeRequest {
            acks: vec![
                with_result(&ds[0], b"first"),
                ack_of(&ds[1]),
                with_result(&ds[2], b"third"),
            ],
            ..Default::default()
        })
        .await
    );
    for r in c.results(3, S5).await {
        assert!(status_of(&r).is_ok(), "{r:?}");
    }
    let by_payload = |p: &str| {
        let d = ds.iter().find(|d| payload_of(d) == p).unwrap();
        id_of(d)
    };
    assert_result(&mut a, &by_payload("s0"), b"first").await;
    assert_result(&mut a, &by_payload("s2"), b"third").await;
    assert_eq!(
        get(&mut a, &by_payload("s1")).await.unwrap_err().code(),
        Code::NotFound
    );

    // Too large on the stream: refused naming `acks[0].result`, the job
    // stays leased, the stream stays open, and the ack then goes through.
    let id = enqueue(&mut client, "res-stream", "big").await;
    let d = c.next_delivery(S5).await;
    assert_eq!(id_of(&d), id);
    assert!(
        c.send(pb::ConsumeRequest {
            acks: vec![with_result(&d, &vec![0; 64 * 1024 + 1])],
            ..Default::default()
        })
        .await
    );
    let r = c.result(S5).await;
    let e = status_of(&r).unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().starts_with("acks[0].result: "), "{e:?}");
    assert!(db.live_row(&id).await.is_some(), "not acked");
    assert!(!kept(&db, &id).await);
    c.ack(&d).await;
    assert!(status_of(&c.result(S5).await).is_ok());
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_result_limit_is_the_brokers_setting() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|cfg| cfg.request_limits.max_result_bytes = 10)
        .start()
        .await;
    let mut client = broker.client().await;
    let mut a = admin(&broker).await;
    let mut s = subscribe(&mut client, &["small"], 1, None).await;
    let id = enqueue(&mut client, "small", "x").await;
    let d = next_delivery(&mut s, S5).await;
    let e = client
        .ack(with_result(&d, b"eleven byte"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert_eq!(
        e.message(),
        "result: is 11 bytes, the limit is 10 bytes",
        "{e:?}"
    );
    assert!(db.live_row(&id).await.is_some(), "nothing acked");
    client.ack(with_result(&d, b"ten bytes!")).await.unwrap();
    assert_result(&mut a, &id, b"ten bytes!").await;
    broker.stop().await;
}

/// Retention: a record with a result lives for the longer of its queue's
/// retention and --result-retention; one without, for its queue's only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_are_kept_for_the_longer_of_the_queue_and_result_retention() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|cfg| {
            cfg.retention_interval = Duration::from_millis(100);
            cfg.result_retention = Duration::from_secs(3);
        })
        .start()
        .await;
    let mut client = broker.client().await;
    let mut a = admin(&broker).await;
    for (q, r) in [("r-none", 0), ("r-short", 1), ("r-long", 3600)] {
        update(&mut a, |u| {
            u.queue = q.into();
            u.completed_retention = Some(dur(Duration::from_secs(r)));
        })
        .await;
    }
    // `queue` -> (id, acked with a result).
    let mut jobs: Vec<(&str, String, bool)> = Vec::new();
    for q in ["r-none", "r-short", "r-long"] {
        let mut s = subscribe(&mut client, &[q], 2, None).await;
        let with = enqueue(&mut client, q, "with").await;
        let without = enqueue(&mut client, q, "without").await;
        for d in take(&mut s, 2, S5).await {
            if id_of(&d) == with {
                client.ack(with_result(&d, q.as_bytes())).await.unwrap();
            } else {
                ack(&mut client, &d).await.unwrap();
            }
        }
        jobs.push((q, with, true));
        jobs.push((q, without, false));
    }
    // At once: every result is there; of the plain ones, those of queues
    // with a retention.
    for (q, id, with) in &jobs {
        let want = *with || *q != "r-none";
        assert_eq!(kept(&db, id).await, want, "{q} {id} with result: {with}");
    }
    let (_, none_result, _) = &jobs[0];
    let (_, short_result, _) = &jobs[2];
    let (_, short_plain, _) = &jobs[3];
    let none_done = completed_at(&mut a, none_result).await;
    let short_done = completed_at(&mut a, short_result).await;
    let plain_done = completed_at(&mut a, short_plain).await;
    // The 1 s queue's plain record goes once a second old (by the
    // database's clock); its result stays while younger than 3 s.
    eventually(
        Duration::from_secs(10),
        "r-short's plain record deleted",
        || async { !kept(&db, short_plain).await },
    )
    .await;
    assert!(age(&db, plain_done).await >= 1.0);
    let result_age = age(&db, short_done).await;
    let still = kept(&db, short_result).await;
    assert!(
        still || result_age >= 3.0,
        "a result {result_age}s old was deleted: it outlives its queue's 1 s retention"
    );
    // After --result-retention (3 s), both results of the short queues go;
    // the hour-long queue keeps both its records.
    eventually(
        Duration::from_secs(15),
        "results past 3 s deleted",
        || async { !kept(&db, none_result).await && !kept(&db, short_result).await },
    )
    .await;
    for done in [none_done, short_done] {
        let a = age(&db, done).await;
        assert!(a >= 3.0, "a result deleted when {a}s old");
    }
    assert_eq!(
        get(&mut a, none_result).await.unwrap_err().code(),
        Code::NotFound
    );
    for (_, id, with) in &jobs[4..] {
        let j = get(&mut a, id).await.unwrap();
        assert_eq!(j.state(), pb::JobState::Completed);
        assert_eq!(j.result.is_empty(), !with);
    }
    broker.stop().await;
}
