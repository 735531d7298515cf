//! Operator subcommands over `leaseq.v1.AdminService`: `stats`, `queues`,
//! `jobs`, `keys`, `job`, `dlq`, `pause`, `resume`, `purge`, `queue update`;
//! `schedules` is in [`super::schedules`].
//!
//! Each takes the connection flags every client command takes
//! ([`ConnectArgs`]) and `-o table|json`: human tables by default, `-o json`
//! for scripts (one JSON document per command; `stats --watch` prints one
//! per line). Exit codes are the shared ones ([`super::exit`]).
//!
//! The commands that delete jobs (`purge`, `dlq purge`, `job cancel`,
//! `queue update --retention 0`) ask on a terminal and need `--yes`
//! elsewhere; `dlq requeue|purge --all` on a
//! terminal goes a page of dead letters at a time under a progress bar
//! ([`super::interactive`]).

use std::io::IsTerminal;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};

use super::interactive::{confirm, progress};
use super::output::{
    none_if_empty, opt_ts, print_json, print_table, rfc3339, set_payload, truncate,
};
use super::{CliError, ClientChannel, ConnectArgs, Output};
use crate::duration::parse_duration;
use crate::pb;
use crate::pb::admin_service_client::AdminServiceClient;

/// The connection and output flags of every operator command.
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: Output,
}

type Admin = AdminServiceClient<ClientChannel>;

/// Operator commands (flattened into the top-level subcommands).
#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Live queue statistics: jobs by state, oldest waiting age, streams.
    Stats(StatsArgs),
    /// Queues and their settings.
    Queues(QueuesArgs),
    /// List jobs (live by default; --state dead for dead letters, --state
    /// completed for completed jobs kept for the queue's retention).
    Jobs(JobsArgs),
    /// The keys of a queue's live jobs (`enqueue --key`), with their jobs
    /// waiting and leased: by key, or the most waiting first.
    Keys(KeysArgs),
    /// Show or cancel one job.
    Job {
        #[command(subcommand)]
        cmd: JobCmd,
    },
    /// Dead letters: list, requeue, purge.
    Dlq {
        #[command(subcommand)]
        cmd: DlqCmd,
    },
    /// Pause a queue: it accepts jobs but delivers none.
    Pause(QueueArg),
    /// Resume a paused queue.
    Resume(QueueArg),
    /// Delete a queue's waiting jobs and its completed jobs kept for
    /// retention (leased jobs are left alone).
    Purge(PurgeArgs),
    /// Change a queue's settings.
    Queue {
        #[command(subcommand)]
        cmd: QueueCmd,
    },
    /// Cron schedules: a job from a template at every tick.
    Schedules {
        #[command(subcommand)]
        cmd: super::schedules::ScheduleCmd,
    },
}

#[derive(Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Only these queues (default: all).
    pub queues: Vec<String>,
    /// Keep printing: at once, whenever counts change, and every --interval.
    #[arg(long, short)]
    pub watch: bool,
    /// With --watch: longest time between two updates (1s to 1h).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub interval: Duration,
}

#[derive(Args, Debug)]
pub struct QueuesArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum StateArg {
    Available,
    Scheduled,
    Leased,
    Dead,
    Completed,
}

#[derive(Args, Debug)]
pub struct JobsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Only this queue.
    #[arg(long, short)]
    pub queue: Option<String>,
    /// Only jobs in this state (default: every live job).
    #[arg(long, value_enum)]
    pub state: Option<StateArg>,
    /// Only jobs of this key (`enqueue --key`), an exact match.
    #[arg(long, short)]
    pub key: Option<String>,
    /// Most jobs to print (pages are fetched until then).
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Include payloads.
    #[arg(long)]
    pub payload: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Default)]
pub enum KeyOrderArg {
    /// By key, every page.
    #[default]
    Key,
    /// Most jobs waiting first: the top --limit keys.
    Waiting,
}

#[derive(Args, Debug)]
pub struct KeysArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The queue.
    pub queue: String,
    /// Order of the keys.
    #[arg(long, value_enum, default_value_t)]
    pub order: KeyOrderArg,
    /// Most keys to print (pages are fetched until then).
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
}

#[derive(Subcommand, Debug)]
pub enum JobCmd {
    /// Show a live, dead or completed job, with its payload.
    Get(JobIdArg),
    /// Delete a live job (its holder's Ack then fails). Asks on a
    /// terminal; elsewhere needs --yes.
    Cancel(JobCancelArgs),
}

#[derive(Args, Debug)]
pub struct JobIdArg {
    #[command(flatten)]
    pub client: ClientArgs,
    pub job_id: String,
}

#[derive(Args, Debug)]
pub struct JobCancelArgs {
    #[command(flatten)]
    pub job: JobIdArg,
    /// Confirm: cancelling deletes the job.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

#[derive(Subcommand, Debug)]
pub enum DlqCmd {
    /// List dead letters.
    List(DlqListArgs),
    /// Move dead letters back to their queue (attempt 0).
    Requeue(DlqSelectArgs),
    /// Delete dead letters for good. Asks on a terminal; elsewhere needs
    /// --yes.
    Purge(DlqPurgeArgs),
}

#[derive(Args, Debug)]
pub struct DlqPurgeArgs {
    #[command(flatten)]
    pub select: DlqSelectArgs,
    /// Confirm: purging deletes the dead letters.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

#[derive(Args, Debug)]
pub struct DlqListArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[arg(long, short)]
    pub queue: Option<String>,
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    #[arg(long)]
    pub payload: bool,
}

#[derive(Args, Debug)]
pub struct DlqSelectArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The queue (required with --all).
    #[arg(long, short)]
    pub queue: Option<String>,
    /// Every dead letter of --queue.
    #[arg(long, requires = "queue", conflicts_with = "ids")]
    pub all: bool,
    /// Dead letter ids.
    #[arg(required_unless_present = "all")]
    pub ids: Vec<String>,
}

#[derive(Args, Debug)]
pub struct QueueArg {
    #[command(flatten)]
    pub client: ClientArgs,
    pub queue: String,
}

#[derive(Args, Debug)]
pub struct PurgeArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    pub queue: String,
    /// Confirm: purging deletes jobs. Without it, asks on a terminal.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

#[derive(Subcommand, Debug)]
pub enum QueueCmd {
    /// Change settings; only the flags given change.
    Update(QueueUpdateArgs),
}

#[derive(Args, Debug)]
pub struct QueueUpdateArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    pub queue: String,
    /// Default lease (1s to 12h).
    #[arg(long, value_parser = parse_duration)]
    pub default_lease: Option<Duration>,
    /// Deliveries before dead-lettering (1 to 1000).
    #[arg(long)]
    pub max_attempts: Option<i32>,
    #[arg(long, value_parser = parse_duration)]
    pub backoff_base: Option<Duration>,
    #[arg(long, value_parser = parse_duration)]
    pub backoff_cap: Option<Duration>,
    /// Keep acked jobs this long (`jobs --state completed`, `job get`); 0
    /// clears it: acked jobs are then deleted at once.
    #[arg(long, value_parser = parse_duration)]
    pub retention: Option<Duration>,
    /// Most jobs leased at once, across replicas (0 removes the limit).
    #[arg(long)]
    pub concurrency_limit: Option<i32>,
    /// Jobs started per second, across replicas (0 removes the limit).
    #[arg(long)]
    pub rate_limit: Option<f64>,
    /// Jobs that may start at once after a quiet spell (0 = the default,
    /// max(1, ceil(rate))).
    #[arg(long)]
    pub rate_burst: Option<i32>,
    /// Deliver the jobs of one key (`enqueue --key`) in enqueue order
    /// (`true`), or in the queue's plain order (`false`).
    #[arg(long)]
    pub ordered_by_key: Option<bool>,
    /// Most jobs of one key leased at once, across replicas (with
    /// --ordered-by-key the first N of the key, default 1; without, any N;
    /// 0 removes it).
    #[arg(long)]
    pub key_concurrency: Option<i32>,
    /// Serve the queue's keys in turn (`true`) so one key's backlog does not
    /// delay the others, or in delivery order (`false`).
    #[arg(long)]
    pub fair_by_key: Option<bool>,
    /// Jobs of one key started per second, across replicas (0 removes it).
    #[arg(long)]
    pub key_rate_limit: Option<f64>,
    /// Jobs of one key that may start at once after a quiet spell (0 = the
    /// default, max(1, ceil(key rate))).
    #[arg(long)]
    pub key_rate_burst: Option<i32>,
    /// Settings of a named key, `KEY:concurrency=N,rate=R,weight=W` (any of
    /// the three; repeat for more keys). Replaces the queue's whole list.
    #[arg(long = "key-override", value_parser = parse_key_override)]
    pub key_overrides: Vec<pb::KeyOverride>,
    /// Remove every key override.
    #[arg(long, conflicts_with = "key_overrides")]
    pub clear_key_overrides: bool,
    /// Create the queue if it does not exist.
    #[arg(long)]
    pub create: bool,
    /// Confirm `--retention 0`, which deletes the queue's kept completed
    /// jobs. Without it, asks on a terminal.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

async fn connect(c: &ClientArgs) -> Result<Admin, CliError> {
    Ok(AdminServiceClient::new(c.connect.connect().await?)
        .max_decoding_message_size(256 * 1024 * 1024))
}

/// Runs an operator command.
pub async fn run(cmd: AdminCommand) -> Result<(), CliError> {
    match cmd {
        AdminCommand::Stats(a) => stats(a).await,
        AdminCommand::Queues(a) => queues(a).await,
        AdminCommand::Jobs(a) => jobs(a).await,
        AdminCommand::Keys(a) => keys(a).await,
        AdminCommand::Job {
            cmd: JobCmd::Get(a),
        } => job_get(a).await,
        AdminCommand::Job {
            cmd: JobCmd::Cancel(JobCancelArgs { job: a, yes }),
        } => job_cancel(a, yes).await,
        AdminCommand::Dlq {
            cmd: DlqCmd::List(a),
        } => dlq_list(a).await,
        AdminCommand::Dlq {
            cmd: DlqCmd::Requeue(a),
        } => dlq_requeue(a).await,
        AdminCommand::Dlq {
            cmd: DlqCmd::Purge(DlqPurgeArgs { select: a, yes }),
        } => dlq_purge(a, yes).await,
        AdminCommand::Pause(a) => pause(a).await,
        AdminCommand::Resume(a) => resume(a).await,
        AdminCommand::Purge(a) => purge(a).await,
        AdminCommand::Queue {
            cmd: QueueCmd::Update(a),
        } => queue_update(a).await,
        AdminCommand::Schedules { cmd } => super::schedules::run(cmd).await,
    }
}

/// `leaseq queues`.
async fn queues(a: QueuesArgs) -> Result<(), CliError> {
    let mut admin = connect(&a.client).await?;
    let queues = all_queues(&mut admin).await?;
    match a.client.output {
        Output::Json => print_json(&Value::Array(queues.iter().map(queue_json).collect())),
        Output::Table => print_table(
            &[
                "QUEUE",
                "PAUSED",
                "LEASE",
                "MAX_ATTEMPTS",
                "BACKOFF",
                "RETENTION",
                "LIMITS",
                "CREATED",
            ],
            queues.iter().map(|q| {
                let s = q.settings.clone().unwrap_or_default();
                vec![
                    q.name.clone(),
                    yes_no(s.paused),
                    human_dur(s.default_lease.as_ref()),
                    s.max_attempts.to_string(),
                    format!(
                        "{}..{}",
                        human_dur(s.backoff_base.as_ref()),
                        human_dur(s.backoff_cap.as_ref())
                    ),
                    s.completed_retention
                        .as_ref()
                        .map_or("-".into(), |d| human_dur(Some(d))),
                    limits(&s),
                    q.created_at.as_ref().map_or("-".into(), rfc3339),
                ]
            }),
        ),
    }
    Ok(())
}

/// `leaseq jobs`.
async fn jobs(a: JobsArgs) -> Result<(), CliError> {
    let state = a.state.map(|s| match s {
        StateArg::Available => pb::JobState::Available,
        StateArg::Scheduled => pb::JobState::Scheduled,
        StateArg::Leased => pb::JobState::Leased,
        StateArg::Dead => pb::JobState::Dead,
        StateArg::Completed => pb::JobState::Completed,
    });
    let mut admin = connect(&a.client).await?;
    let jobs = list_jobs(
        &mut admin,
        a.queue.unwrap_or_default(),
        state.unwrap_or(pb::JobState::Unspecified),
        a.key.unwrap_or_default(),
        a.limit,
        a.payload,
    )
    .await?;
    print_jobs(&jobs, a.client.output, a.payload);
    Ok(())
}

/// `leaseq keys`.
async fn keys(a: KeysArgs) -> Result<(), CliError> {
    let order = match a.order {
        KeyOrderArg::Key => pb::KeyOrder::Key,
        KeyOrderArg::Waiting => pb::KeyOrder::Waiting,
    };
    let mut admin = connect(&a.client).await?;
    let mut keys = Vec::new();
    let mut token = String::new();
    while keys.len() < a.limit {
        let page = admin
            .list_keys(pb::ListKeysRequest {
                queue: a.queue.clone(),
                page_size: (a.limit - keys.len()).min(1000) as u32,
                page_token: token,
                order: order as i32,
            })
            .await?
            .into_inner();
        warn_partial(&page.unavailable_clusters);
        keys.extend(page.keys);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    match a.client.output {
        Output::Json => print_json(&Value::Array(
            keys.iter()
                .map(|k| {
                    json!({
                        "key": k.key,
                        "waiting": k.waiting,
                        "leased": k.leased,
                        "oldest_available_age_seconds": opt_secs(k.oldest_available_age.as_ref()),
                    })
                })
                .collect(),
        )),
        Output::Table => print_table(
            &["KEY", "WAITING", "LEASED", "OLDEST"],
            keys.iter().map(|k| {
                vec![
                    k.key.clone(),
                    k.waiting.to_string(),
                    k.leased.to_string(),
                    human_dur(k.oldest_available_age.as_ref()),
                ]
            }),
        ),
    }
    Ok(())
}

/// `leaseq job get`.
async fn job_get(a: JobIdArg) -> Result<(), CliError> {
    let mut admin = connect(&a.client).await?;
    let job = admin
        .get_job(pb::GetJobRequest { job_id: a.job_id })
        .await?
        .into_inner();
    match a.client.output {
        Output::Json => print_json(&job_json(&job, true)),
        Output::Table => {
            let v = job_json(&job, true);
            if let Value::Object(m) = v {
                for (k, v) in m {
                    let v = match v {
                        Value::String(s) => s,
                        Value::Null => "-".into(),
                        other => other.to_string(),
                    };
                    println!("{k:<17} {v}");
                }
            }
        }
    }
    Ok(())
}

/// `leaseq job cancel`.
async fn job_cancel(a: JobIdArg, yes: bool) -> Result<(), CliError> {
    confirm(&format!("cancel deletes job {}", a.job_id), yes)?;
    let mut admin = connect(&a.client).await?;
    let r = admin
        .cancel_job(pb::CancelJobRequest {
            job_id: a.job_id.clone(),
        })
        .await?
        .into_inner();
    match a.client.output {
        Output::Json => print_json(&json!({"job_id": a.job_id, "was_leased": r.was_leased})),
        Output::Table => println!(
            "cancelled {}{}",
            a.job_id,
            if r.was_leased { " (was leased)" } else { "" }
        ),
    }
    Ok(())
}

/// `leaseq dlq list`.
async fn dlq_list(a: DlqListArgs) -> Result<(), CliError> {
    let mut admin = connect(&a.client).await?;
    let jobs = list_jobs(
        &mut admin,
        a.queue.unwrap_or_default(),
        pb::JobState::Dead,
        String::new(),
        a.limit,
        a.payload,
    )
    .await?;
    print_jobs(&jobs, a.client.output, a.payload);
    Ok(())
}

/// `leaseq dlq requeue`.
async fn dlq_requeue(a: DlqSelectArgs) -> Result<(), CliError> {
    let mut admin = connect(&a.client).await?;
    let r = if a.all && std::io::stderr().is_terminal() {
        let (requeued, skipped) = dlq_by_pages(&mut admin, &a, Dlq::Requeue).await?;
        pb::RequeueDeadLettersResponse {
            requeued,
            skipped_duplicates: skipped,
        }
    } else {
        admin.requeue_dead_letters(selector(&a)).await?.into_inner()
    };
    match a.client.output {
        Output::Json => print_json(&json!({
            "requeued": r.requeued,
            "skipped_duplicates": r.skipped_duplicates,
        })),
        Output::Table => println!(
            "requeued {} (skipped {}: a live job holds the same dedup_key)",
            r.requeued, r.skipped_duplicates
        ),
    }
    Ok(())
}

/// `leaseq dlq purge`.
async fn dlq_purge(a: DlqSelectArgs, yes: bool) -> Result<(), CliError> {
    let what = if a.all {
        format!(
            "dlq purge deletes every dead letter of {}",
            a.queue.as_deref().unwrap_or_default()
        )
    } else {
        format!("dlq purge deletes {} dead letter(s)", a.ids.len())
    };
    confirm(&what, yes)?;
    let mut admin = connect(&a.client).await?;
    let r = if a.all && std::io::stderr().is_terminal() {
        let (purged, _) = dlq_by_pages(&mut admin, &a, Dlq::Purge).await?;
        pb::PurgeDeadLettersResponse { purged }
    } else {
        admin.purge_dead_letters(selector(&a)).await?.into_inner()
    };
    match a.client.output {
        Output::Json => print_json(&json!({"purged": r.purged})),
        Output::Table => println!("purged {}", r.purged),
    }
    Ok(())
}

/// `leaseq pause`.
async fn pause(a: QueueArg) -> Result<(), CliError> {
    let mut admin = connect(&a.client).await?;
    let q = admin
        .pause_queue(pb::PauseQueueRequest { queue: a.queue })
        .await?
        .into_inner();
    print_queue_result(&q, a.client.output, "paused");
    Ok(())
}

/// `leaseq resume`.
async fn resume(a: QueueArg) -> Result<(), CliError> {
    let mut admin = connect(&a.client).await?;
    let q = admin
        .resume_queue(pb::ResumeQueueRequest { queue: a.queue })
        .await?
        .into_inner();
    print_queue_result(&q, a.client.output, "resumed");
    Ok(())
}

/// `leaseq purge`.
async fn purge(a: PurgeArgs) -> Result<(), CliError> {
    confirm(
        &format!(
            "purge deletes the waiting and completed jobs of {}",
            a.queue
        ),
        a.yes,
    )?;
    let mut admin = connect(&a.client).await?;
    let r = admin
        .purge_queue(pb::PurgeQueueRequest {
            queue: a.queue.clone(),
        })
        .await?
        .into_inner();
    match a.client.output {
        Output::Json => print_json(&json!({
            "queue": a.queue,
            "purged": r.purged,
            "purged_completed": r.purged_completed,
        })),
        Output::Table => println!(
            "purged {} waiting and {} completed jobs from {}",
            r.purged, r.purged_completed, a.queue
        ),
    }
    Ok(())
}

/// `leaseq queue update`.
async fn queue_update(a: QueueUpdateArgs) -> Result<(), CliError> {
    if a.retention == Some(Duration::ZERO) {
        confirm(
            &format!("--retention 0 deletes the completed jobs {} keeps", a.queue),
            a.yes,
        )?;
    }
    let d = |d: Option<Duration>| d.and_then(|d| d.try_into().ok());
    let mut admin = connect(&a.client).await?;
    let q = admin
        .update_queue(pb::UpdateQueueRequest {
            queue: a.queue,
            default_lease: d(a.default_lease),
            max_attempts: a.max_attempts,
            backoff_base: d(a.backoff_base),
            backoff_cap: d(a.backoff_cap),
            completed_retention: d(a.retention),
            paused: None,
            create: a.create,
            concurrency_limit: a.concurrency_limit,
            rate_limit: a.rate_limit,
            rate_burst: a.rate_burst,
            ordered_by_key: a.ordered_by_key,
            key_concurrency: a.key_concurrency,
            fair_by_key: a.fair_by_key,
            key_rate_limit: a.key_rate_limit,
            key_rate_burst: a.key_rate_burst,
            key_overrides: (a.clear_key_overrides || !a.key_overrides.is_empty()).then_some(
                pb::KeyOverrides {
                    overrides: a.key_overrides,
                },
            ),
        })
        .await?
        .into_inner();
    print_queue_result(&q, a.client.output, "updated");
    Ok(())
}

#[derive(Clone, Copy)]
enum Dlq {
    Requeue,
    Purge,
}

/// `dlq requeue|purge --all` on a terminal: a page of dead letters at a
/// time (their ids, at most the broker's 1,000 per call) under a progress
/// bar whose total is the queue's dead count when it began. Keyset pages
/// (`next_page_token`) step past dead letters a requeue skipped (a live job
/// holds their dedup key), so each is visited once; dead letters that
/// arrive meanwhile are included when their ids sort after the page under
/// way. Returns (requeued or purged, skipped).
async fn dlq_by_pages(
    admin: &mut Admin,
    a: &DlqSelectArgs,
    op: Dlq,
) -> Result<(i64, i64), CliError> {
    let queue = a.queue.clone().unwrap_or_default();
    let total = admin
        .get_queue(pb::GetQueueRequest {
            queue: queue.clone(),
        })
        .await?
        .into_inner()
        .stats
        .map_or(0, |s| s.dead);
    let verb = match op {
        Dlq::Requeue => "requeueing",
        Dlq::Purge => "purging",
    };
    let bar = progress(
        total.max(0) as u64,
        &format!("{verb} the dead letters of {queue}"),
    );
    let (mut done, mut skipped) = (0i64, 0i64);
    let mut token = String::new();
    loop {
        let page = admin
            .list_jobs(pb::ListJobsRequest {
                queue: queue.clone(),
                state: pb::JobState::Dead as i32,
                page_size: 1000,
                page_token: token,
                include_payload: false,
                key: String::new(),
            })
            .await?
            .into_inner();
        if page.jobs.is_empty() {
            break;
        }
        let n = page.jobs.len() as u64;
        if bar.length().is_some_and(|len| bar.position() + n > len) {
            bar.set_length(bar.position() + n);
        }
        let ids: Vec<String> = page.jobs.into_iter().map(|j| j.id).collect();
        let sel = pb::DeadLettersSelector {
            queue: queue.clone(),
            ids,
            all: false,
        };
        match op {
            Dlq::Requeue => {
                let r = admin.requeue_dead_letters(sel).await?.into_inner();
                done += r.requeued;
                skipped += r.skipped_duplicates;
            }
            Dlq::Purge => done += admin.purge_dead_letters(sel).await?.into_inner().purged,
        }
        bar.inc(n);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    bar.finish_and_clear();
    Ok((done, skipped))
}

fn selector(a: &DlqSelectArgs) -> pb::DeadLettersSelector {
    pb::DeadLettersSelector {
        queue: a.queue.clone().unwrap_or_default(),
        ids: a.ids.clone(),
        all: a.all,
    }
}

/// A broker over several PostgreSQL clusters answered without some: say
/// so on stderr, so a partial listing does not pass for a complete one.
fn warn_partial(missing: &[String]) {
    if !missing.is_empty() {
        eprintln!(
            "warning: PostgreSQL cluster {} did not answer: its queues and jobs are missing below",
            missing.join(", ")
        );
    }
}

async fn all_queues(admin: &mut Admin) -> Result<Vec<pb::QueueInfo>, CliError> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = admin
            .list_queues(pb::ListQueuesRequest {
                page_size: 1000,
                page_token: token,
            })
            .await?
            .into_inner();
        warn_partial(&page.unavailable_clusters);
        out.extend(page.queues);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}

async fn list_jobs(
    admin: &mut Admin,
    queue: String,
    state: pb::JobState,
    key: String,
    limit: usize,
    include_payload: bool,
) -> Result<Vec<pb::JobInfo>, CliError> {
    let mut out = Vec::new();
    let mut token = String::new();
    while out.len() < limit {
        let page = admin
            .list_jobs(pb::ListJobsRequest {
                queue: queue.clone(),
                state: state as i32,
                page_size: (limit - out.len()).min(1000) as u32,
                page_token: token,
                include_payload,
                key: key.clone(),
            })
            .await?
            .into_inner();
        warn_partial(&page.unavailable_clusters);
        out.extend(page.jobs);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    Ok(out)
}

async fn stats(a: StatsArgs) -> Result<(), CliError> {
    let mut admin = connect(&a.client).await?;
    if !a.watch {
        let queues = if a.queues.is_empty() {
            all_queues(&mut admin).await?
        } else {
            let mut out = Vec::new();
            for q in &a.queues {
                out.push(
                    admin
                        .get_queue(pb::GetQueueRequest { queue: q.clone() })
                        .await?
                        .into_inner(),
                );
            }
            out
        };
        match a.client.output {
            Output::Json => print_json(&Value::Array(queues.iter().map(queue_json).collect())),
            Output::Table => print_stats(&queues),
        }
        return Ok(());
    }
    let interval: prost_types::Duration = a
        .interval
        .try_into()
        .map_err(|_| CliError::usage("--interval is out of range"))?;
    let mut stream = admin
        .watch_queues(pb::WatchQueuesRequest {
            queues: a.queues,
            interval: Some(interval),
        })
        .await?
        .into_inner();
    while let Some(msg) = stream.message().await? {
        let at = msg.sent_at.as_ref().map_or("-".into(), rfc3339);
        match a.client.output {
            Output::Json => println!(
                "{}",
                json!({"sent_at": at, "queues": msg.queues.iter().map(queue_json).collect::<Vec<_>>()})
            ),
            Output::Table => {
                println!("-- {at}");
                print_stats(&msg.queues);
            }
        }
    }
    Ok(())
}

fn print_stats(queues: &[pb::QueueInfo]) {
    print_table(
        &[
            "QUEUE",
            "AVAILABLE",
            "SCHEDULED",
            "LEASED",
            "DEAD",
            "OLDEST",
            "STREAMS",
            "CONSUMERS",
            "KEYS_WAITING",
            "KEYS_LEASED",
            "PAUSED",
        ],
        queues.iter().map(|q| {
            let s = q.stats.unwrap_or_default();
            vec![
                q.name.clone(),
                s.available.to_string(),
                s.scheduled.to_string(),
                s.leased.to_string(),
                s.dead.to_string(),
                s.oldest_available_age
                    .as_ref()
                    .map_or("-".into(), |d| human_dur(Some(d))),
                s.streams.to_string(),
                s.consumers.to_string(),
                keys_waiting(&s),
                s.keys_leased.to_string(),
                yes_no(q.settings.as_ref().is_some_and(|s| s.paused)),
            ]
        }),
    );
}

fn print_queue_result(q: &pb::QueueInfo, output: Output, what: &str) {
    match output {
        Output::Json => print_json(&queue_json(q)),
        Output::Table => println!("{what} {}", q.name),
    }
}

fn print_jobs(jobs: &[pb::JobInfo], output: Output, payload: bool) {
    match output {
        Output::Json => print_json(&Value::Array(
            jobs.iter().map(|j| job_json(j, payload)).collect(),
        )),
        Output::Table => {
            let mut head = vec![
                "ID", "QUEUE", "KEY", "STATE", "PRIO", "ATTEMPT", "ENQUEUED", "ERROR",
            ];
            if payload {
                head.push("PAYLOAD");
            }
            print_table(
                &head,
                jobs.iter().map(|j| {
                    let mut row = vec![
                        j.id.clone(),
                        j.queue.clone(),
                        if j.key.is_empty() {
                            "-".into()
                        } else {
                            truncate(&j.key, 24)
                        },
                        state_name(j.state()).into(),
                        j.priority.to_string(),
                        j.attempt.to_string(),
                        j.enqueued_at.as_ref().map_or("-".into(), rfc3339),
                        truncate(&j.last_error, 40),
                    ];
                    if payload {
                        row.push(truncate(&String::from_utf8_lossy(&j.payload), 60));
                    }
                    row
                }),
            );
        }
    }
}

/// "12", or ">=10000" when the broker stopped counting there.
fn keys_waiting(s: &pb::QueueStats) -> String {
    if s.keys_waiting_capped {
        format!(">={}", s.keys_waiting)
    } else {
        s.keys_waiting.to_string()
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}

fn state_name(s: pb::JobState) -> &'static str {
    match s {
        pb::JobState::Unspecified => "unknown",
        pb::JobState::Available => "available",
        pb::JobState::Scheduled => "scheduled",
        pb::JobState::Leased => "leased",
        pb::JobState::Dead => "dead",
        pb::JobState::Completed => "completed",
    }
}

fn secs_f64(d: &prost_types::Duration) -> f64 {
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

fn human_dur(d: Option<&prost_types::Duration>) -> String {
    let Some(d) = d else { return "-".into() };
    let s = secs_f64(d);
    if s < 1.0 {
        format!("{}ms", (s * 1000.0).round())
    } else if s < 120.0 {
        format!("{}s", (s * 10.0).round() / 10.0)
    } else if s < 7200.0 {
        format!("{}m", (s / 6.0).round() / 10.0)
    } else {
        format!("{}h", (s / 360.0).round() / 10.0)
    }
}

fn opt_secs(d: Option<&prost_types::Duration>) -> Value {
    d.map_or(Value::Null, |d| json!(secs_f64(d)))
}

/// `--key-override KEY:concurrency=N,rate=R,weight=W`: the key is
/// everything before the last `:` (keys may hold colons).
fn parse_key_override(s: &str) -> Result<pb::KeyOverride, String> {
    let (key, settings) = s
        .rsplit_once(':')
        .ok_or("expected KEY:concurrency=N,rate=R,weight=W")?;
    let mut o = pb::KeyOverride {
        key: key.to_owned(),
        ..Default::default()
    };
    for part in settings.split(',') {
        let (name, value) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected name=value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{name}: {e}");
        match name.trim() {
            "concurrency" => o.concurrency = value.trim().parse().map_err(|e| bad(&e))?,
            "rate" => o.rate_limit = value.trim().parse().map_err(|e| bad(&e))?,
            "weight" => o.weight = value.trim().parse().map_err(|e| bad(&e))?,
            other => return Err(format!("{other:?}: expected concurrency, rate or weight")),
        }
    }
    Ok(o)
}

/// "5 leased, 10/s burst 10", or "-" without limits.
fn limits(s: &pb::QueueSettings) -> String {
    let mut parts = Vec::new();
    if s.concurrency_limit > 0 {
        parts.push(format!("{} leased", s.concurrency_limit));
    }
    if s.rate_limit > 0.0 {
        parts.push(format!("{}/s burst {}", s.rate_limit, s.rate_burst));
    }
    if s.ordered_by_key {
        parts.push(format!("ordered by key, {} a key", s.key_concurrency));
    } else if s.key_concurrency > 0 {
        parts.push(format!("{} leased a key", s.key_concurrency));
    }
    if s.key_rate_limit > 0.0 {
        parts.push(format!(
            "{}/s a key burst {}",
            s.key_rate_limit, s.key_rate_burst
        ));
    }
    if s.fair_by_key {
        parts.push("fair by key".into());
    }
    if !s.key_overrides.is_empty() {
        parts.push(format!("{} key overrides", s.key_overrides.len()));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

fn queue_json(q: &pb::QueueInfo) -> Value {
    let s = q.settings.clone().unwrap_or_default();
    let st = q.stats.unwrap_or_default();
    json!({
        "name": q.name,
        "paused": s.paused,
        "available": st.available,
        "scheduled": st.scheduled,
        "leased": st.leased,
        "dead": st.dead,
        "oldest_available_age_seconds": opt_secs(st.oldest_available_age.as_ref()),
        "streams": st.streams,
        "consumers": st.consumers,
        "keys_waiting": st.keys_waiting,
        "keys_waiting_capped": st.keys_waiting_capped,
        "keys_leased": st.keys_leased,
        "default_lease_seconds": opt_secs(s.default_lease.as_ref()),
        "max_attempts": s.max_attempts,
        "backoff_base_seconds": opt_secs(s.backoff_base.as_ref()),
        "backoff_cap_seconds": opt_secs(s.backoff_cap.as_ref()),
        "completed_retention_seconds": opt_secs(s.completed_retention.as_ref()),
        "concurrency_limit": (s.concurrency_limit > 0).then_some(s.concurrency_limit),
        "rate_limit": (s.rate_limit > 0.0).then_some(s.rate_limit),
        "rate_burst": (s.rate_burst > 0).then_some(s.rate_burst),
        "ordered_by_key": s.ordered_by_key,
        "key_concurrency": (s.key_concurrency > 0).then_some(s.key_concurrency),
        "fair_by_key": s.fair_by_key,
        "key_rate_limit": (s.key_rate_limit > 0.0).then_some(s.key_rate_limit),
        "key_rate_burst": (s.key_rate_burst > 0).then_some(s.key_rate_burst),
        "key_overrides": s.key_overrides.iter().map(|o| json!({
            "key": o.key,
            "concurrency": (o.concurrency > 0).then_some(o.concurrency),
            "rate_limit": (o.rate_limit > 0.0).then_some(o.rate_limit),
            "weight": (o.weight > 0).then_some(o.weight),
        })).collect::<Vec<_>>(),
        "created_at": opt_ts(q.created_at.as_ref()),
    })
}

fn job_json(j: &pb::JobInfo, payload: bool) -> Value {
    let mut v = json!({
        "id": j.id,
        "queue": j.queue,
        "state": state_name(j.state()),
        "priority": j.priority,
        "attempt": j.attempt,
        "max_attempts": if j.max_attempts == 0 { Value::Null } else { json!(j.max_attempts) },
        "dedup_key": none_if_empty(&j.dedup_key),
        "key": none_if_empty(&j.key),
        "headers": j.headers,
        "enqueued_at": opt_ts(j.enqueued_at.as_ref()),
        "run_at": opt_ts(j.run_at.as_ref()),
        "expires_at": opt_ts(j.expires_at.as_ref()),
        "last_error": none_if_empty(&j.last_error),
        "leased_by": none_if_empty(&j.leased_by),
        "lease_expires_at": opt_ts(j.lease_expires_at.as_ref()),
        "dead_reason": none_if_empty(&j.dead_reason),
        "died_at": opt_ts(j.died_at.as_ref()),
        "completed_at": opt_ts(j.completed_at.as_ref()),
        "completed_by": none_if_empty(&j.completed_by),
    });
    if payload {
        set_payload(&mut v, &j.payload);
    }
    // A held job's latest progress report.
    if j.progress_at.is_some() {
        v["progress"] = json!(j.progress);
        v["progress_message"] = none_if_empty(&j.progress_message);
        v["progress_at"] = opt_ts(j.progress_at.as_ref());
    }
    // A completed job acked with a result (AckRequest.result).
    if !j.result.is_empty() {
        super::output::set_bytes(&mut v, "result", &j.result);
    }
    v
}
