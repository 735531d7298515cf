//! Background upkeep every broker runs: the lease reaper, ttl expiry,
//! retention of completed jobs, and vacuuming of the jobs table.
//!
//! All replicas run it; statements skip rows another replica holds and check
//! the lease token under a row lock, so running it twice is harmless. The
//! dispatcher reaps its own streams' leases at their deadline; this loop
//! catches the rest (leases of a broker that crashed).

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::error::Result;
use crate::settle::Settle;
use crate::store::Store;
use crate::tick::Ticks;

/// Most rows one maintenance statement touches.
const BATCH: i64 = 1000;

/// Runs the reaper and ttl expiry on `store`'s cluster every `interval`
/// until `shutdown` (one loop per cluster).
pub async fn run(settle: Settle, store: Store, interval: Duration, shutdown: CancellationToken) {
    let mut ticks = Ticks::new(interval, &shutdown);
    while ticks.next().await {
        if let Err(e) = pass(&settle, &store).await {
            warn!(error = %e, cluster = %store.cluster_name(), "maintenance pass failed");
        }
    }
}

async fn pass(settle: &Settle, store: &Store) -> Result<()> {
    loop {
        let expired = store.expired_leases(None, BATCH).await?;
        let n = expired.len() as i64;
        let reaped = settle.reap(expired).await?;
        if reaped > 0 {
            debug!(reaped, "expired leases reaped");
        }
        if n < BATCH {
            break;
        }
    }
    loop {
        let dead = store.expire_ttl(BATCH).await?;
        store.metrics().on_ttl_expired(&dead);
        // A job gone from a queue ordered by key lets the key's next go.
        settle.wake(
            dead.iter()
                .filter_map(|(q, _)| crate::domain::QueueName::parse(q))
                .map(|queue| crate::domain::Wake { queue, delay_ms: 0 })
                .collect(),
        );
        let n: u64 = dead.iter().map(|(_, n)| n).sum();
        if n > 0 {
            debug!(expired = n, "jobs past their ttl dead-lettered");
        }
        if (n as i64) < BATCH {
            break;
        }
    }
    Ok(())
}

/// Rows of `leaseq.job_errors` one retention pass looks at.
const ERRORS_BATCH: i64 = 5_000;

/// Most completed records one retention statement deletes.
const RETENTION_BATCH: i64 = 10_000;

/// Deletes completed records (`leaseq.completed_jobs`) once older than their
/// queue's `completed_retention`, and every record of a queue whose retention
/// was cleared, every `interval` until `shutdown`. Each pass deletes in
/// batches of [`RETENTION_BATCH`] until none is left. Every replica runs it;
/// a statement skips the rows another replica is deleting.
///
/// Each pass also deletes dedup keys held after their job completed
/// (`unique_for`, `leaseq.dedup_holds`) whose window has passed (at most
/// [`RETENTION_BATCH`]; enqueues ignore them already), per-key rate buckets that are full again (at most
/// [`RETENTION_BATCH`]: they refill within seconds, so what is left goes on
/// the next pass), and the failed attempts' errors
/// (`leaseq.job_errors`) of jobs that are gone (acked, cancelled, purged),
/// [`ERRORS_BATCH`] rows of the table at a time in job-id order, going round
/// it over the passes: the work per pass is bounded however many errors the
/// live and dead jobs keep.
pub async fn retention_loop(
    store: Store,
    interval: Duration,
    result_retention: Duration,
    shutdown: CancellationToken,
) {
    let result_ms = i64::try_from(result_retention.as_millis()).unwrap_or(i64::MAX);
    let mut ticks = Ticks::new(interval, &shutdown);
    let mut errors_after: Option<uuid::Uuid> = None;
    while ticks.next().await {
        match crate::store::admin::delete_orphan_errors(&store, errors_after, ERRORS_BATCH).await {
            Ok((n, next)) => {
                if n > 0 {
                    debug!(deleted = n, "errors of gone jobs deleted");
                }
                errors_after = next;
            }
            Err(e) => warn!(error = %e, "deleting the errors of gone jobs failed"),
        }
        match store.expire_cancelled(RETENTION_BATCH, result_ms).await {
            Ok(n) if n > 0 => debug!(deleted = n, "records of cancelled jobs expired"),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "expiring the records of cancelled jobs failed"),
        }
        match store.delete_orphan_progress(RETENTION_BATCH).await {
            Ok(n) if n > 0 => debug!(deleted = n, "progress of gone jobs deleted"),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "deleting the progress of gone jobs failed"),
        }
        match store.expire_key_buckets(RETENTION_BATCH).await {
            Ok(n) if n > 0 => debug!(deleted = n, "full per-key rate buckets deleted"),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "deleting full per-key rate buckets failed"),
        }
        match store.expire_dedup_holds(RETENTION_BATCH).await {
            Ok(n) if n > 0 => debug!(deleted = n, "dedup keys held past their window deleted"),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "deleting dedup keys held past their window failed"),
        }
        loop {
            match store.expire_completed(RETENTION_BATCH, result_ms).await {
                Ok(n) => {
                    if n > 0 {
                        debug!(deleted = n, "completed jobs past their retention deleted");
                    }
                    if (n as i64) < RETENTION_BATCH || shutdown.is_cancelled() {
                        break;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "completed-job retention pass failed");
                    break;
                }
            }
        }
    }
}

/// Advisory lock key held while one replica vacuums (`leaseq` in ASCII).
const VACUUM_LOCK: i64 = 0x6c65_6173_6571;

/// Keeps `leaseq.jobs` vacuumed. Every job leaves two dead tuples behind (the
/// leased version and the deleted one), and autovacuum looks at a database
/// only once a minute by default (`autovacuum_naptime`): at queue rates that
/// is hundreds of thousands of dead index entries, which every lease scan has
/// to step over (measured: 2-3x the database CPU per job; see
/// docs/BENCHMARKS.md). So every `interval` this checks the table's dead
/// tuples and vacuums it past `10,000 + 20 % of live tuples`: often when the
/// table is small, rarely when a deep backlog makes each vacuum expensive.
/// One replica at a time (an advisory lock); `skip_locked` yields to a
/// running autovacuum.
pub async fn vacuum_loop(store: Store, interval: Duration, shutdown: CancellationToken) {
    let mut ticks = Ticks::new(interval, &shutdown);
    // A broker that wrote nothing since its last look does not ask (an idle
    // broker stays under a statement a second); a busy replica does the
    // vacuuming for everyone.
    let mut writes_seen = None;
    while ticks.next().await {
        let writes = store.metrics().job_writes();
        if writes_seen == Some(writes) {
            continue;
        }
        writes_seen = Some(writes);
        match vacuum_if_needed(&store).await {
            Ok(Some(dead)) => debug!(dead, "vacuumed leaseq.jobs"),
            Ok(None) => {}
            Err(e) => warn!(error = %e, "vacuum check failed"),
        }
    }
}

/// Vacuums the jobs table if it has enough dead tuples and no other replica
/// is at it. Returns the dead tuple count it acted on.
pub async fn vacuum_if_needed(store: &Store) -> Result<Option<i64>> {
    // The view's columns are never null for a table (sqlx cannot tell).
    let row = store
        .on_pool(async {
            Ok(sqlx::query!(
                "select n_dead_tup as \"n_dead_tup!\", n_live_tup as \"n_live_tup!\" from pg_stat_user_tables \
                 where relid = 'leaseq.jobs'::regclass",
            )
            .fetch_one(store.pool())
            .await?)
        })
        .await?;
    let (dead, live): (i64, i64) = (row.n_dead_tup, row.n_live_tup);
    if dead < 10_000 + live / 5 {
        return Ok(None);
    }
    // Session-level lock and VACUUM (which cannot run in a transaction) on
    // one connection; the lock goes with the connection if it dies. A
    // connection of its own, without the statement timeout: a VACUUM cut
    // short has done nothing that lasts, and one running a while must not
    // hold a connection of the pool the reaper and the dispatcher's sweeps
    // share.
    let mut conn = store.conns().connect_apart().await?;
    let result = vacuum_on(&mut conn).await;
    let _ = sqlx::Connection::close(conn).await;
    Ok(result?.then_some(dead))
}

/// VACUUM under the advisory lock on `conn`; false when another replica
/// holds the lock.
async fn vacuum_on(conn: &mut sqlx::PgConnection) -> Result<bool> {
    sqlx::query("set statement_timeout = 0")
        .execute(&mut *conn)
        .await?;
    let locked: bool = sqlx::query_scalar!(
        r#"select pg_try_advisory_lock($1) as "locked!""#,
        VACUUM_LOCK
    )
    .fetch_one(&mut *conn)
    .await?;
    if !locked {
        return Ok(false);
    }
    let result = sqlx::query("vacuum (skip_locked) leaseq.jobs")
        .execute(&mut *conn)
        .await;
    sqlx::query_scalar!("select pg_advisory_unlock($1)", VACUUM_LOCK)
        .fetch_one(&mut *conn)
        .await?;
    result?;
    Ok(true)
}
