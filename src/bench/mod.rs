//! `leaseq bench`: a load generator against a running broker, and the raw-SQL
//! baseline it is compared with.
//!
//! One function per scenario, each in its own file: [`throughput`],
//! [`enqueue`], [`latency`], [`ping`], [`streams`], [`backlog`],
//! [`fairness`] and [`baseline`]. They share a small harness ([`harness`]: connections, the
//! progress and soak report loop, counters and histograms), the consumer
//! loops ([`consumer`], settling as `--ack` says), the producer loops
//! ([`producer`]: closed loops, and the open-loop generator at `--rate`),
//! CPU accounting ([`cpu`]) and the [`Summary`] every scenario ends with.
//!
//! Every scenario is bounded by `--duration` (and the backlog fill by its
//! count); it prints a live progress line on stderr, its results on stdout
//! and, with `--json`, the [`Summary`] as one JSON line, last; with `-o
//! json`, stdout holds the [`Summary`] alone (the result lines go to
//! stderr).

use clap::{Args, ValueEnum};

mod backlog;
mod baseline;
mod consumer;
mod cpu;
mod enqueue;
mod fairness;
mod harness;
mod histogram;
mod latency;
mod ping;
mod producer;
mod report;
mod stamp;
mod streams;
mod summary;
mod throughput;

pub use summary::{CpuPerJob, Summary};

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Scenario {
    /// EnqueueBatch producers and consumers (settling as --ack says), flat out.
    Throughput,
    /// Single-job Enqueue calls from many concurrent clients.
    Enqueue,
    /// Enqueue at a fixed --rate, open loop; measures enqueue → delivery latency.
    Latency,
    /// gRPC health checks at a fixed --rate, open loop: the gRPC hop's own
    /// round trip on this machine (no job, no database).
    Ping,
    /// --streams idle-ish consumer streams on one broker, fed at --rate.
    Streams,
    /// Fill --backlog jobs first, then run the throughput scenario.
    Backlog,
    /// The raw-SQL pattern straight against --database-url (no broker).
    Baseline,
    /// Tenant A's --backlog jobs, then tenant B's 10: how many of A's go
    /// before B's (with --fair-by-key: served in turn).
    Fairness,
}

impl Scenario {
    /// The name in the summary (as `{:?}` printed it before the summary was
    /// a struct, so scripts reading `scenario` keep working).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Throughput => "Throughput",
            Scenario::Enqueue => "Enqueue",
            Scenario::Latency => "Latency",
            Scenario::Ping => "Ping",
            Scenario::Streams => "Streams",
            Scenario::Backlog => "Backlog",
            Scenario::Baseline => "Baseline",
            Scenario::Fairness => "Fairness",
        }
    }
}

/// How consumers settle their jobs.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum AckMode {
    /// Consume streams, each job's ack sent on its own stream: whatever
    /// finished while the previous request was being sent goes in the next
    /// one. With `confirm_settles`, so the broker answers every ack batch
    /// with one (small) SettleResults response, and the acked count is the
    /// count the broker confirmed.
    Stream,
    /// Subscribe streams and AckBatch calls: each consumer sends what it has
    /// finished as one call, one call in flight at a time.
    Batch,
    /// Subscribe streams and one unary Ack call per job.
    Unary,
}

impl AckMode {
    pub fn name(self) -> &'static str {
        match self {
            AckMode::Stream => "stream",
            AckMode::Batch => "batch",
            AckMode::Unary => "unary",
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Broker address (producers; consumers too unless --consume-addr).
    /// Several, comma-separated: the producers' connections and the
    /// consumer streams are spread over them in turn (broker replicas).
    #[arg(long, env = "LEASEQ_ADDR", default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// Broker address(es) for the consumers (default: --addr). Another
    /// replica on the same database measures the cross-replica path, as
    /// behind a load balancer.
    #[arg(long)]
    pub consume_addr: Option<String>,
    #[arg(long, value_enum, default_value_t = Scenario::Throughput)]
    pub scenario: Scenario,
    /// Seconds to measure.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Open-loop scenarios (latency, ping, streams): seconds of sends at `--rate`
    /// before the measured window, left out of every figure, as the
    /// RabbitMQ anchor's runner leaves out its first seconds (streams and
    /// statements warmed, other replicas' offers heard).
    #[arg(long, default_value_t = 2)]
    pub warmup: u64,
    /// Print a JSON summary as the last line (after the `key=value` lines).
    #[arg(long)]
    pub json: bool,
    /// Output: `key=value` lines for people (with --json, the summary as a
    /// last line too), or `json`: stdout holds the summary alone, one JSON
    /// document, and the lines go to stderr.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: crate::cli::Output,
    /// Producer tasks (for `enqueue`: concurrent single-job clients, e.g. 64).
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Consumer streams.
    #[arg(long, default_value_t = 4)]
    pub consumers: usize,
    /// Jobs per EnqueueBatch (and per raw-SQL transaction in the baseline).
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// How consumers ack: on their Consume stream, with AckBatch calls, or
    /// one unary Ack per job.
    #[arg(long, value_enum, default_value_t = AckMode::Stream)]
    pub ack: AckMode,
    /// Consumers ask for one delivery per response (as clients from before
    /// `Deliveries` do) instead of the packs a broker may send.
    #[arg(long)]
    pub one_per_response: bool,
    /// The broker's process id: report its CPU time per job (Linux /proc).
    /// Several (comma-separated or repeated): their sum (replicas).
    #[arg(long, value_delimiter = ',')]
    pub broker_pid: Vec<u32>,
    /// The PostgreSQL postmaster's process id (first line of
    /// `postmaster.pid` in the data directory): report the CPU time of the
    /// whole cluster (postmaster, backends, vacuum workers) per job.
    /// Several (comma-separated or repeated): their sum (clusters).
    #[arg(long, value_delimiter = ',')]
    pub postgres_pid: Vec<u32>,
    /// Print a line with the rate of the last N seconds every N seconds,
    /// for soaks: with the delivery p50 and the CPU per job over those
    /// seconds (as at the end of a run), the size of leaseq.jobs (the raw
    /// loop's table for `baseline`; with --database-url), and the host
    /// probe, this machine's speed: the mean CPU time of two fixed pieces
    /// of work run once a second, one for the core and one for memory
    /// (more µs: a slower host). `baseline` takes it too, so that a soak of
    /// the raw loop can anchor leaseq's.
    #[arg(long)]
    pub report_every: Option<u64>,
    /// Credits per consumer stream.
    #[arg(long, default_value_t = 256)]
    pub max_in_flight: u32,
    /// Payload bytes (at least 8: the first 8 carry the send time).
    #[arg(long, default_value_t = 64)]
    pub payload_bytes: usize,
    /// `throughput`: producers wait while more than this many of the run's
    /// jobs are enqueued and not yet acked, so the run measures a steady
    /// state (as RabbitMQ's confirm window and the raw-SQL loop do) rather
    /// than a backlog growing for as long as it lasts. 0: no cap.
    #[arg(long, default_value_t = 10_000)]
    pub max_backlog: u64,
    /// Jobs per second for `latency` and `streams` (calls per second for
    /// `ping`), sent open loop: send times are scheduled in advance and calls
    /// do not wait for each other.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Streams for `streams`.
    #[arg(long, default_value_t = 1000)]
    pub streams: usize,
    /// Jobs enqueued before measuring, for `backlog`.
    #[arg(long, default_value_t = 1_000_000)]
    pub backlog: u64,
    /// `baseline`: rows inserted before measuring and left waiting at the
    /// head of its table, so that the raw loop leases from a backlog as the
    /// stream run with its default --max-backlog does. 0: none (the loop's
    /// table then holds only its workers' batches).
    #[arg(long, default_value_t = 0)]
    pub raw_backlog: u64,
    /// Queue name (a fresh one per run by default).
    #[arg(long)]
    pub queue: Option<String>,
    /// Give the jobs keys (`EnqueueRequest.key`): `k0` ... `k<N-1>`, in
    /// turn. 0: no keys.
    #[arg(long, default_value_t = 0)]
    pub keys: u64,
    /// Make the run's queues ordered by key (UpdateQueue `ordered_by_key`,
    /// key_concurrency 1) before producing: with --keys, a key's jobs go
    /// one at a time, in order.
    #[arg(long)]
    pub ordered_by_key: bool,
    /// `fairness`: make the queue fair by key (UpdateQueue `fair_by_key`);
    /// without it the run is the control.
    #[arg(long)]
    pub fair_by_key: bool,
    /// Spread the jobs over this many queues (`QUEUE-0` ...), in turn: one
    /// EnqueueBatch per queue, every consumer stream on all of them. Queue
    /// i's bucket (docs/SCALING.md) is i modulo N, so under the first map of
    /// a new deployment over C clusters (bucket b on cluster b mod C) an N
    /// that is a multiple of C puts N/C queues on each cluster.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub queues: u32,
    /// Database for `baseline`, and for `--compare` and `--report-every`.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// After the run, run the raw-SQL baseline (batches of 100) against
    /// --database-url for the same duration and print the ratio.
    #[arg(long)]
    pub compare: bool,
    /// Write every stamped delivery of the measured window to this file,
    /// one `sent_us,latency_us` line each (send time in µs since the run's
    /// start), in delivery order: where the tail of a latency run sits in
    /// time. At most the first 2,000,000 deliveries.
    #[arg(long)]
    pub latency_log: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub security: crate::cli::ClientSecurity,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let mut summary = match args.scenario {
        Scenario::Throughput => throughput::run(&args).await?,
        Scenario::Enqueue => enqueue::run(&args).await?,
        Scenario::Latency => latency::run(&args).await?,
        Scenario::Ping => ping::run(&args).await?,
        Scenario::Streams => streams::run(&args).await?,
        Scenario::Backlog => backlog::run(&args).await?,
        Scenario::Fairness => fairness::run(&args).await?,
        Scenario::Baseline => baseline::run(&args).await?,
    };
    if args.compare && args.scenario != Scenario::Baseline {
        let b = baseline::compare(&args).await?;
        summary.compared_with(b);
        say(
            &args,
            &format!(
                "baseline (raw SQL, batches of 100) jobs_per_s={b:.0} ratio={:.2}",
                summary.ratio.unwrap_or(f64::NAN)
            ),
        );
    }
    summary.print(args.json, args.output)
}

/// A result line: on stdout, or on stderr with `-o json` (whose stdout is
/// the summary alone).
pub(crate) fn say(args: &BenchArgs, line: &str) {
    match args.output {
        crate::cli::Output::Table => println!("{line}"),
        crate::cli::Output::Json => eprintln!("{line}"),
    }
}
