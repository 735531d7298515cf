//! Schedules (cron) in the [`AdminClient`]: Rust types over the admin
//! API's messages (docs/design/schedules.md).

use std::time::Duration;

use chrono::{DateTime, Utc};
use tonic::Status;

use crate::{AdminClient, Job, pb, timestamp};

/// What a schedule does while the last job it enqueued is unfinished.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overlap {
    /// Enqueue anyway (the default).
    #[default]
    Allow,
    /// Enqueue nothing for this tick.
    Skip,
}

/// Which ticks missed while no broker ran are enqueued when one is back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CatchUp {
    /// None of them.
    None,
    /// The latest of them (the default).
    #[default]
    One,
    /// The latest `n` (1 to 1000).
    All(u32),
}

/// A schedule's definition: a cron expression read in a time zone, and the
/// job each tick enqueues.
#[derive(Clone, Debug)]
pub struct ScheduleSpec {
    pub name: String,
    /// Five fields (minute first) or six (seconds first), or `@hourly`.
    pub cron: String,
    /// An IANA name (`Europe/Paris`); empty = UTC.
    pub time_zone: String,
    /// The job of each tick: its queue, payload, headers, priority, max
    /// attempts and ttl (other options of a [`Job`] are not kept).
    pub job: Job,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
    pub paused: bool,
}

impl ScheduleSpec {
    /// `name` enqueues `job` at each tick of `cron` (UTC).
    pub fn new(name: impl Into<String>, cron: impl Into<String>, job: Job) -> ScheduleSpec {
        ScheduleSpec {
            name: name.into(),
            cron: cron.into(),
            time_zone: String::new(),
            job,
            overlap: Overlap::default(),
            catch_up: CatchUp::default(),
            paused: false,
        }
    }

    /// Reads the cron expression in `zone` (an IANA name).
    pub fn time_zone(mut self, zone: impl Into<String>) -> ScheduleSpec {
        self.time_zone = zone.into();
        self
    }

    pub fn overlap(mut self, overlap: Overlap) -> ScheduleSpec {
        self.overlap = overlap;
        self
    }

    pub fn catch_up(mut self, catch_up: CatchUp) -> ScheduleSpec {
        self.catch_up = catch_up;
        self
    }

    /// Created paused.
    pub fn paused(mut self, paused: bool) -> ScheduleSpec {
        self.paused = paused;
        self
    }

    fn into_pb(self) -> pb::Schedule {
        let (catch_up, catch_up_limit) = catch_up_pb(self.catch_up);
        pb::Schedule {
            name: self.name,
            cron: self.cron,
            time_zone: self.time_zone,
            job: Some(template(self.job)),
            overlap: overlap_pb(self.overlap) as i32,
            catch_up: catch_up as i32,
            catch_up_limit,
            paused: self.paused,
        }
    }
}

fn template(job: Job) -> pb::JobTemplate {
    let r = pb::EnqueueRequest::from(job);
    pb::JobTemplate {
        queue: r.queue,
        payload: r.payload,
        headers: r.headers,
        priority: r.priority,
        max_attempts: r.max_attempts,
        ttl: r.ttl,
    }
}

fn overlap_pb(o: Overlap) -> pb::OverlapPolicy {
    match o {
        Overlap::Allow => pb::OverlapPolicy::Allow,
        Overlap::Skip => pb::OverlapPolicy::Skip,
    }
}

fn catch_up_pb(c: CatchUp) -> (pb::CatchUpPolicy, u32) {
    match c {
        CatchUp::None => (pb::CatchUpPolicy::None, 0),
        CatchUp::One => (pb::CatchUpPolicy::One, 0),
        CatchUp::All(n) => (pb::CatchUpPolicy::All, n),
    }
}

/// A schedule as the broker keeps it.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub name: String,
    pub cron: String,
    /// Empty = UTC.
    pub time_zone: String,
    /// The template's queue, payload, headers, priority, max attempts
    /// (0 = the queue's) and ttl.
    pub queue: String,
    pub payload: Vec<u8>,
    pub headers: std::collections::HashMap<String, String>,
    pub priority: i32,
    pub max_attempts: i32,
    pub ttl: Option<Duration>,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
    pub paused: bool,
    /// The next tick (while paused: where it stood).
    pub next_run_at: Option<DateTime<Utc>>,
    /// The last tick that enqueued a job, and that job.
    pub last_tick_at: Option<DateTime<Utc>>,
    pub last_job_id: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
}

impl From<pb::ScheduleInfo> for Schedule {
    fn from(info: pb::ScheduleInfo) -> Schedule {
        let s = info.schedule.unwrap_or_default();
        let job = s.job.unwrap_or_default();
        Schedule {
            name: s.name,
            cron: s.cron,
            time_zone: s.time_zone,
            queue: job.queue,
            payload: job.payload,
            headers: job.headers,
            priority: job.priority,
            max_attempts: job.max_attempts,
            ttl: job
                .ttl
                .and_then(|d| Duration::try_from(d).ok())
                .filter(|d| !d.is_zero()),
            overlap: match pb::OverlapPolicy::try_from(s.overlap) {
                Ok(pb::OverlapPolicy::Skip) => Overlap::Skip,
                _ => Overlap::Allow,
            },
            catch_up: match pb::CatchUpPolicy::try_from(s.catch_up) {
                Ok(pb::CatchUpPolicy::None) => CatchUp::None,
                Ok(pb::CatchUpPolicy::All) => CatchUp::All(s.catch_up_limit),
                _ => CatchUp::One,
            },
            paused: s.paused,
            next_run_at: info.next_run_at.and_then(timestamp),
            last_tick_at: info.last_tick_at.and_then(timestamp),
            last_job_id: Some(info.last_job_id).filter(|id| !id.is_empty()),
            created_at: info.created_at.and_then(timestamp),
            updated_at: info.updated_at.and_then(timestamp),
        }
    }
}

/// What [`AdminClient::update_schedule`] changes: only what is set.
#[derive(Clone, Debug, Default)]
pub struct ScheduleUpdate(pb::UpdateScheduleRequest);

impl ScheduleUpdate {
    pub fn new() -> ScheduleUpdate {
        ScheduleUpdate::default()
    }

    pub fn cron(mut self, cron: impl Into<String>) -> ScheduleUpdate {
        self.0.cron = Some(cron.into());
        self
    }

    pub fn time_zone(mut self, zone: impl Into<String>) -> ScheduleUpdate {
        self.0.time_zone = Some(zone.into());
        self
    }

    /// Replaces the whole job template.
    pub fn job(mut self, job: Job) -> ScheduleUpdate {
        self.0.job = Some(template(job));
        self
    }

    pub fn overlap(mut self, overlap: Overlap) -> ScheduleUpdate {
        self.0.overlap = overlap_pb(overlap) as i32;
        self
    }

    pub fn catch_up(mut self, catch_up: CatchUp) -> ScheduleUpdate {
        let (policy, limit) = catch_up_pb(catch_up);
        self.0.catch_up = policy as i32;
        self.0.catch_up_limit = Some(limit);
        self
    }

    pub fn paused(mut self, paused: bool) -> ScheduleUpdate {
        self.0.paused = Some(paused);
        self
    }
}

/// A run of [`AdminClient::run_schedule`]: the job, and the tick it was
/// recorded under.
#[derive(Clone, Debug)]
pub struct ScheduleRun {
    pub job_id: String,
    pub tick_at: Option<DateTime<Utc>>,
}

impl AdminClient {
    /// Creates a schedule (`ALREADY_EXISTS` for a name taken).
    pub async fn create_schedule(&self, spec: ScheduleSpec) -> Result<Schedule, Status> {
        let req = pb::CreateScheduleRequest {
            schedule: Some(spec.into_pb()),
        };
        Ok(self
            .admin_service()
            .create_schedule(req)
            .await?
            .into_inner()
            .into())
    }

    pub async fn get_schedule(&self, name: &str) -> Result<Schedule, Status> {
        let req = pb::GetScheduleRequest {
            name: name.to_owned(),
        };
        Ok(self
            .admin_service()
            .get_schedule(req)
            .await?
            .into_inner()
            .into())
    }

    /// Every schedule, in name order.
    pub async fn schedules(&self) -> Result<Vec<Schedule>, Status> {
        let mut out = Vec::new();
        let mut page_token = String::new();
        loop {
            let req = pb::ListSchedulesRequest {
                page_size: 1000,
                page_token,
            };
            let page = self.admin_service().list_schedules(req).await?.into_inner();
            out.extend(page.schedules.into_iter().map(Schedule::from));
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            page_token = page.next_page_token;
        }
    }

    /// Changes what `update` sets.
    pub async fn update_schedule(
        &self,
        name: &str,
        update: ScheduleUpdate,
    ) -> Result<Schedule, Status> {
        let mut req = update.0;
        req.name = name.to_owned();
        Ok(self
            .admin_service()
            .update_schedule(req)
            .await?
            .into_inner()
            .into())
    }

    pub async fn pause_schedule(&self, name: &str) -> Result<Schedule, Status> {
        let req = pb::PauseScheduleRequest {
            name: name.to_owned(),
        };
        Ok(self
            .admin_service()
            .pause_schedule(req)
            .await?
            .into_inner()
            .into())
    }

    pub async fn resume_schedule(&self, name: &str) -> Result<Schedule, Status> {
        let req = pb::ResumeScheduleRequest {
            name: name.to_owned(),
        };
        Ok(self
            .admin_service()
            .resume_schedule(req)
            .await?
            .into_inner()
            .into())
    }

    pub async fn delete_schedule(&self, name: &str) -> Result<(), Status> {
        let req = pb::DeleteScheduleRequest {
            name: name.to_owned(),
        };
        self.admin_service().delete_schedule(req).await?;
        Ok(())
    }

    /// Enqueues the schedule's job now (paused or not).
    pub async fn run_schedule(&self, name: &str) -> Result<ScheduleRun, Status> {
        let req = pb::RunScheduleRequest {
            name: name.to_owned(),
        };
        let r = self.admin_service().run_schedule(req).await?.into_inner();
        Ok(ScheduleRun {
            job_id: r.job_id,
            tick_at: r.tick_at.and_then(timestamp),
        })
    }
}
