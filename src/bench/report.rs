//! `--report-every N`: the soak's periodic report lines, for the broker's
//! runs and the raw-SQL baseline alike, so the two can be read side by side
//! on a noisy host (docs/BENCHMARKS.md, "The soak").

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::BenchArgs;
use super::cpu::{self, CpuTimes};
use super::histogram::Hist;

/// Prints a report line every `--report-every` seconds; [`Reporter::tick`]
/// is called about once a second.
pub struct Reporter {
    every: Duration,
    broker_pid: Vec<u32>,
    postgres_pid: Vec<u32>,
    /// For the table's size (with --database-url).
    pool: Option<sqlx::PgPool>,
    table: &'static str,
    start: ReportStart,
    /// The host probe's samples since the last report (one a tick): the
    /// core's and the memory's.
    probes: Vec<(Duration, Duration)>,
}

/// Where the current report interval began: its figures are the
/// differences from these.
struct ReportStart {
    at: Instant,
    done: u64,
    cpu: CpuTimes,
    latency: Option<Histogram<u64>>,
}

impl Reporter {
    /// `None` without --report-every. `table` is the relation whose size
    /// each line shows.
    pub async fn new(
        args: &BenchArgs,
        table: &'static str,
        latency: Option<&Hist>,
    ) -> anyhow::Result<Option<Reporter>> {
        let Some(every) = args.report_every else {
            return Ok(None);
        };
        let pool = match &args.database_url {
            Some(url) => Some(leaseq_server::store::connect(url, 1).await?),
            None => None,
        };
        Ok(Some(Reporter {
            every: Duration::from_secs(every),
            start: ReportStart {
                at: Instant::now(),
                done: 0,
                cpu: CpuTimes::read(&args.broker_pid, &args.postgres_pid),
                latency: latency.map(Hist::snapshot),
            },
            broker_pid: args.broker_pid.clone(),
            postgres_pid: args.postgres_pid.clone(),
            pool,
            table,
            probes: Vec::new(),
        }))
    }

    /// Takes a host probe sample, and prints a line once the interval is
    /// over. `done` is the jobs done since the window started, `t` the
    /// seconds since then.
    pub async fn tick(&mut self, t: f64, done: u64, latency: Option<&Hist>) {
        if let Ok(Some(d)) = tokio::task::spawn_blocking(cpu::host_probe).await {
            self.probes.push(d);
        }
        // (Half a second of slack: the last sleep of the window is cut
        // short at the deadline, and the last interval still counts.)
        if self.start.at.elapsed() + Duration::from_millis(500) < self.every {
            return;
        }
        let jobs = done - self.start.done;
        let rate = jobs as f64 / self.start.at.elapsed().as_secs_f64();
        let cpu = CpuTimes::read(&self.broker_pid, &self.postgres_pid);
        let per_job = cpu.since(&self.start.cpu).per_job(jobs);
        let p50 = latency
            .zip(self.start.latency.as_ref())
            .and_then(|(h, before)| h.p50_since(before));
        self.start = ReportStart {
            at: Instant::now(),
            done,
            cpu,
            latency: latency.map(Hist::snapshot),
        };
        let size = match &self.pool {
            Some(pool) => table_size(pool, self.table).await,
            None => "n/a".into(),
        };
        let (core, memory): (Vec<_>, Vec<_>) = std::mem::take(&mut self.probes).into_iter().unzip();
        eprintln!(
            "\nreport t={t:.0}s jobs_per_s={rate:.0} delivery_p50_ms={} jobs_table={size} \
             cpu_us_per_job broker={} client={} postgres={} \
             host_probe_us core={} memory={}",
            or_na(p50),
            or_na(per_job.broker),
            or_na(per_job.client),
            or_na(per_job.postgres),
            mean_us(&core),
            mean_us(&memory),
        );
    }

    pub async fn close(self) {
        if let Some(pool) = self.pool {
            pool.close().await;
        }
    }
}

/// The mean of the host probe's samples, in µs ("n/a" for none).
fn mean_us(samples: &[Duration]) -> String {
    if samples.is_empty() {
        return "n/a".into();
    }
    let total: Duration = samples.iter().sum();
    format!("{:.0}", total.as_secs_f64() * 1e6 / samples.len() as f64)
}

fn or_na(x: Option<f64>) -> String {
    x.map_or_else(|| "n/a".into(), |v| v.to_string())
}

async fn table_size(pool: &sqlx::PgPool, table: &str) -> String {
    sqlx::query_scalar::<_, i64>("select pg_total_relation_size($1::regclass)")
        .bind(table)
        .fetch_one(pool)
        .await
        .map_or_else(
            |e| e.to_string(),
            |b| format!("{:.1} MiB", b as f64 / 1048576.0),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_means_are_in_microseconds() {
        let s = [Duration::from_micros(800), Duration::from_micros(900)];
        assert_eq!(mean_us(&s), "850");
        assert_eq!(mean_us(&[]), "n/a");
    }
}
