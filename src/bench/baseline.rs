//! `--scenario baseline` (and `--compare`): the blog-post pattern straight
//! in SQL against --database-url, no broker: insert, lease with `for update
//! skip locked`, delete. `--batch 1` is one job per transaction.
//! `--raw-backlog N` inserts N rows first and leaves them waiting, so the
//! loop leases from a backlog as a broker behind its consumers does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::cpu::{self, CpuTimes};
use super::report::Reporter;
use super::summary::{Summary, round};
use super::{BenchArgs, Scenario};

/// What one raw-SQL run did.
struct Outcome {
    jobs: u64,
    seconds: f64,
    cpu: CpuTimes,
    /// Rows left in the table (not leased) at the end.
    waiting: u64,
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<Summary> {
    let batch = args.batch.max(1);
    let o = raw_sql(args, batch).await?;
    Ok(Summary {
        scenario: Scenario::Baseline.name(),
        jobs: o.jobs,
        seconds: round(o.seconds, 3),
        jobs_per_s: round(o.jobs as f64 / o.seconds, 1),
        cpu_us_per_job: o.cpu.per_job(o.jobs),
        client_rss_kb: cpu::own_rss_kb(),
        batch: Some(batch),
        waiting: Some(o.waiting),
        ..Default::default()
    })
}

/// The baseline for `--compare`: batches of 100, for --duration; jobs/s.
pub async fn compare(args: &BenchArgs) -> anyhow::Result<f64> {
    let o = raw_sql(args, 100).await?;
    Ok(o.jobs as f64 / o.seconds)
}

/// Runs the pattern with 2 × --producers workers for --duration.
async fn raw_sql(args: &BenchArgs, batch: usize) -> anyhow::Result<Outcome> {
    let url = args
        .database_url
        .clone()
        .context("baseline needs --database-url / DATABASE_URL")?;
    let workers = args.producers.max(1) * 2;
    let pool = leaseq_server::store::connect(&url, workers as u32 + 1).await?;
    create_table(&pool).await?;
    prefill(&pool, args.raw_backlog, args.payload_bytes).await?;
    let done = Arc::new(AtomicU64::new(0));
    let cpu_before = CpuTimes::read(&args.broker_pid, &args.postgres_pid);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (pool, done, size) = (pool.clone(), done.clone(), args.payload_bytes);
        tasks.spawn(async move {
            while Instant::now() < deadline {
                let n = cycle(&pool, batch, size).await?;
                done.fetch_add(n, Ordering::Relaxed);
            }
            anyhow::Ok(())
        });
    }
    report_until(args, started, deadline, &done).await?;
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    eprintln!();
    let seconds = started.elapsed().as_secs_f64();
    let cpu = CpuTimes::read(&args.broker_pid, &args.postgres_pid).since(&cpu_before);
    let jobs = done.load(Ordering::Relaxed);
    let waiting: i64 =
        sqlx::query_scalar("select count(*) from leaseq_bench_raw where leased_until is null")
            .fetch_one(&pool)
            .await?;
    let waiting = waiting as u64;
    super::say(
        args,
        &format!(
            "raw-sql batch={batch} workers={workers} jobs={jobs} seconds={seconds:.1} jobs_per_s={:.0} waiting={waiting}",
            jobs as f64 / seconds
        ),
    );
    sqlx::query("drop table leaseq_bench_raw")
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(Outcome {
        jobs,
        seconds,
        cpu,
        waiting,
    })
}

/// The pattern's table, empty.
async fn create_table(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    sqlx::query(
        "create table if not exists leaseq_bench_raw (
            id bigserial primary key, payload bytea not null,
            leased_until timestamptz)",
    )
    .execute(pool)
    .await?;
    sqlx::query("truncate leaseq_bench_raw")
        .execute(pool)
        .await?;
    Ok(())
}

/// Shows (and records, with `--report`) the jobs `done` every second until
/// `deadline`.
async fn report_until(
    args: &BenchArgs,
    started: Instant,
    deadline: Instant,
    done: &AtomicU64,
) -> anyhow::Result<()> {
    let mut reporter = Reporter::new(args, "leaseq_bench_raw", None).await?;
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1).min(deadline - now)).await;
        let jobs = done.load(Ordering::Relaxed);
        if let Some(r) = &mut reporter {
            r.tick(started.elapsed().as_secs_f64(), jobs, None).await;
        }
        eprint!(
            "\r[{:>4.0}s] raw-sql jobs={jobs} ",
            started.elapsed().as_secs_f64(),
        );
    }
    if let Some(r) = reporter {
        r.close().await;
    }
    Ok(())
}

/// Inserts `n` waiting rows (--raw-backlog) and vacuums the table so that
/// the run starts from fresh statistics.
async fn prefill(pool: &sqlx::PgPool, n: u64, size: usize) -> anyhow::Result<()> {
    if n == 0 {
        return Ok(());
    }
    sqlx::query(
        "insert into leaseq_bench_raw (payload)
         select $1 from generate_series(1, $2::int8)",
    )
    .bind(vec![b'x'; size])
    .bind(n as i64)
    .execute(pool)
    .await?;
    sqlx::query("vacuum analyze leaseq_bench_raw")
        .execute(pool)
        .await?;
    Ok(())
}

/// One insert / lease / delete round of `batch` jobs; returns the jobs done.
async fn cycle(pool: &sqlx::PgPool, batch: usize, size: usize) -> anyhow::Result<u64> {
    let payloads: Vec<Vec<u8>> = (0..batch).map(|_| vec![b'x'; size]).collect();
    sqlx::query("insert into leaseq_bench_raw (payload) select unnest($1::bytea[])")
        .bind(payloads)
        .execute(pool)
        .await?;
    let ids: Vec<i64> = sqlx::query_scalar(
        "update leaseq_bench_raw set leased_until = now() + interval '30 seconds'
         where id in (select id from leaseq_bench_raw where leased_until is null
                      order by id limit $1 for update skip locked)
         returning id",
    )
    .bind(batch as i64)
    .fetch_all(pool)
    .await?;
    sqlx::query("delete from leaseq_bench_raw where id = any($1)")
        .bind(&ids)
        .execute(pool)
        .await?;
    Ok(ids.len() as u64)
}
