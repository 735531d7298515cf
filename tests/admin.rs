//! `leaseq.v1.AdminService` over real gRPC and a real PostgreSQL: every RPC,
//! pause / resume, requeue, pagination and WatchQueues (its bad-input table
//! is in tests/validation.rs, with the queue RPCs').

use std::collections::HashSet;
use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

const S5: Duration = Duration::from_secs(5);

async fn get_queue(a: &mut Admin, q: &str) -> pb::QueueInfo {
    a.get_queue(pb::GetQueueRequest { queue: q.into() })
        .await
        .expect("get_queue")
        .into_inner()
}

fn stats(q: &pb::QueueInfo) -> &pb::QueueStats {
    q.stats.as_ref().expect("stats")
}

fn secs(n: u64) -> Option<prost_types::Duration> {
    Some(dur(Duration::from_secs(n)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_stats_count_jobs_by_state_and_this_brokers_streams() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    for i in 0..2 {
        enqueue(&mut c, "stats", &format!("{i}")).await;
    }
    c.enqueue(pb::EnqueueRequest {
        delay: secs(3600),
        ..job("stats", "later")
    })
    .await
    .unwrap();
    enqueue(&mut c, "other", "x").await;

    let q = get_queue(&mut a, "stats").await;
    let s = stats(&q);
    assert_eq!((s.available, s.scheduled, s.leased, s.dead), (2, 1, 0, 0));
    assert_eq!((s.streams, s.consumers), (0, 0));
    assert!(s.oldest_available_age.is_some());
    let settings = q.settings.as_ref().unwrap();
    assert_eq!(settings.max_attempts, 20);
    assert_eq!(settings.default_lease, secs(30));
    assert!(!settings.paused);

    // One stream holding one job, and one dead letter.
    let mut s1 = subscribe(&mut c, &["stats"], 1, None).await;
    let d = next_delivery(&mut s1, S5).await;
    let mut s2 = subscribe(&mut c, &["stats"], 1, None).await;
    let d2 = next_delivery(&mut s2, S5).await;
    nack_dead(&mut c, &d2, "poison").await;
    let q = get_queue(&mut a, "stats").await;
    let s = stats(&q);
    assert_eq!(
        (s.available, s.scheduled, s.leased, s.dead),
        (0, 1, 1, 1),
        "{s:?}"
    );
    assert_eq!(s.streams, 2);
    assert_eq!(s.consumers, 1, "both streams are named \"test\"");
    assert!(s.oldest_available_age.is_none());
    ack(&mut c, &d).await.unwrap();
    drop((s1, s2));

    let all = a
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let names: Vec<_> = all.queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, ["other", "stats"]);
    assert!(all.next_page_token.is_empty());
    assert_eq!(stats(&all.queues[0]).available, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_queues_pages_through_every_queue_once() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let jobs: Vec<_> = (0..23).map(|i| job(&format!("q{i:02}"), "x")).collect();
    c.enqueue_batch(pb::EnqueueBatchRequest { jobs })
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = a
            .list_queues(pb::ListQueuesRequest {
                page_size: 5,
                page_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.queues.len() <= 5);
        seen.extend(page.queues.into_iter().map(|q| q.name));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    let want: Vec<String> = (0..23).map(|i| format!("q{i:02}")).collect();
    assert_eq!(seen, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_queue_changes_only_the_fields_set() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    enqueue(&mut c, "cfg", "x").await;
    let q = a
        .update_queue(pb::UpdateQueueRequest {
            queue: "cfg".into(),
            default_lease: secs(90),
            max_attempts: Some(3),
            completed_retention: secs(86400),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let s = q.settings.unwrap();
    assert_eq!(s.default_lease, secs(90));
    assert_eq!(s.max_attempts, 3);
    assert_eq!(s.backoff_base, secs(1), "unchanged");
    assert_eq!(s.backoff_cap, secs(3600), "unchanged");
    assert_eq!(s.completed_retention, secs(86400));
    let row: (i64, i32, Option<i64>) = sqlx::query_as(
        "select default_lease_ms, max_attempts, completed_retention_ms from leaseq.queues where name = 'cfg'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(row, (90_000, 3, Some(86_400_000)));

    // The new default lease is what a delivery gets.
    let mut s = subscribe(&mut c, &["cfg"], 1, None).await;
    let d = next_delivery(&mut s, S5).await;
    let rows: Vec<(f64,)> = sqlx::query_as(
        "select extract(epoch from lease_expires_at - now())::float8 from leaseq.jobs",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(rows[0].0 > 60.0, "lease of {}s", rows[0].0);
    ack(&mut c, &d).await.unwrap();

    // Zero retention clears it; base above the (merged) cap is refused.
    let q = a
        .update_queue(pb::UpdateQueueRequest {
            queue: "cfg".into(),
            completed_retention: secs(0),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(q.settings.unwrap().completed_retention, None);
    let e = a
        .update_queue(pb::UpdateQueueRequest {
            queue: "cfg".into(),
            backoff_base: secs(7200),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("backoff_base:"), "{}", e.message());

    // Unknown queue: NOT_FOUND, unless asked to create it.
    let e = a
        .update_queue(pb::UpdateQueueRequest {
            queue: "fresh".into(),
            max_attempts: Some(5),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let q = a
        .update_queue(pb::UpdateQueueRequest {
            queue: "fresh".into(),
            max_attempts: Some(5),
            create: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(q.settings.unwrap().max_attempts, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_accepts_jobs_but_delivers_none_until_resumed() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    enqueue(&mut c, "p", "first").await;
    let q = a
        .pause_queue(pb::PauseQueueRequest { queue: "p".into() })
        .await
        .unwrap()
        .into_inner();
    assert!(q.settings.unwrap().paused);
    let mut s = subscribe(&mut c, &["p"], 10, None).await;
    enqueue(&mut c, "p", "second").await;
    assert!(
        try_next_delivery(&mut s, Duration::from_millis(1500))
            .await
            .is_none(),
        "a paused queue delivered"
    );
    assert_eq!(stats(&get_queue(&mut a, "p").await).available, 2);

    let q = a
        .resume_queue(pb::ResumeQueueRequest { queue: "p".into() })
        .await
        .unwrap()
        .into_inner();
    assert!(!q.settings.unwrap().paused);
    // Woken at once: well before the 10 s fallback poll.
    let got: HashSet<_> = [
        next_delivery(&mut s, S5).await,
        next_delivery(&mut s, S5).await,
    ]
    .into_iter()
    .map(|d| String::from_utf8(d.job.unwrap().payload).unwrap())
    .collect();
    assert_eq!(got, HashSet::from(["first".into(), "second".into()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_wakes_streams_on_another_replica() {
    let db = TestDb::new().await;
    let b1 = TestBroker::start(&db).await;
    let b2 = TestBroker::start(&db).await;
    let mut c1 = b1.client().await;
    let mut a2 = admin(&b2).await;
    enqueue(&mut c1, "rp", "x").await;
    a2.pause_queue(pb::PauseQueueRequest { queue: "rp".into() })
        .await
        .unwrap();
    let mut s = subscribe(&mut c1, &["rp"], 1, None).await;
    assert!(
        try_next_delivery(&mut s, Duration::from_millis(1000))
            .await
            .is_none()
    );
    a2.resume_queue(pb::ResumeQueueRequest { queue: "rp".into() })
        .await
        .unwrap();
    next_delivery(&mut s, S5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_queue_deletes_waiting_jobs_and_leaves_leased_ones() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    for i in 0..4 {
        enqueue(&mut c, "pq", &format!("{i}")).await;
    }
    c.enqueue(pb::EnqueueRequest {
        delay: secs(3600),
        ..job("pq", "later")
    })
    .await
    .unwrap();
    enqueue(&mut c, "keep", "other queue").await;
    let mut s = subscribe(&mut c, &["pq"], 1, None).await;
    let d = next_delivery(&mut s, S5).await;
    let r = a
        .purge_queue(pb::PurgeQueueRequest { queue: "pq".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.purged, 4, "3 ready + 1 scheduled");
    assert_eq!(
        db.live_jobs().await,
        2,
        "the leased job and the other queue's"
    );
    ack(&mut c, &d).await.expect("the leased job is still held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_job_finds_live_and_dead_jobs() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let mut req = job("gj", "payload-1");
    req.headers
        .insert("traceparent".into(), "00-abc-def-01".into());
    req.dedup_key = "k1".into();
    req.priority = 7;
    let id = c.enqueue(req).await.unwrap().into_inner().job_id;
    let j = a
        .get_job(pb::GetJobRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(j.state(), pb::JobState::Available);
    assert_eq!(j.payload, b"payload-1");
    assert_eq!(j.headers["traceparent"], "00-abc-def-01");
    assert_eq!((j.priority, j.attempt, j.dedup_key.as_str()), (7, 0, "k1"));
    assert!(j.run_at.is_some() && j.enqueued_at.is_some());

    let mut s = subscribe(&mut c, &["gj"], 1, None).await;
    let d = next_delivery(&mut s, S5).await;
    let j = a
        .get_job(pb::GetJobRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(j.state(), pb::JobState::Leased);
    assert_eq!((j.attempt, j.leased_by.as_str()), (1, "test"));
    assert!(j.lease_expires_at.is_some());

    nack_dead(&mut c, &d, "broken").await;
    let j = a
        .get_job(pb::GetJobRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(j.state(), pb::JobState::Dead);
    assert_eq!(
        (j.dead_reason.as_str(), j.last_error.as_str()),
        ("nacked", "broken")
    );
    assert!(j.died_at.is_some());
    assert_eq!(j.payload, b"payload-1");

    let e = a
        .get_job(pb::GetJobRequest {
            job_id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_jobs_pagination_walks_every_job_exactly_once() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let mut want = Vec::new();
    for batch in 0..3 {
        let jobs: Vec<_> = (0..50)
            .map(|i| {
                job(
                    if i % 3 == 0 { "lj-b" } else { "lj-a" },
                    &format!("{batch}-{i}"),
                )
            })
            .collect();
        let r = c
            .enqueue_batch(pb::EnqueueBatchRequest { jobs })
            .await
            .unwrap()
            .into_inner();
        want.extend(r.results.into_iter().map(|r| r.job_id));
    }
    let walk = |queue: &'static str, state: pb::JobState, page_size: u32| {
        let mut a = a.clone();
        async move {
            let mut ids = Vec::new();
            let mut token = String::new();
            for _ in 0..200 {
                let page = a
                    .list_jobs(pb::ListJobsRequest {
                        queue: queue.into(),
                        state: state as i32,
                        page_size,
                        page_token: token.clone(),
                        include_payload: false,
                        key: String::new(),
                    })
                    .await
                    .unwrap()
                    .into_inner();
                assert!(page.jobs.len() <= page_size as usize);
                assert!(page.jobs.iter().all(|j| j.payload.is_empty()));
                ids.extend(page.jobs.into_iter().map(|j| j.id));
                token = page.next_page_token;
                if token.is_empty() {
                    return ids;
                }
            }
            panic!("pagination did not end");
        }
    };
    let all = walk("", pb::JobState::Unspecified, 7).await;
    let mut sorted = want.clone();
    sorted.sort();
    assert_eq!(all, sorted, "every job once, in enqueue (id) order");
    let a_ids = walk("lj-a", pb::JobState::Unspecified, 10).await;
    let b_ids = walk("lj-b", pb::JobState::Available, 1000).await;
    assert_eq!(a_ids.len() + b_ids.len(), 150);
    assert_eq!(b_ids.len(), 51);
    assert!(walk("lj-b", pb::JobState::Leased, 10).await.is_empty());

    // A page boundary exactly at the end gives one empty last page, not an error.
    let exact = walk("lj-b", pb::JobState::Available, 51).await;
    assert_eq!(exact.len(), 51);

    // State filters see the derived state.
    let mut s = subscribe(&mut c, &["lj-b"], 2, None).await;
    next_delivery(&mut s, S5).await;
    next_delivery(&mut s, S5).await;
    assert_eq!(walk("lj-b", pb::JobState::Leased, 10).await.len(), 2);
    assert_eq!(walk("lj-b", pb::JobState::Available, 10).await.len(), 49);

    // Payloads on request.
    let page = a
        .list_jobs(pb::ListJobsRequest {
            queue: "lj-a".into(),
            page_size: 1,
            include_payload: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!page.jobs[0].payload.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_job_fences_its_holder_and_returns_the_credit() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let waiting = enqueue(&mut c, "cj", "first").await;
    enqueue(&mut c, "cj", "second").await;
    let mut s = subscribe(&mut c, &["cj"], 1, Some(Duration::from_secs(600))).await;
    let d = next_delivery(&mut s, S5).await;
    let held = d.job.as_ref().unwrap().id.clone();
    assert_eq!(held, waiting);
    let r = a
        .cancel_job(pb::CancelJobRequest {
            job_id: held.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.was_leased);
    let e = ack(&mut c, &d).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    // The stream's only credit came back with the cancel: the second job
    // arrives without waiting for the 600 s lease.
    let d2 = next_delivery(&mut s, S5).await;
    assert_eq!(d2.job.unwrap().payload, b"second");
    let e = a
        .cancel_job(pb::CancelJobRequest { job_id: held })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_list_requeue_deliver_again_and_purge() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    for i in 0..3 {
        enqueue(&mut c, "dl", &format!("{i}")).await;
    }
    let mut s = subscribe(&mut c, &["dl"], 3, None).await;
    for _ in 0..3 {
        let d = next_delivery(&mut s, S5).await;
        nack_dead(&mut c, &d, "bad").await;
    }
    let list = a
        .list_dead_letters(pb::ListDeadLettersRequest {
            queue: "dl".into(),
            page_size: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.jobs.len(), 2);
    assert!(list.jobs.iter().all(|j| j.state() == pb::JobState::Dead));
    let rest = a
        .list_dead_letters(pb::ListDeadLettersRequest {
            queue: "dl".into(),
            page_size: 2,
            page_token: list.next_page_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rest.jobs.len(), 1);
    assert!(rest.next_page_token.is_empty());
    // A dead-letter token is not accepted by the live listing.
    let e = a
        .list_jobs(pb::ListJobsRequest {
            page_token: list.next_page_token,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // Requeue one by id: delivered again, attempt counting from 1.
    let one = list.jobs[0].id.clone();
    let r = a
        .requeue_dead_letters(pb::DeadLettersSelector {
            ids: vec![one.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.requeued, r.skipped_duplicates), (1, 0));
    let d = next_delivery(&mut s, S5).await;
    let j = d.job.as_ref().unwrap();
    assert_eq!((j.id.as_str(), j.attempt), (one.as_str(), 1));
    assert_eq!(j.last_error, "bad");
    ack(&mut c, &d).await.unwrap();

    // Requeue the whole queue.
    let r = a
        .requeue_dead_letters(pb::DeadLettersSelector {
            queue: "dl".into(),
            all: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.requeued, 2);
    assert_eq!(db.dead_jobs().await, 0);
    for _ in 0..2 {
        let d = next_delivery(&mut s, S5).await;
        nack_dead(&mut c, &d, "still bad").await;
    }
    let r = a
        .purge_dead_letters(pb::DeadLettersSelector {
            queue: "dl".into(),
            all: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.purged, 2);
    assert_eq!(db.dead_jobs().await, 0);
    assert_eq!(db.live_jobs().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_skips_a_dead_letter_whose_dedup_key_is_live() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    c.enqueue(pb::EnqueueRequest {
        dedup_key: "k".into(),
        ..job("dd", "old")
    })
    .await
    .unwrap();
    let mut s = subscribe(&mut c, &["dd"], 1, None).await;
    let d = next_delivery(&mut s, S5).await;
    nack_dead(&mut c, &d, "x").await;
    drop(s);
    // The key is free again; a new job takes it.
    c.enqueue(pb::EnqueueRequest {
        dedup_key: "k".into(),
        ..job("dd", "new")
    })
    .await
    .unwrap();
    let r = a
        .requeue_dead_letters(pb::DeadLettersSelector {
            queue: "dd".into(),
            all: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.requeued, r.skipped_duplicates), (0, 1));
    assert_eq!((db.live_jobs().await, db.dead_jobs().await), (1, 1));
}

/// Sets a queue's completed retention (creating the queue); 0 clears it.
async fn set_retention(a: &mut Admin, queue: &str, retention: Duration) {
    update(a, |r| {
        r.queue = queue.into();
        r.completed_retention = Some(dur(retention));
    })
    .await;
}

async fn get_job_state(a: &mut Admin, id: &str) -> Result<pb::JobInfo, tonic::Status> {
    a.get_job(pb::GetJobRequest { job_id: id.into() })
        .await
        .map(|r| r.into_inner())
}

/// Enqueues one job on `queue`, takes it on a fresh stream and acks it.
/// Returns its id.
async fn enqueue_and_ack(c: &mut Client, queue: &str, payload: &str) -> String {
    let id = enqueue(c, queue, payload).await;
    let mut s = subscribe(c, &[queue], 1, None).await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(id_of(&d), id);
    ack(c, &d).await.expect("ack");
    id
}

async fn completed_rows(db: &TestDb, queue: &str) -> i64 {
    sqlx::query_scalar("select count(*) from leaseq.completed_jobs where queue = $1")
        .bind(queue)
        .fetch_one(&db.pool)
        .await
        .expect("completed rows")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_jobs_of_a_queue_with_retention_are_kept_as_completed() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    set_retention(&mut a, "kept", Duration::from_secs(3600)).await;

    let mut req = job("kept", "done-1");
    req.headers
        .insert("traceparent".into(), "00-abc-def-01".into());
    req.priority = 3;
    req.dedup_key = "k1".into();
    let id = c.enqueue(req).await.unwrap().into_inner().job_id;
    let mut s = subscribe(&mut c, &["kept"], 1, None).await;
    let d = next_delivery(&mut s, S5).await;
    // A failed first attempt: its error stays on the record.
    c.nack(pb::NackRequest {
        job_id: id.clone(),
        lease_token: d.lease_token.clone(),
        error: "flaky".into(),
        retry_after: Some(dur(Duration::ZERO)),
        dead_letter: false,
    })
    .await
    .unwrap();
    assert_eq!(
        completed_rows(&db, "kept").await,
        0,
        "a nack is no completion"
    );
    let d = next_delivery(&mut s, S5).await;
    ack(&mut c, &d).await.unwrap();

    let j = get_job_state(&mut a, &id)
        .await
        .expect("a kept job is found");
    assert_eq!(j.state(), pb::JobState::Completed);
    assert_eq!(
        (j.queue.as_str(), j.payload.as_slice()),
        ("kept", &b"done-1"[..])
    );
    assert_eq!(j.headers["traceparent"], "00-abc-def-01");
    assert_eq!((j.priority, j.attempt, j.dedup_key.as_str()), (3, 2, "k1"));
    assert_eq!(
        (j.last_error.as_str(), j.completed_by.as_str()),
        ("flaky", "test")
    );
    assert!(j.enqueued_at.is_some() && j.completed_at.is_some());
    assert!(j.lease_expires_at.is_none() && j.died_at.is_none() && j.leased_by.is_empty());
    drop(s);

    // ListJobs(COMPLETED) pages through them; the live listing does not show
    // them, and a completed-listing token is not a live-listing token.
    let mut want = vec![id.clone()];
    for i in 0..2 {
        want.push(enqueue_and_ack(&mut c, "kept", &format!("more-{i}")).await);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut first_token = None;
    for _ in 0..10 {
        let page = a
            .list_jobs(pb::ListJobsRequest {
                queue: "kept".into(),
                state: pb::JobState::Completed as i32,
                page_size: 2,
                page_token: token.clone(),
                include_payload: true,
                key: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.jobs.len() <= 2);
        assert!(
            page.jobs
                .iter()
                .all(|j| j.state() == pb::JobState::Completed)
        );
        assert!(page.jobs.iter().all(|j| !j.payload.is_empty()));
        seen.extend(page.jobs.into_iter().map(|j| j.id));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
        first_token.get_or_insert(token.clone());
    }
    want.sort();
    assert_eq!(seen, want, "every completed job once, in id order");
    let live = a
        .list_jobs(pb::ListJobsRequest {
            queue: "kept".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(live.jobs.is_empty(), "{:?}", live.jobs);
    let e = a
        .list_jobs(pb::ListJobsRequest {
            page_token: first_token.expect("two pages"),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // Cancelled and dead-lettered jobs of the same queue are not completions.
    let cancelled = enqueue(&mut c, "kept", "cancel me").await;
    a.cancel_job(pb::CancelJobRequest {
        job_id: cancelled.clone(),
    })
    .await
    .unwrap();
    let dead = enqueue(&mut c, "kept", "poison").await;
    let mut s = subscribe(&mut c, &["kept"], 1, None).await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(id_of(&d), dead);
    nack_dead(&mut c, &d, "poison").await;
    assert_eq!(
        get_job_state(&mut a, &dead).await.unwrap().state(),
        pb::JobState::Dead
    );
    assert_eq!(
        get_job_state(&mut a, &cancelled).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(completed_rows(&db, "kept").await, 3);

    // A completed job's dedup key is free, as after a plain ack.
    let r = c
        .enqueue(pb::EnqueueRequest {
            dedup_key: "k1".into(),
            ..job("kept", "again")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.duplicate);

    // A queue without retention: an acked job is gone at once.
    let gone = enqueue_and_ack(&mut c, "plain", "x").await;
    let e = get_job_state(&mut a, &gone).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(completed_rows(&db, "plain").await, 0);
    let none = a
        .list_jobs(pb::ListJobsRequest {
            queue: "plain".into(),
            state: pb::JobState::Completed as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(none.jobs.is_empty() && none.next_page_token.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_jobs_are_deleted_once_past_their_queues_retention() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|cfg| {
            cfg.retention_interval = Duration::from_millis(100);
        })
        .start()
        .await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    for q in ["short", "cleared", "long"] {
        set_retention(&mut a, q, Duration::from_secs(3600)).await;
    }
    let short = enqueue_and_ack(&mut c, "short", "s").await;
    let cleared = enqueue_and_ack(&mut c, "cleared", "c").await;
    let long = enqueue_and_ack(&mut c, "long", "l").await;
    for id in [&short, &cleared, &long] {
        assert_eq!(
            get_job_state(&mut a, id).await.unwrap().state(),
            pb::JobState::Completed
        );
    }
    let completed_at = |j: pb::JobInfo| {
        let t = j.completed_at.expect("completed_at");
        chrono::DateTime::from_timestamp(t.seconds, t.nanos as u32).unwrap()
    };
    let short_done = completed_at(get_job_state(&mut a, &short).await.unwrap());

    // A shorter retention applies to the records already kept: deleted once
    // a second old (by the database clock), not before.
    set_retention(&mut a, "short", Duration::from_secs(1)).await;
    // A cleared retention keeps nothing.
    set_retention(&mut a, "cleared", Duration::ZERO).await;
    eventually(
        Duration::from_secs(20),
        "records past retention deleted",
        || async {
            completed_rows(&db, "short").await == 0 && completed_rows(&db, "cleared").await == 0
        },
    )
    .await;
    let age: f64 = sqlx::query_scalar("select extract(epoch from now() - $1)::float8")
        .bind(short_done)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        age >= 1.0,
        "deleted when {age}s old, before its 1s retention"
    );
    for id in [&short, &cleared] {
        let e = get_job_state(&mut a, id).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
    }
    // The retention loop ran many times meanwhile; the hour-long record stays.
    assert_eq!(
        get_job_state(&mut a, &long).await.unwrap().state(),
        pb::JobState::Completed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_queue_deletes_the_queues_completed_jobs() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    for q in ["pc", "other"] {
        set_retention(&mut a, q, Duration::from_secs(3600)).await;
    }
    let done: Vec<String> = [
        enqueue_and_ack(&mut c, "pc", "1").await,
        enqueue_and_ack(&mut c, "pc", "2").await,
    ]
    .into();
    let other = enqueue_and_ack(&mut c, "other", "3").await;
    enqueue(&mut c, "pc", "waiting").await;
    let r = a
        .purge_queue(pb::PurgeQueueRequest { queue: "pc".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.purged, r.purged_completed), (1, 2));
    for id in &done {
        let e = get_job_state(&mut a, id).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
    }
    assert_eq!(completed_rows(&db, "pc").await, 0);
    assert_eq!(
        get_job_state(&mut a, &other).await.unwrap().state(),
        pb::JobState::Completed,
        "another queue's records stay"
    );
    assert_eq!(db.live_jobs().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_queues_pushes_a_snapshot_then_changes() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    enqueue(&mut c, "w", "1").await;
    let mut watch = a
        .watch_queues(pb::WatchQueuesRequest {
            queues: vec!["w".into()],
            // Pushes below come from changes, not from this interval.
            interval: secs(3600),
        })
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(S5, watch.message())
        .await
        .expect("first push")
        .unwrap()
        .unwrap();
    assert_eq!(first.queues.len(), 1);
    assert_eq!(stats(&first.queues[0]).available, 1);
    enqueue(&mut c, "w", "2").await;
    let next = tokio::time::timeout(S5, watch.message())
        .await
        .expect("a push after the change")
        .unwrap()
        .unwrap();
    assert_eq!(stats(&next.queues[0]).available, 2);

    // A short interval pushes even without changes.
    let mut w2 = a
        .watch_queues(pb::WatchQueuesRequest {
            queues: vec![],
            interval: secs(1),
        })
        .await
        .unwrap()
        .into_inner();
    for _ in 0..2 {
        let m = tokio::time::timeout(S5, w2.message())
            .await
            .expect("periodic push")
            .unwrap()
            .unwrap();
        assert_eq!(m.queues.len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_end_unavailable_on_drain() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut a = admin(&broker).await;
    let mut watch = a
        .watch_queues(pb::WatchQueuesRequest::default())
        .await
        .unwrap()
        .into_inner();
    watch.message().await.unwrap().unwrap();
    broker.begin_shutdown();
    let status = loop {
        match tokio::time::timeout(S5, watch.message()).await {
            Err(_) => panic!("watch not ended within 5s of a drain"),
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => panic!("ended without a status"),
            Ok(Err(s)) => break s,
        }
    };
    assert_eq!(status.code(), Code::Unavailable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_service_has_its_own_health_name_and_is_in_reflection() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    assert_eq!(
        health(broker.addr, "leaseq.v1.AdminService").await,
        Some(ServingStatus::Serving)
    );
    let r = reflection_v1(broker.addr, "leaseq.v1.AdminService").await;
    assert!(
        r.services.iter().any(|s| s == "leaseq.v1.AdminService"),
        "{:?}",
        r.services
    );
    assert!(
        !r.files.is_empty(),
        "no descriptor for leaseq.v1.AdminService"
    );
    // Not SERVING from the first moment of a drain (a stream keeps the
    // server up while it drains).
    let mut c = broker.client().await;
    let _s = subscribe(&mut c, &["h"], 1, None).await;
    broker.begin_shutdown();
    wait_not_serving(broker.addr, "leaseq.v1.AdminService", S5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_with_big_payloads_end_early_and_still_walk_every_job() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let big = "x".repeat(1024 * 1024);
    let mut want = Vec::new();
    // Two per batch: a message of five would pass --max-message-bytes (4 MiB).
    for _ in 0..10 {
        let jobs: Vec<_> = (0..2).map(|_| job("big", &big)).collect();
        let r = c
            .enqueue_batch(pb::EnqueueBatchRequest { jobs })
            .await
            .unwrap()
            .into_inner();
        want.extend(r.results.into_iter().map(|r| r.job_id));
    }
    want.sort();
    let mut seen = Vec::new();
    let mut pages = 0;
    let mut token = String::new();
    for _ in 0..40 {
        let page = a
            .list_jobs(pb::ListJobsRequest {
                queue: "big".into(),
                page_size: 1000,
                page_token: token.clone(),
                include_payload: true,
                ..Default::default()
            })
            .await
            .expect("a page within the client's default 4 MiB limit")
            .into_inner();
        pages += 1;
        assert!(page.jobs.iter().all(|j| j.payload.len() == big.len()));
        seen.extend(page.jobs.into_iter().map(|j| j.id));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen, want);
    assert!(
        pages >= 10,
        "{pages} pages: at most ~2 MiB of payloads per page"
    );
}
