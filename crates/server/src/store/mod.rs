//! Every SQL statement leaseq runs, and the types they return.
//!
//! Statements live in `src/store/sql/*.sql`, each with the invariant it
//! protects written above it. Functions here take slices: callers (the
//! batchers in [`batch`] and the dispatcher) always work on many rows per
//! statement. Errors become [`crate::error::Error`] by SQLSTATE class.

pub mod admin;
pub mod batch;
pub mod limits;

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Executor, Postgres, Row};
use uuid::Uuid;

use crate::domain::{AckReq, ExtendReq, JobId, LeaseToken, NewJob, QueueName, Schedule};
use crate::error::{Error, Result};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// Applies pending migrations. Safe to run from several replicas at once
/// (sqlx holds an advisory lock while migrating).
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    // The schema must exist before sqlx creates its bookkeeping table in it.
    for attempt in 0..3 {
        match sqlx::query("create schema if not exists leaseq")
            .execute(pool)
            .await
        {
            Ok(_) => break,
            // Two replicas racing on the catalog: the other one made it.
            Err(_) if attempt < 2 => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => return Err(e.into()),
        }
    }
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// The channel every broker LISTENs on for wake-ups. Payload:
/// `<broker id>:<delay ms>:<queue>`.
pub const WAKE_CHANNEL: &str = "leaseq_wake";

/// The channel one broker LISTENs on to hear that jobs it leased were settled
/// on another replica (payload: comma-separated `job_id:lease_token`).
pub fn settle_channel(broker: Uuid) -> String {
    format!("leaseq_settle_{}", broker.simple())
}

/// Opens the connection pool. The pool is small and fixed: connections do not
/// grow with the number of streams.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    let opts: PgConnectOptions = url.parse()?;
    // Every statement names its schema; the search path only decides where
    // sqlx keeps `_sqlx_migrations`: in our schema, whatever the role is
    // called (a role named `leaseq` would otherwise pick it up via "$user"
    // half-way through the first migration).
    let opts = opts.application_name("leaseq").options([
        ("search_path", "leaseq,public"),
        // Short OLTP statements: JIT compiling one (PostgreSQL does when
        // a big table makes its cost estimate high) costs ~0.5 s.
        ("jit", "off"),
    ]);
    PgPoolOptions::new()
        .max_connections(max_connections)
        .min_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        // No ping before each use: it doubles the statements of an idle
        // broker; a dead connection surfaces as an error and is replaced.
        .test_before_acquire(false)
        .connect_with(opts)
        .await
}

/// A pool of exactly one connection for the LISTEN connection, so it never
/// takes one of the working pool's connections (and reconnects on its own).
pub async fn connect_listener(url: &str) -> Result<PgPool, sqlx::Error> {
    let opts: PgConnectOptions = url.parse()?;
    Ok(PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(opts.application_name("leaseq")))
}

/// One enqueue result, in request order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enqueued {
    pub job_id: JobId,
    pub duplicate: bool,
}

/// A queue to wake: `delay_ms` 0 = has jobs now, > 0 = its next job is due then.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Wake {
    pub queue: QueueName,
    pub delay_ms: i64,
}

/// Coalesces wake-ups: per queue, the earliest ready job and the earliest
/// delayed one (at most two notifications per queue per batch).
#[derive(Default)]
struct Wakes(HashMap<(QueueName, bool), i64>);

impl Wakes {
    fn add(&mut self, queue: &str, delay_ms: i64) {
        if let Some(q) = QueueName::parse(queue) {
            let e = self.0.entry((q, delay_ms > 0)).or_insert(delay_ms);
            *e = (*e).min(delay_ms);
        }
    }

    fn into_vec(self) -> Vec<Wake> {
        self.0
            .into_iter()
            .map(|((queue, _), delay_ms)| Wake { queue, delay_ms })
            .collect()
    }
}

/// What one stream slot wants from one queue in a lease round.
#[derive(Clone, Debug)]
pub struct Want {
    pub queue: QueueName,
    pub n: i32,
    pub lease_ms: Option<i64>,
    pub slot: i32,
    pub consumer: String,
}

/// A job just leased for `slot`.
#[derive(Clone, Debug)]
pub struct Leased {
    pub slot: i32,
    pub lease_ms: i64,
    pub id: JobId,
    pub queue: String,
    pub payload: Vec<u8>,
    pub headers: HashMap<String, String>,
    pub priority: i32,
    pub attempt: i32,
    pub enqueued_at: DateTime<Utc>,
    pub last_error: Option<String>,
    pub token: LeaseToken,
    pub lease_expires_at: DateTime<Utc>,
}

/// What a lease round got.
#[derive(Debug, Default)]
pub struct LeaseOutcome {
    pub jobs: Vec<Leased>,
    /// Wanted queues the round skipped because they have limits.
    pub limited: Vec<QueueName>,
    /// For a round of limited queues: how the limits cut each queue's ask.
    pub caps: Vec<limits::Cap>,
}

enum LeaseRow {
    Job(Leased),
    Limited(QueueName),
}

/// Outcome of a settle (ack / fail) that matched the current token.
#[derive(Clone, Debug)]
pub struct Settled {
    pub id: JobId,
    /// The lease that was settled.
    pub token: LeaseToken,
    /// The broker that leased the job (its stream's credit must come back).
    pub broker: Option<Uuid>,
    /// The job's queue, if it has a concurrency limit (a slot just freed).
    pub slot_freed: Option<QueueName>,
}

/// One lease to end unsuccessfully (see fail.sql).
#[derive(Clone, Debug)]
pub struct FailReq {
    pub id: JobId,
    pub token: LeaseToken,
    pub error: String,
    pub retry_after_ms: Option<i64>,
    pub dead_letter: bool,
    pub refund: bool,
}

#[derive(Clone, Debug)]
pub struct Failed {
    pub id: JobId,
    pub queue: QueueName,
    pub broker: Option<Uuid>,
    /// Some(reason) when dead-lettered.
    pub death: Option<String>,
    pub retry_ms: i64,
    /// The queue has a concurrency limit: a slot just freed.
    pub slot_freed: bool,
}

#[derive(Clone, Debug)]
pub struct Extended {
    pub id: JobId,
    pub lease_expires_at: DateTime<Utc>,
    pub broker: Option<Uuid>,
    pub lease_ms: i64,
}

/// All SQL, over one pool. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pub pool: PgPool,
    /// This broker process's id: stamped on the leases it takes.
    pub broker_id: Uuid,
    /// This broker's counters, histograms and stream registry.
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
}

impl Store {
    pub fn new(pool: PgPool) -> Store {
        Store {
            pool,
            broker_id: Uuid::new_v4(),
            metrics: Default::default(),
        }
    }

    /// Creates queue rows (with defaults) for names not seen before.
    pub async fn ensure_queues<'e>(
        exec: impl Executor<'e, Database = Postgres>,
        names: &[QueueName],
    ) -> Result<()> {
        let names: Vec<&str> = names.iter().map(QueueName::as_str).collect();
        sqlx::query(
            "insert into leaseq.queues (name) select unnest($1::text[]) on conflict do nothing",
        )
        .bind(names)
        .execute(exec)
        .await?;
        Ok(())
    }

    /// Inserts jobs in one transaction (all or none) and commits a coalesced
    /// NOTIFY per queue. Returns one result per job, in order, and the queues
    /// to wake in this process.
    pub async fn enqueue(
        &self,
        jobs: &[NewJob],
        new_queues: &[QueueName],
    ) -> Result<(Vec<Enqueued>, Vec<Wake>)> {
        if new_queues.is_empty() && jobs.iter().all(|j| j.dedup_key.is_none()) {
            return self.enqueue_simple(jobs).await;
        }
        let mut tx = self.pool.begin().await?;
        if !new_queues.is_empty() {
            Self::ensure_queues(&mut *tx, new_queues).await?;
        }
        let mut results: Vec<Option<Enqueued>> = vec![None; jobs.len()];
        let mut wakes = Wakes::default();
        let mut pending: Vec<usize> = (0..jobs.len()).collect();
        // A skipped duplicate whose live job was settled before we looked it
        // up is inserted again; this converges in a round or two.
        for _round in 0..5 {
            if pending.is_empty() {
                break;
            }
            let batch: Vec<&NewJob> = pending.iter().map(|&i| &jobs[i]).collect();
            let inserted = insert_jobs(&mut *tx, &batch).await?;
            let mut by_id: HashMap<Uuid, i64> = HashMap::with_capacity(inserted.len());
            for (id, queue, delay_ms) in inserted {
                by_id.insert(id, delay_ms);
                wakes.add(&queue, delay_ms);
            }
            let mut dups: Vec<usize> = Vec::new();
            for &i in &pending {
                if by_id.contains_key(&jobs[i].id.0) {
                    results[i] = Some(Enqueued {
                        job_id: jobs[i].id,
                        duplicate: false,
                    });
                } else {
                    dups.push(i);
                }
            }
            if dups.is_empty() {
                pending.clear();
                break;
            }
            let queues: Vec<&str> = dups.iter().map(|&i| jobs[i].queue.as_str()).collect();
            let keys: Vec<&str> = dups
                .iter()
                .map(|&i| jobs[i].dedup_key.as_deref().unwrap_or(""))
                .collect();
            let rows = sqlx::query(
                "select j.id, j.queue, j.dedup_key from leaseq.jobs j \
                 join unnest($1::text[], $2::text[]) as k(queue, dedup_key) \
                 on j.queue = k.queue and j.dedup_key = k.dedup_key",
            )
            .bind(&queues)
            .bind(&keys)
            .fetch_all(&mut *tx)
            .await?;
            let mut live: HashMap<(String, String), Uuid> = HashMap::new();
            for r in rows {
                live.insert(
                    (r.try_get("queue")?, r.try_get("dedup_key")?),
                    r.try_get("id")?,
                );
            }
            pending.clear();
            for i in dups {
                let key = (
                    jobs[i].queue.as_str().to_owned(),
                    jobs[i].dedup_key.clone().unwrap_or_default(),
                );
                match live.get(&key) {
                    Some(id) => {
                        results[i] = Some(Enqueued {
                            job_id: JobId(*id),
                            duplicate: true,
                        })
                    }
                    None => pending.push(i),
                }
            }
        }
        if !pending.is_empty() {
            return Err(Error::Internal("dedup lookup did not converge"));
        }
        let wakes = wakes.into_vec();
        self.notify_wake(&mut *tx, &wakes).await?;
        tx.commit().await?;
        let results = results
            .into_iter()
            .map(|r| r.expect("every job resolved"))
            .collect();
        Ok((results, wakes))
    }

    /// The common case (no dedup key, every queue known): one statement that
    /// inserts and NOTIFYs, atomic on its own, so no BEGIN / COMMIT round
    /// trips. The wake-ups are coalesced in SQL: one per queue, two when the
    /// batch holds both ready and delayed jobs.
    async fn enqueue_simple(&self, jobs: &[NewJob]) -> Result<(Vec<Enqueued>, Vec<Wake>)> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "with ins as (\n{}\n),\n\
                 woke as (\n\
                     select pg_notify('{WAKE_CHANNEL}', $11 || ':' || min(delay_ms) || ':' || queue)\n\
                     from ins group by queue, delay_ms > 0\n\
                 )\n\
                 select id, queue, delay_ms, (select count(*) from woke) as woken from ins",
                include_str!("sql/enqueue.sql").trim_end()
            )
        });
        let refs: Vec<&NewJob> = jobs.iter().collect();
        let broker = self.broker_id.simple().to_string();
        let inserted = bind_jobs(sqlx::query(SQL.as_str()), &refs)
            .bind(broker)
            .fetch_all(&self.pool)
            .await?;
        if inserted.len() != jobs.len() {
            return Err(Error::Internal("enqueue inserted fewer rows than asked"));
        }
        let mut wakes = Wakes::default();
        for r in &inserted {
            let queue: String = r.try_get("queue")?;
            wakes.add(&queue, r.try_get("delay_ms")?);
        }
        let results = jobs
            .iter()
            .map(|j| Enqueued {
                job_id: j.id,
                duplicate: false,
            })
            .collect();
        let wakes = wakes.into_vec();
        Ok((results, wakes))
    }

    /// Sends one NOTIFY per wake (coalesced by the caller). Inside a
    /// transaction it is delivered at commit.
    pub async fn notify_wake<'e>(
        &self,
        exec: impl Executor<'e, Database = Postgres>,
        wakes: &[Wake],
    ) -> Result<()> {
        if wakes.is_empty() {
            return Ok(());
        }
        let payloads: Vec<String> = wakes
            .iter()
            .map(|w| format!("{}:{}:{}", self.broker_id.simple(), w.delay_ms, w.queue))
            .collect();
        sqlx::query("select pg_notify($1, p) from unnest($2::text[]) as p")
            .bind(WAKE_CHANNEL)
            .bind(payloads)
            .execute(exec)
            .await?;
        Ok(())
    }

    /// Tells other brokers that jobs they leased were settled here, so their
    /// streams get the credit back.
    pub async fn notify_settled(&self, settled: &[(Uuid, JobId, LeaseToken)]) -> Result<()> {
        let mut by_broker: HashMap<Uuid, Vec<String>> = HashMap::new();
        for (broker, id, token) in settled {
            if *broker != self.broker_id {
                by_broker
                    .entry(*broker)
                    .or_default()
                    .push(format!("{id}:{token}"));
            }
        }
        let mut channels = Vec::new();
        let mut payloads = Vec::new();
        for (broker, ids) in by_broker {
            // NOTIFY payloads are limited to 8000 bytes: 100 pairs is 7400.
            for chunk in ids.chunks(100) {
                channels.push(settle_channel(broker));
                payloads.push(chunk.join(","));
            }
        }
        if channels.is_empty() {
            return Ok(());
        }
        sqlx::query("select pg_notify(c, p) from unnest($1::text[], $2::text[]) as n(c, p)")
            .bind(channels)
            .bind(payloads)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Leases jobs for a dispatcher round of unlimited queues (see
    /// lease.sql). Wanted queues that turn out to have limits are skipped and
    /// named in [`LeaseOutcome::limited`]: they go through
    /// [`Store::lease_limited`].
    pub async fn lease(&self, wants: &[Want]) -> Result<LeaseOutcome> {
        let rows = self.lease_rows(&self.pool, wants, false).await?;
        let mut out = LeaseOutcome::default();
        for row in rows {
            match row {
                LeaseRow::Job(j) => out.jobs.push(j),
                LeaseRow::Limited(q) => out.limited.push(q),
            }
        }
        Ok(out)
    }

    /// Runs lease.sql. With `include_limited` the caller holds the limited
    /// queues' row locks and has trimmed `wants` to what their limits allow.
    async fn lease_rows<'e>(
        &self,
        exec: impl Executor<'e, Database = Postgres>,
        wants: &[Want],
        include_limited: bool,
    ) -> Result<Vec<LeaseRow>> {
        let mut queues = Vec::with_capacity(wants.len());
        let mut lo = Vec::with_capacity(wants.len());
        let mut hi = Vec::with_capacity(wants.len());
        let mut lease = Vec::with_capacity(wants.len());
        let mut slot = Vec::with_capacity(wants.len());
        let mut consumer = Vec::with_capacity(wants.len());
        let mut taken: HashMap<&QueueName, i32> = HashMap::new();
        for w in wants {
            let start = taken.entry(&w.queue).or_insert(0);
            queues.push(w.queue.as_str());
            lo.push(*start);
            hi.push(*start + w.n);
            *start += w.n;
            lease.push(w.lease_ms);
            slot.push(w.slot);
            consumer.push(w.consumer.as_str());
        }
        let rows = sqlx::query(include_str!("sql/lease.sql"))
            .bind(queues)
            .bind(lo)
            .bind(hi)
            .bind(lease)
            .bind(slot)
            .bind(consumer)
            .bind(self.broker_id)
            .bind(include_limited)
            .fetch_all(exec)
            .await?;
        rows.into_iter()
            .map(|r| {
                let slot: i32 = r.try_get("slot")?;
                let queue: String = r.try_get("queue")?;
                if slot < 0 {
                    let q =
                        QueueName::parse(&queue).ok_or(Error::Internal("bad queue name in db"))?;
                    return Ok(LeaseRow::Limited(q));
                }
                let headers: String = r.try_get("headers")?;
                Ok(LeaseRow::Job(Leased {
                    slot,
                    lease_ms: r.try_get("lease_ms")?,
                    id: JobId(r.try_get("id")?),
                    queue,
                    payload: r.try_get("payload")?,
                    // Most jobs have no headers: skip the JSON parser for them.
                    headers: if headers == "{}" {
                        HashMap::new()
                    } else {
                        serde_json::from_str(&headers).unwrap_or_default()
                    },
                    priority: r.try_get("priority")?,
                    attempt: r.try_get("attempt")?,
                    enqueued_at: r.try_get("enqueued_at")?,
                    last_error: r.try_get("last_error")?,
                    token: LeaseToken(r.try_get("lease_token")?),
                    lease_expires_at: r.try_get("lease_expires_at")?,
                }))
            })
            .collect()
    }

    /// Completes jobs whose token is current: deletes them, and keeps a
    /// record of those whose queue has a completed retention (see ack.sql).
    /// Returns the ones completed.
    pub async fn ack(&self, reqs: &[AckReq]) -> Result<Vec<Settled>> {
        let ids: Vec<Uuid> = reqs.iter().map(|r| r.job_id.0).collect();
        let tokens: Vec<Uuid> = reqs.iter().map(|r| r.token.0).collect();
        let rows = sqlx::query(include_str!("sql/ack.sql"))
            .bind(ids)
            .bind(tokens)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| {
                Ok(Settled {
                    id: JobId(r.try_get("id")?),
                    token: LeaseToken(r.try_get("lease_token")?),
                    broker: r.try_get("lease_broker")?,
                    slot_freed: r
                        .try_get::<Option<String>, _>("slot_freed")?
                        .and_then(|q| QueueName::parse(&q)),
                })
            })
            .collect()
    }

    /// Ends leases unsuccessfully (see fail.sql). Returns the ones matched.
    pub async fn fail(&self, reqs: &[FailReq]) -> Result<Vec<Failed>> {
        let rows = sqlx::query(include_str!("sql/fail.sql"))
            .bind(reqs.iter().map(|r| r.id.0).collect::<Vec<_>>())
            .bind(reqs.iter().map(|r| r.token.0).collect::<Vec<_>>())
            .bind(reqs.iter().map(|r| r.error.as_str()).collect::<Vec<_>>())
            .bind(reqs.iter().map(|r| r.retry_after_ms).collect::<Vec<_>>())
            .bind(reqs.iter().map(|r| r.dead_letter).collect::<Vec<_>>())
            .bind(reqs.iter().map(|r| r.refund).collect::<Vec<_>>())
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| {
                let queue: String = r.try_get("queue")?;
                Ok(Failed {
                    id: JobId(r.try_get("id")?),
                    queue: QueueName::parse(&queue)
                        .ok_or(Error::Internal("bad queue name in db"))?,
                    broker: r.try_get("lease_broker")?,
                    death: r.try_get("death")?,
                    retry_ms: r.try_get("retry_ms")?,
                    slot_freed: r.try_get("slot_freed")?,
                })
            })
            .collect()
    }

    /// Extends leases whose token is current and not yet expired.
    pub async fn extend(&self, reqs: &[ExtendReq]) -> Result<Vec<Extended>> {
        let rows = sqlx::query(include_str!("sql/extend.sql"))
            .bind(reqs.iter().map(|r| r.job_id.0).collect::<Vec<_>>())
            .bind(reqs.iter().map(|r| r.token.0).collect::<Vec<_>>())
            .bind(reqs.iter().map(|r| r.lease_ms).collect::<Vec<_>>())
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| {
                Ok(Extended {
                    id: JobId(r.try_get("id")?),
                    lease_expires_at: r.try_get("lease_expires_at")?,
                    broker: r.try_get("lease_broker")?,
                    lease_ms: r.try_get("lease_ms")?,
                })
            })
            .collect()
    }

    /// Leases past their expiry (all, or only among `only`).
    pub async fn expired_leases(
        &self,
        only: Option<&[JobId]>,
        limit: i64,
    ) -> Result<Vec<(JobId, LeaseToken)>> {
        let only: Option<Vec<Uuid>> = only.map(|ids| ids.iter().map(|i| i.0).collect());
        let rows = sqlx::query(include_str!("sql/expired_leases.sql"))
            .bind(only)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| {
                Ok((
                    JobId(r.try_get("id")?),
                    LeaseToken(r.try_get("lease_token")?),
                ))
            })
            .collect()
    }

    /// Which of these leases are still current, with milliseconds left.
    pub async fn lease_status(&self, leases: &[(JobId, LeaseToken)]) -> Result<Vec<(JobId, i64)>> {
        let rows = sqlx::query(include_str!("sql/lease_status.sql"))
            .bind(leases.iter().map(|l| l.0.0).collect::<Vec<_>>())
            .bind(leases.iter().map(|l| l.1.0).collect::<Vec<_>>())
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| Ok((JobId(r.try_get("id")?), r.try_get("remaining_ms")?)))
            .collect()
    }

    /// Dead-letters waiting jobs past their ttl; returns how many.
    pub async fn expire_ttl(&self, limit: i64) -> Result<u64> {
        let done = sqlx::query(include_str!("sql/expire_ttl.sql"))
            .bind(limit)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Deletes up to `limit` completed records past their queue's retention
    /// (see expire_completed.sql). Returns how many.
    pub async fn expire_completed(&self, limit: i64) -> Result<u64> {
        let done = sqlx::query(include_str!("sql/expire_completed.sql"))
            .bind(limit)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Milliseconds until each queue's next delayed job (None: no such job).
    pub async fn next_due(&self, queues: &[QueueName]) -> Result<Vec<(QueueName, Option<i64>)>> {
        let names: Vec<&str> = queues.iter().map(QueueName::as_str).collect();
        let rows = sqlx::query(include_str!("sql/next_due.sql"))
            .bind(names)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| {
                let name: String = r.try_get("name")?;
                let q = QueueName::parse(&name).ok_or(Error::Internal("bad queue name"))?;
                Ok((q, r.try_get("due_ms")?))
            })
            .collect()
    }

    /// A cheap liveness probe for health reporting.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("select 1").execute(&self.pool).await?;
        Ok(())
    }
}

async fn insert_jobs<'e>(
    exec: impl Executor<'e, Database = Postgres>,
    jobs: &[&NewJob],
) -> Result<Vec<(Uuid, String, i64)>> {
    let rows = bind_jobs(sqlx::query(include_str!("sql/enqueue.sql")), jobs)
        .fetch_all(exec)
        .await?;
    rows.into_iter()
        .map(|r| {
            Ok((
                r.try_get("id")?,
                r.try_get("queue")?,
                r.try_get("delay_ms")?,
            ))
        })
        .collect()
}

/// Binds $1..$10 of enqueue.sql: one array per column.
fn bind_jobs<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    jobs: &[&NewJob],
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    let n = jobs.len();
    let mut id = Vec::with_capacity(n);
    let mut queue = Vec::with_capacity(n);
    let mut priority = Vec::with_capacity(n);
    let mut run_at: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(n);
    let mut delay_ms = Vec::with_capacity(n);
    let mut payload: Vec<Vec<u8>> = Vec::with_capacity(n);
    let mut headers: Vec<String> = Vec::with_capacity(n);
    let mut max_attempts = Vec::with_capacity(n);
    let mut dedup: Vec<Option<String>> = Vec::with_capacity(n);
    let mut ttl = Vec::with_capacity(n);
    for j in jobs {
        id.push(j.id.0);
        queue.push(j.queue.as_str().to_owned());
        priority.push(j.priority);
        let (at, delay) = match &j.schedule {
            Schedule::Now => (None, 0i64),
            Schedule::Delay(ms) => (None, *ms),
            Schedule::At(t) => (Some(*t), 0),
        };
        run_at.push(at);
        delay_ms.push(delay);
        payload.push(j.payload.clone());
        headers.push(j.headers_json.clone());
        max_attempts.push(j.max_attempts);
        dedup.push(j.dedup_key.clone());
        ttl.push(j.ttl_ms);
    }
    query
        .bind(id)
        .bind(queue)
        .bind(priority)
        .bind(run_at)
        .bind(delay_ms)
        .bind(payload)
        .bind(headers)
        .bind(max_attempts)
        .bind(dedup)
        .bind(ttl)
}
