//! SQL of the admin API: queue settings and statistics, job inspection
//! (live, dead and completed jobs), cancellation, dead-letter requeue and
//! purge. Long statements are in `sql/admin_*.sql`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

pub use crate::domain::QueueRow;

use super::Store;
use crate::domain::{JobId, LeaseToken, QueueName};
use crate::error::{Error, Result};

/// Settings to change; `None` leaves a setting as it is.
#[derive(Clone, Debug, Default)]
pub struct QueueUpdate {
    pub default_lease_ms: Option<i64>,
    pub max_attempts: Option<i32>,
    pub backoff_base_ms: Option<i64>,
    pub backoff_cap_ms: Option<i64>,
    /// Some(None) clears it.
    pub completed_retention_ms: Option<Option<i64>>,
    pub paused: Option<bool>,
    /// Some(None) removes the limit.
    pub concurrency_limit: Option<Option<i32>>,
    /// Some(None) removes the limit (and the burst). Refills the bucket.
    pub rate_limit: Option<Option<f64>>,
    /// Some(None) = the default, max(1, ceil(rate_limit)). Refills the bucket.
    pub rate_burst: Option<Option<i32>>,
    pub ordered_by_key: Option<bool>,
    /// Some(None) clears it.
    pub key_concurrency: Option<Option<i32>>,
    pub fair_by_key: Option<bool>,
    /// Some(None) removes the limit (and the burst). Refills every key's
    /// bucket.
    pub key_rate_limit: Option<Option<f64>>,
    /// Some(None) = the default. Refills every key's bucket.
    pub key_rate_burst: Option<Option<i32>>,
    /// Replaces the whole list (empty = none).
    pub key_overrides: Option<Vec<crate::domain::KeyOverride>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    Available,
    Scheduled,
    Leased,
    Dead,
    /// Acked and kept for the queue's completed retention.
    Completed,
}

impl JobState {
    fn sql(self) -> &'static str {
        match self {
            JobState::Available => "available",
            JobState::Scheduled => "scheduled",
            JobState::Leased => "leased",
            JobState::Dead => "dead",
            JobState::Completed => "completed",
        }
    }
}

/// A live, dead or completed job.
#[derive(Clone, Debug)]
pub struct JobRow {
    pub id: JobId,
    pub queue: String,
    pub state: JobState,
    pub payload: Vec<u8>,
    pub headers: HashMap<String, String>,
    pub priority: i32,
    pub attempt: i32,
    pub max_attempts: Option<i32>,
    pub dedup_key: Option<String>,
    pub key: Option<String>,
    pub enqueued_at: DateTime<Utc>,
    pub run_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub leased_by: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub dead_reason: Option<String>,
    pub died_at: Option<DateTime<Utc>>,
    pub completed_at: Option<DateTime<Utc>>,
    pub completed_by: Option<String>,
    /// Completed jobs acked with a result (`AckRequest.result`).
    pub result: Option<Vec<u8>>,
    /// Live jobs: the holder's latest progress report.
    pub progress: Option<JobProgress>,
}

/// A live job's latest progress report (`leaseq.job_progress`).
#[derive(Clone, Debug)]
pub struct JobProgress {
    pub fraction: f32,
    pub message: String,
    pub at: DateTime<Utc>,
}

/// A cancelled job: its queue, and the lease it had (whose stream's credit
/// must come back).
#[derive(Clone, Debug)]
pub struct Cancelled {
    pub queue: String,
    pub lease: Option<(Option<Uuid>, LeaseToken)>,
}

// Live jobs: `state` says 'scheduled' for waiting jobs not yet due. $P says
// whether to return payloads.
const LIVE_COLUMNS: &str = "id, queue, \
    case when state = 'available' and run_at > now() then 'scheduled' else state end as state, \
    case when $P then payload else ''::bytea end as payload, headers::text as headers, \
    priority, attempt, max_attempts, dedup_key, key, enqueued_at, run_at, expires_at, last_error, \
    leased_by, lease_expires_at, null::text as reason, null::timestamptz as died_at, \
    null::timestamptz as completed_at, null::text as completed_by, null::bytea as result, \
    (select p.fraction from leaseq.job_progress p where p.job_id = id) as progress, \
    (select p.message from leaseq.job_progress p where p.job_id = id) as progress_message, \
    (select p.at from leaseq.job_progress p where p.job_id = id) as progress_at";
const DEAD_COLUMNS: &str = "id, queue, 'dead' as state, \
    case when $P then payload else ''::bytea end as payload, headers::text as headers, \
    priority, attempt, max_attempts, dedup_key, key, enqueued_at, null::timestamptz as run_at, \
    null::timestamptz as expires_at, last_error, null::text as leased_by, \
    null::timestamptz as lease_expires_at, reason, died_at, null::timestamptz as completed_at, \
    null::text as completed_by, null::bytea as result, null::real as progress, \
    null::text as progress_message, null::timestamptz as progress_at";
const COMPLETED_COLUMNS: &str = "id, queue, 'completed' as state, \
    case when $P then payload else ''::bytea end as payload, headers::text as headers, \
    priority, attempt, max_attempts, dedup_key, key, enqueued_at, null::timestamptz as run_at, \
    null::timestamptz as expires_at, last_error, null::text as leased_by, \
    null::timestamptz as lease_expires_at, null::text as reason, null::timestamptz as died_at, \
    completed_at, completed_by, case when $P then result end as result, null::real as progress, \
    null::text as progress_message, null::timestamptz as progress_at";

fn job_row(r: &PgRow) -> Result<JobRow> {
    let headers: String = r.try_get("headers")?;
    let state: String = r.try_get("state")?;
    Ok(JobRow {
        id: JobId(r.try_get("id")?),
        queue: r.try_get("queue")?,
        state: match state.as_str() {
            "available" => JobState::Available,
            "scheduled" => JobState::Scheduled,
            "leased" => JobState::Leased,
            "dead" => JobState::Dead,
            "completed" => JobState::Completed,
            _ => return Err(Error::Internal("unknown job state in the database")),
        },
        payload: r.try_get("payload")?,
        headers: serde_json::from_str(&headers).unwrap_or_default(),
        priority: r.try_get("priority")?,
        attempt: r.try_get("attempt")?,
        max_attempts: r.try_get("max_attempts")?,
        dedup_key: r.try_get("dedup_key")?,
        key: r.try_get("key")?,
        enqueued_at: r.try_get("enqueued_at")?,
        run_at: r.try_get("run_at")?,
        expires_at: r.try_get("expires_at")?,
        last_error: r.try_get("last_error")?,
        leased_by: r.try_get("leased_by")?,
        lease_expires_at: r.try_get("lease_expires_at")?,
        dead_reason: r.try_get("reason")?,
        died_at: r.try_get("died_at")?,
        completed_at: r.try_get("completed_at")?,
        completed_by: r.try_get("completed_by")?,
        result: r.try_get("result")?,
        progress: match r.try_get::<Option<DateTime<Utc>>, _>("progress_at")? {
            Some(at) => Some(JobProgress {
                fraction: r.try_get("progress")?,
                message: r.try_get("progress_message")?,
                at,
            }),
            None => None,
        },
    })
}

/// The most keys with jobs waiting counted per queue
/// (`QueueStats.keys_waiting`): the count walks them one index probe each
/// (admin_queue_stats.sql), so this bounds its cost. docs/design/keys.md has
/// the measured cost.
pub const KEYS_COUNTED: i64 = 10_000;

/// Statistics of the named queues (`names`), or of a page of all queues in
/// name order after `after`.
pub async fn queue_stats(
    store: &Store,
    names: Option<&[QueueName]>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<QueueRow>> {
    let names: Option<Vec<&str>> = names.map(|n| n.iter().map(QueueName::as_str).collect());
    // With the sweeps' planner settings: a generic plan made on an empty
    // table read a queue's whole jobs_ready and sorted it for every key
    // the count walks (27 s for 10,000 keys); so it probes jobs_key
    // (tests/plans.rs).
    let mut tx = store.sweep_tx().await?;
    let rows = sqlx::query_file!(
        "src/store/sql/admin_queue_stats.sql",
        names as Option<Vec<&str>>,
        after,
        limit,
        store.broker_id,
        KEYS_COUNTED,
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let (streams, credit) = store.metrics.streams.get(&r.name);
            QueueRow {
                default_lease_ms: r.default_lease_ms,
                max_attempts: r.max_attempts,
                backoff_base_ms: r.backoff_base_ms,
                backoff_cap_ms: r.backoff_cap_ms,
                completed_retention_ms: r.completed_retention_ms,
                paused: r.paused,
                concurrency_limit: r.concurrency_limit,
                rate_limit: r.rate_limit,
                rate_burst: r.rate_burst,
                ordered_by_key: r.ordered_by_key,
                key_concurrency: r.key_concurrency,
                fair_by_key: r.fair_by_key,
                key_rate_limit: r.key_rate_limit,
                key_rate_burst: r.key_rate_burst,
                key_overrides: crate::domain::KeyOverride::from_json(r.key_overrides),
                created_at: r.created_at,
                available: r.available,
                scheduled: r.scheduled,
                leased: r.leased,
                leased_here: r.leased_here,
                dead: r.dead,
                consumers: r.consumers,
                oldest_age_ms: r.oldest_age_ms,
                keys_waiting: r.keys_waiting.min(KEYS_COUNTED),
                keys_waiting_capped: r.keys_waiting > KEYS_COUNTED,
                keys_leased: r.keys_leased,
                streams,
                credit,
                name: r.name,
            }
        })
        .collect())
}

/// Changes a queue's settings; creates the queue first when `create`.
/// Returns false when the queue does not exist (and `create` is false).
pub async fn update_queue(
    store: &Store,
    name: &QueueName,
    update: &QueueUpdate,
    create: bool,
) -> Result<bool> {
    let mut tx = store.pool.begin().await?;
    if create {
        Store::ensure_queues(&mut *tx, std::slice::from_ref(name)).await?;
    }
    let Some(cur) = sqlx::query!(
        "select backoff_base_ms, backoff_cap_ms from leaseq.queues where name = $1 for update",
        name.as_str(),
    )
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(false);
    };
    // The rule spans two settings, so it is checked on the merged values.
    let base = update.backoff_base_ms.unwrap_or(cur.backoff_base_ms);
    let cap = update.backoff_cap_ms.unwrap_or(cur.backoff_cap_ms);
    if base > cap {
        return Err(Error::invalid(
            "backoff_base",
            format!("must not exceed backoff_cap ({base} ms > {cap} ms)"),
        ));
    }
    sqlx::query!(
        "update leaseq.queues set \
            default_lease_ms = coalesce($2, default_lease_ms), \
            max_attempts = coalesce($3, max_attempts), \
            backoff_base_ms = $4, \
            backoff_cap_ms = $5, \
            completed_retention_ms = case when $6 then $7 else completed_retention_ms end, \
            paused = coalesce($8, paused), \
            concurrency_limit = case when $9 then $10 else concurrency_limit end, \
            rate_limit = case when $11 then $12 else rate_limit end, \
            rate_burst = case when $11 and $12 is null then null when $13 then $14 else rate_burst end, \
            rate_tokens = case when $11 or $13 then null else rate_tokens end, \
            ordered_by_key = coalesce($15, ordered_by_key), \
            key_concurrency = case when $16 then $17 when $15 = false then null else key_concurrency end, \
            fair_by_key = coalesce($18, fair_by_key), \
            key_rate_limit = case when $19 then $20 else key_rate_limit end, \
            key_rate_burst = case when $19 and $20 is null then null when $21 then $22 else key_rate_burst end, \
            key_overrides = case when $23 then $24 else key_overrides end, \
            fair_cursor = case when $18 is not null then null else fair_cursor end \
         where name = $1 \
         returning name",
        name.as_str(),
        update.default_lease_ms,
        update.max_attempts,
        base,
        cap,
        update.completed_retention_ms.is_some(),
        update.completed_retention_ms.flatten(),
        update.paused,
        update.concurrency_limit.is_some(),
        update.concurrency_limit.flatten(),
        update.rate_limit.is_some(),
        update.rate_limit.flatten(),
        update.rate_burst.is_some(),
        update.rate_burst.flatten(),
        update.ordered_by_key,
        update.key_concurrency.is_some(),
        update.key_concurrency.flatten(),
        update.fair_by_key,
        update.key_rate_limit.is_some(),
        update.key_rate_limit.flatten(),
        update.key_rate_burst.is_some(),
        update.key_rate_burst.flatten(),
        update.key_overrides.is_some(),
        update
            .key_overrides
            .as_deref()
            .and_then(crate::domain::KeyOverride::to_json),
    )
    .fetch_one(&mut *tx)
    .await?;
    refill_key_buckets(&mut tx, name, update).await?;
    tx.commit().await?;
    Ok(true)
}

/// New per-key rates: every key's bucket starts full again.
async fn refill_key_buckets(
    tx: &mut sqlx::PgConnection,
    name: &QueueName,
    update: &QueueUpdate,
) -> Result<()> {
    if update.key_rate_limit.is_some()
        || update.key_rate_burst.is_some()
        || update.key_overrides.is_some()
    {
        sqlx::query!(
            "delete from leaseq.key_buckets where queue = $1",
            name.as_str()
        )
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// What PurgeQueue deleted.
#[derive(Clone, Copy, Debug)]
pub struct Purged {
    /// Waiting jobs.
    pub waiting: u64,
    /// Completed jobs kept for the queue's retention.
    pub completed: u64,
}

/// Deletes the queue's waiting jobs (ready and scheduled), its completed
/// records and the dedup keys its completed jobs hold (`unique_for`): a
/// purged queue starts over. None = no such queue. Rows being leased right now are locked;
/// the delete waits for them and then skips them, since they are no longer
/// 'available'. A job acked after this statement's snapshot is recorded as
/// completed and stays.
pub async fn purge_queue(store: &Store, name: &QueueName) -> Result<Option<Purged>> {
    let row = sqlx::query!(
        "with q as (select name from leaseq.queues where name = $1), \
         gone as (delete from leaseq.jobs where queue = $1 and state = 'available' returning 1), \
         done as (delete from leaseq.completed_jobs where queue = $1 returning 1), \
         held as (delete from leaseq.dedup_holds where queue = $1) \
         select (select count(*) from q) as \"found!\", (select count(*) from gone) as \"purged!\", \
             (select count(*) from done) as \"completed!\"",
        name.as_str(),
    )
    .fetch_one(&store.pool)
    .await?;
    Ok((row.found > 0).then_some(Purged {
        waiting: row.purged as u64,
        completed: row.completed as u64,
    }))
}

/// A live job, else a dead one, else a completed one, else None.
pub async fn get_job(store: &Store, id: JobId) -> Result<Option<JobRow>> {
    let sql = format!(
        "select {} from leaseq.jobs where id = $1 \
         union all select {} from leaseq.dead_jobs where id = $1 \
         union all select {} from leaseq.completed_jobs where id = $1",
        LIVE_COLUMNS.replace("$P", "true"),
        DEAD_COLUMNS.replace("$P", "true"),
        COMPLETED_COLUMNS.replace("$P", "true"),
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.0)
        .fetch_optional(&store.pool)
        .await?;
    row.as_ref().map(job_row).transpose()
}

/// Payload bytes one page carries at most (plus one payload): a page of big
/// payloads ends early instead of exceeding the 4 MiB default receive limit
/// of gRPC clients (with the default 1 MiB payload limit).
pub const PAGE_PAYLOAD_BUDGET: i64 = 2 * 1024 * 1024;

/// Which jobs a listing shows.
#[derive(Clone, Debug, Default)]
pub struct JobFilter {
    /// None = every queue.
    pub queue: Option<QueueName>,
    /// None = every live job; Some(Dead) = dead letters; Some(Completed) =
    /// completed jobs kept for their queue's retention.
    pub state: Option<JobState>,
    /// Only jobs of this key (an exact match, checked by the caller against
    /// MAX_KEY_LEN).
    pub key: Option<String>,
    /// The console's search: only jobs whose id is it, or whose dedup key,
    /// last error or payload (as UTF-8 bytes) contains it.
    pub search: Option<String>,
}

/// A page of jobs in id (= enqueue) order after `after`, and whether there
/// may be more.
///
/// The search and the key are filters on the same ordered scan, so a search
/// that matches little reads the queue's jobs (or every job, without a
/// queue) until the page is full. A key with a queue is read from the
/// jobs_key index (queue, key, id) for live jobs; dead and completed jobs
/// have no key index, and are filtered on their queue's scan.
pub async fn list_jobs(
    store: &Store,
    filter: &JobFilter,
    after: Option<Uuid>,
    limit: i64,
    include_payload: bool,
) -> Result<(Vec<JobRow>, bool)> {
    let state = filter.state;
    let payload = if include_payload { "true" } else { "false" };
    // Dead and completed jobs each have a table of their own.
    let kept = match state {
        Some(JobState::Dead) => Some(("dead_jobs", DEAD_COLUMNS)),
        Some(JobState::Completed) => Some(("completed_jobs", COMPLETED_COLUMNS)),
        _ => None,
    };
    let sql = if let Some((table, columns)) = kept {
        format!(
            "select {} from leaseq.{table} \
             where ($1::text is null or queue = $1) and ($2::uuid is null or id > $2) {SEARCH} \
               and ($7::text is null or key = $7) \
             order by id limit $3",
            columns.replace("$P", payload)
        )
    } else {
        // The state filter is on the derived state, so 'available' means
        // deliverable now and 'scheduled' waiting for its run_at.
        format!(
            "select * from (select {} from leaseq.jobs \
             where ($1::text is null or queue = $1) and ($2::uuid is null or id > $2) {SEARCH} \
               and ($7::text is null or key = $7) \
               and ($4::text is null or state = case when $4 = 'leased' then 'leased' else 'available' end)) j \
             where ($4::text is null or j.state = $4) \
             order by id limit $3",
            LIVE_COLUMNS.replace("$P", payload)
        )
    };
    // Keep rows while the payload bytes before them are under the budget.
    let sql = format!(
        "select * from (\
             select p.*, count(*) over () as fetched, \
                 sum(octet_length(p.payload)) over (order by p.id) - octet_length(p.payload) as bytes_before \
             from ({sql}) p\
         ) s where s.bytes_before < $5 order by s.id"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(filter.queue.as_ref().map(QueueName::as_str))
        .bind(after)
        .bind(limit)
        .bind(state.map(JobState::sql))
        .bind(PAGE_PAYLOAD_BUDGET)
        .bind(filter.search.as_deref())
        .bind(filter.key.as_deref())
        .fetch_all(&store.pool)
        .await?;
    let fetched: i64 = match rows.first() {
        Some(r) => r.try_get("fetched")?,
        None => 0,
    };
    let more = fetched == limit || (rows.len() as i64) < fetched;
    Ok((rows.iter().map(job_row).collect::<Result<_>>()?, more))
}

/// The console's job search, `$6` of [`list_jobs`]: the id, or text in the
/// dedup key, the last error or the payload.
const SEARCH: &str = "and ($6::text is null or id::text = $6 \
     or strpos(coalesce(dedup_key, ''), $6) > 0 \
     or strpos(coalesce(last_error, ''), $6) > 0 \
     or position(convert_to($6, 'UTF8') in payload) > 0)";

/// One failed attempt of a job: its number, when it ended, and its error.
#[derive(Clone, Debug, PartialEq)]
pub struct AttemptError {
    pub attempt: i32,
    pub at: DateTime<Utc>,
    pub error: Option<String>,
}

/// The failed attempts of job `id` recorded on this cluster (by the
/// `jobs_failed_attempt` trigger), oldest first, at most `limit` (the
/// latest).
pub async fn attempt_errors(store: &Store, id: JobId, limit: i64) -> Result<Vec<AttemptError>> {
    let rows = sqlx::query!(
        "select attempt, at, error from (
             select attempt, at, error from leaseq.job_errors
             where job_id = $1 order by at desc limit $2) e
         order by at",
        id.0,
        limit,
    )
    .fetch_all(&store.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| AttemptError {
            attempt: r.attempt,
            at: r.at,
            error: r.error,
        })
        .collect())
}

/// Deletes the attempt errors of jobs that are gone (in none of jobs,
/// dead_jobs, completed_jobs), among the first `limit` rows after job id
/// `after`; returns how many, and where the next call starts (None: from
/// the beginning again). A job moves between its tables in one statement
/// (dead-lettered, requeued, acked with retention), and its error rows are
/// written in the transaction that fails its attempt, so a row is never
/// seen without its job while the job exists.
pub async fn delete_orphan_errors(
    store: &Store,
    after: Option<Uuid>,
    limit: i64,
) -> Result<(u64, Option<Uuid>)> {
    let row = sqlx::query!(
        r#"with batch as (
               select job_id, at from leaseq.job_errors
               where $1::uuid is null or job_id > $1
               order by job_id limit $2
           ),
           gone as (
               delete from leaseq.job_errors e
               using batch b
               where e.job_id = b.job_id and e.at = b.at
                 and not exists (select 1 from leaseq.jobs j where j.id = b.job_id)
                 and not exists (select 1 from leaseq.dead_jobs d where d.id = b.job_id)
                 and not exists (select 1 from leaseq.completed_jobs c where c.id = b.job_id)
               returning 1
           )
           select (select count(*) from gone) as "deleted!", (select count(*) from batch) as "seen!",
               (select job_id from batch order by job_id desc limit 1) as last"#,
        after,
        limit,
    )
    .fetch_one(&store.pool)
    .await?;
    let next = if row.seen < limit { None } else { row.last };
    Ok((row.deleted as u64, next))
}

/// Deletes a live job. None = no live job with that id.
pub async fn cancel_job(store: &Store, id: JobId) -> Result<Option<Cancelled>> {
    // The cancel is remembered (leaseq.cancelled_jobs) in the same
    // statement, for WaitJob on any replica.
    let row = sqlx::query!(
        "with gone as (delete from leaseq.jobs where id = $1 \
             returning queue, lease_token, lease_broker), \
         kept as (insert into leaseq.cancelled_jobs (id, queue) select $1, g.queue from gone g \
             on conflict (id) do nothing) \
         select queue as \"queue!\", lease_token, lease_broker from gone",
        id.0,
    )
    .fetch_optional(&store.pool)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(Cancelled {
        queue: row.queue,
        lease: row
            .lease_token
            .map(|t| (row.lease_broker, LeaseToken(t, store.cluster))),
    }))
}

/// Per consumer name, how many jobs of `queue` it holds here (leased by a
/// stream of any replica).
pub async fn in_flight(store: &Store, queue: &QueueName) -> Result<Vec<(String, i64)>> {
    let rows = sqlx::query!(
        "select coalesce(leased_by, '') as \"consumer!\", count(*) as \"n!\" from leaseq.jobs \
         where queue = $1 and state = 'leased' group by 1 order by 1",
        queue.as_str(),
    )
    .fetch_all(&store.pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.consumer, r.n)).collect())
}

/// Does the queue exist?
pub async fn queue_exists(store: &Store, name: &QueueName) -> Result<bool> {
    Ok(sqlx::query_scalar!(
        r#"select exists(select 1 from leaseq.queues where name = $1) as "exists!""#,
        name.as_str(),
    )
    .fetch_one(&store.pool)
    .await?)
}

/// Moves dead letters back to their queues (see admin_requeue.sql). Returns
/// (jobs requeued per queue, dead letters matched).
pub async fn requeue_dead(
    store: &Store,
    ids: Option<&[JobId]>,
    queue: Option<&QueueName>,
) -> Result<(Vec<(QueueName, i64)>, i64)> {
    let ids: Option<Vec<Uuid>> = ids.map(|ids| ids.iter().map(|i| i.0).collect());
    let rows = sqlx::query_file!(
        "src/store/sql/admin_requeue.sql",
        ids.as_deref(),
        queue.map(QueueName::as_str),
    )
    .fetch_all(&store.pool)
    .await?;
    let mut matched = 0;
    let mut moved = Vec::new();
    for r in rows {
        match r.queue {
            None => matched = r.matched,
            Some(q) => moved.push((
                QueueName::parse(&q).ok_or(Error::Internal("bad queue name in db"))?,
                r.n,
            )),
        }
    }
    Ok((moved, matched))
}

/// Deletes dead letters: the listed ids (within `queue` if given), or every
/// one of `queue`.
pub async fn purge_dead(
    store: &Store,
    ids: Option<&[JobId]>,
    queue: Option<&QueueName>,
) -> Result<u64> {
    let ids: Option<Vec<Uuid>> = ids.map(|ids| ids.iter().map(|i| i.0).collect());
    let done = sqlx::query!(
        "delete from leaseq.dead_jobs \
         where ($1::uuid[] is null or id = any($1)) and ($2::text is null or queue = $2)",
        ids.as_deref(),
        queue.map(QueueName::as_str),
    )
    .execute(&store.pool)
    .await?;
    Ok(done.rows_affected())
}

/// How ListKeys orders the keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyOrder {
    /// By key (the database collation's order), paginated.
    Key,
    /// Most jobs waiting first, then by key; one page.
    Waiting,
}

/// One key of a queue's live jobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRow {
    pub key: String,
    /// Available or scheduled.
    pub waiting: i64,
    pub leased: i64,
    /// now - run_at of the key's oldest deliverable job.
    pub oldest_age_ms: Option<i64>,
}

/// A page of the keys of `queue`'s live jobs, with their counts, and
/// whether there may be more. By key: after `after`, reading the jobs of
/// the page's keys only (a streaming group over jobs_key, which holds the
/// jobs not leased, merged with jobs_key_leased, both in key order). By jobs waiting: the top `limit`, reading every keyed job of the
/// queue.
pub async fn list_keys(
    store: &Store,
    queue: &QueueName,
    order: KeyOrder,
    after: Option<&str>,
    limit: i64,
) -> Result<(Vec<KeyRow>, bool)> {
    // The sweeps' planner settings, as for the key count of queue_stats: a
    // page by key then reads jobs_key in order whatever the statistics.
    let mut tx = store.sweep_tx().await?;
    let rows = match order {
        KeyOrder::Key => {
            sqlx::query_as!(
                KeyRow,
                r#"select j.key as "key!",
                   count(*) filter (where j.state = 'available') as "waiting!",
                   count(*) filter (where j.state = 'leased') as "leased!",
                   (extract(epoch from (now() - min(j.run_at)
                       filter (where j.state = 'available' and j.run_at <= now()))) * 1000)::int8
                       as oldest_age_ms
               from (
                   (select e.key, e.state, e.run_at from leaseq.jobs e
                    where e.queue = $1 and e.key is not null and e.state <> 'leased'
                      and ($2::text is null or e.key > $2)
                    order by e.key)
                   union all
                   (select e.key, e.state, e.run_at from leaseq.jobs e
                    where e.queue = $1 and e.key is not null and e.state = 'leased'
                      and ($2::text is null or e.key > $2)
                    order by e.key)
               ) j
               group by j.key
               order by j.key
               limit $3"#,
                queue.as_str(),
                after,
                limit,
            )
            .fetch_all(&mut *tx)
            .await?
        }
        KeyOrder::Waiting => {
            sqlx::query_as!(
                KeyRow,
                r#"select j.key as "key!",
                   count(*) filter (where j.state = 'available') as "waiting!",
                   count(*) filter (where j.state = 'leased') as "leased!",
                   (extract(epoch from (now() - min(j.run_at)
                       filter (where j.state = 'available' and j.run_at <= now()))) * 1000)::int8
                       as oldest_age_ms
               from leaseq.jobs j
               where j.queue = $1 and j.key is not null
               group by j.key
               order by 2 desc, j.key
               limit $2"#,
                queue.as_str(),
                limit,
            )
            .fetch_all(&mut *tx)
            .await?
        }
    };
    tx.commit().await?;
    let more = order == KeyOrder::Key && rows.len() as i64 == limit;
    Ok((rows, more))
}
