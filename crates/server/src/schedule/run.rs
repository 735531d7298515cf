//! Every broker's schedule loop, and the firing of ticks (also RunSchedule).
//!
//! A pass is one transaction on the home cluster: it locks the due
//! schedules `for update skip locked` (another broker's pass holds the
//! rest, and fires them), inserts each fired tick's record and job, and
//! moves `next_run_at` on. With one cluster (or a queue on the home
//! cluster) the jobs are inserted in that same transaction: the tick, its
//! job and the schedule's advance commit together. A queue on another
//! cluster gets its ticks and jobs in a transaction there, committed first;
//! should the home transaction then be lost, the next pass fires the same
//! ticks again and their records (primary key schedule and tick) stop a
//! second job.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};
use uuid::Uuid;

use super::store::{self, Row};
use super::{Definition, Overlap, due};
use crate::domain::Wake;
use crate::error::{Error, Result};
use crate::placement::Clusters;
use crate::settle::Settle;
use crate::store::Store;
use crate::tick::Ticks;

/// Most schedules one pass locks and fires; the rest wait for the next.
const BATCH: i64 = 100;
/// Passes between two deletions of old tick records.
const EXPIRE_EVERY: u32 = 60;
/// Most tick records one deletion removes, per cluster.
const EXPIRE_BATCH: i64 = 10_000;

/// The longest `--schedule-grace` (longer is taken as this).
pub const MAX_GRACE: Duration = Duration::from_secs(3600);

/// Fires the schedules' ticks.
#[derive(Clone)]
pub struct Scheduler {
    clusters: Clusters,
    settle: Settle,
    /// Ticks later than this are missed (the catch-up policy decides).
    grace: Duration,
}

impl Scheduler {
    pub fn new(clusters: Clusters, settle: Settle, grace: Duration) -> Scheduler {
        Scheduler {
            clusters,
            settle,
            grace: grace.min(MAX_GRACE),
        }
    }

    /// Runs a pass every `interval` until `shutdown` (one loop per broker:
    /// schedules live on the home cluster).
    pub async fn run(self, interval: Duration, shutdown: CancellationToken) {
        let mut ticks = Ticks::new(interval, &shutdown);
        let mut passes: u32 = 0;
        while ticks.next().await {
            match self.clusters.home().on_pool(self.pass()).await {
                Ok(n) if n > 0 => debug!(fired = n, "schedule ticks fired"),
                Ok(_) => {}
                Err(e) => warn!(error = %e, "schedule pass failed"),
            }
            passes = passes.wrapping_add(1);
            if passes.is_multiple_of(EXPIRE_EVERY) {
                for s in self.clusters.all() {
                    let r = s
                        .on_pool(async {
                            let mut c = s.pool().acquire().await?;
                            store::expire_ticks(&mut c, EXPIRE_BATCH).await
                        })
                        .await;
                    if let Err(e) = r {
                        warn!(error = %e, cluster = %s.cluster_name(), "deleting old schedule ticks failed");
                    }
                }
            }
        }
    }

    /// One pass: fires what is due. Returns the number of jobs enqueued.
    pub async fn pass(&self) -> Result<usize> {
        let home = self.clusters.home();
        let mut tx = home.pool().begin().await?;
        let rows = store::take_due(&mut tx, BATCH).await?;
        if rows.is_empty() {
            tx.rollback().await?;
            return Ok(0);
        }
        // The transaction's start, which take_due compared with.
        let now = store::now(&mut tx).await?;
        let mut wakes = Vec::new();
        let mut fired = 0;
        for row in &rows {
            fired += self.fire_due(&mut tx, row, now, &mut wakes).await?;
        }
        tx.commit().await?;
        self.settle.wake(wakes);
        Ok(fired)
    }

    /// Fires a locked, due schedule's ticks and moves it on.
    async fn fire_due(
        &self,
        home_tx: &mut PgConnection,
        row: &Row,
        now: DateTime<Utc>,
        wakes: &mut Vec<Wake>,
    ) -> Result<usize> {
        let def = match row.definition() {
            Ok(d) => d,
            Err(e) => {
                // Not the broker's writing: leave it for an operator, and
                // do not let it stop the other schedules.
                warn!(schedule = %row.name, error = %e, "schedule cannot be read; not fired");
                return Ok(0);
            }
        };
        let due = due(
            &def.spec,
            row.next_run_at,
            now,
            self.grace,
            def.catch_up,
            def.catch_up_limit,
        );
        let mut fire = due.fire;
        let target = self.clusters.store_for(&def.template.queue)?;
        let same = target.cluster() == self.clusters.home().cluster();
        if def.overlap == Overlap::Skip && !fire.is_empty() {
            let live = match row.last_job_id {
                Some(id) if same => store::is_live(home_tx, id).await?,
                Some(id) => {
                    let mut c = target.pool().acquire().await?;
                    store::is_live(&mut c, id).await?
                }
                None => false,
            };
            let latest = fire.last().copied();
            fire.clear();
            if live {
                debug!(schedule = %def.name, "tick skipped: the last run's job is live");
            } else {
                fire.extend(latest);
            }
        }
        let last = if fire.is_empty() {
            None
        } else if same {
            enqueue_ticks(target, home_tx, row.id, &def, &fire, false, wakes).await?
        } else {
            let mut tx = target.pool().begin().await?;
            let last = enqueue_ticks(target, &mut tx, row.id, &def, &fire, false, wakes).await?;
            tx.commit().await?;
            last
        };
        let next = due.next.unwrap_or_else(never);
        store::advance(home_tx, row.id, next, last).await?;
        Ok(fire.len())
    }

    /// RunSchedule: the schedule's job now, recorded as a tick at the
    /// database's time. Waits for a pass holding the schedule.
    pub async fn run_now(&self, name: &str) -> Result<(DateTime<Utc>, Uuid)> {
        let home = self.clusters.home();
        let mut tx = home.pool().begin().await?;
        let row = store::get(&mut tx, name, true)
            .await?
            .ok_or_else(|| unknown(name))?;
        let def = row.definition()?;
        let tick = store::now(&mut tx).await?;
        let target = self.clusters.store_for(&def.template.queue)?;
        let mut wakes = Vec::new();
        let last = if target.cluster() == home.cluster() {
            enqueue_ticks(target, &mut tx, row.id, &def, &[tick], true, &mut wakes).await?
        } else {
            let mut ttx = target.pool().begin().await?;
            let last =
                enqueue_ticks(target, &mut ttx, row.id, &def, &[tick], true, &mut wakes).await?;
            ttx.commit().await?;
            last
        };
        let (tick, job) = last.ok_or(Error::Internal("a manual run found its tick taken"))?;
        store::record_run(&mut tx, row.id, tick, job).await?;
        tx.commit().await?;
        self.settle.wake(wakes);
        Ok((tick, job))
    }
}

pub(crate) fn unknown(name: &str) -> Error {
    Error::NotFound(format!("schedule {name:?} does not exist"))
}

/// Far enough: a cron that never fires again (a schedule whose days do not
/// come back) waits here.
fn never() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(9999, 12, 31, 0, 0, 0)
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Inserts each tick's record and job on `conn` (a transaction on the
/// queue's cluster, `target`): a tick already recorded enqueues nothing.
/// Returns the last tick that enqueued, with its job.
async fn enqueue_ticks(
    target: &Store,
    conn: &mut PgConnection,
    schedule: Uuid,
    def: &Definition,
    ticks: &[DateTime<Utc>],
    manual: bool,
    wakes: &mut Vec<Wake>,
) -> Result<Option<(DateTime<Utc>, Uuid)>> {
    let mut last = None;
    for &tick in ticks {
        let job = def.template.job(&def.name, tick);
        if !store::claim_tick(conn, schedule, tick, job.id.0, manual).await? {
            debug!(schedule = %def.name, %tick, "tick fired already");
            continue;
        }
        let queue = [job.queue.clone()];
        let out = target
            .enqueue_in(conn, std::slice::from_ref(&job), &[None], &queue)
            .await?;
        wakes.extend(out.wakes);
        if let Some(r) = out.results.first() {
            last = Some((tick, r.job_id.0));
        }
    }
    Ok(last)
}
