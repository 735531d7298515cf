//! `leaseq bench`: a load generator against a running broker, and the raw-SQL
//! baseline it is compared with.
//!
//! Every scenario is bounded by `--duration` (and the backlog fill by its
//! count); it prints a live progress line on stderr and, with `--json`, a
//! one-line JSON summary as its last line on stdout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{Args, ValueEnum};
use std::sync::Mutex;

use crate::cli::ClientChannel;
use crate::pb;
use crate::pb::queue_service_client::QueueServiceClient;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Scenario {
    /// EnqueueBatch producers, Subscribe consumers, unary Acks, flat out.
    Throughput,
    /// Single-job Enqueue calls from many concurrent clients.
    Enqueue,
    /// Enqueue at a fixed --rate; measures enqueue → delivery latency.
    Latency,
    /// --streams idle-ish Subscribe streams on one broker, fed at --rate.
    Streams,
    /// Fill --backlog jobs first, then run the throughput scenario.
    Backlog,
    /// The raw-SQL pattern straight against --database-url (no broker).
    Baseline,
}

/// How consumers settle their jobs.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum AckMode {
    /// One unary Ack call per job.
    Unary,
    /// AckBatch calls: each consumer sends what it has finished as one call,
    /// one call in flight at a time.
    Batch,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Broker address.
    #[arg(long, env = "LEASEQ_ADDR", default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    #[arg(long, value_enum, default_value_t = Scenario::Throughput)]
    pub scenario: Scenario,
    /// Seconds to measure.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Print a JSON summary as the last line.
    #[arg(long)]
    pub json: bool,
    /// Producer tasks (for `enqueue`: concurrent single-job clients, e.g. 64).
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Consumer streams.
    #[arg(long, default_value_t = 4)]
    pub consumers: usize,
    /// Jobs per EnqueueBatch (and per raw-SQL transaction in the baseline).
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// How consumers ack: one Ack per job, or AckBatch.
    #[arg(long, value_enum, default_value_t = AckMode::Unary)]
    pub ack: AckMode,
    /// The broker's process id: report its CPU time per job (Linux /proc).
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// The PostgreSQL postmaster's process id (first line of
    /// `postmaster.pid` in the data directory): report the CPU time of the
    /// whole cluster (postmaster, backends, vacuum workers) per job.
    #[arg(long)]
    pub postgres_pid: Option<u32>,
    /// Print a line with the rate of the last N seconds (and, with
    /// --database-url, the size of leaseq.jobs) every N seconds: for soaks.
    #[arg(long)]
    pub report_every: Option<u64>,
    /// Credits per consumer stream.
    #[arg(long, default_value_t = 256)]
    pub max_in_flight: u32,
    /// Payload bytes.
    #[arg(long, default_value_t = 64)]
    pub payload_bytes: usize,
    /// Jobs per second for `latency` and `streams`.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Streams for `streams`.
    #[arg(long, default_value_t = 1000)]
    pub streams: usize,
    /// Jobs enqueued before measuring, for `backlog`.
    #[arg(long, default_value_t = 1_000_000)]
    pub backlog: u64,
    /// Queue name (a fresh one per run by default).
    #[arg(long)]
    pub queue: Option<String>,
    /// Database for `baseline`, and for `--compare`.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// After the run, run the raw-SQL baseline (batches of 100) against
    /// --database-url for the same duration and print the ratio.
    #[arg(long)]
    pub compare: bool,
    #[command(flatten)]
    pub security: crate::cli::ClientSecurity,
}

#[derive(Default)]
struct Counters {
    enqueued: AtomicU64,
    delivered: AtomicU64,
    acked: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    /// Counts an error; the first few are printed so a run explains itself.
    fn error(&self, e: &tonic::Status) -> u64 {
        let n = self.errors.fetch_add(1, Ordering::Relaxed);
        if n < 3 {
            eprintln!("\nerror: {:?}: {}", e.code(), e.message());
        }
        n
    }
}

/// Latency samples in microseconds, as a histogram of fixed size (a
/// 10-minute soak records tens of millions): 10 µs buckets below 100 ms,
/// 1 ms buckets up to 60 s, one bucket beyond; the maximum is exact.
struct Samples(Mutex<(Vec<u64>, u64)>);

const FINE_US: u64 = 10;
const FINE_BUCKETS: u64 = 10_000;
const COARSE_US: u64 = 1_000;
const COARSE_BUCKETS: u64 = 59_900;

impl Default for Samples {
    fn default() -> Self {
        Samples(Mutex::new((
            vec![0; (FINE_BUCKETS + COARSE_BUCKETS + 1) as usize],
            0,
        )))
    }
}

impl Samples {
    fn bucket(us: u64) -> usize {
        let fine_end = FINE_US * FINE_BUCKETS;
        let b = if us < fine_end {
            us / FINE_US
        } else {
            (FINE_BUCKETS + (us - fine_end) / COARSE_US).min(FINE_BUCKETS + COARSE_BUCKETS)
        };
        b as usize
    }

    /// The middle of a bucket, in µs.
    fn value(b: usize) -> u64 {
        let b = b as u64;
        if b < FINE_BUCKETS {
            b * FINE_US + FINE_US / 2
        } else {
            FINE_US * FINE_BUCKETS + (b - FINE_BUCKETS) * COARSE_US + COARSE_US / 2
        }
    }

    fn push(&self, us: u64) {
        let mut g = self.0.lock().expect("poisoned");
        g.0[Self::bucket(us)] += 1;
        g.1 = g.1.max(us);
    }

    /// p50, p99 and max in milliseconds.
    fn percentiles(&self) -> (f64, f64, f64) {
        let g = self.0.lock().expect("poisoned");
        let n: u64 = g.0.iter().sum();
        if n == 0 {
            return (f64::NAN, f64::NAN, f64::NAN);
        }
        let at = |p: f64| {
            let rank = ((n - 1) as f64 * p).round() as u64;
            let mut seen = 0;
            for (b, c) in g.0.iter().enumerate() {
                seen += c;
                if seen > rank {
                    return Self::value(b).min(g.1) as f64 / 1000.0;
                }
            }
            g.1 as f64 / 1000.0
        };
        (at(0.5), at(0.99), g.1 as f64 / 1000.0)
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A payload whose first 8 bytes are the send time (µs since the epoch).
fn payload(size: usize) -> Vec<u8> {
    let mut p = now_us().to_le_bytes().to_vec();
    p.resize(size.max(8), b'x');
    p
}

fn sent_at(p: &[u8]) -> Option<u64> {
    p.get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.scenario == Scenario::Baseline {
        return baseline(args).await;
    }
    let channel = crate::cli::connect(&args.addr, &args.security).await?;
    let queue = args
        .queue
        .clone()
        .unwrap_or_else(|| format!("bench-{}", uuid::Uuid::new_v4().simple()));
    let counters = Arc::new(Counters::default());
    let samples = Arc::new(Samples::default());
    let stop = Arc::new(AtomicBool::new(false));

    if args.scenario == Scenario::Backlog {
        fill_backlog(&channel, &queue, &args).await?;
    }

    let mut tasks = tokio::task::JoinSet::new();
    let consumers = match args.scenario {
        Scenario::Enqueue => 0,
        Scenario::Streams => args.streams,
        _ => args.consumers,
    };
    for i in 0..consumers {
        let mut client = QueueServiceClient::new(channel.clone());
        let (queue, counters, samples, stop) = (
            queue.clone(),
            counters.clone(),
            samples.clone(),
            stop.clone(),
        );
        let max_in_flight = if args.scenario == Scenario::Streams {
            4
        } else {
            args.max_in_flight
        };
        let acks = (args.ack == AckMode::Batch).then(|| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(ack_batches(client.clone(), rx, counters.clone()));
            tx
        });
        tasks.spawn(async move {
            let mut stream = client
                .subscribe(pb::SubscribeRequest {
                    queues: vec![queue],
                    consumer: format!("bench-{i}"),
                    max_in_flight,
                    lease: None,
                })
                .await?
                .into_inner();
            // Runs until aborted at the end of the measurement (a timeout
            // around `message()` could drop a half-read delivery).
            while !stop.load(Ordering::Relaxed) {
                let Some(msg) = stream.message().await? else {
                    break;
                };
                let Some(pb::subscribe_response::Kind::Delivery(d)) = msg.kind else {
                    continue;
                };
                let job = d.job.unwrap_or_default();
                if let Some(t) = sent_at(&job.payload) {
                    samples.push(now_us().saturating_sub(t));
                }
                counters.delivered.fetch_add(1, Ordering::Relaxed);
                if let Some(acks) = &acks {
                    let _ = acks.send(pb::AckRequest {
                        job_id: job.id,
                        lease_token: d.lease_token,
                    });
                    continue;
                }
                let mut client = client.clone();
                let counters = counters.clone();
                tokio::spawn(async move {
                    let r = client
                        .ack(pb::AckRequest {
                            job_id: job.id,
                            lease_token: d.lease_token,
                        })
                        .await;
                    match r {
                        Ok(_) => counters.acked.fetch_add(1, Ordering::Relaxed),
                        Err(e) => counters.error(&e),
                    };
                });
            }
            anyhow::Ok(())
        });
    }
    // Let streams register before producing.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let cpu_before = CpuTimes::read(&args);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration);
    match args.scenario {
        Scenario::Throughput | Scenario::Backlog => {
            for _ in 0..args.producers {
                let mut client = QueueServiceClient::new(channel.clone());
                let (queue, counters, stop, args) =
                    (queue.clone(), counters.clone(), stop.clone(), args.clone());
                tasks.spawn(async move {
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        let jobs = (0..args.batch)
                            .map(|_| pb::EnqueueRequest {
                                queue: queue.clone(),
                                payload: payload(args.payload_bytes),
                                ..Default::default()
                            })
                            .collect();
                        match client.enqueue_batch(pb::EnqueueBatchRequest { jobs }).await {
                            Ok(_) => counters
                                .enqueued
                                .fetch_add(args.batch as u64, Ordering::Relaxed),
                            Err(e) => counters.error(&e),
                        };
                    }
                    anyhow::Ok(())
                });
            }
        }
        Scenario::Enqueue => {
            // Many clients, each one call at a time: only server-side
            // coalescing can batch these.
            for _ in 0..args.producers {
                let mut client = QueueServiceClient::new(channel.clone());
                let (queue, counters, stop, size) = (
                    queue.clone(),
                    counters.clone(),
                    stop.clone(),
                    args.payload_bytes,
                );
                tasks.spawn(async move {
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        let r = client
                            .enqueue(pb::EnqueueRequest {
                                queue: queue.clone(),
                                payload: payload(size),
                                ..Default::default()
                            })
                            .await;
                        match r {
                            Ok(_) => counters.enqueued.fetch_add(1, Ordering::Relaxed),
                            Err(e) => counters.error(&e),
                        };
                    }
                    anyhow::Ok(())
                });
            }
        }
        Scenario::Latency | Scenario::Streams => {
            let client = QueueServiceClient::new(channel.clone());
            let (queue, counters, stop, size, rate) = (
                queue.clone(),
                counters.clone(),
                stop.clone(),
                args.payload_bytes,
                args.rate.max(1),
            );
            tasks.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    tick.tick().await;
                    let mut client = client.clone();
                    let queue = queue.clone();
                    let counters = counters.clone();
                    tokio::spawn(async move {
                        let r = client
                            .enqueue(pb::EnqueueRequest {
                                queue,
                                payload: payload(size),
                                ..Default::default()
                            })
                            .await;
                        match r {
                            Ok(_) => counters.enqueued.fetch_add(1, Ordering::Relaxed),
                            Err(e) => counters.error(&e),
                        };
                    });
                }
                anyhow::Ok(())
            });
        }
        Scenario::Baseline => unreachable!(),
    }

    let report_pool = match (&args.report_every, &args.database_url) {
        (Some(_), Some(url)) => Some(leaseq_server::store::connect(url, 1).await?),
        _ => None,
    };
    let mut report = (Instant::now(), 0u64);
    let mut last = (Instant::now(), 0u64);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let done = if consumers == 0 {
            counters.enqueued.load(Ordering::Relaxed)
        } else {
            counters.acked.load(Ordering::Relaxed)
        };
        if let Some(every) = args.report_every
            && report.0.elapsed() >= Duration::from_secs(every)
        {
            let rate = (done - report.1) as f64 / report.0.elapsed().as_secs_f64();
            report = (Instant::now(), done);
            let size = match &report_pool {
                Some(pool) => {
                    sqlx::query_scalar::<_, i64>("select pg_total_relation_size('leaseq.jobs')")
                        .fetch_one(pool)
                        .await
                        .map_or_else(
                            |e| e.to_string(),
                            |b| format!("{:.1} MiB", b as f64 / 1048576.0),
                        )
                }
                None => "n/a".into(),
            };
            eprintln!(
                "\nreport t={:.0}s jobs_per_s={rate:.0} jobs_table={size}",
                started.elapsed().as_secs_f64()
            );
        }
        let rate = (done - last.1) as f64 / last.0.elapsed().as_secs_f64();
        last = (Instant::now(), done);
        eprint!(
            "\r[{:>4.0}s] enqueued={} delivered={} acked={} errors={} rate={:.0}/s   ",
            started.elapsed().as_secs_f64(),
            counters.enqueued.load(Ordering::Relaxed),
            counters.delivered.load(Ordering::Relaxed),
            counters.acked.load(Ordering::Relaxed),
            counters.errors.load(Ordering::Relaxed),
            rate
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = CpuTimes::read(&args).since(&cpu_before);
    stop.store(true, Ordering::Relaxed);
    eprintln!();
    tasks.abort_all();
    let done = if consumers == 0 {
        counters.enqueued.load(Ordering::Relaxed)
    } else {
        counters.acked.load(Ordering::Relaxed)
    };
    let (p50, p99, max) = samples.percentiles();
    let jobs_per_s = done as f64 / elapsed;
    let baseline_jobs_per_s = if args.compare {
        let mut b = args.clone();
        b.batch = 100;
        Some(baseline_rate(&b).await?)
    } else {
        None
    };
    let ratio = baseline_jobs_per_s.map(|b| jobs_per_s / b);
    if let (Some(b), Some(r)) = (baseline_jobs_per_s, ratio) {
        println!("baseline (raw SQL, batches of 100) jobs_per_s={b:.0} ratio={r:.2}");
    }
    if done > 0 {
        let per_job = |secs: Option<f64>| {
            secs.map_or("n/a".to_owned(), |s| {
                format!("{:.1}", s * 1e6 / done as f64)
            })
        };
        println!(
            "cpu_us_per_job broker={} client={} postgres={}",
            per_job(cpu.broker),
            per_job(cpu.client),
            per_job(cpu.postgres)
        );
    }
    let rss_kb = own_rss_kb();
    println!(
        "scenario={:?} jobs={} seconds={:.1} jobs_per_s={:.0} p50_ms={:.2} p99_ms={:.2} max_ms={:.2} errors={}",
        args.scenario,
        done,
        elapsed,
        jobs_per_s,
        p50,
        p99,
        max,
        counters.errors.load(Ordering::Relaxed)
    );
    if args.json {
        println!(
            "{{\"scenario\":\"{:?}\",\"jobs\":{},\"seconds\":{:.3},\"jobs_per_s\":{:.1},\"p50_ms\":{},\"p99_ms\":{},\"max_ms\":{},\"errors\":{},\"enqueued\":{},\"delivered\":{},\"client_rss_kb\":{},\"baseline_jobs_per_s\":{},\"ratio\":{}}}",
            args.scenario,
            done,
            elapsed,
            jobs_per_s,
            json_num(p50),
            json_num(p99),
            json_num(max),
            counters.errors.load(Ordering::Relaxed),
            counters.enqueued.load(Ordering::Relaxed),
            counters.delivered.load(Ordering::Relaxed),
            rss_kb,
            baseline_jobs_per_s.map_or("null".into(), |b| format!("{b:.1}")),
            ratio.map_or("null".into(), |r| format!("{r:.3}")),
        );
    }
    Ok(())
}

fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "null".into()
    }
}

/// This process's resident set, from /proc (0 where unavailable).
fn own_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

async fn fill_backlog(
    channel: &ClientChannel,
    queue: &str,
    args: &BenchArgs,
) -> anyhow::Result<()> {
    let mut client = QueueServiceClient::new(channel.clone());
    let mut done = 0u64;
    let started = Instant::now();
    while done < args.backlog {
        let n = (args.backlog - done).min(1000) as usize;
        let jobs = (0..n)
            .map(|_| pb::EnqueueRequest {
                queue: queue.to_owned(),
                payload: vec![b'x'; args.payload_bytes],
                ..Default::default()
            })
            .collect();
        client
            .enqueue_batch(pb::EnqueueBatchRequest { jobs })
            .await?;
        done += n as u64;
        if done % 50_000 < 1000 {
            eprint!("\rbacklog: {done}/{} jobs", args.backlog);
        }
    }
    eprintln!(
        "\rbacklog: {done} jobs in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The blog-post pattern straight in SQL: insert, lease with `for update skip
/// locked`, delete. `--batch 1` is one job per transaction.
async fn baseline(args: BenchArgs) -> anyhow::Result<()> {
    let jobs_per_s = baseline_rate(&args).await?;
    if args.json {
        println!(
            "{{\"scenario\":\"Baseline\",\"batch\":{},\"jobs_per_s\":{:.1},\"p50_ms\":null,\"p99_ms\":null}}",
            args.batch, jobs_per_s
        );
    }
    Ok(())
}

/// Runs the raw-SQL pattern for `--duration` and returns jobs per second.
async fn baseline_rate(args: &BenchArgs) -> anyhow::Result<f64> {
    let url = args
        .database_url
        .clone()
        .context("baseline needs --database-url / DATABASE_URL")?;
    let workers = args.producers.max(1) * 2;
    let pool = leaseq_server::store::connect(&url, workers as u32 + 1).await?;
    sqlx::query(
        "create table if not exists leaseq_bench_raw (
            id bigserial primary key, payload bytea not null,
            leased_until timestamptz)",
    )
    .execute(&pool)
    .await?;
    sqlx::query("truncate leaseq_bench_raw")
        .execute(&pool)
        .await?;
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (pool, done, batch, size) = (
            pool.clone(),
            done.clone(),
            args.batch.max(1),
            args.payload_bytes,
        );
        tasks.spawn(async move {
            while Instant::now() < deadline {
                let payloads: Vec<Vec<u8>> = (0..batch).map(|_| vec![b'x'; size]).collect();
                sqlx::query("insert into leaseq_bench_raw (payload) select unnest($1::bytea[])")
                    .bind(payloads)
                    .execute(&pool)
                    .await?;
                let ids: Vec<i64> = sqlx::query_scalar(
                    "update leaseq_bench_raw set leased_until = now() + interval '30 seconds'
                     where id in (select id from leaseq_bench_raw where leased_until is null
                                  order by id limit $1 for update skip locked)
                     returning id",
                )
                .bind(batch as i64)
                .fetch_all(&pool)
                .await?;
                sqlx::query("delete from leaseq_bench_raw where id = any($1)")
                    .bind(&ids)
                    .execute(&pool)
                    .await?;
                done.fetch_add(ids.len() as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        });
    }
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        eprint!(
            "\r[{:>4.0}s] raw-sql jobs={} ",
            started.elapsed().as_secs_f64(),
            done.load(Ordering::Relaxed)
        );
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    eprintln!();
    let elapsed = started.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    let jobs_per_s = n as f64 / elapsed;
    println!(
        "scenario=Baseline batch={} workers={} jobs={} seconds={:.1} jobs_per_s={:.0}",
        args.batch, workers, n, elapsed, jobs_per_s
    );
    sqlx::query("drop table leaseq_bench_raw")
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(jobs_per_s)
}

/// Acks a consumer's finished jobs with AckBatch: whatever piled up while the
/// previous call ran goes in the next one (group commit on the client side).
async fn ack_batches(
    mut client: QueueServiceClient<ClientChannel>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<pb::AckRequest>,
    counters: Arc<Counters>,
) {
    while let Some(first) = rx.recv().await {
        let mut acks = vec![first];
        while acks.len() < 1000 {
            match rx.try_recv() {
                Ok(a) => acks.push(a),
                Err(_) => break,
            }
        }
        let n = acks.len() as u64;
        match client.ack_batch(pb::AckBatchRequest { acks }).await {
            Ok(r) => {
                let ok = r
                    .into_inner()
                    .results
                    .iter()
                    .filter(|r| r.code == 0)
                    .count() as u64;
                counters.acked.fetch_add(ok, Ordering::Relaxed);
                counters.errors.fetch_add(n - ok, Ordering::Relaxed);
            }
            Err(e) => {
                counters.error(&e);
            }
        }
    }
}

/// CPU seconds (user + system) consumed so far by the broker, this process,
/// and the PostgreSQL cluster, read from Linux's /proc (None elsewhere, or
/// when the pid was not given).
struct CpuTimes {
    broker: Option<f64>,
    client: Option<f64>,
    postgres: Option<f64>,
}

impl CpuTimes {
    fn read(args: &BenchArgs) -> CpuTimes {
        CpuTimes {
            broker: args.broker_pid.and_then(|p| proc_cpu(p, true)),
            client: proc_cpu(std::process::id(), false),
            postgres: args.postgres_pid.and_then(cluster_cpu),
        }
    }

    fn since(&self, before: &CpuTimes) -> CpuTimes {
        let d = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
        CpuTimes {
            broker: d(self.broker, before.broker),
            client: d(self.client, before.client),
            postgres: d(self.postgres, before.postgres),
        }
    }
}

/// Fields of /proc/PID/stat after the command name.
fn proc_stat(pid: u32) -> Option<Vec<u64>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.rsplit_once(')')?.1;
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

/// CPU seconds of a process; with `children`, also of its exited children.
fn proc_cpu(pid: u32, children: bool) -> Option<f64> {
    let f = proc_stat(pid)?;
    // utime, stime, cutime, cstime are fields 14-17 (11-14 after the name).
    let ticks = f.get(11)? + f.get(12)? + if children { f.get(13)? + f.get(14)? } else { 0 };
    Some(ticks as f64 / clock_ticks())
}

/// CPU seconds of a PostgreSQL cluster: its postmaster with every exited
/// child (vacuum workers, closed backends), plus its live children.
fn cluster_cpu(postmaster: u32) -> Option<f64> {
    let mut total = proc_cpu(postmaster, true)?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(f) = proc_stat(pid)
            && f.get(1) == Some(&u64::from(postmaster))
        {
            total += (f.get(11).unwrap_or(&0) + f.get(12).unwrap_or(&0)) as f64 / clock_ticks();
        }
    }
    Some(total)
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

#[cfg(test)]
mod tests {
    use super::Samples;

    #[test]
    fn percentiles_within_a_bucket() {
        let s = Samples::default();
        // 1 µs .. 200 ms in steps of 20 µs: fine and coarse buckets.
        for us in (1..=200_000).step_by(20) {
            s.push(us);
        }
        s.push(90_000_000); // beyond the last bucket
        let (p50, p99, max) = s.percentiles();
        assert!((p50 - 100.0).abs() <= 1.0, "p50 {p50}");
        assert!((p99 - 198.0).abs() <= 1.0, "p99 {p99}");
        assert_eq!(max, 90_000.0);
        let small = Samples::default();
        small.push(1234);
        assert_eq!(small.percentiles(), (1.234, 1.234, 1.234));
    }
}
