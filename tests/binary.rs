//! The real `leaseq` binary as a process: signals, drain, kill -9, health,
//! reflection and the CLI.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use leaseq::pb;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

const S5: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_jobs_ends_streams_unavailable_and_exits_zero() {
    let db = TestDb::new().await;
    let mut broker = BinaryBroker::start(&db, &[]).await;
    let mut c = broker.client().await;
    for i in 0..3 {
        enqueue(&mut c, "drain", &format!("{i}")).await;
    }
    let mut s = subscribe(&mut c, &["drain"], 5, Some(Duration::from_secs(60))).await;
    for _ in 0..3 {
        next_delivery(&mut s, S5).await;
    }
    broker.signal(libc::SIGTERM);
    // The stream ends with UNAVAILABLE (heartbeats may come first).
    let deadline = Instant::now() + S5;
    let status = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.message()).await {
            Err(_) => panic!("stream not ended within 5s of SIGTERM"),
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => panic!("stream ended without a status"),
            Ok(Err(status)) => break status,
        }
    };
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let exit = broker.wait(Duration::from_secs(10)).await;
    assert!(exit.success(), "exit status {exit:?}");
    // Released at once, the attempt given back: not waiting for the 60 s lease.
    let rows: Vec<(String, i32)> =
        sqlx::query_as("select state, attempt from leaseq.jobs order by id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(rows, vec![("available".to_string(), 0); 3]);
    let next = TestBroker::start(&db).await;
    let mut c = next.client().await;
    let mut s = subscribe(&mut c, &["drain"], 5, None).await;
    for _ in 0..3 {
        let d = next_delivery(&mut s, S5).await;
        assert_eq!(d.job.as_ref().unwrap().attempt, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_goes_not_serving_at_the_start_of_a_drain() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    assert_eq!(health(broker.addr, "").await, Some(ServingStatus::Serving));
    let mut c = broker.client().await;
    let _s = subscribe(&mut c, &["h"], 1, None).await;
    broker.begin_shutdown();
    let deadline = Instant::now() + S5;
    while health(broker.addr, "leaseq.v1.QueueService").await == Some(ServingStatus::Serving) {
        assert!(Instant::now() < deadline, "still SERVING 5s into a drain");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_job() {
    let db = TestDb::new().await;
    let mut broker = BinaryBroker::start(&db, &[]).await;
    let mut c = broker.client().await;
    let jobs: Vec<_> = (0..200).map(|i| job("k9", &format!("{i}"))).collect();
    c.enqueue_batch(pb::EnqueueBatchRequest { jobs })
        .await
        .unwrap();

    let mut acked_payloads = HashSet::new();
    let mut acked_ids = HashSet::new();
    let mut s = subscribe(&mut c, &["k9"], 10, Some(Duration::from_secs(2))).await;
    while acked_payloads.len() < 100 {
        let d = next_delivery(&mut s, S5).await;
        let j = d.job.clone().unwrap();
        assert!(
            !acked_ids.contains(&j.id),
            "delivered after its ack returned OK"
        );
        ack(&mut c, &d).await.unwrap();
        acked_ids.insert(j.id);
        acked_payloads.insert(j.payload);
    }
    broker.signal(libc::SIGKILL);
    broker.wait(S5).await;
    drop(s);

    let mut broker = BinaryBroker::start(&db, &[]).await;
    let mut c = broker.client().await;
    let mut s = subscribe(&mut c, &["k9"], 10, Some(Duration::from_secs(2))).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked_payloads.len() < 200 {
        assert!(
            Instant::now() < deadline,
            "only {} of 200 acked",
            acked_payloads.len()
        );
        let Some(d) = try_next_delivery(&mut s, Duration::from_secs(5)).await else {
            continue;
        };
        let j = d.job.clone().unwrap();
        assert!(
            !acked_ids.contains(&j.id),
            "delivered after its ack returned OK"
        );
        ack(&mut c, &d).await.unwrap();
        acked_ids.insert(j.id);
        acked_payloads.insert(j.payload);
    }
    assert_eq!(db.live_jobs().await, 0);
    assert_eq!(db.dead_jobs().await, 0);
    broker.signal(libc::SIGTERM);
    assert!(broker.wait(Duration::from_secs(10)).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_on_the_binary() {
    let db = TestDb::new().await;
    let mut broker = BinaryBroker::start(&db, &[]).await;
    for service in ["", "leaseq.v1.QueueService", "liveness"] {
        assert_eq!(
            health(broker.addr, service).await,
            Some(ServingStatus::Serving),
            "{service:?}"
        );
    }
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", broker.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();

    use tonic_reflection::pb::{v1, v1alpha};
    let mut v1c = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut resp = v1c
        .server_reflection_info(tokio_stream::once(req))
        .await
        .unwrap()
        .into_inner();
    let msg = resp.message().await.unwrap().unwrap();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        msg.message_response
    else {
        panic!("no list services response")
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"leaseq.v1.QueueService".to_string()),
        "{names:?}"
    );

    let mut v1a = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut resp = v1a
        .server_reflection_info(tokio_stream::once(req))
        .await
        .unwrap()
        .into_inner();
    let msg = resp.message().await.unwrap().unwrap();
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        msg.message_response
    else {
        panic!("no v1alpha list services response")
    };
    assert!(
        list.service
            .iter()
            .any(|s| s.name == "leaseq.v1.QueueService")
    );
    broker.signal(libc::SIGTERM);
    assert!(broker.wait(Duration::from_secs(10)).await.success());
}

#[test]
fn serve_help_documents_flags_and_env() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--listen",
        "LEASEQ_LISTEN",
        "--database-url",
        "DATABASE_URL",
    ] {
        assert!(help.contains(needle), "help mentions {needle}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_enqueue_and_tail() {
    let db = TestDb::new().await;
    let mut broker = BinaryBroker::start(&db, &[]).await;
    let addr = format!("http://{}", broker.addr);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
        .args([
            "enqueue",
            "--addr",
            &addr,
            "--queue",
            "cli",
            "--payload",
            "hello",
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(uuid::Uuid::try_parse(&id).is_ok(), "{id:?} is a job id");
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
            .args(["tail", "--addr", &addr, "--queue", "cli", "--count", "1"])
            .output(),
    )
    .await
    .expect("tail exits")
    .unwrap();
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).unwrap();
    assert!(
        line.contains(&id) && line.contains("payload=hello"),
        "{line}"
    );
    assert_eq!(db.live_jobs().await, 0, "tail acked it");
    broker.signal(libc::SIGTERM);
    assert!(broker.wait(Duration::from_secs(10)).await.success());
}
