//! TLS, mutual TLS, bearer tokens with per-queue grants, and connection
//! limits, over real gRPC on loopback and a real PostgreSQL. Certificates are
//! made fresh in each test ([`Pki`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::common::*;
use leaseq::cli::ClientSecurity;
use leaseq::pb;
use leaseq::pb::queue_service_client::QueueServiceClient;
use tonic::Code;

/// Whether an Enqueue to `url` through `sec` succeeds (connecting included:
/// with TLS 1.3 a refused client certificate may only show on the first
/// call).
async fn can_enqueue(url: &str, sec: &ClientSecurity) -> Result<(), String> {
    let channel = leaseq::cli::connect(url, sec)
        .await
        .map_err(|e| format!("{e:#}"))?;
    QueueServiceClient::new(channel)
        .enqueue(job("emails", "x"))
        .await
        .map(drop)
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

#[tokio::test]
async fn tls_is_required_and_works() {
    let db = TestDb::new().await;
    let pki = Pki::new();
    let broker = TestBroker::on(&db).tls(&pki).start().await;

    // A plaintext client gets nowhere and changes nothing.
    let plaintext = format!("http://{}", broker.addr);
    let plain = can_enqueue(&plaintext, &ClientSecurity::default()).await;
    assert!(plain.is_err(), "plaintext client was served");
    assert_eq!(db.live_jobs().await, 0);

    // A client that does not trust the broker's CA refuses it.
    let untrusting = ClientSecurity {
        tls_ca: Some(pki.rogue_ca.clone()),
        ..Default::default()
    };
    assert!(can_enqueue(&broker.url(), &untrusting).await.is_err());

    // TLS works end to end: enqueue, stream delivery, ack.
    let mut client = broker.client_with(&pki.trusting()).await.unwrap();
    let id = client
        .enqueue(job("emails", "over tls"))
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            queues: vec!["emails".into()],
            consumer: "tls".into(),
            max_in_flight: 1,
            lease: None,
            accept: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let d = next_delivery(&mut stream, Duration::from_secs(5)).await;
    let job = d.job.clone().unwrap();
    assert_eq!(
        (job.id.as_str(), job.payload.as_slice()),
        (id.as_str(), &b"over tls"[..])
    );
    client
        .ack(pb::AckRequest {
            job_id: job.id,
            lease_token: d.lease_token,
            enqueue: Vec::new(),
            result: Vec::new(),
        })
        .await
        .unwrap();
    drop(stream);
    assert_eq!(db.live_jobs().await, 0);
    broker.stop().await;
}

#[tokio::test]
async fn mutual_tls_requires_a_client_certificate_from_the_ca() {
    let db = TestDb::new().await;
    let pki = Pki::new();
    let with_cert = ClientSecurity {
        tls_cert: Some(pki.client_cert.clone()),
        tls_key: Some(pki.client_key.clone()),
        ..pki.trusting()
    };
    let broker = TestBroker::on(&db).mutual_tls(&pki).start().await;

    let without = can_enqueue(&broker.url(), &pki.trusting()).await;
    assert!(without.is_err(), "served a client without a certificate");
    let rogue = ClientSecurity {
        tls_cert: Some(pki.rogue_cert.clone()),
        tls_key: Some(pki.rogue_key.clone()),
        ..pki.trusting()
    };
    let rogue = can_enqueue(&broker.url(), &rogue).await;
    assert!(rogue.is_err(), "served a certificate from another CA");
    assert_eq!(db.live_jobs().await, 0);

    can_enqueue(&broker.url(), &with_cert).await.unwrap();
    assert_eq!(db.live_jobs().await, 1);
    broker.stop().await;
}

#[tokio::test]
async fn tls_startup_fails_on_a_bad_key_instead_of_serving_plaintext() {
    let db = TestDb::new().await;
    let pki = Pki::new();
    let err = TestBroker::on(&db)
        .tls(&pki)
        .config(|c| c.security.tls_key = Some(pki.ca.clone())) // a certificate, not a key
        .run()
        .await
        .expect_err("started with an unusable key");
    assert!(format!("{err:#}").contains("--tls"), "{err:#}");
}

// ---- bearer tokens -------------------------------------------------------

const PRODUCER: &str = "producer-secret-0123456789";
const CONSUMER: &str = "consumer-secret-0123456789";
const BOTH: &str = "both-secret-0123456789";

fn auth_file() -> (Scratch, PathBuf) {
    let h = leaseq_server::hash_token;
    let text = serde_json::json!({"tokens": [
        {"name": "producer", "sha256": h(PRODUCER),
         "grants": [{"queues": "emails*", "actions": ["enqueue"]}]},
        {"name": "consumer", "sha256": h(CONSUMER),
         "grants": [{"queues": "emails*", "actions": ["consume"]}]},
        {"name": "both", "sha256": h(BOTH),
         "grants": [{"queues": ["orders", "audit.*"], "actions": ["enqueue", "consume"]}]},
    ]});
    Scratch::with_file("sec", "tokens.json", &text.to_string())
}

fn token(t: &str) -> ClientSecurity {
    ClientSecurity {
        token: Some(t.to_owned()),
        ..Default::default()
    }
}

async fn auth_broker(db: &TestDb) -> TestBroker {
    let (_scratch, file) = auth_file();
    TestBroker::on(db).auth_file(&file).start().await
}

#[tokio::test]
async fn missing_or_bad_tokens_are_unauthenticated() {
    let db = TestDb::new().await;
    let broker = auth_broker(&db).await;
    for (sec, secret) in [
        (ClientSecurity::default(), None),
        (token("not-a-known-token"), Some("not-a-known-token")),
        (token(&PRODUCER[1..]), Some(&PRODUCER[1..])),
    ] {
        let mut client = broker.client_with(&sec).await.unwrap();
        let s = client.enqueue(job("emails", "x")).await.unwrap_err();
        assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
        if let Some(secret) = secret {
            assert!(!s.message().contains(secret), "token echoed: {s:?}");
        }
        // Authentication comes before validation: no hint about the input.
        let s = client.enqueue(job("", "x")).await.unwrap_err();
        assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
        let s = client
            .subscribe(pb::SubscribeRequest {
                queues: vec!["emails".into()],
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
        let s = client
            .ack(pb::AckRequest {
                job_id: uuid::Uuid::now_v7().to_string(),
                lease_token: uuid::Uuid::new_v4().to_string(),
                enqueue: Vec::new(),
                result: Vec::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    }
    // A scheme other than Bearer is refused too.
    let mut client = QueueServiceClient::with_interceptor(
        tonic::transport::Channel::from_shared(broker.url())
            .unwrap()
            .connect()
            .await
            .unwrap(),
        |mut r: tonic::Request<()>| {
            r.metadata_mut().insert(
                "authorization",
                format!("Basic {PRODUCER}").parse().unwrap(),
            );
            Ok(r)
        },
    );
    let s = client.enqueue(job("emails", "x")).await.unwrap_err();
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    assert_eq!(db.live_jobs().await, 0);

    // Health stays reachable without a token (probes), so does reflection.
    assert_eq!(
        health(broker.addr, "").await,
        Some(tonic_health::pb::health_check_response::ServingStatus::Serving)
    );
    broker.stop().await;
}

#[tokio::test]
async fn grants_are_per_queue_and_per_action() {
    let db = TestDb::new().await;
    let broker = auth_broker(&db).await;
    let mut producer = broker.client_with(&token(PRODUCER)).await.unwrap();
    let mut consumer = broker.client_with(&token(CONSUMER)).await.unwrap();
    let mut both = broker.client_with(&token(BOTH)).await.unwrap();

    // A queue outside the grants: PERMISSION_DENIED naming queue and action,
    // and nothing enqueued.
    let s = producer.enqueue(job("orders", "x")).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(
        s.message().contains("\"orders\"") && s.message().contains("enqueue"),
        "{s:?}"
    );
    assert!(!s.message().contains(PRODUCER));
    // One forbidden queue in a batch refuses the whole batch.
    let s = producer
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: vec![job("emails", "ok"), job("emailz", "no")],
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(s.message().contains("\"emailz\""), "{s:?}");
    assert_eq!(db.live_jobs().await, 0);

    // Prefix grants: `emails*` covers emails and emails.eu, not email.
    producer.enqueue(job("emails", "1")).await.unwrap();
    producer.enqueue(job("emails.eu", "2")).await.unwrap();
    let s = producer.enqueue(job("email", "x")).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied);
    // An exact name is not a prefix; `audit.*` is.
    both.enqueue(job("orders", "3")).await.unwrap();
    both.enqueue(job("audit.eu", "4")).await.unwrap();
    let s = both.enqueue(job("orders2", "x")).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied);
    assert_eq!(db.live_jobs().await, 4);

    // Consume without enqueue: the consumer reads and acks but cannot
    // enqueue; the producer cannot subscribe, nor settle what it holds no
    // consume grant for.
    let s = consumer.enqueue(job("emails", "x")).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(s.message().contains("enqueue"), "{s:?}");
    let sub = |queues: &[&str]| pb::SubscribeRequest {
        queues: queues.iter().map(|q| q.to_string()).collect(),
        consumer: "t".into(),
        max_in_flight: 4,
        lease: None,
        accept: Vec::new(),
    };
    let s = producer.subscribe(sub(&["emails"])).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(s.message().contains("consume"), "{s:?}");
    // Every queue of a subscription must be granted.
    let s = consumer
        .subscribe(sub(&["emails", "orders"]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(s.message().contains("\"orders\""), "{s:?}");

    let mut stream = consumer
        .subscribe(sub(&["emails", "emails.eu"]))
        .await
        .unwrap()
        .into_inner();
    let first = next_delivery(&mut stream, Duration::from_secs(5)).await;
    let second = next_delivery(&mut stream, Duration::from_secs(5)).await;
    let settle = |d: &pb::Delivery| pb::AckRequest {
        job_id: d.job.as_ref().unwrap().id.clone(),
        lease_token: d.lease_token.clone(),
        enqueue: Vec::new(),
        result: Vec::new(),
    };
    let s = producer.ack(settle(&first)).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let s = producer
        .extend_lease(pb::ExtendLeaseRequest {
            job_id: first.job.as_ref().unwrap().id.clone(),
            lease_token: first.lease_token.clone(),
            lease: Some(dur(Duration::from_secs(60))),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let s = producer
        .nack(pb::NackRequest {
            job_id: first.job.as_ref().unwrap().id.clone(),
            lease_token: first.lease_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert_eq!(db.live_jobs().await, 4);
    consumer.ack(settle(&first)).await.unwrap();
    consumer.ack(settle(&second)).await.unwrap();
    assert_eq!(db.live_jobs().await, 2);
    drop(stream);
    broker.stop().await;
}

// ---- limits --------------------------------------------------------------

#[tokio::test]
async fn broker_wide_stream_limit_is_resource_exhausted() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|c| c.security.max_streams = 2)
        .start()
        .await;
    // Separate connections: the limit is per broker, not per connection.
    let mut a = broker.client().await;
    let mut b = broker.client().await;
    let mut c = broker.client().await;
    let s1 = subscribe(&mut a, &["q"], 1, None).await;
    let _s2 = subscribe(&mut b, &["q"], 1, None).await;
    let s = c
        .subscribe(pb::SubscribeRequest {
            queues: vec!["q".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert!(s.message().contains("max-streams"), "{s:?}");
    // Unary calls are not streams: they still work.
    enqueue(&mut c, "q", "x").await;

    // A closed stream gives its slot back (once the broker has seen it go).
    drop(s1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match c
            .subscribe(pb::SubscribeRequest {
                queues: vec!["q".into()],
                ..Default::default()
            })
            .await
        {
            Ok(_) => break,
            Err(s) => assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "slot not freed within 5s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker.stop().await;
}

#[tokio::test]
async fn per_connection_stream_limit_holds_extra_streams_back() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|c| c.security.max_streams_per_connection = 2)
        .start()
        .await;
    let mut a = broker.client().await;
    let s1 = subscribe(&mut a, &["q"], 1, None).await;
    let _s2 = subscribe(&mut a, &["q"], 1, None).await;
    // The connection's two HTTP/2 streams are taken: a third call on it
    // waits for a slot (the client honours SETTINGS_MAX_CONCURRENT_STREAMS).
    let mut a2 = a.clone();
    let third = tokio::spawn(async move { enqueue(&mut a2, "q", "third").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third stream ran on a full connection"
    );
    // Another connection is not affected.
    let mut b = broker.client().await;
    enqueue(&mut b, "q", "other connection").await;
    // Closing a stream lets the waiting call through.
    drop(s1);
    tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("waiting call completes once a stream closes")
        .unwrap();
    broker.stop().await;
}

#[tokio::test]
async fn per_connection_concurrency_limit_sheds_with_resource_exhausted() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|c| c.security.concurrency_limit_per_connection = Some(1))
        .start()
        .await;
    let mut client = broker.client().await;
    // Hold one Enqueue in flight: it blocks on a table lock held here.
    let mut lock = db.pool.begin().await.unwrap();
    sqlx::query("lock table leaseq.jobs in access exclusive mode")
        .execute(&mut *lock)
        .await
        .unwrap();
    let mut held = client.clone();
    let first = tokio::spawn(async move { held.enqueue(job("q", "held")).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity
             where datname = current_database() and wait_event_type = 'Lock'
               and query like '%insert into leaseq.jobs%'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "enqueue never blocked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The connection's one slot is busy: the next call is shed at once
    // (not queued behind the held one, which would time out here).
    let s = tokio::time::timeout(Duration::from_secs(5), client.enqueue(job("q", "shed")))
        .await
        .expect("shed at once, not queued")
        .unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    // Another connection still gets its own slot (health answers on it).
    assert!(health(broker.addr, "").await.is_some());
    lock.rollback().await.unwrap();
    first.await.unwrap().expect("held enqueue completes");
    assert_eq!(db.live_jobs().await, 1);
    broker.stop().await;
}

// ---- the binary ------------------------------------------------------------

/// The real binary with TLS and tokens, driven by the real `enqueue` client.
#[tokio::test]
async fn binary_serves_tls_with_tokens_and_the_cli_speaks_it() {
    let db = TestDb::new().await;
    let pki = Pki::new();
    let (_scratch, auth) = auth_file();
    let mut broker = BinaryBroker::on(&db)
        .tls(&pki)
        .auth_file(&auth)
        .start()
        .await;
    let url = format!("https://{}", broker.addr);
    let bin = env!("CARGO_BIN_EXE_leaseq");
    let enqueue = |token: &'static str| {
        tokio::process::Command::new(bin)
            .args([
                "enqueue",
                "--addr",
                &url,
                "--queue",
                "emails",
                "--payload",
                "hi",
            ])
            .arg("--tls-ca")
            .arg(&pki.ca)
            .env("LEASEQ_TOKEN", token)
            .output()
    };
    let ok = enqueue(PRODUCER).await.unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let denied = enqueue(CONSUMER).await.unwrap();
    assert!(!denied.status.success());
    let err = String::from_utf8_lossy(&denied.stderr);
    assert!(
        err.contains("PermissionDenied") || err.contains("permission"),
        "{err}"
    );
    assert!(!err.contains(CONSUMER), "token in the error output: {err}");
    assert_eq!(db.live_jobs().await, 1);
    broker.child.kill().await.unwrap();
}

#[tokio::test]
async fn binary_refuses_a_bad_auth_file_and_hashes_tokens() {
    let db = TestDb::new().await;
    let (_scratch, bad) = Scratch::with_file(
        "sec",
        "tokens.json",
        r#"{"tokens":[{"name":"x","sha256":"nothex","grants":[]}]}"#,
    );
    let bin = env!("CARGO_BIN_EXE_leaseq");
    let out = tokio::process::Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .arg("--auth-file")
        .arg(&bad)
        .env("DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tokens[0].sha256"), "{err}");

    let mut child = tokio::process::Command::new(bin)
        .arg("hash-token")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use tokio::io::AsyncWriteExt;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"abc\n").await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

/// WaitJob and ReportProgress (issue 34) follow the grants: a wait needs
/// the enqueue or consume permission on the job's queue (a token of other
/// queues learns nothing of the job); a progress report, as an ack, needs
/// the consume permission somewhere (its lease token is the capability).
#[tokio::test]
async fn wait_job_and_report_progress_follow_the_grants() {
    let db = TestDb::new().await;
    let broker = auth_broker(&db).await;
    let mut producer = broker.client_with(&token(PRODUCER)).await.unwrap();
    let mut both = broker.client_with(&token(BOTH)).await.unwrap();
    let mut consumer = broker.client_with(&token(CONSUMER)).await.unwrap();
    let email = producer
        .enqueue(job("emails", "e"))
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let order = both
        .enqueue(job("orders", "o"))
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let wait = |id: &str| pb::WaitJobRequest {
        job_id: id.to_owned(),
        timeout: Some(dur(Duration::from_millis(200))),
        changes: true,
    };
    // Its own queues: the producer's enqueue grant, the consumer's consume
    // grant (the stream opens, its first message is the live state).
    for c in [&mut producer, &mut consumer] {
        let mut w = c.wait_job(wait(&email)).await.unwrap().into_inner();
        let m = w.message().await.unwrap().unwrap();
        assert_eq!(m.state(), pb::WaitState::Available);
    }
    // Another queue's job: denied, naming the queue.
    let e = producer.wait_job(wait(&order)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("orders"), "{e:?}");
    let e = both.wait_job(wait(&email)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // ReportProgress needs the consume grant somewhere.
    let report = |id: &str| pb::ReportProgressRequest {
        job_id: id.to_owned(),
        lease_token: uuid::Uuid::new_v4().to_string(),
        fraction: 0.5,
        message: String::new(),
    };
    let e = producer.report_progress(report(&email)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // With it, a token that is not the job's lease is stale, as an ack.
    let e = consumer.report_progress(report(&email)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
}
