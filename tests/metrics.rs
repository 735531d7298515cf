//! `--metrics-listen` on the real binary: scrape `/metrics` over HTTP after
//! some traffic and check that counters, histograms and gauges moved, per
//! queue. Also: every series the Grafana dashboard and the alerting rules in
//! deploy/ use is one the broker exposes, and docs/METRICS.md documents
//! exactly the families the broker exposes. And `--http-listen` (or
//! `LEASEQ_HTTP_LISTEN`) on the real binary: the console's page and
//! `/metrics` on one port (the console itself is tests/console.rs's).

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const S5: Duration = Duration::from_secs(5);

/// GET `path`; returns (status line, body).
async fn get(addr: SocketAddr, path: &str) -> (String, String) {
    get_with_type(addr, path).await.0
}

/// GET `path`; returns ((status line, body), content type).
async fn get_with_type(addr: SocketAddr, path: &str) -> ((String, String), String) {
    let (status, head, body) = get_full(addr, path).await;
    let ctype = header(&head, "content-type").unwrap_or_default();
    ((status, body), ctype)
}

/// The value of header `name` in a response head.
fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

/// GET `path`; returns (status line, head, body).
async fn get_full(addr: SocketAddr, path: &str) -> (String, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    tokio::time::timeout(S5, s.read_to_string(&mut buf))
        .await
        .expect("response within 5s")
        .unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").expect("http response");
    let status = head.lines().next().unwrap().to_owned();
    let len: usize = header(head, "content-length")
        .expect("content-length")
        .parse()
        .unwrap();
    assert_eq!(len, body.len(), "content-length matches the body");
    (status, head.to_owned(), body.to_owned())
}

/// Sample lines as `name{labels}` → value; checks every sample has a TYPE
/// and that the text ends with OpenMetrics' `# EOF`.
fn parse(body: &str) -> HashMap<String, f64> {
    assert_eq!(
        body.lines().last(),
        Some("# EOF"),
        "OpenMetrics ends with # EOF"
    );
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
        let family = ["_total", "_bucket", "_sum", "_count", "_info"]
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

/// The metric families (TYPE lines) of an exposition.
fn families(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|t| t.split_whitespace().next().unwrap().to_owned())
        .collect()
}

/// Every `leaseq_*` name in `text`, reduced to its family (suffixes of
/// counters and histograms removed).
fn names_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("leaseq_") {
        let start = i + at;
        let before = start.checked_sub(1).map(|j| bytes[j]);
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        i = end;
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_') {
            continue;
        }
        let mut name = &text[start..end];
        for suffix in ["_total", "_bucket", "_sum", "_count", "_info"] {
            name = name.strip_suffix(suffix).unwrap_or(name);
        }
        out.insert(name.to_owned());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_traffic() {
    let db = TestDb::new().await;
    let maddr = free_addr();
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

    let ((status, body), ctype) = get_with_type(maddr, "/metrics").await;
    assert!(status.contains("200"), "{status}");
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    let before = parse(&body);
    assert!(
        !before
            .keys()
            .any(|k| k.starts_with("leaseq_jobs_enqueued_total")),
        "no queue has enqueues yet"
    );

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

    // A lease that expires, on another queue (1 s lease, reaped every 200 ms).
    c.enqueue(job("x", "slow")).await.unwrap();
    let mut slow = subscribe(&mut c, &["x"], 1, Some(Duration::from_secs(1))).await;
    next_delivery(&mut slow, S5).await;
    next_delivery(&mut slow, S5).await; // redelivered after the expiry

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
    let q = |name: &str| format!("{name}{{queue=\"m\"}}");
    assert_eq!(
        m[&q("leaseq_jobs_enqueued_total")],
        6.0,
        "5 + 1 new, 1 duplicate"
    );
    assert_eq!(m[&q("leaseq_jobs_enqueue_duplicates_total")], 1.0);
    assert_eq!(m[&q("leaseq_jobs_delivered_total")], 7.0);
    assert_eq!(m[&q("leaseq_jobs_acked_total")], 3.0);
    assert_eq!(m[&q("leaseq_jobs_nacked_total")], 2.0);
    assert_eq!(m[&q("leaseq_jobs_dead_lettered_total")], 1.0);
    assert_eq!(m["leaseq_stale_tokens_total"], 1.0);
    assert!(
        !m.contains_key(&q("leaseq_leases_expired_total")),
        "no lease of queue m expired"
    );
    assert_eq!(m["leaseq_leases_expired_total{queue=\"x\"}"], 1.0);
    assert_eq!(
        m[&q("leaseq_delivery_wait_seconds_count")],
        6.0,
        "first deliveries only"
    );
    let inf = m
        .iter()
        .find(|(k, _)| {
            k.starts_with("leaseq_delivery_wait_seconds_bucket{")
                && k.contains("queue=\"m\"")
                && k.contains("le=\"+Inf\"")
        })
        .map(|(_, v)| *v);
    assert_eq!(inf, Some(6.0));
    assert_eq!(
        m[&q("leaseq_handler_duration_seconds_count")],
        3.0,
        "one per ack of a job this broker delivered"
    );
    assert!(m[&q("leaseq_handler_duration_seconds_sum")] >= 0.0);
    assert!(m["leaseq_enqueue_batch_jobs_sum"] >= 7.0);
    assert!(m["leaseq_lease_batch_jobs_count"] >= 1.0);
    assert_eq!(m[&q("leaseq_queue_dead_jobs")], 1.0);
    assert_eq!(m[&q("leaseq_queue_leased_jobs")], 2.0);
    assert_eq!(m[&q("leaseq_queue_available_jobs")], 0.0);
    assert_eq!(m[&q("leaseq_queue_streams")], 1.0);
    assert_eq!(m[&q("leaseq_queue_free_credits")], 8.0);
    assert_eq!(m[&q("leaseq_queue_paused")], 0.0);
    assert_eq!(m[&q("leaseq_queue_consumers")], 1.0);
    assert_eq!(m["leaseq_serving"], 1.0);

    // The dashboard and the alerts use only series the broker exposes, and
    // docs/METRICS.md documents every family (and no other).
    let (_, body) = get(maddr, "/metrics").await;
    let exposed = families(&body);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in [
        "deploy/grafana/leaseq-dashboard.json",
        "deploy/prometheus/alerts.yml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).expect(file);
        let used = names_in(&text);
        assert!(!used.is_empty(), "{file} uses leaseq series");
        let unknown: Vec<_> = used.difference(&exposed).collect();
        assert!(
            unknown.is_empty(),
            "{file} uses series the broker does not expose: {unknown:?}"
        );
    }
    let docs = names_in(&std::fs::read_to_string(root.join("docs/METRICS.md")).unwrap());
    let undocumented: Vec<_> = exposed.difference(&docs).collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/METRICS.md: {undocumented:?}"
    );
    let stale: Vec<_> = docs.difference(&exposed).collect();
    assert!(
        stale.is_empty(),
        "docs/METRICS.md names series the broker does not expose: {stale:?}"
    );

    let (status, _) = get(maddr, "/").await;
    assert!(status.contains("404"), "{status}");
}

/// `--http-listen` on the real binary: the console's page (with its
/// Content-Security-Policy) at `/` and the OpenMetrics exposition at
/// `/metrics`, on one port; without `--auth-file` the broker warns that the
/// console is open to anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_listen_serves_the_console_and_metrics() {
    let db = TestDb::new().await;
    let http = free_addr();
    let scratch = Scratch::new("http");
    let log = scratch.path("broker.log");
    let broker = BinaryBroker::on(&db)
        .args(&["--http-listen", &http.to_string()])
        .log(&log)
        .start()
        .await;
    console_and_metrics_on(http, &broker).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(
            "console authentication is OFF (no --auth-file): anyone who reaches the console may read payloads"
        ),
        "no warning that the console is open, in the broker's log:\n{text}"
    );
}

/// The same through the environment twin, `LEASEQ_HTTP_LISTEN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaseq_http_listen_env_serves_the_console_and_metrics() {
    let db = TestDb::new().await;
    let http = free_addr();
    let scratch = Scratch::new("http");
    let log = scratch.path("broker.log");
    let broker = BinaryBroker::on(&db)
        .env("LEASEQ_HTTP_LISTEN", &http.to_string())
        .log(&log)
        .start()
        .await;
    console_and_metrics_on(http, &broker).await;
}

/// Checks what a console port answers: the page, `/metrics` (after one
/// enqueue over gRPC, so a per-queue counter is there), and 404 elsewhere.
async fn console_and_metrics_on(http: SocketAddr, broker: &BinaryBroker) {
    let (status, head, body) = get_full(http, "/").await;
    assert!(status.contains("200"), "GET /: {status}");
    assert!(
        header(&head, "content-type").is_some_and(|t| t.starts_with("text/html")),
        "{head}"
    );
    let csp = header(&head, "content-security-policy")
        .unwrap_or_else(|| panic!("GET / has no Content-Security-Policy:\n{head}"));
    assert!(
        csp.starts_with("default-src 'none'; script-src 'self'")
            && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(body.contains("<title>leaseq console</title>"), "{body}");
    assert!(body.contains("/assets/app.js"), "{body}");

    let mut c = broker.client().await;
    c.enqueue(job("web", "x")).await.unwrap();
    let ((status, body), ctype) = get_with_type(http, "/metrics").await;
    assert!(status.contains("200"), "GET /metrics: {status}");
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    let m = parse(&body);
    assert_eq!(
        m.get("leaseq_jobs_enqueued_total{queue=\"web\"}"),
        Some(&1.0)
    );

    let (status, _, _) = get_full(http, "/no-such-page").await;
    assert!(status.contains("404"), "{status}");
}

/// The key gauges (issue 33): per queue, never per key. Keys `a` (two jobs)
/// and `b` waiting and a job without a key; one job of `a` leased.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_gauges_count_a_queues_keys_waiting_and_leased() {
    let db = TestDb::new().await;
    let maddr = free_addr();
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
    let keyed = |payload: &str, key: &str| pb::EnqueueRequest {
        key: key.into(),
        ..job("k", payload)
    };
    for j in [
        keyed("a1", "a"),
        keyed("a2", "a"),
        keyed("b1", "b"),
        job("k", "none"),
    ] {
        c.enqueue(j).await.unwrap();
    }
    let mut s = subscribe(&mut c, &["k"], 1, None).await;
    let first = next_delivery(&mut s, S5).await;
    assert_eq!(first.job.as_ref().unwrap().key, "a", "the oldest job, a1");

    let q = |name: &str| format!("{name}{{queue=\"k\"}}");
    let mut m = HashMap::new();
    for _ in 0..100 {
        let (_, body) = get(maddr, "/metrics").await;
        m = parse(&body);
        if m.get(&q("leaseq_queue_keys_leased")) == Some(&1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(m[&q("leaseq_queue_keys_leased")], 1.0, "a");
    assert_eq!(m[&q("leaseq_queue_keys_waiting")], 2.0, "a (a2) and b");
    assert!(
        !m.keys().any(|k| k.contains("key=")),
        "no series is labelled by key"
    );
}
