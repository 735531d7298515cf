//! Queues over three PostgreSQL clusters (docs/SCALING.md): three private
//! clusters (started like the fault suite's, `tests/faults/pg.rs`), brokers
//! in this process given all three, and the fault suite's history checker
//! over the result: every job acked exactly once, no two live leases of one
//! job, with streams over queues on every cluster and acks sent to another
//! replica; wake-ups by NOTIFY on each cluster with the fallback poll set
//! long; a batch over two clusters refused with nothing written; one
//! cluster crashed (`pg_ctl stop -m immediate`) while the others flow; a
//! bucket moved under load.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use leaseq::pb;
use leaseq_server::ClusterId;
use leaseq_server::placement::{self, MoveOptions, bucket_of};
use sqlx::PgPool;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::common::history::{History, Op};
use crate::common::load::{self, Next, Rng, lazy_client, next, producer_over};
use crate::common::{Database, TestBroker, TestBrokerBuilder, dur};
use crate::faults::pg::PrivatePg;

const NAMES: [&str; 3] = ["a", "b", "c"];

/// Three private clusters and a pool on each.
pub(crate) struct Three {
    pub(crate) pgs: Vec<PrivatePg>,
    pub(crate) pools: Vec<PgPool>,
}

impl Three {
    pub(crate) async fn start() -> Three {
        let (a, b, c) = tokio::join!(PrivatePg::start(), PrivatePg::start(), PrivatePg::start());
        let pgs = vec![a, b, c];
        let mut pools = Vec::new();
        for pg in &pgs {
            pools.push(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(3)
                    .connect(&pg.url)
                    .await
                    .expect("test pool"),
            );
        }
        Three { pgs, pools }
    }

    pub(crate) fn databases(&self) -> Vec<Database> {
        self.pgs
            .iter()
            .zip(NAMES)
            .map(|(pg, name)| Database {
                name: name.to_owned(),
                url: pg.url.clone(),
            })
            .collect()
    }

    /// (id, pool) per cluster, home first: what `move_bucket` takes.
    pub(crate) fn placement_pools(&self) -> Vec<(ClusterId, PgPool)> {
        self.pools
            .iter()
            .enumerate()
            .map(|(i, p)| (ClusterId(i as u16), p.clone()))
            .collect()
    }

    pub(crate) async fn live(&self, k: usize, queues: &[String]) -> i64 {
        sqlx::query_scalar("select count(*) from leaseq.jobs where queue = any($1)")
            .bind(queues)
            .fetch_one(&self.pools[k])
            .await
            .expect("count")
    }

    pub(crate) async fn live_everywhere(&self, queues: &[String]) -> i64 {
        let mut n = 0;
        for k in 0..3 {
            n += self.live(k, queues).await;
        }
        n
    }

    /// Dead and live ids over every cluster, for the checker.
    async fn final_ids(&self) -> (HashSet<String>, HashSet<String>) {
        let (mut dead, mut live) = (HashSet::new(), HashSet::new());
        for p in &self.pools {
            let (d, l) = crate::common::load::final_ids(p).await;
            dead.extend(d);
            live.extend(l);
        }
        (dead, live)
    }
}

/// A broker over `dbs` (the three clusters), in this process: its fallback
/// poll longer than any test, so that deliveries must come from NOTIFY
/// wake-ups, and the map followed every 200 ms.
pub(crate) fn over_three(dbs: &[Database]) -> TestBrokerBuilder {
    TestBroker::over(dbs)
        .ready_within(Duration::from_secs(60))
        .stop_within(Duration::from_secs(20))
        .config(|cfg| {
            cfg.poll_interval = Duration::from_secs(600);
            cfg.placement_interval = Duration::from_millis(200);
        })
}

/// `n` queue names on cluster `k` under the first map of a new deployment
/// (bucket b on cluster b mod 3).
pub(crate) fn queues_on(k: usize, n: usize, prefix: &str) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}{k}-{i}"))
        .filter(|q| bucket_of(q) as usize % 3 == k)
        .take(n)
        .collect()
}

/// Consumes `queues` with one stream at a time on `consume` and sends its
/// settles to `settle` (another replica, when they differ), recording
/// everything, until `stop`. Nacks a share of its jobs.
#[allow(clippy::too_many_arguments)]
async fn consumer(
    h: History,
    consume: SocketAddr,
    settle: SocketAddr,
    broker: usize,
    settle_broker: usize,
    queues: Vec<String>,
    nack: f64,
    seed: u64,
    stop: CancellationToken,
) {
    let lease = Duration::from_secs(2);
    let mut rng = Rng::new(seed);
    let mut settler = lazy_client(settle);
    while !stop.is_cancelled() {
        let mut c = lazy_client(consume);
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            r = timeout(Duration::from_secs(5), c.subscribe(pb::SubscribeRequest {
                queues: queues.clone(),
                consumer: format!("scaling-{seed}"),
                max_in_flight: 8,
                lease: Some(dur(lease)),
                accept: Vec::new(),
            })) => r,
        };
        let stream = match opened {
            Ok(Ok(s)) => s.into_inner(),
            Ok(Err(s)) => {
                h.subscribe_err(s.code());
                sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(_) => {
                h.subscribe_err(Code::DeadlineExceeded);
                continue;
            }
        };
        let sid = h.consumer_stream(broker, 8, false);
        let mut reader = load::Reader::start(&h, sid, broker, lease, stream);
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => {
                    h.stream_dropped(sid);
                    return;
                }
                m = reader.next() => m,
            };
            let Some(rec) = msg else { break };
            if rng.next_f64() < nack {
                load::nack(
                    &h,
                    &mut settler,
                    &rec,
                    settle_broker,
                    "scaling: nacked on purpose",
                )
                .await;
            } else {
                let sent = h.sent(Op::Ack, &rec, settle_broker);
                let r = load::ack(&mut settler, &rec.id, &rec.token).await;
                h.answered(sent, &r);
            }
        }
        drop(reader);
        sleep(Duration::from_millis(50)).await;
    }
}

/// Takes and acks everything left in `queues` through `addr` (recorded),
/// until no cluster holds a job of them.
async fn final_drain(h: &History, three: &Three, addr: SocketAddr, queues: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let lease = Duration::from_secs(30);
    let mut client = lazy_client(addr);
    let mut acks = load::Acks::default();
    'outer: loop {
        assert!(
            Instant::now() < deadline,
            "final drain: {} jobs left",
            three.live_everywhere(queues).await
        );
        let Ok(Ok(s)) = timeout(
            Duration::from_secs(5),
            client.subscribe(pb::SubscribeRequest {
                queues: queues.to_vec(),
                consumer: "final-drain".into(),
                max_in_flight: 256,
                lease: Some(dur(lease)),
                accept: Vec::new(),
            }),
        )
        .await
        else {
            sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut stream = s.into_inner();
        let sid = h.stream_opened(usize::MAX);
        loop {
            if three.live_everywhere(queues).await == 0 {
                acks.wait().await;
                h.stream_dropped(sid);
                break 'outer;
            }
            let msg = match timeout(Duration::from_millis(500), stream.message()).await {
                Err(_) => continue,
                Ok(m) => m,
            };
            let d = match next(h, sid, msg) {
                Next::Job(d) => d,
                Next::Nothing => continue,
                Next::Ended => continue 'outer,
            };
            let rec = h.delivered(sid, usize::MAX, lease, &d);
            acks.ack(h, &client, rec).await;
        }
    }
}

/// Producers and consumers of one run.
pub(crate) struct Run {
    h: History,
    producers: CancellationToken,
    consumers: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    consumer_tasks: Vec<tokio::task::JoinHandle<()>>,
    sampler_stop: CancellationToken,
    sampler: Option<tokio::task::JoinHandle<()>>,
}

impl Run {
    /// Two consumers per broker, each streaming every queue from its broker
    /// and settling on the other one; two producers over every queue and
    /// broker, about `rate` jobs/s between them.
    pub(crate) fn start(h: &History, addrs: &[SocketAddr], queues: &[String], rate: u32) -> Run {
        let (producers, consumers) = (CancellationToken::new(), CancellationToken::new());
        let mut consumer_tasks = Vec::new();
        for i in 0..2 * addrs.len() {
            let b = i % addrs.len();
            consumer_tasks.push(tokio::spawn(consumer(
                h.clone(),
                addrs[b],
                addrs[(b + 1) % addrs.len()],
                b,
                (b + 1) % addrs.len(),
                queues.to_vec(),
                0.05,
                i as u64 + 1,
                consumers.clone(),
            )));
        }
        let pace = Duration::from_secs_f64(2.0 / f64::from(rate));
        let tasks = ["pa", "pb"]
            .into_iter()
            .map(|prefix| {
                tokio::spawn(producer_over(
                    h.clone(),
                    addrs.to_vec(),
                    queues.to_vec(),
                    prefix,
                    20_000,
                    pace,
                    producers.clone(),
                ))
            })
            .collect();
        Run {
            h: h.clone(),
            producers,
            consumers,
            tasks,
            consumer_tasks,
            sampler_stop: CancellationToken::new(),
            sampler: None,
        }
    }

    /// Samples the jobs of `queues` waiting deliverable on every cluster
    /// (the history's stall check) until [`Run::finish`] has drained.
    pub(crate) fn watch(&mut self, three: &Three, queues: &[String]) {
        self.sampler = Some(tokio::spawn(load::sample_ready(
            self.h.clone(),
            three.pools.clone(),
            queues.to_vec(),
            self.sampler_stop.clone(),
        )));
    }

    /// Runs `task` as one more producer: [`Run::finish`] waits for it.
    pub(crate) fn produce(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.push(tokio::spawn(task));
    }

    /// The token producers stop on.
    pub(crate) fn producers_stop(&self) -> CancellationToken {
        self.producers.clone()
    }

    /// Stops the load, drains, checks the history over every cluster.
    pub(crate) async fn finish(
        self,
        name: &str,
        three: &Three,
        drain: SocketAddr,
        queues: &[String],
    ) -> crate::common::history::Report {
        self.h.faults_over();
        self.producers.cancel();
        for t in self.tasks {
            timeout(Duration::from_secs(20), t).await.unwrap().unwrap();
        }
        self.consumers.cancel();
        for t in self.consumer_tasks {
            timeout(Duration::from_secs(20), t).await.unwrap().unwrap();
        }
        final_drain(&self.h, three, drain, queues).await;
        self.sampler_stop.cancel();
        if let Some(s) = self.sampler {
            s.await.expect("sampler");
        }
        let (dead, live) = three.final_ids().await;
        let report = self.h.check(&dead, &live);
        eprintln!("{}", report.figures(name, self.h.now()));
        report.assert_ok();
        assert!(live.is_empty(), "jobs left after the drain: {live:?}");
        report
    }
}

/// Commits on cluster `k` so far: they move with every enqueue, lease and
/// ack there (the load reached that cluster).
async fn commits_on(three: &Three, k: usize) -> i64 {
    sqlx::query_scalar(
        "select xact_commit from pg_stat_database where datname = current_database()",
    )
    .fetch_one(&three.pools[k])
    .await
    .expect("stats")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_over_three_clusters() {
    let three = Three::start().await;
    let dbs = three.databases();
    let b0 = over_three(&dbs).start().await;
    let b1 = over_three(&dbs).start().await;
    let queues: Vec<String> = (0..3).flat_map(|k| queues_on(k, 2, "q")).collect();

    // Wake-ups by NOTIFY on every cluster: a stream on broker 0 over one
    // queue per cluster; jobs enqueued through broker 1 (no stream there,
    // so inserted available and announced on the queue's cluster), and one
    // by `leaseq.enqueue()` in cluster c's own database. The fallback poll
    // is 10 minutes: only the notifications can deliver them.
    let mut c0 = lazy_client(b0.addr);
    let mut c1 = lazy_client(b1.addr);
    let one_each: Vec<String> = (0..3).map(|k| queues_on(k, 1, "q").remove(0)).collect();
    let names: Vec<&str> = one_each.iter().map(String::as_str).collect();
    let mut stream = crate::common::subscribe(&mut c0, &names, 16, None).await;
    for (k, q) in one_each.iter().enumerate() {
        let started = Instant::now();
        if k == 2 {
            sqlx::query("select leaseq.enqueue($1, 'by-sql'::bytea)")
                .bind(q)
                .execute(&three.pools[2])
                .await
                .unwrap();
        } else {
            crate::common::enqueue(&mut c1, q, &format!("wake-{k}")).await;
        }
        let d = crate::common::next_delivery(&mut stream, Duration::from_secs(5)).await;
        assert_eq!(&crate::common::job_of(&d).queue, q);
        assert!(started.elapsed() < Duration::from_secs(5));
        // Its token routes the ack to the job's cluster, through the other replica.
        if k > 0 {
            assert!(
                d.lease_token.ends_with(&format!(".{k}")),
                "{}",
                d.lease_token
            );
        } else {
            assert!(uuid::Uuid::try_parse(&d.lease_token).is_ok());
        }
        crate::common::ack(&mut c1, &d)
            .await
            .expect("ack on another replica");
        assert_eq!(three.live(k, &one_each).await, 0);
    }
    drop(stream);

    // A batch over two clusters is refused, naming the field, and nothing
    // is written anywhere.
    let batch = pb::EnqueueBatchRequest {
        jobs: vec![
            crate::common::job(&queues_on(0, 1, "q")[0], "x"),
            crate::common::job(&queues_on(0, 2, "q")[1], "y"),
            crate::common::job(&queues_on(1, 1, "q")[0], "z"),
        ],
    };
    let err = c0.enqueue_batch(batch).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("jobs[2].queue"), "{}", err.message());
    assert_eq!(three.live_everywhere(&queues).await, 0);
    // On one cluster, a batch goes through.
    let ok = pb::EnqueueBatchRequest {
        jobs: vec![
            crate::common::job(&queues_on(1, 1, "q")[0], "batch-1"),
            crate::common::job(&queues_on(1, 2, "q")[1], "batch-2"),
        ],
    };
    let ids: Vec<String> = c0
        .enqueue_batch(ok)
        .await
        .unwrap()
        .into_inner()
        .results
        .into_iter()
        .map(|r| r.job_id)
        .collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(three.live(1, &queues).await, 2);
    let mut admin = leaseq::pb::admin_service_client::AdminServiceClient::new(
        tonic::transport::Channel::from_shared(format!("http://{}", b0.addr))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    for id in &ids {
        admin
            .cancel_job(pb::CancelJobRequest { job_id: id.clone() })
            .await
            .expect("cancel fans out to the job's cluster");
    }
    // Admin lists merge every cluster.
    let listed = admin
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .queues;
    for q in &one_each {
        assert!(listed.iter().any(|l| &l.name == q), "{q} not listed");
    }

    // Load: streams over six queues on three clusters, settles on the other
    // replica, nacks, producers on both replicas.
    let before: Vec<i64> = {
        let mut v = Vec::new();
        for k in 0..3 {
            v.push(commits_on(&three, k).await);
        }
        v
    };
    let h = History::new();
    let mut run = Run::start(&h, &[b0.addr, b1.addr], &queues, 200);
    run.watch(&three, &queues);
    sleep(Duration::from_secs(6)).await;
    run.finish("scaling-exactly-once", &three, b1.addr, &queues)
        .await;
    for (k, b) in before.iter().enumerate() {
        let after = commits_on(&three, k).await;
        assert!(after - b > 100, "cluster {k} saw {} commits", after - b);
    }
    b0.stop().await;
    b1.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_cluster_crashes_the_others_flow() {
    let three = Three::start().await;
    let dbs = three.databases();
    let b0 = over_three(&dbs).start().await;
    let b1 = over_three(&dbs).start().await;
    let up: Vec<String> = (0..2).flat_map(|k| queues_on(k, 2, "u")).collect();
    let down = queues_on(2, 2, "u");
    let all: Vec<String> = up.iter().chain(&down).cloned().collect();

    let h = History::new();
    let mut run = Run::start(&h, &[b0.addr, b1.addr], &all, 200);
    run.watch(&three, &all);
    sleep(Duration::from_secs(2)).await;

    let fault = h.fault("cluster c stopped -m immediate", None);
    three.pgs[2].stop_immediate();
    sleep(Duration::from_millis(500)).await;
    // Its queues answer UNAVAILABLE...
    let mut c = lazy_client(b0.addr);
    let err = timeout(
        Duration::from_secs(40),
        c.enqueue(crate::common::job(&down[0], "while-down")),
    )
    .await
    .expect("answered")
    .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let err = timeout(
        Duration::from_secs(40),
        c.subscribe(pb::SubscribeRequest {
            queues: vec![down[0].clone()],
            ..Default::default()
        }),
    )
    .await
    .expect("answered")
    .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    // ...and the others keep flowing, on the streams that span all three.
    let acked = h.acked_count();
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.acked_count() < acked + 50 {
        assert!(
            Instant::now() < deadline,
            "only {} acks in 10 s with cluster c down",
            h.acked_count() - acked
        );
        sleep(Duration::from_millis(50)).await;
    }
    // An enqueue on a cluster that is up works.
    // Recorded in the history: the consumers deliver and ack it like any
    // other job, and the final check needs to know it was enqueued.
    let id = crate::common::enqueue(&mut c, &up[0], "up-while-c-down").await;
    h.enqueue_ok("up-while-c-down", &id);
    crate::common::wait_health(
        b0.addr,
        "leaseq.cluster.c",
        tonic_health::pb::health_check_response::ServingStatus::NotServing,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        crate::common::health(b0.addr, "").await,
        Some(tonic_health::pb::health_check_response::ServingStatus::Serving)
    );

    three.pgs[2].start_again();
    h.healed(fault);
    // Back: its queues flow again, leases held at the crash redelivered.
    sleep(Duration::from_secs(4)).await;
    run.finish("scaling-cluster-crash", &three, b0.addr, &all)
        .await;
    b0.stop().await;
    b1.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bucket_moved_under_load() {
    let three = Three::start().await;
    let dbs = three.databases();
    let b0 = over_three(&dbs).start().await;
    let b1 = over_three(&dbs).start().await;
    // Two queues of one bucket... is rare; one moving queue and a queue on
    // each other cluster that stays put.
    let moving = queues_on(0, 1, "m");
    let stay: Vec<String> = (1..3).flat_map(|k| queues_on(k, 1, "m")).collect();
    let all: Vec<String> = moving.iter().chain(&stay).cloned().collect();
    let bucket = bucket_of(&moving[0]);

    let h = History::new();
    let mut run = Run::start(&h, &[b0.addr, b1.addr], &all, 300);
    run.watch(&three, &all);
    sleep(Duration::from_secs(2)).await;
    // A backlog on the source too, so the copy has something to carry.
    let mut c = lazy_client(b0.addr);
    let backlog = pb::EnqueueBatchRequest {
        jobs: (0..300)
            .map(|i| crate::common::job(&moving[0], &format!("backlog{i:04}")))
            .collect(),
    };
    let resp = c.enqueue_batch(backlog).await.unwrap().into_inner();
    for (i, r) in resp.results.iter().enumerate() {
        h.enqueue_ok(&format!("backlog{i:04}"), &r.job_id);
    }

    let moved = placement::move_bucket(
        &three.placement_pools(),
        bucket,
        ClusterId(1),
        &MoveOptions {
            batch: 50,
            grace: Duration::from_secs(1),
            limit: Duration::from_secs(60),
            ..MoveOptions::default()
        },
    )
    .await
    .expect("bucket moved");
    eprintln!("moved: {moved:?}");
    assert_eq!(moved.queues, 1);
    // Brokers follow; new jobs go to b, and nothing of the queue is left on a.
    sleep(Duration::from_secs(2)).await;
    assert_eq!(three.live(0, &moving).await, 0);
    let map = placement::load(&three.pools[0]).await.unwrap();
    assert_eq!(map.cluster_of(&moving[0]), ClusterId(1));
    assert!(map.moving.is_empty());
    run.finish("scaling-bucket-move", &three, b1.addr, &all)
        .await;
    b0.stop().await;
    b1.stop().await;
}

/// One broker over three clusters answers a single-database deployment's
/// upgrade: tokens issued by the single-database broker stay valid, and
/// the first map keeps every bucket home.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrade_in_place_keeps_queues_home() {
    let three = Three::start().await;
    let home = &three.pgs[0].url;
    // The single-database broker, as today.
    let single = TestBroker::on_url(home)
        .ready_within(Duration::from_secs(60))
        .stop_within(Duration::from_secs(20))
        .start()
        .await;
    let mut c = lazy_client(single.addr);
    let mut s = crate::common::subscribe(&mut c, &["old"], 4, None).await;
    crate::common::enqueue(&mut c, "old", "before").await;
    let d = crate::common::next_delivery(&mut s, Duration::from_secs(5)).await;
    crate::common::enqueue(&mut c, "old", "waiting").await;
    drop(s);
    single.stop().await;

    let dbs = three.databases();
    let b = over_three(&dbs).start().await;
    let mut c = lazy_client(b.addr);
    // A token of the single-database broker (a bare UUID) is understood as
    // cluster 0's: this one was released when its stream closed, so it is
    // stale, not malformed.
    let r = crate::common::ack(&mut c, &d).await;
    assert!(
        r.is_ok() || r.as_ref().unwrap_err().code() == Code::FailedPrecondition,
        "{r:?}"
    );
    let map = placement::load(&three.pools[0]).await.unwrap();
    assert!(map.buckets.iter().all(|c| *c == ClusterId::HOME));
    // The waiting jobs are delivered from home.
    let mut s = crate::common::subscribe(&mut c, &["old"], 4, None).await;
    let mut got = Vec::new();
    for _ in 0..2 {
        let d = crate::common::next_delivery(&mut s, Duration::from_secs(5)).await;
        got.push(crate::common::payload_of(&d));
        crate::common::ack(&mut c, &d).await.unwrap();
    }
    assert!(got.contains(&"waiting".to_owned()), "{got:?}");
    drop(s);
    b.stop().await;
}

type Admin = pb::admin_service_client::AdminServiceClient<tonic::transport::Channel>;

async fn admin_client(addr: SocketAddr) -> Admin {
    Admin::new(
        tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    )
}

/// The clusters a response names as missing, in its metadata.
fn missing_header<T>(r: &tonic::Response<T>) -> Option<String> {
    r.metadata()
        .get("leaseq-unavailable-clusters")
        .map(|v| v.to_str().unwrap().to_owned())
}

/// A GET of the console's API (open: no --auth-file), in a new session.
async fn console_json(http: SocketAddr, path: &str) -> serde_json::Value {
    let r = crate::console::http(http, "GET", "/api/session", &[], "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let cookie = crate::console::session_cookie(&r.head);
    let r = crate::console::http(http, "GET", path, &[("Cookie", &cookie)], "").await;
    assert_eq!(r.status, 200, "{path}: {}", r.body);
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{path}: {e}: {}", r.body))
}

/// The in-flight count of `consumer` in the console's table of `queue`.
async fn console_in_flight(
    http: SocketAddr,
    queue: &str,
    consumer: &str,
) -> (i64, serde_json::Value) {
    let v = console_json(http, &format!("/api/queues/{queue}")).await;
    let n = v["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["consumer"] == consumer)
        .map_or(0, |c| c["in_flight"].as_i64().unwrap());
    (n, v)
}

/// Admin reads over three clusters with one stopped answer from the other
/// two and name the missing one (docs/SCALING.md, "Admin calls"); writes
/// that need it fail UNAVAILABLE naming it; the console's in-flight table
/// counts the leases held on every cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_reads_answer_without_a_stopped_cluster() {
    let three = Three::start().await;
    let dbs = three.databases();
    let b = over_three(&dbs).http().start().await;
    let http = b.http();
    let qs: Vec<String> = (0..3).map(|k| queues_on(k, 1, "r").remove(0)).collect();
    let mut c = lazy_client(b.addr);
    let mut admin = admin_client(b.addr).await;

    // On each cluster: a job held by consumer holder-K, one waiting.
    let mut ids = Vec::new();
    let mut streams = Vec::new();
    for (k, q) in qs.iter().enumerate() {
        ids.push(crate::common::enqueue(&mut c, q, "held").await);
        ids.push(crate::common::enqueue(&mut c, q, "waiting").await);
        let mut s = c
            .subscribe(pb::SubscribeRequest {
                queues: vec![q.clone()],
                consumer: format!("holder-{k}"),
                max_in_flight: 1,
                lease: Some(dur(Duration::from_secs(120))),
                accept: Vec::new(),
            })
            .await
            .unwrap()
            .into_inner();
        crate::common::next_delivery(&mut s, Duration::from_secs(10)).await;
        streams.push(s);
    }
    // The console's in-flight table reads every cluster, not only home.
    for (k, q) in qs.iter().enumerate() {
        let (n, v) = console_in_flight(http, q, &format!("holder-{k}")).await;
        assert_eq!(n, 1, "in flight of {q} (cluster {}): {v}", NAMES[k]);
        assert_eq!(v["unavailable_clusters"], serde_json::json!([]), "{v}");
    }

    // A leftover settings row of c's queue on a (as `leaseq.enqueue()` on
    // the wrong database leaves): with c down, the queue is missing with
    // c, not shown with a's leftover defaults.
    sqlx::query("insert into leaseq.queues (name) values ($1)")
        .bind(&qs[2])
        .execute(&three.pools[0])
        .await
        .unwrap();
    let fault = std::time::Instant::now();
    three.pgs[2].stop_immediate();
    let answered_within = Duration::from_secs(8);

    // Reads answer from a and b, and name c.
    let started = Instant::now();
    let r = admin
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .expect("ListQueues answers with a cluster down");
    assert!(
        started.elapsed() < answered_within,
        "{:?}",
        started.elapsed()
    );
    assert_eq!(missing_header(&r).as_deref(), Some("c"));
    let r = r.into_inner();
    assert_eq!(r.unavailable_clusters, vec!["c".to_owned()]);
    let names: Vec<&str> = r.queues.iter().map(|q| q.name.as_str()).collect();
    assert!(
        names.contains(&qs[0].as_str()) && names.contains(&qs[1].as_str()),
        "{names:?}"
    );
    assert!(!names.contains(&qs[2].as_str()), "{names:?}");
    // Queue a's figures are whole: one leased, one waiting.
    let qa = r.queues.iter().find(|q| q.name == qs[0]).unwrap();
    let st = qa.stats.as_ref().unwrap();
    assert_eq!((st.leased, st.available), (1, 1), "{qa:?}");

    let r = admin
        .list_jobs(pb::ListJobsRequest::default())
        .await
        .expect("ListJobs answers with a cluster down");
    assert_eq!(missing_header(&r).as_deref(), Some("c"));
    let r = r.into_inner();
    assert_eq!(r.unavailable_clusters, vec!["c".to_owned()]);
    let mut listed: Vec<String> = r.jobs.iter().map(|j| j.id.clone()).collect();
    listed.sort();
    let mut want = ids[..4].to_vec();
    want.sort();
    assert_eq!(listed, want);

    let r = admin
        .get_queue(pb::GetQueueRequest {
            queue: qs[0].clone(),
        })
        .await
        .expect("GetQueue of a queue on a cluster that answers");
    assert_eq!(missing_header(&r).as_deref(), Some("c"));
    admin
        .get_job(pb::GetJobRequest {
            job_id: ids[0].clone(),
        })
        .await
        .expect("GetJob of a job on a cluster that answers");

    // What only c could answer, and writes that need c: UNAVAILABLE naming c.
    let named_c = |e: tonic::Status| {
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        assert!(e.message().contains("cluster c"), "{e:?}");
    };
    named_c(
        admin
            .get_job(pb::GetJobRequest {
                job_id: ids[4].clone(),
            })
            .await
            .unwrap_err(),
    );
    named_c(
        admin
            .get_queue(pb::GetQueueRequest {
                queue: qs[2].clone(),
            })
            .await
            .unwrap_err(),
    );
    named_c(
        admin
            .pause_queue(pb::PauseQueueRequest {
                queue: qs[2].clone(),
            })
            .await
            .unwrap_err(),
    );
    named_c(
        admin
            .purge_dead_letters(pb::DeadLettersSelector {
                queue: qs[0].clone(),
                all: true,
                ..Default::default()
            })
            .await
            .unwrap_err(),
    );
    named_c(
        timeout(
            Duration::from_secs(20),
            c.enqueue(crate::common::job(&qs[2], "x")),
        )
        .await
        .expect("answered")
        .unwrap_err(),
    );
    // A write on a cluster that answers goes through.
    admin
        .pause_queue(pb::PauseQueueRequest {
            queue: qs[1].clone(),
        })
        .await
        .expect("pause a queue on b");
    admin
        .resume_queue(pb::ResumeQueueRequest {
            queue: qs[1].clone(),
        })
        .await
        .expect("resume a queue on b");

    // The console says which cluster is missing, and counts the others.
    let v = console_json(http, "/api/queues").await;
    assert_eq!(v["unavailable_clusters"], serde_json::json!(["c"]), "{v}");
    let (n, v) = console_in_flight(http, &qs[1], "holder-1").await;
    assert_eq!(n, 1, "{v}");
    assert_eq!(v["unavailable_clusters"], serde_json::json!(["c"]), "{v}");
    eprintln!("reads with c down checked in {:?}", fault.elapsed());

    // Back: complete answers again.
    three.pgs[2].start_again();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = admin.list_queues(pb::ListQueuesRequest::default()).await;
        if let Ok(r) = r
            && missing_header(&r).is_none()
        {
            let r = r.into_inner();
            assert!(r.unavailable_clusters.is_empty());
            assert!(r.queues.iter().any(|q| q.name == qs[2]));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "c not back in ListQueues within 30 s"
        );
        sleep(Duration::from_millis(200)).await;
    }
    drop(streams);
    b.stop().await;
}

/// Stray jobs, on a cluster that does not hold their queue, are moved to
/// their queue's cluster by the brokers' sweep and delivered exactly once
/// (the history checker), under load: jobs put by `leaseq.enqueue()` on the
/// wrong database, and a job left on both sides by a copy interrupted
/// between its two commits (the tombstone on the destination keeps it from
/// being delivered a second time after its ack).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stray_jobs_are_swept_to_their_cluster() {
    let three = Three::start().await;
    let dbs = three.databases();
    let sweep = |cfg: &mut leaseq_server::Config| cfg.sweep_interval = Duration::from_millis(300);
    let b0 = over_three(&dbs).config(sweep).start().await;
    let b1 = over_three(&dbs).config(sweep).start().await;
    let queues: Vec<String> = (0..3).flat_map(|k| queues_on(k, 1, "s")).collect();
    // queues[k] lives on cluster k.

    let h = History::new();
    let mut run = Run::start(&h, &[b0.addr, b1.addr], &queues, 200);
    run.watch(&three, &queues);
    sleep(Duration::from_secs(1)).await;

    // An interrupted copy of a job of queues[0] from c to a: committed on
    // a with its tombstone, then delivered and acked there; the source row
    // on c is still there (its transaction "rolled back").
    let id = uuid::Uuid::now_v7();
    let payload = "interrupted-copy";
    let row = |k: usize| {
        let q = queues[0].clone();
        let pool = three.pools[k].clone();
        async move {
            sqlx::query(
                "insert into leaseq.jobs (id, queue, run_at, payload) values ($1, $2, now(), $3)",
            )
            .bind(id)
            .bind(q)
            .bind(payload.as_bytes())
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    sqlx::query("insert into leaseq.moved_jobs (id) values ($1)")
        .bind(id)
        .execute(&three.pools[0])
        .await
        .unwrap();
    row(0).await;
    h.enqueue_ok(payload, &id.to_string());
    sqlx::query("select pg_notify('leaseq_wake', 'test:0:' || $1)")
        .bind(&queues[0])
        .execute(&three.pools[0])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while sqlx::query_scalar::<_, bool>("select exists (select 1 from leaseq.jobs where id = $1)")
        .bind(id)
        .fetch_one(&three.pools[0])
        .await
        .unwrap()
    {
        assert!(
            Instant::now() < deadline,
            "the copied job was not acked on a"
        );
        sleep(Duration::from_millis(100)).await;
    }
    row(2).await;

    // leaseq.enqueue() on the wrong database, for every queue, while the
    // load runs: each stray is swept to its queue's cluster.
    for n in 0..30 {
        let k = n % 3;
        let wrong = (k + 1 + n % 2) % 3;
        let payload = format!("stray{n:03}");
        let id: uuid::Uuid = sqlx::query_scalar("select leaseq.enqueue($1, $2::bytea)")
            .bind(&queues[k])
            .bind(payload.as_bytes())
            .fetch_one(&three.pools[wrong])
            .await
            .unwrap();
        h.enqueue_ok(&payload, &id.to_string());
        sleep(Duration::from_millis(50)).await;
    }
    // Swept: no cluster holds a job of a queue it does not own.
    let deadline = Instant::now() + Duration::from_secs(20);
    'swept: loop {
        let mut stray = 0;
        for k in 0..3 {
            let others: Vec<String> = (0..3)
                .filter(|j| *j != k)
                .map(|j| queues[j].clone())
                .collect();
            stray += three.live(k, &others).await;
        }
        if stray == 0 {
            break 'swept;
        }
        assert!(
            Instant::now() < deadline,
            "{stray} stray jobs left after 20 s"
        );
        sleep(Duration::from_millis(100)).await;
    }
    run.finish("scaling-stray-sweep", &three, b0.addr, &queues)
        .await;
    b0.stop().await;
    b1.stop().await;
}

/// A bucket move takes the queue's settings and its completed records with
/// it: a settings row the destination had already (as `leaseq.enqueue()`
/// on that database leaves) is replaced by the source's, and the completed
/// records kept for the queue's retention leave the source (whose
/// retention loop no longer sees the queue once its row is gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bucket_move_carries_settings_and_completed_records() {
    let three = Three::start().await;
    let dbs = three.databases();
    let b = over_three(&dbs).start().await;
    let q = queues_on(0, 1, "k").remove(0);
    let mut admin = admin_client(b.addr).await;
    admin
        .update_queue(pb::UpdateQueueRequest {
            queue: q.clone(),
            create: true,
            max_attempts: Some(3),
            concurrency_limit: Some(2),
            completed_retention: Some(dur(Duration::from_secs(3600))),
            ..Default::default()
        })
        .await
        .expect("settings");
    let mut c = lazy_client(b.addr);
    let mut s = crate::common::subscribe(&mut c, &[q.as_str()], 8, None).await;
    for i in 0..3 {
        crate::common::enqueue(&mut c, &q, &format!("done{i}")).await;
        let d = crate::common::next_delivery(&mut s, Duration::from_secs(10)).await;
        crate::common::ack(&mut c, &d).await.expect("ack");
    }
    drop(s);
    let completed_on = |k: usize| {
        let pool = three.pools[k].clone();
        let q = q.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "select count(*) from leaseq.completed_jobs where queue = $1",
            )
            .bind(q)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(completed_on(0).await, 3);
    // A stale row with the defaults on the destination.
    sqlx::query("insert into leaseq.queues (name) values ($1)")
        .bind(&q)
        .execute(&three.pools[1])
        .await
        .unwrap();

    let moved = placement::move_bucket(
        &three.placement_pools(),
        bucket_of(&q),
        ClusterId(1),
        &MoveOptions {
            grace: Duration::from_millis(500),
            limit: Duration::from_secs(60),
            ..MoveOptions::default()
        },
    )
    .await
    .expect("bucket moved");
    assert_eq!(moved.completed, 3, "{moved:?}");
    assert_eq!(completed_on(0).await, 0);
    assert_eq!(completed_on(1).await, 3);
    let (attempts, limit, retention): (i32, Option<i32>, Option<i64>) = sqlx::query_as(
        "select max_attempts, concurrency_limit, completed_retention_ms from leaseq.queues where name = $1",
    )
    .bind(&q)
    .fetch_one(&three.pools[1])
    .await
    .unwrap();
    assert_eq!((attempts, limit, retention), (3, Some(2), Some(3_600_000)));
    // Through the broker, once it follows the new map.
    sleep(Duration::from_secs(1)).await;
    let info = admin
        .get_queue(pb::GetQueueRequest { queue: q.clone() })
        .await
        .unwrap()
        .into_inner();
    let settings = info.settings.unwrap();
    assert_eq!((settings.max_attempts, settings.concurrency_limit), (3, 2));
    let listed = admin
        .list_jobs(pb::ListJobsRequest {
            queue: q.clone(),
            state: pb::JobState::Completed as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.jobs.len(), 3);
    b.stop().await;
}

/// Case 3 of issue 32: an Enqueue with a dedup key during a bucket move.
/// Job X (dedup key K, delayed an hour) waits on its queue's cluster; the
/// bucket starts moving; an Enqueue of the same queue and key, routed to
/// the destination by then, was answered `duplicate: false` with a new id
/// (dedup was checked on the destination only), and the move's copy of X
/// then met that job's key on the destination and skipped X (`on conflict
/// do nothing`) before deleting it from the source: X, answered OK, was
/// gone from both clusters. The Enqueue during the move must find X.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dedup_key_enqueued_during_a_bucket_move_finds_the_job_being_moved() {
    let three = Three::start().await;
    let dbs = three.databases();
    let b = over_three(&dbs).start().await;
    let q = queues_on(0, 1, "dd").remove(0);
    let mut c = lazy_client(b.addr);
    let keyed = |payload: &str| pb::EnqueueRequest {
        dedup_key: "K".into(),
        delay: Some(dur(Duration::from_secs(3600))),
        ..crate::common::job(&q, payload)
    };
    let x = c.enqueue(keyed("x")).await.unwrap().into_inner();
    assert!(!x.duplicate);

    let pools = three.placement_pools();
    let bucket = bucket_of(&q);
    let mover = tokio::spawn(async move {
        placement::move_bucket(
            &pools,
            bucket,
            ClusterId(1),
            &MoveOptions {
                grace: Duration::from_secs(2),
                limit: Duration::from_secs(60),
                ..MoveOptions::default()
            },
        )
        .await
    });
    // The move is announced; the broker follows (placement_interval is
    // 200 ms) and routes the queue to the destination, well within the
    // move's grace, before any job is copied.
    let announced = Instant::now() + Duration::from_secs(20);
    loop {
        let moving: Option<i16> =
            sqlx::query_scalar("select moving_to from leaseq.placement where bucket = $1")
                .bind(bucket as i32)
                .fetch_one(&three.pools[0])
                .await
                .unwrap();
        if moving == Some(1) {
            break;
        }
        assert!(Instant::now() < announced, "the move was never announced");
        sleep(Duration::from_millis(20)).await;
    }
    sleep(Duration::from_millis(600)).await;
    let y = c.enqueue(keyed("y")).await.unwrap().into_inner();
    let moved = mover.await.unwrap().expect("bucket moved");
    assert_eq!(moved.jobs, 1, "{moved:?}");
    assert_eq!(
        (y.duplicate, y.job_id.as_str()),
        (true, x.job_id.as_str()),
        "the Enqueue during the move did not see the job of the same key"
    );
    // X lives on the destination, and nothing else of the queue anywhere.
    let ids = |k: usize| {
        let (pool, q) = (three.pools[k].clone(), q.clone());
        async move {
            sqlx::query_scalar::<_, String>(
                "select id::text from leaseq.jobs where queue = $1 order by id",
            )
            .bind(q)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(ids(0).await, Vec::<String>::new());
    assert_eq!(ids(1).await, vec![x.job_id.clone()]);
    assert_eq!(ids(2).await, Vec::<String>::new());
    b.stop().await;
}

/// Found by the fault suite (faults::moves): a bucket move killed between
/// the two commits of a copy leaves a job X (dedup key K) on both
/// clusters, the destination's row tombstoned, the source's paused; X is
/// delivered from the destination and acked there. Until the move runs
/// again, an Enqueue with key K looked on the source, found X's stale row
/// and was answered `duplicate: true` with X's id: a job already done, so
/// the Enqueue created nothing. Once X is acked its key is free: the
/// Enqueue creates a job, delivered in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dedup_key_is_free_once_its_job_copied_by_a_killed_move_is_acked() {
    let three = Three::start().await;
    let b = over_three(&three.databases()).start().await;
    let q = queues_on(0, 1, "kk").remove(0);
    let bucket = bucket_of(&q);
    let mut c = lazy_client(b.addr);
    let keyed = |payload: &str| pb::EnqueueRequest {
        dedup_key: "K".into(),
        ..crate::common::job(&q, payload)
    };
    let x = c.enqueue(keyed("x")).await.unwrap().into_inner();
    assert!(!x.duplicate);

    // What `leaseq placement move` leaves when killed after the copy of X
    // committed on b and before its delete on a: the move announced (a
    // new epoch), the queue fenced (paused) on a, X on both clusters, its
    // tombstone on b.
    let epoch: i64 = sqlx::query_scalar(
        "with m as (update leaseq.placement set moving_to = 1 where bucket = $1)
         update leaseq.placement_epoch set epoch = epoch + 1 returning epoch",
    )
    .bind(bucket as i32)
    .fetch_one(&three.pools[0])
    .await
    .unwrap();
    sqlx::query("update leaseq.queues set paused = true where name = $1")
        .bind(&q)
        .execute(&three.pools[0])
        .await
        .unwrap();
    let row: String =
        sqlx::query_scalar("select row_to_json(j)::text from leaseq.jobs j where id = $1::uuid")
            .bind(&x.job_id)
            .fetch_one(&three.pools[0])
            .await
            .unwrap();
    for sql in [
        "insert into leaseq.queues (name) values ($2) on conflict do nothing",
        "insert into leaseq.moved_jobs (id) select (r).id
           from (select json_populate_record(null::leaseq.jobs, $1::json) r) s",
        "insert into leaseq.jobs select * from json_populate_record(null::leaseq.jobs, $1::json)",
    ] {
        sqlx::query(sql)
            .bind(&row)
            .bind(&q)
            .execute(&three.pools[1])
            .await
            .unwrap();
    }
    // The broker routes the queue to b.
    let deadline = Instant::now() + Duration::from_secs(20);
    while sqlx::query_scalar::<_, i64>(
        "select count(*) from leaseq.placement_brokers where epoch < $1",
    )
    .bind(epoch)
    .fetch_one(&three.pools[0])
    .await
    .unwrap()
        > 0
    {
        assert!(Instant::now() < deadline, "the broker never followed");
        sleep(Duration::from_millis(50)).await;
    }

    // X is delivered from b and acked.
    let mut s = c
        .subscribe(pb::SubscribeRequest {
            queues: vec![q.clone()],
            max_in_flight: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let d = crate::common::next_delivery(&mut s, Duration::from_secs(10)).await;
    assert_eq!(d.job.as_ref().unwrap().id, x.job_id);
    crate::common::ack(&mut c, &d).await.expect("X acked");

    // The key is free: a new job, delivered.
    let y = c.enqueue(keyed("y")).await.unwrap().into_inner();
    assert!(
        !y.duplicate,
        "answered duplicate of {} ({}), which was acked",
        y.job_id, x.job_id
    );
    let d = crate::common::next_delivery(&mut s, Duration::from_secs(10)).await;
    assert_eq!(d.job.as_ref().unwrap().id, y.job_id);
    crate::common::ack(&mut c, &d).await.expect("Y acked");
    drop(s);
    b.stop().await;
}

/// The stray sweep and the bucket move copy with the same statement; a
/// stray job whose dedup key is taken by a live job on its queue's own
/// cluster was skipped by the copy (`on conflict do nothing`), then
/// deleted from where it was: gone. A job answered OK is never dropped:
/// it arrives without its dedup key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stray_job_whose_dedup_key_is_taken_is_moved_not_dropped() {
    let three = Three::start().await;
    // A broker migrates the three databases and writes the first map.
    over_three(&three.databases()).start().await.stop().await;
    let q = queues_on(0, 1, "sk").remove(0);
    // The queue's own cluster holds a live job with key K ...
    let insert = "select leaseq.enqueue($1, 'p'::bytea, dedup_key => 'K')::text";
    let own: String = sqlx::query_scalar(insert)
        .bind(&q)
        .fetch_one(&three.pools[0])
        .await
        .unwrap();
    // ... and a stray of the same queue and key sits on another (enqueued
    // in SQL on the wrong database).
    let stray: String = sqlx::query_scalar(insert)
        .bind(&q)
        .fetch_one(&three.pools[2])
        .await
        .unwrap();
    let swept = placement::sweep(&three.placement_pools(), 100)
        .await
        .expect("sweep");
    assert_eq!(swept.jobs, 1, "{swept:?}");
    let rows: Vec<(String, Option<String>)> =
        sqlx::query_as("select id::text, dedup_key from leaseq.jobs where queue = $1 order by id")
            .bind(&q)
            .fetch_all(&three.pools[0])
            .await
            .unwrap();
    let mut want = vec![(own, Some("K".to_owned())), (stray, None)];
    want.sort();
    assert_eq!(rows, want);
    let left: i64 = sqlx::query_scalar("select count(*) from leaseq.jobs")
        .fetch_one(&three.pools[2])
        .await
        .unwrap();
    assert_eq!(left, 0);
}
