//! Prometheus metrics on `prometheus-client` (the Prometheus project's own
//! Rust client): per-queue counters and histograms bumped on the hot path,
//! per-queue gauges from a statistics snapshot refreshed on a timer, and the
//! exposition text for `GET /metrics` (served by [`crate::console`]'s HTTP
//! server).
//!
//! One [`Metrics`] per broker (it hangs off `Store`), not a
//! process global, so brokers running side by side in one test process do
//! not share counts. The per-queue gauges cost one statistics query per
//! `--metrics-interval`, never one per scrape. The same snapshots feed the
//! console's charts ([`crate::history`]). `docs/METRICS.md` lists every metric.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use tracing::debug;

use crate::domain::{
    Enqueued, Failed, FastMap, JobId, Leased, NewJob, QueueName, QueueRow, Settled,
};

/// The `Content-Type` of [`Metrics::render`]'s text (OpenMetrics 1.0, which
/// Prometheus negotiates and parses natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A monotonically increasing count (a Prometheus counter without labels).
#[derive(Clone, Debug, Default)]
pub struct Counter(PromCounter<u64, AtomicU64>);

impl Counter {
    pub fn add(&self, n: usize) {
        self.0.inc_by(n as u64);
    }
}

/// The one label of per-queue series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct QueueLabel {
    pub queue: String,
}

impl QueueLabel {
    fn of(queue: &str) -> QueueLabel {
        QueueLabel {
            queue: queue.to_owned(),
        }
    }
}

type Counters = Family<QueueLabel, PromCounter<u64, AtomicU64>>;

/// The one label of per-cluster series (docs/SCALING.md).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ClusterLabel {
    pub cluster: String,
}

/// Per-cluster series: whether it answers, and the jobs it took in and
/// completed through this broker (how evenly the placement spreads load).
#[derive(Clone, Debug, Default)]
pub struct ClusterMetrics {
    pub up: Family<ClusterLabel, Gauge<i64, std::sync::atomic::AtomicI64>>,
    pub enqueued: Family<ClusterLabel, PromCounter<u64, AtomicU64>>,
    pub acked: Family<ClusterLabel, PromCounter<u64, AtomicU64>>,
}

impl ClusterMetrics {
    fn label(cluster: &str) -> ClusterLabel {
        ClusterLabel {
            cluster: cluster.to_owned(),
        }
    }

    pub fn set_up(&self, cluster: &str, up: bool) {
        self.up
            .get_or_create(&Self::label(cluster))
            .set(i64::from(up));
    }

    /// Whether the last health probe of the cluster failed (false before
    /// the first probe).
    pub fn is_down(&self, cluster: &str) -> bool {
        self.up
            .get(&Self::label(cluster))
            .is_some_and(|g| g.get() == 0)
    }

    pub fn on_enqueued(&self, cluster: &str, n: usize) {
        if n > 0 {
            self.enqueued
                .get_or_create(&Self::label(cluster))
                .inc_by(n as u64);
        }
    }

    pub fn on_acked(&self, cluster: &str, n: usize) {
        if n > 0 {
            self.acked
                .get_or_create(&Self::label(cluster))
                .inc_by(n as u64);
        }
    }
}
type Histograms = Family<QueueLabel, Histogram, fn() -> Histogram>;

/// Seconds, from 1 ms to 1 h: enqueue → delivery and handler times.
const SECONDS_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    1800.0, 3600.0,
];
const BATCH_BOUNDS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0,
];

fn seconds_histogram() -> Histogram {
    Histogram::new(SECONDS_BOUNDS.iter().copied())
}

/// Adds `n` to `queue`'s series of `family`.
fn bump(family: &Counters, queue: &str, n: u64) {
    if n > 0 {
        family.get_or_create(&QueueLabel::of(queue)).inc_by(n);
    }
}

/// One Subscribe / Consume stream of this broker.
#[derive(Clone, Debug)]
pub struct StreamEntry {
    pub consumer: String,
    pub queues: Vec<QueueName>,
    pub credit: u32,
    pub opened: Instant,
}

#[derive(Default)]
struct StreamMaps {
    by_id: HashMap<u64, StreamEntry>,
    /// Per queue: (streams, total credit).
    by_queue: HashMap<QueueName, (i64, i64)>,
}

impl StreamMaps {
    fn account(&mut self, queues: &[QueueName], streams: i64, credit: i64) {
        for q in queues {
            let e = self.by_queue.entry(q.clone()).or_default();
            e.0 += streams;
            e.1 += credit;
            if e.0 <= 0 {
                self.by_queue.remove(q);
            }
        }
    }
}

/// This broker's Subscribe streams: per stream its consumer, queues and
/// credit (`max_in_flight`), and per queue how many and their total credit.
/// Each replica knows only its own.
#[derive(Default)]
pub struct StreamRegistry(Mutex<StreamMaps>);

impl StreamRegistry {
    pub fn opened(&self, id: u64, consumer: &str, queues: &[QueueName], max_in_flight: u32) {
        let mut m = self.0.lock().expect("poisoned");
        m.account(queues, 1, i64::from(max_in_flight));
        m.by_id.insert(
            id,
            StreamEntry {
                consumer: consumer.to_owned(),
                queues: queues.to_vec(),
                credit: max_in_flight,
                opened: Instant::now(),
            },
        );
    }

    /// The stream's credit is now `max_in_flight` (Consume).
    pub fn credit(&self, id: u64, max_in_flight: u32) {
        let mut m = self.0.lock().expect("poisoned");
        let Some(e) = m.by_id.get_mut(&id) else {
            return;
        };
        let delta = i64::from(max_in_flight) - i64::from(e.credit);
        e.credit = max_in_flight;
        let queues = e.queues.clone();
        m.account(&queues, 0, delta);
    }

    pub fn closed(&self, id: u64) {
        let mut m = self.0.lock().expect("poisoned");
        if let Some(e) = m.by_id.remove(&id) {
            m.account(&e.queues, -1, -i64::from(e.credit));
        }
    }

    /// (streams, total credit) of this broker's streams on `queue`.
    pub fn get(&self, queue: &str) -> (i64, i64) {
        let m = self.0.lock().expect("poisoned");
        QueueName::parse(queue)
            .and_then(|q| m.by_queue.get(&q).copied())
            .unwrap_or((0, 0))
    }

    /// This broker's streams on `queue`, oldest first.
    pub fn on_queue(&self, queue: &str) -> Vec<StreamEntry> {
        let m = self.0.lock().expect("poisoned");
        let mut out: Vec<StreamEntry> = m
            .by_id
            .values()
            .filter(|s| s.queues.iter().any(|q| q.as_str() == queue))
            .cloned()
            .collect();
        out.sort_by_key(|s| s.opened);
        out
    }
}

/// Per queue, the jobs this broker enqueued and acked since it started
/// (the same counts as `leaseq_jobs_enqueued_total` and
/// `leaseq_jobs_acked_total`, kept where they can be listed): what
/// [`crate::history`] turns into the deployment's rates.
#[derive(Default)]
pub struct Activity(Mutex<HashMap<String, [u64; 2]>>);

impl Activity {
    fn add(&self, per: impl IntoIterator<Item = (usize, String, u64)>) {
        let mut m = self.0.lock().expect("poisoned");
        for (i, queue, n) in per {
            if n > 0 {
                m.entry(queue).or_default()[i] += n;
            }
        }
    }

    /// Every queue's (enqueued, acked) so far.
    pub fn totals(&self) -> HashMap<String, [u64; 2]> {
        self.0.lock().expect("poisoned").clone()
    }
}

/// The per-queue gauges, encoded from the last statistics snapshot at
/// scrape time (one consistent snapshot per scrape).
#[derive(Debug, Default)]
struct QueueGauges(Arc<Mutex<Vec<QueueRow>>>);

type GaugeDef = (&'static str, &'static str, fn(&QueueRow) -> f64);

const QUEUE_GAUGES: [GaugeDef; 11] = [
    ("leaseq_queue_available_jobs", "Jobs deliverable now", |q| {
        q.available as f64
    }),
    (
        "leaseq_queue_scheduled_jobs",
        "Jobs waiting for a later run_at",
        |q| q.scheduled as f64,
    ),
    (
        "leaseq_queue_leased_jobs",
        "Jobs delivered and unsettled",
        |q| q.leased as f64,
    ),
    ("leaseq_queue_dead_jobs", "Jobs in the dead letters", |q| {
        q.dead as f64
    }),
    (
        "leaseq_queue_oldest_available_age_seconds",
        "How long the longest-waiting deliverable job has been deliverable (0 when none)",
        |q| q.oldest_age_ms.unwrap_or(0) as f64 / 1000.0,
    ),
    ("leaseq_queue_paused", "1 when the queue is paused", |q| {
        if q.paused { 1.0 } else { 0.0 }
    }),
    (
        "leaseq_queue_consumers",
        "Distinct consumer names holding leases on the queue (every replica)",
        |q| q.consumers as f64,
    ),
    (
        "leaseq_queue_streams",
        "Subscribe streams on the queue held by this broker",
        |q| q.streams as f64,
    ),
    (
        "leaseq_queue_free_credits",
        "This broker's streams' max_in_flight on the queue minus the jobs of the queue they hold (a stream on several queues counts on each)",
        |q| (q.credit - q.leased_here).max(0) as f64,
    ),
    (
        "leaseq_queue_keys_waiting",
        "Distinct keys with a job waiting (counted up to 10,000: a queue with more shows 10,000)",
        |q| q.keys_waiting as f64,
    ),
    (
        "leaseq_queue_keys_leased",
        "Distinct keys with a job delivered and unsettled (every replica)",
        |q| q.keys_leased as f64,
    ),
];

impl Collector for QueueGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = self.0.lock().expect("poisoned");
        for (name, help, f) in QUEUE_GAUGES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for q in rows.iter() {
                let label = QueueLabel::of(&q.name);
                ConstGauge::new(f(q)).encode(family.encode_family(&label)?)?;
            }
        }
        Ok(())
    }
}

/// Jobs this broker delivered and has not seen settled: when and on which
/// queue, for the handler-time histogram.
#[derive(Default)]
struct InFlight(Mutex<FastMap<JobId, (QueueName, Instant)>>);

/// Deliveries older than this are forgotten (settled on another replica,
/// cancelled, or reaped there): twice the longest lease.
const INFLIGHT_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// Every metric of one broker.
pub struct Metrics {
    registry: Registry,
    pub enqueued: Counters,
    pub enqueue_duplicates: Counters,
    pub delivered: Counters,
    pub acked: Counters,
    pub nacked: Counters,
    pub lease_expired: Counters,
    pub dead_lettered: Counters,
    /// Ack / Nack / ExtendLease with a stale or unknown lease (no queue is
    /// known for those).
    pub stale_tokens: Counter,
    /// Database time from enqueue to first delivery (a requested delay
    /// included).
    pub delivery_wait: Histograms,
    /// From this broker's delivery of a job to its ack (this broker's clock).
    pub handler_duration: Histograms,
    /// Jobs per group-commit enqueue statement.
    pub enqueue_batch: Histogram,
    /// Jobs per lease statement that leased any.
    pub lease_batch: Histogram,
    /// 1 while the health service says SERVING.
    pub serving: Gauge<i64, std::sync::atomic::AtomicI64>,
    pub streams: StreamRegistry,
    pub clusters: ClusterMetrics,
    /// Rows written to the jobs table (see [`Metrics::job_writes`]).
    writes: AtomicU64,
    inflight: InFlight,
    /// The last per-queue statistics, refreshed on a timer by [`refresh`].
    gauges: Arc<Mutex<Vec<QueueRow>>>,
    pub activity: Activity,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("job_writes", &self.job_writes())
            .finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let JobCounters {
            enqueued,
            enqueue_duplicates,
            delivered,
            acked,
            nacked,
            lease_expired,
            dead_lettered,
        } = JobCounters::register(&mut registry);
        let stale_tokens = Counter::default();
        registry.register(
            "leaseq_stale_tokens",
            "Ack / Nack / ExtendLease refused with FAILED_PRECONDITION (stale or unknown lease)",
            stale_tokens.0.clone(),
        );
        let delivery_wait = Histograms::new_with_constructor(seconds_histogram as fn() -> _);
        registry.register(
            "leaseq_delivery_wait_seconds",
            "Time from enqueue to first delivery (delays included), database clock",
            delivery_wait.clone(),
        );
        let handler_duration = Histograms::new_with_constructor(seconds_histogram as fn() -> _);
        registry.register(
            "leaseq_handler_duration_seconds",
            "Time from this broker's delivery of a job to its ack received by this broker",
            handler_duration.clone(),
        );
        let enqueue_batch = Histogram::new(BATCH_BOUNDS.iter().copied());
        registry.register(
            "leaseq_enqueue_batch_jobs",
            "Jobs per group-commit enqueue statement",
            enqueue_batch.clone(),
        );
        let lease_batch = Histogram::new(BATCH_BOUNDS.iter().copied());
        registry.register(
            "leaseq_lease_batch_jobs",
            "Jobs per lease statement (statements that leased at least one)",
            lease_batch.clone(),
        );
        let serving = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
        registry.register(
            "leaseq_serving",
            "1 while the broker's health is SERVING (PostgreSQL reachable, not draining), else 0",
            serving.clone(),
        );
        registry.register(
            "leaseq_build",
            "The broker's version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let clusters = ClusterMetrics::register(&mut registry);
        let gauges = Arc::new(Mutex::new(Vec::new()));
        registry.register_collector(Box::new(QueueGauges(gauges.clone())));
        Metrics {
            registry,
            enqueued,
            enqueue_duplicates,
            delivered,
            acked,
            nacked,
            lease_expired,
            dead_lettered,
            stale_tokens,
            delivery_wait,
            handler_duration,
            enqueue_batch,
            lease_batch,
            serving,
            streams: StreamRegistry::default(),
            clusters,
            writes: AtomicU64::new(0),
            inflight: InFlight::default(),
            gauges,
            activity: Activity::default(),
        }
    }
}

/// The per-queue counters of jobs, registered together.
struct JobCounters {
    enqueued: Counters,
    enqueue_duplicates: Counters,
    delivered: Counters,
    acked: Counters,
    nacked: Counters,
    lease_expired: Counters,
    dead_lettered: Counters,
}

impl JobCounters {
    fn register(registry: &mut Registry) -> JobCounters {
        let mut counters = |name: &str, help: &str| {
            let family = Counters::default();
            registry.register(name, help, family.clone());
            family
        };
        JobCounters {
            enqueued: counters(
                "leaseq_jobs_enqueued",
                "Jobs enqueued (new jobs only; de-duplicated enqueues are counted apart)",
            ),
            enqueue_duplicates: counters(
                "leaseq_jobs_enqueue_duplicates",
                "Enqueues that matched a live job's dedup_key and created nothing",
            ),
            delivered: counters(
                "leaseq_jobs_delivered",
                "Deliveries (leases taken) by this broker's streams",
            ),
            acked: counters(
                "leaseq_jobs_acked",
                "Successful Acks received by this broker",
            ),
            nacked: counters(
                "leaseq_jobs_nacked",
                "Successful Nacks received by this broker",
            ),
            lease_expired: counters(
                "leaseq_leases_expired",
                "Leases this broker found expired and ended",
            ),
            dead_lettered: counters(
                "leaseq_jobs_dead_lettered",
                "Jobs this broker moved to the dead letters (nack, last attempt, ttl)",
            ),
        }
    }
}

impl ClusterMetrics {
    fn register(registry: &mut Registry) -> ClusterMetrics {
        let clusters = ClusterMetrics::default();
        registry.register(
            "leaseq_cluster_up",
            "1 while the PostgreSQL cluster answers this broker's health probe, else 0",
            clusters.up.clone(),
        );
        registry.register(
            "leaseq_cluster_jobs_enqueued",
            "Jobs this broker enqueued on the cluster",
            clusters.enqueued.clone(),
        );
        registry.register(
            "leaseq_cluster_jobs_acked",
            "Jobs acked on the cluster through this broker",
            clusters.acked.clone(),
        );
        clusters
    }
}

impl Metrics {
    /// Rows this broker has written to the jobs table so far (inserted,
    /// leased, settled, released or expired): it leaves dead tuples only
    /// when this moves, which is how the vacuum loop stays silent when idle.
    pub fn job_writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    fn wrote(&self, n: usize) {
        self.writes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts an enqueue statement's results (`results[i]` is `jobs[i]`'s).
    pub fn on_enqueued(&self, jobs: &[NewJob], results: &[Enqueued]) {
        let mut per: FastMap<&str, (u64, u64)> = FastMap::default();
        for (j, r) in jobs.iter().zip(results) {
            let e = per.entry(j.queue.as_str()).or_default();
            if r.duplicate {
                e.1 += 1;
            } else {
                e.0 += 1;
            }
        }
        for (queue, (new, dups)) in &per {
            bump(&self.enqueued, queue, *new);
            bump(&self.enqueue_duplicates, queue, *dups);
            self.wrote(*new as usize);
        }
        self.activity
            .add(per.into_iter().map(|(q, (new, _))| (0, q.to_owned(), new)));
        self.enqueue_batch.observe(results.len() as f64);
    }

    /// Counts an ack statement: `asked` requests, `done` matched their
    /// current token (the rest were stale). Observes the handler time of
    /// jobs this broker delivered.
    pub fn on_acked(&self, asked: usize, done: &[Settled]) {
        self.stale_tokens.add(asked.saturating_sub(done.len()));
        self.wrote(done.len());
        let now = Instant::now();
        let mut inflight = self.inflight.0.lock().expect("poisoned");
        let mut per: FastMap<&str, u64> = FastMap::default();
        for s in done {
            *per.entry(s.queue.as_str()).or_default() += 1;
            if let Some((queue, at)) = inflight.remove(&s.id) {
                self.handler_duration
                    .get_or_create(&QueueLabel::of(queue.as_str()))
                    .observe(now.duration_since(at).as_secs_f64());
            }
        }
        drop(inflight);
        for (queue, n) in &per {
            bump(&self.acked, queue, *n);
        }
        self.activity
            .add(per.into_iter().map(|(q, n)| (1, q.to_owned(), n)));
    }

    /// Counts a nack statement (`asked` requests, `done` matched).
    pub fn on_nacked(&self, asked: usize, done: &[Failed]) {
        self.stale_tokens.add(asked.saturating_sub(done.len()));
        self.on_failed(&self.nacked, done);
    }

    /// Counts leases found expired and ended.
    pub fn on_expired(&self, done: &[Failed]) {
        self.on_failed(&self.lease_expired, done);
    }

    /// Counts leases the broker released (stream closed, drain): only the
    /// dead letters among them (a job past its ttl or last attempt).
    pub fn on_released(&self, done: &[Failed]) {
        self.wrote(done.len());
        let mut inflight = self.inflight.0.lock().expect("poisoned");
        for f in done {
            inflight.remove(&f.id);
            if f.death.is_some() {
                bump(&self.dead_lettered, f.queue.as_str(), 1);
            }
        }
    }

    fn on_failed(&self, counter: &Counters, done: &[Failed]) {
        self.wrote(done.len());
        let mut inflight = self.inflight.0.lock().expect("poisoned");
        for f in done {
            inflight.remove(&f.id);
            bump(counter, f.queue.as_str(), 1);
            if f.death.is_some() {
                bump(&self.dead_lettered, f.queue.as_str(), 1);
            }
        }
    }

    /// Counts waiting jobs dead-lettered past their ttl, per queue.
    pub fn on_ttl_expired(&self, per_queue: &[(String, u64)]) {
        for (queue, n) in per_queue {
            bump(&self.dead_lettered, queue, *n);
            self.wrote(*n as usize);
        }
    }

    /// Counts jobs just leased and observes their wait. All instants are the
    /// database's: lease start = lease_expires_at - lease, so broker clock
    /// skew does not enter.
    pub fn on_leased<'a>(&self, jobs: impl ExactSizeIterator<Item = &'a Leased>) {
        if jobs.len() == 0 {
            return;
        }
        self.lease_batch.observe(jobs.len() as f64);
        self.wrote(jobs.len());
        let now = Instant::now();
        // Per queue: deliveries, and the waits of first deliveries.
        let mut per: FastMap<&str, (u64, Vec<f64>)> = FastMap::default();
        let mut inflight = self.inflight.0.lock().expect("poisoned");
        for j in jobs {
            let e = per.entry(j.queue.as_str()).or_default();
            e.0 += 1;
            if j.attempt == 1 {
                let start = j.lease_expires_at - chrono::Duration::milliseconds(j.lease_ms);
                let waited = (start - j.enqueued_at).num_microseconds().unwrap_or(0);
                e.1.push(waited.max(0) as f64 / 1e6);
            }
            if let Some(q) = QueueName::parse(&j.queue) {
                inflight.insert(j.id, (q, now));
            }
            // Trace context travels verbatim in the headers; logging it here
            // lets a delivery be found from a distributed trace.
            debug!(job_id = %j.id, queue = %j.queue, attempt = j.attempt,
                traceparent = j.headers.get("traceparent").map(String::as_str), "delivered");
        }
        drop(inflight);
        for (queue, (n, waits)) in per {
            let label = QueueLabel::of(queue);
            self.delivered.get_or_create(&label).inc_by(n);
            if !waits.is_empty() {
                let h = self.delivery_wait.get_or_create(&label);
                for w in waits {
                    h.observe(w);
                }
            }
        }
    }

    /// The exposition text (OpenMetrics; see [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// New per-queue statistics (from [`crate::history`]'s sampler).
    pub fn refreshed(&self, rows: Vec<QueueRow>) {
        *self.gauges.lock().expect("poisoned") = rows;
        // Forget deliveries settled elsewhere.
        let mut inflight = self.inflight.0.lock().expect("poisoned");
        inflight.retain(|_, (_, at)| at.elapsed() < INFLIGHT_MAX_AGE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_counted_per_queue_and_per_stream() {
        let r = StreamRegistry::default();
        let a = QueueName::parse("a").unwrap();
        let b = QueueName::parse("b").unwrap();
        r.opened(1, "w1", &[a.clone(), b.clone()], 10);
        r.opened(2, "w2", std::slice::from_ref(&a), 5);
        assert_eq!(r.get("a"), (2, 15));
        assert_eq!(r.get("b"), (1, 10));
        r.credit(1, 4);
        assert_eq!(r.get("a"), (2, 9));
        assert_eq!(r.on_queue("a").len(), 2);
        r.closed(1);
        r.closed(1);
        assert_eq!(r.get("a"), (1, 5));
        assert_eq!(r.get("b"), (0, 0));
        assert_eq!(r.on_queue("a")[0].consumer, "w2");
    }

    #[test]
    fn renders_openmetrics_with_queue_labels() {
        let m = Metrics::default();
        bump(&m.enqueued, "q1", 3);
        m.stale_tokens.add(2);
        m.serving.set(1);
        let text = m.render();
        assert!(
            text.contains("# TYPE leaseq_jobs_enqueued counter"),
            "{text}"
        );
        assert!(
            text.contains("leaseq_jobs_enqueued_total{queue=\"q1\"} 3"),
            "{text}"
        );
        assert!(text.contains("leaseq_stale_tokens_total 2"), "{text}");
        assert!(text.contains("leaseq_serving 1"), "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }
}
