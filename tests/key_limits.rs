//! Per-key limits and fair shares across keys (issue 33 items 3 and 4):
//! `key_concurrency` without order, `key_rate_limit`, `key_overrides` for
//! named keys, and `fair_by_key`, whose lease rounds serve the keys in turn
//! (lease_keys.sql). Against a real broker and PostgreSQL; two replicas
//! where a limit must hold across them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::*;
use leaseq::pb;
use tonic::Code;

fn keyed(queue: &str, key: &str, payload: &str) -> pb::EnqueueRequest {
    let mut r = job(queue, payload);
    r.key = key.into();
    r
}

async fn enqueue_keyed(c: &mut Client, queue: &str, key: &str, payload: &str) {
    c.enqueue(keyed(queue, key, payload))
        .await
        .expect("enqueue");
}

/// `n` jobs of `key`, payloads `{key}{i}`, in batches of 500.
async fn enqueue_many_keyed(c: &mut Client, queue: &str, key: &str, n: usize) {
    let all: Vec<pb::EnqueueRequest> = (0..n)
        .map(|i| keyed(queue, key, &format!("{key}{i}")))
        .collect();
    for chunk in all.chunks(500) {
        c.enqueue_batch(pb::EnqueueBatchRequest {
            jobs: chunk.to_vec(),
        })
        .await
        .expect("enqueue_batch");
    }
}

const S5: Duration = Duration::from_secs(5);
const QUIET: Duration = Duration::from_millis(600);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn key_of(d: &pb::Delivery) -> String {
    job_of(d).key.clone()
}

/// Deliveries from either stream until `n` arrived or `limit` passed.
async fn from_both(
    s1: &mut JobStream,
    s2: &mut JobStream,
    n: usize,
    limit: Duration,
) -> Vec<pb::Delivery> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    while got.len() < n && tokio::time::Instant::now() < deadline {
        tokio::select! {
            Some(d) = async { try_next_delivery(s1, Duration::from_millis(100)).await } => got.push(d),
            Some(d) = async { try_next_delivery(s2, Duration::from_millis(100)).await } => got.push(d),
            else => {}
        }
    }
    got
}

fn count_keys(ds: &[pb::Delivery]) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for d in ds {
        *m.entry(key_of(d)).or_default() += 1;
    }
    m
}

/// `key_concurrency` without `ordered_by_key`: at most N of a key leased at
/// once over two replicas' streams, in any order; other keys and jobs
/// without a key are not held back; an ack lets the key's next one go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_concurrency_without_order_holds_across_replicas() {
    let db = TestDb::new().await;
    let b1 = TestBroker::start(&db).await;
    let b2 = TestBroker::start(&db).await;
    let mut c1 = b1.client().await;
    let mut c2 = b2.client().await;
    let mut a = admin(&b1).await;
    let s = update(&mut a, |r| {
        r.queue = "kc".into();
        r.key_concurrency = Some(2);
    })
    .await;
    assert_eq!((s.ordered_by_key, s.key_concurrency), (false, 2));
    enqueue_many_keyed(&mut c1, "kc", "big", 6).await;
    enqueue_keyed(&mut c1, "kc", "small", "small0").await;
    enqueue(&mut c1, "kc", "nokey").await;
    let mut s1 = subscribe(&mut c1, &["kc"], 10, Some(secs(30))).await;
    let mut s2 = subscribe(&mut c2, &["kc"], 10, Some(secs(30))).await;
    let got = from_both(&mut s1, &mut s2, 4, S5).await;
    let n = count_keys(&got);
    assert_eq!(
        (n.get("big"), n.get("small"), n.get("")),
        (Some(&2), Some(&1), Some(&1)),
        "{n:?}"
    );
    let more = from_both(&mut s1, &mut s2, 1, QUIET).await;
    assert!(
        more.is_empty(),
        "a third job of the key: {:?}",
        count_keys(&more)
    );
    // An ack through the other replica frees one place of the key.
    let big = got.iter().find(|d| key_of(d) == "big").unwrap();
    ack(&mut c2, big).await.unwrap();
    let next = from_both(&mut s1, &mut s2, 2, S5).await;
    assert_eq!(count_keys(&next).get("big"), Some(&1), "one more, not two");
}

/// A per-key rate limit paces each key apart: one key's jobs start no
/// faster than the rate, and another key's start meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rate_limit_paces_each_key_apart() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let s = update(&mut a, |r| {
        r.queue = "kr".into();
        r.key_rate_limit = Some(4.0);
    })
    .await;
    assert_eq!((s.key_rate_limit, s.key_rate_burst), (4.0, 4));
    // The default bucket holds 4: four of a key start at once, the fifth a
    // token (250 ms) later.
    enqueue_many_keyed(&mut c, "kr", "burst", 5).await;
    let start = Instant::now();
    let mut s = subscribe(&mut c, &["kr"], 100, Some(secs(30))).await;
    let mut got = take(&mut s, 4, S5).await;
    let four = start.elapsed();
    got.push(next_delivery(&mut s, S5).await);
    let fifth = start.elapsed();
    for d in &got {
        ack(&mut c, d).await.unwrap();
    }
    assert!(
        fifth - four >= Duration::from_millis(150),
        "the fifth {:?} after the fourth",
        fifth - four
    );
    drop(s);
    let s = update(&mut a, |r| {
        r.queue = "kr".into();
        r.key_rate_burst = Some(1);
    })
    .await;
    assert_eq!(s.key_rate_burst, 1);
    enqueue_many_keyed(&mut c, "kr", "a", 4).await;
    enqueue_many_keyed(&mut c, "kr", "b", 4).await;
    let start = Instant::now();
    let mut s = subscribe(&mut c, &["kr"], 100, Some(secs(30))).await;
    let mut at: HashMap<String, Vec<Duration>> = HashMap::new();
    for _ in 0..8 {
        let d = next_delivery(&mut s, S5).await;
        at.entry(key_of(&d)).or_default().push(start.elapsed());
    }
    for (key, times) in &at {
        assert_eq!(times.len(), 4, "{key}");
        // 4 a second, bucket of 1: 250 ms apart (less a timer's slack).
        for w in times.windows(2) {
            assert!(
                w[1] - w[0] >= Duration::from_millis(200),
                "{key}: two jobs {:?} apart",
                w[1] - w[0]
            );
        }
    }
    // The two keys went side by side: b's first did not wait for a's last.
    assert!(at["b"][0] < at["a"][3] && at["a"][0] < at["b"][3], "{at:?}");
}

/// A named key's override: its own concurrency and rate, beside the
/// queue's setting for every other key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_override_gives_one_key_its_own_limit() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let s = update(&mut a, |r| {
        r.queue = "ko".into();
        r.key_concurrency = Some(1);
        r.key_overrides = Some(pb::KeyOverrides {
            overrides: vec![pb::KeyOverride {
                key: "vip".into(),
                concurrency: 3,
                weight: 2,
                ..Default::default()
            }],
        });
    })
    .await;
    assert_eq!(s.key_overrides.len(), 1);
    assert_eq!(
        (
            s.key_overrides[0].key.as_str(),
            s.key_overrides[0].concurrency
        ),
        ("vip", 3)
    );
    enqueue_many_keyed(&mut c, "ko", "vip", 5).await;
    enqueue_many_keyed(&mut c, "ko", "std", 5).await;
    let mut s = subscribe(&mut c, &["ko"], 20, Some(secs(30))).await;
    let got = take(&mut s, 4, S5).await;
    assert_quiet(&mut s, QUIET, "past the limits").await;
    let n = count_keys(&got);
    assert_eq!((n.get("vip"), n.get("std")), (Some(&3), Some(&1)), "{n:?}");
    // Cleared: vip falls back to the queue's 1 (it holds 3 now: none more).
    let s2 = update(&mut a, |r| {
        r.queue = "ko".into();
        r.key_overrides = Some(pb::KeyOverrides::default());
    })
    .await;
    assert!(s2.key_overrides.is_empty());
    for d in got.iter().filter(|d| key_of(d) == "vip").take(2) {
        ack(&mut c, d).await.unwrap();
    }
    assert_quiet(&mut s, QUIET, "vip still holds one of its one").await;
}

/// Fair shares: a tenant's backlog of 2,000 jobs does not hold back
/// another's 10, enqueued after it; without fairness it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_shares_let_a_small_key_through_a_big_backlog() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    for (queue, fair) in [("fair", true), ("unfair", false)] {
        let s = update(&mut a, |r| {
            r.queue = queue.into();
            r.fair_by_key = Some(fair);
        })
        .await;
        assert_eq!(s.fair_by_key, fair);
        enqueue_many_keyed(&mut c, queue, "A", 2000).await;
        enqueue_many_keyed(&mut c, queue, "B", 10).await;
        // A worker with 20 in flight that acks each job as it comes.
        let mut s = subscribe(&mut c, &[queue], 20, Some(secs(30))).await;
        let (mut a_before, mut b_seen) = (0, 0);
        while b_seen < 10 && a_before <= 1500 {
            let d = next_delivery(&mut s, S5).await;
            match key_of(&d).as_str() {
                "A" => a_before += 1,
                _ => b_seen += 1,
            }
            ack(&mut c, &d).await.unwrap();
        }
        if fair {
            // The first round serves both keys in turn: B's 10 within the
            // first ~20 jobs.
            assert_eq!(b_seen, 10);
            assert!(a_before <= 20, "{a_before} of A before B's 10");
        } else {
            assert!(a_before > 1500, "without fairness B waits behind A");
        }
    }
}

/// In a fair queue jobs without a key take one turn among the keys, when
/// they are at the head of the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_without_a_key_take_a_turn_in_a_fair_queue() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    update(&mut a, |r| {
        r.queue = "fu".into();
        r.fair_by_key = Some(true);
    })
    .await;
    for i in 0..5 {
        enqueue(&mut c, "fu", &format!("u{i}")).await;
    }
    enqueue_many_keyed(&mut c, "fu", "A", 5).await;
    enqueue_many_keyed(&mut c, "fu", "B", 5).await;
    // One job at a time: the turns go A, B, unkeyed, A, B, unkeyed, ...
    let mut s = subscribe(&mut c, &["fu"], 1, Some(secs(30))).await;
    let mut order = String::new();
    for _ in 0..9 {
        let d = next_delivery(&mut s, S5).await;
        let k = key_of(&d);
        order.push_str(if k.is_empty() { "u" } else { &k });
        ack(&mut c, &d).await.unwrap();
    }
    let mut turns: Vec<&str> = vec![&order[0..3], &order[3..6], &order[6..9]];
    turns.dedup();
    assert_eq!(turns.len(), 1, "the same turn order each time: {order}");
    let mut first: Vec<char> = order[0..3].chars().collect();
    first.sort_unstable();
    assert_eq!(first, ['A', 'B', 'u'], "{order}");
}

/// A queue both ordered and fair keeps each key's order through a retry
/// while the keys take turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_fair_queue_keeps_each_keys_order_through_a_retry() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    update(&mut a, |r| {
        r.queue = "of".into();
        r.ordered_by_key = Some(true);
        r.fair_by_key = Some(true);
    })
    .await;
    for k in ["x", "y"] {
        for i in 1..=3 {
            enqueue_keyed(&mut c, "of", k, &format!("{k}{i}")).await;
        }
    }
    let mut s = subscribe(&mut c, &["of"], 10, Some(secs(30))).await;
    let first = take(&mut s, 2, S5).await;
    let mut names: Vec<String> = first.iter().map(payload_of).collect();
    names.sort();
    assert_eq!(names, ["x1", "y1"]);
    assert_quiet(&mut s, QUIET, "one of a key at a time").await;
    let x1 = first.iter().find(|d| payload_of(d) == "x1").unwrap();
    c.nack(pb::NackRequest {
        job_id: id_of(x1),
        lease_token: x1.lease_token.clone(),
        error: "again".into(),
        retry_after: Some(dur(Duration::from_millis(800))),
        dead_letter: false,
    })
    .await
    .unwrap();
    assert_quiet(
        &mut s,
        Duration::from_millis(500),
        "x2 waits behind x1's retry",
    )
    .await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!((payload_of(&d).as_str(), job_of(&d).attempt), ("x1", 2));
    ack(&mut c, &d).await.unwrap();
    assert_eq!(payload_of(&next_delivery(&mut s, S5).await), "x2");
}

/// Every bad per-key setting is INVALID_ARGUMENT naming its field, and
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_settings_are_validated() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut a = admin(&broker).await;
    update(&mut a, |r| r.queue = "v".into()).await;
    let o = |key: &str, concurrency, rate_limit, weight| pb::KeyOverride {
        key: key.into(),
        concurrency,
        rate_limit,
        weight,
    };
    let overrides = |list: Vec<pb::KeyOverride>| Some(pb::KeyOverrides { overrides: list });
    let cases: Vec<(pb::UpdateQueueRequest, &str)> = vec![
        (
            pb::UpdateQueueRequest {
                key_rate_limit: Some(-1.0),
                ..Default::default()
            },
            "key_rate_limit",
        ),
        (
            pb::UpdateQueueRequest {
                key_rate_limit: Some(f64::NAN),
                ..Default::default()
            },
            "key_rate_limit",
        ),
        (
            pb::UpdateQueueRequest {
                key_rate_burst: Some(0x7fff_ffff),
                ..Default::default()
            },
            "key_rate_burst",
        ),
        (
            pb::UpdateQueueRequest {
                key_concurrency: Some(1001),
                ..Default::default()
            },
            "key_concurrency",
        ),
        (
            pb::UpdateQueueRequest {
                key_overrides: overrides(vec![o("", 1, 0.0, 0)]),
                ..Default::default()
            },
            "key_overrides[0].key",
        ),
        (
            pb::UpdateQueueRequest {
                key_overrides: overrides(vec![o("a", 1, 0.0, 0), o("a", 2, 0.0, 0)]),
                ..Default::default()
            },
            "key_overrides[1].key",
        ),
        (
            pb::UpdateQueueRequest {
                key_overrides: overrides(vec![o(&"k".repeat(257), 1, 0.0, 0)]),
                ..Default::default()
            },
            "key_overrides[0].key",
        ),
        (
            pb::UpdateQueueRequest {
                key_overrides: overrides(vec![o("a", 0, 0.0, 0)]),
                ..Default::default()
            },
            "key_overrides[0].key",
        ),
        (
            pb::UpdateQueueRequest {
                key_overrides: overrides(vec![o("a", 1001, 0.0, 0)]),
                ..Default::default()
            },
            "key_overrides[0].concurrency",
        ),
        (
            pb::UpdateQueueRequest {
                key_overrides: overrides(vec![o("a", 0, 1e9, 0)]),
                ..Default::default()
            },
            "key_overrides[0].rate_limit",
        ),
        (
            pb::UpdateQueueRequest {
                key_overrides: overrides(vec![o("a", 0, 0.0, 101)]),
                ..Default::default()
            },
            "key_overrides[0].weight",
        ),
        (
            pb::UpdateQueueRequest {
                key_overrides: overrides(
                    (0..1001).map(|i| o(&format!("k{i}"), 1, 0.0, 0)).collect(),
                ),
                ..Default::default()
            },
            "key_overrides",
        ),
    ];
    for (mut r, field) in cases {
        r.queue = "v".into();
        let e = a.update_queue(r).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e:?}");
        assert!(
            e.message().starts_with(&format!("{field}:")),
            "{field}: {}",
            e.message()
        );
    }
    let s = a
        .get_queue(pb::GetQueueRequest { queue: "v".into() })
        .await
        .unwrap()
        .into_inner()
        .settings
        .unwrap();
    assert_eq!(
        (
            s.fair_by_key,
            s.key_rate_limit,
            s.key_rate_burst,
            s.key_concurrency,
            s.key_overrides.len()
        ),
        (false, 0.0, 0, 0, 0)
    );
    // A thousand is the limit, and fits.
    let s = update(&mut a, |r| {
        r.queue = "v".into();
        r.key_overrides = overrides(
            (0..1000)
                .map(|i| o(&format!("k{i:04}"), 1, 0.0, 0))
                .collect(),
        );
    })
    .await;
    assert_eq!(s.key_overrides.len(), 1000);
    assert_eq!(s.key_overrides[0].key, "k0000");
}

/// A key's rate bucket row goes once the bucket is full again: the table
/// holds only the keys that started jobs lately, however many keys a queue
/// has seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_key_buckets_are_deleted() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|c| c.retention_interval = Duration::from_millis(200))
        .start()
        .await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    update(&mut a, |r| {
        r.queue = "kb".into();
        r.key_rate_limit = Some(1.0);
    })
    .await;
    for k in 0..20 {
        enqueue_keyed(&mut c, "kb", &format!("k{k}"), "x").await;
    }
    let mut s = subscribe(&mut c, &["kb"], 100, Some(secs(30))).await;
    for d in take(&mut s, 20, S5).await {
        ack(&mut c, &d).await.unwrap();
    }
    assert!(db.count("select count(*) from leaseq.key_buckets").await > 0);
    // One a second, a bucket of one: full a second after its job started.
    let deadline = Instant::now() + secs(5);
    while db.count("select count(*) from leaseq.key_buckets").await > 0 {
        assert!(Instant::now() < deadline, "buckets still there after 5 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
