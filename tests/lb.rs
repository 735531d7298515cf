//! leaseq behind a real L7 load balancer. HAProxy (Debian's `haproxy`) runs
//! the shipped `deploy/haproxy.cfg`, unchanged (addresses and timings come
//! from the environment variables it documents), in front of two real
//! `leaseq` binaries on one database. Producers and consumers talk only to the
//! balancer. One replica is killed with SIGKILL, or drained with SIGTERM, or
//! loses PostgreSQL; the balancer takes it out of rotation (read back from
//! HAProxy's admin socket), consumers re-subscribe, every job is acked exactly
//! once, and jobs keep flowing. Two more tests show why the balancer's stream
//! timeout must exceed the heartbeat interval, and how `--max-connection-age`
//! moves streams to a replica added later.
//!
//! Without the haproxy binary these tests fail (they do not skip): `.ci/run`
//! installs it.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use leaseq::pb::subscribe_response::Kind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;
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
         (apt-get install haproxy; .ci/run installs it)"
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
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
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

/// What the consumers saw, shared by all of them.
#[derive(Default)]
struct Ledger {
    /// Job id -> number of Acks that returned OK (must end at exactly 1).
    acked: HashMap<String, u32>,
    /// Job id -> payload, for every delivery.
    payloads: HashMap<String, String>,
    /// Jobs whose Ack failed for a reason other than a stale token (the
    /// replica died under it): it may or may not have been applied.
    ack_unknown: HashSet<String>,
    /// Streams that ended (error or end) and were opened again.
    resubscribes: u32,
    /// How streams ended: status code (or "end") -> count.
    stream_ends: HashMap<String, u32>,
    /// Deliveries, and those of an attempt after the first (redeliveries).
    deliveries: u32,
    redeliveries: u32,
    /// Acks refused with FAILED_PRECONDITION (lease lost: redelivered later).
    stale: u32,
}

struct Consumers {
    ledger: Arc<Mutex<Ledger>>,
    /// Number of distinct jobs acked OK so far; tests wait on it.
    progress: watch::Receiver<usize>,
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl Consumers {
    /// `n` consumers of the balancer, each a re-subscribe loop, with the
    /// short [`LEASE`].
    async fn start(lb: &Balancer, n: usize) -> Consumers {
        Self::start_with_lease(lb, n, LEASE).await
    }

    /// Consumers whose leases last `lease`.
    async fn start_with_lease(lb: &Balancer, n: usize, lease: Duration) -> Consumers {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let (tx, progress) = watch::channel(0);
        let tx = Arc::new(tx);
        let stop = CancellationToken::new();
        let mut tasks = JoinSet::new();
        for i in 0..n {
            let client = lb_client(lb.addr).await;
            tasks.spawn(consume(
                format!("c{i}"),
                lease,
                client,
                ledger.clone(),
                tx.clone(),
                stop.clone(),
            ));
        }
        Consumers {
            ledger,
            progress,
            stop,
            tasks,
        }
    }

    async fn wait_acked(&mut self, n: usize, limit: Duration) {
        let waited = timeout(limit, self.progress.wait_for(|&c| c >= n))
            .await
            .map(|r| r.is_ok());
        assert_eq!(
            waited,
            Ok(true),
            "{n} jobs not acked within {limit:?} (acked {})",
            *self.progress.borrow()
        );
    }

    async fn stop(mut self) -> Ledger {
        self.stop.cancel();
        while let Some(r) = self.tasks.join_next().await {
            r.expect("consumer task");
        }
        Arc::try_unwrap(self.ledger)
            .ok()
            .expect("consumers stopped")
            .into_inner()
            .unwrap()
    }
}

/// One consumer: subscribe through the balancer, ack every delivery, and when
/// the stream ends for any reason (replica killed or draining), subscribe
/// again, which the balancer routes to a replica that is up.
async fn consume(
    name: String,
    lease: Duration,
    mut client: Client,
    ledger: Arc<Mutex<Ledger>>,
    progress: Arc<watch::Sender<usize>>,
    stop: CancellationToken,
) {
    let mut first = true;
    while !stop.is_cancelled() {
        if !first {
            ledger.lock().unwrap().resubscribes += 1;
        }
        first = false;
        let subscribed = tokio::select! {
            _ = stop.cancelled() => return,
            r = client.subscribe(pb::SubscribeRequest {
                queues: vec![QUEUE.into()],
                consumer: name.clone(),
                max_in_flight: 8,
                lease: Some(dur(lease)),
            }) => r,
        };
        let mut stream = match subscribed {
            Ok(s) => s.into_inner(),
            Err(_) => {
                // Refused (a draining replica the balancer still routes
                // to) or no replica up: try again shortly.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return,
                m = stream.message() => m,
            };
            let delivery = match msg {
                Ok(Some(pb::SubscribeResponse {
                    kind: Some(Kind::Delivery(d)),
                })) => d,
                Ok(Some(_)) => continue,
                // The stream ended: resubscribe.
                Ok(None) => {
                    *ledger
                        .lock()
                        .unwrap()
                        .stream_ends
                        .entry("end".into())
                        .or_default() += 1;
                    break;
                }
                Err(s) => {
                    let code = format!("{:?}: {}", s.code(), s.message());
                    *ledger.lock().unwrap().stream_ends.entry(code).or_default() += 1;
                    break;
                }
            };
            let job = delivery.job.as_ref().expect("delivery has a job");
            {
                let mut l = ledger.lock().unwrap();
                l.deliveries += 1;
                l.redeliveries += u32::from(job.attempt > 1);
                l.payloads
                    .insert(job.id.clone(), String::from_utf8_lossy(&job.payload).into());
            }
            // A little work per job, so that streams hold unsettled jobs
            // when a replica goes away.
            tokio::time::sleep(Duration::from_millis(2)).await;
            settle(&mut client, &delivery, &ledger, &progress).await;
        }
    }
}

/// Acks one delivery. A failure other than a stale token means the call
/// died with a replica: retried (a second Ack of an applied Ack is refused as
/// stale, so a retry cannot double-count); if it never gets an answer, the
/// outcome is recorded as unknown.
async fn settle(
    client: &mut Client,
    d: &pb::Delivery,
    ledger: &Mutex<Ledger>,
    progress: &watch::Sender<usize>,
) {
    let id = d.job.as_ref().unwrap().id.clone();
    let mut transport_error = false;
    for _ in 0..20 {
        match ack(client, d).await {
            Ok(()) => {
                let mut l = ledger.lock().unwrap();
                *l.acked.entry(id.clone()).or_default() += 1;
                l.ack_unknown.remove(&id);
                progress.send_replace(l.acked.len());
                return;
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                let mut l = ledger.lock().unwrap();
                l.stale += 1;
                if transport_error {
                    // Either the first attempt was applied, or the lease was
                    // lost and the job will be delivered again.
                    l.ack_unknown.insert(id);
                }
                return;
            }
            Err(_) => {
                transport_error = true;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    ledger.lock().unwrap().ack_unknown.insert(id);
}

/// Enqueues `range` through the balancer, one job per payload `job-<i>`,
/// with the payload as dedup key so that a retry after an error whose outcome
/// is unknown does not create a second live job. Returns payload -> job id.
async fn produce(
    lb: SocketAddr,
    range: std::ops::Range<u32>,
    produced: Arc<Mutex<HashMap<String, String>>>,
) {
    let mut client = lb_client(lb).await;
    for i in range {
        let payload = format!("job-{i}");
        let mut req = job(QUEUE, &payload);
        req.dedup_key = payload.clone();
        let mut tries = 0;
        let id = loop {
            match client.enqueue(req.clone()).await {
                Ok(r) => break r.into_inner().job_id,
                Err(s) => {
                    tries += 1;
                    assert!(tries < 100, "enqueue of {payload} keeps failing: {s:?}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        produced.lock().unwrap().insert(payload, id);
    }
}

/// Enqueues `range` through the balancer in EnqueueBatch calls of 100 (a
/// backlog), with dedup keys as [`produce`] does.
async fn produce_batches(
    lb: SocketAddr,
    range: std::ops::Range<u32>,
    produced: Arc<Mutex<HashMap<String, String>>>,
) {
    let mut client = lb_client(lb).await;
    let payloads: Vec<String> = range.map(|i| format!("job-{i}")).collect();
    for chunk in payloads.chunks(100) {
        let jobs = chunk
            .iter()
            .map(|p| pb::EnqueueRequest {
                dedup_key: p.clone(),
                ..job(QUEUE, p)
            })
            .collect();
        let results = client
            .enqueue_batch(pb::EnqueueBatchRequest { jobs })
            .await
            .expect("enqueue batch (all replicas are up)")
            .into_inner()
            .results;
        let mut p = produced.lock().unwrap();
        for (payload, r) in chunk.iter().zip(results) {
            p.insert(payload.clone(), r.job_id);
        }
    }
}

/// Every job whose Enqueue returned OK was acked exactly once, or its Ack's
/// outcome is unknown and it is gone from the database (the Ack was applied);
/// nothing is left live or dead.
async fn assert_nothing_lost(db: &TestDb, produced: &HashMap<String, String>, ledger: &Ledger) {
    let twice: Vec<_> = ledger.acked.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "jobs acked OK more than once: {twice:?}");
    let live: HashSet<String> = sqlx::query_scalar("select id::text from leaseq.jobs")
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert!(live.is_empty(), "jobs left live: {live:?}");
    assert_eq!(db.dead_jobs().await, 0, "no job dead-lettered");
    let mut unknown = 0;
    for (payload, id) in produced {
        if ledger.acked.get(id) == Some(&1) {
            continue;
        }
        assert!(
            ledger.ack_unknown.contains(id),
            "job {id} ({payload}) enqueued OK but never acked"
        );
        unknown += 1;
    }
    // An id acked but not returned by Enqueue: its Enqueue failed after
    // committing and the retry found the key free again (the first job was
    // already done). It must be one of our payloads.
    for id in ledger.acked.keys() {
        let payload = &ledger.payloads[id];
        assert!(
            produced.contains_key(payload),
            "acked job {id} with unknown payload {payload}"
        );
    }
    eprintln!(
        "{} jobs, {} acked once, {unknown} with an Ack applied but unanswered; \
         {} deliveries, {} redeliveries, {} stale acks, {} resubscribes; streams ended {:?}",
        produced.len(),
        ledger.acked.len(),
        ledger.deliveries,
        ledger.redeliveries,
        ledger.stale,
        ledger.resubscribes,
        ledger.stream_ends
    );
}

/// Waits until both replicas hold open streams through the balancer.
async fn wait_streams_on_both(lb: &Balancer) {
    for name in ["leaseq-1", "leaseq-2"] {
        lb.wait_status(name, |s| s.current >= 1, Duration::from_secs(10))
            .await;
    }
}

/// Waits until every produced job is acked (or its Ack's outcome unknown).
async fn wait_all_settled(
    consumers: &mut Consumers,
    produced: &Mutex<HashMap<String, String>>,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    loop {
        let missing: Vec<String> = {
            let p = produced.lock().unwrap();
            let l = consumers.ledger.lock().unwrap();
            p.values()
                .filter(|id| !l.acked.contains_key(*id) && !l.ack_unknown.contains(*id))
                .cloned()
                .collect()
        };
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} jobs not acked within {limit:?}, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        // Progress is an event: wait for the next ack (or a short tick, for
        // jobs settled as unknown without an ack).
        let _ = timeout(Duration::from_millis(200), consumers.progress.changed()).await;
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
/// replica 1 goes away mid-flow.
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

    let mut consumers = Consumers::start_with_lease(&lb, 4, lease).await;
    // leastconn spreads the four streams over both replicas.
    wait_streams_on_both(&lb).await;

    let produced = Arc::new(Mutex::new(HashMap::new()));
    produce_batches(lb.addr, 0..400, produced.clone()).await;
    let producer = tokio::spawn(produce(lb.addr, 400..800, produced.clone()));
    consumers.wait_acked(100, Duration::from_secs(60)).await;

    let lost_at = Instant::now();
    match loss {
        Loss::Kill => b1.signal(libc::SIGKILL),
        Loss::Drain => b1.signal(libc::SIGTERM),
    }
    let down = lb
        .wait_status("leaseq-1", |s| s.status == "DOWN", Duration::from_secs(15))
        .await;
    eprintln!("{loss:?}: leaseq-1 DOWN after {:?}", lost_at.elapsed());
    let exit = b1.wait(Duration::from_secs(15)).await;
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
    let acked_at_down = *consumers.progress.borrow();

    producer.await.expect("producer");
    // Jobs enqueued after the replica left the rotation flow too.
    produce(lb.addr, 800..900, produced.clone()).await;
    wait_all_settled(&mut consumers, &produced, Duration::from_secs(60)).await;
    assert!(
        *consumers.progress.borrow() >= acked_at_down + 100,
        "jobs kept flowing after the loss"
    );
    let ledger = consumers.stop().await;
    assert!(
        ledger.resubscribes >= 1,
        "consumers of the lost replica re-subscribed"
    );
    let produced = produced.lock().unwrap().clone();
    assert_nothing_lost(&db, &produced, &ledger).await;
    if loss == Loss::Drain {
        // A drain gives the attempt back: no delivery counted a second one.
        assert_eq!(ledger.redeliveries, 0, "drain releases are not attempts");
    }
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
    let addr2: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let lb = Balancer::start_expecting([b1.addr, addr2], "60s", &["leaseq-1"]).await;

    // Every stream lands on the only replica there is.
    let consumers = Consumers::start(&lb, 4).await;
    lb.wait_status("leaseq-1", |s| s.current >= 4, Duration::from_secs(10))
        .await;

    // Scale up. Streams are long-lived: without a connection age they would
    // stay on replica 1. With one, replica 1 closes the balancer's
    // connection (GOAWAY, then the grace), the streams on it end, the
    // consumers re-subscribe and leastconn sends them to the new replica.
    let b2 = BinaryBroker::start_at(&db, addr2, &age).await;
    lb.wait_status("leaseq-2", |s| s.status == "UP", Duration::from_secs(20))
        .await;
    lb.wait_status("leaseq-2", |s| s.current >= 1, Duration::from_secs(20))
        .await;
    let ledger = consumers.stop().await;
    assert!(
        ledger.resubscribes >= 1,
        "streams re-subscribed after the age"
    );
    eprintln!("streams ended with {:?}", ledger.stream_ends);
    drop(b2);
}
