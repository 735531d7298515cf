//! The SQL of schedules: `leaseq.schedules` (home cluster) and
//! `leaseq.schedule_ticks` (the cluster of each tick's job). Functions take
//! any connection, so the schedule loop composes them in one transaction.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::{CatchUp, Definition, MAX_SCHEDULES, Overlap, Spec, Template};
use crate::domain::QueueName;
use crate::error::{Error, Result};

/// Advisory lock (transaction-level) that serialises creates, so the count
/// against [`MAX_SCHEDULES`] holds (`leaseqsc` in ASCII).
const CREATE_LOCK: i64 = 0x6c65_6173_6571_7363;

/// A row of `leaseq.schedules`.
#[derive(Clone, Debug)]
pub struct Row {
    pub id: Uuid,
    pub name: String,
    pub cron: String,
    pub time_zone: String,
    pub queue: String,
    pub payload: Vec<u8>,
    pub headers: String,
    pub priority: i32,
    pub max_attempts: Option<i32>,
    pub ttl_ms: Option<i64>,
    pub overlap: String,
    pub catch_up: String,
    pub catch_up_limit: i32,
    pub paused: bool,
    pub next_run_at: DateTime<Utc>,
    pub last_tick_at: Option<DateTime<Utc>>,
    pub last_job_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Row {
    /// The definition the row holds. The broker wrote it from a validated
    /// one; a row it cannot read (edited by hand) is an error naming it.
    pub fn definition(&self) -> Result<Definition> {
        let spec = Spec::parse(&self.cron, &self.time_zone).map_err(|_| {
            Error::invalid(
                format!("schedule {:?}", self.name),
                "the stored cron or time zone does not parse",
            )
        })?;
        let queue = QueueName::parse(&self.queue)
            .ok_or(Error::Internal("a stored schedule names an invalid queue"))?;
        let headers = serde_json::from_str(&self.headers).unwrap_or_default();
        Ok(Definition {
            name: self.name.clone(),
            cron: self.cron.clone(),
            spec,
            template: Template {
                queue,
                payload: self.payload.clone(),
                headers,
                priority: self.priority,
                max_attempts: self.max_attempts,
                ttl_ms: self.ttl_ms,
            },
            overlap: Overlap::from_db(&self.overlap),
            catch_up: CatchUp::from_db(&self.catch_up),
            catch_up_limit: self.catch_up_limit as u32,
            paused: self.paused,
        })
    }
}

/// Inserts a schedule; false when the name is taken. Over
/// [`MAX_SCHEDULES`], `LimitReached`.
pub async fn create(
    conn: &mut PgConnection,
    d: &Definition,
    next_run_at: DateTime<Utc>,
) -> Result<Option<Row>> {
    let mut tx = sqlx::Connection::begin(conn).await?;
    sqlx::query!("select pg_advisory_xact_lock($1)", CREATE_LOCK)
        .execute(&mut *tx)
        .await?;
    let n: i64 = sqlx::query_scalar!(r#"select count(*) as "n!" from leaseq.schedules"#)
        .fetch_one(&mut *tx)
        .await?;
    if n >= MAX_SCHEDULES {
        return Err(Error::LimitReached {
            limit: "schedules",
            what: format!("a deployment holds at most {MAX_SCHEDULES} schedules"),
        });
    }
    let headers = serde_json::to_string(&d.template.headers).unwrap_or_else(|_| "{}".into());
    let row = sqlx::query_as!(
        Row,
        r#"insert into leaseq.schedules
               (id, name, cron, time_zone, queue, payload, headers, priority, max_attempts,
                ttl_ms, overlap, catch_up, catch_up_limit, paused, next_run_at)
           values ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8, $9, $10, $11, $12, $13, $14, $15)
           on conflict (name) do nothing
           returning id, name, cron, time_zone, queue, payload, headers::text as "headers!",
               priority, max_attempts, ttl_ms, overlap, catch_up, catch_up_limit, paused,
               next_run_at, last_tick_at, last_job_id, created_at, updated_at"#,
        Uuid::now_v7(),
        &d.name,
        &d.cron,
        d.spec.zone_name(),
        d.template.queue.as_str(),
        &d.template.payload,
        headers,
        d.template.priority,
        d.template.max_attempts,
        d.template.ttl_ms,
        d.overlap.as_str(),
        d.catch_up.as_str(),
        d.catch_up_limit as i32,
        d.paused,
        next_run_at,
    )
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(row)
}

/// One schedule by name; `lock` takes its row lock (in the caller's
/// transaction), waiting for a schedule pass that holds it.
pub async fn get(conn: &mut PgConnection, name: &str, lock: bool) -> Result<Option<Row>> {
    let row = if lock {
        sqlx::query_as!(
            Row,
            r#"select id, name, cron, time_zone, queue, payload, headers::text as "headers!",
                   priority, max_attempts, ttl_ms, overlap, catch_up, catch_up_limit, paused,
                   next_run_at, last_tick_at, last_job_id, created_at, updated_at
               from leaseq.schedules where name = $1 for update"#,
            name,
        )
        .fetch_optional(conn)
        .await?
    } else {
        sqlx::query_as!(
            Row,
            r#"select id, name, cron, time_zone, queue, payload, headers::text as "headers!",
                   priority, max_attempts, ttl_ms, overlap, catch_up, catch_up_limit, paused,
                   next_run_at, last_tick_at, last_job_id, created_at, updated_at
               from leaseq.schedules where name = $1"#,
            name,
        )
        .fetch_optional(conn)
        .await?
    };
    Ok(row)
}

/// Schedules in name order after `after`, at most `limit`.
pub async fn list(conn: &mut PgConnection, after: Option<&str>, limit: i64) -> Result<Vec<Row>> {
    Ok(sqlx::query_as!(
        Row,
        r#"select id, name, cron, time_zone, queue, payload, headers::text as "headers!",
               priority, max_attempts, ttl_ms, overlap, catch_up, catch_up_limit, paused,
               next_run_at, last_tick_at, last_job_id, created_at, updated_at
           from leaseq.schedules where $1::text is null or name > $1
           order by name limit $2"#,
        after,
        limit,
    )
    .fetch_all(conn)
    .await?)
}

/// Writes a changed definition (the row locked by the caller) and its next
/// tick.
pub async fn update(
    conn: &mut PgConnection,
    id: Uuid,
    d: &Definition,
    next_run_at: DateTime<Utc>,
) -> Result<Row> {
    let headers = serde_json::to_string(&d.template.headers).unwrap_or_else(|_| "{}".into());
    Ok(sqlx::query_as!(
        Row,
        r#"update leaseq.schedules set
               cron = $2, time_zone = $3, queue = $4, payload = $5, headers = $6::text::jsonb,
               priority = $7, max_attempts = $8, ttl_ms = $9, overlap = $10, catch_up = $11,
               catch_up_limit = $12, paused = $13, next_run_at = $14, updated_at = now()
           where id = $1
           returning id, name, cron, time_zone, queue, payload, headers::text as "headers!",
               priority, max_attempts, ttl_ms, overlap, catch_up, catch_up_limit, paused,
               next_run_at, last_tick_at, last_job_id, created_at, updated_at"#,
        id,
        &d.cron,
        d.spec.zone_name(),
        d.template.queue.as_str(),
        &d.template.payload,
        headers,
        d.template.priority,
        d.template.max_attempts,
        d.template.ttl_ms,
        d.overlap.as_str(),
        d.catch_up.as_str(),
        d.catch_up_limit as i32,
        d.paused,
        next_run_at,
    )
    .fetch_one(conn)
    .await?)
}

/// Deletes a schedule; false if there was none of that name.
pub async fn delete(conn: &mut PgConnection, name: &str) -> Result<bool> {
    let n = sqlx::query!("delete from leaseq.schedules where name = $1", name)
        .execute(conn)
        .await?
        .rows_affected();
    Ok(n > 0)
}

/// The database's clock.
pub async fn now(conn: &mut PgConnection) -> Result<DateTime<Utc>> {
    Ok(sqlx::query_scalar!(r#"select now() as "now!""#)
        .fetch_one(conn)
        .await?)
}

/// Due schedules, locked for the caller's transaction; those another
/// broker's pass holds are skipped (it fires them).
pub async fn take_due(conn: &mut PgConnection, limit: i64) -> Result<Vec<Row>> {
    Ok(sqlx::query_as!(
        Row,
        r#"select id, name, cron, time_zone, queue, payload, headers::text as "headers!",
               priority, max_attempts, ttl_ms, overlap, catch_up, catch_up_limit, paused,
               next_run_at, last_tick_at, last_job_id, created_at, updated_at
           from leaseq.schedules
           where not paused and next_run_at <= now()
           order by next_run_at limit $1
           for update skip locked"#,
        limit,
    )
    .fetch_all(conn)
    .await?)
}

/// Moves a schedule on: its next tick, and the last job a tick enqueued
/// (unchanged when `last` is None).
pub async fn advance(
    conn: &mut PgConnection,
    id: Uuid,
    next_run_at: DateTime<Utc>,
    last: Option<(DateTime<Utc>, Uuid)>,
) -> Result<()> {
    sqlx::query!(
        "update leaseq.schedules set next_run_at = $2,
             last_tick_at = coalesce($3, last_tick_at), last_job_id = coalesce($4, last_job_id)
         where id = $1",
        id,
        next_run_at,
        last.map(|l| l.0),
        last.map(|l| l.1),
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Records a manual run on the schedule's row (RunSchedule).
pub async fn record_run(
    conn: &mut PgConnection,
    id: Uuid,
    tick: DateTime<Utc>,
    job: Uuid,
) -> Result<()> {
    sqlx::query!(
        "update leaseq.schedules set last_tick_at = $2, last_job_id = $3 where id = $1",
        id,
        tick,
        job,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Claims a tick: true if this is its first record (the caller then
/// inserts its job in the same transaction), false if it fired already.
pub async fn claim_tick(
    conn: &mut PgConnection,
    schedule: Uuid,
    tick: DateTime<Utc>,
    job: Uuid,
    manual: bool,
) -> Result<bool> {
    let n = sqlx::query!(
        "insert into leaseq.schedule_ticks (schedule_id, tick_at, job_id, manual)
         values ($1, $2, $3, $4) on conflict do nothing",
        schedule,
        tick,
        job,
        manual,
    )
    .execute(conn)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// Whether a job is live (waiting or leased) on this cluster.
pub async fn is_live(conn: &mut PgConnection, job: Uuid) -> Result<bool> {
    Ok(sqlx::query_scalar!(
        r#"select exists (select 1 from leaseq.jobs where id = $1) as "live!""#,
        job
    )
    .fetch_one(conn)
    .await?)
}

/// Deletes tick records older than a day, at most `limit`.
pub async fn expire_ticks(conn: &mut PgConnection, limit: i64) -> Result<u64> {
    Ok(sqlx::query!(
        "delete from leaseq.schedule_ticks where ctid in (
             select ctid from leaseq.schedule_ticks
             where at < now() - interval '1 day' limit $1)",
        limit,
    )
    .execute(conn)
    .await?
    .rows_affected())
}
