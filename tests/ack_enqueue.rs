//! An ack that carries follow-up jobs (`AckRequest.enqueue`, issue 34):
//! the follow-ups are inserted in the ack's transaction, so they exist if
//! and only if the ack committed. Unary Ack returns their ids in
//! `AckResponse.enqueued`, a Consume stream in `SettleResult.enqueued`
//! (with `confirm_settles`); a stale token inserts none; acks racing for
//! one lease give one set of follow-ups. The bad-input rows are in
//! tests/validation.rs.

use std::time::Duration;

use crate::common::consume::{Consumer, ack_of, status_of};
use crate::common::*;
use leaseq::pb;
use tonic::Code;

const S5: Duration = Duration::from_secs(5);

fn with_follow_ups(d: &pb::Delivery, jobs: &[(&str, &str)]) -> pb::AckRequest {
    pb::AckRequest {
        enqueue: jobs.iter().map(|(q, p)| job(q, p)).collect(),
        ..ack_of(d)
    }
}

async fn count_in(db: &TestDb, queue: &str) -> i64 {
    sqlx::query_scalar("select count(*) from leaseq.jobs where queue = $1")
        .bind(queue)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_ack_inserts_its_follow_ups_with_the_ack() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut client = broker.client().await;
    let mut s = subscribe(&mut client, &["orders"], 1, None).await;
    let id = enqueue(&mut client, "orders", "o-1").await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(id_of(&d), id);

    let resp = client
        .ack(with_follow_ups(
            &d,
            &[("emails", "mail o-1"), ("invoices", "invoice o-1")],
        ))
        .await
        .expect("ack with follow-ups")
        .into_inner();
    assert_eq!(resp.enqueued.len(), 2);
    assert!(db.live_row(&id).await.is_none(), "the acked job is gone");
    // The follow-ups, as enqueued, delivered to their queues' streams.
    let mut e = subscribe(&mut client, &["emails"], 1, None).await;
    let mail = next_delivery(&mut e, S5).await;
    assert_eq!(id_of(&mail), resp.enqueued[0]);
    assert_eq!(payload_of(&mail), "mail o-1");
    let mut i = subscribe(&mut client, &["invoices"], 1, None).await;
    let inv = next_delivery(&mut i, S5).await;
    assert_eq!(id_of(&inv), resp.enqueued[1]);

    // A stale token: FAILED_PRECONDITION, and no follow-up is inserted.
    let before = count_in(&db, "emails").await;
    let e2 = client
        .ack(with_follow_ups(&d, &[("emails", "never")]))
        .await
        .unwrap_err();
    assert_eq!(e2.code(), Code::FailedPrecondition, "{e2:?}");
    assert_eq!(count_in(&db, "emails").await, before);

    // A follow-up with the dedup key of a live job: that job's id, nothing new.
    let id = enqueue(&mut client, "orders", "o-2").await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(id_of(&d), id);
    let live = client
        .enqueue(pb::EnqueueRequest {
            dedup_key: "k".into(),
            ..job("later", "first")
        })
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let mut req = with_follow_ups(&d, &[]);
    req.enqueue.push(pb::EnqueueRequest {
        dedup_key: "k".into(),
        ..job("later", "second")
    });
    let resp = client.ack(req).await.unwrap().into_inner();
    assert_eq!(resp.enqueued, [live]);
    assert_eq!(count_in(&db, "later").await, 1);
    // An ack without follow-ups answers an empty list.
    let id = enqueue(&mut client, "orders", "o-3").await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(id_of(&d), id);
    let resp = client.ack(ack_of(&d)).await.unwrap().into_inner();
    assert!(resp.enqueued.is_empty());
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consume_streams_ack_carries_follow_ups_and_confirms_their_ids() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut client = broker.client().await;
    // The first heartbeat lists the feature.
    let mut raw = client
        .subscribe(pb::SubscribeRequest {
            queues: vec!["steps-features".into()],
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
    assert!(
        h.features.contains(&pb::features::ACK_ENQUEUE.to_owned()),
        "{:?}",
        h.features
    );
    drop(raw);
    let mut c = Consumer::open(&mut client, &["steps"], 4, None, true).await;

    // A chain: each step acks itself and enqueues the next, on the stream.
    enqueue(&mut client, "steps", "0").await;
    let mut seen = Vec::new();
    for step in 0..5u32 {
        let d = c.next_delivery(S5).await;
        assert_eq!(payload_of(&d), step.to_string());
        seen.push(id_of(&d));
        let next = (step + 1).to_string();
        let follow = if step < 4 {
            vec![("steps", next.as_str())]
        } else {
            vec![]
        };
        assert!(
            c.send(pb::ConsumeRequest {
                acks: vec![with_follow_ups(&d, &follow)],
                ..Default::default()
            })
            .await
        );
        let r = c.result(S5).await;
        assert!(status_of(&r).is_ok(), "{r:?}");
        assert_eq!(r.enqueued.len(), follow.len(), "{r:?}");
        if let Some(next_id) = r.enqueued.first() {
            assert!(db.live_row(next_id).await.is_some(), "the follow-up exists");
        }
    }
    assert_eq!(db.live_jobs().await, 0);

    // Stale on the stream: refused, nothing inserted; the bad entry does
    // not end the stream.
    let id = enqueue(&mut client, "steps", "x").await;
    let d = c.next_delivery(S5).await;
    assert_eq!(id_of(&d), id);
    c.ack(&d).await;
    assert!(status_of(&c.result(S5).await).is_ok());
    assert!(
        c.send(pb::ConsumeRequest {
            acks: vec![with_follow_ups(&d, &[("elsewhere", "never")])],
            ..Default::default()
        })
        .await
    );
    let r = c.result(S5).await;
    assert_eq!(status_of(&r).unwrap_err().code(), Code::FailedPrecondition);
    assert!(r.enqueued.is_empty());
    assert_eq!(count_in(&db, "elsewhere").await, 0);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_racing_for_one_lease_give_one_set_of_follow_ups() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut client = broker.client().await;
    let mut s = subscribe(&mut client, &["race"], 1, None).await;
    for round in 0..5 {
        let id = enqueue(&mut client, "race", &format!("r{round}")).await;
        let d = next_delivery(&mut s, S5).await;
        assert_eq!(id_of(&d), id);
        // Eight acks of the same lease at once, each with two follow-ups.
        let mut calls = tokio::task::JoinSet::new();
        for k in 0..8 {
            let mut c = client.clone();
            let req = with_follow_ups(
                &d,
                &[
                    ("race-out", &format!("{round}-{k}-a")),
                    ("race-out", &format!("{round}-{k}-b")),
                ],
            );
            calls.spawn(async move { c.ack(req).await });
        }
        let results: Vec<_> = calls.join_all().await;
        let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(
            ok.len(),
            1,
            "round {round}: exactly one ack applies: {results:?}"
        );
        for r in &results {
            if let Err(e) = r {
                assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            }
        }
        // Follow-ups exist iff their ack was applied, and those are they.
        let ids: Vec<String> = sqlx::query_scalar(
            "select id::text from leaseq.jobs where queue = 'race-out' \
             and convert_from(payload, 'UTF8') like $1 order by id",
        )
        .bind(format!("{round}-%"))
        .fetch_all(&db.pool)
        .await
        .unwrap();
        let mut want = ok[0].get_ref().enqueued.clone();
        want.sort();
        assert_eq!(ids, want, "round {round}");
    }
    broker.stop().await;
}

/// A Consume stream reset (its client killed: the connection cut without
/// the stream's end) while an ack with follow-ups it sent is still
/// running: the ack either commits (the job is gone, its follow-up exists)
/// or the job is released and goes to another consumer soon, not when its
/// lease runs out. The broker used to drop the stream's running settles
/// with the stream: the ack's transaction rolled back, and since a lease
/// acked on the stream is left to its ack, the job stayed leased for its
/// whole lease (found by the Python SDK's kill -9 test). The ack is held
/// between its statement's start and its commit by a lock on the job's
/// row; the client reaches the broker through a TCP proxy that resets the
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_running_when_its_stream_is_reset_commits_or_the_job_is_released() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|c| c.poll_interval = Duration::from_secs(600))
        .start()
        .await;
    let mut client = broker.client().await;
    let id = enqueue(&mut client, "orders", "o-1").await;
    let proxy = crate::common::pgproxy::PgProxy::start(&format!(
        "postgres://x@127.0.0.1:{}/x",
        broker.addr.port()
    ))
    .await;
    let mut doomed: Client =
        pb::queue_service_client::QueueServiceClient::connect(format!("http://{}", proxy.addr))
            .await
            .expect("connect through the proxy");
    let mut consumer = Consumer::start(
        &mut doomed,
        crate::common::consume::opening(&["orders"], 1, Some(Duration::from_secs(60)), true),
    )
    .await
    .expect("consume");
    let d = consumer.next_delivery(S5).await;
    assert_eq!(id_of(&d), id);

    let mut hold = db.pool.begin().await.unwrap();
    sqlx::query("select 1 from leaseq.jobs where id = $1::uuid for update")
        .bind(&id)
        .execute(&mut *hold)
        .await
        .unwrap();
    assert!(
        consumer
            .send(pb::ConsumeRequest {
                acks: vec![with_follow_ups(&d, &[("emails", "mail o-1")])],
                ..Default::default()
            })
            .await
    );
    let mut waiting = false;
    for _ in 0..200 {
        let n: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity \
             where wait_event_type = 'Lock' and query like '-- Completes jobs%'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if n > 0 {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(waiting, "the ack statement never waited for the job's row");
    assert!(proxy.reset_all() > 0, "the client's connection was cut");
    tokio::time::sleep(Duration::from_millis(300)).await;
    hold.commit().await.unwrap();

    let mut other = subscribe(&mut client, &["orders"], 1, None).await;
    let deadline = tokio::time::Instant::now() + S5;
    loop {
        if db.live_row(&id).await.is_none() {
            assert_eq!(
                count_in(&db, "emails").await,
                1,
                "the ack committed: its follow-up exists"
            );
            break;
        }
        if let Some(again) = try_next_delivery(&mut other, Duration::from_millis(200)).await {
            assert_eq!(id_of(&again), id);
            assert_eq!(
                count_in(&db, "emails").await,
                0,
                "released: the ack did not commit"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "5 s after the reset the job is still leased to the stream that is gone"
        );
    }
    drop(consumer);
}
