//! Every field of every RPC at its limits and beyond: each bad request gets
//! the documented status with a message naming the field, and changes nothing.

mod common;

use std::time::Duration;

use common::*;
use leaseq::pb;
use prost_types::{Duration as PDuration, Timestamp};
use tonic::Code;

const INVALID: Code = Code::InvalidArgument;
const TOO_BIG: Code = Code::ResourceExhausted;

fn pd(seconds: i64, nanos: i32) -> Option<PDuration> {
    Some(PDuration { seconds, nanos })
}

fn enqueue_cases() -> Vec<(&'static str, pb::EnqueueRequest, Code, &'static str)> {
    let base = || job("ok", "x");
    let with = |f: &dyn Fn(&mut pb::EnqueueRequest)| {
        let mut r = base();
        f(&mut r);
        r
    };
    vec![
        ("empty queue", with(&|r| r.queue.clear()), INVALID, "queue"),
        (
            "long queue",
            with(&|r| r.queue = "q".repeat(129)),
            INVALID,
            "queue",
        ),
        (
            "space in queue",
            with(&|r| r.queue = "a b".into()),
            INVALID,
            "queue",
        ),
        (
            "non-ascii queue",
            with(&|r| r.queue = "é".into()),
            INVALID,
            "queue",
        ),
        (
            "slash in queue",
            with(&|r| r.queue = "a/b".into()),
            INVALID,
            "queue",
        ),
        (
            "queue starts with dot",
            with(&|r| r.queue = ".a".into()),
            INVALID,
            "queue",
        ),
        (
            "queue starts with dash",
            with(&|r| r.queue = "-a".into()),
            INVALID,
            "queue",
        ),
        (
            "payload over 1 MiB",
            with(&|r| r.payload = vec![0; 1024 * 1024 + 1]),
            TOO_BIG,
            "payload",
        ),
        (
            "empty header key",
            with(&|r| {
                r.headers.insert(String::new(), "v".into());
            }),
            INVALID,
            "headers",
        ),
        (
            "NUL in header value",
            with(&|r| {
                r.headers.insert("k".into(), "a\0b".into());
            }),
            INVALID,
            "headers",
        ),
        (
            "NUL in header key",
            with(&|r| {
                r.headers.insert("k\0".into(), "v".into());
            }),
            INVALID,
            "headers",
        ),
        (
            "too many headers",
            with(&|r| {
                for i in 0..65 {
                    r.headers.insert(format!("k{i}"), "v".into());
                }
            }),
            INVALID,
            "headers",
        ),
        (
            "huge header value",
            with(&|r| {
                r.headers.insert("k".into(), "v".repeat(16 * 1024 + 1));
            }),
            INVALID,
            "headers",
        ),
        (
            "negative delay",
            with(&|r| r.delay = pd(-1, 0)),
            INVALID,
            "delay",
        ),
        (
            "negative delay nanos",
            with(&|r| r.delay = pd(0, -5)),
            INVALID,
            "delay",
        ),
        (
            "delay nanos overflow",
            with(&|r| r.delay = pd(0, 1_000_000_000)),
            INVALID,
            "delay",
        ),
        (
            "delay over 10 years",
            with(&|r| r.delay = pd(400_000_000, 0)),
            INVALID,
            "delay",
        ),
        (
            "huge delay",
            with(&|r| r.delay = pd(i64::MAX, 0)),
            INVALID,
            "delay",
        ),
        (
            "delay and run_at",
            with(&|r| {
                r.delay = pd(1, 0);
                r.run_at = Some(Timestamp {
                    seconds: 1,
                    nanos: 0,
                });
            }),
            INVALID,
            "delay, run_at",
        ),
        (
            "run_at nanos out of range",
            with(&|r| {
                r.run_at = Some(Timestamp {
                    seconds: 1,
                    nanos: -1,
                })
            }),
            INVALID,
            "run_at",
        ),
        (
            "run_at after year 9999",
            with(&|r| {
                r.run_at = Some(Timestamp {
                    seconds: 253_402_300_800,
                    nanos: 0,
                })
            }),
            INVALID,
            "run_at",
        ),
        (
            "run_at before 1970",
            with(&|r| {
                r.run_at = Some(Timestamp {
                    seconds: -1,
                    nanos: 0,
                })
            }),
            INVALID,
            "run_at",
        ),
        (
            "long dedup_key",
            with(&|r| r.dedup_key = "k".repeat(513)),
            INVALID,
            "dedup_key",
        ),
        (
            "NUL in dedup_key",
            with(&|r| r.dedup_key = "a\0".into()),
            INVALID,
            "dedup_key",
        ),
        (
            "negative max_attempts",
            with(&|r| r.max_attempts = -1),
            INVALID,
            "max_attempts",
        ),
        (
            "max_attempts over 1000",
            with(&|r| r.max_attempts = 1001),
            INVALID,
            "max_attempts",
        ),
        ("negative ttl", with(&|r| r.ttl = pd(-1, 0)), INVALID, "ttl"),
        (
            "ttl over 10 years",
            with(&|r| r.ttl = pd(400_000_000, 0)),
            INVALID,
            "ttl",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_enqueues_are_rejected_and_change_nothing() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    for (name, req, code, field) in enqueue_cases() {
        let err = c.enqueue(req.clone()).await.expect_err(name);
        assert_eq!(err.code(), code, "{name}: {}", err.message());
        assert!(
            err.message().contains(field),
            "{name}: {:?} names {field}",
            err.message()
        );
        // The same job inside a batch, at index 1, is named by its index.
        let batch = pb::EnqueueBatchRequest {
            jobs: vec![job("ok", "fine"), req, job("ok", "fine")],
        };
        let err = c.enqueue_batch(batch).await.expect_err(name);
        assert_eq!(err.code(), code, "{name} in a batch");
        let want = format!("jobs[1].{field}");
        assert!(
            err.message().contains(&want),
            "{name}: {:?} names {want}",
            err.message()
        );
    }
    assert_eq!(db.live_jobs().await, 0, "nothing was enqueued");

    // The limits themselves are accepted.
    let mut edge = job(&"q".repeat(128), "x");
    edge.payload = vec![0; 1024 * 1024];
    edge.max_attempts = 1000;
    edge.dedup_key = "k".repeat(512);
    c.enqueue(edge).await.expect("values at the limits");
    let mut zero = job("ok", "x");
    zero.max_attempts = 0;
    zero.delay = pd(0, 0);
    zero.ttl = pd(0, 0);
    c.enqueue(zero).await.expect("zeros mean defaults");
    assert_eq!(db.live_jobs().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_batches_are_rejected() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let err = c
        .enqueue_batch(pb::EnqueueBatchRequest { jobs: vec![] })
        .await
        .unwrap_err();
    assert_eq!(err.code(), INVALID);
    assert!(err.message().contains("jobs"));
    let err = c
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: (0..1001).map(|_| job("ok", "x")).collect(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), TOO_BIG);
    assert!(err.message().contains("jobs"));
    assert_eq!(db.live_jobs().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_subscribes_are_rejected() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let base = || pb::SubscribeRequest {
        queues: vec!["ok".into()],
        consumer: "t".into(),
        max_in_flight: 1,
        lease: None,
    };
    let with = |f: &dyn Fn(&mut pb::SubscribeRequest)| {
        let mut r = base();
        f(&mut r);
        r
    };
    let cases = vec![
        ("no queues", with(&|r| r.queues.clear()), "queues"),
        (
            "bad queue at 1",
            with(&|r| r.queues = vec!["ok".into(), "a b".into()]),
            "queues[1]",
        ),
        (
            "duplicate queue",
            with(&|r| r.queues = vec!["ok".into(), "ok".into()]),
            "queues[1]",
        ),
        (
            "too many queues",
            with(&|r| r.queues = (0..65).map(|i| format!("q{i}")).collect()),
            "queues",
        ),
        (
            "max_in_flight too big",
            with(&|r| r.max_in_flight = 10_001),
            "max_in_flight",
        ),
        (
            "lease under 1s",
            with(&|r| r.lease = pd(0, 999_000_000)),
            "lease",
        ),
        (
            "lease over 12h",
            with(&|r| r.lease = pd(43_201, 0)),
            "lease",
        ),
        ("negative lease", with(&|r| r.lease = pd(-5, 0)), "lease"),
        (
            "NUL in consumer",
            with(&|r| r.consumer = "a\0".into()),
            "consumer",
        ),
        (
            "long consumer",
            with(&|r| r.consumer = "c".repeat(257)),
            "consumer",
        ),
    ];
    for (name, req, field) in cases {
        let err = c.subscribe(req).await.expect_err(name);
        assert_eq!(err.code(), INVALID, "{name}: {}", err.message());
        assert!(
            err.message().contains(field),
            "{name}: {:?} names {field}",
            err.message()
        );
    }
    let queues: i64 = db.count("select count(*) from leaseq.queues").await;
    assert_eq!(
        queues, 0,
        "no queue row was created by a rejected subscribe"
    );
    // Limits accepted: 10000 credits, 0 = default, 12 h lease, 64 queues.
    let mut ok = base();
    ok.max_in_flight = 10_000;
    ok.lease = pd(43_200, 0);
    ok.queues = (0..64).map(|i| format!("q{i}")).collect();
    c.subscribe(ok).await.expect("limits accepted");
    let mut zero = base();
    zero.max_in_flight = 0;
    c.subscribe(zero).await.expect("0 = default credits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settles_are_rejected_and_leave_the_lease_alone() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    enqueue(&mut c, "held", "x").await;
    let mut s = subscribe(&mut c, &["held"], 1, Some(Duration::from_secs(60))).await;
    let d = next_delivery(&mut s, Duration::from_secs(5)).await;
    let id = d.job.as_ref().unwrap().id.clone();
    let token = d.lease_token.clone();
    let unknown = uuid::Uuid::now_v7().to_string();
    let other_token = uuid::Uuid::new_v4().to_string();

    // (name, job_id, lease_token, code, field)
    let ids: Vec<(&str, String, String, Code, &str)> = vec![
        (
            "empty job_id",
            String::new(),
            token.clone(),
            INVALID,
            "job_id",
        ),
        (
            "job_id not a uuid",
            "nope".into(),
            token.clone(),
            INVALID,
            "job_id",
        ),
        (
            "empty token",
            id.clone(),
            String::new(),
            INVALID,
            "lease_token",
        ),
        (
            "token not a uuid",
            id.clone(),
            "nope".into(),
            INVALID,
            "lease_token",
        ),
        (
            "wrong token",
            id.clone(),
            other_token.clone(),
            Code::FailedPrecondition,
            "lease_token",
        ),
        (
            "unknown job",
            unknown.clone(),
            token.clone(),
            Code::FailedPrecondition,
            "lease_token",
        ),
    ];
    for (name, job_id, lease_token, code, field) in &ids {
        let checks = [
            c.ack(pb::AckRequest {
                job_id: job_id.clone(),
                lease_token: lease_token.clone(),
            })
            .await
            .map(|_| ()),
            c.nack(pb::NackRequest {
                job_id: job_id.clone(),
                lease_token: lease_token.clone(),
                dead_letter: true,
                ..Default::default()
            })
            .await
            .map(|_| ()),
            c.extend_lease(pb::ExtendLeaseRequest {
                job_id: job_id.clone(),
                lease_token: lease_token.clone(),
                lease: pd(5, 0),
            })
            .await
            .map(|_| ()),
        ];
        for (rpc, r) in ["ack", "nack", "extend"].iter().zip(checks) {
            let err = r.expect_err(name);
            assert_eq!(err.code(), *code, "{rpc} {name}: {}", err.message());
            if *code == INVALID {
                assert!(
                    err.message().contains(field),
                    "{rpc} {name}: {:?}",
                    err.message()
                );
            }
        }
    }
    let nacks = vec![
        (
            "error over 64 KiB",
            "e".repeat(64 * 1024 + 1),
            None,
            "error",
        ),
        ("NUL in error", "a\0b".to_string(), None, "error"),
        (
            "negative retry_after",
            String::new(),
            pd(-1, 0),
            "retry_after",
        ),
        (
            "retry_after nanos",
            String::new(),
            pd(0, 2_000_000_000),
            "retry_after",
        ),
    ];
    for (name, error, retry_after, field) in nacks {
        let err = c
            .nack(pb::NackRequest {
                job_id: id.clone(),
                lease_token: token.clone(),
                error,
                retry_after,
                dead_letter: false,
            })
            .await
            .expect_err(name);
        assert_eq!(err.code(), INVALID, "{name}");
        assert!(err.message().contains(field), "{name}: {:?}", err.message());
    }
    for (name, lease) in [
        ("missing lease", None),
        ("lease under 1s", pd(0, 500_000_000)),
        ("lease over 12h", pd(43_201, 0)),
    ] {
        let err = c
            .extend_lease(pb::ExtendLeaseRequest {
                job_id: id.clone(),
                lease_token: token.clone(),
                lease,
            })
            .await
            .expect_err(name);
        assert_eq!(err.code(), INVALID, "{name}");
        assert!(
            err.message().contains("lease"),
            "{name}: {:?}",
            err.message()
        );
    }

    // Nothing changed: the job is still leased under its token, once.
    let (state, attempt): (String, i32) =
        sqlx::query_as("select state, attempt from leaseq.jobs where id = $1::uuid")
            .bind(&id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), attempt), ("leased", 1));
    assert_eq!(db.dead_jobs().await, 0);
    ack(&mut c, &d)
        .await
        .expect("the real holder can still ack");

    // And the broker is fine.
    enqueue(&mut c, "held", "after").await;
    let d = next_delivery(&mut s, Duration::from_secs(5)).await;
    assert_eq!(d.job.unwrap().payload, b"after");
}
