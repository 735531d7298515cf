//! The Rust client (`leaseq_client`): `Client` calls, the `AdminClient`, and
//! the `Worker` (settles on the Consume stream and the Subscribe + AckBatch
//! fallback, handlers per queue, outcomes, timeouts, lost leases, reconnects
//! across a broker drain and restart, lease extension, bounded concurrency,
//! graceful stop), TLS with client certificates and tokens, and the crate's
//! examples, over real gRPC to in-process brokers on a real PostgreSQL.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Pki, Scratch, TestBroker, TestDb, free_addr, until};
use leaseq_client::pb;
use leaseq_client::pb::queue_service_client::QueueServiceClient;
use leaseq_client::pb::queue_service_server::{QueueService, QueueServiceServer};
use leaseq_client::{
    AdminClient, Client, ConnectError, ConnectOptions, DeadLetter, DeadLetters, Delivery, Job,
    KeyOverride, Nack, QueueUpdate, Retry, TraceParent, Worker,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status, Streaming};

/// The crate's examples, compiled into this test and run against real
/// brokers (their `main`s are not called: they read the environment).
#[allow(dead_code)]
mod examples {
    pub mod producer {
        include!("../crates/client/examples/producer.rs");
    }
    pub mod worker {
        include!("../crates/client/examples/worker.rs");
    }
    pub mod tls {
        include!("../crates/client/examples/tls.rs");
    }
    pub mod admin {
        include!("../crates/client/examples/admin.rs");
    }
    pub mod tracing {
        include!("../crates/client/examples/tracing.rs");
    }
}

const S10: Duration = Duration::from_secs(10);

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
        let (tx, stopped_rx, shutdown) = Running::shutdown();
        let handle = tokio::spawn(worker.run(handler, shutdown));
        Running {
            stop: Some(tx),
            stopped: Some(stopped_rx),
            handle,
        }
    }

    /// A worker whose handlers were given with `Worker::handle`.
    fn serve(worker: Worker) -> Running {
        let (tx, stopped_rx, shutdown) = Running::shutdown();
        let handle = tokio::spawn(worker.serve(shutdown));
        Running {
            stop: Some(tx),
            stopped: Some(stopped_rx),
            handle,
        }
    }

    fn shutdown() -> (
        oneshot::Sender<()>,
        oneshot::Receiver<()>,
        impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let (tx, rx) = oneshot::channel::<()>();
        let (stopped_tx, stopped_rx) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = rx.await;
            let _ = stopped_tx.send(());
        };
        (tx, stopped_rx, shutdown)
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
    let broker = TestBroker::on(&db).addr(addr).start().await;
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
    assert!(!again.replaced);
    // Debounce: the waiting job takes the new payload.
    let replaced = client
        .enqueue(
            Job::new("calls", "a3")
                .header("k", "v")
                .priority(3)
                .dedup_key("d1")
                .replace_waiting(),
        )
        .await
        .unwrap();
    assert_eq!(
        (
            replaced.job_id.as_str(),
            replaced.duplicate,
            replaced.replaced
        ),
        (a.job_id.as_str(), true, true)
    );
    // Unique for a window: the option reaches the broker.
    let w = client
        .enqueue(
            Job::new("calls-w", "w")
                .dedup_key("w1")
                .unique_for(Duration::from_secs(90)),
        )
        .await
        .unwrap();
    let window: Option<i64> =
        sqlx::query_scalar("select unique_for_ms from leaseq.jobs where id = $1::uuid")
            .bind(&w.job_id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(window, Some(90_000));
    let bad = client
        .enqueue(Job::new("calls-w", "w").unique_for(Duration::from_secs(90)))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().contains("unique_for"), "{}", bad.message());
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
    let broker = TestBroker::on(&db).addr(addr).start().await;
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
    let first = TestBroker::on(&db).addr(addr).start().await;
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
    let second = TestBroker::on(&db).addr(addr).start().await;
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

/// The queue's one job is gone (acked) within 10 s, `competitor` (a
/// subscriber on its queue since the handler started) never got it, and
/// the handler ran once.
async fn acked_once_and_never_redelivered(
    db: &TestDb,
    competitor: &mut tonic::Streaming<pb::SubscribeResponse>,
    calls: &AtomicUsize,
) {
    until(db, "select count(*) = 0 from leaseq.jobs", S10).await;
    assert!(
        crate::common::try_next_delivery(competitor, Duration::from_millis(300))
            .await
            .is_none(),
        "never redelivered"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The worker keeps leases from a task of its own, not from the job's: a
/// handler that holds its thread (blocking work it should have given to
/// `spawn_blocking`) still has its lease extended while it runs, on a
/// runtime with another thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_holds_its_thread_keeps_its_lease() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let lease = Duration::from_secs(1);
    let blocking = Worker::new(client.clone(), ["blocking"]).lease(lease);
    let stats = blocking.stats();
    let worker = {
        let calls = calls.clone();
        Running::spawn(blocking, move |_d| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                // Three leases without a single await.
                std::thread::sleep(lease * 3);
                Ok(())
            }
        })
    };
    client.enqueue(Job::new("blocking", "slow")).await.unwrap();
    // A competitor gets the job if the lease ever lapses (the reaper runs
    // every 200 ms).
    let mut raw = crate::common::connect(addr).await;
    let mut competitor = crate::common::subscribe(&mut raw, &["blocking"], 1, None).await;
    acked_once_and_never_redelivered(&db, &mut competitor, &calls).await;
    assert_eq!(stats.lease_lost.load(Ordering::SeqCst), 0);
    assert_eq!(stats.acked.load(Ordering::SeqCst), 1);
    worker.stop(S10).await.expect("clean stop");
    drop(competitor);
    broker.stop().await;
}

#[tokio::test]
async fn lease_is_extended_while_the_handler_runs() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
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
    acked_once_and_never_redelivered(&db, &mut competitor, &calls).await;
    worker.stop(S10).await.expect("clean stop");
    drop(competitor);
    broker.stop().await;
}

#[tokio::test]
async fn handler_errors_and_panics_are_nacked_with_their_text() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
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
    let broker = TestBroker::on(&db).addr(addr).start().await;
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
    let broker = TestBroker::on(&db).addr(addr).start().await;
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
    let broker = TestBroker::on(&db).addr(addr).start().await;
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
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let noop = |_: Delivery| async { Ok::<(), anyhow::Error>(()) };
    let err = Worker::new(client.clone(), ["bad queue"])
        .run(noop, std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // Named in the Consume request the worker opens with.
    assert!(
        err.message().starts_with("subscribe.queues[0]:"),
        "{}",
        err.message()
    );
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
    let first = TestBroker::on(&db).addr(addr).start().await;
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
    let second = TestBroker::on(&db).addr(addr).start().await;
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

// ---- settles on the Consume stream, and the fallback ---------------------

/// Calls per method seen by a [`Proxy`], and what its Consume streams carried.
#[derive(Default)]
struct Calls(Mutex<HashMap<String, usize>>);

impl Calls {
    fn add(&self, key: &str, n: usize) {
        *self.0.lock().unwrap().entry(key.to_owned()).or_default() += n;
    }

    fn get(&self, key: &str) -> usize {
        self.0.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    fn summary(&self) -> String {
        let mut v: Vec<_> = self.0.lock().unwrap().clone().into_iter().collect();
        v.sort();
        format!("{v:?}")
    }
}

/// A gRPC proxy in front of a broker's QueueService that counts every call
/// and every settle sent on Consume streams, and (with `consume: false`)
/// answers UNIMPLEMENTED to Consume as a broker from before it would; with
/// `strip_features`, Consume heartbeats lose their `features`, as from a
/// broker before them (tests/client_effects.rs).
struct Proxy {
    upstream: QueueServiceClient<Channel>,
    calls: Arc<Calls>,
    consume: bool,
    strip_features: bool,
}

#[tonic::async_trait]
impl QueueService for Proxy {
    async fn enqueue(
        &self,
        r: Request<pb::EnqueueRequest>,
    ) -> Result<Response<pb::EnqueueResponse>, Status> {
        self.calls.add("Enqueue", 1);
        self.upstream.clone().enqueue(r.into_inner()).await
    }

    async fn enqueue_batch(
        &self,
        r: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueBatchResponse>, Status> {
        self.calls.add("EnqueueBatch", 1);
        self.upstream.clone().enqueue_batch(r.into_inner()).await
    }

    type SubscribeStream = Streaming<pb::SubscribeResponse>;

    async fn subscribe(
        &self,
        r: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        self.calls.add("Subscribe", 1);
        self.upstream.clone().subscribe(r.into_inner()).await
    }

    async fn ack(&self, r: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        self.calls.add("Ack", 1);
        self.upstream.clone().ack(r.into_inner()).await
    }

    async fn ack_batch(
        &self,
        r: Request<pb::AckBatchRequest>,
    ) -> Result<Response<pb::AckBatchResponse>, Status> {
        self.calls.add("AckBatch", 1);
        self.calls.add("AckBatch.acks", r.get_ref().acks.len());
        self.upstream.clone().ack_batch(r.into_inner()).await
    }

    async fn nack(
        &self,
        r: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        self.calls.add("Nack", 1);
        self.upstream.clone().nack(r.into_inner()).await
    }

    async fn extend_lease(
        &self,
        r: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        self.calls.add("ExtendLease", 1);
        self.upstream.clone().extend_lease(r.into_inner()).await
    }

    async fn report_progress(
        &self,
        _: Request<pb::ReportProgressRequest>,
    ) -> Result<Response<pb::ReportProgressResponse>, Status> {
        Err(Status::unimplemented(
            "leaseq.v1.QueueService/ReportProgress",
        ))
    }

    type WaitJobStream =
        tokio_stream::wrappers::ReceiverStream<Result<pb::WaitJobResponse, Status>>;

    async fn wait_job(
        &self,
        _: Request<pb::WaitJobRequest>,
    ) -> Result<Response<Self::WaitJobStream>, Status> {
        Err(Status::unimplemented("leaseq.v1.QueueService/WaitJob"))
    }

    type ProduceStream =
        tokio_stream::wrappers::ReceiverStream<Result<pb::ProduceResponse, Status>>;

    async fn produce(
        &self,
        r: Request<Streaming<pb::ProduceRequest>>,
    ) -> Result<Response<Self::ProduceStream>, Status> {
        self.produce_through(r).await
    }

    type ConsumeStream =
        tokio_stream::wrappers::ReceiverStream<Result<pb::ConsumeResponse, Status>>;

    async fn consume(
        &self,
        r: Request<Streaming<pb::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        self.calls.add("Consume", 1);
        if !self.consume {
            return Err(Status::unimplemented("leaseq.v1.QueueService/Consume"));
        }
        // Requests: counted, and how the client ended them (half-close or not).
        let (req_tx, req_rx) = mpsc::channel(16);
        let (calls, mut inbound) = (self.calls.clone(), r.into_inner());
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(m)) => {
                        calls.add("Consume.messages", 1);
                        calls.add("Consume.acks", m.acks.len());
                        calls.add("Consume.nacks", m.nacks.len());
                        calls.add("Consume.extends", m.extends.len());
                        if req_tx.send(m).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => return calls.add("Consume.half_closed", 1),
                    Err(_) => return calls.add("Consume.reset", 1),
                }
            }
        });
        let mut upstream = self
            .upstream
            .clone()
            .consume(tokio_stream::wrappers::ReceiverStream::new(req_rx))
            .await?
            .into_inner();
        // Responses: passed on, and how the broker ended them.
        let (resp_tx, resp_rx) = mpsc::channel(16);
        let (calls, strip) = (self.calls.clone(), self.strip_features);
        tokio::spawn(async move {
            loop {
                match upstream.message().await {
                    Ok(Some(mut m)) => {
                        if let Some(pb::consume_response::Kind::Heartbeat(h)) = &mut m.kind
                            && strip
                        {
                            h.features.clear();
                        }
                        if resp_tx.send(Ok(m)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => return calls.add("Consume.ended_ok", 1),
                    Err(s) => {
                        calls.add("Consume.ended_with_error", 1);
                        let _ = resp_tx.send(Err(s)).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            resp_rx,
        )))
    }
}

/// Produce through the [`Proxy`]: passed on, its messages counted; with
/// `consume: false` (a broker from before Consume, older still than
/// Produce) UNIMPLEMENTED.
impl Proxy {
    async fn produce_through(
        &self,
        r: Request<Streaming<pb::ProduceRequest>>,
    ) -> Result<
        Response<tokio_stream::wrappers::ReceiverStream<Result<pb::ProduceResponse, Status>>>,
        Status,
    > {
        self.calls.add("Produce", 1);
        if !self.consume {
            return Err(Status::unimplemented("leaseq.v1.QueueService/Produce"));
        }
        let (req_tx, req_rx) = mpsc::channel(16);
        let (calls, mut inbound) = (self.calls.clone(), r.into_inner());
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                calls.add("Produce.messages", 1);
                if req_tx.send(m).await.is_err() {
                    return;
                }
            }
        });
        let mut upstream = self
            .upstream
            .clone()
            .produce(tokio_stream::wrappers::ReceiverStream::new(req_rx))
            .await?
            .into_inner();
        let (resp_tx, resp_rx) = mpsc::channel(16);
        tokio::spawn(async move {
            loop {
                let m = upstream.message().await;
                let end = !matches!(m, Ok(Some(_)));
                let item = match m {
                    Ok(Some(m)) => Ok(m),
                    Ok(None) => return,
                    Err(s) => Err(s),
                };
                if resp_tx.send(item).await.is_err() || end {
                    return;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            resp_rx,
        )))
    }
}

/// Starts a [`Proxy`] to the broker at `upstream`; returns its address.
async fn start_proxy(upstream: SocketAddr, consume: bool) -> (SocketAddr, Arc<Calls>) {
    start_proxy_with(upstream, consume, false).await
}

/// A [`Proxy`] that makes the broker at `upstream` look like one from
/// before `Heartbeat.features`: its Consume streams' first heartbeats list
/// none.
pub(crate) async fn start_featureless_proxy(upstream: SocketAddr) -> SocketAddr {
    start_proxy_with(upstream, true, true).await.0
}

async fn start_proxy_with(
    upstream: SocketAddr,
    consume: bool,
    strip_features: bool,
) -> (SocketAddr, Arc<Calls>) {
    let calls = Arc::new(Calls::default());
    let proxy = Proxy {
        upstream: QueueServiceClient::connect(format!("http://{upstream}"))
            .await
            .unwrap(),
        calls: calls.clone(),
        consume,
        strip_features,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(QueueServiceServer::new(proxy))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, calls)
}

/// Retries at once after a plain nack, so tests need not wait out the
/// backoff (the queue is created by enqueueing to it first).
async fn no_backoff(db: &TestDb) {
    sqlx::query("update leaseq.queues set backoff_base_ms = 0")
        .execute(&db.pool)
        .await
        .unwrap();
}

type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>;

/// Enqueues `ok` jobs that succeed, one that fails on its first attempt and
/// one that runs past its 1 s lease; returns the handler for them.
async fn mixed_jobs(
    client: &Client,
    db: &TestDb,
    queue: &str,
    ok: usize,
) -> impl Fn(Delivery) -> BoxFuture + Send + Sync + 'static {
    client
        .enqueue_batch((0..ok).map(|i| Job::new(queue, format!("ok-{i}"))))
        .await
        .unwrap();
    client.enqueue(Job::new(queue, "fail")).await.unwrap();
    client.enqueue(Job::new(queue, "long")).await.unwrap();
    no_backoff(db).await;
    |d: Delivery| -> BoxFuture {
        Box::pin(async move {
            match payload(&d).as_str() {
                "fail" if d.attempt == 1 => anyhow::bail!("first attempts fail"),
                "long" => tokio::time::sleep(Duration::from_millis(1800)).await,
                _ => {}
            }
            Ok(())
        })
    }
}

#[tokio::test]
async fn settles_and_lease_extensions_travel_on_the_consume_stream() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let (proxy, calls) = start_proxy(addr, true).await;
    let client = Client::connect(format!("http://{proxy}")).await.unwrap();
    let handler = mixed_jobs(&client, &db, "stream", 30).await;
    let worker = Worker::new(client.clone(), ["stream"])
        .concurrency(8)
        .lease(Duration::from_secs(1));
    let stats = worker.stats();
    let running = Running::spawn(worker, handler);
    until(&db, "select count(*) = 0 from leaseq.jobs", S10).await;
    running.stop(S10).await.expect("clean stop");

    let c = calls.summary();
    // One stream carried everything: 32 acks, a nack, the extensions of the
    // long job's lease (every half second for 1.8 s).
    assert_eq!(calls.get("Consume"), 1, "{c}");
    assert_eq!(calls.get("Consume.acks"), 32, "{c}");
    assert_eq!(calls.get("Consume.nacks"), 1, "{c}");
    assert!(calls.get("Consume.extends") >= 2, "{c}");
    for unary in ["Subscribe", "Ack", "AckBatch", "Nack", "ExtendLease"] {
        assert_eq!(calls.get(unary), 0, "{unary}: {c}");
    }
    // The stop half-closed the stream, and the broker ended it with OK.
    assert_eq!(calls.get("Consume.half_closed"), 1, "{c}");
    assert_eq!(calls.get("Consume.ended_ok"), 1, "{c}");
    assert_eq!(
        calls.get("Consume.reset") + calls.get("Consume.ended_with_error"),
        0,
        "{c}"
    );
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    assert_eq!(n(&stats.settled_on_stream), 33);
    assert_eq!((n(&stats.acked), n(&stats.nacked)), (32, 1));
    assert_eq!(n(&stats.consume_streams), 1);
    assert_eq!(n(&stats.subscribe_streams), 0);
    assert_eq!(db.dead_jobs().await, 0);
    broker.stop().await;
}

#[tokio::test]
async fn acks_finishing_together_share_a_message() {
    const JOBS: usize = 20;
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let (proxy, calls) = start_proxy(addr, true).await;
    let client = Client::connect(format!("http://{proxy}")).await.unwrap();
    client
        .enqueue_batch((0..JOBS).map(|i| Job::new("together", format!("{i}"))))
        .await
        .unwrap();
    // Every handler waits until all have started, then they finish at once.
    let (started, _) = watch::channel(0usize);
    let started = Arc::new(started);
    let running = {
        let started = started.clone();
        Running::spawn(
            Worker::new(client.clone(), ["together"]).concurrency(JOBS as u32),
            move |_| {
                let started = started.clone();
                async move {
                    started.send_modify(|n| *n += 1);
                    let _ = started.subscribe().wait_for(|n| *n == JOBS).await;
                    Ok(())
                }
            },
        )
    };
    until(&db, "select count(*) = 0 from leaseq.jobs", S10).await;
    running.stop(S10).await.expect("clean stop");
    let c = calls.summary();
    assert_eq!(calls.get("Consume.acks"), JOBS, "{c}");
    // The first message opened the stream; the acks took a few at most.
    let ack_messages = calls.get("Consume.messages") - 1;
    eprintln!("{JOBS} acks in {ack_messages} message(s)");
    assert!(
        ack_messages <= 5,
        "{JOBS} acks in {ack_messages} messages: {c}"
    );
    broker.stop().await;
}

#[tokio::test]
async fn a_broker_without_consume_gets_subscribe_and_ack_batch() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let (proxy, calls) = start_proxy(addr, false).await;
    let client = Client::connect(format!("http://{proxy}")).await.unwrap();
    let handler = mixed_jobs(&client, &db, "old", 20).await;
    let worker = Worker::new(client.clone(), ["old"])
        .concurrency(8)
        .lease(Duration::from_secs(1));
    let stats = worker.stats();
    let running = Running::spawn(worker, handler);
    until(&db, "select count(*) = 0 from leaseq.jobs", S10).await;
    running.stop(S10).await.expect("clean stop");

    let c = calls.summary();
    // Consume was tried once, then Subscribe: acks in AckBatch calls, the
    // nack and the extensions as unary calls.
    assert_eq!(calls.get("Consume"), 1, "{c}");
    assert_eq!(calls.get("Subscribe"), 1, "{c}");
    assert_eq!(calls.get("AckBatch.acks"), 22, "{c}");
    assert!(calls.get("AckBatch") >= 1, "{c}");
    assert_eq!(calls.get("Ack"), 0, "{c}");
    assert_eq!(calls.get("Nack"), 1, "{c}");
    assert!(calls.get("ExtendLease") >= 2, "{c}");
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    assert_eq!(n(&stats.settled_on_stream), 0);
    assert_eq!(n(&stats.settled_batched), 22);
    assert_eq!(n(&stats.settled_unary), 1);
    assert_eq!(n(&stats.subscribe_streams), 1);
    broker.stop().await;
}

/// `Client::enqueue` sends its jobs on one Produce stream shared by the
/// client's clones: 40 concurrent enqueues from two clones are one call of
/// 40 messages, no Enqueue, each answered with its own job; after the
/// broker behind it restarts (the stream broken), the next enqueue opens a
/// new stream. Against a broker without Produce (UNIMPLEMENTED, the proxy
/// playing an older broker) the same enqueues go as unary Enqueue calls,
/// after one refused Produce, and the jobs are all there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_enqueues_share_one_produce_stream_or_fall_back_to_enqueue() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    for (newer, queue) in [(true, "produce-new"), (false, "produce-old")] {
        let (proxy, calls) = start_proxy(addr, newer).await;
        let client = Client::connect(format!("http://{proxy}")).await.unwrap();
        let clone = client.clone();
        let sent = futures::future::join_all((0..40).map(|i| {
            let c = if i % 2 == 0 { &client } else { &clone };
            c.enqueue(Job::new(queue, format!("p{i}")))
        }))
        .await;
        let ids: HashSet<String> = sent
            .into_iter()
            .map(|r| r.expect("enqueued").job_id)
            .collect();
        assert_eq!(ids.len(), 40, "one job each");
        let n: i64 = sqlx::query_scalar("select count(*) from leaseq.jobs where queue = $1")
            .bind(queue)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(n, 40);
        let c = calls.summary();
        assert_eq!(calls.get("Produce"), 1, "{c}");
        if newer {
            assert_eq!(calls.get("Produce.messages"), 40, "{c}");
            assert_eq!(calls.get("Enqueue"), 0, "{c}");
        } else {
            assert_eq!(calls.get("Produce.messages"), 0, "{c}");
            assert_eq!(calls.get("Enqueue"), 40, "{c}");
            // Told once: the later ones go straight to Enqueue.
            client.enqueue(Job::new(queue, "later")).await.unwrap();
            assert_eq!(calls.get("Produce"), 1, "{}", calls.summary());
            assert_eq!(calls.get("Enqueue"), 41, "{}", calls.summary());
        }
    }
    broker.stop().await;

    // A broker restart breaks the stream: the next enqueue opens another.
    let direct_addr = free_addr();
    let broker = TestBroker::on(&db).addr(direct_addr).start().await;
    let client = Client::connect(format!("http://{direct_addr}"))
        .await
        .unwrap();
    client
        .enqueue(Job::new("produce-restart", "a"))
        .await
        .unwrap();
    broker.stop().await;
    let broker = TestBroker::on(&db).addr(direct_addr).start().await;
    let mut again = None;
    for _ in 0..50 {
        match client.enqueue(Job::new("produce-restart", "b")).await {
            Ok(e) => {
                again = Some(e);
                break;
            }
            // The broken stream's answer, or the reconnection under way.
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(again.is_some(), "an enqueue after the restart succeeds");
    broker.stop().await;
}

#[tokio::test]
async fn stream_acks_off_uses_subscribe_from_the_start() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let (proxy, calls) = start_proxy(addr, true).await;
    let client = Client::connect(format!("http://{proxy}")).await.unwrap();
    client.enqueue(Job::new("plain", "x")).await.unwrap();
    let running = Running::spawn(
        Worker::new(client.clone(), ["plain"]).stream_acks(false),
        |_| async { Ok(()) },
    );
    until(&db, "select count(*) = 0 from leaseq.jobs", S10).await;
    running.stop(S10).await.expect("clean stop");
    let c = calls.summary();
    assert_eq!(
        (
            calls.get("Consume"),
            calls.get("Subscribe"),
            calls.get("AckBatch")
        ),
        (0, 1, 1),
        "{c}"
    );
    broker.stop().await;
}

// ---- handlers per queue, outcomes, timeouts, lost leases -----------------

/// Sets its flag when dropped: shows a handler's future was cancelled.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn handlers_per_queue_with_a_fallback_and_trace_context() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = client
        .enqueue(
            Job::new("emails", "traced")
                .traceparent(TP)
                .tracestate("congo=t61rcWkgMzE"),
        )
        .await
        .unwrap();
    client.enqueue(Job::new("sms", "text")).await.unwrap();
    client.enqueue(Job::new("audit", "log")).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel::<(&'static str, Delivery)>();
    let (tx1, tx2, tx3) = (tx.clone(), tx.clone(), tx);
    let running = Running::spawn(
        Worker::new(client.clone(), ["audit"])
            .handle("emails", move |d: Delivery| {
                let tx = tx1.clone();
                async move {
                    tx.send(("emails", d)).unwrap();
                    Ok::<(), anyhow::Error>(())
                }
            })
            // A different error type per handler is fine.
            .handle("sms", move |d: Delivery| {
                let tx = tx2.clone();
                async move {
                    tx.send(("sms", d)).unwrap();
                    Ok::<(), String>(())
                }
            })
            .concurrency(3),
        move |d| {
            let tx = tx3.clone();
            async move {
                tx.send(("fallback", d)).unwrap();
                Ok(())
            }
        },
    );
    let mut got = HashMap::new();
    while got.len() < 3 {
        let (handler, d) = tokio::time::timeout(S10, rx.recv())
            .await
            .expect("3 jobs handled")
            .unwrap();
        got.insert(d.queue.clone(), (handler, d));
    }
    assert_eq!(got["emails"].0, "emails");
    assert_eq!(got["sms"].0, "sms");
    assert_eq!(got["audit"].0, "fallback");
    let d = &got["emails"].1;
    assert_eq!(d.id, traced.job_id);
    assert_eq!(d.traceparent(), Some(TP));
    assert_eq!(d.tracestate(), Some("congo=t61rcWkgMzE"));
    let tp = d.trace_parent().expect("parsed");
    assert_eq!(tp.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(tp, TraceParent::parse(TP).unwrap());
    assert_eq!(got["sms"].1.traceparent(), None);
    until(&db, "select count(*) = 0 from leaseq.jobs", S10).await;
    running.stop(S10).await.expect("clean stop");
    broker.stop().await;
}

/// The spans of a real OpenTelemetry SDK, as its exporter receives them.
#[derive(Clone, Debug, Default)]
struct Collected(Arc<Mutex<Vec<opentelemetry_sdk::trace::SpanData>>>);

impl opentelemetry_sdk::trace::SpanExporter for Collected {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

impl Collected {
    /// A real SDK tracer provider exporting into a new collection, installed
    /// as the global one (each test runs in a process of its own).
    fn install() -> (Collected, opentelemetry_sdk::trace::SdkTracerProvider) {
        let spans = Collected::default();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_simple_exporter(spans.clone())
            .build();
        opentelemetry::global::set_tracer_provider(provider.clone());
        (spans, provider)
    }
}

/// The `otel` feature: an enqueue inside a span carries that span's context
/// (a job with its own `traceparent` keeps it; one outside any span gets
/// none), and the worker runs each handler in a `process <queue>` consumer
/// span, child of the producer's, whose outcome and status it records; the
/// handler's own spans are children of that span.
#[tokio::test]
async fn otel_enqueue_carries_the_current_span_and_the_handler_span_is_its_child() {
    use opentelemetry::context::FutureExt as _;
    use opentelemetry::trace::{
        Span as _, SpanKind, Status, TraceContextExt, Tracer, TracerProvider as _,
    };
    use opentelemetry::{Context, KeyValue};

    let (spans, provider) = Collected::install();
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();

    let cx = Context::current_with_span(provider.tracer("app").start("produce"));
    let producer = cx.span().span_context().clone();
    let fine = client
        .enqueue(Job::new("otel", "fine"))
        .with_context(cx.clone())
        .await
        .unwrap();
    let failing = client
        .enqueue_batch([Job::new("otel", "fail")])
        .with_context(cx.clone())
        .await
        .unwrap()
        .remove(0);
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let own = client
        .enqueue(Job::new("otel", "own").traceparent(TP))
        .with_context(cx.clone())
        .await
        .unwrap();
    cx.span().end();
    let bare = client.enqueue(Job::new("otel", "bare")).await.unwrap();

    let (tx, mut rx) = mpsc::unbounded_channel();
    let running = Running::serve(Worker::builder(client.clone()).handle(
        "otel",
        move |d: Delivery| {
            let tx = tx.clone();
            async move {
                // A span of the handler's own, in the context it runs in.
                let tracer = opentelemetry::global::tracer("handler");
                tracer.start("work").end();
                let sc = Context::current().span().span_context().clone();
                tx.send((d.id.clone(), d.traceparent().map(str::to_owned), sc))
                    .unwrap();
                if d.payload == b"fail" {
                    return Err(DeadLetter::new("bad input").into());
                }
                Ok::<(), anyhow::Error>(())
            }
        },
    ));
    let mut seen = HashMap::new();
    while seen.len() < 4 {
        let (id, tp, sc) = tokio::time::timeout(S10, rx.recv())
            .await
            .expect("4 jobs handled")
            .unwrap();
        seen.insert(id, (tp, sc));
    }
    until(
        &db,
        "select (select count(*) from leaseq.jobs) = 0
            and (select count(*) from leaseq.dead_jobs) = 1",
        S10,
    )
    .await;
    running.stop(S10).await.expect("clean stop");
    broker.stop().await;

    let producer_tp = TraceParent {
        trace_id: producer.trace_id().to_bytes(),
        parent_id: producer.span_id().to_bytes(),
        flags: producer.trace_flags().to_u8(),
    }
    .to_string();
    assert!(producer.is_sampled());
    assert_eq!(seen[&fine.job_id].0.as_deref(), Some(producer_tp.as_str()));
    assert_eq!(
        seen[&failing.job_id].0.as_deref(),
        Some(producer_tp.as_str())
    );
    assert_eq!(
        seen[&own.job_id].0.as_deref(),
        Some(TP),
        "a job's own traceparent is kept"
    );
    assert_eq!(seen[&bare.job_id].0, None, "no span, no traceparent");

    let spans = spans.0.lock().unwrap().clone();
    let process = |id: &str| {
        spans
            .iter()
            .find(|s| {
                s.name == "process otel"
                    && s.attributes
                        .contains(&KeyValue::new("messaging.message.id", id.to_owned()))
            })
            .unwrap_or_else(|| panic!("a process span for {id} in {spans:#?}"))
    };
    let attr = |s: &opentelemetry_sdk::trace::SpanData, key: &str| {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    for (id, status, outcome) in [
        (&fine.job_id, Status::Ok, "ack"),
        (&failing.job_id, Status::error("bad input"), "dead_letter"),
    ] {
        let s = process(id);
        assert_eq!(s.span_context.trace_id(), producer.trace_id(), "{id}");
        assert_eq!(
            s.parent_span_id,
            producer.span_id(),
            "child of the producer's span"
        );
        assert!(s.parent_span_is_remote);
        assert_eq!(s.span_kind, SpanKind::Consumer);
        assert_eq!(s.status, status);
        assert_eq!(attr(s, "leaseq.outcome").as_deref(), Some(outcome));
        assert_eq!(
            attr(s, "messaging.destination.name").as_deref(),
            Some("otel")
        );
        assert_eq!(attr(s, "messaging.system").as_deref(), Some("leaseq"));
        // The handler ran in this span: its context and its own span say so.
        assert_eq!(seen[id].1.span_id(), s.span_context.span_id());
        let work = spans.iter().find(|w| {
            w.name == "work"
                && w.span_context.trace_id() == producer.trace_id()
                && w.parent_span_id == s.span_context.span_id()
        });
        assert!(
            work.is_some(),
            "the handler's span is a child of {id}'s process span"
        );
    }
    let s = process(&own.job_id);
    assert_eq!(
        s.span_context.trace_id().to_string(),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert_eq!(s.parent_span_id.to_string(), "00f067aa0ba902b7");
    let s = process(&bare.job_id);
    assert_eq!(
        s.parent_span_id,
        opentelemetry::trace::SpanId::INVALID,
        "a root span"
    );
    assert_ne!(s.span_context.trace_id(), producer.trace_id());
    let produce = spans
        .iter()
        .find(|s| s.name == "produce")
        .expect("the producer's span");
    assert_eq!(produce.span_context.span_id(), producer.span_id());
}

/// The tracing example: `signup` → `process <queue>` → `send email`, one
/// trace, each span the parent of the next.
#[tokio::test]
async fn the_tracing_example_makes_one_trace_from_producer_to_handler() {
    let (spans, _provider) = Collected::install();
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let id = tokio::time::timeout(S10, examples::tracing::traced_round_trip(&client, "traced"))
        .await
        .expect("the example ends")
        .unwrap();
    until(&db, "select count(*) = 0 from leaseq.jobs", S10).await;
    broker.stop().await;
    let spans = spans.0.lock().unwrap().clone();
    let named = |name: &str| {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("a span {name} in {spans:#?}"))
    };
    let (signup, process, send) = (
        named("signup"),
        named("process traced"),
        named("send email"),
    );
    assert!(
        process
            .attributes
            .contains(&opentelemetry::KeyValue::new("messaging.message.id", id))
    );
    assert_eq!(process.parent_span_id, signup.span_context.span_id());
    assert_eq!(send.parent_span_id, process.span_context.span_id());
    for s in [process, send] {
        assert_eq!(s.span_context.trace_id(), signup.span_context.trace_id());
    }
}

/// The crate installs from its folder into a project of its own: a new
/// cargo package that depends on `leaseq-client` by path (nothing of this
/// workspace but the crate and the lock file's versions) builds offline and
/// runs, enqueueing a job and working it with a `Worker` against a broker.
/// Every ```rust block of the crate's README and of docs/clients.md is
/// compiled in it too, each as the body of an async function (`client`,
/// `id` and `payload` given, and stubs for what the handlers call), so the
/// snippets stay true to the API.
/// The build shares this workspace's target directory and profiles.
/// Where cargo put this test's build (`target/debug`, wherever the target
/// directory is): beside the `leaseq` binary it built for the tests.
fn profile_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_leaseq"))
        .parent()
        .expect("the binary's directory")
        .to_owned()
}

/// The ```rust blocks of the crate's README and of docs/clients.md as a
/// module: each the body of an async function, in the files' order.
fn readme_blocks(root: &std::path::Path) -> String {
    let mut out = String::from(
        "//! The README's Rust blocks, compiled (not run).\n\
         #![allow(unused, clippy::all)]\n\
         use leaseq_client::*;\n\
         /// What the consume block's handler calls.\n\
         #[derive(Debug)]\n\
         pub struct SendError;\n\
         impl std::fmt::Display for SendError {\n\
             fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(\"send\") }\n\
         }\n\
         impl std::error::Error for SendError {}\n\
         impl SendError {\n\
             pub fn is_busy(&self) -> bool { false }\n\
             pub fn is_permanent(&self) -> bool { false }\n\
         }\n\
         pub async fn deliver(_: &[u8]) -> Result<(), SendError> { Ok(()) }\n\
         pub async fn mail_server_busy() -> bool { false }\n\
         pub async fn send_sms(_: Delivery) -> anyhow::Result<()> { Ok(()) }\n",
    );
    let mut blocks = 0;
    for (file, at_least) in [("crates/client/README.md", 5), ("docs/clients.md", 1)] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let before = blocks;
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() != "```rust" {
                continue;
            }
            blocks += 1;
            out.push_str(&format!(
                "\n/// {file}\npub async fn block_{blocks}(client: Client, id: String, \
                 payload: &'static str) -> anyhow::Result<()> {{\n"
            ));
            for body in lines.by_ref().take_while(|l| l.trim() != "```") {
                out.push_str(body);
                out.push('\n');
            }
            out.push_str("Ok(())\n}\n");
        }
        assert!(
            blocks - before >= at_least,
            "{file}'s Rust blocks: {}",
            blocks - before
        );
    }
    out
}

/// A command for cargo with the environment of a shell, not of this test:
/// cargo gives a test CARGO_MANIFEST_DIR, CARGO_PKG_* and more, and build
/// scripts that track one of them (ring's does) would be rebuilt in the
/// shared target directory, and then again by the workspace's next build.
fn shell_cargo() -> tokio::process::Command {
    let mut cargo = tokio::process::Command::new(env!("CARGO"));
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if (key.starts_with("CARGO_") && key != "CARGO_HOME") || key.starts_with("NEXTEST") {
            cargo.env_remove(&*key);
        }
    }
    cargo.env_remove("RUSTC_WORKSPACE_WRAPPER");
    cargo
}

/// leaseq-proto and leaseq-client as crates.io would get them: `cargo
/// package` (what `cargo publish` uploads: the normalized manifests, path
/// dependencies replaced by versions, only the files inside each crate),
/// unpacked into `dir`. Their directories.
async fn packaged_crates(root: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let target = dir.join("package-target");
    let out = shell_cargo()
        .args(["package", "--offline", "--no-verify", "--allow-dirty"])
        .args(["-p", "leaseq-proto", "-p", "leaseq-client", "--target-dir"])
        .arg(&target)
        .current_dir(root)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "cargo package: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let version = env!("CARGO_PKG_VERSION");
    let mut dirs = Vec::new();
    for krate in ["leaseq-proto", "leaseq-client"] {
        let file = target.join(format!("package/{krate}-{version}.crate"));
        let status = std::process::Command::new("tar")
            .arg("xzf")
            .arg(&file)
            .arg("-C")
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success(), "unpacking {}", file.display());
        let unpacked = dir.join(format!("{krate}-{version}"));
        let license = std::fs::symlink_metadata(unpacked.join("LICENSE"))
            .unwrap_or_else(|e| panic!("{krate} carries LICENSE: {e}"));
        assert!(license.is_file(), "{krate}'s LICENSE is the text itself");
        dirs.push(unpacked);
    }
    // The proto files themselves (crates/proto/proto is a link to proto/).
    for name in ["queue.proto", "admin.proto"] {
        let packed = dirs[0].join("proto/leaseq/v1").join(name);
        assert!(
            std::fs::symlink_metadata(&packed).is_ok_and(|m| m.is_file()),
            "{} is a file of the package",
            packed.display()
        );
        assert_eq!(
            std::fs::read(&packed).unwrap(),
            std::fs::read(root.join("proto/leaseq/v1").join(name)).unwrap()
        );
    }
    (dirs.remove(0), dirs.remove(0))
}

/// The client crate as a user gets it from crates.io (`packaged_crates`:
/// what `cargo publish` would upload, leaseq-proto's too), in a project of
/// its own that builds offline from them alone and runs against a broker:
/// `cargo publish --dry-run` verifies no more (it builds the packages), and
/// with fresh profiles it would compile every dependency again.
#[tokio::test]
async fn the_crate_builds_and_runs_in_a_project_of_its_own() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let profiles = &workspace[workspace.find("\n[profile.").expect("profiles") + 1..];
    let project = Scratch::new("rust-user");
    let dir = project.dir();
    let (proto, client) = packaged_crates(&root, dir).await;
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            r#"[package]
name = "leaseq-user"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
leaseq-client = {{ path = "{}", features = ["otel"] }}
anyhow = "1"
serde = {{ version = "1", features = ["derive"] }}
opentelemetry = {{ version = "0.33", default-features = false, features = ["trace"] }}
tokio = {{ version = "1", features = ["macros", "rt-multi-thread", "signal"] }}

# The packaged client depends on leaseq-proto from crates.io: the packaged
# one stands in for it.
[patch.crates-io]
leaseq-proto = {{ path = "{}" }}

{profiles}"#,
            client.display(),
            proto.display()
        ),
    )
    .unwrap();
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    std::fs::create_dir(dir.join("src")).unwrap();
    std::fs::write(dir.join("src/readme.rs"), readme_blocks(&root)).unwrap();
    std::fs::write(
        dir.join("src/main.rs"),
        r#"mod readme;

use leaseq_client::{Client, Delivery, Job, Worker};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let client = Client::connect(std::env::var("LEASEQ_ADDR")?).await?;
    let sent = client.enqueue(Job::new("installed", "hello")).await?;
    let (tx, rx) = tokio::sync::oneshot::channel::<String>();
    let tx = std::sync::Mutex::new(Some(tx));
    let worker = Worker::builder(client.clone()).handle("installed", move |job: Delivery| {
        if let Some(tx) = tx.lock().unwrap().take() {
            let _ = tx.send(format!("{} {}", job.id, String::from_utf8_lossy(&job.payload)));
        }
        async { Ok::<(), anyhow::Error>(()) }
    });
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(worker.serve(async { let _ = done_rx.await; }));
    let handled = rx.await?;
    done_tx.send(()).ok();
    serving.await??;
    println!("enqueued {} handled {handled}", sent.job_id);
    Ok(())
}
"#,
    )
    .unwrap();

    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let target = profile_dir()
        .parent()
        .expect("the target directory")
        .to_owned();
    let out = shell_cargo()
        .args(["run", "--offline", "--quiet"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .env("LEASEQ_ADDR", format!("http://{addr}"))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), out)
        .await
        .expect("the project builds and runs within 10 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo run: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let words: Vec<&str> = stdout.split_whitespace().collect();
    assert!(
        matches!(words.as_slice(), ["enqueued", a, "handled", b, "hello"] if a == b),
        "{stdout}"
    );
    until(&db, "select count(*) = 0 from leaseq.jobs", S10).await;
    broker.stop().await;
}

#[tokio::test]
async fn timeout_cancels_the_handler_and_the_job_comes_back() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let slow = client.enqueue(Job::new("slow", "x")).await.unwrap();
    client.enqueue(Job::new("quick", "y")).await.unwrap();
    no_backoff(&db).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = {
        let (dropped, tx, tx2) = (dropped.clone(), tx.clone(), tx);
        Worker::builder(client.clone())
            .handle("slow", move |d: Delivery| {
                let (dropped, tx) = (dropped.clone(), tx.clone());
                async move {
                    if d.attempt == 1 {
                        let _flag = DropFlag(dropped);
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    tx.send((d.queue.clone(), d.attempt, d.last_error.clone()))
                        .unwrap();
                    Ok::<(), anyhow::Error>(())
                }
            })
            // 300 ms for every queue but `quick`, which has far longer.
            .timeout(Duration::from_millis(300))
            .handle("quick", move |d: Delivery| {
                let tx = tx2.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    tx.send((d.queue.clone(), d.attempt, d.last_error.clone()))
                        .unwrap();
                    Ok::<(), anyhow::Error>(())
                }
            })
            .queue_timeout("quick", S10)
            .concurrency(2)
    };
    let stats = worker.stats();
    let started = Instant::now();
    let running = Running::serve(worker);
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(
            tokio::time::timeout(S10, rx.recv())
                .await
                .expect("handled")
                .unwrap(),
        );
    }
    got.sort();
    assert_eq!(
        got[0],
        ("quick".to_owned(), 1, None),
        "quick kept its timeout"
    );
    let (queue, attempt, last_error) = &got[1];
    assert_eq!((queue.as_str(), *attempt), ("slow", 2), "came back");
    assert_eq!(
        last_error.as_deref(),
        Some("timeout: the handler ran longer than 300ms")
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the handler's future was dropped"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(stats.timed_out.load(Ordering::Relaxed), 1);
    until(&db, "select count(*) = 0 from leaseq.jobs", S10).await;
    assert!(db.live_row(&slow.job_id).await.is_none());
    running.stop(S10).await.expect("clean stop");
    broker.stop().await;
}

#[tokio::test]
async fn retry_and_dead_letter_outcomes() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    for p in ["retry", "context", "dead", "plain"] {
        client.enqueue(Job::new("outcomes", p)).await.unwrap();
    }
    // A plain failure waits for the queue's backoff: make that long, so the
    // Retry jobs' own delays are what show.
    sqlx::query("update leaseq.queues set backoff_base_ms = 60000, backoff_cap_ms = 60000")
        .execute(&db.pool)
        .await
        .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = Worker::new(client.clone(), ["outcomes"]).concurrency(4);
    let stats = worker.stats();
    let running =
        Running::spawn(worker, move |d| {
            let tx = tx.clone();
            async move {
                let p = payload(&d);
                tx.send((p.clone(), d.attempt, d.last_error.clone(), Instant::now()))
                    .unwrap();
                match (p.as_str(), d.attempt) {
                    ("retry", 1) => Err(Retry::after(Duration::from_millis(1500))
                        .because("busy")
                        .into()),
                    // Found under context, as the first Retry in the chain.
                    ("context", 1) => Err(anyhow::Error::new(Retry::after(Duration::ZERO))
                        .context("calling upstream")),
                    ("dead", _) => Err(DeadLetter::new("bad payload").into()),
                    ("plain", _) => Err(anyhow::anyhow!("plain failure")),
                    _ => Ok(()),
                }
            }
        });
    let mut seen: HashMap<(String, i32), (Option<String>, Instant)> = HashMap::new();
    while seen.len() < 6 {
        let (p, attempt, last_error, at) = tokio::time::timeout(S10, rx.recv())
            .await
            .expect("6 deliveries")
            .unwrap();
        seen.insert((p, attempt), (last_error, at));
    }
    let get = |p: &str, a: i32| seen[&(p.to_owned(), a)].clone();
    assert_eq!(
        get("context", 2).0.as_deref(),
        Some("calling upstream: retry requested")
    );
    assert_eq!(get("retry", 2).0.as_deref(), Some("busy"));
    let waited = get("retry", 2).1 - get("retry", 1).1;
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_secs(5),
        "retry_after 1.5 s, came back after {waited:?}"
    );
    until(&db, "select count(*) = 1 from leaseq.jobs", S10).await;
    // The plain failure waits for the queue's backoff.
    let rows = db.job_rows().await;
    assert_eq!((rows[0].0.as_str(), rows[0].2), ("plain", 1));

    // The dead letter, seen through the admin client.
    let admin = AdminClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let dead = admin
        .list_dead_letters("outcomes", 0, "", true)
        .await
        .unwrap()
        .jobs;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (
            dead[0].payload.as_slice(),
            dead[0].attempt,
            dead[0].dead_reason.as_str(),
            dead[0].last_error.as_str()
        ),
        (&b"dead"[..], 1, "nacked", "bad payload")
    );
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    assert_eq!(
        (n(&stats.acked), n(&stats.nacked), n(&stats.dead_lettered)),
        (2, 4, 1)
    );
    running.stop(S10).await.expect("clean stop");
    broker.stop().await;
}

/// Deletes a job behind its holder's back: no stream hears of it.
async fn gone_untold(db: &TestDb, id: &str) {
    let n = sqlx::query("delete from leaseq.jobs where id = $1::uuid")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn a_cancel_stops_the_running_handler_and_settles_nothing() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let admin = client.admin();
    let dropped = Arc::new(AtomicBool::new(false));
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (done_tx, mut done) = mpsc::unbounded_channel();
    // A long lease: only the Cancelled message can stop the handler soon.
    let worker = Worker::new(client.clone(), ["cancel.me"])
        .concurrency(1)
        .lease(Duration::from_secs(600));
    let stats = worker.stats();
    let running = {
        let dropped = dropped.clone();
        Running::spawn(worker, move |d| {
            let (dropped, started_tx, done_tx) =
                (dropped.clone(), started_tx.clone(), done_tx.clone());
            async move {
                if payload(&d) == "long" {
                    let _flag = DropFlag(dropped);
                    started_tx.send(d.id.clone()).unwrap();
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                done_tx.send(payload(&d)).unwrap();
                Ok(())
            }
        })
    };
    let long = client.enqueue(Job::new("cancel.me", "long")).await.unwrap();
    client.enqueue(Job::new("cancel.me", "next")).await.unwrap();
    let id = tokio::time::timeout(S10, started.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(id, long.job_id);
    let asked = Instant::now();
    assert!(admin.cancel_job(&id).await.unwrap(), "was leased");
    crate::common::eventually(S10, "handler cancelled", || {
        let dropped = dropped.clone();
        async move { dropped.load(Ordering::SeqCst) }
    })
    .await;
    // Its only credit came back with the cancel: the next job runs now,
    // not after the 600 s lease.
    assert_eq!(
        tokio::time::timeout(S10, done.recv())
            .await
            .unwrap()
            .as_deref(),
        Some("next")
    );
    assert!(asked.elapsed() < Duration::from_secs(10));
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    crate::common::eventually(S10, "next acked", || {
        let stats = stats.clone();
        async move { stats.acked.load(Ordering::Relaxed) == 1 }
    })
    .await;
    assert_eq!(
        (n(&stats.cancelled), n(&stats.lease_lost), n(&stats.nacked)),
        (1, 0, 0)
    );
    running.stop(S10).await.expect("clean stop");
    assert_eq!(db.live_jobs().await, 0);
    assert_eq!(db.dead_jobs().await, 0);
    broker.stop().await;
}

#[tokio::test]
async fn a_lost_lease_cancels_the_handler_or_skips_the_settle_quietly() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();

    // Lost while the handler runs: the next extension (every half second of
    // a 1 s lease) is refused, and the handler is cancelled.
    let dropped = Arc::new(AtomicBool::new(false));
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (done_tx, mut done) = mpsc::unbounded_channel();
    let running_worker =
        Worker::new(client.clone(), ["lost.running"]).lease(Duration::from_secs(1));
    let running_stats = running_worker.stats();
    let running = {
        let dropped = dropped.clone();
        Running::spawn(running_worker, move |d| {
            let (dropped, started_tx, done_tx) =
                (dropped.clone(), started_tx.clone(), done_tx.clone());
            async move {
                if payload(&d) == "stuck" {
                    let _flag = DropFlag(dropped);
                    started_tx.send(d.id.clone()).unwrap();
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                done_tx.send(payload(&d)).unwrap();
                Ok(())
            }
        })
    };
    let stuck = client
        .enqueue(Job::new("lost.running", "stuck"))
        .await
        .unwrap();
    let id = tokio::time::timeout(S10, started.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(id, stuck.job_id);
    // The lease goes away under the worker's feet, untold (as when it
    // expired and another consumer took the job): only the refused
    // extension says so. (`CancelJob` tells the stream: see
    // `a_cancel_stops_the_running_handler_and_settles_nothing`.)
    gone_untold(&db, &id).await;
    crate::common::eventually(S10, "handler cancelled", || {
        let dropped = dropped.clone();
        async move { dropped.load(Ordering::SeqCst) }
    })
    .await;
    // The worker goes on with the next job.
    client
        .enqueue(Job::new("lost.running", "next"))
        .await
        .unwrap();
    assert_eq!(
        tokio::time::timeout(S10, done.recv())
            .await
            .unwrap()
            .as_deref(),
        Some("next")
    );
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    crate::common::eventually(S10, "next acked", || {
        let stats = running_stats.clone();
        async move { stats.acked.load(Ordering::Relaxed) == 1 }
    })
    .await;
    assert_eq!(n(&running_stats.lease_lost), 1);
    assert_eq!(n(&running_stats.nacked), 0);

    // Lost before the settle: the handler finishes, its ack (on the stream)
    // is refused with FAILED_PRECONDITION, and nothing else happens.
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (release_tx, release_rx) = watch::channel(false);
    let settle_worker = Worker::new(client.clone(), ["lost.settle"]);
    let settle_stats = settle_worker.stats();
    let settling = Running::spawn(settle_worker, move |d| {
        let started_tx = started_tx.clone();
        let mut release = release_rx.clone();
        async move {
            started_tx.send(d.id.clone()).unwrap();
            let _ = release.wait_for(|r| *r).await;
            Ok(())
        }
    });
    let job = client.enqueue(Job::new("lost.settle", "x")).await.unwrap();
    let id = tokio::time::timeout(S10, started.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(id, job.job_id);
    gone_untold(&db, &id).await;
    release_tx.send(true).unwrap();
    crate::common::eventually(S10, "ack refused", || {
        let stats = settle_stats.clone();
        async move { stats.lease_lost.load(Ordering::Relaxed) == 1 }
    })
    .await;
    assert_eq!((n(&settle_stats.acked), n(&settle_stats.nacked)), (0, 0));
    assert_eq!(n(&settle_stats.settled_on_stream), 1);
    running.stop(S10).await.expect("clean stop");
    settling.stop(S10).await.expect("clean stop");
    assert_eq!(db.live_jobs().await, 0);
    assert_eq!(db.dead_jobs().await, 0);
    broker.stop().await;
}

#[tokio::test]
async fn a_drain_mid_work_loses_nothing() {
    const JOBS: usize = 40;
    let db = TestDb::new().await;
    let addr = free_addr();
    let first = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect_lazy(format!("http://{addr}")).unwrap();
    client
        .enqueue_batch((0..JOBS).map(|i| Job::new("drain", format!("{i}"))))
        .await
        .unwrap();
    let handled = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let worker = Worker::new(client.clone(), ["drain"])
        .concurrency(4)
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500));
    let stats = worker.stats();
    let running = {
        let handled = handled.clone();
        Running::spawn(worker, move |d| {
            let handled = handled.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(150)).await;
                *handled.lock().unwrap().entry(payload(&d)).or_default() += 1;
                Ok(())
            }
        })
    };
    crate::common::eventually(S10, "some jobs handled", || {
        let handled = handled.clone();
        async move { handled.lock().unwrap().len() >= 8 }
    })
    .await;
    // Mid-work: the stream ends with UNAVAILABLE, the unsettled jobs are
    // released; the worker reconnects to the next broker on that address.
    first.stop().await;
    let before = handled.lock().unwrap().len();
    assert!(before < JOBS, "the drain came mid-work");
    let second = TestBroker::on(&db).addr(addr).start().await;
    until(
        &db,
        "select count(*) = 0 from leaseq.jobs",
        Duration::from_secs(30),
    )
    .await;
    running.stop(S10).await.expect("clean stop");
    let handled = handled.lock().unwrap().clone();
    let missing: Vec<usize> = (0..JOBS)
        .filter(|i| !handled.contains_key(&i.to_string()))
        .collect();
    assert!(missing.is_empty(), "never handled: {missing:?}");
    assert_eq!(db.dead_jobs().await, 0);
    assert!(
        stats.consume_streams.load(Ordering::Relaxed) >= 2,
        "reconnected"
    );
    second.stop().await;
}

// ---- TLS, client certificates, tokens ------------------------------------

/// Certificates ([`Pki`]) and a token file.
struct Secure {
    pki: Pki,
    auth_file: PathBuf,
    /// Where the token file is; removed with the Secure.
    _dir: Scratch,
}

const WORKER_TOKEN: &str = "worker-secret-0123456789";
const ADMIN_TOKEN: &str = "admin-secret-0123456789";

impl Secure {
    fn new() -> Secure {
        let h = leaseq_server::hash_token;
        let tokens = serde_json::json!({"tokens": [
            {"name": "worker", "sha256": h(WORKER_TOKEN),
             "grants": [{"queues": "secure*", "actions": ["enqueue", "consume"]}]},
            {"name": "admin", "sha256": h(ADMIN_TOKEN),
             "grants": [{"queues": "*", "actions": ["admin"]}]},
        ]});
        let (dir, auth_file) = Scratch::with_file("client", "tokens.json", &tokens.to_string());
        Secure {
            pki: Pki::new(),
            auth_file,
            _dir: dir,
        }
    }

    fn options(&self, token: Option<&str>) -> ConnectOptions {
        let opts = ConnectOptions::default()
            .tls_ca(&self.pki.ca)
            .tls_identity(&self.pki.client_cert, &self.pki.client_key);
        match token {
            Some(t) => opts.token(t),
            None => opts,
        }
    }
}

#[tokio::test]
async fn tls_client_certificates_and_tokens_on_every_client() {
    let db = TestDb::new().await;
    let sec = Secure::new();
    let addr = free_addr();
    // TLS, client certificates from the CA required, tokens required.
    let broker = TestBroker::on(&db)
        .addr(addr)
        .mutual_tls(&sec.pki)
        .auth_file(&sec.auth_file)
        .spawn()
        .await;
    let url = format!("https://{addr}");
    // Ready once health (no token needed) answers SERVING over mutual TLS.
    crate::common::eventually(Duration::from_secs(20), "TLS broker serving", || {
        let (url, opts) = (url.clone(), sec.options(None));
        async move {
            let Ok(client) = Client::connect_with(&url, opts).await else {
                return false;
            };
            tonic_health::pb::health_client::HealthClient::new(client.channel())
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await
                .is_ok_and(|r| r.into_inner().status == 1)
        }
    })
    .await;

    // The TLS example: enqueue, and a worker's Consume stream, with the token.
    let id = examples::tls::round_trip(&url, sec.options(Some(WORKER_TOKEN)), "secure.emails")
        .await
        .unwrap();
    assert!(db.live_row(&id).await.is_none(), "handled and acked");

    // The lazy variant carries the same settings.
    let lazy = Client::connect_lazy_with(&url, sec.options(Some(WORKER_TOKEN))).unwrap();
    lazy.enqueue(Job::new("secure.sms", "lazy")).await.unwrap();

    // Without a token the worker stops at once: retrying cannot fix it.
    let anonymous = Client::connect_with(&url, sec.options(None)).await.unwrap();
    let err = Worker::new(anonymous.clone(), ["secure.sms"])
        .run(|_| async { Ok::<(), String>(()) }, std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = anonymous
        .enqueue(Job::new("secure.sms", "x"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    // A token for other queues: PERMISSION_DENIED, also fatal for a worker.
    let worker_client = Client::connect_with(&url, sec.options(Some(WORKER_TOKEN)))
        .await
        .unwrap();
    let err = Worker::new(worker_client.clone(), ["elsewhere"])
        .run(|_| async { Ok::<(), String>(()) }, std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // The admin client: with the admin token; the worker's is refused.
    let admin = AdminClient::connect_with(&url, sec.options(Some(ADMIN_TOKEN)))
        .await
        .unwrap();
    let info = admin.get_queue("secure.sms").await.unwrap();
    assert_eq!(info.stats.unwrap().available, 1);
    let err = worker_client
        .admin()
        .get_queue("secure.sms")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // Without a client certificate the TLS handshake (or first call) fails.
    let no_cert = ConnectOptions::default()
        .tls_ca(&sec.pki.ca)
        .token(WORKER_TOKEN);
    let refused = match Client::connect_with(&url, no_cert).await {
        Err(_) => true,
        Ok(c) => c.enqueue(Job::new("secure.sms", "x")).await.is_err(),
    };
    assert!(refused, "served a client without a certificate");
    // Options that cannot work fail before connecting, naming the option.
    let missing = ConnectOptions::default()
        .tls_ca(&sec.pki.ca)
        .tls_identity("/nonexistent/client.pem", &sec.pki.client_key);
    match Client::connect_lazy_with(&url, missing) {
        Err(ConnectError::Config(msg)) => assert!(msg.starts_with("tls_cert:"), "{msg}"),
        other => panic!("expected a config error, got {other:?}"),
    }
    match Client::connect_lazy_with(
        format!("http://{addr}"),
        ConnectOptions::default().tls_ca(&sec.pki.ca),
    ) {
        Err(ConnectError::Config(msg)) => assert!(msg.contains("https://"), "{msg}"),
        other => panic!("expected a config error, got {other:?}"),
    }
    assert_eq!(db.live_jobs().await, 1);
    broker.stop().await;
}

// ---- the admin client ------------------------------------------------------

#[tokio::test]
async fn the_admin_client_covers_the_admin_service() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let admin = AdminClient::connect_with(format!("http://{addr}"), ConnectOptions::default())
        .await
        .unwrap();

    let info = admin
        .update_queue(
            "adm.a",
            QueueUpdate::new()
                .create()
                .max_attempts(7)
                .default_lease(Duration::from_secs(45))
                .backoff(Duration::from_secs(2), Duration::from_secs(20))
                .completed_retention(Duration::from_secs(3600))
                .concurrency_limit(3)
                .rate_limit(50.0)
                .rate_burst(5),
        )
        .await
        .unwrap();
    let s = info.settings.unwrap();
    assert_eq!(
        (
            s.max_attempts,
            s.concurrency_limit,
            s.rate_limit,
            s.rate_burst
        ),
        (7, 3, 50.0, 5)
    );
    assert_eq!(s.default_lease.unwrap().seconds, 45);
    let err = admin
        .update_queue("adm.a", QueueUpdate::new().max_attempts(0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with("max_attempts"),
        "{}",
        err.message()
    );
    let err = admin.get_queue("adm.none").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    for q in ["adm.b", "adm.c"] {
        client.enqueue(Job::new(q, "x")).await.unwrap();
    }
    let page = admin.list_queues(1, "").await.unwrap();
    assert_eq!(page.queues.len(), 1);
    assert!(!page.next_page_token.is_empty());
    let names: Vec<String> = admin
        .queues()
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(names, ["adm.a", "adm.b", "adm.c"]);

    assert!(
        admin
            .pause_queue("adm.b")
            .await
            .unwrap()
            .settings
            .unwrap()
            .paused
    );
    assert!(
        !admin
            .resume_queue("adm.b")
            .await
            .unwrap()
            .settings
            .unwrap()
            .paused
    );
    let job = client.enqueue(Job::new("adm.b", "y")).await.unwrap();
    let got = admin.get_job(&job.job_id).await.unwrap();
    assert_eq!(
        (got.payload.as_slice(), got.state),
        (&b"y"[..], pb::JobState::Available as i32)
    );
    let listed = admin
        .list_jobs(pb::ListJobsRequest {
            queue: "adm.b".into(),
            include_payload: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.jobs.len(), 2);
    assert!(
        !admin.cancel_job(&job.job_id).await.unwrap(),
        "was not leased"
    );
    assert_eq!(
        admin.get_job(&job.job_id).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(admin.purge_queue("adm.c").await.unwrap().purged, 1);

    let mut watch = admin
        .watch_queues(["adm.b"], Some(Duration::from_secs(1)))
        .await
        .unwrap();
    let first = tokio::time::timeout(S10, watch.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.queues[0].name, "adm.b");
    assert_eq!(first.queues[0].stats.unwrap().available, 1);
    drop(watch);

    // Dead letters: make two (dead-lettering nacks), requeue one, purge one.
    let ids: Vec<String> = client
        .enqueue_batch([Job::new("adm.d", "1"), Job::new("adm.d", "2")])
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.job_id)
        .collect();
    let mut raw = crate::common::connect(addr).await;
    let mut stream = crate::common::subscribe(&mut raw, &["adm.d"], 2, None).await;
    for d in crate::common::take(&mut stream, 2, S10).await {
        let nack = Nack {
            retry_after: None,
            dead_letter: true,
        };
        assert!(
            client
                .nack(&crate::common::id_of(&d), &d.lease_token, "no", nack)
                .await
                .unwrap()
        );
    }
    drop(stream);
    let dead = admin
        .list_dead_letters("adm.d", 0, "", false)
        .await
        .unwrap();
    assert_eq!(dead.jobs.len(), 2);
    let r = admin
        .requeue_dead_letters(DeadLetters::ids([ids[0].clone()]).in_queue("adm.d"))
        .await
        .unwrap();
    assert_eq!(r.requeued, 1);
    assert_eq!(
        admin
            .purge_dead_letters(DeadLetters::all("adm.d"))
            .await
            .unwrap(),
        1
    );
    assert_eq!(db.dead_jobs().await, 0);
    assert!(db.live_row(&ids[0]).await.is_some(), "requeued");
    broker.stop().await;
}

/// Keys (issue 33) through the crate: `QueueUpdate::ordered_by_key` and
/// `key_concurrency` round-trip and are validated; in an ordered queue a
/// `Worker` gets a key's second job only once its first is acked, while a
/// job without a key is not held back; `Delivery::key` names the key; a key
/// over 256 bytes is INVALID_ARGUMENT. (The per-key limits, overrides and
/// fair shares: the next test.)
#[tokio::test]
async fn keys_and_ordered_queues_through_the_rust_client() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let admin = client.admin();
    let settings = |info: pb::QueueInfo| {
        let s = info.settings.unwrap();
        (s.ordered_by_key, s.key_concurrency)
    };

    let set = |u: QueueUpdate| admin.update_queue("keys.o", u);
    assert_eq!(
        settings(
            set(QueueUpdate::new().create().ordered_by_key(true))
                .await
                .unwrap()
        ),
        (true, 1),
        "1 when not given"
    );
    assert_eq!(
        settings(set(QueueUpdate::new().key_concurrency(3)).await.unwrap()),
        (true, 3)
    );
    assert_eq!(
        settings(set(QueueUpdate::new().ordered_by_key(false)).await.unwrap()),
        (false, 0),
        "turning ordering off clears key_concurrency"
    );
    let err = set(QueueUpdate::new()
        .ordered_by_key(true)
        .key_concurrency(1001))
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with("key_concurrency"),
        "{}",
        err.message()
    );
    assert_eq!(
        settings(admin.get_queue("keys.o").await.unwrap()),
        (false, 0)
    );
    set(QueueUpdate::new().ordered_by_key(true).key_concurrency(1))
        .await
        .unwrap();

    let too_long = client
        .enqueue(Job::new("keys.o", "x").key("k".repeat(257)))
        .await
        .unwrap_err();
    assert_eq!(too_long.code(), Code::InvalidArgument);
    assert!(
        too_long.message().starts_with("key:"),
        "{}",
        too_long.message()
    );

    let first = client
        .enqueue(Job::new("keys.o", "k1").key("acct-7"))
        .await
        .unwrap();
    client
        .enqueue_batch([
            Job::new("keys.o", "k2").key("acct-7"),
            Job::new("keys.o", "free"),
        ])
        .await
        .unwrap();
    assert_eq!(
        admin.get_job(&first.job_id).await.unwrap().key,
        "acct-7",
        "JobInfo.key"
    );
    // The handler of k1 holds it until told; the others return at once.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (release, released) = watch::channel(false);
    let worker = Running::spawn(
        Worker::new(client.clone(), ["keys.o"]).concurrency(4),
        move |d| {
            let tx = tx.clone();
            let mut released = released.clone();
            async move {
                tx.send((payload(&d), d.key.clone())).unwrap();
                if payload(&d) == "k1" {
                    released.wait_for(|r| *r).await?;
                }
                Ok(())
            }
        },
    );
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(
            tokio::time::timeout(S10, rx.recv())
                .await
                .expect("two jobs handled")
                .unwrap(),
        );
    }
    got.sort();
    assert_eq!(
        got,
        [
            ("free".to_owned(), None),
            ("k1".to_owned(), Some("acct-7".to_owned()))
        ]
    );
    // k2 waits for k1, which its handler still holds (the worker has room
    // for three more).
    assert!(
        tokio::time::timeout(Duration::from_millis(600), rx.recv())
            .await
            .is_err(),
        "k2 was delivered while k1 was unsettled"
    );
    release.send(true).unwrap();
    let next = tokio::time::timeout(S10, rx.recv())
        .await
        .expect("k2 after k1's ack")
        .unwrap();
    assert_eq!(next, ("k2".to_owned(), Some("acct-7".to_owned())));
    worker.stop(S10).await.expect("clean stop");
    assert_eq!(db.live_jobs().await, 0);
    broker.stop().await;
}

/// Per-key limits, key overrides and fair shares through the crate:
/// `key_concurrency` without order, `fair_by_key`, `key_rate_limit` /
/// `key_rate_burst` and `key_overrides` (typed `KeyOverride`) round-trip,
/// a bad override is INVALID_ARGUMENT naming `key_overrides[i].field` and
/// changes nothing, an empty list clears them; then, in a fair queue, a
/// `Worker` gets key B's 3 jobs through key A's backlog of 300 enqueued
/// before them.
#[tokio::test]
async fn per_key_limits_overrides_and_fair_shares_through_the_rust_client() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let admin = client.admin();
    let q = "keys.f";
    let info = admin
        .update_queue(
            q,
            QueueUpdate::new()
                .create()
                .key_concurrency(2)
                .fair_by_key(true)
                .key_rate_limit(2.5)
                .key_overrides([
                    KeyOverride::new("vip").concurrency(5).weight(3),
                    KeyOverride::new("slow").rate_limit(0.5),
                ]),
        )
        .await
        .unwrap();
    let s = info.settings.unwrap();
    assert_eq!(
        (s.ordered_by_key, s.key_concurrency, s.fair_by_key),
        (false, 2, true),
        "key_concurrency without order"
    );
    assert_eq!((s.key_rate_limit, s.key_rate_burst), (2.5, 3), "ceil(2.5)");
    let by_key = |s: &pb::QueueSettings| {
        s.key_overrides
            .iter()
            .map(|o| (o.key.clone(), o.concurrency, o.rate_limit, o.weight))
            .collect::<Vec<_>>()
    };
    let overrides = vec![
        ("slow".to_owned(), 0, 0.5, 0),
        ("vip".to_owned(), 5, 0.0, 3),
    ];
    assert_eq!(by_key(&s), overrides, "in key order");
    let read = admin.get_queue(q).await.unwrap().settings.unwrap();
    assert_eq!(read, s, "GetQueue shows what UpdateQueue returned");

    for (u, field) in [
        (
            QueueUpdate::new().key_overrides([KeyOverride::new("x")]),
            "key_overrides[0].key",
        ),
        (
            QueueUpdate::new().key_overrides([
                KeyOverride::new("a").weight(1),
                KeyOverride::new("b").weight(101),
            ]),
            "key_overrides[1].weight",
        ),
        (QueueUpdate::new().key_rate_limit(-1.0), "key_rate_limit"),
        (
            QueueUpdate::new().key_rate_burst(2_000_000),
            "key_rate_burst",
        ),
    ] {
        let err = admin.update_queue(q, u).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(
            err.message().starts_with(&format!("{field}:")),
            "{field}: {}",
            err.message()
        );
    }
    let read = admin.get_queue(q).await.unwrap().settings.unwrap();
    assert_eq!(read, s, "a refused update changes nothing");

    let s = admin
        .update_queue(
            q,
            QueueUpdate::new()
                .clear_key_overrides()
                .key_rate_limit(0.0)
                .key_concurrency(0),
        )
        .await
        .unwrap()
        .settings
        .unwrap();
    assert_eq!(
        (
            s.key_overrides.len(),
            s.key_rate_limit,
            s.key_rate_burst,
            s.key_concurrency,
            s.fair_by_key
        ),
        (0, 0.0, 0, 0, true),
        "cleared; fair_by_key not given, so unchanged"
    );

    // Fair shares: A's 300, then B's 3; B's all come within A's first 30.
    for chunk in 0..3 {
        client
            .enqueue_batch((0..100).map(|i| Job::new(q, format!("a{}", chunk * 100 + i)).key("A")))
            .await
            .unwrap();
    }
    client
        .enqueue_batch((0..3).map(|i| Job::new(q, format!("b{i}")).key("B")))
        .await
        .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = Running::spawn(Worker::new(client.clone(), [q]).concurrency(4), move |d| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(d.key.clone().unwrap_or_default());
            Ok(())
        }
    });
    let (mut a_before, mut b_seen) = (0, 0);
    while b_seen < 3 {
        let key = tokio::time::timeout(S10, rx.recv())
            .await
            .expect("deliveries go on")
            .unwrap();
        match key.as_str() {
            "A" => a_before += 1,
            _ => b_seen += 1,
        }
    }
    assert!(a_before <= 30, "{a_before} of A's jobs before B's 3");
    worker.stop(S10).await.expect("clean stop");
    broker.stop().await;
}

// ---- the crate's examples --------------------------------------------------

/// The worker example's samples are settled for good: none left, two
/// dead-lettered.
const SAMPLES_SETTLED: &str = "select (select count(*) from leaseq.jobs \
     where queue in ('emails', 'reports')) = 0 and (select count(*) from leaseq.dead_jobs) = 2";

/// The worker example as users run it (`cargo run --example worker`: the
/// binary cargo built beside this test): its `main` connects, enqueues the
/// samples, works them, and on SIGTERM stops gracefully and exits 0.
#[tokio::test]
async fn the_worker_example_runs_as_a_program_and_stops_on_sigterm() {
    let bin = profile_dir().join("examples/worker");
    assert!(
        bin.exists(),
        "{} (built by cargo test --no-run)",
        bin.display()
    );
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let child = tokio::process::Command::new(&bin)
        .env("LEASEQ_ADDR", format!("http://{addr}"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    until(&db, SAMPLES_SETTLED, Duration::from_secs(30)).await;
    let pid = child.id().expect("running") as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("the example stops within its grace")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.lines().last() == Some("stopped"), "{stdout}");
    assert!(stdout.contains("attempt 2 \"busy\""), "{stdout}");
    broker.stop().await;
}

#[tokio::test]
async fn the_examples_run_against_a_broker() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();

    // producer: five enqueues, one of them a duplicate.
    let ids = examples::producer::produce(&client, "produced")
        .await
        .unwrap();
    assert_eq!(ids.len(), 5);
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        5,
        "the duplicate is not in the list"
    );
    assert_eq!(db.live_jobs().await, 5);
    let admin = client.admin();
    let traced = admin.get_job(&ids[4]).await.unwrap();
    assert!(traced.headers["traceparent"].starts_with("00-4bf92f35"));

    // worker: handlers per queue, outcomes, a timeout; runs until every
    // sample is settled for good.
    examples::worker::enqueue_samples(&client).await.unwrap();
    let worker = examples::worker::worker(client.clone());
    let stats = worker.stats();
    let db2 = TestDb {
        url: db.url.clone(),
        name: db.name.clone(),
        pool: db.pool.clone(),
    };
    worker
        .serve(async move {
            until(&db2, SAMPLES_SETTLED, Duration::from_secs(30)).await;
        })
        .await
        .unwrap();
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    // hello, busy (2nd attempt), slow (2nd attempt) acked; busy, bounce,
    // slow (timeout), broken twice nacked.
    assert_eq!((n(&stats.acked), n(&stats.nacked)), (3, 5));
    assert_eq!((n(&stats.timed_out), n(&stats.dead_lettered)), (1, 2));
    let dead: Vec<(String, String)> = sqlx::query_as(
        "select convert_from(payload, 'UTF8'), reason from leaseq.dead_jobs order by 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        dead,
        [
            ("bounce".to_owned(), "nacked".to_owned()),
            ("broken".to_owned(), "max_attempts".to_owned())
        ]
    );

    // admin: the tour of queue `emails` requeues its dead letter.
    let seen = examples::admin::tour(&client, "emails").await.unwrap();
    assert!(seen.contains(&"requeued 1".to_owned()), "{seen:?}");
    assert!(seen.contains(&"paused, available 1".to_owned()), "{seen:?}");
    broker.stop().await;
}

// ---------------------------------------------------------------------------
// Typed payloads, middleware and burst mode (issue 36, item 5).

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
struct Email {
    to: String,
    tries: u32,
}

const EMAILS: leaseq_client::Task<Email> = leaseq_client::Task::new("typed-emails");

#[tokio::test]
async fn a_task_declares_its_payload_type_once_for_producer_and_handler() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let sent = Email {
        to: "a@b.c".into(),
        tries: 3,
    };
    EMAILS.enqueue(&client, &sent).await.unwrap();
    // Not an Email: dead-lettered at once with the reason, not retried.
    client
        .enqueue(Job::new("typed-emails", r#"{"to": 5}"#))
        .await
        .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = Running::serve(Worker::builder(client.clone()).task(
        EMAILS,
        move |email: Email, job: Delivery| {
            let tx = tx.clone();
            async move {
                tx.send((email, job.headers.get("content-type").cloned()))
                    .unwrap();
                Ok::<(), anyhow::Error>(())
            }
        },
    ));
    let got = tokio::time::timeout(S10, rx.recv()).await.unwrap().unwrap();
    assert_eq!(got, (sent, Some("application/json".to_owned())));
    until(
        &db,
        "select count(*) = 1 from leaseq.dead_jobs where last_error like 'payload is not a valid %Email: invalid type%'",
        S10,
    )
    .await;
    worker.stop(S10).await.expect("clean stop");
    assert_eq!(db.live_jobs().await, 0);
    assert!(
        rx.try_recv().is_err(),
        "the bad payload never reached the handler"
    );
    broker.stop().await;
}

#[tokio::test]
async fn middleware_wraps_handlers_outermost_first_and_keeps_their_outcome() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    client.enqueue(Job::new("mw", "retry")).await.unwrap();
    client.enqueue(Job::new("mw", "ok")).await.unwrap();
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let (l1, l2) = (log.clone(), log.clone());
    let worker = Running::serve(
        Worker::builder(client.clone())
            .concurrency(1)
            .middleware(move |job: Delivery, next: leaseq_client::Next| {
                let log = l1.clone();
                async move {
                    let p = payload(&job);
                    log.lock().unwrap().push(format!("outer in {p}"));
                    let r = next.run(job).await;
                    let how = match &r {
                        Ok(_) => "ok".to_owned(),
                        Err(e) => format!("{} {:?} {}", e.kind(), e.retry_after(), e.message()),
                    };
                    log.lock().unwrap().push(format!("outer out {p}: {how}"));
                    r
                }
            })
            .middleware(move |job: Delivery, next: leaseq_client::Next| {
                let log = l2.clone();
                async move {
                    log.lock().unwrap().push(format!("inner {}", payload(&job)));
                    next.run(job).await
                }
            })
            .handle("mw", |job: Delivery| async move {
                if payload(&job) == "retry" && job.attempt == 1 {
                    return Err(anyhow::Error::new(
                        leaseq_client::Retry::after(Duration::from_secs(3600)).because("later"),
                    ));
                }
                Ok(())
            }),
    );
    // The retry kept its delay through both middlewares: its job waits an
    // hour (not the queue's backoff), and the other was acked.
    until(
        &db,
        "select count(*) = 1 from leaseq.jobs where run_at > now() + interval '50 minutes' and last_error = 'later'",
        S10,
    )
    .await;
    until(&db, "select count(*) = 1 from leaseq.jobs", S10).await;
    worker.stop(S10).await.expect("clean stop");
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            "outer in retry",
            "inner retry",
            "outer out retry: retry Some(3600s) later",
            "outer in ok",
            "inner ok",
            "outer out ok: ok",
        ]
    );
    broker.stop().await;
}

#[tokio::test]
async fn a_burst_worker_works_what_waits_then_returns() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let jobs = (0..300).map(|i| Job::new("burst", format!("b{i}")));
    client.enqueue_batch(jobs).await.unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    let worker = Worker::new(client.clone(), ["burst"])
        .concurrency(32)
        .burst(Duration::from_millis(300))
        .run(
            move |_job: Delivery| {
                let d = d.clone();
                async move {
                    d.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), anyhow::Error>(())
                }
            },
            std::future::pending(),
        );
    tokio::time::timeout(S10, worker)
        .await
        .expect("the burst worker returns by itself")
        .expect("clean end");
    assert_eq!(done.load(Ordering::SeqCst), 300);
    assert_eq!(
        db.live_jobs().await,
        0,
        "every job acked before it returned"
    );
    broker.stop().await;
}

#[tokio::test]
async fn a_consumer_stream_delivers_and_settles_and_releases_the_rest_on_drop() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let jobs = (0..50).map(|i| Job::new("own-loop", format!("c{i}")));
    client.enqueue_batch(jobs).await.unwrap();
    let mut consumer = client
        .consume(
            leaseq_client::ConsumeOptions::new(["own-loop"])
                .credit(64)
                .lease(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let settle = consumer.settler();
    let mut seen = HashSet::new();
    let mut kept = None;
    while seen.len() < 50 {
        let job = tokio::time::timeout(S10, consumer.next())
            .await
            .expect("50 deliveries")
            .expect("open")
            .expect("ok");
        assert!(seen.insert(job.id.clone()), "delivered twice");
        if payload(&job) == "c7" {
            kept = Some(job); // left unsettled
        } else if payload(&job) == "c8" {
            let dead = settle
                .nack(
                    &job,
                    "no",
                    &Nack {
                        retry_after: None,
                        dead_letter: true,
                    },
                )
                .await
                .unwrap();
            assert!(dead);
        } else {
            settle.ack(&job).await.unwrap();
        }
    }
    let kept = kept.expect("c7 came");
    settle
        .extend(&kept, Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(db.live_jobs().await, 1);
    assert_eq!(db.dead_jobs().await, 1);
    // Dropped: the broker releases c7 at once (no waiting out its lease).
    drop(consumer);
    until(
        &db,
        "select count(*) = 1 from leaseq.jobs where state = 'available'",
        S10,
    )
    .await;
    assert_eq!(
        settle.ack(&kept).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    broker.stop().await;
}

#[tokio::test]
async fn the_test_helper_runs_a_throwaway_broker_and_stops_what_it_started() {
    let broker = leaseq_client::testing::TestBroker::start_binary(env!("CARGO_BIN_EXE_leaseq"))
        .await
        .expect("a broker");
    let client = broker.client().await.unwrap();
    client.enqueue(Job::new("helper", "x")).await.unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    Worker::new(client, ["helper"])
        .burst(Duration::from_millis(200))
        .run(
            move |_job: Delivery| {
                let d = d.clone();
                async move {
                    d.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), anyhow::Error>(())
                }
            },
            std::future::pending(),
        )
        .await
        .unwrap();
    assert_eq!(done.load(Ordering::SeqCst), 1);
    let addr = broker.addr();
    broker.stop().await;
    // Gone: nothing listens there any more.
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[tokio::test]
async fn schedules_through_the_rust_admin_client() {
    use leaseq_client::{CatchUp, Overlap, ScheduleSpec, ScheduleUpdate};
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let admin = AdminClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let spec = ScheduleSpec::new(
        "every-second",
        "* * * * * *",
        Job::new("ticks", "tick").priority(3),
    )
    .time_zone("Europe/Paris")
    .overlap(Overlap::Skip)
    .catch_up(CatchUp::All(5));
    let s = admin.create_schedule(spec.clone()).await.unwrap();
    assert_eq!(
        (
            s.name.as_str(),
            s.queue.as_str(),
            s.priority,
            s.overlap,
            s.catch_up
        ),
        ("every-second", "ticks", 3, Overlap::Skip, CatchUp::All(5))
    );
    assert!(s.next_run_at.is_some());
    assert_eq!(
        admin.create_schedule(spec).await.unwrap_err().code(),
        Code::AlreadyExists
    );
    // A tick enqueues its job (overlap skip: one while it waits).
    until(
        &db,
        "select count(*) = 1 from leaseq.jobs where queue = 'ticks'",
        S10,
    )
    .await;
    let paused = admin.pause_schedule("every-second").await.unwrap();
    assert!(paused.paused);
    let run = admin.run_schedule("every-second").await.unwrap();
    assert!(!run.job_id.is_empty() && run.tick_at.is_some());
    let updated = admin
        .update_schedule(
            "every-second",
            ScheduleUpdate::new().cron("0 0 * * *").paused(false),
        )
        .await
        .unwrap();
    assert_eq!(
        (updated.cron.as_str(), updated.paused),
        ("0 0 * * *", false)
    );
    assert_eq!(admin.schedules().await.unwrap().len(), 1);
    let bad = admin
        .create_schedule(ScheduleSpec::new(
            "bad",
            "61 * * * *",
            Job::new("ticks", "x"),
        ))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().contains("cron"), "{}", bad.message());
    admin.delete_schedule("every-second").await.unwrap();
    assert_eq!(
        admin.get_schedule("every-second").await.unwrap_err().code(),
        Code::NotFound
    );
    broker.stop().await;
}

#[tokio::test]
async fn prefetch_holds_jobs_ahead_of_the_handlers_and_bounds_them_apart() {
    let db = TestDb::new().await;
    let addr = free_addr();
    let broker = TestBroker::on(&db).addr(addr).start().await;
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    // Refused before anything is opened: less prefetch than handlers.
    let bad = Worker::new(client.clone(), ["ahead"])
        .concurrency(4)
        .prefetch(2)
        .run(
            |_j: Delivery| async { Ok::<(), anyhow::Error>(()) },
            std::future::pending(),
        )
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().starts_with("prefetch:"), "{}", bad.message());

    client
        .enqueue_batch((0..20).map(|i| Job::new("ahead", format!("{i}"))))
        .await
        .unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (release_tx, release_rx) = watch::channel(false);
    let worker = {
        let (running, most) = (running.clone(), most.clone());
        Running::spawn(
            Worker::new(client.clone(), ["ahead"])
                .concurrency(2)
                .prefetch(8),
            move |_d| {
                let (running, most) = (running.clone(), most.clone());
                let mut release = release_rx.clone();
                async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let _ = release.wait_for(|r| *r).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                }
            },
        )
    };
    // Eight leased (the credit), two running (the concurrency).
    until(
        &db,
        "select count(*) = 8 from leaseq.jobs where state = 'leased'",
        S10,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(running.load(Ordering::SeqCst), 2);
    release_tx.send(true).unwrap();
    until(&db, "select count(*) = 0 from leaseq.jobs", S10).await;
    assert_eq!(most.load(Ordering::SeqCst), 2);
    worker.stop(S10).await.expect("clean stop");
    broker.stop().await;
}
