//! Fault injection, Jepsen style: each test runs producers and consumers
//! against real brokers (the binary as processes, or in-process where noted)
//! over one database, injects one kind of fault while they run, then drains
//! everything with a clean consumer and checks the recorded history with
//! the strict checker (tests/common/history.rs, itself checked by
//! `checker`): nothing lost, nothing acked twice, no two current leases of
//! one job, no valid settle refused and no stale one answered OK, nothing
//! delivered after its lease ended, every job settled soon after the
//! faults, no stream left without deliveries while jobs wait, and every
//! duplicate explained by an expiry, a Nack, or a stream closed; where the
//! load acks with follow-up jobs and a schedule ticks (kill -9, SIGTERM,
//! PostgreSQL crash), every follow-up exists iff its Ack committed, once,
//! and every tick has exactly one job. Each
//! prints one `FAULTS` line of figures. The faults of this file are the
//! processes' and the database's; the modules below add client deadlines
//! (`deadlines`), a frozen replica (`frozen`), the database's clock
//! (`pgclock`), a killed bucket move (`moves`), the broker's own timings
//! (`linger`), the network to PostgreSQL (`pgnet`: a proxy that stalls,
//! drops, resets and delays) and its durability settings (`durability`). docs/RELIABILITY.md has the commands, the long-run
//! variant (`LEASEQ_FAULT_SECONDS`) and the fault table.

pub mod checker;
pub mod deadlines;
mod durability;
pub mod frozen;
pub mod linger;
pub mod moves;
pub mod pg;
pub mod pgclock;
mod pgnet;

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::history::{History, Op, ts_us};
use crate::common::load::*;
use crate::common::*;
use leaseq::pb;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

/// The default consumers, half of them on Consume streams (settles on the
/// stream), half on Subscribe streams with unary settles.
fn mixed() -> Behaviour {
    Behaviour {
        protocol: Protocol::Mixed,
        ..Behaviour::default()
    }
}

async fn start_replicas(url: &str, n: usize, extra: &[&str], test: &str) -> Vec<Replica> {
    let logs = log_dir(test);
    let mut reps: Vec<Replica> = (0..n)
        .map(|i| Replica::new(i, url, extra, logs.clone()))
        .collect();
    for r in &mut reps {
        r.start().await;
    }
    reps
}

/// 1. kill -9 of one of three replicas every ~2 s under load, restarted at
///    once on the same address. The dead broker's leases expire (2 s) and
///    its jobs come back; nothing else may. (Keys under kill -9:
///    keys::order_survives_a_broker_killed_holding_the_head; an ordered
///    queue here would hand off nothing, and this test is the one that
///    checks hand-off across replicas under kill -9.) A fifth of the Acks
///    carry follow-up jobs, and a schedule ticks every second into the
///    queue: the checker holds both through the kills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_replicas_under_load() {
    let db = TestDb::new().await;
    let mut reps = start_replicas(&db.url, 3, &[], "kill9").await;
    let addrs: Vec<SocketAddr> = reps.iter().map(|r| r.addr).collect();
    let h = History::new();
    const CONSUMERS: usize = 6;
    // A fifth of the Acks carry follow-ups; a schedule ticks every second
    // into the queue.
    let behaviour = Behaviour {
        follow_ups: 0.2,
        ..mixed()
    };
    let ticker = Ticker::start(&h, addrs[0], "faults-k9", "k9").await;
    let mut load = Load::start(&h, &addrs, "k9", CONSUMERS, behaviour, 150);
    load.watch(&db.pool);
    wait_acked(&h, 20, Duration::from_secs(20)).await;

    let until = Instant::now() + fault_seconds();
    let mut victim = 0;
    while Instant::now() < until {
        sleep(Duration::from_millis(1500)).await;
        let f = h.fault("kill -9", Some(victim));
        reps[victim].signal(libc::SIGKILL);
        let exit = reps[victim].wait(Duration::from_secs(5)).await;
        assert!(!exit.success(), "killed: {exit:?}");
        reps[victim].start().await;
        h.healed(f);
        h.wait_recovered(Some(victim), h.now(), Duration::from_secs(15))
            .await;
        victim = (victim + 1) % reps.len();
    }
    ticker.stop(&h, addrs[1], &db.pool).await;
    let report = load.finish("kill-9", &db.pool, addrs[0], "k9").await;
    assert!(report.faults >= 1);
    assert_follow_ups_and_ticks(&report);
    assert!(report.consume_acks > 0, "no job acked on a Consume stream");
    assert!(report.handed_across > 0, "no job handed across replicas");
    // A kill costs at most an attempt per job: nothing reaches max_attempts.
    assert_eq!(report.dead, 0, "jobs dead-lettered by kills");
    // Each consumer acks one job at a time, so a kill leaves at most one Ack
    // per consumer committed without its answer.
    assert!(
        report.acked_unanswered <= report.faults * CONSUMERS,
        "{} Acks committed unanswered in {} kills of {CONSUMERS} consumers",
        report.acked_unanswered,
        report.faults
    );
    // The replicas that were not killed kept their streams.
    let failed = h.unexplained_stream_failures();
    assert!(
        failed.is_empty(),
        "streams failed on live replicas: {failed:#?}"
    );
    // Replicas restarted after a kill (they recovered the dead ones' jobs)
    // still drain cleanly.
    for r in &mut reps {
        r.signal(libc::SIGTERM);
        let exit = r.wait(Duration::from_secs(10)).await;
        assert!(
            exit.success(),
            "replica {} after SIGTERM: {exit:?}",
            r.index
        );
    }
}

/// The follow-ups and the schedule of a run had something to check: Acks
/// carried follow-ups and some of them exist (the checker found each once,
/// under its answered id, and none of an Ack that did not commit); the
/// schedule ticked through the faults (none missed nor doubled).
fn assert_follow_ups_and_ticks(report: &crate::common::history::Report) {
    assert!(
        report.follow_ups_applied > 0,
        "no follow-up job was enqueued by an Ack: {} carried",
        report.follow_ups
    );
    // One tick a second, and the fault phase alone lasts that long (less
    // the seconds of the first tick and the last one due, each rounded).
    assert!(
        report.ticks as u64 + 2 >= fault_seconds().as_secs(),
        "{} schedule ticks in {:?} of faults",
        report.ticks,
        fault_seconds()
    );
}

/// 2. SIGTERM of one of two replicas every ~2 s under load: it drains
///    within its grace (5 s), exits 0, ends its streams with UNAVAILABLE
///    after releasing their jobs; it is restarted on the same address. The
///    queue is ordered by key, two of a key at a time, and half the jobs
///    have one of 8 keys: a job the drain released keeps its place. Acks
///    with follow-ups and a schedule every second, as in the kill -9 test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_under_load() {
    let db = TestDb::new().await;
    let mut reps = start_replicas(&db.url, 2, &[], "sigterm").await;
    let addrs: Vec<SocketAddr> = reps.iter().map(|r| r.addr).collect();
    let h = History::new();
    // Ordered and fair: leased by the key walk (lease_keys.sql).
    let keys = KeySettings {
        ordered: true,
        key_concurrency: 2,
        fair: true,
    };
    set_keys(&h, addrs[0], "term", keys).await;
    let behaviour = Behaviour {
        follow_ups: 0.2,
        ..mixed()
    };
    let ticker = Ticker::start(&h, addrs[0], "faults-term", "term").await;
    let mut load = Load::start_keyed(&h, &addrs, "term", 4, behaviour, (150, 8));
    load.watch(&db.pool);
    wait_acked(&h, 20, Duration::from_secs(20)).await;

    let until = Instant::now() + fault_seconds();
    let mut victim = 0;
    let mut streams_ended = 0;
    while Instant::now() < until {
        sleep(Duration::from_millis(1500)).await;
        let f = h.fault("SIGTERM", Some(victim));
        h.drain(victim);
        let at = h.now();
        let sent = Instant::now();
        reps[victim].signal(libc::SIGTERM);
        let exit = reps[victim].wait(Duration::from_secs(10)).await;
        let took = sent.elapsed();
        assert!(exit.success(), "exit after SIGTERM: {exit:?}");
        assert!(
            took < Duration::from_millis(6500),
            "exited {took:?} after SIGTERM; the grace is 5 s"
        );
        // Every stream open on it when SIGTERM was sent ends, UNAVAILABLE.
        let deadline = Instant::now() + Duration::from_secs(5);
        let ends = loop {
            let ends = h.ends_of_streams_open_at(victim, at);
            if ends.iter().all(Option::is_some) || Instant::now() > deadline {
                break ends;
            }
            sleep(Duration::from_millis(20)).await;
        };
        assert!(
            ends.iter().all(|e| *e == Some(Code::Unavailable)),
            "stream ends after SIGTERM: {ends:?}"
        );
        streams_ended += ends.len();
        reps[victim].start().await;
        h.healed(f);
        h.wait_recovered(Some(victim), h.now(), Duration::from_secs(15))
            .await;
        victim = (victim + 1) % reps.len();
    }
    assert!(streams_ended > 0, "no stream was open on a drained broker");
    ticker.stop(&h, addrs[1], &db.pool).await;
    let report = load.finish("sigterm", &db.pool, addrs[0], "term").await;
    assert_follow_ups_and_ticks(&report);
    assert!(report.consume_acks > 0, "no job acked on a Consume stream");
    // No hand-off: an ordered queue is leased only by lease rounds under
    // its queue's lock (docs/design/keys.md); kill -9's test checks
    // hand-off across replicas.
    // Keyed jobs were checked; some waited behind their key, and some key
    // had its two at once.
    assert!(
        report.keyed > 0 && report.key_behind > 0 && report.key_peak == 2,
        "keys not exercised: {} keyed deliveries, {} behind their key, peak {}",
        report.keyed,
        report.key_behind,
        report.key_peak
    );
    // UNAVAILABLE, except that a call racing the connection's close at the
    // end of the drain fails in the client as CANCELLED, or rarely INTERNAL
    // (an HTTP/2 reset: the broker logs no error for it). Both are unknown
    // outcomes to the client, and the history treats them so.
    let other: Vec<_> = report
        .errors_not_unavailable()
        .into_iter()
        .filter(|(k, _)| !k.ends_with(" Cancelled") && !k.ends_with(" Internal"))
        .collect();
    assert!(
        other.is_empty(),
        "a draining or stopped broker must answer UNAVAILABLE: {:?}",
        report.errors
    );
}

/// Polls the overall health of `addrs` every 50 ms; keeps what it saw.
fn health_monitor(
    addrs: Vec<SocketAddr>,
    history: History,
    stop: CancellationToken,
) -> JoinHandle<Vec<(Duration, usize, Option<ServingStatus>)>> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while !stop.is_cancelled() {
            for (i, a) in addrs.iter().enumerate() {
                seen.push((history.now(), i, health(*a, "").await));
            }
            sleep(Duration::from_millis(50)).await;
        }
        seen
    })
}

/// 3. PostgreSQL stopped with `pg_ctl stop -m immediate` under load (a
///    private cluster), down for ~2 s, started again with `pg_ctl start`.
///    While it is down clients see only UNAVAILABLE and health is
///    NOT_SERVING; the brokers recover by themselves. Acks with follow-ups
///    and a schedule every second, as in the kill -9 test; the brokers'
///    `--schedule-grace` is 1 s, so the ticks due while PostgreSQL is down
///    fire by the catch-up policy (`all`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crash_and_restart_under_load() {
    let pg = pg::PrivatePg::start().await;
    let logs = log_dir("pgcrash");
    let mut reps = Vec::new();
    for i in 0..2 {
        // Health transitions are logged at info. A tick more than a second
        // late is missed, and fires by the catch-up policy (`all`): the
        // ticks due while PostgreSQL is down take that path.
        let mut r = Replica::new(i, &pg.url, &["--schedule-grace", "1s"], logs.clone())
            .env("RUST_LOG", "warn,leaseq_server::server=info");
        r.start().await;
        reps.push(r);
    }
    let addrs: Vec<SocketAddr> = reps.iter().map(|r| r.addr).collect();
    let pool = admin_pool(&pg.url).await;
    let h = History::new();
    let stop_health = CancellationToken::new();
    let monitor = health_monitor(addrs.clone(), h.clone(), stop_health.clone());
    // Per-key concurrency without order, fair: the key walk's buckets and
    // cursor through PostgreSQL's crash.
    let keys = KeySettings {
        ordered: false,
        key_concurrency: 2,
        fair: true,
    };
    set_keys(&h, addrs[0], "pg", keys).await;
    let behaviour = Behaviour {
        follow_ups: 0.2,
        ..Behaviour::default()
    };
    let ticker = Ticker::start(&h, addrs[0], "faults-pg", "pg").await;
    let mut load = Load::start_keyed(&h, &addrs, "pg", 4, behaviour, (100, 8));
    load.watch(&pool);
    wait_acked(&h, 20, Duration::from_secs(20)).await;

    let until = Instant::now() + fault_seconds();
    let mut outages = Vec::new();
    let mut serving_again = Vec::new();
    while Instant::now() < until {
        sleep(Duration::from_millis(1500)).await;
        let f = h.fault("postgres stop -m immediate", None);
        let down = h.now();
        pg.stop_immediate();
        for (i, a) in addrs.iter().enumerate() {
            // Like wait_health, but says what it saw when it fails.
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut seen = Vec::new();
            loop {
                let h = health(*a, "").await;
                if h == Some(ServingStatus::NotServing) {
                    break;
                }
                if seen.last() != Some(&h) {
                    seen.push(h);
                }
                assert!(
                    Instant::now() < deadline,
                    "broker {i} ({a}) not NOT_SERVING 10 s after `pg_ctl stop -m immediate` \
                     (outage {}); health seen: {seen:?}; pg_ctl status: {}",
                    outages.len() + 1,
                    pg.status()
                );
                sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(
                health(*a, "liveness").await,
                Some(ServingStatus::Serving),
                "liveness stays SERVING while Postgres is down"
            );
        }
        sleep(Duration::from_secs(2)).await;
        let up = h.now();
        outages.push((down, up));
        let started = Instant::now();
        pg.start_again();
        h.healed(f);
        for a in &addrs {
            wait_health(*a, "", ServingStatus::Serving, Duration::from_secs(30)).await;
        }
        serving_again.push(started.elapsed().as_secs_f64());
        h.wait_recovered(None, up, Duration::from_secs(15)).await;
    }
    // The pool's connections died with the server: it reconnects.
    ticker.stop(&h, addrs[1], &pool).await;
    let report = load.finish("postgres-crash", &pool, addrs[0], "pg").await;
    stop_health.cancel();
    assert_follow_ups_and_ticks(&report);
    // The ticks due while PostgreSQL was down (2 s) fired after it came
    // back, past the grace (1 s): by the catch-up policy.
    assert!(
        report.tick_late_max_s > 1.0,
        "no tick fired by the catch-up: the latest was {:.2}s after its tick",
        report.tick_late_max_s
    );
    // Keyed jobs were checked against the per-key limit, and some key had
    // its two at once.
    assert!(
        report.keyed > 0 && report.key_peak == 2,
        "keys not exercised: {} keyed deliveries, peak {}",
        report.keyed,
        report.key_peak
    );
    let seen = monitor.await.expect("health monitor");

    for (down, up) in &outages {
        let errors = h.errors_between(*down, *up);
        let wrong: Vec<_> = errors.iter().filter(|e| e.1 != Code::Unavailable).collect();
        assert!(
            wrong.is_empty(),
            "while Postgres was down clients saw {wrong:?} (all errors: {errors:?})"
        );
        for i in 0..addrs.len() {
            let during: Vec<_> = seen
                .iter()
                .filter(|s| s.1 == i && s.0 > *down && s.0 < *up)
                .map(|s| s.2)
                .collect();
            assert!(
                during.contains(&Some(ServingStatus::NotServing)),
                "broker {i} health while Postgres was down: {during:?}"
            );
        }
    }
    eprintln!(
        "FAULTS postgres-crash: outages={} serving_again_s={serving_again:?} errors_while_down={}",
        outages.len(),
        outages
            .iter()
            .map(|(d, u)| h.errors_between(*d, *u).len())
            .sum::<usize>()
    );
    assert!(report.faults >= 1);
    drop(reps);
}

/// A pool that is not named `leaseq`, so that terminating the brokers'
/// backends (application_name `leaseq`) spares it.
async fn admin_pool(url: &str) -> PgPool {
    let opts = sqlx::postgres::PgConnectOptions::from_str(url)
        .expect("url")
        .application_name("leaseq-faults");
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(opts)
        .await
        .expect("admin pool")
}

/// Terminates the brokers' backends of this database: the LISTEN ones
/// (their last statement was LISTEN) or the pool ones. Returns how many.
async fn terminate(admin: &PgPool, listen: bool) -> i64 {
    sqlx::query_scalar(
        "select count(*) filter (where pg_terminate_backend(pid))
         from pg_stat_activity
         where datname = current_database()
           and application_name = 'leaseq'
           and pid <> pg_backend_pid()
           and (query ilike 'listen%') = $1",
    )
    .bind(listen)
    .fetch_one(admin)
    .await
    .expect("pg_terminate_backend")
}

/// 4. pg_terminate_backend of the brokers' LISTEN connections, then of
///    their pool connections, every ~2 s under load. A job enqueued through
///    broker 1 right after the LISTEN connections died reaches a stream on
///    broker 0 within the fallback poll interval (2 s here) at worst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backends_under_load() {
    const POLL: Duration = Duration::from_secs(2);
    let db = TestDb::new().await;
    let reps = start_replicas(&db.url, 2, &["--poll-interval", "2s"], "terminate").await;
    let addrs: Vec<SocketAddr> = reps.iter().map(|r| r.addr).collect();
    // The harness's pool is named `leaseq` too: use one that is not.
    db.pool.close().await;
    let admin = admin_pool(&db.url).await;
    let h = History::new();
    let mut load = Load::start(&h, &addrs, "term4", 4, Behaviour::default(), 150);
    load.watch(&admin);
    wait_acked(&h, 20, Duration::from_secs(20)).await;

    // A probe stream on broker 0 and a producer on broker 1, on a queue of
    // their own.
    let mut probe_client = connect(addrs[0]).await;
    let mut probe = subscribe(&mut probe_client, &["probe"], 1, None).await;
    let mut producer = connect(addrs[1]).await;

    let until = Instant::now() + fault_seconds();
    let mut latencies = Vec::new();
    let mut killed = (0, 0);
    while Instant::now() < until {
        sleep(Duration::from_millis(1000)).await;
        let f = h.fault("terminate LISTEN", None);
        let n = terminate(&admin, true).await;
        killed.0 += n;
        let sent = Instant::now();
        let id = loop {
            match producer.enqueue(job("probe", "probe")).await {
                Ok(r) => break r.into_inner().job_id,
                Err(s) => {
                    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                    sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let d = next_delivery(&mut probe, POLL + Duration::from_secs(3)).await;
        let latency = sent.elapsed();
        assert_eq!(d.job.as_ref().unwrap().id, id);
        crate::common::ack(&mut probe_client, &d)
            .await
            .expect("probe ack");
        latencies.push(latency.as_secs_f64());
        h.healed(f);

        sleep(Duration::from_millis(1000)).await;
        h.fault("terminate pool", None);
        killed.1 += terminate(&admin, false).await;
    }
    assert!(killed.0 >= 2, "no LISTEN backend was terminated");
    assert!(killed.1 >= 1, "no pool backend was terminated");
    let worst = latencies.iter().copied().fold(0.0, f64::max);
    latencies.sort_by(f64::total_cmp);
    eprintln!(
        "FAULTS terminate-backend: listen_killed={} pool_killed={} probes={} \
         probe_latency_median_s={:.2} probe_latency_max_s={worst:.2}",
        killed.0,
        killed.1,
        latencies.len(),
        latencies[latencies.len() / 2]
    );
    assert!(
        worst <= POLL.as_secs_f64() + 1.5,
        "a wake-up took {worst:.2}s after the LISTEN connection died; fallback poll is {POLL:?}"
    );
    drop(probe);
    let report = load
        .finish("terminate-backend", &admin, addrs[0], "term4")
        .await;
    assert!(
        report.errors_not_unavailable().is_empty(),
        "a terminated backend must look like an outage (UNAVAILABLE): {:?}",
        report.errors
    );
    drop(reps);
}

/// 5. A consumer paused (SIGSTOP) past its lease: the job goes to another
///    consumer, and the paused one's late ExtendLease and Ack, once it
///    runs again (SIGCONT), are refused with FAILED_PRECONDITION.
///
/// Twice: with the real `leaseq work` process as the paused consumer
/// (its refusals read from its log), and with a client in this process
/// that holds a delivery without extending it (the codes asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_consumer_is_fenced() {
    let db = TestDb::new().await;
    let mut reps = start_replicas(&db.url, 1, &[], "sigstop").await;
    let addr = reps[0].addr;
    let h = History::new();
    let mut client = connect(addr).await;

    // --- the real `leaseq work` process, SIGSTOPped while it holds a job.
    let id = client
        .enqueue(job("stop", "held-by-worker"))
        .await
        .expect("enqueue")
        .into_inner()
        .job_id;
    let dir = log_dir("sigstop");
    let marker = dir.join(format!("held-{}", uuid::Uuid::new_v4().simple()));
    let worker_log = dir.join("worker.log");
    let script = format!(
        "echo \"$LEASEQ_JOB_ID\" > {m}.tmp && mv {m}.tmp {m} && sleep 1",
        m = marker.display()
    );
    let mut worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
        .args([
            "work",
            "--addr",
            &format!("http://{addr}"),
            "--queue",
            "stop",
        ])
        .args([
            "--lease",
            "2s",
            "--grace",
            "5s",
            "--consumer",
            "faults-worker",
        ])
        .args(["--", "sh", "-c", &script])
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&worker_log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn leaseq work");
    let pid = worker.id().expect("worker pid") as i32;
    let deadline = Instant::now() + Duration::from_secs(15);
    while !marker.exists() {
        assert!(
            Instant::now() < deadline,
            "leaseq work never ran its command"
        );
        sleep(Duration::from_millis(20)).await;
    }
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let f = h.fault("SIGSTOP consumer", None);
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), id);
    let first_token = lease_of(&db.pool, &id)
        .await
        .expect("leased by the worker")
        .0;
    // Another consumer is ready; once the worker's 2 s lease has run out the
    // job is leased again, to this stream or (its credit came back with the
    // expiry) to the stopped worker's.
    let mut stream = subscribe(&mut client, &["stop"], 1, Some(Duration::from_secs(30))).await;
    let sid = h.stream_opened(0);
    let deadline = Instant::now() + Duration::from_secs(15);
    let holder = loop {
        match lease_of(&db.pool, &id).await {
            Some((token, by)) if !token.is_empty() && token != first_token => break by,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "the stopped worker's lease never expired"
        );
        sleep(Duration::from_millis(20)).await;
    };
    if holder == "test" {
        // (When the worker's own stream got it back, its Ack is not in
        // this history: the job is only checked to be gone below.)
        h.enqueue_ok("held-by-worker", &id);
        let d = next_delivery(&mut stream, Duration::from_secs(10)).await;
        let rec = h.delivered(sid, 0, Duration::from_secs(30), &d);
        assert_eq!(rec.id, id);
        assert_eq!(rec.attempt, 2, "the paused worker's lease was attempt 1");
        let sent = h.sent(Op::Ack, &rec, 0);
        let r = crate::common::ack(&mut client, &d).await;
        h.answered(sent, &r);
        r.expect("the new holder acks");
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    h.healed(f);
    // It resumes, finds its command done, acks: refused. Then stop it.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let log = std::fs::read_to_string(&worker_log).unwrap_or_default();
        if log.contains("lease lost before settling") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the resumed worker's Ack was not refused; its log:\n{log}"
        );
        sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_file(&marker);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let exit = timeout(Duration::from_secs(10), worker.wait())
        .await
        .expect("worker exits")
        .expect("wait");
    assert!(exit.success(), "leaseq work after SIGTERM: {exit:?}");
    let log = std::fs::read_to_string(&worker_log).unwrap();
    // Settled exactly once: by this test's Ack, or by the worker's Ack of
    // its second lease.
    assert_eq!(
        lease_of(&db.pool, &id).await,
        None,
        "job still live:\n{log}"
    );
    assert_eq!(db.dead_jobs().await, 0);
    eprintln!("FAULTS sigstop: second lease held by {holder:?}");
    drop(stream);

    // --- a client in this process that stops extending past its lease.
    let id = client
        .enqueue(job("stop2", "held-by-client"))
        .await
        .expect("enqueue")
        .into_inner()
        .job_id;
    h.enqueue_ok("held-by-client", &id);
    let lease = Duration::from_secs(1);
    let mut paused = subscribe(&mut client, &["stop2"], 1, Some(lease)).await;
    let sid = h.stream_opened(0);
    let d1 = next_delivery(&mut paused, Duration::from_secs(5)).await;
    let first = h.delivered(sid, 0, lease, &d1);
    let mut c2 = connect(addr).await;
    let mut other = subscribe(&mut c2, &["stop2"], 1, Some(Duration::from_secs(30))).await;
    let sid2 = h.stream_opened(0);
    // After the 1 s lease the job is leased again, to either stream.
    let second = tokio::select! {
        d = next_delivery(&mut paused, Duration::from_secs(10)) => h.delivered(sid, 0, lease, &d),
        d = next_delivery(&mut other, Duration::from_secs(10)) => {
            h.delivered(sid2, 0, Duration::from_secs(30), &d)
        }
    };
    assert_eq!(second.id, first.id);
    assert_ne!(second.token, first.token);
    let sent = h.sent(Op::Extend, &first, 0);
    let late_extend = client
        .extend_lease(pb::ExtendLeaseRequest {
            job_id: first.id.clone(),
            lease_token: first.token.clone(),
            lease: Some(dur(Duration::from_secs(30))),
        })
        .await
        .map(|r| ts_us(&r.into_inner().lease_expires_at.expect("lease_expires_at")));
    h.extended(sent, &late_extend);
    let late_extend = late_extend.expect_err("a late ExtendLease is refused");
    assert_eq!(
        late_extend.code(),
        Code::FailedPrecondition,
        "{late_extend:?}"
    );
    let sent = h.sent(Op::Ack, &first, 0);
    let late_ack = load::ack(&mut client, &first.id, &first.token).await;
    h.answered(sent, &late_ack);
    assert_eq!(
        late_ack.expect_err("a late Ack is refused").code(),
        Code::FailedPrecondition
    );
    let sent = h.sent(Op::Ack, &second, 0);
    let r = load::ack(&mut client, &second.id, &second.token).await;
    h.answered(sent, &r);
    r.expect("the new holder acks");
    drop((paused, other));

    let (dead, live) = final_ids(&db.pool).await;
    let report = h.check(&dead, &live);
    eprintln!("{}", report.figures("sigstop", Duration::ZERO));
    report.assert_ok();
    assert!(live.is_empty() && dead.is_empty(), "{live:?} {dead:?}");
    reps[0].signal(libc::SIGTERM);
    reps[0].wait(Duration::from_secs(10)).await;
}

/// (lease_token, leased_by) of a leased job; None once it is gone.
async fn lease_of(pool: &PgPool, id: &str) -> Option<(String, String)> {
    let row: Option<(Option<String>, Option<String>)> =
        sqlx::query_as("select lease_token::text, leased_by from leaseq.jobs where id = $1::uuid")
            .bind(id)
            .fetch_optional(pool)
            .await
            .expect("lease_of");
    row.map(|(t, b)| (t.unwrap_or_default(), b.unwrap_or_default()))
}

/// 6. Many consumers (16, credit 4) racing on one queue through two
///    in-process brokers, a tenth of deliveries cut mid-lease by the client
///    dropping its stream (the broker releases the job at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_streams_and_racing_consumers() {
    let db = TestDb::new().await;
    let b0 = TestBroker::start(&db).await;
    let b1 = TestBroker::start(&db).await;
    let addrs = [b0.addr, b1.addr];
    let h = History::new();
    let behaviour = Behaviour {
        cut: 0.1,
        credit: 4,
        ..mixed()
    };
    let mut load = Load::start(&h, &addrs, "race", 16, behaviour, 200);
    load.watch(&db.pool);
    wait_acked(&h, 20, Duration::from_secs(20)).await;
    sleep(fault_seconds()).await;
    let report = load.finish("cut-streams", &db.pool, addrs[0], "race").await;
    assert!(report.dup_closed > 0, "no cut stream's job came back");
    assert!(report.consume_acks > 0, "no job acked on a Consume stream");
    assert!(
        report.errors.is_empty(),
        "client cuts are no errors, yet clients saw: {:?}",
        report.errors
    );
    b0.stop().await;
    b1.stop().await;
}

/// libfaketime: `$LEASEQ_LIBFAKETIME`, else where Debian's faketime package
/// (multiarch directories) or Fedora's libfaketime (lib64) put it.
fn libfaketime() -> std::path::PathBuf {
    let mut candidates: Vec<std::path::PathBuf> = std::env::var_os("LEASEQ_LIBFAKETIME")
        .filter(|v| !v.is_empty())
        .map(Into::into)
        .into_iter()
        .collect();
    candidates.extend(
        std::fs::read_dir("/usr/lib")
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path().join("faketime/libfaketime.so.1")),
    );
    candidates.push("/usr/lib/faketime/libfaketime.so.1".into());
    candidates.push("/usr/lib64/faketime/libfaketime.so.1".into());
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "libfaketime not found (set LEASEQ_LIBFAKETIME, or apt-get install faketime; \
                 ./test.sh installs it)"
            )
        })
}

/// The first RFC 3339 timestamp in a broker's log, in seconds since the epoch.
fn first_log_time(text: &str) -> Option<i64> {
    // Without the colour codes (ESC [ ... m) around the timestamp.
    let mut plain = String::with_capacity(text.len());
    let mut in_escape = false;
    for c in text.chars() {
        match (in_escape, c) {
            (false, '\u{1b}') => in_escape = true,
            (false, c) => plain.push(c),
            (true, 'm') => in_escape = false,
            (true, _) => {}
        }
    }
    plain
        .split_whitespace()
        .find_map(|w| chrono::DateTime::parse_from_rfc3339(w).ok())
        .map(|t| t.timestamp())
}

/// 7. Two brokers whose clocks are wrong by +1 h and -1 h (libfaketime),
///    under load with stalled consumers: leases still last what was asked,
///    in database time, and expire neither early nor late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_broker_clocks() {
    let db = TestDb::new().await;
    let lib = libfaketime();
    let logs = log_dir("skew");
    let mut reps = Vec::new();
    for (i, skew) in ["+1h", "-1h"].into_iter().enumerate() {
        let mut r = Replica::new(i, &db.url, &[], logs.clone())
            .env("LD_PRELOAD", lib.to_str().unwrap())
            .env("FAKETIME", skew)
            // Tokio's timers stay on the true monotonic clock: the skew is
            // of the wall clock, as with a bad NTP setup.
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env("RUST_LOG", "info");
        r.start().await;
        reps.push(r);
    }
    // The fault is real: each broker's log is stamped with its skewed clock.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for (i, skew) in [3600i64, -3600].into_iter().enumerate() {
        let text = std::fs::read_to_string(logs.join(format!("broker{i}-1.log"))).unwrap();
        let t = first_log_time(&text)
            .unwrap_or_else(|| panic!("no timestamp in broker {i}'s log:\n{text}"));
        assert!(
            (t - now - skew).abs() < 300,
            "broker {i} logs at {t}, now is {now}: skew {skew} not applied\n{text}"
        );
    }
    let addrs: Vec<SocketAddr> = reps.iter().map(|r| r.addr).collect();
    let h = History::new();
    let wall_start = SystemTime::now();
    for i in 0..reps.len() {
        h.fault("clock skew", Some(i));
    }
    let behaviour = Behaviour {
        stall: 0.05,
        ..Behaviour::default()
    };
    let mut load = Load::start(&h, &addrs, "skew", 4, behaviour, 100);
    load.watch(&db.pool);
    wait_acked(&h, 20, Duration::from_secs(20)).await;
    sleep(fault_seconds()).await;
    let report = load.finish("clock-skew", &db.pool, addrs[0], "skew").await;
    assert!(report.dup_expiry > 0, "no stalled job came back by expiry");
    assert!(
        report.errors.is_empty(),
        "no fault but the clocks, yet clients saw errors: {:?}",
        report.errors
    );

    // Each lease ran for what was asked, by the database's (true) clock.
    let start_us = wall_start.duration_since(UNIX_EPOCH).unwrap().as_micros() as i64;
    let mut worst = 0i64;
    for d in h.deliveries() {
        let received_us = start_us + d.t.as_micros() as i64;
        let lease_us = if d.broker == usize::MAX {
            30_000_000
        } else {
            2_000_000
        };
        let off = d.expires_us - received_us - lease_us;
        worst = worst.max(off.abs());
    }
    eprintln!(
        "FAULTS clock-skew: worst lease end vs receive time + lease: {:.2}s",
        worst as f64 / 1e6
    );
    // Seconds of scheduling delay on a busy machine are fine; an hour, or
    // a lease that already ended or lasts far longer, is not.
    assert!(
        worst < 10_000_000,
        "a lease's end was {:.1}s off receive time + lease",
        worst as f64 / 1e6
    );
    for mut r in reps {
        r.signal(libc::SIGTERM);
        r.wait(Duration::from_secs(10)).await;
    }
}
