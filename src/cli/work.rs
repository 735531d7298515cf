//! `leaseq work --queue Q [--concurrency N] -- CMD ARGS...`: any program as a
//! worker. CMD runs once per job with the payload on stdin and the job's
//! fields in its environment; exit 0 acks, anything else nacks with the tail
//! of its stderr. Built on [`leaseq_client::Worker`], which extends leases
//! while CMD runs, reconnects, and drains on SIGTERM / SIGINT.
//!
//! Environment of CMD (besides leaseq work's own, minus any inherited
//! `LEASEQ_HEADER_*` and the variables below):
//!
//! | variable | value |
//! |---|---|
//! | `LEASEQ_JOB_ID` | job id (UUID) |
//! | `LEASEQ_QUEUE` | queue name |
//! | `LEASEQ_ATTEMPT` | 1 on first delivery |
//! | `LEASEQ_PRIORITY` | priority |
//! | `LEASEQ_ENQUEUED_AT` | RFC 3339, UTC, microseconds |
//! | `LEASEQ_LAST_ERROR` | error of the previous attempt (set only on a retry) |
//! | `LEASEQ_HEADERS` | all headers as one JSON object |
//! | `LEASEQ_HEADER_<NAME>` | one per header; NAME upper-cased, every character outside `[A-Z0-9]` becomes `_` (`content-type` → `LEASEQ_HEADER_CONTENT_TYPE`) |

use std::collections::HashMap;
use std::ffi::OsString;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::info;

use super::{CliError, ConnectArgs, stop_signal};
use leaseq_client::{Delivery, Worker};

/// Job-field variables set for CMD; inherited ones are removed first so a
/// stale value never leaks into a job that lacks the field.
const JOB_VARS: &[&str] = &[
    "LEASEQ_JOB_ID",
    "LEASEQ_QUEUE",
    "LEASEQ_ATTEMPT",
    "LEASEQ_PRIORITY",
    "LEASEQ_ENQUEUED_AT",
    "LEASEQ_LAST_ERROR",
    "LEASEQ_HEADERS",
];
const HEADER_PREFIX: &str = "LEASEQ_HEADER_";
/// How long after CMD exits its stderr may still be read (output buffered in
/// the pipe, or a child of CMD still writing).
const STDERR_LINGER: Duration = Duration::from_secs(1);

/// Shown by `leaseq work --help`: what CMD gets and what its exit means.
const AFTER_HELP: &str = "\
CMD runs once per job with the payload on stdin and, in its environment:
  LEASEQ_JOB_ID, LEASEQ_QUEUE, LEASEQ_ATTEMPT (1 on first delivery),
  LEASEQ_PRIORITY, LEASEQ_ENQUEUED_AT (RFC 3339, UTC),
  LEASEQ_LAST_ERROR (only on a retry), LEASEQ_HEADERS (all headers, JSON),
  LEASEQ_HEADER_<NAME> per header (upper-cased, other characters as _:
  content-type -> LEASEQ_HEADER_CONTENT_TYPE).
Exit 0 acks the job; any other exit nacks it with the tail of CMD's stderr.
The lease is extended while CMD runs. SIGTERM / SIGINT: no new command starts,
running ones get --grace to finish, then leaseq work exits.";

#[derive(Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct WorkArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Queue(s) to consume (repeatable, or comma-separated).
    #[arg(
        long,
        short,
        env = "LEASEQ_WORK_QUEUE",
        required = true,
        value_delimiter = ','
    )]
    pub queue: Vec<String>,
    /// Commands running at once (also the stream's credit).
    #[arg(long, short, env = "LEASEQ_WORK_CONCURRENCY", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,
    /// Lease per job, extended every half lease while CMD runs (1s to 12h).
    #[arg(long, env = "LEASEQ_WORK_LEASE", default_value = "30s", value_parser = crate::duration::parse_duration)]
    pub lease: Duration,
    /// On SIGTERM / SIGINT, how long running commands may take to finish
    /// before they are killed and their jobs released.
    #[arg(long, env = "LEASEQ_WORK_GRACE", default_value = "30s", value_parser = crate::duration::parse_duration)]
    pub grace: Duration,
    /// Consumer name shown in admin views (default: <hostname>-<pid>).
    #[arg(long, env = "LEASEQ_WORK_CONSUMER")]
    pub consumer: Option<String>,
    /// Bytes of CMD's stderr kept as the Nack error when it fails.
    #[arg(long, env = "LEASEQ_WORK_STDERR_TAIL", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub stderr_tail: u32,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Runs until SIGTERM / SIGINT (exit 0 once drained), or until the broker
/// refuses the stream for good (a status retrying cannot fix, e.g. a token
/// without `consume` on the queue).
pub async fn run(args: WorkArgs) -> Result<(), CliError> {
    // The worker waits for a broker that is down, but would wait for ever on
    // TLS that cannot work: find that out now.
    args.connect.preflight().await?;
    let client = args.connect.lazy_client()?;
    let scrub: Vec<OsString> = std::env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| {
            k.to_str()
                .is_some_and(|k| k.starts_with(HEADER_PREFIX) || JOB_VARS.contains(&k))
        })
        .collect();
    let cmd = Arc::new(Command {
        argv: args.command,
        scrub,
        stderr_tail: args.stderr_tail as usize,
    });
    let mut worker = Worker::new(client, args.queue.clone())
        .concurrency(args.concurrency)
        .lease(args.lease)
        .grace(args.grace)
        // An operator running a command per job wants to see a job whose
        // lease ran out under it (the command was too slow for --lease).
        .lost_lease_log_level(tracing::Level::WARN);
    if let Some(name) = args.consumer {
        worker = worker.consumer(name);
    }
    info!(queues = ?args.queue, concurrency = args.concurrency, "leaseq work started");
    worker
        .run(move |job| cmd.clone().run(job), stop_signal())
        .await?;
    info!("leaseq work stopped");
    Ok(())
}

struct Command {
    argv: Vec<OsString>,
    /// Inherited variables to remove from CMD's environment.
    scrub: Vec<OsString>,
    stderr_tail: usize,
}

impl Command {
    /// Runs CMD for one job. `Err` is the Nack error text.
    async fn run(self: Arc<Self>, job: Delivery) -> Result<(), String> {
        let mut c = tokio::process::Command::new(&self.argv[0]);
        c.args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped())
            // The worker's task is aborted when the grace runs out: the
            // command goes with it.
            .kill_on_drop(true);
        for k in &self.scrub {
            c.env_remove(k);
        }
        for (k, v) in job_env(&job) {
            c.env(k, v);
        }
        let mut child = c
            .spawn()
            .map_err(|e| format!("cannot run {:?}: {e}", self.argv[0]))?;
        let stdin = child.stdin.take();
        let payload = job.payload;
        let feed = async move {
            if let Some(mut stdin) = stdin {
                // A command that does not read its stdin closes the pipe:
                // that is its business, not an error.
                let _ = stdin.write_all(&payload).await;
                // Dropping stdin closes it: CMD sees end of input.
            }
        };
        let stderr = child.stderr.take();
        let keep = self.stderr_tail;
        // The last `keep` bytes (up to twice that between trims) of stderr,
        // shared so they can be read even if the pipe never closes.
        let tail = Arc::new(Mutex::new(Vec::<u8>::new()));
        let collect = {
            let tail = tail.clone();
            async move {
                let Some(mut stderr) = stderr else { return };
                let mut out = tokio::io::stderr();
                let mut buf = [0u8; 8192];
                loop {
                    match stderr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            // Passed through, so CMD's logs are not lost.
                            let _ = out.write_all(&buf[..n]).await;
                            let mut t = tail.lock().expect("poisoned");
                            t.extend_from_slice(&buf[..n]);
                            if t.len() > 2 * keep {
                                let cut = t.len() - keep;
                                t.drain(..cut);
                            }
                        }
                    }
                }
            }
        };
        // Tasks of their own, so CMD's exit decides when the job is done: a
        // background process CMD left behind may hold its stdin or stderr
        // open indefinitely (its stderr is still passed through meanwhile).
        let feed = tokio::spawn(feed);
        let mut collect = tokio::spawn(collect);
        let status = child.wait().await;
        feed.abort();
        let _ = tokio::time::timeout(STDERR_LINGER, &mut collect).await;
        let tail = {
            let t = tail.lock().expect("poisoned");
            t[t.len().saturating_sub(keep)..].to_vec()
        };
        let status = status.map_err(|e| format!("waiting for {:?}: {e}", self.argv[0]))?;
        if status.success() {
            return Ok(());
        }
        let tail = String::from_utf8_lossy(&tail);
        let tail = tail.trim();
        Err(if tail.is_empty() {
            describe(status)
        } else {
            format!("{}: {tail}", describe(status))
        })
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => format!("{status}"),
    }
}

/// The job's fields as CMD's environment (see the module docs).
fn job_env(job: &Delivery) -> Vec<(String, String)> {
    let mut env = vec![
        ("LEASEQ_JOB_ID".to_owned(), job.id.clone()),
        ("LEASEQ_QUEUE".to_owned(), job.queue.clone()),
        ("LEASEQ_ATTEMPT".to_owned(), job.attempt.to_string()),
        ("LEASEQ_PRIORITY".to_owned(), job.priority.to_string()),
    ];
    if let Some(at) = job.enqueued_at {
        env.push((
            "LEASEQ_ENQUEUED_AT".to_owned(),
            at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        ));
    }
    if let Some(e) = &job.last_error {
        env.push(("LEASEQ_LAST_ERROR".to_owned(), e.clone()));
    }
    env.push((
        "LEASEQ_HEADERS".to_owned(),
        serde_json::to_string(&job.headers).unwrap_or_else(|_| "{}".to_owned()),
    ));
    // Sorted, so when two names map to one variable the result is stable
    // (the last in byte order wins).
    let mut headers: Vec<(&String, &String)> = job.headers.iter().collect();
    headers.sort();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (k, v) in headers {
        let name = header_var(k);
        match seen.get(&name) {
            Some(&i) => env[i].1 = v.clone(),
            None => {
                seen.insert(name.clone(), env.len());
                env.push((name, v.clone()));
            }
        }
    }
    env
}

/// `content-type` → `LEASEQ_HEADER_CONTENT_TYPE`.
pub fn header_var(name: &str) -> String {
    let mut s = String::with_capacity(HEADER_PREFIX.len() + name.len());
    s.push_str(HEADER_PREFIX);
    s.extend(name.chars().map(|c| {
        let c = c.to_ascii_uppercase();
        if c.is_ascii_alphanumeric() { c } else { '_' }
    }));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names() {
        assert_eq!(header_var("content-type"), "LEASEQ_HEADER_CONTENT_TYPE");
        assert_eq!(header_var("x.trace id"), "LEASEQ_HEADER_X_TRACE_ID");
        assert_eq!(header_var("é"), "LEASEQ_HEADER__");
    }
}
