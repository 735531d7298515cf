//! `leaseq schedules create|list|get|update|pause|resume|delete|run`: cron
//! schedules over `leaseq.v1.AdminService` (docs/design/schedules.md). The
//! same flags and `-o table|json` as the other operator commands.

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};

use super::admin::ClientArgs;
use super::output::{none_if_empty, opt_ts, print_json, print_table, rfc3339, set_payload};
use super::{CliError, Output, parse_header};
use crate::duration::parse_duration;
use crate::pb;
use crate::pb::admin_service_client::AdminServiceClient;

#[derive(Subcommand, Debug)]
pub enum ScheduleCmd {
    /// Create a schedule: a job from the template at every tick of --cron.
    Create(CreateArgs),
    /// Every schedule, with its next tick.
    List(ListArgs),
    /// One schedule, with its template.
    Get(NameArg),
    /// Change a schedule; only the flags given change (a new --cron or --tz
    /// counts the next tick from now).
    Update(UpdateArgs),
    /// Stop a schedule's ticks (run still works).
    Pause(NameArg),
    /// Resume a paused schedule from now (ticks passed while paused are not
    /// caught up).
    Resume(NameArg),
    /// Delete a schedule (the jobs it enqueued stay).
    Delete(NameArg),
    /// Enqueue the schedule's job now, once.
    Run(NameArg),
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum OverlapArg {
    /// Enqueue at every tick.
    Allow,
    /// Enqueue nothing while the last run's job is waiting or leased.
    Skip,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum CatchUpArg {
    /// Fire none of the ticks missed while every broker was down.
    None,
    /// Fire the latest of them.
    One,
    /// Fire the latest --catch-up-limit of them.
    All,
}

#[derive(Args, Debug)]
pub struct NameArg {
    #[command(flatten)]
    pub client: ClientArgs,
    pub name: String,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

/// The template and policy flags of create and update.
#[derive(Args, Debug)]
pub struct SpecArgs {
    /// Cron expression: five fields, or six with seconds first
    /// ("*/5 * * * * *"), or @hourly, @daily, ...
    #[arg(long)]
    pub cron: Option<String>,
    /// IANA time zone the cron is read in (default UTC).
    #[arg(long = "tz")]
    pub time_zone: Option<String>,
    /// The job's queue.
    #[arg(long, short)]
    pub queue: Option<String>,
    /// The job's payload (text).
    #[arg(long)]
    pub payload: Option<String>,
    /// A header of the job (repeatable).
    #[arg(long = "header", short = 'H', value_name = "KEY=VALUE", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    #[arg(long)]
    pub priority: Option<i32>,
    /// Deliveries before the job is dead-lettered (0 = the queue's default).
    #[arg(long)]
    pub max_attempts: Option<i32>,
    /// The job expires this long after its enqueue (0 = never).
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    #[arg(long, value_enum)]
    pub overlap: Option<OverlapArg>,
    #[arg(long, value_enum)]
    pub catch_up: Option<CatchUpArg>,
    /// With --catch-up all: most missed ticks fired (1 to 1000).
    #[arg(long)]
    pub catch_up_limit: Option<u32>,
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    pub name: String,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
}

#[derive(Args, Debug)]
pub struct UpdateArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    pub name: String,
    #[command(flatten)]
    pub spec: SpecArgs,
}

type Admin = AdminServiceClient<super::ClientChannel>;

async fn connect(c: &ClientArgs) -> Result<Admin, CliError> {
    Ok(AdminServiceClient::new(c.connect.connect().await?))
}

fn overlap(o: Option<OverlapArg>) -> i32 {
    match o {
        None => pb::OverlapPolicy::Unspecified as i32,
        Some(OverlapArg::Allow) => pb::OverlapPolicy::Allow as i32,
        Some(OverlapArg::Skip) => pb::OverlapPolicy::Skip as i32,
    }
}

fn catch_up(c: Option<CatchUpArg>) -> i32 {
    match c {
        None => pb::CatchUpPolicy::Unspecified as i32,
        Some(CatchUpArg::None) => pb::CatchUpPolicy::None as i32,
        Some(CatchUpArg::One) => pb::CatchUpPolicy::One as i32,
        Some(CatchUpArg::All) => pb::CatchUpPolicy::All as i32,
    }
}

impl SpecArgs {
    fn touches_template(&self) -> bool {
        self.queue.is_some()
            || self.payload.is_some()
            || !self.headers.is_empty()
            || self.priority.is_some()
            || self.max_attempts.is_some()
            || self.ttl.is_some()
    }

    /// The template: `base` with the flags given laid over it.
    fn template(&self, base: pb::JobTemplate) -> pb::JobTemplate {
        let mut t = base;
        if let Some(q) = &self.queue {
            t.queue = q.clone();
        }
        if let Some(p) = &self.payload {
            t.payload = p.clone().into_bytes();
        }
        if !self.headers.is_empty() {
            t.headers = self.headers.iter().cloned().collect();
        }
        if let Some(p) = self.priority {
            t.priority = p;
        }
        if let Some(m) = self.max_attempts {
            t.max_attempts = m;
        }
        if let Some(ttl) = self.ttl {
            t.ttl = ttl.try_into().ok();
        }
        t
    }
}

/// Runs a `leaseq schedules` command.
pub async fn run(cmd: ScheduleCmd) -> Result<(), CliError> {
    match cmd {
        ScheduleCmd::Create(a) => create(a).await,
        ScheduleCmd::List(a) => list(a).await,
        ScheduleCmd::Get(a) => {
            let mut admin = connect(&a.client).await?;
            let s = admin
                .get_schedule(pb::GetScheduleRequest { name: a.name })
                .await?
                .into_inner();
            print_one(&s, a.client.output, None);
            Ok(())
        }
        ScheduleCmd::Update(a) => update(a).await,
        ScheduleCmd::Pause(a) => {
            let mut admin = connect(&a.client).await?;
            let s = admin
                .pause_schedule(pb::PauseScheduleRequest { name: a.name })
                .await?
                .into_inner();
            print_one(&s, a.client.output, Some("paused"));
            Ok(())
        }
        ScheduleCmd::Resume(a) => {
            let mut admin = connect(&a.client).await?;
            let s = admin
                .resume_schedule(pb::ResumeScheduleRequest { name: a.name })
                .await?
                .into_inner();
            print_one(&s, a.client.output, Some("resumed"));
            Ok(())
        }
        ScheduleCmd::Delete(a) => {
            let mut admin = connect(&a.client).await?;
            admin
                .delete_schedule(pb::DeleteScheduleRequest {
                    name: a.name.clone(),
                })
                .await?;
            match a.client.output {
                Output::Json => print_json(&json!({"name": a.name, "deleted": true})),
                Output::Table => println!("schedule {} deleted", a.name),
            }
            Ok(())
        }
        ScheduleCmd::Run(a) => {
            let mut admin = connect(&a.client).await?;
            let r = admin
                .run_schedule(pb::RunScheduleRequest {
                    name: a.name.clone(),
                })
                .await?
                .into_inner();
            match a.client.output {
                Output::Json => print_json(&json!({
                    "name": a.name,
                    "job_id": r.job_id,
                    "tick_at": opt_ts(r.tick_at.as_ref()),
                })),
                Output::Table => println!("schedule {} run: job {}", a.name, r.job_id),
            }
            Ok(())
        }
    }
}

async fn create(a: CreateArgs) -> Result<(), CliError> {
    let s = &a.spec;
    let schedule = pb::Schedule {
        name: a.name.clone(),
        cron: s.cron.clone().unwrap_or_default(),
        time_zone: s.time_zone.clone().unwrap_or_default(),
        job: Some(s.template(pb::JobTemplate::default())),
        overlap: overlap(s.overlap),
        catch_up: catch_up(s.catch_up),
        catch_up_limit: s.catch_up_limit.unwrap_or(0),
        paused: a.paused,
    };
    let mut admin = connect(&a.client).await?;
    let info = admin
        .create_schedule(pb::CreateScheduleRequest {
            schedule: Some(schedule),
        })
        .await?
        .into_inner();
    print_one(&info, a.client.output, Some("created"));
    Ok(())
}

async fn update(a: UpdateArgs) -> Result<(), CliError> {
    let mut admin = connect(&a.client).await?;
    let s = &a.spec;
    // The template is replaced whole: the flags given, over the current one.
    let job = if s.touches_template() {
        let current = admin
            .get_schedule(pb::GetScheduleRequest {
                name: a.name.clone(),
            })
            .await?
            .into_inner()
            .schedule
            .and_then(|s| s.job)
            .unwrap_or_default();
        Some(s.template(current))
    } else {
        None
    };
    let info = admin
        .update_schedule(pb::UpdateScheduleRequest {
            name: a.name.clone(),
            cron: s.cron.clone(),
            time_zone: s.time_zone.clone(),
            job,
            overlap: overlap(s.overlap),
            catch_up: catch_up(s.catch_up),
            catch_up_limit: s.catch_up_limit,
            paused: None,
        })
        .await?
        .into_inner();
    print_one(&info, a.client.output, Some("updated"));
    Ok(())
}

async fn list(a: ListArgs) -> Result<(), CliError> {
    let mut admin = connect(&a.client).await?;
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let page = admin
            .list_schedules(pb::ListSchedulesRequest {
                page_size: 1000,
                page_token: token,
            })
            .await?
            .into_inner();
        all.extend(page.schedules);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    match a.client.output {
        Output::Json => print_json(&Value::Array(all.iter().map(schedule_json).collect())),
        Output::Table => print_table(
            &["NAME", "CRON", "ZONE", "QUEUE", "PAUSED", "NEXT", "LAST"],
            all.iter().map(|i| {
                let s = i.schedule.clone().unwrap_or_default();
                vec![
                    s.name,
                    s.cron,
                    s.time_zone,
                    s.job.map(|j| j.queue).unwrap_or_default(),
                    if s.paused { "yes" } else { "no" }.into(),
                    i.next_run_at.as_ref().map_or("-".into(), rfc3339),
                    i.last_tick_at.as_ref().map_or("-".into(), rfc3339),
                ]
            }),
        ),
    }
    Ok(())
}

fn policy_names(s: &pb::Schedule) -> (&'static str, &'static str) {
    let overlap = match pb::OverlapPolicy::try_from(s.overlap) {
        Ok(pb::OverlapPolicy::Skip) => "skip",
        _ => "allow",
    };
    let catch_up = match pb::CatchUpPolicy::try_from(s.catch_up) {
        Ok(pb::CatchUpPolicy::None) => "none",
        Ok(pb::CatchUpPolicy::All) => "all",
        _ => "one",
    };
    (overlap, catch_up)
}

fn schedule_json(i: &pb::ScheduleInfo) -> Value {
    let s = i.schedule.clone().unwrap_or_default();
    let (overlap, catch_up) = policy_names(&s);
    let job = s.job.clone().unwrap_or_default();
    let mut j = json!({
        "queue": job.queue,
        "headers": job.headers,
        "priority": job.priority,
        "max_attempts": job.max_attempts,
        "ttl_seconds": job.ttl.map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9),
    });
    set_payload(&mut j, &job.payload);
    json!({
        "name": s.name,
        "cron": s.cron,
        "time_zone": s.time_zone,
        "job": j,
        "overlap": overlap,
        "catch_up": catch_up,
        "catch_up_limit": s.catch_up_limit,
        "paused": s.paused,
        "next_run_at": opt_ts(i.next_run_at.as_ref()),
        "last_tick_at": opt_ts(i.last_tick_at.as_ref()),
        "last_job_id": none_if_empty(&i.last_job_id),
        "created_at": opt_ts(i.created_at.as_ref()),
        "updated_at": opt_ts(i.updated_at.as_ref()),
    })
}

fn print_one(i: &pb::ScheduleInfo, output: Output, what: Option<&str>) {
    match output {
        Output::Json => print_json(&schedule_json(i)),
        Output::Table => {
            let s = i.schedule.clone().unwrap_or_default();
            if let Some(what) = what {
                println!("schedule {} {what}", s.name);
            }
            let (overlap, catch_up) = policy_names(&s);
            let job = s.job.clone().unwrap_or_default();
            let next = i.next_run_at.as_ref().map_or("-".into(), rfc3339);
            let last = i.last_tick_at.as_ref().map_or("-".into(), rfc3339);
            print_table(
                &["FIELD", "VALUE"],
                [
                    vec!["name".into(), s.name.clone()],
                    vec!["cron".into(), s.cron.clone()],
                    vec!["time zone".into(), s.time_zone.clone()],
                    vec!["queue".into(), job.queue.clone()],
                    vec!["priority".into(), job.priority.to_string()],
                    vec!["overlap".into(), overlap.into()],
                    vec![
                        "catch up".into(),
                        format!("{catch_up} (limit {})", s.catch_up_limit),
                    ],
                    vec!["paused".into(), if s.paused { "yes" } else { "no" }.into()],
                    vec!["next run".into(), next],
                    vec!["last tick".into(), last],
                    vec!["last job".into(), i.last_job_id.clone()],
                ]
                .into_iter(),
            );
        }
    }
}
