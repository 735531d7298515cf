//! The broker's lifecycle and health. The real `leaseq` binary as a process:
//! one SIGTERM drain step by step (what it does to each job row, the stream,
//! health, the exit), health and reflection, `serve --help`, and the
//! `enqueue` / `tail` client subcommands. In process: health during a drain
//! and through a database outage. That kill -9 and SIGTERM lose nothing
//! under load is tests/faults.rs's to check (its history checker is the
//! strictest), behind a load balancer tests/lb.rs's.

use std::time::Duration;

use crate::common::*;
use tokio::time::{Instant, timeout};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_releases_with_refund_and_exits_zero() {
    let db = TestDb::new().await;
    let mut broker = BinaryBroker::start(&db, &[]).await;
    let addr = broker.addr;
    let mut client = broker.client().await;
    for i in 0..3 {
        enqueue(&mut client, "drain", &format!("d{i}")).await;
    }
    let mut stream = subscribe(&mut client, &["drain"], 5, Some(Duration::from_secs(60))).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        let d = next_delivery(&mut stream, Duration::from_secs(5)).await;
        assert_eq!(d.job.as_ref().unwrap().attempt, 1);
        got.push(d);
    }
    let rows = db.job_rows().await;
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r.1 == "leased" && r.2 == 1), "{rows:?}");

    let signalled = Instant::now();
    broker.signal(libc::SIGTERM);
    // Health flips and the stream ends, concurrently.
    let (seen, end) = tokio::join!(
        wait_not_serving(addr, "", Duration::from_secs(5)),
        stream_end(&mut stream, Duration::from_secs(5)),
    );
    let status = end.expect_err("the stream must end with a status, not cleanly");
    assert_eq!(
        status.code(),
        Code::Unavailable,
        "drain ends streams with UNAVAILABLE: {status:?}"
    );
    assert!(
        matches!(seen, None | Some(ServingStatus::NotServing)),
        "health during drain: {seen:?}"
    );
    // Released before the stream was ended: available again at once (not
    // after the 60 s lease), with the attempt given back.
    let rows = db.job_rows().await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    for (payload, state, attempt, token) in &rows {
        assert_eq!(state, "available", "{payload} after the drain: {rows:?}");
        assert_eq!(*attempt, 0, "{payload}: the drain refunds the attempt");
        assert!(token.is_none(), "{payload} still has a lease token");
    }
    let exit = broker.wait(Duration::from_secs(10)).await;
    let took = signalled.elapsed();
    assert!(exit.success(), "exit status after SIGTERM: {exit:?}");
    assert!(
        took < Duration::from_millis(6500),
        "exited {took:?} after SIGTERM; drain grace is 5s"
    );
    assert_eq!(health(addr, "").await, None, "nothing listens after exit");
    // The settles of the old stream are now stale.
    drop(stream);

    // Another broker delivers all three, as first attempts.
    let next = TestBroker::start(&db).await;
    let mut client = next.client().await;
    let mut stream = subscribe(&mut client, &["drain"], 5, None).await;
    let mut payloads = Vec::new();
    for _ in 0..3 {
        let d = next_delivery(&mut stream, Duration::from_secs(5)).await;
        let job = d.job.as_ref().unwrap();
        assert_eq!(job.attempt, 1, "attempt after a refunded drain");
        payloads.push(String::from_utf8(job.payload.clone()).unwrap());
        ack(&mut client, &d).await.expect("ack on the new broker");
    }
    payloads.sort();
    assert_eq!(payloads, ["d0", "d1", "d2"]);
    // The old tokens no longer settle anything.
    let stale = ack(&mut client, &got[0]).await.expect_err("stale token");
    assert_eq!(stale.code(), Code::FailedPrecondition);
    assert_eq!(db.live_jobs().await, 0);
    assert_eq!(db.dead_jobs().await, 0);
    drop(stream);
    next.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_on_the_binary() {
    let db = TestDb::new().await;
    let mut broker = BinaryBroker::start(&db, &[]).await;
    for service in ["", "leaseq.v1.QueueService", "liveness"] {
        assert_eq!(
            health(broker.addr, service).await,
            Some(ServingStatus::Serving),
            "health {service:?}"
        );
    }
    let symbol = "leaseq.v1.QueueService";
    for (version, r) in [
        ("v1", reflection_v1(broker.addr, symbol).await),
        ("v1alpha", reflection_v1alpha(broker.addr, symbol).await),
    ] {
        for want in [symbol, "grpc.health.v1.Health"] {
            assert!(
                r.services.iter().any(|s| s == want),
                "reflection {version} lists {:?}, not {want}",
                r.services
            );
        }
        assert!(
            !r.files.is_empty(),
            "reflection {version}: no file for {symbol}"
        );
    }
    broker.signal(libc::SIGTERM);
    assert!(broker.wait(Duration::from_secs(10)).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_not_serving_from_the_start_of_an_in_process_drain() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let addr = broker.addr;
    let mut client = broker.client().await;
    enqueue(&mut client, "hd", "held").await;
    let mut stream = subscribe(&mut client, &["hd"], 1, Some(Duration::from_secs(60))).await;
    let _held = next_delivery(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(health(addr, "").await, Some(ServingStatus::Serving));

    broker.begin_shutdown();
    let started = Instant::now();
    let mut polls = Vec::new();
    // From the first poll on, never SERVING; stop once unreachable.
    while started.elapsed() < Duration::from_secs(2) {
        let all = (
            health(addr, "").await,
            health(addr, "leaseq.v1.QueueService").await,
        );
        polls.push(all);
        assert!(
            matches!(all.0, None | Some(ServingStatus::NotServing))
                && matches!(all.1, None | Some(ServingStatus::NotServing)),
            "health after begin_shutdown ({:?} in): {polls:?}",
            started.elapsed()
        );
        if all == (None, None) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let end = stream_end(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(
        end.expect_err("stream ends with a status").code(),
        Code::Unavailable
    );
    broker.stop().await;
    let rows = db.job_rows().await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].1, "available", "{rows:?}");
    assert_eq!(rows[0].2, 0, "attempt refunded: {rows:?}");
}

/// PostgreSQL becoming unreachable under a running broker: health follows it,
/// clients see UNAVAILABLE, and the broker recovers by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_is_not_serving_then_recovers() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut s = subscribe(&mut c, &["out"], 4, None).await;
    db.cut_off().await;
    wait_health(
        broker.addr,
        "",
        ServingStatus::NotServing,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        health(broker.addr, "liveness").await,
        Some(ServingStatus::Serving),
        "liveness stays SERVING through a database outage"
    );
    let err = c.enqueue(job("out", "x")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    db.allow_connections(true).await;
    wait_health(
        broker.addr,
        "",
        ServingStatus::Serving,
        Duration::from_secs(15),
    )
    .await;
    // Enqueues work again and the open stream is served again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let id = loop {
        match c.enqueue(job("out", "after")).await {
            Ok(r) => break r.into_inner().job_id,
            Err(e) if tokio::time::Instant::now() < deadline => {
                assert_eq!(e.code(), Code::Unavailable);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("enqueue still failing: {e:?}"),
        }
    };
    let d = next_delivery(&mut s, Duration::from_secs(15)).await;
    assert_eq!(d.job.unwrap().id, id);
}

#[test]
fn serve_help_documents_listen_and_database_url() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
        .args(["serve", "--help"])
        .env_remove("DATABASE_URL")
        .env_remove("LEASEQ_LISTEN")
        .env_remove("LEASEQ_HTTP_LISTEN")
        .output()
        .expect("run leaseq serve --help");
    assert!(out.status.success(), "{:?}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "--listen",
        "LEASEQ_LISTEN",
        "--database-url",
        "DATABASE_URL",
        "--http-listen",
        "LEASEQ_HTTP_LISTEN",
    ] {
        assert!(text.contains(want), "`serve --help` lacks {want}:\n{text}");
    }
}

/// Runs the binary with `args`; returns (success, stdout). Bounded.
async fn leaseq(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let out = timeout(
        Duration::from_secs(15),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
            .args(args)
            .env_remove("LEASEQ_ADDR")
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("leaseq {args:?} did not finish within 15s"))
    .expect("run leaseq");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_enqueue_then_tail() {
    let db = TestDb::new().await;
    let mut broker = BinaryBroker::start(&db, &[]).await;
    let url = format!("http://{}", broker.addr);

    let (status, out, err) = leaseq(&[
        "enqueue",
        "--addr",
        &url,
        "--queue",
        "q",
        "--payload",
        "hello",
    ])
    .await;
    assert!(status.success(), "enqueue: {status:?}\n{err}");
    let id = out.trim();
    uuid::Uuid::parse_str(id).unwrap_or_else(|_| panic!("enqueue printed {out:?}, not a UUID"));
    assert_eq!(db.live_jobs().await, 1);

    let (status, out, err) =
        leaseq(&["tail", "--addr", &url, "--queue", "q", "--count", "1"]).await;
    assert!(status.success(), "tail: {status:?}\n{err}");
    let line = out
        .lines()
        .find(|l| l.contains("hello"))
        .unwrap_or_else(|| panic!("tail printed no line with the payload: {out:?}"));
    assert!(
        line.contains(id) && line.contains("payload=hello"),
        "tail line {line:?} lacks the job id {id} or payload=hello"
    );
    // tail acks what it prints.
    assert_eq!(db.live_jobs().await, 0);

    broker.signal(libc::SIGTERM);
    assert!(broker.wait(Duration::from_secs(10)).await.success());
}
