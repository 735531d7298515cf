//! `--metrics-listen` on the real binary: scrape `/metrics` over HTTP after
//! some traffic and check that counters, histograms and gauges moved.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const S5: Duration = Duration::from_secs(5);

/// GET `path`; returns (status line, body).
async fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    tokio::time::timeout(S5, s.read_to_string(&mut buf))
        .await
        .expect("response within 5s")
        .unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").expect("http response");
    let status = head.lines().next().unwrap().to_owned();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("content-length")
        .parse()
        .unwrap();
    assert_eq!(len, body.len(), "content-length matches the body");
    (status, body.to_owned())
}

/// Sample lines as `name{labels}` → value; checks every sample has a TYPE.
fn parse(body: &str) -> HashMap<String, f64> {
    let mut types = Vec::new();
    let mut out = HashMap::new();
    for line in body.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            types.push(t.split_whitespace().next().unwrap().to_owned());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').expect("sample line");
        let name = key.split('{').next().unwrap();
        assert!(name.starts_with("leaseq_"), "{name}");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.iter().any(|t| t == f))
            })
            .unwrap_or(name);
        assert!(types.iter().any(|t| t == family), "no TYPE for {name}");
        out.insert(key.to_owned(), value.parse().expect("numeric value"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_traffic() {
    let db = TestDb::new().await;
    let port = free_port();
    let maddr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let broker = BinaryBroker::start(
        &db,
        &[
            "--metrics-listen",
            &maddr.to_string(),
            "--metrics-interval",
            "200ms",
        ],
    )
    .await;
    let mut c = broker.client().await;

    let (status, body) = get(maddr, "/metrics").await;
    assert!(status.contains("200"), "{status}");
    let before = parse(&body);
    assert_eq!(before["leaseq_jobs_enqueued_total"], 0.0);

    let jobs: Vec<_> = (0..5).map(|i| job("m", &format!("{i}"))).collect();
    c.enqueue_batch(pb::EnqueueBatchRequest { jobs })
        .await
        .unwrap();
    c.enqueue(pb::EnqueueRequest {
        dedup_key: "k".into(),
        ..job("m", "d1")
    })
    .await
    .unwrap();
    c.enqueue(pb::EnqueueRequest {
        dedup_key: "k".into(),
        ..job("m", "d2")
    })
    .await
    .unwrap();
    let mut s = subscribe(&mut c, &["m"], 10, None).await;
    let mut got = Vec::new();
    for _ in 0..6 {
        got.push(next_delivery(&mut s, S5).await);
    }
    for d in &got[..3] {
        ack(&mut c, d).await.unwrap();
    }
    // A second Ack of a settled job is a stale token.
    assert!(ack(&mut c, &got[0]).await.is_err());
    c.nack(pb::NackRequest {
        job_id: got[3].job.as_ref().unwrap().id.clone(),
        lease_token: got[3].lease_token.clone(),
        error: "dead".into(),
        retry_after: None,
        dead_letter: true,
    })
    .await
    .unwrap();
    c.nack(pb::NackRequest {
        job_id: got[4].job.as_ref().unwrap().id.clone(),
        lease_token: got[4].lease_token.clone(),
        error: "again".into(),
        retry_after: Some(dur(Duration::ZERO)),
        dead_letter: false,
    })
    .await
    .unwrap();
    next_delivery(&mut s, S5).await; // the retried job

    // Gauges are refreshed on a timer: wait for the snapshot that has the
    // dead letter (bounded by time and count).
    let mut m = HashMap::new();
    for _ in 0..100 {
        let (_, body) = get(maddr, "/metrics").await;
        m = parse(&body);
        if m.get("leaseq_queue_dead_jobs{queue=\"m\"}") == Some(&1.0)
            && m.get("leaseq_queue_leased_jobs{queue=\"m\"}") == Some(&2.0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        m["leaseq_jobs_enqueued_total"], 6.0,
        "5 + 1 new, 1 duplicate"
    );
    assert_eq!(m["leaseq_jobs_enqueue_duplicates_total"], 1.0);
    assert_eq!(m["leaseq_jobs_delivered_total"], 7.0);
    assert_eq!(m["leaseq_jobs_acked_total"], 3.0);
    assert_eq!(m["leaseq_jobs_nacked_total"], 2.0);
    assert_eq!(m["leaseq_jobs_dead_lettered_total"], 1.0);
    assert_eq!(m["leaseq_stale_tokens_total"], 1.0);
    assert_eq!(m["leaseq_leases_expired_total"], 0.0);
    assert_eq!(
        m["leaseq_delivery_wait_seconds_count"], 6.0,
        "first deliveries only"
    );
    assert_eq!(m["leaseq_delivery_wait_seconds_bucket{le=\"+Inf\"}"], 6.0);
    assert!(m["leaseq_enqueue_batch_jobs_sum"] >= 7.0);
    assert!(m["leaseq_lease_batch_jobs_count"] >= 1.0);
    assert_eq!(m["leaseq_queue_dead_jobs{queue=\"m\"}"], 1.0);
    assert_eq!(m["leaseq_queue_leased_jobs{queue=\"m\"}"], 2.0);
    assert_eq!(m["leaseq_queue_available_jobs{queue=\"m\"}"], 0.0);
    assert_eq!(m["leaseq_queue_streams{queue=\"m\"}"], 1.0);
    assert_eq!(m["leaseq_queue_free_credits{queue=\"m\"}"], 8.0);
    assert_eq!(m["leaseq_queue_paused{queue=\"m\"}"], 0.0);

    let (status, _) = get(maddr, "/").await;
    assert!(status.contains("404"), "{status}");
}
