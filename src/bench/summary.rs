//! What a run measured: printed as `key=value` lines, and with `--json` as
//! one JSON object on the last line.

use serde::Serialize;

use super::histogram::Percentiles;

/// The result of one `leaseq bench` run. Times are in milliseconds; a key
/// is `null` where the scenario does not measure it.
#[derive(Serialize, Debug, Clone, Default)]
pub struct Summary {
    /// `Throughput`, `Enqueue`, `Latency`, `Ping`, `Streams`, `Backlog` or
    /// `Baseline`.
    pub scenario: &'static str,
    /// Jobs done in the measured window: acked (confirmed by the broker) when
    /// the scenario consumes, else enqueued (`Ping`: health checks answered,
    /// also counted as `enqueued`).
    pub jobs: u64,
    pub seconds: f64,
    pub jobs_per_s: f64,
    /// Enqueue → delivery: from the send time in the payload (for the open
    /// loop, the time the send was scheduled for) to the consumer reading
    /// the delivery. `Ping`: from the due time to the health check's answer.
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// The round trip of the producers' own Enqueue (EnqueueBatch in
    /// `throughput` and `backlog`; the health check in `Ping`) calls.
    pub enqueue_p50_ms: Option<f64>,
    pub enqueue_p99_ms: Option<f64>,
    /// Open loop only: sends that started more than 1 ms after their
    /// scheduled time, and how far behind schedule the generator was at p99
    /// (a saturated load generator shows here, not as a lower rate).
    pub late_sends: Option<u64>,
    pub late_p99_ms: Option<f64>,
    /// Failed calls, acks the broker answered with a non-zero code, consumer
    /// streams that ended, and open-loop sends skipped (too many in flight).
    pub errors: u64,
    pub enqueued: u64,
    pub delivered: u64,
    pub acked: u64,
    pub client_rss_kb: u64,
    /// CPU µs per job (`--broker-pid`, `--postgres-pid`; the client always).
    pub cpu_us_per_job: CpuPerJob,
    /// `stream`, `batch` or `unary`; null when nothing consumes.
    pub ack: Option<&'static str>,
    /// The scheduled rate (jobs/s) of an open-loop scenario.
    pub rate: Option<u64>,
    /// Jobs per EnqueueBatch, or per raw-SQL transaction.
    pub batch: Option<usize>,
    /// `Baseline`: rows waiting in the raw loop's table when the run ended
    /// (its --raw-backlog, plus the rows of any last batch not leased).
    pub waiting: Option<u64>,
    /// With `--compare`: the raw-SQL baseline and jobs_per_s / baseline.
    pub baseline_jobs_per_s: Option<f64>,
    pub ratio: Option<f64>,
    /// `Fairness` only.
    pub fairness: Option<Fairness>,
}

/// `--scenario fairness`: tenant B's few jobs against tenant A's backlog.
#[derive(Serialize, Debug, Clone, Copy, Default, PartialEq)]
pub struct Fairness {
    pub fair_by_key: bool,
    /// Tenant A's jobs enqueued before the run.
    pub backlog: u64,
    /// Tenant B's jobs, enqueued once A's flow, and how many arrived.
    pub b_jobs: u64,
    pub b_delivered: u64,
    /// A's jobs delivered from the send of B's batch to B's last delivery.
    pub a_before_b: u64,
    /// That time (null when B's jobs did not all arrive within --duration).
    pub b_wait_ms: Option<f64>,
    /// A's jobs delivered from the answer to B's batch (B's jobs committed)
    /// to B's last delivery: `a_before_b` less what went out while B's
    /// enqueue itself ran.
    pub a_after_commit: u64,
    /// How long B's EnqueueBatch took (send to answer).
    pub b_enqueue_ms: f64,
    /// A's delivery rate in the second before B came.
    pub a_jobs_per_s_before: f64,
}

#[derive(Serialize, Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuPerJob {
    pub broker: Option<f64>,
    pub client: Option<f64>,
    pub postgres: Option<f64>,
}

/// Rounds to `places` decimals (the JSON needs no more).
pub fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

fn ms(x: Option<f64>) -> Option<f64> {
    x.map(|v| round(v, 3))
}

impl Summary {
    pub fn set_latency(&mut self, p: Percentiles) {
        self.p50_ms = ms(p.p50);
        self.p90_ms = ms(p.p90);
        self.p99_ms = ms(p.p99);
        self.p999_ms = ms(p.p999);
        self.max_ms = ms(p.max);
    }

    pub fn set_enqueue_calls(&mut self, p: Percentiles) {
        self.enqueue_p50_ms = ms(p.p50);
        self.enqueue_p99_ms = ms(p.p99);
    }

    /// Adds the `--compare` baseline.
    pub fn compared_with(&mut self, baseline_jobs_per_s: f64) {
        self.baseline_jobs_per_s = Some(round(baseline_jobs_per_s, 1));
        self.ratio =
            (baseline_jobs_per_s > 0.0).then(|| round(self.jobs_per_s / baseline_jobs_per_s, 3));
    }

    /// The human-readable lines, then (with `json`) the JSON line; with
    /// `-o json`, the lines on stderr and the summary alone on stdout.
    pub fn print(&self, json: bool, output: crate::cli::Output) -> anyhow::Result<()> {
        let only_json = output == crate::cli::Output::Json;
        let println = |line: String| {
            if only_json {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
        };
        let opt = |x: Option<f64>| x.map_or("n/a".to_owned(), |v| format!("{v:.1}"));
        if self.jobs > 0 {
            let c = &self.cpu_us_per_job;
            println(format!(
                "cpu_us_per_job broker={} client={} postgres={}",
                opt(c.broker),
                opt(c.client),
                opt(c.postgres)
            ));
        }
        let ms = |x: Option<f64>| x.map_or("n/a".to_owned(), |v| format!("{v:.2}"));
        println(format!(
            "scenario={} jobs={} seconds={:.1} jobs_per_s={:.0} p50_ms={} p90_ms={} p99_ms={} p999_ms={} max_ms={} errors={}",
            self.scenario,
            self.jobs,
            self.seconds,
            self.jobs_per_s,
            ms(self.p50_ms),
            ms(self.p90_ms),
            ms(self.p99_ms),
            ms(self.p999_ms),
            ms(self.max_ms),
            self.errors
        ));
        if self.enqueue_p50_ms.is_some() || self.late_sends.is_some() {
            let late = match self.late_sends {
                Some(n) => format!(" late_sends={n} late_p99_ms={}", ms(self.late_p99_ms)),
                None => String::new(),
            };
            println(format!(
                "enqueue_call p50_ms={} p99_ms={}{late}",
                ms(self.enqueue_p50_ms),
                ms(self.enqueue_p99_ms)
            ));
        }
        if let Some(f) = &self.fairness {
            println(format!(
                "fairness fair_by_key={} backlog={} b_delivered={}/{} a_before_b={} a_after_commit={} b_enqueue_ms={:.3} b_wait_ms={} a_jobs_per_s_before={:.0}",
                f.fair_by_key,
                f.backlog,
                f.b_delivered,
                f.b_jobs,
                f.a_before_b,
                f.a_after_commit,
                f.b_enqueue_ms,
                ms(f.b_wait_ms),
                f.a_jobs_per_s_before
            ));
        }
        if only_json {
            crate::cli::print_json(&serde_json::to_value(self)?);
        } else if json {
            println!("{}", serde_json::to_string(self)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_keeps_the_old_keys_and_nulls() {
        let mut s = Summary {
            scenario: "Latency",
            jobs: 10,
            jobs_per_s: 1000.0,
            ack: Some("stream"),
            ..Default::default()
        };
        s.compared_with(4000.0);
        let v: serde_json::Value = serde_json::to_value(&s).unwrap();
        for key in [
            "scenario",
            "jobs",
            "seconds",
            "jobs_per_s",
            "p50_ms",
            "p99_ms",
            "max_ms",
            "errors",
            "enqueued",
            "delivered",
            "client_rss_kb",
            "baseline_jobs_per_s",
            "ratio",
            "p90_ms",
            "p999_ms",
            "enqueue_p50_ms",
            "enqueue_p99_ms",
            "cpu_us_per_job",
            "ack",
            "rate",
        ] {
            assert!(v.get(key).is_some(), "{key} missing from {v}");
        }
        assert_eq!(v["p50_ms"], serde_json::Value::Null);
        assert_eq!(v["ratio"], 0.25);
        assert_eq!(v["cpu_us_per_job"]["postgres"], serde_json::Value::Null);
        assert_eq!(v["ack"], "stream");
    }
}
