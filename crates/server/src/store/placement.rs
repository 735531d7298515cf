//! SQL of the placement (crate::placement, docs/SCALING.md): the cluster
//! ids and the bucket map on the home cluster, the brokers' epochs, pins,
//! and the copies of a bucket move and of the stray-job sweep.
//!
//! One function per statement, taking any executor (a pool, or a
//! transaction the caller holds open), except where a transaction is the
//! unit ([`read_map`], [`set_pin`], [`finish_move`], [`copy_queue_rows`],
//! [`copy_batch`]). The statements return sqlx's own error: their callers
//! are the operator commands, which report it as it is (anyhow), and the
//! broker's loops, which convert it as every store call does (`?`).

use sqlx::{Executor, PgConnection, PgPool, Postgres};
use tracing::warn;
use uuid::Uuid;

use crate::domain::ClusterId;
use crate::error::{Error, Result};

type SqlResult<T> = std::result::Result<T, sqlx::Error>;

/// Advisory lock key held while a broker sets up the placement tables
/// (`lqplace` in ASCII).
const SETUP_LOCK: i64 = 0x6c71706c616365;

// ---- the cluster ids and the first map (home) ----

/// Holds the setup lock until the transaction ends.
pub async fn lock_setup(tx: &mut PgConnection) -> SqlResult<()> {
    sqlx::query!("select pg_advisory_xact_lock($1)", SETUP_LOCK)
        .execute(tx)
        .await?;
    Ok(())
}

/// The clusters the placement knows: (name, id).
pub async fn known_clusters(tx: &mut PgConnection) -> SqlResult<Vec<(String, i16)>> {
    let known = sqlx::query!("select id, name from leaseq.placement_clusters")
        .fetch_all(tx)
        .await?;
    Ok(known.into_iter().map(|r| (r.name, r.id)).collect())
}

pub async fn add_cluster(tx: &mut PgConnection, id: i16, name: &str) -> SqlResult<()> {
    sqlx::query!(
        "insert into leaseq.placement_clusters (id, name) values ($1, $2)",
        id,
        name,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// How many buckets the map has a row for (none before the first map).
pub async fn mapped_buckets(tx: &mut PgConnection) -> SqlResult<i64> {
    sqlx::query_scalar!(r#"select count(*) as "count!" from leaseq.placement"#)
        .fetch_one(tx)
        .await
}

/// Whether the database has any queue (an upgrade, not a new deployment).
pub async fn has_queues(tx: &mut PgConnection) -> SqlResult<bool> {
    sqlx::query_scalar!(r#"select exists (select 1 from leaseq.queues) as "exists!""#)
        .fetch_one(tx)
        .await
}

/// Writes the first map (`clusters[b]` holds bucket `b`) and moves the
/// epoch on.
pub async fn write_first_map(tx: &mut PgConnection, clusters: &[i16]) -> SqlResult<()> {
    sqlx::query!(
        "insert into leaseq.placement (bucket, cluster) \
         select b - 1, c from unnest($1::int2[]) with ordinality as u(c, b)",
        clusters,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "insert into leaseq.placement_epoch (epoch) values (1) \
         on conflict (one) do update set epoch = leaseq.placement_epoch.epoch + 1",
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// Records the database as cluster `id` named `name` unless it knows
/// itself already; returns what it knows itself as: (id, name).
pub async fn identity(pool: &PgPool, id: ClusterId, name: &str) -> SqlResult<(i16, String)> {
    sqlx::query!(
        "insert into leaseq.cluster_identity (id, name) values ($1, $2) on conflict (one) do nothing",
        id.0 as i16,
        name,
    )
    .execute(pool)
    .await?;
    let was = sqlx::query!("select id, name from leaseq.cluster_identity")
        .fetch_one(pool)
        .await?;
    Ok((was.id, was.name))
}

// ---- the map and its epoch (home) ----

/// Whether the map or a pin places anything off the home cluster, or a
/// move is under way (the database is the home of several clusters).
pub async fn places_elsewhere(home: &PgPool) -> SqlResult<bool> {
    sqlx::query_scalar!(
        "select exists (select 1 from leaseq.placement where cluster <> 0 or moving_to is not null) \
         or exists (select 1 from leaseq.placement_pins where cluster <> 0) as \"elsewhere!\"",
    )
    .fetch_one(home)
    .await
}

/// The current epoch; None before the first map.
pub async fn epoch<'e>(exec: impl Executor<'e, Database = Postgres>) -> SqlResult<Option<i64>> {
    sqlx::query_scalar!("select epoch from leaseq.placement_epoch")
        .fetch_optional(exec)
        .await
}

/// The epoch, the buckets as (bucket, cluster, moving to) and the pins,
/// read in one snapshot.
#[allow(clippy::type_complexity)]
pub async fn read_map(
    home: &PgPool,
) -> SqlResult<(
    Option<i64>,
    Vec<(i32, i16, Option<i16>)>,
    Vec<(String, ClusterId)>,
)> {
    let mut tx = home.begin().await?;
    // One snapshot for the epoch and the tables it stands for.
    sqlx::query("set transaction isolation level repeatable read")
        .execute(&mut *tx)
        .await?;
    let epoch = epoch(&mut *tx).await?;
    let rows = sqlx::query!("select bucket, cluster, moving_to from leaseq.placement")
        .fetch_all(&mut *tx)
        .await?;
    let pins = pins(&mut *tx).await?;
    tx.commit().await?;
    Ok((
        epoch,
        rows.into_iter()
            .map(|r| (r.bucket, r.cluster, r.moving_to))
            .collect(),
        pins,
    ))
}

/// The pins: (pattern, cluster).
pub async fn pins<'e>(
    exec: impl Executor<'e, Database = Postgres>,
) -> SqlResult<Vec<(String, ClusterId)>> {
    let pins = sqlx::query!("select pattern, cluster from leaseq.placement_pins")
        .fetch_all(exec)
        .await?;
    Ok(pins
        .into_iter()
        .map(|r| (r.pattern, ClusterId(r.cluster as u16)))
        .collect())
}

/// Moves the epoch on (the map or the pins changed); returns the new one.
pub async fn bump_epoch(tx: &mut PgConnection) -> SqlResult<i64> {
    sqlx::query_scalar!("update leaseq.placement_epoch set epoch = epoch + 1 returning epoch")
        .fetch_one(tx)
        .await
}

// ---- the brokers following the map (home) ----

/// Records that `broker` routes by `epoch` (and is alive).
pub async fn report_epoch(home: &PgPool, broker: Uuid, epoch: i64) -> SqlResult<()> {
    sqlx::query!(
        "insert into leaseq.placement_brokers (broker, epoch) values ($1, $2) \
         on conflict (broker) do update set epoch = excluded.epoch, seen_at = now()",
        broker,
        epoch,
    )
    .execute(home)
    .await?;
    Ok(())
}

/// Forgets `broker`: a move need not wait for it.
pub async fn forget_broker(home: &PgPool, broker: Uuid) -> SqlResult<()> {
    sqlx::query!(
        "delete from leaseq.placement_brokers where broker = $1",
        broker,
    )
    .execute(home)
    .await?;
    Ok(())
}

/// Brokers seen within `timeout_secs` that route by an epoch before `epoch`.
pub async fn brokers_behind(home: &PgPool, epoch: i64, timeout_secs: f64) -> SqlResult<i64> {
    sqlx::query_scalar!(
        "select count(*) as \"count!\" from leaseq.placement_brokers \
         where epoch < $1 and seen_at > now() - make_interval(secs => $2)",
        epoch,
        timeout_secs,
    )
    .fetch_one(home)
    .await
}

// ---- pins ----

/// Whether the cluster has live jobs or dead letters of queues matching
/// `like` (a LIKE pattern).
pub async fn has_jobs_like(pool: &PgPool, like: &str) -> SqlResult<bool> {
    sqlx::query_scalar!(
        "select exists (select 1 from leaseq.jobs where queue like $1) \
         or exists (select 1 from leaseq.dead_jobs where queue like $1) as \"elsewhere!\"",
        like,
    )
    .fetch_one(pool)
    .await
}

/// Pins `pattern` to cluster `to` and moves the epoch on, in one
/// transaction.
pub async fn set_pin(home: &PgPool, pattern: &str, to: ClusterId) -> SqlResult<()> {
    let mut tx = home.begin().await?;
    sqlx::query!(
        "insert into leaseq.placement_pins (pattern, cluster) values ($1, $2) \
         on conflict (pattern) do update set cluster = excluded.cluster",
        pattern,
        to.0 as i16,
    )
    .execute(&mut *tx)
    .await?;
    bump_epoch(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

// ---- a bucket move ----

/// The bucket's row, locked until the transaction ends: (cluster, moving
/// to).
pub async fn lock_bucket(tx: &mut PgConnection, bucket: u32) -> SqlResult<(i16, Option<i16>)> {
    let row = sqlx::query!(
        "select cluster, moving_to from leaseq.placement where bucket = $1 for update",
        bucket as i32,
    )
    .fetch_one(tx)
    .await?;
    Ok((row.cluster, row.moving_to))
}

/// Marks the bucket as moving to `to` (enqueues and leases go there).
pub async fn announce_move(tx: &mut PgConnection, bucket: u32, to: ClusterId) -> SqlResult<()> {
    sqlx::query!(
        "update leaseq.placement set moving_to = $2 where bucket = $1",
        bucket as i32,
        to.0 as i16,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// The epoch, which exists once a move is under way.
pub async fn current_epoch(tx: &mut PgConnection) -> SqlResult<i64> {
    sqlx::query_scalar!("select epoch from leaseq.placement_epoch")
        .fetch_one(tx)
        .await
}

/// Every queue of the cluster.
pub async fn queue_names(pool: &PgPool) -> SqlResult<Vec<String>> {
    sqlx::query_scalar!("select name from leaseq.queues")
        .fetch_all(pool)
        .await
}

/// Pauses the queues: the cluster's lease statements skip them (the
/// source's fence).
pub async fn pause_queues(pool: &PgPool, queues: &[String]) -> SqlResult<()> {
    sqlx::query!(
        "update leaseq.queues set paused = true where name = any($1)",
        queues,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The queues' live jobs, dead letters and completed records on the
/// cluster.
pub async fn rows_left(pool: &PgPool, queues: &[String]) -> SqlResult<i64> {
    sqlx::query_scalar!(
        "select (select count(*) from leaseq.jobs where queue = any($1)) \
              + (select count(*) from leaseq.dead_jobs where queue = any($1)) \
              + (select count(*) from leaseq.completed_jobs where queue = any($1)) as \"left!\"",
        queues,
    )
    .fetch_one(pool)
    .await
}

/// The queues' live jobs on the cluster.
pub async fn jobs_left(pool: &PgPool, queues: &[String]) -> SqlResult<i64> {
    sqlx::query_scalar!(
        r#"select count(*) as "count!" from leaseq.jobs where queue = any($1)"#,
        queues,
    )
    .fetch_one(pool)
    .await
}

/// Gives the bucket to `to` for good and moves the epoch on; returns the
/// new epoch.
pub async fn finish_move(home: &PgPool, bucket: u32, to: ClusterId) -> SqlResult<i64> {
    let mut tx = home.begin().await?;
    sqlx::query!(
        "update leaseq.placement set cluster = $2, moving_to = null where bucket = $1",
        bucket as i32,
        to.0 as i16,
    )
    .execute(&mut *tx)
    .await?;
    let epoch = bump_epoch(&mut tx).await?;
    tx.commit().await?;
    Ok(epoch)
}

/// Deletes the queues' rows (their settings) from the cluster.
pub async fn delete_queue_rows(pool: &PgPool, queues: &[String]) -> SqlResult<()> {
    sqlx::query!("delete from leaseq.queues where name = any($1)", queues)
        .execute(pool)
        .await?;
    Ok(())
}

// ---- copies between clusters (a move, the sweep) ----

/// A table whose rows move with their queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// Waiting jobs only (`state = 'available'`): leased ones stay where
    /// their token says.
    Jobs,
    DeadJobs,
    /// Completed records kept for the queue's retention.
    CompletedJobs,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Jobs => "jobs",
            Table::DeadJobs => "dead_jobs",
            Table::CompletedJobs => "completed_jobs",
        }
    }
}

/// Distinct queues of `table` on a cluster, by a skip scan of the index
/// that leads with the queue (`jobs_ready` for waiting jobs,
/// `dead_jobs_queue`): one index probe per queue, not a scan of the table.
pub async fn queues_holding(pool: &PgPool, table: Table) -> Result<Vec<String>> {
    let (filter, first) = if table == Table::Jobs {
        ("and state = 'available'", "where state = 'available'")
    } else {
        ("", "")
    };
    let table = table.name();
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "with recursive q(queue) as ( \
             (select queue from leaseq.{table} {first} order by queue limit 1) \
             union all \
             select (select t.queue from leaseq.{table} t where t.queue > q.queue {filter} \
                     order by t.queue limit 1) \
             from q where q.queue is not null) \
         select queue from q where queue is not null"
    )))
    .fetch_all(pool)
    .await?)
}

/// Creates the queues' rows on `dest` with the source's settings; rows that
/// exist there already are replaced when `replace`, else kept.
pub async fn copy_queue_rows(
    source: &PgPool,
    dest: &PgPool,
    queues: &[String],
    replace: bool,
) -> Result<()> {
    // As JSON text: one statement whatever the table's columns are (the
    // schema is the same on every cluster).
    let rows: String = sqlx::query_scalar!(
        r#"select coalesce(json_agg(q), '[]')::text as "rows!" from leaseq.queues q where name = any($1)"#,
        queues as &[String],
    )
    .fetch_one(source)
    .await?;
    // $1 is sent as text, as before (`as String`): sqlx maps `json` to
    // serde_json, which leaseq does not use.
    let mut tx = dest.begin().await?;
    if replace {
        sqlx::query!(
            "delete from leaseq.queues where name in \
             (select name from json_populate_recordset(null::leaseq.queues, $1::json))",
            &rows as &String,
        )
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query!(
        "insert into leaseq.queues select * from json_populate_recordset(null::leaseq.queues, $1::json) \
         on conflict (name) do nothing",
        rows as String,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// One copy transaction of up to `batch` rows of `table`: locked on the
/// source, inserted on the destination with tombstones (skipping ids
/// already tombstoned: a repeated copy), committed there, then deleted on
/// the source. Returns how many.
pub async fn copy_batch(
    source: &PgPool,
    dest: &PgPool,
    queues: &[String],
    table: Table,
    batch: i64,
) -> Result<u64> {
    let waiting = if table == Table::Jobs {
        "and state = 'available'"
    } else {
        ""
    };
    let name = table.name();
    let mut src = source.begin().await?;
    let (rows, ids): (String, Vec<Uuid>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "with picked as (select * from leaseq.{name} where queue = any($1) {waiting} \
         order by id limit $2 for update skip locked) \
         select coalesce(json_agg(p), '[]')::text, coalesce(array_agg(p.id), '{{}}') from picked p"
    )))
    .bind(queues)
    .bind(batch)
    .fetch_one(&mut *src)
    .await?;
    if ids.is_empty() {
        src.commit().await?;
        return Ok(0);
    }
    let mut dst = dest.begin().await?;
    insert_copies(&mut dst, table, &rows, &ids).await?;
    dst.commit().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "delete from leaseq.{name} where id = any($1)"
    )))
    .bind(&ids)
    .execute(&mut *src)
    .await?;
    src.commit().await?;
    // The source no longer has them: the tombstones have done their work.
    sqlx::query!("delete from leaseq.moved_jobs where id = any($1)", &ids)
        .execute(dest)
        .await?;
    Ok(ids.len() as u64)
}

/// The destination's half of [`copy_batch`], in its transaction `dst`:
/// tombstones for `ids` and the rows (`rows`, JSON) whose ids were not
/// tombstoned already.
async fn insert_copies(
    dst: &mut PgConnection,
    table: Table,
    rows: &str,
    ids: &[Uuid],
) -> Result<()> {
    let name = table.name();
    // Rows of ids already tombstoned were copied by an earlier pass whose
    // source transaction did not commit: only the delete below is left.
    // Every other row must arrive: the source's copy is deleted next.
    let (fresh, inserted): (Vec<Uuid>, Vec<Uuid>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "with fresh as (insert into leaseq.moved_jobs (id) select unnest($2::uuid[]) \
         on conflict (id) do nothing returning id), \
         ins as (insert into leaseq.{name} select r.* \
         from json_populate_recordset(null::leaseq.{name}, $1::json) r \
         where r.id in (select id from fresh) on conflict do nothing returning id) \
         select coalesce((select array_agg(id) from fresh), '{{}}'), \
                coalesce((select array_agg(id) from ins), '{{}}')"
    )))
    .bind(rows)
    .bind(ids)
    .fetch_one(&mut *dst)
    .await?;
    if inserted.len() >= fresh.len() {
        return Ok(());
    }
    // A live job of the same queue holds the row's dedup key on the
    // destination (an Enqueue routed there during the move checks
    // the source too, so these come from `leaseq.enqueue()` on the
    // wrong database, as stray jobs do). Both were answered as new
    // jobs: the row arrives without its dedup key rather than not at
    // all. Anything else that did not insert fails the copy.
    let missing: Vec<Uuid> = fresh
        .iter()
        .filter(|id| !inserted.contains(id))
        .copied()
        .collect();
    let kept: Vec<Uuid> = if table == Table::Jobs {
        sqlx::query_scalar(
            "insert into leaseq.jobs select r.* from jsonb_array_elements($1::jsonb) e \
             cross join lateral jsonb_populate_record(null::leaseq.jobs, e - 'dedup_key') r \
             where r.id = any($2) on conflict do nothing returning id",
        )
        .bind(rows)
        .bind(&missing)
        .fetch_all(&mut *dst)
        .await?
    } else {
        Vec::new()
    };
    if kept.len() < missing.len() {
        return Err(Error::Internal(
            "a row copied between clusters conflicted with one there: copy aborted",
        ));
    }
    warn!(
        jobs = ?kept,
        "jobs copied between clusters without their dedup key: a live job of their queue holds it there"
    );
    Ok(())
}

/// Wakes the queues' consumers on every broker (they all LISTEN on `pool`).
pub async fn wake(pool: &PgPool, queues: &[String]) {
    let r = sqlx::query!(
        "select pg_notify($1, 'placement:0:' || q) from unnest($2::text[]) as q",
        crate::channels::WAKE,
        queues as &[String],
    )
    .execute(pool)
    .await;
    if let Err(e) = r {
        warn!(error = %e, "bucket move: wake-up failed; the fallback poll will find the jobs");
    }
}
