//! The Rust client (`leaseq::client`): `Client` calls and the `Worker`
//! (reconnects across a broker drain and restart, extends leases, nacks
//! failures with their text, bounds concurrency, stops gracefully), over real
//! gRPC to in-process brokers on a real PostgreSQL.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{TestDb, test_config, until, wait_serving};
use leaseq::client::{Client, Delivery, Job, Nack, Worker};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Code;

const S10: Duration = Duration::from_secs(10);

/// An in-process broker on a given address, so a test can stop it and start
/// another on the same address (a restart, as the worker sees it).
struct Broker {
    shutdown: CancellationToken,
    handle: JoinHandle<anyhow::Result<()>>,
}

impl Broker {
    async fn start(db: &TestDb, addr: SocketAddr) -> Broker {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let shutdown = CancellationToken::new();
        let (url, token) = (db.url.clone(), shutdown.clone());
        let handle =
            tokio::spawn(
                async move { leaseq::server::run(test_config(), &url, listener, token).await },
            );
        wait_serving(addr, Duration::from_secs(20)).await;
        Broker { shutdown, handle }
    }

    /// Drains (streams end with UNAVAILABLE) and waits until it is gone.
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(15), self.handle)
            .await
            .expect("broker stops in time")
            .expect("broker task")
            .expect("broker run");
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A running worker and the means to stop it.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    /// Fires when the worker has taken the stop (its shutdown future
    /// completed): from then on it starts no handler.
    stopped: Option<oneshot::Receiver<()>>,
    handle: JoinHandle<Result<(), tonic::Status>>,
}

impl Running {
    fn spawn<F, Fut>(worker: Worker, handler: F) -> Running
    where
        F: Fn(Delivery) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), anyhow::Error>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel::<()>();
        let (stopped_tx, stopped_rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(worker.run(handler, async move {
            let _ = rx.await;
            let _ = stopped_tx.send(());
        }));
        Running {
            stop: Some(tx),
            stopped: Some(stopped_rx),
            handle,
        }
    }

    /// Asks the worker to stop; returns once it has taken the request.
    async fn begin_stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(rx) = self.stopped.take() {
            let _ = tokio::time::timeout(S10, rx).await;
        }
    }

    async fn stop(mut self, limit: Duration) -> Result<(), tonic::Status> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(limit, self.handle)
            .await
            .expect("worker stops in time")
            .expect("worker task")
    }
}

/// Polls the database until `sql` (a boolean query) holds; panics after `limit`.
fn payload(d: &Delivery) -> String {
    String::from_utf8(d.payload.clone()).unwrap()
}

#[tokio::test]
async fn client_calls_round_trip() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = Broker::start(&db, addr).await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();

    let a = client
        .enqueue(
            Job::new("calls", "a")
                .header("k", "v")
                .priority(3)
                .dedup_key("d1"),
        )
        .await
        .unwrap();
    assert!(!a.duplicate);
    let again = client
        .enqueue(Job::new("calls", "a2").dedup_key("d1"))
        .await
        .unwrap();
    assert_eq!(
        (again.job_id.as_str(), again.duplicate),
        (a.job_id.as_str(), true)
    );
    let batch = client
        .enqueue_batch([
            Job::new("calls", "b"),
            Job::new("calls", "c").max_attempts(1),
        ])
        .await
        .unwrap();
    assert_eq!(batch.len(), 2);
    let bad = client
        .enqueue(Job::new("bad queue", "x"))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().starts_with("queue:"), "{}", bad.message());

    // Settle through the client, on deliveries from a raw stream.
    let mut raw = crate::common::connect(addr).await;
    let mut stream = crate::common::subscribe(&mut raw, &["calls"], 3, None).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(crate::common::next_delivery(&mut stream, S10).await);
    }
    let first = got[0].job.clone().unwrap();
    assert_eq!(first.id, a.job_id, "priority 3 first");
    let until = client
        .extend_lease(&first.id, &got[0].lease_token, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(until > chrono::Utc::now() + chrono::Duration::seconds(50));
    client.ack(&first.id, &got[0].lease_token).await.unwrap();
    let stale = client
        .ack(&first.id, &got[0].lease_token)
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    let b = got[1].job.clone().unwrap();
    let dead = client
        .nack(
            &b.id,
            &got[1].lease_token,
            "nope",
            Nack {
                retry_after: None,
                dead_letter: true,
            },
        )
        .await
        .unwrap();
    assert!(dead);
    assert_eq!(db.dead_jobs().await, 1);
    drop(stream);
    broker.stop().await;
}

#[tokio::test]
async fn worker_acks_jobs_its_handler_completes() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = Broker::start(&db, addr).await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = Running::spawn(
        Worker::new(client.clone(), ["mail"]).concurrency(2),
        move |d| {
            let tx = tx.clone();
            async move {
                tx.send(payload(&d)).unwrap();
                Ok(())
            }
        },
    );
    for i in 0..5 {
        client
            .enqueue(Job::new("mail", format!("m{i}")))
            .await
            .unwrap();
    }
    let mut seen = HashSet::new();
    while seen.len() < 5 {
        let p = tokio::time::timeout(S10, rx.recv())
            .await
            .expect("5 jobs handled")
            .unwrap();
        seen.insert(p);
    }
    worker.stop(S10).await.expect("clean stop");
    // Acks are sent before the handler's task ends; stop waits for them.
    assert_eq!(db.live_jobs().await, 0);
    broker.stop().await;
}

#[tokio::test]
async fn worker_waits_for_the_broker_and_reconnects_after_drain_and_restart() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let (tx, mut rx) = mpsc::unbounded_channel();
    // Started before any broker listens on `addr`.
    let worker = Running::spawn(
        Worker::new(
            Client::connect_lazy(format!("http://{addr}")).unwrap(),
            ["jobs"],
        )
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500)),
        move |d| {
            let tx = tx.clone();
            async move {
                tx.send(payload(&d)).unwrap();
                Ok(())
            }
        },
    );
    let first = Broker::start(&db, addr).await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    client.enqueue(Job::new("jobs", "before")).await.unwrap();
    let got = tokio::time::timeout(S10, rx.recv())
        .await
        .expect("handled")
        .unwrap();
    assert_eq!(got, "before");
    // Acked before the drain (a drain releases what is not yet settled).
    until(&db, "select count(*) = 0 from leaseq.jobs", S10).await;

    // Drain: the broker ends the stream with UNAVAILABLE and exits.
    first.stop().await;
    let second = Broker::start(&db, addr).await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    client.enqueue(Job::new("jobs", "after")).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("handled after the restart")
        .unwrap();
    assert_eq!(got, "after");
    worker.stop(S10).await.expect("clean stop");
    assert_eq!(db.live_jobs().await, 0, "both jobs acked");
    second.stop().await;
}

#[tokio::test]
async fn lease_is_extended_while_the_handler_runs() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = Broker::start(&db, addr).await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let lease = Duration::from_secs(1);
    let worker = {
        let calls = calls.clone();
        Running::spawn(
            Worker::new(client.clone(), ["long"]).lease(lease),
            move |d| {
                calls.fetch_add(1, Ordering::SeqCst);
                let started = started_tx.clone();
                async move {
                    started.send(d.lease_expires_at).unwrap();
                    // The work itself: four times the lease.
                    tokio::time::sleep(lease * 4).await;
                    Ok(())
                }
            },
        )
    };
    client.enqueue(Job::new("long", "slow")).await.unwrap();
    let first_expiry = tokio::time::timeout(S10, started.recv())
        .await
        .expect("handler started")
        .unwrap()
        .expect("delivery has lease_expires_at");
    // A competitor on the same queue gets the job if the lease ever lapses
    // (the reaper runs every 200 ms).
    let mut raw = crate::common::connect(addr).await;
    let mut competitor = crate::common::subscribe(&mut raw, &["long"], 1, None).await;
    // While the handler runs, past its original lease, the job is still
    // leased to the worker with a later expiry.
    until(
        &db,
        "select coalesce(now() > (select min(enqueued_at) from leaseq.jobs) + interval '2.5 s', true)",
        S10,
    )
    .await;
    let (state, expires): (String, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("select state, lease_expires_at from leaseq.jobs")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(state, "leased");
    assert!(
        expires > first_expiry + chrono::Duration::seconds(1),
        "extended: {expires} vs {first_expiry}"
    );
    until(&db, "select count(*) = 0 from leaseq.jobs", S10).await;
    assert!(
        crate::common::try_next_delivery(&mut competitor, Duration::from_millis(300))
            .await
            .is_none(),
        "never redelivered"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    worker.stop(S10).await.expect("clean stop");
    drop(competitor);
    broker.stop().await;
}

#[tokio::test]
async fn handler_errors_and_panics_are_nacked_with_their_text() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = Broker::start(&db, addr).await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    client.enqueue(Job::new("flaky", "fail")).await.unwrap();
    client.enqueue(Job::new("flaky", "panic")).await.unwrap();
    // Retry at once, so the test need not wait out the backoff.
    sqlx::query("update leaseq.queues set backoff_base_ms = 0")
        .execute(&db.pool)
        .await
        .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = Running::spawn(
        Worker::new(client.clone(), ["flaky"]).concurrency(2),
        move |d| {
            let tx = tx.clone();
            async move {
                if d.attempt == 1 {
                    if payload(&d) == "panic" {
                        panic!("index out of range at row 9");
                    }
                    return Err(anyhow::anyhow!("disk full").context("writing report"));
                }
                tx.send((payload(&d), d.attempt, d.last_error.clone()))
                    .unwrap();
                Ok(())
            }
        },
    );
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(
            tokio::time::timeout(S10, rx.recv())
                .await
                .expect("retried")
                .unwrap(),
        );
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            (
                "fail".to_owned(),
                2,
                Some("writing report: disk full".to_owned())
            ),
            (
                "panic".to_owned(),
                2,
                Some("handler panicked: index out of range at row 9".to_owned())
            ),
        ]
    );
    worker.stop(S10).await.expect("clean stop");
    assert_eq!(db.live_jobs().await, 0);
    broker.stop().await;
}

#[tokio::test]
async fn concurrency_is_bounded() {
    const LIMIT: usize = 3;
    const JOBS: usize = 6;
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = Broker::start(&db, addr).await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    client
        .enqueue_batch((0..JOBS).map(|i| Job::new("par", format!("{i}"))))
        .await
        .unwrap();
    // Each handler holds on until more than LIMIT run at once, for at most a
    // second: a correct worker never gets there (the peak is exactly LIMIT),
    // a worker that overshoots gets there at once.
    let (running, _) = watch::channel(0usize);
    let running = Arc::new(running);
    let peak = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let worker = {
        let (running, peak, done) = (running.clone(), peak.clone(), done.clone());
        Running::spawn(
            Worker::new(client.clone(), ["par"]).concurrency(LIMIT as u32),
            move |_| {
                let (running, peak, done) = (running.clone(), peak.clone(), done.clone());
                async move {
                    let mut now = 0;
                    running.send_modify(|n| {
                        *n += 1;
                        now = *n;
                    });
                    peak.fetch_max(now, Ordering::SeqCst);
                    let mut rx = running.subscribe();
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), rx.wait_for(|n| *n > LIMIT))
                            .await;
                    running.send_modify(|n| *n -= 1);
                    done.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            },
        )
    };
    until(
        &db,
        "select count(*) = 0 from leaseq.jobs",
        Duration::from_secs(30),
    )
    .await;
    worker.stop(S10).await.expect("clean stop");
    assert_eq!(done.load(Ordering::SeqCst), JOBS);
    assert_eq!(peak.load(Ordering::SeqCst), LIMIT, "peak concurrency");
    broker.stop().await;
}

#[tokio::test]
async fn graceful_stop_lets_running_handlers_finish_and_starts_no_new_job() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = Broker::start(&db, addr).await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let started = Arc::new(Mutex::new(Vec::<String>::new()));
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    let (release_tx, release_rx) = watch::channel(false);
    let mut worker = {
        let started = started.clone();
        Running::spawn(
            Worker::new(client.clone(), ["stop"])
                .concurrency(2)
                .grace(S10),
            move |d| {
                let started = started.clone();
                let started_tx = started_tx.clone();
                let mut release = release_rx.clone();
                async move {
                    started.lock().unwrap().push(payload(&d));
                    started_tx.send(()).unwrap();
                    let _ = release.wait_for(|r| *r).await;
                    Ok(())
                }
            },
        )
    };
    client.enqueue(Job::new("stop", "running")).await.unwrap();
    tokio::time::timeout(S10, started_rx.recv())
        .await
        .expect("started")
        .unwrap();
    worker.begin_stop().await;
    // Delivered to the stopping worker (it has a free credit) but not run.
    let late = client.enqueue(Job::new("stop", "late")).await.unwrap();
    until(
        &db,
        "select count(*) = 1 from leaseq.jobs where payload = 'late' and state = 'leased'",
        S10,
    )
    .await;
    assert!(
        !worker.handle.is_finished(),
        "waits for the running handler"
    );
    release_tx.send(true).unwrap();
    worker.stop(S10).await.expect("clean stop");
    assert_eq!(*started.lock().unwrap(), vec!["running".to_owned()]);
    // The running job was acked; the late one released when the stream closed.
    until(
        &db,
        "select count(*) = 1 from leaseq.jobs where state = 'available'",
        S10,
    )
    .await;
    let id: String = sqlx::query_scalar("select id::text from leaseq.jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(id, late.job_id);
    broker.stop().await;
}

#[tokio::test]
async fn grace_elapsed_cancels_the_handler_and_releases_its_job() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = Broker::start(&db, addr).await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    let worker = Running::spawn(
        Worker::new(client.clone(), ["stuck"]).grace(Duration::from_millis(300)),
        move |_| {
            let started_tx = started_tx.clone();
            async move {
                started_tx.send(()).unwrap();
                std::future::pending::<()>().await;
                Ok(())
            }
        },
    );
    client.enqueue(Job::new("stuck", "forever")).await.unwrap();
    tokio::time::timeout(S10, started_rx.recv())
        .await
        .expect("started")
        .unwrap();
    worker.stop(S10).await.expect("stops after the grace");
    until(
        &db,
        "select count(*) = 1 from leaseq.jobs where state = 'available'",
        S10,
    )
    .await;
    broker.stop().await;
}

#[tokio::test]
async fn unfixable_errors_end_the_worker() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = Broker::start(&db, addr).await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let noop = |_: Delivery| async { Ok::<(), anyhow::Error>(()) };
    let err = Worker::new(client.clone(), ["bad queue"])
        .run(noop, std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("queues[0]:"), "{}", err.message());
    let err = Worker::new(client.clone(), ["ok"])
        .concurrency(0)
        .run(noop, std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with("concurrency:"),
        "{}",
        err.message()
    );
    broker.stop().await;
}

#[tokio::test]
async fn handler_running_across_a_restart_keeps_the_bound_and_the_job_is_redone() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let first = Broker::start(&db, addr).await;
    let client = Client::connect_lazy(format!("http://{addr}")).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    let (release_tx, release_rx) = watch::channel(false);
    let worker = {
        let calls = calls.clone();
        Running::spawn(
            Worker::new(client.clone(), ["redo"])
                .concurrency(1)
                .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500)),
            move |_| {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                let started_tx = started_tx.clone();
                let mut release = release_rx.clone();
                async move {
                    started_tx.send(n).unwrap();
                    if n == 1 {
                        let _ = release.wait_for(|r| *r).await;
                    }
                    Ok(())
                }
            },
        )
    };
    client.enqueue(Job::new("redo", "x")).await.unwrap();
    assert_eq!(
        tokio::time::timeout(S10, started_rx.recv()).await.unwrap(),
        Some(1)
    );
    let token: String = sqlx::query_scalar("select lease_token::text from leaseq.jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();

    // The drain releases the job under the running handler; the next broker
    // leases it again to the reconnected worker.
    first.stop().await;
    let second = Broker::start(&db, addr).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let re_leased: bool = sqlx::query_scalar(
            "select coalesce(bool_and(state = 'leased' and lease_token::text <> $1), true) \
             from leaseq.jobs",
        )
        .bind(&token)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if re_leased {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "re-leased to the worker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Delivered, but not started: the first handler still holds the only
    // slot. (Watched for a bounded time: it must not happen.)
    assert!(
        tokio::time::timeout(Duration::from_millis(500), started_rx.recv())
            .await
            .is_err(),
        "a second handler started while the first still runs"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The first handler's ack is refused (stale token); the redelivery then
    // runs and is acked.
    release_tx.send(true).unwrap();
    assert_eq!(
        tokio::time::timeout(S10, started_rx.recv()).await.unwrap(),
        Some(2)
    );
    until(&db, "select count(*) = 0 from leaseq.jobs", S10).await;
    worker.stop(S10).await.expect("clean stop");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    second.stop().await;
}
