//! The schedule RPCs of `leaseq.v1.AdminService` (docs/design/schedules.md):
//! validate ([`crate::schedule::Definition`]), run the SQL on the home
//! cluster ([`crate::schedule::store`]), convert. [`super::admin`] calls
//! these from its trait impl.

use chrono::{DateTime, Utc};
use tracing::info;

use super::admin::{decode_token, encode_token, page_size, ts};
use crate::config::RequestLimits;
use crate::error::{Error, Result};
use crate::pb;
use crate::placement::Clusters;
use crate::schedule::run::{Scheduler, unknown};
use crate::schedule::store::{self, Row};
use crate::schedule::{Definition, Spec, parse_name};

/// What the schedule RPCs need.
pub struct Schedules {
    pub scheduler: Scheduler,
    pub clusters: Clusters,
    pub limits: RequestLimits,
}

fn info(row: &Row) -> Result<pb::ScheduleInfo> {
    let d = row.definition()?;
    Ok(pb::ScheduleInfo {
        schedule: Some(d.to_pb()),
        next_run_at: Some(ts(row.next_run_at)),
        last_tick_at: row.last_tick_at.map(ts),
        last_job_id: row.last_job_id.map(|u| u.to_string()).unwrap_or_default(),
        created_at: Some(ts(row.created_at)),
        updated_at: Some(ts(row.updated_at)),
    })
}

/// The first tick after `now`; a cron whose days never come (30 February)
/// is refused.
fn first_tick(spec: &Spec, now: DateTime<Utc>, field: &str) -> Result<DateTime<Utc>> {
    spec.next_after(now)
        .ok_or_else(|| Error::invalid(field, "never fires"))
}

impl Schedules {
    pub async fn create(&self, r: pb::CreateScheduleRequest) -> Result<pb::ScheduleInfo> {
        let d = Definition::parse(r.schedule, &self.limits)?;
        let home = self.clusters.home();
        let row = home
            .on_pool(async {
                let mut c = home.pool().acquire().await?;
                let now = store::now(&mut c).await?;
                let next = first_tick(&d.spec, now, "schedule.cron")?;
                store::create(&mut c, &d, next).await
            })
            .await?
            .ok_or_else(|| Error::AlreadyExists(format!("schedule {:?} exists", d.name)))?;
        info!(schedule = %d.name, cron = %d.cron, zone = d.spec.zone_name(), "schedule created");
        info(&row)
    }

    pub async fn get(&self, name: &str) -> Result<pb::ScheduleInfo> {
        let name = parse_name(name, "name")?;
        let home = self.clusters.home();
        let row = home
            .on_pool(async {
                let mut c = home.pool().acquire().await?;
                store::get(&mut c, &name, false).await
            })
            .await?
            .ok_or_else(|| unknown(&name))?;
        info(&row)
    }

    pub async fn list(&self, r: pb::ListSchedulesRequest) -> Result<pb::ListSchedulesResponse> {
        let limit = page_size(r.page_size, "page_size")?;
        let after = decode_token(&r.page_token, 's')?;
        let home = self.clusters.home();
        let mut rows = home
            .on_pool(async {
                let mut c = home.pool().acquire().await?;
                store::list(&mut c, after.as_deref(), limit + 1).await
            })
            .await?;
        let more = rows.len() as i64 > limit;
        rows.truncate(limit as usize);
        let next_page_token = match rows.last() {
            Some(last) if more => encode_token('s', &last.name),
            _ => String::new(),
        };
        Ok(pb::ListSchedulesResponse {
            schedules: rows.iter().map(info).collect::<Result<_>>()?,
            next_page_token,
        })
    }

    /// Update, pause and resume: the row locked, the definition changed,
    /// the next tick counted from now when the cron or zone changed or the
    /// schedule resumed.
    pub async fn update(&self, r: pb::UpdateScheduleRequest) -> Result<pb::ScheduleInfo> {
        let name = parse_name(&r.name, "name")?;
        let home = self.clusters.home();
        let row = home
            .on_pool(async {
                let mut tx = home.pool().begin().await?;
                let row = store::get(&mut tx, &name, true)
                    .await?
                    .ok_or_else(|| unknown(&name))?;
                let mut d = row.definition()?;
                let was_paused = d.paused;
                let respec = d.update(r, &self.limits)?;
                let now = store::now(&mut tx).await?;
                let next = if respec || (was_paused && !d.paused) {
                    first_tick(&d.spec, now, "cron")?
                } else {
                    row.next_run_at
                };
                let row = store::update(&mut tx, row.id, &d, next).await?;
                tx.commit().await?;
                Ok(row)
            })
            .await?;
        info!(schedule = %name, paused = row.paused, "schedule changed");
        info(&row)
    }

    pub async fn set_paused(&self, name: String, paused: bool) -> Result<pb::ScheduleInfo> {
        self.update(pb::UpdateScheduleRequest {
            name,
            paused: Some(paused),
            ..Default::default()
        })
        .await
    }

    pub async fn delete(&self, name: &str) -> Result<pb::DeleteScheduleResponse> {
        let name = parse_name(name, "name")?;
        let home = self.clusters.home();
        let deleted = home
            .on_pool(async {
                let mut c = home.pool().acquire().await?;
                store::delete(&mut c, &name).await
            })
            .await?;
        if !deleted {
            return Err(unknown(&name));
        }
        info!(schedule = %name, "schedule deleted");
        Ok(pb::DeleteScheduleResponse {})
    }

    pub async fn run(&self, name: &str) -> Result<pb::RunScheduleResponse> {
        let name = parse_name(name, "name")?;
        let (tick, job) = self
            .clusters
            .home()
            .on_pool(self.scheduler.run_now(&name))
            .await?;
        info!(schedule = %name, job_id = %job, "schedule run now");
        Ok(pb::RunScheduleResponse {
            job_id: job.to_string(),
            tick_at: Some(ts(tick)),
        })
    }
}
