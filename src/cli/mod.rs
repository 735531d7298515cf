//! Client-side subcommands: `leaseq enqueue` and `leaseq tail` here, one
//! file per further command: [`work`], and the operator commands in
//! [`admin`]. They share one way to reach the broker ([`ConnectArgs`]:
//! `--addr`, `--tls-ca`, `--tls-cert`, `--tls-key`, `--token`, each with an
//! environment twin), one output switch ([`Output`], `-o table|json`) and
//! one table of exit codes ([`exit`]).

pub mod admin;
mod connect;
pub mod exit;
mod hash_token;
pub mod health;
pub mod interactive;
pub mod migrate;
mod output;
pub mod schedules;
pub mod work;

use std::io::Read;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::json;
use tokio::sync::mpsc;
use tonic::Code;

use crate::duration::parse_duration;
use crate::pb;
use crate::pb::queue_service_client::QueueServiceClient;
use leaseq_client::Job;

pub use connect::{ClientChannel, ClientSecurity, ConnectArgs, DEFAULT_ADDR, connect};
pub use exit::{CliError, Exit, report};
pub use hash_token::{HashTokenArgs, run as hash_token};
pub use output::{Output, print_json};

/// Largest message accepted from the broker (its default
/// `--max-message-bytes`), so a delivery of any accepted payload fits.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

#[derive(Args, Debug)]
pub struct EnqueueArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Queue name.
    #[arg(long, short)]
    pub queue: String,
    /// Payload; read from stdin when absent.
    #[arg(long, short)]
    pub payload: Option<String>,
    /// Priority (higher first).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Deliver no earlier than this long from now (90s, 1h30m, 2d, or bare
    /// seconds).
    #[arg(long, value_parser = parse_duration, conflicts_with = "run_at")]
    pub delay: Option<Duration>,
    /// Deliver no earlier than this instant (RFC 3339, e.g.
    /// 2030-01-31T09:00:00Z or 2030-01-31T10:00:00+01:00).
    #[arg(long, value_parser = parse_rfc3339)]
    pub run_at: Option<DateTime<Utc>>,
    /// Dead-letter the job (reason `expired`) if it is not completed within
    /// this long of its enqueue.
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// Deliveries before the job is dead-lettered (default: the queue's).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub max_attempts: Option<i32>,
    /// De-duplication key: while a job with this key is live in the queue,
    /// enqueue adds nothing and returns that job's id as a duplicate.
    #[arg(long)]
    pub dedup_key: Option<String>,
    /// Keep the dedup key held for this long after the job completes (at
    /// most 366 days): an enqueue with the key in that time is a duplicate
    /// of this job. Needs --dedup-key.
    #[arg(long, value_parser = parse_duration, requires = "dedup_key")]
    pub unique_for: Option<Duration>,
    /// Debounce: if a job with the dedup key is waiting (not leased), give
    /// it this payload, headers, priority and delay instead. Needs
    /// --dedup-key.
    #[arg(long, requires = "dedup_key")]
    pub replace: bool,
    /// The job's key inside its queue (a customer, an account): in a queue
    /// ordered by key, its jobs go out in enqueue order.
    #[arg(long)]
    pub key: Option<String>,
    /// Header as KEY=VALUE (repeatable).
    #[arg(long = "header", short = 'H', value_name = "KEY=VALUE", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// Output: the job id (`ID`, `ID (duplicate)` or `ID (replaced)`), or
    /// {"job_id", "queue", "duplicate", "replaced"}.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct TailArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Queue(s) to consume (repeatable, or comma-separated).
    #[arg(long, short, required = true, value_delimiter = ',')]
    pub queue: Vec<String>,
    /// Consumer name shown in admin views.
    #[arg(long, default_value = "leaseq-tail")]
    pub consumer: String,
    /// Leave jobs unacked: they are released (and redelivered) when tail
    /// exits. Without it each job is acked on the stream once printed.
    #[arg(long)]
    pub no_ack: bool,
    /// Exit after this many jobs.
    #[arg(long)]
    pub count: Option<u64>,
    /// Output: one line per job (`ID queue=... attempt=... priority=...
    /// payload=...`), or one JSON object per line.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct WaitArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The job's id (as `leaseq enqueue` printed it).
    pub job_id: String,
    /// Give up after this long (at most 1h; exit 4).
    #[arg(long, value_parser = parse_duration, default_value = "1h")]
    pub timeout: Duration,
    /// Also print the job's state as it changes (available, scheduled,
    /// leased) before its outcome.
    #[arg(long)]
    pub changes: bool,
    /// Output: the state, and a completed job's result (as text, or hex
    /// when it is not UTF-8), or a dead job's reason and last error; or one
    /// JSON object per message.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: Output,
}

fn parse_rfc3339(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{s:?} is not an RFC 3339 instant (e.g. 2030-01-31T09:00:00Z): {e}"))
}

pub(crate) fn parse_header(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("header {s:?} is not KEY=VALUE"))
}

pub async fn enqueue(args: EnqueueArgs) -> Result<(), CliError> {
    let payload = match args.payload {
        Some(p) => p.into_bytes(),
        None => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| CliError::error(format!("reading the payload from stdin: {e}")))?;
            buf
        }
    };
    let mut job = Job::new(args.queue.clone(), payload).priority(args.priority);
    for (k, v) in args.headers {
        job = job.header(k, v);
    }
    if let Some(d) = args.delay {
        job = job.delay(d);
    }
    if let Some(at) = args.run_at {
        job = job.run_at(SystemTime::from(at));
    }
    if let Some(ttl) = args.ttl {
        job = job.ttl(ttl);
    }
    if let Some(n) = args.max_attempts {
        job = job.max_attempts(n);
    }
    if let Some(key) = args.dedup_key {
        job = job.dedup_key(key);
    }
    if let Some(window) = args.unique_for {
        job = job.unique_for(window);
    }
    if args.replace {
        job = job.replace_waiting();
    }
    if let Some(key) = args.key {
        job = job.key(key);
    }
    let mut client = QueueServiceClient::new(args.connect.connect().await?);
    let resp = client
        .enqueue(pb::EnqueueRequest::from(job))
        .await?
        .into_inner();
    match args.output {
        Output::Json => output::print_json(&json!({
            "job_id": resp.job_id,
            "queue": args.queue,
            "duplicate": resp.duplicate,
            "replaced": resp.replaced,
        })),
        Output::Table if resp.replaced => println!("{} (replaced)", resp.job_id),
        Output::Table if resp.duplicate => println!("{} (duplicate)", resp.job_id),
        Output::Table => println!("{}", resp.job_id),
    }
    Ok(())
}

/// `leaseq wait`: the WaitJob stream, printed; the exit code says how the
/// job ended.
pub async fn wait(args: WaitArgs) -> Result<(), CliError> {
    let mut client = QueueServiceClient::new(args.connect.connect().await?);
    let mut stream = client
        .wait_job(pb::WaitJobRequest {
            job_id: args.job_id.clone(),
            timeout: Some(prost_types::Duration {
                seconds: args.timeout.as_secs() as i64,
                nanos: args.timeout.subsec_nanos() as i32,
            }),
            changes: args.changes,
        })
        .await?
        .into_inner();
    while let Some(m) = stream.message().await? {
        print_wait(&m, args.output);
        if let Some(done) = wait_outcome(&m, &args.job_id) {
            return done;
        }
    }
    Err(CliError::new(
        Exit::Error,
        "the wait ended without an outcome",
    ))
}

/// One WaitJob message, as `leaseq wait` prints it.
fn print_wait(m: &pb::WaitJobResponse, out: Output) {
    let state = m.state();
    let name = state
        .as_str_name()
        .trim_start_matches("WAIT_STATE_")
        .to_lowercase();
    match out {
        Output::Json => {
            let mut v = json!({
                "job_id": m.job_id,
                "state": name,
                "dead_reason": output::none_if_empty(&m.dead_reason),
                "last_error": output::none_if_empty(&m.last_error),
                "finished_at": output::opt_ts(m.finished_at.as_ref()),
            });
            if !m.result.is_empty() {
                output::set_bytes(&mut v, "result", &m.result);
            }
            output::print_json_line(&v);
        }
        Output::Table => match state {
            pb::WaitState::Completed if !m.result.is_empty() => {
                match std::str::from_utf8(&m.result) {
                    Ok(s) => println!("completed {s}"),
                    Err(_) => {
                        let hex: String = m.result.iter().map(|b| format!("{b:02x}")).collect();
                        println!("completed hex:{hex}");
                    }
                }
            }
            pb::WaitState::Dead => println!("dead {}: {}", m.dead_reason, m.last_error),
            _ => println!("{name}"),
        },
    }
}

/// How `leaseq wait` ends after this message: None while the job is live.
fn wait_outcome(m: &pb::WaitJobResponse, id: &str) -> Option<Result<(), CliError>> {
    let e = |exit, message: String| Some(Err(CliError::new(exit, message)));
    match m.state() {
        pb::WaitState::Completed => Some(Ok(())),
        pb::WaitState::Dead => e(Exit::Error, format!("job {id} is dead ({})", m.dead_reason)),
        pb::WaitState::Cancelled => e(Exit::Error, format!("job {id} was cancelled")),
        pb::WaitState::Unknown => e(
            Exit::NotFound,
            format!(
                "job {id} is neither live nor recorded (acked without a record, purged, or never enqueued)"
            ),
        ),
        _ => None,
    }
}

/// Most jobs `tail` holds unacked at once.
const TAIL_CREDIT: u64 = 16;
/// The broker's largest credit: `tail --no-ack --count N` holds up to N.
const MAX_CREDIT: u64 = 10_000;

/// Prints jobs as they are delivered on a Consume stream, acking each on
/// the same stream. At `--count` jobs, or on SIGINT / SIGTERM, it
/// half-closes the stream and waits for the broker to end it: by then every
/// ack it sent is settled and every job it did not ack is released.
pub async fn tail(args: TailArgs) -> Result<(), CliError> {
    let mut client = QueueServiceClient::new(args.connect.connect().await?)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let most = if args.no_ack { MAX_CREDIT } else { TAIL_CREDIT };
    let mut credit = args.count.unwrap_or(TAIL_CREDIT).clamp(1, most);
    let (tx, rx) = mpsc::channel(64);
    let first = pb::ConsumeRequest {
        subscribe: Some(pb::SubscribeRequest {
            queues: args.queue.clone(),
            consumer: args.consumer.clone(),
            max_in_flight: credit as u32,
            lease: None,
            // One delivery per response: tail prints and answers each.
            accept: Vec::new(),
        }),
        ..Default::default()
    };
    tx.send(first)
        .await
        .expect("the receiver is alive: it is sent below");
    let mut stream = match client
        .consume(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == Code::Unimplemented => {
            // A broker from before Consume.
            return tail_subscribe(client, args).await;
        }
        Err(s) => return Err(s.into()),
    };
    let mut requests = Some(tx);
    let mut stop = std::pin::pin!(stop_signal());
    let (mut seen, mut failed) = (0u64, 0usize);
    loop {
        let msg = tokio::select! {
            msg = stream.message() => msg?,
            _ = &mut stop, if requests.is_some() => {
                requests = None; // half-close
                continue;
            }
        };
        let Some(msg) = msg else { break };
        match msg.kind {
            Some(pb::consume_response::Kind::Delivery(d)) => {
                // After the last job (or a signal) deliveries already on
                // their way are left alone: the broker releases them.
                let Some(tx) = &requests else { continue };
                print_delivery(&d, args.output);
                seen += 1;
                let (req, last) = answer(d, &args, seen, &mut credit);
                if req != pb::ConsumeRequest::default() {
                    // A send fails only once the stream is over; the next
                    // message says why.
                    let _ = tx.send(req).await;
                }
                if last {
                    requests = None; // half-close
                }
            }
            Some(pb::consume_response::Kind::Settled(r)) => failed += warn_failed(&r.results),
            // Deliveries: not asked for (`accept` is empty), ignored as an
            // older tail would. A cancel: the job was printed and is gone
            // (its ack, if any, is refused and reported).
            Some(
                pb::consume_response::Kind::Deliveries(_)
                | pb::consume_response::Kind::Heartbeat(_)
                | pb::consume_response::Kind::Cancelled(_),
            )
            | None => {}
        }
    }
    if failed > 0 {
        return Err(CliError::error(format!("{failed} ack(s) failed")));
    }
    Ok(())
}

/// What `tail` sends back for the `seen`th job delivered: its ack (unless
/// `--no-ack`), and less `credit` as the last jobs wanted near; and whether
/// it was the last one wanted.
fn answer(
    d: pb::Delivery,
    args: &TailArgs,
    seen: u64,
    credit: &mut u64,
) -> (pb::ConsumeRequest, bool) {
    let mut req = pb::ConsumeRequest::default();
    if !args.no_ack {
        req.acks.push(pb::AckRequest {
            job_id: d.job.map(|j| j.id).unwrap_or_default(),
            lease_token: d.lease_token,
            enqueue: Vec::new(),
            result: Vec::new(),
        });
    }
    let remaining = args.count.map(|n| n.saturating_sub(seen));
    if let Some(r) = remaining.filter(|&r| r > 0 && r < *credit && !args.no_ack) {
        // No more credit than jobs still wanted. (Unacked jobs
        // keep theirs: with --no-ack the credit is --count.)
        *credit = r;
        req.max_in_flight = r as u32;
    }
    (req, remaining == Some(0))
}

/// Warns of each ack the broker refused; returns how many.
fn warn_failed(results: &[pb::SettleResult]) -> usize {
    let mut failed = 0;
    for r in results.iter().filter(|r| r.code != 0) {
        failed += 1;
        eprintln!(
            "warning: ack of {} failed: {:?}: {}",
            r.job_id,
            Code::from(r.code),
            r.message
        );
    }
    failed
}

/// `tail` over Subscribe and unary Acks, for a broker without Consume.
async fn tail_subscribe(
    mut client: QueueServiceClient<ClientChannel>,
    args: TailArgs,
) -> Result<(), CliError> {
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            queues: args.queue,
            consumer: args.consumer,
            max_in_flight: TAIL_CREDIT as u32,
            lease: None,
            accept: Vec::new(),
        })
        .await?
        .into_inner();
    let mut stop = std::pin::pin!(stop_signal());
    let mut seen = 0u64;
    while args.count.is_none_or(|n| seen < n) {
        let msg = tokio::select! {
            msg = stream.message() => msg?,
            _ = &mut stop => break,
        };
        let Some(msg) = msg else { break };
        let Some(pb::subscribe_response::Kind::Delivery(d)) = msg.kind else {
            continue;
        };
        print_delivery(&d, args.output);
        if !args.no_ack {
            client
                .ack(pb::AckRequest {
                    job_id: d.job.map(|j| j.id).unwrap_or_default(),
                    lease_token: d.lease_token,
                    enqueue: Vec::new(),
                    result: Vec::new(),
                })
                .await?;
        }
        seen += 1;
    }
    Ok(())
}

/// One delivered job: a line for people, or a JSON object on one line.
fn print_delivery(d: &pb::Delivery, out: Output) {
    let job = d.job.clone().unwrap_or_default();
    match out {
        Output::Table => println!(
            "{} queue={} attempt={} priority={} payload={}",
            job.id,
            job.queue,
            job.attempt,
            job.priority,
            String::from_utf8_lossy(&job.payload)
        ),
        Output::Json => {
            let mut v = json!({
                "id": job.id,
                "queue": job.queue,
                "attempt": job.attempt,
                "priority": job.priority,
                "headers": job.headers,
                "enqueued_at": output::opt_ts(job.enqueued_at.as_ref()),
                "last_error": output::none_if_empty(&job.last_error),
                "lease_expires_at": output::opt_ts(d.lease_expires_at.as_ref()),
            });
            output::set_payload(&mut v, &job.payload);
            output::print_json_line(&v);
        }
    }
}

/// Completes on the first SIGTERM or SIGINT.
pub(crate) async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the process would die on the first signal
        // anyway; run until then.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received: stopping"),
        _ = int.recv() => tracing::info!("SIGINT received: stopping"),
    }
}
