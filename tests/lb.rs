//! leaseq behind a real L7 load balancer. HAProxy (Debian's `haproxy`) runs
//! the shipped `deploy/haproxy.cfg`, unchanged (addresses and timings come
//! from the environment variables it documents), in front of two real
//! `leaseq` binaries on one database. Producers and consumers talk only to the
//! balancer. One replica is killed with SIGKILL, or drained with SIGTERM, or
//! loses PostgreSQL; the balancer takes it out of rotation (read back from
//! HAProxy's admin socket), consumers re-subscribe, and jobs keep flowing;
//! the consumers and the checker of their history are the fault suite's
//! (tests/common/load.rs and history.rs: nothing lost, nothing acked twice,
//! no overlapping leases). Two more tests show why the balancer's stream
//! timeout must exceed the heartbeat interval, and how `--max-connection-age`
//! moves streams to a replica added later.
//!
//! Without the haproxy binary these tests fail (they do not skip): `./test.sh`
//! installs it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common::history::History;
use crate::common::load::{Behaviour, BrokerIds, Load, Protocol, producer, wait_acked};
use crate::common::*;
use leaseq::pb;
use leaseq::pb::subscribe_response::Kind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

const QUEUE: &str = "lb";
/// Consumers' lease: jobs held by a killed replica come back after this.
const LEASE: Duration = Duration::from_secs(2);

/// The haproxy binary; panics (never skips) when it is not installed.
fn haproxy_bin() -> PathBuf {
    let candidates = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into()]);
    for dir in candidates {
        let bin = dir.join("haproxy");
        if bin.is_file() {
            return bin;
        }
    }
    panic!(
        "haproxy not found on PATH or in /usr/sbin: these tests need a real load balancer \
         (apt-get install haproxy; ./test.sh installs it)"
    );
}

/// State of one HAProxy server, from `show stat`.
#[derive(Clone, Debug, Default)]
struct ServerStat {
    /// UP, DOWN, "UP 1/2" (going down), "DOWN 1/2" (coming up), MAINT...
    status: String,
    /// Last check result: L7OK, L4CON (refused), L7RSP (answered, not SERVING)...
    check_status: String,
    /// Requests (streams) open on it now.
    current: u64,
}

/// HAProxy running `deploy/haproxy.cfg` on a free loopback port.
struct Balancer {
    addr: SocketAddr,
    dir: PathBuf,
    socket: PathBuf,
    child: tokio::process::Child,
}

impl Balancer {
    /// Starts HAProxy in front of `servers` (the config's leaseq-1 and
    /// leaseq-2) and waits until both are UP.
    async fn start(servers: [SocketAddr; 2], stream_timeout: &str) -> Balancer {
        Self::start_expecting(servers, stream_timeout, &["leaseq-1", "leaseq-2"]).await
    }

    /// Starts HAProxy and waits until the servers named in `up` are UP.
    async fn start_expecting(
        servers: [SocketAddr; 2],
        stream_timeout: &str,
        up: &[&str],
    ) -> Balancer {
        let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/haproxy.cfg");
        let dir = std::env::temp_dir().join(format!("leaseq-lb-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("admin.sock");
        let addr = free_addr();
        let log = std::fs::File::create(dir.join("haproxy.log")).unwrap();
        let child = tokio::process::Command::new(haproxy_bin())
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .env("LEASEQ_LB_BIND", addr.to_string())
            .env("LEASEQ_LB_SERVER_1", servers[0].to_string())
            .env("LEASEQ_LB_SERVER_2", servers[1].to_string())
            .env("LEASEQ_LB_STREAM_TIMEOUT", stream_timeout)
            // Quick checks keep the test short; the shipped default is 2s.
            .env("LEASEQ_LB_CHECK_INTER", "300ms")
            .env("LEASEQ_LB_STATS_SOCKET", &socket)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn haproxy");
        let mut lb = Balancer {
            addr,
            dir,
            socket,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        for name in up {
            loop {
                // A config HAProxy rejects ends the process: say so at once
                // (Drop prints its log) rather than time out.
                if let Some(exit) = lb.child.try_wait().expect("haproxy status") {
                    panic!("haproxy exited at start: {exit}");
                }
                let stat = lb.stats().await.and_then(|mut m| m.remove(*name));
                if stat.as_ref().is_some_and(|s| s.status == "UP") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "haproxy server {name} not UP within 20s: {stat:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        lb
    }

    /// `show stat` on the admin socket: the servers of backend `leaseq`.
    async fn stats(&self) -> Option<HashMap<String, ServerStat>> {
        let mut conn = tokio::net::UnixStream::connect(&self.socket).await.ok()?;
        conn.write_all(b"show stat\n").await.ok()?;
        let mut out = String::new();
        conn.read_to_string(&mut out).await.ok()?;
        let mut lines = out.lines();
        let header: Vec<&str> = lines.next()?.trim_start_matches("# ").split(',').collect();
        let col = |name: &str| header.iter().position(|h| *h == name);
        let (px, sv, st, chk, cur) = (
            col("pxname")?,
            col("svname")?,
            col("status")?,
            col("check_status")?,
            col("scur")?,
        );
        let mut servers = HashMap::new();
        for line in lines {
            let f: Vec<&str> = line.split(',').collect();
            if f.len() > cur && f[px] == "leaseq" && f[sv].starts_with("leaseq-") {
                servers.insert(
                    f[sv].to_owned(),
                    ServerStat {
                        status: f[st].to_owned(),
                        check_status: f[chk].to_owned(),
                        current: f[cur].parse().unwrap_or(0),
                    },
                );
            }
        }
        Some(servers)
    }

    /// Polls HAProxy until server `name` satisfies `ok`; returns that state.
    async fn wait_status(
        &self,
        name: &str,
        ok: impl Fn(&ServerStat) -> bool,
        limit: Duration,
    ) -> ServerStat {
        let deadline = Instant::now() + limit;
        let mut last = None;
        loop {
            if let Some(s) = self.stats().await.and_then(|mut m| m.remove(name)) {
                if ok(&s) {
                    return s;
                }
                last = Some(s);
            }
            assert!(
                Instant::now() < deadline,
                "haproxy server {name} not in the expected state within {limit:?}; last seen {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        // kill_on_drop ends the process; its log helps when a test failed.
        if std::thread::panicking()
            && let Ok(log) = std::fs::read_to_string(self.dir.join("haproxy.log"))
        {
            eprintln!("--- haproxy log\n{log}");
        }
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A client of the balancer (never of a broker directly).
async fn lb_client(lb: SocketAddr) -> Client {
    let channel = Channel::from_shared(format!("http://{lb}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect to the balancer");
    Client::new(channel)
}

/// What the consumers do with each job: the shared fault-run consumer
/// (tests/common/load.rs), on the one address it knows (the balancer), with
/// a little work per job so that streams hold unsettled jobs when a replica
/// goes away, and no nacks, stalls or cuts of its own: every redelivery is
/// the lost replica's doing. Half the consumers receive and settle on
/// Consume streams (bidirectional, through the balancer), half on Subscribe
/// streams with unary settles.
fn through_the_balancer(lease: Duration) -> Behaviour {
    Behaviour {
        nack: 0.0,
        stall: 0.0,
        cut: 0.0,
        lease,
        credit: 8,
        work: Duration::from_millis(4),
        protocol: Protocol::Mixed,
        follow_ups: 0.0,
    }
}

/// Enqueues `n` jobs `{prefix}{i}` through the balancer in EnqueueBatch
/// calls of 100 (a backlog), recording each in `history`.
async fn enqueue_backlog(history: History, lb: SocketAddr, prefix: &'static str, n: usize) {
    let mut client = lb_client(lb).await;
    let payloads: Vec<String> = (0..n).map(|i| format!("{prefix}{i:06}")).collect();
    for chunk in payloads.chunks(100) {
        let jobs = chunk.iter().map(|p| job(QUEUE, p)).collect();
        let results = client
            .enqueue_batch(pb::EnqueueBatchRequest { jobs })
            .await
            .expect("enqueue batch (all replicas are up)")
            .into_inner()
            .results;
        for (payload, r) in chunk.iter().zip(results) {
            history.enqueue_ok(payload, &r.job_id);
        }
    }
}

/// Waits until both replicas hold open streams through the balancer.
async fn wait_streams_on_both(lb: &Balancer) {
    for name in ["leaseq-1", "leaseq-2"] {
        lb.wait_status(name, |s| s.current >= 1, Duration::from_secs(10))
            .await;
    }
}

/// How the test takes replica leaseq-1 away.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Loss {
    /// kill -9: no drain, no release; its streams' leases run out.
    Kill,
    /// SIGTERM: NOT_SERVING at once, its streams' jobs released with the
    /// attempt given back, streams ended with UNAVAILABLE, exit 0.
    Drain,
}

/// Two replicas behind the balancer, four consumers and producers on the
/// balancer, a backlog so that every stream holds unsettled jobs, then
/// replica 1 goes away mid-flow. The balancer must take it out of rotation
/// (and only it), consumers re-subscribe through the balancer, jobs keep
/// flowing, and the history checker (tests/common/history.rs) finds nothing
/// lost, nothing acked twice, no overlapping leases.
async fn lose_a_replica_mid_flow(loss: Loss) {
    // A kill is recovered by lease expiry, so leases are short. A drain
    // releases its jobs itself: with leases far longer than the test, any
    // delivery of a second attempt is the drain's doing (a short lease could
    // also run out on a loaded machine and muddy that check).
    let lease = match loss {
        Loss::Kill => LEASE,
        Loss::Drain => Duration::from_secs(60),
    };
    let db = TestDb::new().await;
    let mut b1 = BinaryBroker::start(&db, &[]).await;
    let b2 = BinaryBroker::start(&db, &[]).await;
    let lb = Balancer::start([b1.addr, b2.addr], "60s").await;

    const CONSUMERS: usize = 4;
    let h = History::new();
    // Each stream is recorded on the replica that serves it (named in its
    // metadata): the drain of replica 1 excuses the releases of its own
    // streams only.
    let ids = BrokerIds::default();
    assert_eq!(ids.learn(b1.addr).await, 0);
    assert_eq!(ids.learn(b2.addr).await, 1);
    let mut load = Load::consumers_behind(
        &h,
        &[lb.addr],
        QUEUE,
        CONSUMERS,
        through_the_balancer(lease),
        Some(ids),
    );
    load.watch(&db.pool);
    // leastconn spreads the four streams over both replicas.
    wait_streams_on_both(&lb).await;

    enqueue_backlog(h.clone(), lb.addr, "backlog-", 400).await;
    let stop = load.producers_stop();
    load.produce(producer(
        h.clone(),
        vec![lb.addr],
        QUEUE,
        "flow-",
        400,
        Duration::from_millis(5),
        stop,
    ));
    wait_acked(&h, 100, Duration::from_secs(60)).await;

    let lost_at = Instant::now();
    // Replica 1 is broker 0 of the history.
    let fault = h.fault(
        match loss {
            Loss::Kill => "kill -9",
            Loss::Drain => "SIGTERM",
        },
        Some(0),
    );
    match loss {
        Loss::Kill => b1.signal(libc::SIGKILL),
        Loss::Drain => {
            h.drain(0);
            b1.signal(libc::SIGTERM)
        }
    }
    let down = lb
        .wait_status("leaseq-1", |s| s.status == "DOWN", Duration::from_secs(15))
        .await;
    eprintln!("{loss:?}: leaseq-1 DOWN after {:?}", lost_at.elapsed());
    let exit = b1.wait(Duration::from_secs(15)).await;
    h.healed(fault);
    match loss {
        Loss::Kill => assert_eq!(down.check_status, "L4CON", "killed: {down:?}"),
        Loss::Drain => {
            // L7RSP when a check saw NOT_SERVING before the process exited,
            // L4CON when the drain was already over.
            assert!(
                ["L7RSP", "L4CON"].contains(&down.check_status.as_str()),
                "drained: {down:?}"
            );
            assert!(exit.success(), "a drain exits 0: {exit:?}");
        }
    }
    let acked_at_down = h.acked_count();

    // Jobs enqueued after the replica left the rotation flow too.
    enqueue_backlog(h.clone(), lb.addr, "after-", 100).await;
    wait_acked(&h, acked_at_down + 100, Duration::from_secs(60)).await;
    assert!(
        h.streams_opened() > CONSUMERS,
        "consumers of the lost replica re-subscribed"
    );
    if loss == Loss::Drain {
        // A drain gives the attempt back: no delivery counted a second one.
        let again: Vec<_> = h
            .deliveries()
            .into_iter()
            .filter(|d| d.attempt > 1)
            .collect();
        assert!(
            again.is_empty(),
            "drain releases are not attempts: {again:?}"
        );
    }
    let report = load
        .finish(&format!("lb-{loss:?}"), &db.pool, lb.addr, QUEUE)
        .await;
    assert_eq!(report.dead, 0, "no job dead-lettered");
    assert!(report.consume_acks > 0, "no job acked on a Consume stream");
    assert_eq!(
        lb.stats().await.unwrap()["leaseq-2"].status,
        "UP",
        "the other replica stayed in rotation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_killed_behind_the_balancer_loses_nothing() {
    lose_a_replica_mid_flow(Loss::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_drained_behind_the_balancer_loses_nothing() {
    lose_a_replica_mid_flow(Loss::Drain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_without_postgres_leave_rotation_while_alive_and_return() {
    let db = TestDb::new().await;
    let b1 = BinaryBroker::start(&db, &[]).await;
    let b2 = BinaryBroker::start(&db, &[]).await;
    let lb = Balancer::start([b1.addr, b2.addr], "60s").await;

    // Cut this test's database off: no new connections, existing ones ended.
    db.cut_off().await;
    for name in ["leaseq-1", "leaseq-2"] {
        let s = lb
            .wait_status(name, |s| s.status == "DOWN", Duration::from_secs(20))
            .await;
        // The process answered the check, with NOT_SERVING: the gRPC check
        // takes out a replica a TCP check would keep.
        assert_eq!(s.check_status, "L7RSP", "{name}: {s:?}");
    }
    for b in [&b1, &b2] {
        assert_eq!(
            health(b.addr, "liveness").await,
            Some(ServingStatus::Serving),
            "liveness stays SERVING: no restart for a database outage"
        );
    }
    db.allow_connections(true).await;
    for name in ["leaseq-1", "leaseq-2"] {
        lb.wait_status(name, |s| s.status == "UP", Duration::from_secs(30))
            .await;
    }
    // And traffic through the balancer works again.
    let mut c = lb_client(lb.addr).await;
    let mut s = subscribe(&mut c, &["back"], 1, None).await;
    let id = enqueue(&mut c, "back", "again").await;
    let d = next_delivery(&mut s, Duration::from_secs(10)).await;
    assert_eq!(d.job.as_ref().unwrap().id, id);
    ack(&mut c, &d).await.expect("ack");
}

/// Subscribe through the balancer and read heartbeats for `idle`; returns
/// the error that ended the stream, if one did.
async fn idle_stream(lb: &Balancer, idle: Duration) -> Result<u32, tonic::Status> {
    let mut c = lb_client(lb.addr).await;
    let mut s = subscribe(&mut c, &["idle"], 1, None).await;
    let until = Instant::now() + idle;
    let mut heartbeats = 0;
    while Instant::now() < until {
        match tokio::time::timeout_at(until, s.message()).await {
            Err(_) => break,
            Ok(Ok(Some(m))) => {
                assert!(
                    matches!(m.kind, Some(Kind::Heartbeat(_))),
                    "only heartbeats"
                );
                heartbeats += 1;
            }
            Ok(Ok(None)) => return Err(tonic::Status::cancelled("stream ended")),
            Ok(Err(e)) => return Err(e),
        }
    }
    // Still open: a job enqueued now arrives on it.
    let id = enqueue(&mut c, "idle", "after the quiet").await;
    let d = next_delivery(&mut s, Duration::from_secs(10)).await;
    assert_eq!(d.job.as_ref().unwrap().id, id);
    ack(&mut c, &d).await.expect("ack");
    Ok(heartbeats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_streams_outlive_the_balancer_timeout_only_with_heartbeats() {
    let db = TestDb::new().await;
    // Heartbeats every 500ms (BinaryBroker's setting).
    let b = BinaryBroker::start(&db, &[]).await;

    // Stream timeout 2s, above the heartbeat interval: a stream with no
    // job for twice that long survives.
    let lb = Balancer::start([b.addr, b.addr], "2s").await;
    let heartbeats = idle_stream(&lb, Duration::from_secs(4))
        .await
        .expect("quiet stream kept open by heartbeats");
    assert!(heartbeats >= 4, "heartbeats kept it busy: {heartbeats}");
    drop(lb);

    // Stream timeout 300ms, under the heartbeat interval: the balancer cuts
    // the quiet stream.
    let lb = Balancer::start([b.addr, b.addr], "300ms").await;
    let err = idle_stream(&lb, Duration::from_secs(4))
        .await
        .expect_err("the balancer cuts a stream quiet for longer than its timeout");
    assert_ne!(err.code(), Code::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connection_age_moves_streams_to_a_replica_added_later() {
    let db = TestDb::new().await;
    let age = [
        "--max-connection-age",
        "2s",
        "--max-connection-age-grace",
        "1s",
    ];
    let b1 = BinaryBroker::start(&db, &age).await;
    // Replica 2's address is in the balancer's config before it runs.
    let addr2 = free_addr();
    let lb = Balancer::start_expecting([b1.addr, addr2], "60s", &["leaseq-1"]).await;

    // Every stream lands on the only replica there is.
    let h = History::new();
    let consumers = Load::consumers_only(&h, &[lb.addr], QUEUE, 4, through_the_balancer(LEASE));
    lb.wait_status("leaseq-1", |s| s.current >= 4, Duration::from_secs(10))
        .await;

    // Scale up. Streams are long-lived: without a connection age they would
    // stay on replica 1. With one, replica 1 closes the balancer's
    // connection (GOAWAY, then the grace), the streams on it end, the
    // consumers re-subscribe and leastconn sends them to the new replica.
    let b2 = BinaryBroker::on(&db).addr(addr2).args(&age).start().await;
    lb.wait_status("leaseq-2", |s| s.status == "UP", Duration::from_secs(20))
        .await;
    lb.wait_status("leaseq-2", |s| s.current >= 1, Duration::from_secs(20))
        .await;
    // The consumers saw their new streams open (the balancer counts one as
    // soon as it forwards the call, before the broker's answer is back).
    eventually(
        Duration::from_secs(10),
        "streams re-subscribed after the age",
        || async { h.streams_opened() > 4 },
    )
    .await;
    consumers.stop().await;
    drop(b2);
}
