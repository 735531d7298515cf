//! Every SQL statement leaseq runs, and the types they return.
//!
//! Statements live in `src/store/sql/*.sql`, each with the invariant it
//! protects written above it. Functions here take slices: callers (the
//! batchers in [`batch`] and the dispatcher) always work on many rows per
//! statement. Errors become [`crate::error::Error`] by SQLSTATE class.

/// A job row of a lease statement (lease.sql, lease_keys.sql) as a
/// [`Leased`]. To sqlx every column is nullable (a `union all` with marker
/// rows, whose job columns are null): a job row has them all.
macro_rules! leased_row {
    ($store:expr, $r:expr) => {{
        fn col<T>(v: Option<T>) -> $crate::error::Result<T> {
            v.ok_or($crate::error::Error::Internal("null column in a lease row"))
        }
        let r = $r;
        let headers: String = col(r.headers)?;
        $crate::domain::Leased {
            slot: col(r.slot)?,
            lease_ms: col(r.lease_ms)?,
            id: $crate::domain::JobId(col(r.id)?),
            queue: col(r.queue)?,
            payload: col(r.payload)?,
            // Most jobs have no headers: skip the JSON parser for them.
            headers: if headers == "{}" {
                std::collections::HashMap::new()
            } else {
                serde_json::from_str(&headers).unwrap_or_default()
            },
            priority: col(r.priority)?,
            attempt: col(r.attempt)?,
            enqueued_at: col(r.enqueued_at)?,
            run_at: col(r.run_at)?,
            last_error: r.last_error,
            token: $crate::domain::LeaseToken(col(r.lease_token)?, $store.cluster),
            lease_expires_at: col(r.lease_expires_at)?,
            key: r.key,
        }
    }};
}

/// A row of lease.sql or lease_one.sql: a job leased, or (slot -1) a
/// queue that must go to the limited path.
macro_rules! lease_row {
    ($store:expr, $r:expr) => {{
        let r = $r;
        if r.slot.is_some_and(|s| s < 0) {
            let q = r.queue.as_deref().and_then(QueueName::parse);
            Ok(LeaseRow::Limited(
                q.ok_or(Error::Internal("bad queue name in db"))?,
            ))
        } else {
            Ok(LeaseRow::Job(leased_row!($store, r)))
        }
    }};
}

pub(crate) mod admin;
pub(crate) mod batch;
pub(crate) mod conn;
pub(crate) mod limits;
pub(crate) mod placement;

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Executor, Postgres};
use uuid::Uuid;

pub(crate) use conn::Conns;

use crate::channels;
use crate::domain::{
    AckReq, ClusterId, Due, EnqueueOutcome, Enqueued, ExtendReq, Extended, FailReq, Failed,
    FastMap, FastSet, HandoffTo, JobId, LeaseOutcome, LeaseToken, Leased, NewJob, ProgressReq,
    QueueName, Schedule, Settled, Wake, Want,
};
use crate::error::{Error, Result};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// The planner settings of [`Store::expire_ttl`], [`Store::expired_leases`],
/// [`Store::check_leases`] and the other sweeps (public for the test that
/// checks their plans).
pub const SWEEP_PLANNER_SETTINGS: &str =
    "set local enable_seqscan = off; set local enable_sort = off";

/// Applies pending migrations. Safe to run from several replicas at once
/// (sqlx holds an advisory lock while migrating).
///
/// On one connection of `pool` without a statement timeout (a migration
/// may rewrite or index a large table, and one cut short would only be
/// tried again at the next start); the connection is closed afterwards
/// rather than given back with that setting.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await?;
    sqlx::query("set statement_timeout = 0")
        .execute(&mut *conn)
        .await?;
    // The schema must exist before sqlx creates its bookkeeping table in it.
    let mut result = Ok(());
    for attempt in 0..3 {
        match sqlx::query("create schema if not exists leaseq")
            .execute(&mut *conn)
            .await
        {
            Ok(_) => break,
            // Two replicas racing on the catalog: the other one made it.
            Err(_) if attempt < 2 => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => result = Err(e.into()),
        }
    }
    if result.is_ok() {
        // `run` with a connection trips the compiler's Send check (a
        // higher-ranked `Acquire`); `run_direct` is what it calls.
        result = MIGRATOR
            .run_direct(None, &mut *conn, false)
            .await
            .map_err(Into::into);
    }
    let _ = sqlx::Connection::close(conn.detach()).await;
    result
}

/// The settings that decide whether a commit PostgreSQL reported survives
/// a crash of the server or its host (fsync, synchronous_commit,
/// full_page_writes), as (name, value) in this session.
pub(crate) async fn durability_settings(pool: &PgPool) -> Result<Vec<(String, String)>> {
    let rows = sqlx::query!(
        r#"select name as "name!", setting as "setting!" from pg_settings
           where name in ('fsync', 'synchronous_commit', 'full_page_writes')
           order by name"#
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.name, r.setting)).collect())
}

/// Opens the connection pool. The pool is small and fixed: connections do not
/// grow with the number of streams. `url` is what the user passed
/// (DATABASE_URL: a URI or keyword/value string, empty for PG* alone), read
/// with the PG* variables by [`crate::pgconn`], which also adds leaseq's
/// session settings (application_name, search_path, jit).
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    let target = crate::pgconn::connect_options(url)?;
    PgPoolOptions::new()
        .max_connections(max_connections)
        .min_connections(1)
        .acquire_timeout(target.acquire_timeout())
        // No ping before each use: it doubles the statements of an idle
        // broker; a dead connection surfaces as an error and is replaced.
        .test_before_acquire(false)
        .connect_with(target.options()?)
        .await
}

/// What the broker sets on each of its sessions beyond what the connection
/// string says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Session {
    /// PostgreSQL's `statement_timeout` for the broker's statements (the
    /// migrations and VACUUM excepted), sent at connect, after the
    /// string's `options`; the broker's own wait on a statement is bounded
    /// by it plus [`conn::BOUND_MARGIN`]. None: neither is set (the
    /// server's, role's or string's setting applies, and the broker waits
    /// as long as TCP keepalive lets it).
    pub statement_timeout: Option<Duration>,
}

impl Default for Session {
    fn default() -> Self {
        Session {
            statement_timeout: Some(crate::config::DEFAULT_STATEMENT_TIMEOUT),
        }
    }
}

impl Session {
    /// `opts` with this session's settings added.
    fn apply(&self, opts: sqlx::postgres::PgConnectOptions) -> sqlx::postgres::PgConnectOptions {
        match self.statement_timeout {
            Some(t) => opts.options([("statement_timeout", format!("{}", t.as_millis()))]),
            None => opts,
        }
    }

    /// The broker's bound on one borrow of a connection.
    pub(crate) fn bound(&self) -> Option<Duration> {
        self.statement_timeout.map(|t| t + conn::BOUND_MARGIN)
    }
}

/// A sqlx pool over `target` with the broker's settings: TCP options set on
/// each new connection, and a connection given back checked within
/// [`conn::PING_TIMEOUT`]. (sqlx pings every connection given back, with no
/// bound: one whose server stopped answering, e.g. left mid-statement by a
/// call whose client gave up, would hold its place in the pool for good.
/// A ping that fails here closes it first.)
fn pool_options(target: &crate::pgconn::PgTarget, max: u32) -> PgPoolOptions {
    let tuner = crate::pgsock::Tuner::for_target(target);
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(target.acquire_timeout())
        .after_connect(move |_conn, _meta| {
            let tuner = tuner.clone();
            Box::pin(async move {
                if let Some(t) = tuner {
                    t.tune().await;
                }
                Ok(())
            })
        })
        .after_release(|conn, _meta| {
            Box::pin(async move {
                match tokio::time::timeout(conn::PING_TIMEOUT, sqlx::Connection::ping(conn)).await {
                    Ok(Ok(())) => Ok(true),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no answer to a ping on release",
                    ))),
                }
            })
        })
}

/// Opens the broker's connections: the hot path's [`Conns`] (group-commit
/// statements and lease rounds) and a small sqlx pool for everything else
/// (admin, maintenance, migrations). Together they hold `pool_size`
/// connections (at least two), plus the LISTEN connection opened apart.
pub async fn open(url: &str, pool_size: u32) -> Result<(PgPool, Conns), sqlx::Error> {
    open_with(url, pool_size, Session::default()).await
}

/// Of `pool_size` connections, how many the hot path gets ([`Conns`]:
/// group-commit statements and lease rounds); the rest (one, or two from a
/// pool of 4) serve admin and maintenance.
pub fn hot_connections(pool_size: u32) -> u32 {
    let aux = if pool_size <= 3 { 1 } else { 2 };
    pool_size.saturating_sub(aux).max(1)
}

/// [`open`] with the session settings given.
pub(crate) async fn open_with(
    url: &str,
    pool_size: u32,
    session: Session,
) -> Result<(PgPool, Conns), sqlx::Error> {
    let hot = hot_connections(pool_size);
    let aux = pool_size.saturating_sub(hot).max(1);
    let target = crate::pgconn::connect_options(url)?;
    let pool = pool_options(&target, aux)
        .min_connections(1)
        .test_before_acquire(false)
        .connect_with(session.apply(target.options()?))
        .await?;
    // The hot statements take arrays (`unnest($1::uuid[])`), which the
    // planner estimates at 10 rows in a generic plan and at their real
    // length in a custom one, so with the default plan_cache_mode every call
    // was planned again: a third of PostgreSQL's CPU per job (profiled,
    // docs/BENCHMARKS.md). Their generic plans are the same shapes.
    //
    // Every hot statement reaches `leaseq.jobs` through an index (the
    // primary key, jobs_ready, jobs_dedup). A generic plan made while the
    // table is new and has no statistics chose a sequential scan for
    // ack.sql, and the connection kept it: each ack then read every page of
    // a table full of dead rows (231 pages per call, 0.27 ms, half of
    // PostgreSQL's CPU per job at 1,000 jobs/s on a fresh database;
    // pg_stat_statements, docs/BENCHMARKS.md). `enable_seqscan = off` makes
    // the planner take an index whatever its statistics say, but not always
    // the right scan of it: planned on a drained, vacuumed table, ack.sql
    // read all of jobs_pkey for its `order by j.id`. The settle statements
    // now lock each id in a lateral subquery, whose only plan is a key
    // probe (docs/BENCHMARKS.md, "Plans made on an empty table";
    // tests/plans.rs).
    let hot_opts = session.apply(target.options()?).options([
        ("plan_cache_mode", "force_generic_plan"),
        ("enable_seqscan", "off"),
    ]);
    let conns = Conns::new(
        hot_opts,
        hot,
        target.acquire_timeout(),
        session.bound(),
        crate::pgsock::Tuner::for_target(&target),
    );
    Ok((pool, conns))
}

/// A pool of exactly one connection for the LISTEN connection, so it never
/// takes one of the working pool's connections (and reconnects on its own).
pub async fn connect_listener(url: &str) -> Result<PgPool, sqlx::Error> {
    connect_listener_with(url, Session::default()).await
}

/// [`connect_listener`] with the session settings given.
pub(crate) async fn connect_listener_with(
    url: &str,
    session: Session,
) -> Result<PgPool, sqlx::Error> {
    let target = crate::pgconn::connect_options(url)?;
    Ok(pool_options(&target, 1)
        .min_connections(0)
        .connect_lazy_with(session.apply(target.options()?)))
}

/// Coalesces wake-ups: per queue, the earliest ready job and the earliest
/// delayed one (at most two notifications per queue per batch).
#[derive(Default)]
struct Wakes(FastMap<(QueueName, bool), i64>);

/// The jobs of `pending` that go in this round of [`Store::enqueue_in`]:
/// all but REPLACE jobs whose key an earlier pending job has, which wait
/// for a later round (the second list) so that they act on what the
/// earlier one left.
fn this_round(jobs: &[NewJob], pending: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut seen: FastSet<(&str, &str)> = Default::default();
    pending.iter().partition(|&&i| {
        let j = &jobs[i];
        match j.dedup_key.as_deref() {
            Some(k) => seen.insert((j.queue.as_str(), k)) || !j.replace,
            None => true,
        }
    })
}

/// What holds a dedup key (dedup_holders.sql).
struct Holder {
    id: Uuid,
    /// A live job not leased: a REPLACE enqueue may change it.
    waiting: bool,
}

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

// A lease row is a job nearly always: boxing it would allocate once per job.
#[allow(clippy::large_enum_variant)]
enum LeaseRow {
    Job(Leased),
    Limited(QueueName),
}

/// All SQL. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    /// For admin and maintenance statements.
    pool: PgPool,
    /// For the hot path: group-commit statements and lease rounds.
    conns: Conns,
    /// This broker process's id: stamped on the leases it takes.
    broker_id: Uuid,
    /// This broker's counters, histograms and stream registry.
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// The cluster these connections reach (docs/SCALING.md): stamped on the
    /// lease tokens this store reads, so settles find their way back.
    cluster: ClusterId,
    /// Its name (`--database-url NAME=URI`; `main` for a single database).
    cluster_name: std::sync::Arc<str>,
}

impl Store {
    /// The pool, for admin and maintenance statements.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The hot path's connections: group-commit statements and lease rounds.
    pub(crate) fn conns(&self) -> &Conns {
        &self.conns
    }

    /// This broker process's id: stamped on the leases it takes.
    pub(crate) fn broker_id(&self) -> Uuid {
        self.broker_id
    }

    /// This broker's counters, histograms and stream registry.
    pub(crate) fn metrics(&self) -> &std::sync::Arc<crate::metrics::Metrics> {
        &self.metrics
    }

    /// The cluster these connections reach.
    pub(crate) fn cluster(&self) -> ClusterId {
        self.cluster
    }

    /// The cluster's name.
    pub(crate) fn cluster_name(&self) -> &std::sync::Arc<str> {
        &self.cluster_name
    }

    pub fn new(pool: PgPool, conns: Conns) -> Store {
        Store {
            pool,
            conns,
            broker_id: Uuid::new_v4(),
            metrics: Default::default(),
            cluster: ClusterId::HOME,
            cluster_name: std::sync::Arc::from(crate::domain::HOME_NAME),
        }
    }

    /// The store of another cluster of the same broker: same broker id and
    /// metrics, other connections.
    pub(crate) fn sibling(
        &self,
        pool: PgPool,
        conns: Conns,
        cluster: ClusterId,
        name: &str,
    ) -> Store {
        Store {
            pool,
            conns,
            broker_id: self.broker_id,
            metrics: self.metrics.clone(),
            cluster,
            cluster_name: std::sync::Arc::from(name),
        }
    }

    /// Names this (home) store's cluster.
    pub(crate) fn named(mut self, name: &str) -> Store {
        self.cluster_name = std::sync::Arc::from(name);
        self
    }

    /// Creates queue rows (with defaults) for names not seen before.
    pub(crate) async fn ensure_queues<'e>(
        exec: impl Executor<'e, Database = Postgres>,
        names: &[QueueName],
    ) -> Result<()> {
        let names: Vec<&str> = names.iter().map(QueueName::as_str).collect();
        sqlx::query!(
            "insert into leaseq.queues (name) select unnest($1::text[]) on conflict do nothing",
            names as Vec<&str>,
        )
        .execute(exec)
        .await?;
        Ok(())
    }

    /// Inserts jobs, all or none. A job with a claim is inserted already
    /// leased to the claiming stream when its queue allows it (not paused, no
    /// concurrency or rate limit): see enqueue.sql. Sends no NOTIFY: the
    /// caller wakes the queues in [`EnqueueOutcome::wakes`] once this returns
    /// (crate::settle explains why not in this transaction).
    ///
    /// `moving` names jobs with a dedup key whose queue's bucket is being
    /// moved here from another cluster (by their index in `jobs`, with that
    /// cluster's store): their key is looked for there too, before the
    /// commit, so that a job the move has not copied yet is found
    /// ([`Store::dedup_elsewhere`]).
    pub(crate) async fn enqueue(
        &self,
        jobs: &[NewJob],
        claims: &[Option<HandoffTo>],
        new_queues: &[QueueName],
        moving: &[(Store, Vec<usize>)],
    ) -> Result<EnqueueOutcome> {
        debug_assert_eq!(jobs.len(), claims.len());
        let mut c = self.conns.acquire().await?;
        let out = c
            .bounded(|c| async move {
                if new_queues.is_empty()
                    && moving.is_empty()
                    && jobs.iter().all(|j| j.dedup_key.is_none())
                {
                    // The common case: one statement, atomic on its own, so
                    // no BEGIN / COMMIT round trips.
                    let refs: Vec<&NewJob> = jobs.iter().collect();
                    let claims: Vec<Option<&HandoffTo>> =
                        claims.iter().map(Option::as_ref).collect();
                    let inserted = self.insert_jobs(c, &refs, &claims).await?;
                    if inserted.len() != jobs.len() {
                        return Err(Error::Internal("enqueue inserted fewer rows than asked"));
                    }
                    let mut out = EnqueueOutcome {
                        results: jobs
                            .iter()
                            .map(|j| Enqueued {
                                job_id: j.id,
                                duplicate: false,
                                replaced: false,
                            })
                            .collect(),
                        ..Default::default()
                    };
                    let by_id: FastMap<Uuid, usize> =
                        jobs.iter().enumerate().map(|(i, j)| (j.id.0, i)).collect();
                    let mut wakes = Wakes::default();
                    for row in inserted {
                        row.into_outcome(&by_id, jobs, &mut wakes, &mut out.handed, self.cluster);
                    }
                    out.wakes = wakes.into_vec();
                    Ok(out)
                } else {
                    let mut tx = sqlx::Connection::begin(c).await?;
                    let mut out = self.enqueue_in(&mut tx, jobs, claims, new_queues).await?;
                    for (source, idxs) in moving {
                        self.dedup_elsewhere(&mut tx, source, jobs, idxs, &mut out)
                            .await?;
                    }
                    tx.commit().await?;
                    Ok(out)
                }
            })
            .await?;
        c.done();
        Ok(out)
    }

    /// During a bucket move the queue's new jobs come here while the jobs
    /// not copied yet are still on the source, so a dedup key is looked
    /// for on both. The new rows are inserted first, in the open
    /// transaction `tx`, which holds their keys: a copy of the source's job
    /// of the same key waits for this transaction, and the source deletes
    /// its row only after that copy commits. So the job is in one of the
    /// two places when looked for: here (the insert found it), or on the
    /// source (found below, and the new row deleted again before the
    /// commit: the caller gets that job's id, `duplicate: true`).
    async fn dedup_elsewhere(
        &self,
        tx: &mut sqlx::PgConnection,
        source: &Store,
        jobs: &[NewJob],
        idxs: &[usize],
        out: &mut EnqueueOutcome,
    ) -> Result<()> {
        let fresh: Vec<usize> = idxs
            .iter()
            .copied()
            .filter(|&i| !out.results[i].duplicate && jobs[i].dedup_key.is_some())
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        let queues: Vec<&str> = fresh.iter().map(|&i| jobs[i].queue.as_str()).collect();
        let keys: Vec<&str> = fresh
            .iter()
            .map(|&i| jobs[i].dedup_key.as_deref().unwrap_or(""))
            .collect();
        let there: HashMap<(String, String), Uuid> = sqlx::query!(
            "select j.id, j.queue, j.dedup_key as \"dedup_key!\" from leaseq.jobs j \
             join unnest($1::text[], $2::text[]) as k(queue, dedup_key) \
             on j.queue = k.queue and j.dedup_key = k.dedup_key",
            &queues as &Vec<&str>,
            &keys as &Vec<&str>,
        )
        .fetch_all(&source.pool)
        .await?
        .into_iter()
        .map(|r| ((r.queue, r.dedup_key), r.id))
        .collect();
        // A source row whose copy committed here (its tombstone is here) is
        // this cluster's job now, the source's row a leftover of a copy
        // interrupted before its delete (a killed move): if the job is still
        // live here the insert above found its key; if not, it was settled
        // here and its key is free. Answering with it would name a job
        // already done.
        let ids: Vec<Uuid> = there.values().copied().collect();
        let copied: Vec<Uuid> =
            sqlx::query_scalar!("select id from leaseq.moved_jobs where id = any($1)", &ids)
                .fetch_all(&mut *tx)
                .await?;
        let there: HashMap<(String, String), Uuid> = there
            .into_iter()
            .filter(|(_, id)| !copied.contains(id))
            .collect();
        let mut undo = Vec::new();
        for i in fresh {
            let key = (
                jobs[i].queue.as_str().to_owned(),
                jobs[i].dedup_key.clone().unwrap_or_default(),
            );
            if let Some(id) = there.get(&key) {
                undo.push(jobs[i].id.0);
                out.results[i] = Enqueued {
                    job_id: JobId(*id),
                    duplicate: true,
                    replaced: false,
                };
            }
        }
        if !undo.is_empty() {
            sqlx::query!("delete from leaseq.jobs where id = any($1)", &undo)
                .execute(&mut *tx)
                .await?;
            out.handed.retain(|j| !undo.contains(&j.id.0));
        }
        Ok(())
    }

    /// The transactional form: creates missing queue rows, and resolves
    /// duplicates: a job whose dedup key matches a live job, or one held
    /// after its job completed (`unique_for`, leaseq.dedup_holds), is not
    /// inserted; that job's id is returned instead. A job with `replace`
    /// (on_duplicate = REPLACE) whose key matches a waiting job gives it
    /// its payload, headers, priority and delivery time (replace.sql).
    ///
    /// Jobs are resolved as if one after the other in the order given: a
    /// REPLACE job whose key an earlier job of this call also has waits
    /// for the next round, so that it replaces what the earlier one left
    /// (a job it inserted, or one it found).
    pub(crate) async fn enqueue_in(
        &self,
        tx: &mut sqlx::PgConnection,
        jobs: &[NewJob],
        claims: &[Option<HandoffTo>],
        new_queues: &[QueueName],
    ) -> Result<EnqueueOutcome> {
        if !new_queues.is_empty() {
            Self::ensure_queues(&mut *tx, new_queues).await?;
        }
        let by_id: FastMap<Uuid, usize> =
            jobs.iter().enumerate().map(|(i, j)| (j.id.0, i)).collect();
        let mut results: Vec<Option<Enqueued>> = vec![None; jobs.len()];
        let mut wakes = Wakes::default();
        let mut handed = Vec::new();
        let mut pending: Vec<usize> = (0..jobs.len()).collect();
        // A skipped duplicate whose live job was settled before we looked it
        // up is inserted again (and a REPLACE job whose waiting job was
        // leased meanwhile looked up again); this converges in a round or
        // two. Rounds that only took REPLACE jobs deferred behind an
        // earlier job of their key do not count.
        let mut retries = 0;
        while !pending.is_empty() {
            let (mut round, later) = this_round(jobs, &pending);
            let replacing: Vec<usize> =
                round.iter().copied().filter(|&i| jobs[i].replace).collect();
            if !replacing.is_empty() {
                for (i, id, delay_ms) in self.replace_waiting(&mut *tx, jobs, &replacing).await? {
                    results[i] = Some(Enqueued {
                        replaced: true,
                        ..Enqueued::duplicate_of(id)
                    });
                    wakes.add(jobs[i].queue.as_str(), delay_ms);
                }
                round.retain(|&i| results[i].is_none());
            }
            let mut retry: Vec<usize> = Vec::new();
            if !round.is_empty() {
                let batch: Vec<&NewJob> = round.iter().map(|&i| &jobs[i]).collect();
                let batch_claims: Vec<Option<&HandoffTo>> =
                    round.iter().map(|&i| claims[i].as_ref()).collect();
                let inserted = self.insert_jobs(&mut *tx, &batch, &batch_claims).await?;
                let mut done: FastSet<Uuid> = Default::default();
                for row in inserted {
                    done.insert(row.id);
                    row.into_outcome(&by_id, jobs, &mut wakes, &mut handed, self.cluster);
                }
                let mut dups: Vec<usize> = Vec::new();
                for &i in &round {
                    if done.contains(&jobs[i].id.0) {
                        results[i] = Some(Enqueued::new(jobs[i].id));
                    } else {
                        dups.push(i);
                    }
                }
                self.held_since_insert(&mut *tx, jobs, &round, &mut results, &mut handed)
                    .await?;
                if !dups.is_empty() {
                    let holders = Self::key_holders(&mut *tx, jobs, &dups).await?;
                    for i in dups {
                        match holders.get(&(
                            jobs[i].queue.as_str().to_owned(),
                            jobs[i].dedup_key.clone().unwrap_or_default(),
                        )) {
                            // A waiting job a REPLACE job can still change
                            // (inserted since replace.sql looked), or none
                            // (its job ended since the insert looked).
                            Some(h) if jobs[i].replace && h.waiting => retry.push(i),
                            None => retry.push(i),
                            Some(h) => results[i] = Some(Enqueued::duplicate_of(h.id)),
                        }
                    }
                }
            }
            if !retry.is_empty() {
                retries += 1;
                if retries > 5 {
                    return Err(Error::Internal("dedup lookup did not converge"));
                }
            }
            retry.extend(later);
            retry.sort_unstable();
            pending = retry;
        }
        Ok(EnqueueOutcome {
            results: results
                .into_iter()
                .map(|r| r.expect("every job resolved"))
                .collect(),
            wakes: wakes.into_vec(),
            handed,
        })
    }

    /// replace.sql for the REPLACE jobs `idxs` (at most one per key): the
    /// waiting jobs changed, as (index in `jobs`, job id, milliseconds
    /// until deliverable).
    async fn replace_waiting(
        &self,
        tx: &mut sqlx::PgConnection,
        jobs: &[NewJob],
        idxs: &[usize],
    ) -> Result<Vec<(usize, Uuid, i64)>> {
        // Locked in key order: two calls replacing the same keys never
        // deadlock on each other.
        let mut idxs = idxs.to_vec();
        idxs.sort_unstable_by(|&a, &b| {
            (jobs[a].queue.as_str(), jobs[a].dedup_key.as_deref())
                .cmp(&(jobs[b].queue.as_str(), jobs[b].dedup_key.as_deref()))
        });
        let mut queue = Vec::with_capacity(idxs.len());
        let mut dedup = Vec::with_capacity(idxs.len());
        let mut payload = Vec::with_capacity(idxs.len());
        let mut headers = Vec::with_capacity(idxs.len());
        let mut priority = Vec::with_capacity(idxs.len());
        let mut run_at: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(idxs.len());
        let mut delay_ms = Vec::with_capacity(idxs.len());
        for &i in &idxs {
            let j = &jobs[i];
            queue.push(j.queue.as_str());
            dedup.push(j.dedup_key.as_deref().unwrap_or(""));
            payload.push(j.payload.as_slice());
            headers.push(j.headers_json.as_str());
            priority.push(j.priority);
            let (at, delay) = schedule_columns(&j.schedule);
            run_at.push(at);
            delay_ms.push(delay);
        }
        let rows = sqlx::query_file!(
            "src/store/sql/replace.sql",
            &queue as &Vec<&str>,
            &dedup as &Vec<&str>,
            &payload as &Vec<&[u8]>,
            &headers as &Vec<&str>,
            &priority,
            &run_at as &Vec<Option<DateTime<Utc>>>,
            &delay_ms,
        )
        .fetch_all(&mut *tx)
        .await?;
        let at: HashMap<(&str, &str), usize> = idxs
            .iter()
            .map(|&i| {
                (
                    (
                        jobs[i].queue.as_str(),
                        jobs[i].dedup_key.as_deref().unwrap_or(""),
                    ),
                    i,
                )
            })
            .collect();
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                at.get(&(r.queue.as_str(), r.dedup_key.as_str()))
                    .map(|&i| (i, r.id, r.delay_ms))
            })
            .collect())
    }

    /// A dedup key held by a job that completed while the insert of
    /// `round` waited for it: the insert's snapshot, taken before that
    /// ack committed, missed the hold, and the key was free in jobs_dedup
    /// once the ack's delete committed. This statement's snapshot is
    /// newer than that commit, so it sees the hold: the new job is
    /// deleted again and the answer is the holding job, as if the hold
    /// had been seen at once. Runs only for rounds with a dedup key.
    async fn held_since_insert(
        &self,
        tx: &mut sqlx::PgConnection,
        jobs: &[NewJob],
        round: &[usize],
        results: &mut [Option<Enqueued>],
        handed: &mut Vec<Leased>,
    ) -> Result<()> {
        let ids: Vec<Uuid> = round
            .iter()
            .filter(|&&i| jobs[i].dedup_key.is_some() && results[i].is_some_and(|r| !r.duplicate))
            .map(|&i| jobs[i].id.0)
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let rows = sqlx::query_file!("src/store/sql/enqueue_held.sql", &ids)
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            return Ok(());
        }
        let by_id: FastMap<Uuid, usize> = round.iter().map(|&i| (jobs[i].id.0, i)).collect();
        for r in &rows {
            if let Some(&i) = by_id.get(&r.id) {
                results[i] = Some(Enqueued::duplicate_of(r.holder));
            }
        }
        handed.retain(|h| !rows.iter().any(|r| r.id == h.id.0));
        Ok(())
    }

    /// What holds the dedup keys of `jobs[i]` for `i` in `dups`: a live
    /// job (and whether it is waiting), else a hold of a completed job
    /// (unique_for) still in force. (queue, dedup key) → holder.
    async fn key_holders(
        tx: &mut sqlx::PgConnection,
        jobs: &[NewJob],
        dups: &[usize],
    ) -> Result<HashMap<(String, String), Holder>> {
        let queues: Vec<&str> = dups.iter().map(|&i| jobs[i].queue.as_str()).collect();
        let keys: Vec<&str> = dups
            .iter()
            .map(|&i| jobs[i].dedup_key.as_deref().unwrap_or(""))
            .collect();
        let rows = sqlx::query_file!(
            "src/store/sql/dedup_holders.sql",
            &queues as &Vec<&str>,
            &keys as &Vec<&str>
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut holders: HashMap<(String, String), Holder> = HashMap::new();
        for r in rows {
            holders.insert(
                (r.queue, r.dedup_key),
                Holder {
                    id: r.id,
                    waiting: r.waiting,
                },
            );
        }
        Ok(holders)
    }

    /// Runs enqueue.sql for `jobs` (with their claims, if any); one job,
    /// enqueue_one.sql.
    async fn insert_jobs(
        &self,
        conn: &mut sqlx::PgConnection,
        jobs: &[&NewJob],
        claims: &[Option<&HandoffTo>],
    ) -> Result<Vec<InsertedRow>> {
        if let ([job], [claim]) = (jobs, claims) {
            return self.insert_job(conn, job, *claim).await;
        }
        let c = JobColumns::new(jobs, claims, self.broker_id);
        Ok(sqlx::query_file_as!(
            InsertedRow,
            "src/store/sql/enqueue.sql",
            &c.id,
            &c.queue,
            &c.priority,
            &c.run_at as &Vec<Option<DateTime<Utc>>>,
            &c.delay_ms,
            &c.payload,
            &c.headers,
            &c.max_attempts as &Vec<Option<i32>>,
            &c.dedup as &Vec<Option<String>>,
            &c.ttl as &Vec<Option<i64>>,
            &c.handoff,
            &c.lease_ms as &Vec<Option<i64>>,
            &c.consumer as &Vec<Option<&str>>,
            &c.broker as &Vec<Option<Uuid>>,
            &c.token as &Vec<Option<Uuid>>,
            &c.key as &Vec<Option<String>>,
            &c.unique_for_ms as &Vec<Option<i64>>,
        )
        .fetch_all(conn)
        .await?)
    }

    /// [`Store::insert_jobs`] for one job: enqueue_one.sql, the same
    /// statement with plain parameters (cheaper for PostgreSQL than unnest
    /// over one-element arrays; a light load enqueues one job at a time).
    async fn insert_job(
        &self,
        conn: &mut sqlx::PgConnection,
        job: &NewJob,
        claim: Option<&HandoffTo>,
    ) -> Result<Vec<InsertedRow>> {
        let (run_at, delay_ms) = schedule_columns(&job.schedule);
        if let Some(c) = claim
            && let Some(broker) = c.broker
        {
            // Another replica's stream: the hand-over NOTIFY goes in the
            // same statement (enqueue_handover.sql).
            return Ok(sqlx::query_file_as!(
                InsertedRow,
                "src/store/sql/enqueue_handover.sql",
                job.id.0,
                job.queue.as_str(),
                job.priority,
                run_at,
                delay_ms,
                &job.payload,
                &job.headers_json,
                job.max_attempts,
                job.dedup_key.as_deref(),
                job.ttl_ms,
                true,
                c.lease_ms,
                &*c.consumer,
                broker,
                Uuid::new_v4(),
                // Keyed jobs are never handed off (broker.rs).
                job.key.as_deref(),
                job.unique_for_ms,
                c.stream as i64,
            )
            .fetch_all(conn)
            .await?);
        }
        Ok(sqlx::query_file_as!(
            InsertedRow,
            "src/store/sql/enqueue_one.sql",
            job.id.0,
            job.queue.as_str(),
            job.priority,
            run_at,
            delay_ms,
            &job.payload,
            &job.headers_json,
            job.max_attempts,
            job.dedup_key.as_deref(),
            job.ttl_ms,
            claim.is_some(),
            claim.and_then(|c| c.lease_ms),
            claim.map(|c| &*c.consumer),
            claim.map(|c| c.broker.unwrap_or(self.broker_id)),
            claim.map(|_| Uuid::new_v4()),
            job.key.as_deref(),
            job.unique_for_ms,
        )
        .fetch_all(conn)
        .await?)
    }

    /// Sends wake-ups (on [`channels::WAKE`]), settle notices (on each
    /// broker's [`channels::settle`] channel) and
    /// `raw` (channel, payload) pairs in one statement, outside any write
    /// transaction.
    pub(crate) async fn notify(
        &self,
        wakes: &[Wake],
        settled: &[(Uuid, JobId, LeaseToken)],
        raw: Vec<(String, String)>,
    ) -> Result<()> {
        let (mut names, mut payloads): (Vec<String>, Vec<String>) = raw.into_iter().unzip();
        let me = self.broker_id.simple().to_string();
        for w in wakes {
            names.push(channels::WAKE.to_owned());
            payloads.push(channels::wake(&me, w));
        }
        let mut by_broker: HashMap<Uuid, Vec<(JobId, LeaseToken)>> = HashMap::new();
        for (broker, id, token) in settled {
            by_broker.entry(*broker).or_default().push((*id, *token));
        }
        for (broker, leases) in by_broker {
            for p in channels::settled(&leases) {
                names.push(channels::settle(broker));
                payloads.push(p);
            }
        }
        if names.is_empty() {
            return Ok(());
        }
        let mut c = self.conns.acquire().await?;
        c.bounded(|c| {
            sqlx::query!(
                "select pg_notify(c, p) from unnest($1::text[], $2::text[]) as n(c, p)",
                &names,
                &payloads,
            )
            .execute(c)
        })
        .await?;
        c.done();
        Ok(())
    }

    /// Leases jobs for a dispatcher round of unlimited queues (see
    /// lease.sql). Wanted queues that turn out to have limits are skipped and
    /// named in [`LeaseOutcome::limited`]: they go through
    /// [`Store::lease_limited`].
    pub(crate) async fn lease(&self, wants: &[Want]) -> Result<LeaseOutcome> {
        let mut c = self.conns.acquire().await?;
        let rows = c.bounded(|c| self.lease_rows(c, wants, false)).await?;
        c.done();
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
    /// A round of one want outside the limited path runs lease_one.sql, the
    /// same lease in a leaner statement.
    async fn lease_rows<'e>(
        &self,
        exec: impl Executor<'e, Database = Postgres>,
        wants: &[Want],
        include_limited: bool,
    ) -> Result<Vec<LeaseRow>> {
        if let [w] = wants
            && !include_limited
        {
            let rows = sqlx::query_file!(
                "src/store/sql/lease_one.sql",
                w.queue.as_str(),
                i64::from(w.n),
                w.lease_ms,
                w.slot,
                &*w.consumer,
                self.broker_id,
            )
            .fetch_all(exec)
            .await?;
            return rows.into_iter().map(|r| lease_row!(self, r)).collect();
        }
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
            consumer.push(&*w.consumer);
        }
        let rows = sqlx::query_file!(
            "src/store/sql/lease.sql",
            &queues as &Vec<&str>,
            &lo,
            &hi,
            &lease as &Vec<Option<i64>>,
            &slot,
            &consumer as &Vec<&str>,
            self.broker_id,
            include_limited,
        )
        .fetch_all(exec)
        .await?;
        rows.into_iter().map(|r| lease_row!(self, r)).collect()
    }

    /// Completes jobs whose token is current: deletes them, and keeps a
    /// record of those whose queue has a completed retention (see ack.sql).
    /// Returns the ones completed.
    pub(crate) async fn ack(&self, reqs: &[AckReq]) -> Result<Vec<Settled>> {
        // In id order: ack.sql locks the rows in the order given.
        let mut reqs: Vec<&AckReq> = reqs.iter().collect();
        reqs.sort_unstable_by_key(|r| (r.job_id.0, r.token.0));
        let ids: Vec<Uuid> = reqs.iter().map(|r| r.job_id.0).collect();
        let tokens: Vec<Uuid> = reqs.iter().map(|r| r.token.0).collect();
        let results = ack_results(&reqs);
        let mut c = self.conns.acquire().await?;
        let rows = c
            .bounded(|c| {
                sqlx::query_file!(
                    "src/store/sql/ack.sql",
                    &ids,
                    &tokens,
                    &results as &Vec<Option<&[u8]>>
                )
                .fetch_all(c)
            })
            .await?;
        c.done();
        Ok(rows
            .into_iter()
            .map(|r| Settled {
                id: JobId(r.id),
                token: LeaseToken(r.lease_token, self.cluster),
                broker: r.lease_broker,
                slot_freed: r.slot_freed.and_then(|q| QueueName::parse(&q)),
                queue: r.queue,
                recheck_key: r.recheck_key,
            })
            .collect())
    }

    /// Of these (queue, key) pairs, the queues where a job of the key waits
    /// (any state but leased): ack.sql's `recheck_key`, looked up again
    /// after the acks committed. One probe of jobs_key per pair.
    pub(crate) async fn keys_waiting(&self, pairs: &[(String, String)]) -> Result<Vec<QueueName>> {
        let (queues, keys): (Vec<&str>, Vec<&str>) =
            pairs.iter().map(|(q, k)| (q.as_str(), k.as_str())).unzip();
        let mut c = self.conns.acquire().await?;
        let rows = c
            .bounded(|c| {
                sqlx::query_scalar!(
                    r#"select distinct u.queue as "queue!"
                    from unnest($1::text[], $2::text[]) as u(queue, key)
                    where exists (
                        select from leaseq.jobs j
                        where j.queue = u.queue and j.key = u.key and j.state <> 'leased')"#,
                    &queues as &Vec<&str>,
                    &keys as &Vec<&str>,
                )
                .fetch_all(c)
            })
            .await?;
        c.done();
        Ok(rows.iter().filter_map(|q| QueueName::parse(q)).collect())
    }

    /// Completes one job whose token is current and inserts `jobs` (its
    /// follow-ups) in the same transaction: ack.sql, then the enqueue
    /// statement, then COMMIT. A stale token matches no row: the
    /// transaction is rolled back before anything is inserted, and None is
    /// returned. Follow-ups are inserted available (never handed off), with
    /// duplicates resolved as [`Store::enqueue`] does; `new_queues` are
    /// their queues, `moving` as for [`Store::enqueue`].
    pub(crate) async fn ack_enqueue(
        &self,
        ack: AckReq,
        jobs: &[NewJob],
        new_queues: &[QueueName],
        moving: &[(Store, Vec<usize>)],
    ) -> Result<Option<(Settled, EnqueueOutcome)>> {
        let mut c = self.conns.acquire().await?;
        let out = c
            .bounded(|c| async move {
                let mut tx = sqlx::Connection::begin(c).await?;
                let (ids, tokens) = (vec![ack.job_id.0], vec![ack.token.0]);
                let results = ack_results(&[&ack]);
                let row = sqlx::query_file!(
                    "src/store/sql/ack.sql",
                    &ids,
                    &tokens,
                    &results as &Vec<Option<&[u8]>>
                )
                .fetch_optional(&mut *tx)
                .await?;
                let Some(r) = row else {
                    tx.rollback().await?;
                    return Ok::<_, Error>(None);
                };
                let claims = vec![None; jobs.len()];
                let mut out = self.enqueue_in(&mut tx, jobs, &claims, new_queues).await?;
                for (source, idxs) in moving {
                    self.dedup_elsewhere(&mut tx, source, jobs, idxs, &mut out)
                        .await?;
                }
                tx.commit().await?;
                let acked = Settled {
                    id: JobId(r.id),
                    token: LeaseToken(r.lease_token, self.cluster),
                    broker: r.lease_broker,
                    slot_freed: r.slot_freed.and_then(|q| QueueName::parse(&q)),
                    queue: r.queue,
                    recheck_key: r.recheck_key,
                };
                Ok(Some((acked, out)))
            })
            .await?;
        c.done();
        Ok(out)
    }

    /// Ends leases unsuccessfully (see fail.sql). Returns the ones matched.
    pub(crate) async fn fail(&self, reqs: &[FailReq]) -> Result<Vec<Failed>> {
        // In id order: fail.sql locks the rows in the order given.
        let mut reqs: Vec<&FailReq> = reqs.iter().collect();
        reqs.sort_unstable_by_key(|r| r.id.0);
        let ids: Vec<Uuid> = reqs.iter().map(|r| r.id.0).collect();
        let tokens: Vec<Uuid> = reqs.iter().map(|r| r.token.0).collect();
        let errors: Vec<&str> = reqs.iter().map(|r| r.error.as_str()).collect();
        let retry: Vec<Option<i64>> = reqs.iter().map(|r| r.retry_after_ms).collect();
        let dead: Vec<bool> = reqs.iter().map(|r| r.dead_letter).collect();
        let refund: Vec<bool> = reqs.iter().map(|r| r.refund).collect();
        let mut c = self.conns.acquire().await?;
        let rows = c
            .bounded(|c| {
                sqlx::query_file!(
                    "src/store/sql/fail.sql",
                    &ids,
                    &tokens,
                    &errors as &Vec<&str>,
                    &retry as &Vec<Option<i64>>,
                    &dead,
                    &refund,
                )
                .fetch_all(c)
            })
            .await?;
        c.done();
        rows.into_iter()
            .map(|r| {
                Ok(Failed {
                    id: JobId(r.id),
                    token: LeaseToken(r.token, self.cluster),
                    queue: QueueName::parse(&r.queue)
                        .ok_or(Error::Internal("bad queue name in db"))?,
                    broker: r.lease_broker,
                    death: r.death,
                    retry_ms: r.retry_ms,
                    slot_freed: r.slot_freed,
                })
            })
            .collect()
    }

    /// Extends leases whose token is current and not yet expired.
    pub(crate) async fn extend(&self, reqs: &[ExtendReq]) -> Result<Vec<Extended>> {
        // In id order: extend.sql locks the rows in the order given.
        let mut reqs: Vec<&ExtendReq> = reqs.iter().collect();
        reqs.sort_unstable_by_key(|r| r.job_id.0);
        let ids: Vec<Uuid> = reqs.iter().map(|r| r.job_id.0).collect();
        let tokens: Vec<Uuid> = reqs.iter().map(|r| r.token.0).collect();
        let lease_ms: Vec<i64> = reqs.iter().map(|r| r.lease_ms).collect();
        let mut c = self.conns.acquire().await?;
        let rows = c
            .bounded(|c| {
                sqlx::query_file!("src/store/sql/extend.sql", &ids, &tokens, &lease_ms).fetch_all(c)
            })
            .await?;
        c.done();
        Ok(rows
            .into_iter()
            .map(|r| Extended {
                id: JobId(r.id),
                token: LeaseToken(r.lease_token, self.cluster),
                lease_expires_at: r.lease_expires_at,
                broker: r.lease_broker,
                lease_ms: r.lease_ms,
            })
            .collect())
    }

    /// Leases past their expiry (all, or only among `only`).
    pub(crate) async fn expired_leases(
        &self,
        only: Option<&[JobId]>,
        limit: i64,
    ) -> Result<Vec<(JobId, LeaseToken)>> {
        let only: Option<Vec<Uuid>> = only.map(|ids| ids.iter().map(|i| i.0).collect());
        let rows = self
            .on_pool(async {
                let mut tx = self.sweep_tx().await?;
                let rows =
                    sqlx::query_file!("src/store/sql/expired_leases.sql", only.as_deref(), limit)
                        .fetch_all(&mut *tx)
                        .await?;
                tx.commit().await?;
                Ok(rows)
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| (JobId(r.id), LeaseToken(r.lease_token, self.cluster)))
            .collect())
    }

    /// Live leases of this broker on jobs enqueued more than `older_ms` ago
    /// (see unheard_leases.sql): the dispatcher keeps those its streams hold.
    pub(crate) async fn unheard_leases(&self, older_ms: i64) -> Result<Vec<(JobId, LeaseToken)>> {
        let rows = self
            .on_pool(async {
                let mut tx = self.sweep_tx().await?;
                let rows =
                    sqlx::query_file!("src/store/sql/unheard_leases.sql", self.broker_id, older_ms)
                        .fetch_all(&mut *tx)
                        .await?;
                tx.commit().await?;
                Ok(rows)
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| (JobId(r.id), LeaseToken(r.lease_token, self.cluster)))
            .collect())
    }

    /// Checks these leases in one snapshot of the database: which are past
    /// their expiry (to reap: they may carry another token by now, a lease
    /// that ran out all the same) and which are still current, with
    /// milliseconds left. Both statements run in one transaction, so they
    /// see the same `now()`: every lease still held is in one list or the
    /// other. (Run as two, a lease that ran out between them was in
    /// neither: the dispatcher gave its stream the credit back, and the job
    /// waited for the maintenance reaper, up to `--reap-interval`.) In a
    /// sweep transaction: see lease_status.sql.
    pub async fn check_leases(
        &self,
        leases: &[(JobId, LeaseToken)],
    ) -> Result<(Vec<(JobId, LeaseToken)>, Vec<(JobId, i64)>)> {
        let ids: Vec<Uuid> = leases.iter().map(|l| l.0.0).collect();
        let tokens: Vec<Uuid> = leases.iter().map(|l| l.1.0).collect();
        let (expired, alive) = self
            .on_pool(async {
                let mut tx = self.sweep_tx().await?;
                let expired = sqlx::query_file!(
                    "src/store/sql/expired_leases.sql",
                    Some(&ids[..]),
                    ids.len() as i64
                )
                .fetch_all(&mut *tx)
                .await?;
                let alive = sqlx::query_file!("src/store/sql/lease_status.sql", &ids, &tokens)
                    .fetch_all(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok((expired, alive))
            })
            .await?;
        Ok((
            expired
                .into_iter()
                .map(|r| (JobId(r.id), LeaseToken(r.lease_token, self.cluster)))
                .collect(),
            alive
                .into_iter()
                .map(|r| (JobId(r.id), r.remaining_ms))
                .collect(),
        ))
    }

    /// Dead-letters waiting jobs past their ttl; returns how many per queue.
    pub(crate) async fn expire_ttl(&self, limit: i64) -> Result<Vec<(String, u64)>> {
        let rows = self
            .on_pool(async {
                let mut tx = self.sweep_tx().await?;
                let rows = sqlx::query_file!("src/store/sql/expire_ttl.sql", limit)
                    .fetch_all(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(rows)
            })
            .await?;
        Ok(rows.into_iter().map(|r| (r.queue, r.n as u64)).collect())
    }

    /// A transaction for the sweeps over leaseq.jobs (expired leases, ttl)
    /// in which the planner takes no sequential scan and no sort where an
    /// index serves: their plan, an ordered range scan of a small partial
    /// index, must not depend on the table's statistics when the statement
    /// was planned (after a VACUUM or ANALYZE of a drained table: no
    /// rows). Planned so, the ttl sweep read every
    /// waiting job through jobs_ready instead, and under a steady stream of
    /// enqueues one run took minutes (docs/BENCHMARKS.md, "Plans made on an
    /// empty table"). These statements (and the dispatcher's lease check,
    /// its next-due lookup and the retention sweep over completed_jobs,
    /// whose plans had the same flaw) run only in such a transaction, so
    /// every plan the connection caches for them is made with these
    /// settings.
    async fn sweep_tx(&self) -> Result<sqlx::Transaction<'static, Postgres>> {
        let mut tx = self.pool.begin().await?;
        sqlx::raw_sql(SWEEP_PLANNER_SETTINGS)
            .execute(&mut *tx)
            .await?;
        Ok(tx)
    }

    /// Deletes up to `limit` completed records past their queue's retention
    /// (see expire_completed.sql). Returns how many. In a sweep transaction:
    /// with the default planner settings, its generic plan made on an empty,
    /// analysed completed_jobs found the doomed rows by reading the whole
    /// table (a sequential scan filtered on ctid) for every batch, however
    /// many records the retention kept (tests/plans.rs).
    ///
    /// Records with a result are kept for the longer of their queue's
    /// retention and `result_retention_ms`.
    pub(crate) async fn expire_completed(
        &self,
        limit: i64,
        result_retention_ms: i64,
    ) -> Result<u64> {
        let done = self
            .on_pool(async {
                let mut tx = self.sweep_tx().await?;
                let done = sqlx::query_file!(
                    "src/store/sql/expire_completed.sql",
                    limit,
                    result_retention_ms
                )
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(done)
            })
            .await?;
        Ok(done.rows_affected())
    }

    /// Records progress reports whose token is current (progress.sql), one
    /// per job. Returns the jobs written.
    pub(crate) async fn progress(&self, reqs: &[&ProgressReq]) -> Result<Vec<Uuid>> {
        // In id order: the upsert locks the rows in the order given.
        let mut reqs = reqs.to_vec();
        reqs.sort_unstable_by_key(|r| r.job_id.0);
        let ids: Vec<Uuid> = reqs.iter().map(|r| r.job_id.0).collect();
        let tokens: Vec<Uuid> = reqs.iter().map(|r| r.token.0).collect();
        let fractions: Vec<f32> = reqs.iter().map(|r| r.fraction).collect();
        let messages: Vec<&str> = reqs.iter().map(|r| r.message.as_str()).collect();
        let mut c = self.conns.acquire().await?;
        let rows = c
            .bounded(|c| {
                sqlx::query_file_scalar!(
                    "src/store/sql/progress.sql",
                    &ids,
                    &tokens,
                    &fractions,
                    &messages as &Vec<&str>,
                )
                .fetch_all(c)
            })
            .await?;
        c.done();
        Ok(rows)
    }

    /// Deletes at most `limit` progress reports of jobs that are gone
    /// (delete_orphan_progress.sql). Returns how many.
    pub(crate) async fn delete_orphan_progress(&self, limit: i64) -> Result<u64> {
        let done = self
            .on_pool(async {
                sqlx::query_file!("src/store/sql/delete_orphan_progress.sql", limit)
                    .execute(&self.pool)
                    .await
                    .map_err(Into::into)
            })
            .await?;
        Ok(done.rows_affected())
    }

    /// The state of each of `ids` (wait_status.sql): live, dead, completed,
    /// or none (`state` None). For WaitJob ([`crate::waits`]).
    pub(crate) async fn wait_status(&self, ids: &[Uuid]) -> Result<Vec<WaitRow>> {
        self.on_pool(async {
            let rows = sqlx::query_file!("src/store/sql/wait_status.sql", ids)
                .fetch_all(&self.pool)
                .await?;
            Ok(rows
                .into_iter()
                .map(|r| WaitRow {
                    id: r.id,
                    state: r.state,
                    queue: r.queue,
                    dead_reason: r.dead_reason,
                    last_error: r.last_error,
                    finished_at: r.finished_at,
                    result: r.result,
                })
                .collect())
        })
        .await
    }

    /// Deletes at most `limit` records of cancelled jobs older than
    /// `retention_ms` (expire_cancelled.sql). Returns how many.
    pub(crate) async fn expire_cancelled(&self, limit: i64, retention_ms: i64) -> Result<u64> {
        let done = self
            .on_pool(async {
                sqlx::query_file!("src/store/sql/expire_cancelled.sql", limit, retention_ms)
                    .execute(&self.pool)
                    .await
                    .map_err(Into::into)
            })
            .await?;
        Ok(done.rows_affected())
    }

    /// Deletes at most `limit` per-key rate buckets that are full again
    /// (expire_key_buckets.sql). Returns how many.
    pub(crate) async fn expire_key_buckets(&self, limit: i64) -> Result<u64> {
        let done = self
            .on_pool(async {
                sqlx::query_file!("src/store/sql/expire_key_buckets.sql", limit)
                    .execute(&self.pool)
                    .await
                    .map_err(Into::into)
            })
            .await?;
        Ok(done.rows_affected())
    }

    /// Deletes dedup keys held after their job completed (unique_for) whose
    /// window has passed, at most `limit` (expire_dedup_holds.sql).
    pub(crate) async fn expire_dedup_holds(&self, limit: i64) -> Result<u64> {
        let done = self
            .on_pool(async {
                sqlx::query_file!("src/store/sql/expire_dedup_holds.sql", limit)
                    .execute(&self.pool)
                    .await
                    .map_err(Into::into)
            })
            .await?;
        Ok(done.rows_affected())
    }

    /// Milliseconds until each queue's next delayed job (None: no such job),
    /// and whether one is deliverable now. In a sweep transaction: with the default planner settings, its
    /// generic plan made on a drained table read every job of the queue and
    /// sorted them (tests/plans.rs); with them it reads jobs_scheduled.
    pub(crate) async fn next_due(&self, queues: &[QueueName]) -> Result<Vec<Due>> {
        let names: Vec<&str> = queues.iter().map(QueueName::as_str).collect();
        let rows = self
            .on_pool(async {
                let mut tx = self.sweep_tx().await?;
                let rows = sqlx::query_file!("src/store/sql/next_due.sql", &names as &Vec<&str>)
                    .fetch_all(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(rows)
            })
            .await?;
        rows.into_iter()
            .map(|r| {
                let queue = QueueName::parse(&r.name).ok_or(Error::Internal("bad queue name"))?;
                Ok(Due {
                    queue,
                    due_ms: r.due_ms,
                    ready: r.ready,
                })
            })
            .collect()
    }

    /// A cheap liveness probe for health reporting: `select 1` on a
    /// connection of the hot path's set, within [`conn::PING_TIMEOUT`]
    /// (UNAVAILABLE past it). The hot path's, not the pool's: what clients
    /// need is that set answering, and long admin or console statements on
    /// the small pool must not make a healthy database look down.
    ///
    /// A connection the server closed while it sat in the set (a backend
    /// terminated, a restart) fails at once without saying anything about
    /// the server: it is closed and the probe tries again, three times at
    /// most, on another connection or a new one.
    pub(crate) async fn ping(&self) -> Result<()> {
        let probe = async {
            let mut tries = 0;
            loop {
                tries += 1;
                let mut c = self.conns.acquire().await?;
                match c
                    .bounded(|c| sqlx::query_scalar!("select 1").fetch_one(c))
                    .await
                {
                    Ok(_) => {
                        c.done();
                        return Ok(());
                    }
                    Err(e) if tries >= 3 => return Err(e),
                    Err(_) => {}
                }
            }
        };
        tokio::time::timeout(conn::PING_TIMEOUT, probe)
            .await
            .unwrap_or_else(|_| Err(conn::no_answer("the health probe", conn::PING_TIMEOUT)))
    }

    /// Runs `f`, statements on the sqlx pool, within the time to get a
    /// connection plus the statement bound: a pool connection whose server
    /// stopped answering must not hang the caller (the dispatcher's sweeps,
    /// the reaper) for good. Past it `f` is dropped (its connection, given
    /// back mid-statement, fails its check on release and is closed) and
    /// the call fails with UNAVAILABLE.
    pub(crate) async fn on_pool<T>(
        &self,
        f: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let Some(bound) = self.conns.bound() else {
            return f.await;
        };
        let bound = bound + self.conns.acquire_timeout();
        tokio::time::timeout(bound, f)
            .await
            .unwrap_or_else(|_| Err(conn::no_answer("a maintenance statement", bound)))
    }
}

/// One row enqueue.sql inserted.
struct InsertedRow {
    id: Uuid,
    queue: String,
    delay_ms: i64,
    /// Set when the job was inserted leased (handed off).
    lease_token: Option<Uuid>,
    lease_ms: Option<i64>,
    lease_expires_at: Option<DateTime<Utc>>,
    enqueued_at: DateTime<Utc>,
    /// Set when the statement sent the job's hand-over (enqueue_handover.sql).
    notified: Option<String>,
}

impl InsertedRow {
    /// Adds the row to an outcome: a wake for an available job, a
    /// delivery for a handed-off one (`by_id` maps ids to request indexes)
    /// unless the statement handed it over to another replica already.
    fn into_outcome(
        self,
        by_id: &FastMap<Uuid, usize>,
        jobs: &[NewJob],
        wakes: &mut Wakes,
        handed: &mut Vec<Leased>,
        cluster: ClusterId,
    ) {
        let (Some(token), Some(lease_ms), Some(expires), Some(&i)) = (
            self.lease_token,
            self.lease_ms,
            self.lease_expires_at,
            by_id.get(&self.id),
        ) else {
            wakes.add(&self.queue, self.delay_ms);
            return;
        };
        if self.notified.is_some() {
            // Handed over to another replica by the statement itself.
            return;
        }
        let job = &jobs[i];
        handed.push(Leased {
            slot: i as i32,
            lease_ms,
            id: job.id,
            queue: self.queue,
            payload: job.payload.clone(),
            headers: job.headers.clone(),
            priority: job.priority,
            attempt: 1,
            enqueued_at: self.enqueued_at,
            run_at: self.enqueued_at,
            last_error: None,
            token: LeaseToken(token, cluster),
            lease_expires_at: expires,
            key: job.key.clone(),
        });
    }
}

/// A schedule as enqueue.sql's `run_at` and `delay_ms` columns.
/// A waited job's state (wait_status.sql): `state` is `available`,
/// `scheduled`, `leased`, `dead`, `completed`, or None (no such job here).
#[derive(Clone, Debug)]
pub struct WaitRow {
    pub id: Uuid,
    pub state: Option<String>,
    pub queue: Option<String>,
    pub dead_reason: Option<String>,
    pub last_error: Option<String>,
    pub finished_at: Option<DateTime<Utc>>,
    pub result: Option<Vec<u8>>,
}

/// ack.sql's `$3`, beside the ids and tokens: each ack's result, or null.
/// Empty when no ack has one (unnest pads it with nulls), so that a
/// statement of acks without results binds no array of nulls.
fn ack_results<'a>(reqs: &[&'a AckReq]) -> Vec<Option<&'a [u8]>> {
    if reqs.iter().all(|r| r.result.is_none()) {
        return Vec::new();
    }
    reqs.iter().map(|r| r.result.as_deref()).collect()
}

fn schedule_columns(schedule: &Schedule) -> (Option<DateTime<Utc>>, i64) {
    match schedule {
        Schedule::Now => (None, 0),
        Schedule::Delay(ms) => (None, *ms),
        Schedule::At(t) => (Some(*t), 0),
    }
}

/// $1..$17 of enqueue.sql: one array per column.
struct JobColumns<'a> {
    id: Vec<Uuid>,
    queue: Vec<String>,
    priority: Vec<i32>,
    run_at: Vec<Option<DateTime<Utc>>>,
    delay_ms: Vec<i64>,
    payload: Vec<Vec<u8>>,
    headers: Vec<String>,
    max_attempts: Vec<Option<i32>>,
    dedup: Vec<Option<String>>,
    ttl: Vec<Option<i64>>,
    handoff: Vec<bool>,
    lease_ms: Vec<Option<i64>>,
    consumer: Vec<Option<&'a str>>,
    broker: Vec<Option<Uuid>>,
    /// The lease token of a job handed off (enqueue.sql).
    token: Vec<Option<Uuid>>,
    key: Vec<Option<String>>,
    unique_for_ms: Vec<Option<i64>>,
}

impl<'a> JobColumns<'a> {
    /// `me`: the broker of a claim on a stream of this one.
    fn new(jobs: &[&NewJob], claims: &[Option<&'a HandoffTo>], me: Uuid) -> JobColumns<'a> {
        let n = jobs.len();
        let mut handoff = Vec::with_capacity(n);
        let mut lease_ms: Vec<Option<i64>> = Vec::with_capacity(n);
        let mut consumer: Vec<Option<&str>> = Vec::with_capacity(n);
        let mut broker: Vec<Option<Uuid>> = Vec::with_capacity(n);
        let mut token: Vec<Option<Uuid>> = Vec::with_capacity(n);
        for c in claims {
            handoff.push(c.is_some());
            lease_ms.push(c.and_then(|c| c.lease_ms));
            consumer.push(c.map(|c| &*c.consumer));
            broker.push(c.map(|c| c.broker.unwrap_or(me)));
            token.push(c.map(|_| Uuid::new_v4()));
        }
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
        let mut key = Vec::with_capacity(n);
        let mut unique_for_ms = Vec::with_capacity(n);
        for j in jobs {
            id.push(j.id.0);
            queue.push(j.queue.as_str().to_owned());
            priority.push(j.priority);
            let (at, delay) = schedule_columns(&j.schedule);
            run_at.push(at);
            delay_ms.push(delay);
            payload.push(j.payload.clone());
            headers.push(j.headers_json.clone());
            max_attempts.push(j.max_attempts);
            dedup.push(j.dedup_key.clone());
            ttl.push(j.ttl_ms);
            key.push(j.key.clone());
            unique_for_ms.push(j.unique_for_ms);
        }
        JobColumns {
            id,
            queue,
            priority,
            run_at,
            delay_ms,
            payload,
            headers,
            max_attempts,
            dedup,
            ttl,
            handoff,
            lease_ms,
            consumer,
            broker,
            token,
            key,
            unique_for_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    /// The SQL of a statement file without its comment lines.
    fn code(sql: &str) -> String {
        sql.lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// enqueue_one.sql is enqueue.sql with the job's fields as plain
    /// parameters: the two differ only in their `from` item, so a change to
    /// one cannot silently miss the other (tests/semantics.rs checks that
    /// they store a job alike).
    #[test]
    fn the_one_job_statement_is_the_batch_statement_with_plain_parameters() {
        let batch = code(include_str!("sql/enqueue.sql"));
        let one = code(include_str!("sql/enqueue_one.sql"));
        let around = |s: &str| {
            let from = s.find("\nfrom ").expect("a from item");
            let join = s.find("\nleft join lateral").expect("the queue lookup");
            (s[..from].to_owned(), s[join..].to_owned())
        };
        assert_eq!(around(&batch), around(&one));
        assert!(batch.contains("from unnest($1::uuid[]"), "{batch}");
        assert!(one.contains("from (select $1::uuid as id"), "{one}");
    }

    /// enqueue_handover.sql's insert is enqueue_one.sql's (its NOTIFY
    /// comes after, and it reports `notified` itself).
    #[test]
    fn the_hand_over_statement_inserts_as_the_one_job_statement() {
        let one = code(include_str!("sql/enqueue_one.sql"));
        let over = code(include_str!("sql/enqueue_handover.sql"));
        let start = over.find("with j as (\n").expect("the insert's CTE") + "with j as (\n".len();
        let end = over.find("\n)\nselect j.id").expect("the select after it");
        let insert: Vec<&str> = over[start..end]
            .lines()
            .map(|l| l.strip_prefix("    ").unwrap_or(l))
            .collect();
        let one = one.replace(",\n    null::text as notified", "");
        assert_eq!(insert.join("\n"), one.trim_end());
        assert!(over.contains("pg_notify("), "{over}");
    }

    /// The body of SQL function `name` in the last migration that creates
    /// (or replaces) it: the text between its dollar-quote tags.
    fn function_body(name: &str) -> String {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "sql"))
            .collect();
        files.sort();
        let tag = format!("${}$", name.trim_start_matches("leaseq."));
        for path in files.iter().rev() {
            let sql = std::fs::read_to_string(path).unwrap();
            let Some(at) = sql.find(&format!("function {name}(")) else {
                continue;
            };
            let rest = &sql[at..];
            let start = rest
                .find(&format!("as {tag}\n"))
                .expect("the body's opening tag")
                + tag.len()
                + 4;
            let end = rest[start..].find(&tag).expect("the body's closing tag");
            return rest[start..start + end].to_owned();
        }
        panic!("no migration creates {name}");
    }

    /// leaseq.ack() and leaseq.nack() (SQL, in the user's transaction)
    /// settle with the broker's own statements: the functions they call are
    /// ack.sql and fail.sql verbatim. A change to either file needs a
    /// migration that replaces its function with the new text.
    #[test]
    fn the_sql_settle_functions_are_the_broker_statements() {
        assert_eq!(
            function_body("leaseq.settle_ack").trim_end(),
            include_str!("sql/ack.sql").trim_end(),
            "leaseq.settle_ack is not ack.sql: add a migration replacing it"
        );
        assert_eq!(
            function_body("leaseq.settle_fail").trim_end(),
            include_str!("sql/fail.sql").trim_end(),
            "leaseq.settle_fail is not fail.sql: add a migration replacing it"
        );
    }
}
