//! Prometheus metrics: counters and histograms over atomics, per-queue gauges
//! refreshed on a timer, and a tiny HTTP/1.1 responder for `GET /metrics`.
//!
//! One [`Metrics`] per broker (it hangs off [`crate::store::Store`]), not a
//! process global, so brokers running side by side in one test process do
//! not share counts. Counters are bumped on the hot path with one relaxed
//! atomic add; the per-queue gauges cost one statistics query per
//! `--metrics-interval`, never one per scrape. `docs/METRICS.md` lists every
//! metric.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::domain::QueueName;
use crate::domain::{Enqueued, Leased};
use crate::store::admin::QueueRow;

/// A monotonically increasing count.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn add(&self, n: usize) {
        self.0.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A fixed-bucket histogram (cumulative buckets are computed when rendered).
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, plus the +Inf bucket.
    buckets: Vec<AtomicU64>,
    /// f64 bits, updated with a CAS loop.
    sum: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        cumulative += self.buckets[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = f64::from_bits(self.sum.load(Ordering::Relaxed));
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
    }
}

const WAIT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    1800.0, 3600.0,
];
const BATCH_BOUNDS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0,
];

/// This broker's Subscribe streams per queue: how many, and the credit
/// (`max_in_flight`) they hold in total. Each replica knows only its own.
#[derive(Default)]
pub struct StreamRegistry(Mutex<HashMap<QueueName, (i64, i64)>>);

impl StreamRegistry {
    pub fn opened(&self, queues: &[QueueName], max_in_flight: u32) {
        let mut m = self.0.lock().expect("poisoned");
        for q in queues {
            let e = m.entry(q.clone()).or_default();
            e.0 += 1;
            e.1 += i64::from(max_in_flight);
        }
    }

    pub fn closed(&self, queues: &[QueueName], max_in_flight: u32) {
        let mut m = self.0.lock().expect("poisoned");
        for q in queues {
            if let Some(e) = m.get_mut(q) {
                e.0 -= 1;
                e.1 -= i64::from(max_in_flight);
                if e.0 <= 0 {
                    m.remove(q);
                }
            }
        }
    }

    /// (streams, total credit) of this broker's streams on `queue`.
    pub fn get(&self, queue: &str) -> (i64, i64) {
        let m = self.0.lock().expect("poisoned");
        QueueName::parse(queue)
            .and_then(|q| m.get(&q).copied())
            .unwrap_or((0, 0))
    }
}

/// Every metric of one broker.
pub struct Metrics {
    pub enqueued: Counter,
    pub enqueue_duplicates: Counter,
    pub delivered: Counter,
    pub acked: Counter,
    pub nacked: Counter,
    pub lease_expired: Counter,
    pub dead_lettered: Counter,
    pub stale_tokens: Counter,
    /// Database time from enqueue to first delivery (a requested delay
    /// included).
    pub delivery_wait: Histogram,
    /// Jobs per group-commit enqueue statement.
    pub enqueue_batch: Histogram,
    /// Jobs per lease statement that leased any.
    pub lease_batch: Histogram,
    pub streams: StreamRegistry,
    /// The last per-queue statistics, refreshed on a timer by [`serve`].
    gauges: Mutex<Vec<QueueRow>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("enqueued", &self.enqueued.get())
            .field("delivered", &self.delivered.get())
            .finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            enqueued: Counter::default(),
            enqueue_duplicates: Counter::default(),
            delivered: Counter::default(),
            acked: Counter::default(),
            nacked: Counter::default(),
            lease_expired: Counter::default(),
            dead_lettered: Counter::default(),
            stale_tokens: Counter::default(),
            delivery_wait: Histogram::new(WAIT_BOUNDS),
            enqueue_batch: Histogram::new(BATCH_BOUNDS),
            lease_batch: Histogram::new(BATCH_BOUNDS),
            streams: StreamRegistry::default(),
            gauges: Mutex::new(Vec::new()),
        }
    }
}

impl Metrics {
    /// Rows this broker has written to the jobs table so far (inserted,
    /// leased, settled, released or expired): it leaves dead tuples only
    /// when this moves, which is how the vacuum loop stays silent when idle.
    pub fn job_writes(&self) -> u64 {
        self.enqueued.get()
            + self.delivered.get()
            + self.acked.get()
            + self.nacked.get()
            + self.lease_expired.get()
            + self.dead_lettered.get()
    }

    /// Counts an enqueue statement's results.
    pub fn on_enqueued(&self, results: &[Enqueued]) {
        let dups = results.iter().filter(|r| r.duplicate).count();
        self.enqueued.add(results.len() - dups);
        self.enqueue_duplicates.add(dups);
        self.enqueue_batch.observe(results.len() as f64);
    }

    /// Counts a settle statement: `asked` requests, `done` matched their
    /// current token (the rest were stale), `dead` of those dead-lettered.
    pub fn on_settled(&self, counter: &Counter, asked: usize, done: usize, dead: usize) {
        counter.add(done);
        self.stale_tokens.add(asked.saturating_sub(done));
        self.dead_lettered.add(dead);
    }

    /// Counts jobs just leased and observes their wait. All instants are the
    /// database's: lease start = lease_expires_at - lease, so broker clock
    /// skew does not enter.
    pub fn on_leased<'a>(&self, jobs: impl ExactSizeIterator<Item = &'a Leased>) {
        if jobs.len() == 0 {
            return;
        }
        self.delivered.add(jobs.len());
        self.lease_batch.observe(jobs.len() as f64);
        for j in jobs {
            if j.attempt == 1 {
                let start = j.lease_expires_at - chrono::Duration::milliseconds(j.lease_ms);
                let waited = (start - j.enqueued_at).num_microseconds().unwrap_or(0);
                self.delivery_wait.observe(waited.max(0) as f64 / 1e6);
            }
            // Trace context travels verbatim in the headers; logging it here
            // lets a delivery be found from a distributed trace.
            debug!(job_id = %j.id, queue = %j.queue, attempt = j.attempt,
                traceparent = j.headers.get("traceparent").map(String::as_str), "delivered");
        }
    }

    /// The exposition text (format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        let counters: [(&str, &str, &Counter); 8] = [
            (
                "leaseq_jobs_enqueued_total",
                "Jobs enqueued (new jobs only; de-duplicated enqueues are counted apart).",
                &self.enqueued,
            ),
            (
                "leaseq_jobs_enqueue_duplicates_total",
                "Enqueues that matched a live job's dedup_key and created nothing.",
                &self.enqueue_duplicates,
            ),
            (
                "leaseq_jobs_delivered_total",
                "Deliveries (leases taken) by this broker's streams.",
                &self.delivered,
            ),
            (
                "leaseq_jobs_acked_total",
                "Successful Acks received by this broker.",
                &self.acked,
            ),
            (
                "leaseq_jobs_nacked_total",
                "Successful Nacks received by this broker.",
                &self.nacked,
            ),
            (
                "leaseq_leases_expired_total",
                "Leases this broker found expired and ended.",
                &self.lease_expired,
            ),
            (
                "leaseq_jobs_dead_lettered_total",
                "Jobs this broker moved to the dead letters (nack, last attempt, ttl).",
                &self.dead_lettered,
            ),
            (
                "leaseq_stale_tokens_total",
                "Ack / Nack / ExtendLease refused with FAILED_PRECONDITION (stale or unknown lease).",
                &self.stale_tokens,
            ),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                c.get()
            );
        }
        self.delivery_wait.render(
            &mut out,
            "leaseq_delivery_wait_seconds",
            "Time from enqueue to first delivery (delays included), database clock.",
        );
        self.enqueue_batch.render(
            &mut out,
            "leaseq_enqueue_batch_jobs",
            "Jobs per group-commit enqueue statement.",
        );
        self.lease_batch.render(
            &mut out,
            "leaseq_lease_batch_jobs",
            "Jobs per lease statement (statements that leased at least one).",
        );
        let gauges = self.gauges.lock().expect("poisoned");
        type Gauge = (&'static str, &'static str, fn(&QueueRow) -> f64);
        let per_queue: [Gauge; 8] = [
            (
                "leaseq_queue_available_jobs",
                "Jobs deliverable now.",
                |q| q.available as f64,
            ),
            (
                "leaseq_queue_scheduled_jobs",
                "Jobs waiting for a later run_at.",
                |q| q.scheduled as f64,
            ),
            (
                "leaseq_queue_leased_jobs",
                "Jobs delivered and unsettled.",
                |q| q.leased as f64,
            ),
            ("leaseq_queue_dead_jobs", "Jobs in the dead letters.", |q| {
                q.dead as f64
            }),
            (
                "leaseq_queue_oldest_available_age_seconds",
                "How long the longest-waiting deliverable job has been deliverable (0 when none).",
                |q| q.oldest_age_ms.unwrap_or(0) as f64 / 1000.0,
            ),
            ("leaseq_queue_paused", "1 when the queue is paused.", |q| {
                if q.paused { 1.0 } else { 0.0 }
            }),
            (
                "leaseq_queue_streams",
                "Subscribe streams on the queue held by this broker.",
                |q| q.streams as f64,
            ),
            (
                "leaseq_queue_free_credits",
                "This broker's streams' max_in_flight on the queue minus the jobs of the queue they hold (a stream on several queues counts on each).",
                |q| (q.credit - q.leased_here).max(0) as f64,
            ),
        ];
        for (name, help, f) in per_queue {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            // Queue names are [A-Za-z0-9._:-]: nothing to escape in a label.
            for q in gauges.iter() {
                let _ = writeln!(out, "{name}{{queue=\"{}\"}} {}", q.name, f(q));
            }
        }
        out
    }
}

/// Serves `GET /metrics` on `listener` and refreshes the per-queue gauges
/// every `interval`, until `shutdown`.
pub async fn serve(
    store: crate::store::Store,
    listener: TcpListener,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let refresher = {
        let store = store.clone();
        let shutdown = shutdown.clone();
        async move {
            let mut tick = tokio::time::interval(interval.max(Duration::from_millis(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match crate::store::admin::queue_stats(&store, None, None, i64::MAX).await {
                    Ok(rows) => *store.metrics.gauges.lock().expect("poisoned") = rows,
                    Err(e) => warn!(error = %e, "metrics: queue statistics query failed"),
                }
            }
        }
    };
    tokio::spawn(refresher);
    let metrics: Arc<Metrics> = store.metrics.clone();
    loop {
        let conn = tokio::select! {
            _ = shutdown.cancelled() => return,
            c = listener.accept() => c,
        };
        match conn {
            Ok((stream, _)) => {
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    // A client that sends nothing is dropped after 10 s.
                    let _ =
                        tokio::time::timeout(Duration::from_secs(10), respond(stream, &metrics))
                            .await;
                });
            }
            Err(e) => {
                warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Binds the metrics listener (so `serve` fails fast on a taken port).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    use anyhow::Context;
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics listener {addr}"))
}

/// One request per connection: reads the request head, answers, closes.
async fn respond(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > 16 * 1024 {
            return write(&mut stream, "431 Request Header Fields Too Large", "", "").await;
        }
    }
    let line = buf.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => {
            let body = metrics.render();
            write(
                &mut stream,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
            )
            .await
        }
        (_, "/metrics") => write(&mut stream, "405 Method Not Allowed", "text/plain", "").await,
        _ => write(&mut stream, "404 Not Found", "text/plain", "see /metrics\n").await,
    }
}

async fn write(
    stream: &mut TcpStream,
    status: &str,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
