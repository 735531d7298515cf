//! Keys made visible to operators (issue 33 item 6): the key counts of
//! GetQueue / ListQueues (`QueueStats.keys_waiting`, `keys_leased`,
//! `keys_waiting_capped`), ListJobs filtered by key, and ListKeys, against
//! a real broker and PostgreSQL; over three clusters where a queue's jobs
//! sit on two of them (a bucket move). The CLI's `jobs --key` and `keys`
//! run the real binary.

use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use tonic::Code;

const S5: Duration = Duration::from_secs(5);

fn keyed(queue: &str, key: &str, payload: &str) -> pb::EnqueueRequest {
    let mut r = job(queue, payload);
    r.key = key.into();
    r
}

async fn enqueue_keyed(c: &mut Client, r: pb::EnqueueRequest) -> String {
    c.enqueue(r).await.expect("enqueue").into_inner().job_id
}

async fn stats(a: &mut Admin, queue: &str) -> pb::QueueStats {
    a.get_queue(pb::GetQueueRequest {
        queue: queue.into(),
    })
    .await
    .expect("get_queue")
    .into_inner()
    .stats
    .expect("stats")
}

fn list_keys_req(queue: &str, order: pb::KeyOrder, page_size: u32) -> pb::ListKeysRequest {
    pb::ListKeysRequest {
        queue: queue.into(),
        page_size,
        page_token: String::new(),
        order: order as i32,
    }
}

/// Every key of the queue in key order, page by page: (key, waiting,
/// leased, has an oldest age), and the number of pages.
async fn all_keys(
    a: &mut Admin,
    queue: &str,
    page_size: u32,
) -> (Vec<(String, i64, i64, bool)>, usize) {
    let mut out = Vec::new();
    let mut req = list_keys_req(queue, pb::KeyOrder::Key, page_size);
    let mut pages = 0;
    loop {
        let page = a
            .list_keys(req.clone())
            .await
            .expect("list_keys")
            .into_inner();
        pages += 1;
        let most = if page_size == 0 {
            100
        } else {
            page_size as usize
        };
        assert!(page.keys.len() <= most, "{page:?}");
        out.extend(
            page.keys
                .into_iter()
                .map(|k| (k.key, k.waiting, k.leased, k.oldest_available_age.is_some())),
        );
        if page.next_page_token.is_empty() {
            return (out, pages);
        }
        req.page_token = page.next_page_token;
        assert!(pages < 100, "paging does not end");
    }
}

async fn jobs_of_key(a: &mut Admin, queue: &str, key: &str, state: pb::JobState) -> Vec<String> {
    let r = a
        .list_jobs(pb::ListJobsRequest {
            queue: queue.into(),
            state: state as i32,
            key: key.into(),
            ..Default::default()
        })
        .await
        .expect("list_jobs")
        .into_inner();
    assert!(r.jobs.iter().all(|j| j.key == key), "{r:?}");
    r.jobs.into_iter().map(|j| j.id).collect()
}

/// The key counts follow the jobs through their states: waiting counts
/// keys with an available or scheduled job, leased the keys with a job in
/// flight, dead letters and jobs without a key count in neither; ListKeys
/// shows each key's jobs, by key (paged) and most waiting first; ListJobs
/// lists one key's jobs, with a state and across queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_counts_listings_and_the_key_filter_follow_the_jobs() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    let q = "vis";

    // No keyed job: nothing counted.
    enqueue(&mut c, q, "plain").await;
    let s = stats(&mut a, q).await;
    assert_eq!(
        (s.keys_waiting, s.keys_leased, s.keys_waiting_capped),
        (0, 0, false)
    );

    // e: a dead letter.
    let e1 = enqueue_keyed(&mut c, keyed(q, "e", "e1")).await;
    let mut s1 = subscribe(&mut c, &[q], 1, Some(Duration::from_secs(60))).await;
    // The plain job was enqueued first: take it and e1 on a stream of one.
    let d = next_delivery(&mut s1, S5).await;
    ack(&mut c, &d).await.unwrap();
    let d = next_delivery(&mut s1, S5).await;
    assert_eq!(payload_of(&d), "e1");
    nack_dead(&mut c, &d, "bad").await;
    drop(s1);

    // c and d: one job each leased by a stream of two.
    let c1 = enqueue_keyed(&mut c, keyed(q, "c", "c1")).await;
    let d1 = enqueue_keyed(&mut c, keyed(q, "d", "d1")).await;
    let mut s2 = subscribe(&mut c, &[q], 2, Some(Duration::from_secs(60))).await;
    let held = take(&mut s2, 2, S5).await;
    let mut got: Vec<String> = held.iter().map(payload_of).collect();
    got.sort();
    assert_eq!(got, ["c1", "d1"]);

    // a: three waiting; b: one scheduled; c: one more waiting; two without
    // a key.
    for i in 1..=3 {
        enqueue_keyed(&mut c, keyed(q, "a", &format!("a{i}"))).await;
    }
    let mut b1 = keyed(q, "b", "b1");
    b1.delay = Some(dur(Duration::from_secs(3600)));
    enqueue_keyed(&mut c, b1).await;
    let c2 = enqueue_keyed(&mut c, keyed(q, "c", "c2")).await;
    enqueue(&mut c, q, "plain2").await;
    enqueue(&mut c, q, "plain3").await;
    assert_quiet(&mut s2, Duration::from_millis(300), "the stream is full").await;

    let s = stats(&mut a, q).await;
    assert_eq!(
        (s.keys_waiting, s.keys_leased, s.keys_waiting_capped),
        (3, 2, false),
        "waiting: a, b, c; leased: c, d: {s:?}"
    );
    assert_eq!((s.available, s.scheduled, s.leased, s.dead), (6, 1, 2, 1));
    // ListQueues carries the same figures.
    let listed = a
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let lq = listed.queues.iter().find(|x| x.name == q).unwrap();
    assert_eq!(lq.stats.as_ref().unwrap().keys_waiting, 3);
    assert_eq!(lq.stats.as_ref().unwrap().keys_leased, 2);

    // ListKeys by key, two a page: the dead letter's key is not there.
    let want = vec![
        ("a".to_owned(), 3, 0, true),
        ("b".to_owned(), 1, 0, false),
        ("c".to_owned(), 1, 1, true),
        ("d".to_owned(), 0, 1, false),
    ];
    let (keys, pages) = all_keys(&mut a, q, 2).await;
    assert_eq!(keys, want);
    assert!(pages >= 2, "{pages}");
    let (keys, pages) = all_keys(&mut a, q, 0).await;
    assert_eq!((keys, pages), (want.clone(), 1));
    // Most waiting first, then by key; one page.
    let top = a
        .list_keys(list_keys_req(q, pb::KeyOrder::Waiting, 3))
        .await
        .unwrap()
        .into_inner();
    let top: Vec<(&str, i64)> = top
        .keys
        .iter()
        .map(|k| (k.key.as_str(), k.waiting))
        .collect();
    assert_eq!(top, [("a", 3), ("b", 1), ("c", 1)]);

    // ListJobs by key: in enqueue order, with a state, across states.
    assert_eq!(
        jobs_of_key(&mut a, q, "c", pb::JobState::Unspecified).await,
        [c1.clone(), c2.clone()]
    );
    assert_eq!(
        jobs_of_key(&mut a, q, "c", pb::JobState::Leased).await,
        vec![c1.clone()]
    );
    assert_eq!(
        jobs_of_key(&mut a, q, "c", pb::JobState::Available).await,
        vec![c2.clone()]
    );
    assert_eq!(
        jobs_of_key(&mut a, q, "d", pb::JobState::Unspecified).await,
        vec![d1.clone()]
    );
    assert_eq!(
        jobs_of_key(&mut a, q, "e", pb::JobState::Dead).await,
        vec![e1.clone()]
    );
    assert!(
        jobs_of_key(&mut a, q, "e", pb::JobState::Unspecified)
            .await
            .is_empty()
    );
    assert_eq!(
        jobs_of_key(&mut a, q, "b", pb::JobState::Scheduled)
            .await
            .len(),
        1
    );
    assert!(
        jobs_of_key(&mut a, q, "nobody", pb::JobState::Unspecified)
            .await
            .is_empty()
    );
    // Empty key = no filter.
    assert_eq!(
        jobs_of_key_any(&mut a, q, "").await.len(),
        9,
        "every live job"
    );
    // Page by page, one job a page.
    let mut ids = Vec::new();
    let mut token = String::new();
    loop {
        let r = a
            .list_jobs(pb::ListJobsRequest {
                queue: q.into(),
                key: "a".into(),
                page_size: 1,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        ids.extend(r.jobs.into_iter().map(|j| j.id));
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    assert_eq!(ids.len(), 3);
    // Without a queue: the key's jobs of every queue.
    let other = enqueue_keyed(&mut c, keyed("vis2", "c", "other")).await;
    assert_eq!(
        jobs_of_key(&mut a, "", "c", pb::JobState::Unspecified).await,
        [c1.clone(), c2.clone(), other]
    );

    // Settling moves the counts: c's and d's leases acked, a cancelled.
    for d in &held {
        ack(&mut c, d).await.unwrap();
    }
    let c2d = next_delivery(&mut s2, S5).await;
    let s = stats(&mut a, q).await;
    assert_eq!(s.keys_leased, 1, "{s:?} after {}", payload_of(&c2d));
    drop(s2);
}

async fn jobs_of_key_any(a: &mut Admin, queue: &str, key: &str) -> Vec<pb::JobInfo> {
    a.list_jobs(pb::ListJobsRequest {
        queue: queue.into(),
        key: key.into(),
        ..Default::default()
    })
    .await
    .expect("list_jobs")
    .into_inner()
    .jobs
}

/// keys_waiting stops counting at 10,000 keys and says so; 10,000 keys
/// exactly are counted whole. The jobs are written by SQL (as
/// `leaseq.enqueue()` would): 10,001 Enqueue calls would be a load test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_waiting_stops_at_its_cap_and_says_so() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut a = admin(&broker).await;
    let fill = |queue: &'static str, n: i32| {
        let pool = db.pool.clone();
        async move {
            sqlx::query(
                "select count(leaseq.enqueue($1, ''::bytea, key => 'k' || g))
                 from generate_series(1, $2) g",
            )
            .bind(queue)
            .bind(n)
            .execute(&pool)
            .await
            .expect("fill");
        }
    };
    fill("capped", 10_001).await;
    fill("whole", 10_000).await;
    let s = stats(&mut a, "capped").await;
    assert_eq!(
        (s.keys_waiting, s.keys_waiting_capped, s.available),
        (10_000, true, 10_001)
    );
    let s = stats(&mut a, "whole").await;
    assert_eq!((s.keys_waiting, s.keys_waiting_capped), (10_000, false));
    // ListKeys pages through them all.
    let (keys, _) = all_keys(&mut a, "capped", 1000).await;
    assert_eq!(keys.len(), 10_001);
    assert!(keys.iter().all(|k| k.1 == 1 && k.2 == 0));
}

/// ListJobs' key and ListKeys' fields are checked: INVALID_ARGUMENT naming
/// the field; unknown queues are NOT_FOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_filter_and_list_keys_are_validated() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    enqueue_keyed(&mut c, keyed("val", "k", "x")).await;
    enqueue_keyed(&mut c, keyed("val", "l", "y")).await;
    let longest = "k".repeat(256);
    let r = a
        .list_jobs(pb::ListJobsRequest {
            key: longest.clone(),
            ..Default::default()
        })
        .await
        .expect("a 256-byte key is a key");
    assert!(r.into_inner().jobs.is_empty());
    for (key, why) in [
        ("k".repeat(257), "at most 256 bytes"),
        ("a\0b".to_owned(), "NUL"),
    ] {
        let e = a
            .list_jobs(pb::ListJobsRequest {
                key,
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().starts_with("key"), "{}", e.message());
        assert!(e.message().contains(why), "{}", e.message());
    }

    let ok = list_keys_req("val", pb::KeyOrder::Key, 10);
    let cases = [
        (
            pb::ListKeysRequest {
                queue: String::new(),
                ..ok.clone()
            },
            "queue",
            Code::InvalidArgument,
        ),
        (
            pb::ListKeysRequest {
                queue: "bad name".into(),
                ..ok.clone()
            },
            "queue",
            Code::InvalidArgument,
        ),
        (
            pb::ListKeysRequest {
                queue: "nosuch".into(),
                ..ok.clone()
            },
            "queue",
            Code::NotFound,
        ),
        (
            pb::ListKeysRequest {
                page_size: 1001,
                ..ok.clone()
            },
            "page_size",
            Code::InvalidArgument,
        ),
        (
            pb::ListKeysRequest {
                order: 7,
                ..ok.clone()
            },
            "order",
            Code::InvalidArgument,
        ),
        (
            pb::ListKeysRequest {
                page_token: "zz".into(),
                ..ok.clone()
            },
            "page_token",
            Code::InvalidArgument,
        ),
    ];
    for (r, field, code) in cases {
        let e = a.list_keys(r.clone()).await.expect_err("refused");
        assert_eq!(e.code(), code, "{r:?}: {e:?}");
        assert!(e.message().contains(field), "{r:?}: {}", e.message());
    }
    // A token of the key order does not page the one by jobs waiting.
    let first = a
        .list_keys(list_keys_req("val", pb::KeyOrder::Key, 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.keys.len(), 1);
    assert!(!first.next_page_token.is_empty(), "{first:?}");
    let e = a
        .list_keys(pb::ListKeysRequest {
            page_token: first.next_page_token,
            order: pb::KeyOrder::Waiting as i32,
            ..ok.clone()
        })
        .await
        .expect_err("refused");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("page_token"), "{}", e.message());
    // Nothing changed: the broker still answers.
    let s = stats(&mut a, "val").await;
    assert_eq!(s.keys_waiting, 2);
}

/// Over three clusters: ListJobs by key finds the key's jobs on every
/// cluster; a queue whose jobs sit on two clusters (as during a bucket
/// move: rows written on the second cluster by SQL) has its keys merged
/// in ListKeys (a key on both sides adds up) and its counts added in
/// GetQueue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_are_listed_and_counted_over_several_clusters() {
    use crate::scaling::{Three, over_three, queues_on};
    let three = Three::start().await;
    let dbs = three.databases();
    let b = over_three(&dbs).start().await;
    let qs: Vec<String> = (0..3).map(|k| queues_on(k, 1, "kv").remove(0)).collect();
    let mut c =
        leaseq::pb::queue_service_client::QueueServiceClient::connect(format!("http://{}", b.addr))
            .await
            .unwrap();
    let mut a =
        leaseq::pb::admin_service_client::AdminServiceClient::connect(format!("http://{}", b.addr))
            .await
            .unwrap();
    let mut ids = Vec::new();
    for q in &qs {
        ids.push(enqueue_keyed(&mut c, keyed(q, "tenant-1", "x")).await);
        enqueue_keyed(&mut c, keyed(q, "tenant-2", "y")).await;
    }
    ids.sort();
    let r = a
        .list_jobs(pb::ListJobsRequest {
            key: "tenant-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut got: Vec<String> = r.jobs.iter().map(|j| j.id.clone()).collect();
    got.sort();
    assert_eq!(got, ids, "one job of tenant-1 on each cluster");
    assert!(r.unavailable_clusters.is_empty());

    // Queue 0's jobs also on cluster 1 (the destination of a move).
    let q = &qs[0];
    for key in ["tenant-1", "tenant-3", "tenant-3"] {
        sqlx::query("select leaseq.enqueue($1, ''::bytea, key => $2)")
            .bind(q)
            .bind(key)
            .execute(&three.pools[1])
            .await
            .unwrap();
    }
    let s = stats(&mut a, q).await;
    // tenant-1 waits on both clusters: counted once per cluster.
    assert_eq!(s.keys_waiting, 4, "{s:?}");
    let (keys, _) = all_keys(&mut a, q, 2).await;
    let keys: Vec<(&str, i64)> = keys.iter().map(|k| (k.0.as_str(), k.1)).collect();
    assert_eq!(keys, [("tenant-1", 2), ("tenant-2", 1), ("tenant-3", 2)]);
    let top = a
        .list_keys(list_keys_req(q, pb::KeyOrder::Waiting, 2))
        .await
        .unwrap()
        .into_inner();
    let top: Vec<(&str, i64)> = top
        .keys
        .iter()
        .map(|k| (k.key.as_str(), k.waiting))
        .collect();
    assert_eq!(top, [("tenant-1", 2), ("tenant-3", 2)]);
    b.stop().await;
}

async fn cli(addr: &str, args: &[&str]) -> serde_json::Value {
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
            .args(args)
            .env("LEASEQ_ADDR", addr)
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("cli finishes within 20s")
    .expect("run leaseq");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {stdout}"))
}

/// The real binary: `stats` shows the key counts, `jobs --key` lists one
/// key's jobs, `keys` lists the keys (by key, and most waiting first), and
/// a key over 256 bytes exits with the broker's INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_shows_keys_and_filters_jobs_by_key() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let addr = broker.url();
    let a = addr.as_str();
    let mut c = broker.client().await;
    let x1 = enqueue_keyed(&mut c, keyed("clik", "x", "1")).await;
    enqueue_keyed(&mut c, keyed("clik", "y", "2")).await;
    enqueue_keyed(&mut c, keyed("clik", "y", "3")).await;
    enqueue(&mut c, "clik", "4").await;

    let v = cli(a, &["stats", "clik", "-o", "json"]).await;
    assert_eq!(v[0]["keys_waiting"], 2, "{v}");
    assert_eq!(v[0]["keys_leased"], 0, "{v}");
    assert_eq!(v[0]["keys_waiting_capped"], false, "{v}");

    let v = cli(a, &["jobs", "-q", "clik", "--key", "x", "-o", "json"]).await;
    let ids: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [x1.as_str()], "{v}");
    assert_eq!(v[0]["key"], "x");

    let v = cli(a, &["keys", "clik", "-o", "json"]).await;
    let keys: Vec<(&str, i64)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["key"].as_str().unwrap(), k["waiting"].as_i64().unwrap()))
        .collect();
    assert_eq!(keys, [("x", 1), ("y", 2)], "{v}");
    let v = cli(
        a,
        &[
            "keys", "clik", "--order", "waiting", "--limit", "1", "-o", "json",
        ],
    )
    .await;
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v[0]["key"], "y", "{v}");

    let long = "k".repeat(257);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
        .args(["jobs", "--key", &long])
        .env("LEASEQ_ADDR", a)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run leaseq");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("key") && err.contains("256"), "{err}");
}
