//! The deployment's per-queue rates and depth over time, in PostgreSQL, for
//! the console (any replica shows every replica's traffic, and the charts
//! survive a rolling deploy).
//!
//! Every broker runs [`sample_loop`] every `--metrics-interval`: it turns its
//! own enqueue and ack counts ([`crate::metrics::Activity`]) into rates over
//! the interval and writes them, one row per queue with traffic, to
//! `leaseq.queue_rates` (the latest, upserted) and `leaseq.queue_samples`
//! (the last [`KEEP`]). A broker that serves `/metrics` or the console also
//! counts each queue's depth first (the per-queue gauges' snapshot, as
//! before) and writes it with the rates, and at least every
//! [`DEPTH_EVERY`] for a queue whose depth does not change. Readers add the
//! brokers' rates up ([`rates`], [`series`]); a broker's row counts for
//! 2.5 of its intervals, so one that stops writing drops out on its own.
//!
//! The rows go to the home cluster: one place for the deployment, whatever
//! the placement. The cost is one statement per broker per interval (rows
//! only for queues with traffic, or whose depth changed), on the auxiliary
//! pool, and a delete of samples past [`KEEP`] by index in the same
//! statement.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::warn;
use uuid::Uuid;

use crate::error::Result;
use crate::placement::Clusters;
use crate::store::Store;
use crate::tick::Ticks;

/// How far back the charts reach.
pub const KEEP: Duration = Duration::from_secs(15 * 60);
/// A queue's depth is written at least this often, even when it does not
/// change (so that a chart opened later has a recent point).
pub const DEPTH_EVERY: Duration = Duration::from_secs(60);

/// One row of `leaseq.queue_samples`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub broker: Uuid,
    pub at_ms: i64,
    pub period_ms: i32,
    pub enqueue_rate: f64,
    pub ack_rate: f64,
    /// available, scheduled, leased, dead (None: the broker did not count).
    pub depth: Option<[i64; 4]>,
}

/// One point of a queue's charts: its depth, and the deployment's rates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub at_ms: i64,
    pub depth: [i64; 4],
    pub enqueue_rate: f64,
    pub ack_rate: f64,
}

/// A row to write to `leaseq.queue_samples`: the queue, this broker's
/// (enqueue, ack) rates, and the depth if it was counted.
type Row = (String, (f64, f64), Option<[i64; 4]>);

/// How long after its sample a broker's rate still counts, in periods.
const VALID_PERIODS: f64 = 2.5;

/// Samples every `interval` until `shutdown` (see the module's doc);
/// `depth`: also count every queue's depth (the broker serves `/metrics`
/// or the console), which refreshes the per-queue gauges too.
pub async fn sample_loop(
    clusters: Clusters,
    interval: Duration,
    depth: bool,
    shutdown: CancellationToken,
) {
    let store = clusters.home().clone();
    let interval = interval.max(Duration::from_millis(100));
    let period_ms = interval.as_millis().min(i32::MAX as u128) as i32;
    let mut ticks = Ticks::new(interval, &shutdown);
    let mut sampler = Sampler::new(&store);
    while ticks.next().await {
        let depths = if depth {
            count_depths(&clusters, &store).await
        } else {
            HashMap::new()
        };
        let now = Instant::now();
        let rates = sampler.rates(&store, now);
        let samples = sampler.samples(&depths, &rates, now);
        if let Err(e) = write(&store, period_ms, &rates, &samples).await {
            warn!(error = %e, "history: writing the queues' rates failed");
        }
    }
}

/// Every queue's depth (available, scheduled, leased, dead) over every
/// cluster that answers; refreshes the per-queue gauges. Empty (and
/// logged) when the statistics query fails.
async fn count_depths(clusters: &Clusters, store: &Store) -> HashMap<String, [i64; 4]> {
    match crate::fanout::queue_stats(clusters, None, None, i64::MAX).await {
        Ok(found) => {
            let d: HashMap<String, [i64; 4]> = found
                .value
                .iter()
                .map(|q| (q.name.clone(), [q.available, q.scheduled, q.leased, q.dead]))
                .collect();
            store.metrics().refreshed(found.value);
            d
        }
        Err(e) => {
            warn!(error = %e, "metrics: queue statistics query failed");
            HashMap::new()
        }
    }
}

/// What [`sample_loop`] remembers from one pass to the next.
struct Sampler {
    /// The enqueue and ack counts at the last rates, and when.
    last_totals: HashMap<String, [u64; 2]>,
    last_at: Instant,
    /// Queues whose last written rate was not zero: they get one more row
    /// (the zero) when their traffic stops.
    active: HashSet<String>,
    /// The depth last written per queue, and when.
    written: HashMap<String, ([i64; 4], Instant)>,
}

impl Sampler {
    fn new(store: &Store) -> Sampler {
        Sampler {
            last_totals: store.metrics().activity.totals(),
            last_at: Instant::now(),
            active: HashSet::new(),
            written: HashMap::new(),
        }
    }

    /// This broker's (enqueue, ack) rates per queue since the last call:
    /// queues with traffic, and those that had some last time.
    fn rates(&mut self, store: &Store, now: Instant) -> HashMap<String, (f64, f64)> {
        let secs = now.duration_since(self.last_at).as_secs_f64();
        let totals = store.metrics().activity.totals();
        // The first tick comes at once: no interval to divide by yet.
        let mut rates: HashMap<String, (f64, f64)> = HashMap::new();
        if secs >= 0.05 {
            for (q, t) in &totals {
                let was = self.last_totals.get(q).copied().unwrap_or_default();
                let d = [t[0].saturating_sub(was[0]), t[1].saturating_sub(was[1])];
                if d != [0, 0] || self.active.contains(q) {
                    rates.insert(q.clone(), (d[0] as f64 / secs, d[1] as f64 / secs));
                }
            }
            self.last_totals = totals;
            self.last_at = now;
        }
        self.active = rates
            .iter()
            .filter(|(_, r)| r.0 > 0.0 || r.1 > 0.0)
            .map(|(q, _)| q.clone())
            .collect();
        rates
    }

    /// The rows to write: every queue with a rate, and every queue whose
    /// depth changed or was last written [`DEPTH_EVERY`] ago.
    fn samples(
        &mut self,
        depths: &HashMap<String, [i64; 4]>,
        rates: &HashMap<String, (f64, f64)>,
        now: Instant,
    ) -> Vec<Row> {
        let mut samples: Vec<Row> = Vec::new();
        for (q, d) in depths {
            let stale = self
                .written
                .get(q)
                .is_none_or(|(w, at)| w != d || now.duration_since(*at) >= DEPTH_EVERY);
            if stale || rates.contains_key(q) {
                samples.push((
                    q.clone(),
                    rates.get(q).copied().unwrap_or_default(),
                    Some(*d),
                ));
                self.written.insert(q.clone(), (*d, now));
            }
        }
        for (q, r) in rates {
            if !depths.contains_key(q) {
                samples.push((q.clone(), *r, None));
            }
        }
        self.written.retain(|q, _| depths.contains_key(q));
        samples
    }
}

async fn write(
    store: &Store,
    period_ms: i32,
    rates: &HashMap<String, (f64, f64)>,
    samples: &[Row],
) -> Result<()> {
    let (rq, (re, ra)): (Vec<&str>, (Vec<f64>, Vec<f64>)) =
        rates.iter().map(|(q, r)| (q.as_str(), (r.0, r.1))).unzip();
    let sq: Vec<&str> = samples.iter().map(|s| s.0.as_str()).collect();
    let se: Vec<f64> = samples.iter().map(|s| s.1.0).collect();
    let sa: Vec<f64> = samples.iter().map(|s| s.1.1).collect();
    let col =
        |i: usize| -> Vec<Option<i64>> { samples.iter().map(|s| s.2.map(|d| d[i])).collect() };
    sqlx::query_file!(
        "src/store/sql/history_write.sql",
        &rq as &[&str],
        &re,
        &ra,
        store.broker_id(),
        period_ms,
        &sq as &[&str],
        &se,
        &sa,
        &col(0) as &[Option<i64>],
        &col(1) as &[Option<i64>],
        &col(2) as &[Option<i64>],
        &col(3) as &[Option<i64>],
    )
    .execute(store.pool())
    .await?;
    Ok(())
}

/// The deployment's rates per queue: (enqueued, acked) per second, summed
/// over the brokers whose latest rate still counts.
pub async fn rates(store: &Store) -> Result<HashMap<String, (f64, f64)>> {
    let rows = sqlx::query!(
        r#"select queue, sum(enqueue_rate) as "enqueue_rate!", sum(ack_rate) as "ack_rate!"
           from leaseq.queue_rates
           where at > now() - period_ms * interval '2.5 milliseconds'
           group by queue"#
    )
    .fetch_all(store.pool())
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.queue, (r.enqueue_rate, r.ack_rate)))
        .collect())
}

/// A queue's chart points over the last [`KEEP`], every broker's samples
/// together ([`combine`]).
pub async fn series(store: &Store, queue: &str) -> Result<Vec<Point>> {
    let rows = sqlx::query!(
        r#"select broker, (extract(epoch from at) * 1000)::int8 as "at_ms!", period_ms,
               enqueue_rate, ack_rate, available, scheduled, leased, dead
           from leaseq.queue_samples
           where queue = $1 and at > now() - $2 * interval '1 millisecond'
           order by at"#,
        queue,
        KEEP.as_millis() as f64,
    )
    .fetch_all(store.pool())
    .await?;
    Ok(combine(rows.into_iter().map(|r| Sample {
        broker: r.broker,
        at_ms: r.at_ms,
        period_ms: r.period_ms,
        enqueue_rate: r.enqueue_rate,
        ack_rate: r.ack_rate,
        depth: match (r.available, r.scheduled, r.leased, r.dead) {
            (Some(a), Some(s), Some(l), Some(d)) => Some([a, s, l, d]),
            _ => None,
        },
    })))
}

/// The chart's points from every broker's samples, oldest first: at each
/// sample, the latest depth any broker counted, and the sum of the rates of
/// the brokers whose latest sample still counts then. Samples before the
/// first depth make no point.
pub fn combine(samples: impl IntoIterator<Item = Sample>) -> Vec<Point> {
    let mut per_broker: HashMap<Uuid, (f64, f64, f64)> = HashMap::new();
    let mut depth: Option<[i64; 4]> = None;
    let mut out: Vec<Point> = Vec::new();
    for s in samples {
        let until = s.at_ms as f64 + f64::from(s.period_ms) * VALID_PERIODS;
        per_broker.insert(s.broker, (s.enqueue_rate, s.ack_rate, until));
        if s.depth.is_some() {
            depth = s.depth;
        }
        let Some(depth) = depth else { continue };
        let (e, a) = per_broker
            .values()
            .filter(|v| v.2 >= s.at_ms as f64)
            .fold((0.0, 0.0), |acc, v| (acc.0 + v.0, acc.1 + v.1));
        let point = Point {
            at_ms: s.at_ms,
            depth,
            enqueue_rate: e,
            ack_rate: a,
        };
        match out.last_mut() {
            Some(last) if last.at_ms == s.at_ms => *last = point,
            _ => out.push(point),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(broker: u128, at_ms: i64, rates: (f64, f64), depth: Option<[i64; 4]>) -> Sample {
        Sample {
            broker: Uuid::from_u128(broker),
            at_ms,
            period_ms: 1000,
            enqueue_rate: rates.0,
            ack_rate: rates.1,
            depth,
        }
    }

    #[test]
    fn two_brokers_rates_add_up_and_a_silent_one_drops_out() {
        let points = combine([
            s(1, 0, (10.0, 0.0), None),
            s(2, 100, (0.0, 4.0), Some([5, 0, 1, 0])),
            s(1, 1000, (12.0, 0.0), None),
            s(2, 1100, (0.0, 6.0), Some([7, 0, 1, 0])),
            // Broker 1 stops writing: its rate counts until 1000 + 2,500.
            s(2, 3100, (0.0, 8.0), Some([9, 0, 1, 0])),
            s(2, 3600, (0.0, 8.0), Some([9, 0, 1, 0])),
        ]);
        let got: Vec<(i64, [i64; 4], f64, f64)> = points
            .iter()
            .map(|p| (p.at_ms, p.depth, p.enqueue_rate, p.ack_rate))
            .collect();
        assert_eq!(
            got,
            vec![
                (100, [5, 0, 1, 0], 10.0, 4.0),
                (1000, [5, 0, 1, 0], 12.0, 4.0),
                (1100, [7, 0, 1, 0], 12.0, 6.0),
                (3100, [9, 0, 1, 0], 12.0, 8.0),
                (3600, [9, 0, 1, 0], 0.0, 8.0),
            ]
        );
    }

    #[test]
    fn samples_at_one_instant_make_one_point() {
        let points = combine([
            s(1, 0, (1.0, 1.0), Some([1, 0, 0, 0])),
            s(2, 0, (2.0, 2.0), Some([2, 0, 0, 0])),
        ]);
        assert_eq!(points.len(), 1);
        assert_eq!(points[0].enqueue_rate, 3.0);
        assert_eq!(points[0].depth, [2, 0, 0, 0]);
        assert!(combine([s(1, 0, (1.0, 1.0), None)]).is_empty());
    }
}
