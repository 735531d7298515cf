//! The operator's commands on the placement (`leaseq placement pin|move`):
//! pinning queues to a cluster, and moving a bucket between clusters
//! (docs/SCALING.md, "Moving a bucket").

use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;
use tracing::info;

use super::{BUCKETS, Map, bucket_of};
use crate::domain::ClusterId;
use crate::error::{Error, Result};
use crate::store::placement::{self as sql, Table};

/// Pins a queue name (or a prefix ending in `*`) to a cluster. Refused if
/// jobs of matching queues live elsewhere (move them first).
pub async fn pin(clusters: &[(ClusterId, PgPool)], pattern: &str, to: ClusterId) -> Result<()> {
    let like = like_pattern(pattern);
    for (id, pool) in clusters.iter().filter(|(id, _)| *id != to) {
        if sql::has_jobs_like(pool, &like).await? {
            return Err(Error::invalid(
                "pattern",
                format!("queues matching {pattern:?} have jobs on cluster {id}: move them first"),
            ));
        }
    }
    sql::set_pin(&clusters[0].1, pattern, to).await?;
    Ok(())
}

/// The SQL LIKE pattern matching what a pin's pattern matches: the name
/// itself, or every name starting with the prefix before a final `*`.
fn like_pattern(pattern: &str) -> String {
    let escape = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    };
    match pattern.strip_suffix('*') {
        Some(prefix) => format!("{}%", escape(prefix)),
        None => escape(pattern),
    }
}

/// How [`move_bucket`] paces itself.
#[derive(Clone, Debug)]
pub struct MoveOptions {
    /// Jobs per copy transaction.
    pub batch: i64,
    /// A broker not seen for this long is not waited for.
    pub broker_timeout: Duration,
    /// Waited after the last copy before the move ends, for enqueue
    /// statements that began before brokers followed the announcement.
    pub grace: Duration,
    /// Gives up waiting for brokers or for leases on the source after this.
    pub limit: Duration,
    /// Told what was copied so far after every copy transaction (the
    /// CLI's progress line).
    pub progress: Option<tokio::sync::watch::Sender<Moved>>,
}

impl Default for MoveOptions {
    fn default() -> Self {
        MoveOptions {
            batch: 500,
            broker_timeout: Duration::from_secs(10),
            grace: Duration::from_secs(2),
            limit: Duration::from_secs(600),
            progress: None,
        }
    }
}

/// What a move did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    pub queues: usize,
    pub jobs: u64,
    pub dead: u64,
    /// Completed records kept for retention.
    pub completed: u64,
}

impl Moved {
    /// The count of rows of `table` copied.
    fn of(&mut self, table: Table) -> &mut u64 {
        match table {
            Table::Jobs => &mut self.jobs,
            Table::DeadJobs => &mut self.dead,
            Table::CompletedJobs => &mut self.completed,
        }
    }
}

/// Moves `bucket` to cluster `to` (docs/SCALING.md, "Moving a bucket"):
/// announce, wait for every live broker to follow, fence the source by
/// pausing the bucket's queues there, copy waiting jobs and dead letters
/// with tombstones, wait for the source's leases to end, finish. Safe to
/// run again after it was interrupted (it resumes). `clusters` is every
/// cluster, home first.
pub async fn move_bucket(
    clusters: &[(ClusterId, PgPool)],
    bucket: u32,
    to: ClusterId,
    opts: &MoveOptions,
) -> anyhow::Result<Moved> {
    anyhow::ensure!(bucket < BUCKETS, "bucket must be below {BUCKETS}");
    let home = clusters[0].1.clone();
    let dest = pool_of(clusters, to)?;
    let started = Instant::now();

    // 1. Announce (and find the source).
    let Some(source) = announce(clusters, &dest, bucket, to).await? else {
        return Ok(Moved::default());
    };
    wait_for_brokers(&home, source.epoch, opts, started).await?;
    tokio::time::sleep(opts.grace).await;

    // 2. Fence the source: its lease statements skip paused queues.
    sql::pause_queues(&source.pool, &source.queues).await?;

    // 3. Copy, until the source holds nothing of the bucket.
    let moved = copy_until_empty(&source, &dest, bucket, opts, started).await?;

    // 4. Finish.
    let epoch = sql::finish_move(&home, bucket, to).await?;
    sql::delete_queue_rows(&source.pool, &source.queues).await?;
    let from = source.cluster;
    info!(bucket, %from, %to, epoch, jobs = moved.jobs, dead = moved.dead, completed = moved.completed, "bucket moved");
    Ok(moved)
}

/// The source of an announced move.
struct Source {
    cluster: ClusterId,
    pool: PgPool,
    /// The bucket's queues there.
    queues: Vec<String>,
    /// The epoch that announced the move.
    epoch: i64,
}

/// The pool of cluster `id`.
fn pool_of(clusters: &[(ClusterId, PgPool)], id: ClusterId) -> anyhow::Result<PgPool> {
    clusters
        .iter()
        .find(|(c, _)| *c == id)
        .map(|(_, p)| p.clone())
        .ok_or_else(|| anyhow::anyhow!("cluster {id} is not among the databases given"))
}

/// Step 1: marks the bucket as moving to `to` on home (unless a move there
/// is under way already: this one resumes it) and creates its queues' rows
/// on `dest`. None: the bucket is on `to` already.
async fn announce(
    clusters: &[(ClusterId, PgPool)],
    dest: &PgPool,
    bucket: u32,
    to: ClusterId,
) -> anyhow::Result<Option<Source>> {
    let mut tx = clusters[0].1.begin().await?;
    let (from, moving) = sql::lock_bucket(&mut tx, bucket).await?;
    let from = ClusterId(from as u16);
    if from == to && moving.is_none() {
        return Ok(None);
    }
    if let Some(m) = moving
        && m != to.0 as i16
    {
        anyhow::bail!("bucket {bucket} is being moved to cluster {m} already");
    }
    let source = pool_of(clusters, from)?;
    let mut pinned = Map::home_only();
    pinned.pins = sql::pins(&mut *tx).await?;
    // The bucket's queues on the source (pinned ones stay where pinned).
    let queues: Vec<String> = sql::queue_names(&source)
        .await?
        .into_iter()
        .filter(|q| bucket_of(q) == bucket && pinned.pinned(q).is_none())
        .collect();
    // Queue rows (settings) exist on the destination before any job goes
    // there, with the source's settings: a row the destination had already
    // (left by `leaseq.enqueue()` there, say) is replaced, since nothing
    // leases the queue there yet. A resumed move keeps the destination's:
    // the source's rows are fenced (paused) by then.
    sql::copy_queue_rows(&source, dest, &queues, moving.is_none()).await?;
    let epoch = if moving.is_none() {
        sql::announce_move(&mut tx, bucket, to).await?;
        sql::bump_epoch(&mut tx).await?
    } else {
        sql::current_epoch(&mut tx).await?
    };
    tx.commit().await?;
    info!(bucket, %from, %to, epoch, queues = queues.len(), "bucket move announced");
    Ok(Some(Source {
        cluster: from,
        pool: source,
        queues,
        epoch,
    }))
}

/// Waits until every live broker routes by `epoch` (or gives up after
/// `opts.limit` from `started`).
async fn wait_for_brokers(
    home: &PgPool,
    epoch: i64,
    opts: &MoveOptions,
    started: Instant,
) -> anyhow::Result<()> {
    loop {
        let behind = sql::brokers_behind(home, epoch, opts.broker_timeout.as_secs_f64()).await?;
        if behind == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < opts.limit,
            "{behind} brokers did not follow epoch {epoch}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Step 3: copies the bucket's waiting jobs, dead letters and completed
/// records to `dest` until the source holds none (its leased jobs are
/// settled or expire there first), or gives up after `opts.limit` from
/// `started`.
async fn copy_until_empty(
    source: &Source,
    dest: &PgPool,
    bucket: u32,
    opts: &MoveOptions,
    started: Instant,
) -> anyhow::Result<Moved> {
    let queues = &source.queues;
    let mut moved = Moved {
        queues: queues.len(),
        ..Moved::default()
    };
    loop {
        // Completed records kept for the queues' retention: the queue's
        // retention runs where its row is, so they go with it.
        for table in [Table::Jobs, Table::DeadJobs, Table::CompletedJobs] {
            copy_table(&source.pool, dest, queues, table, opts, &mut moved).await?;
        }
        let left = sql::rows_left(&source.pool, queues).await?;
        if left == 0 {
            // A last look after the grace: an enqueue that began before the
            // brokers followed may commit late.
            tokio::time::sleep(opts.grace).await;
            if sql::jobs_left(&source.pool, queues).await? == 0 {
                return Ok(moved);
            }
        }
        let from = source.cluster;
        anyhow::ensure!(
            started.elapsed() < opts.limit,
            "{left} jobs of bucket {bucket} still on cluster {from} (leased ones end first)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Copies the queues' rows of `table` in batches until a batch comes back
/// short, counting them in `moved` (and telling `opts.progress`); waiting
/// jobs wake their consumers on `dest`.
async fn copy_table(
    source: &PgPool,
    dest: &PgPool,
    queues: &[String],
    table: Table,
    opts: &MoveOptions,
    moved: &mut Moved,
) -> Result<()> {
    loop {
        let n = sql::copy_batch(source, dest, queues, table, opts.batch).await?;
        *moved.of(table) += n;
        if let Some(p) = &opts.progress {
            p.send_replace(moved.clone());
        }
        if table == Table::Jobs && n > 0 {
            sql::wake(dest, queues).await;
        }
        if (n as i64) < opts.batch {
            return Ok(());
        }
    }
}
