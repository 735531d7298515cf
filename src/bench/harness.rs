//! What every broker scenario shares: the connections, the counters and
//! histograms the producer and consumer loops record into, starting the
//! consumers, the measured window (progress line, soak reports, CPU
//! accounting) and the [`Summary`] it ends with.

use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::cpu::{self, CpuTimes};
use super::histogram::Hist;
use super::report::Reporter;
use super::summary::{Summary, round};
use super::{BenchArgs, Scenario, consumer, producer, stamp};
use crate::cli::ClientChannel;
use crate::pb;
use crate::pb::queue_service_client::QueueServiceClient;

/// Consumer streams per HTTP/2 connection: the broker's default
/// --max-subscriptions-per-connection.
const STREAMS_PER_CONNECTION: usize = 100;

/// How long consumers may take to register before producers start anyway.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct Counters {
    pub enqueued: AtomicU64,
    pub delivered: AtomicU64,
    pub acked: AtomicU64,
    pub errors: AtomicU64,
}

impl Counters {
    /// Counts an error; the first few are printed so a run explains itself.
    pub fn error(&self, what: impl Display) {
        let n = self.errors.fetch_add(1, Ordering::Relaxed);
        if n < 3 {
            eprintln!("\nerror: {what}");
        }
    }

    fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// `--latency-log` keeps at most this many deliveries (16 bytes each).
const LATENCY_LOG_MAX: usize = 2_000_000;

/// Writes `--latency-log`: `sent_us,latency_us` per delivery, send times
/// relative to the window's start (`start_us`, stamp µs).
fn write_latency_log(
    path: &std::path::Path,
    log: &[(u64, u64)],
    start_us: u64,
) -> anyhow::Result<()> {
    use std::io::Write;
    let file = std::fs::File::create(path)
        .map_err(|e| anyhow::anyhow!("--latency-log {}: {e}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    writeln!(out, "sent_us,latency_us")?;
    for (sent, latency) in log {
        writeln!(out, "{},{latency}", sent.saturating_sub(start_us))?;
    }
    out.flush()?;
    Ok(())
}

/// State shared by the producer and consumer tasks of one run.
pub struct Shared {
    /// The run's queues (one unless `--queues`), used in turn.
    pub queues: Vec<String>,
    next_queue: AtomicU64,
    /// `--keys`: jobs get keys k0..k<N-1> in turn (0: none).
    keys: u64,
    next_key: AtomicU64,
    pub payload_bytes: usize,
    /// `--max-backlog` (0: none).
    pub max_backlog: u64,
    pub counters: Counters,
    /// Enqueue → delivery.
    pub latency: Hist,
    /// The producers' Enqueue / EnqueueBatch round trips.
    pub enqueue_calls: Hist,
    /// Open loop: how far behind its scheduled time each send started.
    pub late: Hist,
    /// Open loop: sends more than [`producer::LATE_US`] behind schedule.
    pub late_sends: AtomicU64,
    /// `--latency-log`: (send time, latency) of each stamped delivery, µs.
    latency_log: Option<Mutex<Vec<(u64, u64)>>>,
    /// Cancelled when the measured window ends.
    pub stop: CancellationToken,
    /// Open loop: sends due before this (stamp µs) are a warm-up, left out
    /// of every figure.
    measure_from: AtomicU64,
    /// One permit per consumer stream registered (its first response).
    ready: Semaphore,
    /// Why a consumer stream could not open, if one could not.
    open_failed: Mutex<Option<String>>,
}

impl Shared {
    fn new(queues: Vec<String>, payload_bytes: usize, max_backlog: u64) -> Shared {
        Shared {
            queues,
            next_queue: AtomicU64::new(0),
            keys: 0,
            next_key: AtomicU64::new(0),
            payload_bytes,
            max_backlog,
            counters: Counters::default(),
            latency: Hist::default(),
            enqueue_calls: Hist::default(),
            late: Hist::default(),
            late_sends: AtomicU64::new(0),
            latency_log: None,
            stop: CancellationToken::new(),
            measure_from: AtomicU64::new(0),
            ready: Semaphore::new(0),
            open_failed: Mutex::new(None),
        }
    }

    /// Whether a send due at `due` (stamp µs) is measured (not a warm-up).
    pub fn measured(&self, due: u64) -> bool {
        due >= self.measure_from.load(Ordering::Relaxed)
    }

    /// Records a delivery: its latency, if its payload carries a send time
    /// (a warm-up send's delivery is not counted at all).
    pub fn on_delivery(&self, job: &pb::Job) {
        if let Some(sent) = stamp::read(&job.payload) {
            if !self.measured(sent) {
                return;
            }
            let latency = stamp::now().saturating_sub(sent);
            self.latency.record_us(latency);
            if let Some(log) = &self.latency_log {
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                if log.len() < LATENCY_LOG_MAX {
                    log.push((sent, latency));
                }
            }
        }
        self.counters.delivered.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts settle results: acks the broker confirmed, and failures.
    pub fn on_settled(&self, results: &[pb::SettleResult]) {
        let mut acked = 0;
        for r in results {
            if r.code != 0 {
                self.counters.error(format_args!(
                    "{:?} of job {}: code {}: {}",
                    r.op(),
                    r.job_id,
                    r.code,
                    r.message
                ));
            } else if r.op() == pb::SettleOp::Ack {
                acked += 1;
            }
        }
        self.counters.acked.fetch_add(acked, Ordering::Relaxed);
    }

    /// A consumer stream got its first response (it is registered).
    pub fn consumer_ready(&self) {
        self.ready.add_permits(1);
    }

    /// A consumer stream could not open: the run stops before producing.
    pub fn consumer_failed_to_open(&self, why: String) {
        self.open_failed
            .lock()
            .expect("poisoned")
            .get_or_insert(why);
        self.ready.add_permits(1);
    }

    /// The next queue in turn.
    pub fn next_queue(&self) -> &str {
        let i = self.next_queue.fetch_add(1, Ordering::Relaxed) as usize;
        &self.queues[i % self.queues.len()]
    }

    /// A job for the next queue in turn.
    pub fn new_job(&self, payload: Vec<u8>) -> pb::EnqueueRequest {
        let queue = self.next_queue().to_owned();
        self.keyed_job_on(queue, payload)
    }

    /// A job for `queue`, with the next key in turn (`--keys`).
    pub fn keyed_job_on(&self, queue: String, payload: Vec<u8>) -> pb::EnqueueRequest {
        let mut job = Self::job_on(queue, payload);
        if self.keys > 0 {
            let k = self.next_key.fetch_add(1, Ordering::Relaxed) % self.keys;
            job.key = format!("k{k}");
        }
        job
    }

    pub fn job_on(queue: String, payload: Vec<u8>) -> pb::EnqueueRequest {
        pb::EnqueueRequest {
            queue,
            payload,
            ..Default::default()
        }
    }
}

/// The measured window.
pub struct Window {
    pub started: Instant,
    pub deadline: Instant,
    cpu: CpuTimes,
}

/// The addresses of a comma-separated `--addr`.
fn addrs(list: &str) -> Vec<&str> {
    let v: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    if v.is_empty() { vec![list] } else { v }
}

/// `n` queue names from `base`: `base` itself for one; else `base-i...`,
/// queue i named so that its bucket is i modulo n (a suffix is searched).
fn spread_queues(base: &str, n: usize) -> Vec<String> {
    if n <= 1 {
        return vec![base.to_owned()];
    }
    (0..n)
        .map(|i| {
            (0..)
                .map(|k| format!("{base}-{i}-{k}"))
                .find(|q| leaseq_server::placement::bucket_of(q) as usize % n == i)
                .expect("some suffix lands in every residue")
        })
        .collect()
}

/// One run against a broker: connections, shared state, and its tasks.
pub struct Bench {
    pub args: BenchArgs,
    pub shared: Arc<Shared>,
    /// One connection per address of `--addr`.
    producers: Vec<ClientChannel>,
    next_producer: usize,
    tasks: JoinSet<()>,
    consumers: usize,
    rate: Option<u64>,
}

impl Bench {
    /// Connects the producers to --addr (consumers connect when started).
    pub async fn connect(args: &BenchArgs) -> anyhow::Result<Bench> {
        stamp::init();
        let mut producers = Vec::new();
        for addr in addrs(&args.addr) {
            producers.push(crate::cli::connect(addr, &args.security).await?);
        }
        let queue = args
            .queue
            .clone()
            .unwrap_or_else(|| format!("bench-{}", uuid::Uuid::new_v4().simple()));
        let queues = spread_queues(&queue, args.queues as usize);
        if args.ordered_by_key {
            let mut admin =
                crate::pb::admin_service_client::AdminServiceClient::new(producers[0].clone());
            for q in &queues {
                admin
                    .update_queue(pb::UpdateQueueRequest {
                        queue: q.clone(),
                        create: true,
                        ordered_by_key: Some(true),
                        ..Default::default()
                    })
                    .await?;
            }
        }
        let mut shared = Shared::new(queues, args.payload_bytes, args.max_backlog);
        shared.keys = args.keys;
        if args.latency_log.is_some() {
            shared.latency_log = Some(Mutex::new(Vec::new()));
        }
        let shared = Arc::new(shared);
        Ok(Bench {
            args: args.clone(),
            shared,
            producers,
            next_producer: 0,
            tasks: JoinSet::new(),
            consumers: 0,
            rate: None,
        })
    }

    /// A client on a producers' connection: each call the next address.
    pub fn producer_client(&mut self) -> QueueServiceClient<ClientChannel> {
        QueueServiceClient::new(self.producer_channel())
    }

    /// The next producer connection in turn.
    pub fn producer_channel(&mut self) -> ClientChannel {
        let channel = self.producers[self.next_producer % self.producers.len()].clone();
        self.next_producer += 1;
        channel
    }

    /// Starts `n` consumer streams of `credit` each on --consume-addr (or
    /// --addr), settling as --ack says, on their own connection(s) (not the
    /// producers'), and waits until the broker has registered them.
    pub async fn start_consumers(&mut self, n: usize, credit: u32) -> anyhow::Result<()> {
        let addr = self.args.consume_addr.as_ref().unwrap_or(&self.args.addr);
        let addrs = addrs(addr);
        let mut channels = Vec::new();
        // At least one connection per address; consumer i on address i mod N.
        for i in 0..n.div_ceil(STREAMS_PER_CONNECTION).max(addrs.len()) {
            channels.push(crate::cli::connect(addrs[i % addrs.len()], &self.args.security).await?);
        }
        for i in 0..n {
            let channel = channels[i % channels.len()].clone();
            let accept = !self.args.one_per_response;
            let fut = consumer::run(
                self.shared.clone(),
                channel,
                i,
                credit,
                self.args.ack,
                accept,
            );
            self.tasks.spawn(fut);
        }
        self.consumers = n;
        let all = u32::try_from(n).unwrap_or(u32::MAX);
        let registered =
            tokio::time::timeout(READY_TIMEOUT, self.shared.ready.acquire_many(all)).await;
        if let Some(why) = self.shared.open_failed.lock().expect("poisoned").take() {
            anyhow::bail!("{why}");
        }
        if registered.is_err() {
            eprintln!(
                "warning: {} of {n} consumer streams registered within {READY_TIMEOUT:?}; starting anyway",
                self.shared.ready.available_permits()
            );
        }
        Ok(())
    }

    /// Starts the measured window: producers start after this.
    pub fn start(&self) -> Window {
        let started = Instant::now();
        Window {
            started,
            deadline: started + Duration::from_secs(self.args.duration),
            cpu: CpuTimes::read(&self.args.broker_pid, &self.args.postgres_pid),
        }
    }

    /// Runs a producer loop (or anything else) until the window ends.
    pub fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// Starts the open-loop generator of Enqueue calls at `rate` jobs/s
    /// (see [`Bench::open_loop_of`]).
    pub async fn open_loop(&mut self, rate: u64) -> anyhow::Result<Window> {
        let call = producer::Call::Enqueue(self.producer_client());
        self.open_loop_of(call, rate).await
    }

    /// Starts the open-loop generator of `call` at `rate` calls/s: first
    /// `--warmup` seconds of sends left out of every figure, then the
    /// measured window, which this returns once it starts.
    pub async fn open_loop_of(
        &mut self,
        call: producer::Call,
        rate: u64,
    ) -> anyhow::Result<Window> {
        let rate = rate.max(1);
        self.rate = Some(rate);
        let warm = Duration::from_secs(self.args.warmup);
        let t0 = Instant::now();
        let from = t0 + warm;
        let deadline = from + Duration::from_secs(self.args.duration);
        self.shared
            .measure_from
            .store(stamp::at(from), Ordering::Relaxed);
        producer::open_loop(self.shared.clone(), call, rate, t0, deadline)?;
        tokio::time::sleep_until(from.into()).await;
        // What the warm-up's sends and settles counted (a warm-up job acked
        // after this still counts: a few, at the window's start).
        let c = &self.shared.counters;
        for n in [&c.enqueued, &c.delivered, &c.acked] {
            n.store(0, Ordering::Relaxed);
        }
        let mut w = self.start();
        w.started = from;
        w.deadline = deadline;
        Ok(w)
    }

    /// Jobs done so far: acked when something consumes, else enqueued.
    fn done(&self) -> u64 {
        let c = &self.shared.counters;
        Counters::get(if self.consumers == 0 {
            &c.enqueued
        } else {
            &c.acked
        })
    }

    /// Shows progress until the window ends, then stops every task and
    /// returns what was measured.
    pub async fn measure(mut self, scenario: Scenario, w: Window) -> anyhow::Result<Summary> {
        self.progress(&w).await?;
        let seconds = w.started.elapsed().as_secs_f64();
        let cpu = CpuTimes::read(&self.args.broker_pid, &self.args.postgres_pid).since(&w.cpu);
        let c = &self.shared.counters;
        let mut s = Summary {
            scenario: scenario.name(),
            jobs: self.done(),
            enqueued: Counters::get(&c.enqueued),
            delivered: Counters::get(&c.delivered),
            acked: Counters::get(&c.acked),
            errors: Counters::get(&c.errors),
            ack: (self.consumers > 0).then(|| self.args.ack.name()),
            rate: self.rate,
            ..Default::default()
        };
        self.shared.stop.cancel();
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        eprintln!();
        s.seconds = round(seconds, 3);
        s.jobs_per_s = round(s.jobs as f64 / seconds, 1);
        s.cpu_us_per_job = cpu.per_job(s.jobs);
        s.client_rss_kb = cpu::own_rss_kb();
        s.set_latency(self.shared.latency.percentiles());
        s.set_enqueue_calls(self.shared.enqueue_calls.percentiles());
        if self.rate.is_some() {
            s.late_sends = Some(self.shared.late_sends.load(Ordering::Relaxed));
            s.late_p99_ms = self.shared.late.percentiles().p99.map(|v| round(v, 3));
        }
        if let (Some(path), Some(log)) = (&self.args.latency_log, &self.shared.latency_log) {
            let log = log.lock().unwrap_or_else(|e| e.into_inner());
            write_latency_log(path, &log, stamp::at(w.started))?;
        }
        Ok(s)
    }

    /// The live progress line (stderr), and with --report-every the soak's
    /// periodic report lines, until the window's deadline.
    async fn progress(&self, w: &Window) -> anyhow::Result<()> {
        let latency = Some(&self.shared.latency);
        let mut reporter = Reporter::new(&self.args, "leaseq.jobs", latency).await?;
        let c = &self.shared.counters;
        let mut last = (Instant::now(), 0u64);
        loop {
            let now = Instant::now();
            if now >= w.deadline {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1).min(w.deadline - now)).await;
            let done = self.done();
            if let Some(r) = &mut reporter {
                r.tick(w.started.elapsed().as_secs_f64(), done, latency)
                    .await;
            }
            let rate = (done - last.1) as f64 / last.0.elapsed().as_secs_f64();
            last = (Instant::now(), done);
            eprint!(
                "\r[{:>4.0}s] enqueued={} delivered={} acked={} errors={} rate={:.0}/s   ",
                w.started.elapsed().as_secs_f64(),
                Counters::get(&c.enqueued),
                Counters::get(&c.delivered),
                Counters::get(&c.acked),
                Counters::get(&c.errors),
                rate
            );
        }
        if let Some(r) = reporter {
            r.close().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(op: pb::SettleOp, code: i32) -> pb::SettleResult {
        pb::SettleResult {
            job_id: "j".into(),
            op: op as i32,
            code,
            ..Default::default()
        }
    }

    /// `--keys` reaches every producer's jobs, the batches' too (the
    /// flat-out producers once sent none: keys.sh's stream runs had no keys).
    #[test]
    fn batch_jobs_carry_the_keys_in_turn() {
        let mut s = Shared::new(vec!["q".into()], 64, 0);
        s.keys = 3;
        let keys: Vec<String> = (0..4)
            .map(|_| s.keyed_job_on("q".into(), Vec::new()).key)
            .collect();
        assert_eq!(keys, ["k0", "k1", "k2", "k0"]);
        assert_eq!(s.new_job(Vec::new()).key, "k1");
    }

    #[test]
    fn settles_count_confirmed_acks_and_failures() {
        let s = Shared::new(vec!["q".into()], 64, 0);
        s.on_settled(&[
            result(pb::SettleOp::Ack, 0),
            result(pb::SettleOp::Ack, 0),
            result(pb::SettleOp::Ack, 9),
            result(pb::SettleOp::Nack, 0),
        ]);
        assert_eq!(Counters::get(&s.counters.acked), 2);
        assert_eq!(Counters::get(&s.counters.errors), 1);
    }

    #[test]
    fn deliveries_record_latency_only_when_stamped() {
        stamp::init();
        let s = Shared::new(vec!["q".into()], 64, 0);
        let job = |payload| pb::Job {
            payload,
            ..Default::default()
        };
        s.on_delivery(&job(stamp::payload(stamp::now(), 64)));
        s.on_delivery(&job(stamp::unstamped(64)));
        assert_eq!(Counters::get(&s.counters.delivered), 2);
        assert_eq!(s.latency.percentiles().count, 1);
    }

    #[test]
    fn deliveries_of_warm_up_sends_are_left_out() {
        stamp::init();
        let mut s = Shared::new(vec!["q".into()], 64, 0);
        s.latency_log = Some(Mutex::new(Vec::new()));
        let from = stamp::now();
        s.measure_from.store(from, Ordering::Relaxed);
        let job = |payload| pb::Job {
            payload,
            ..Default::default()
        };
        s.on_delivery(&job(stamp::payload(from - 1, 64)));
        assert_eq!(Counters::get(&s.counters.delivered), 0);
        assert_eq!(s.latency.percentiles().count, 0);
        s.on_delivery(&job(stamp::payload(from, 64)));
        assert_eq!(Counters::get(&s.counters.delivered), 1);
        assert_eq!(s.latency.percentiles().count, 1);
        assert_eq!(s.latency_log.as_ref().unwrap().lock().unwrap().len(), 1);
        assert!(!s.measured(from - 1) && s.measured(from));
    }

    #[test]
    fn the_latency_log_holds_stamped_deliveries_relative_to_the_start() {
        stamp::init();
        let mut s = Shared::new(vec!["q".into()], 64, 0);
        s.latency_log = Some(Mutex::new(Vec::new()));
        let start = stamp::now();
        let job = |payload| pb::Job {
            payload,
            ..Default::default()
        };
        s.on_delivery(&job(stamp::payload(start + 1_500, 64)));
        s.on_delivery(&job(stamp::unstamped(64)));
        let log = s.latency_log.as_ref().unwrap().lock().unwrap().clone();
        assert_eq!(log.len(), 1, "only stamped deliveries are logged");
        let path = std::env::temp_dir().join(format!("leaseq-latlog-{}", std::process::id()));
        write_latency_log(&path, &log, start).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).ok();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "sent_us,latency_us");
        assert_eq!(lines.len(), 2);
        assert!(lines[1].starts_with("1500,"), "{}", lines[1]);
    }

    #[test]
    fn spread_queues_cover_every_residue_and_addresses_split() {
        let qs = spread_queues("b", 6);
        assert_eq!(qs.len(), 6);
        for (i, q) in qs.iter().enumerate() {
            assert_eq!(
                leaseq_server::placement::bucket_of(q) as usize % 6,
                i,
                "{q}"
            );
        }
        assert_eq!(spread_queues("b", 1), vec!["b".to_owned()]);
        assert_eq!(
            addrs("http://a:1, http://b:2"),
            vec!["http://a:1", "http://b:2"]
        );
        assert_eq!(addrs("http://a:1"), vec!["http://a:1"]);
        let s = Shared::new(vec!["x".into(), "y".into()], 64, 0);
        let seen: Vec<&str> = (0..4).map(|_| s.next_queue()).collect();
        assert_eq!(seen, ["x", "y", "x", "y"]);
    }
}
