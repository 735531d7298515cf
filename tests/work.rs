//! `leaseq work -- CMD`: the real binary as a process, running `sh -c` scripts
//! against an in-process broker: payload on stdin, job fields in the
//! environment, exit 0 acks, non-zero nacks with the stderr tail, leases
//! extended while CMD runs, SIGTERM drains.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

const S20: Duration = Duration::from_secs(20);

/// `leaseq work` with `args`, running `sh -c script` (`OUT` is the scratch
/// dir), and its stderr lines (its log, and the script's stderr).
fn spawn_work(
    broker: &TestBroker,
    out: &Path,
    args: &[&str],
    script: &str,
) -> (tokio::process::Child, mpsc::UnboundedReceiver<String>) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
        .arg("work")
        .args(args)
        .args(["--", "sh", "-c", script])
        .env("LEASEQ_ADDR", broker.url())
        .env("OUT", out)
        .env("RUST_LOG", "leaseq=info")
        // Must not reach the job's command.
        .env("LEASEQ_HEADER_STALE", "inherited")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn leaseq work");
    let (tx, rx) = mpsc::unbounded_channel();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("leaseq work: {line}");
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// Waits for a stderr line containing `text`.
async fn until_line(lines: &mut mpsc::UnboundedReceiver<String>, text: &str, limit: Duration) {
    tokio::time::timeout(limit, async {
        while let Some(line) = lines.recv().await {
            if line.contains(text) {
                return;
            }
        }
        panic!("leaseq work's stderr ended before {text:?}");
    })
    .await
    .unwrap_or_else(|_| panic!("no {text:?} within {limit:?}"))
}

async fn until_file(path: &Path, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} not within {limit:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn sigterm(child: &tokio::process::Child) {
    let pid = child.id().expect("running") as i32;
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
}

async fn exit_status(
    child: &mut tokio::process::Child,
    limit: Duration,
) -> std::process::ExitStatus {
    tokio::time::timeout(limit, child.wait())
        .await
        .expect("leaseq work exits in time")
        .expect("wait")
}

#[tokio::test]
async fn runs_the_command_with_payload_on_stdin_and_job_env() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let out = Scratch::new("work");
    let (mut work, _lines) = spawn_work(
        &broker,
        out.dir(),
        &["--queue", "reports"],
        r#"cat > "$OUT/$LEASEQ_JOB_ID.payload" && env > "$OUT/$LEASEQ_JOB_ID.env""#,
    );
    let mut client = broker.client().await;
    let mut req = job("reports", "line one\nline two\n");
    req.priority = 5;
    req.headers
        .insert("content-type".into(), "text/plain".into());
    req.headers.insert("x.trace-id".into(), "abc 123".into());
    let id = client.enqueue(req).await.unwrap().into_inner().job_id;
    until(&db, "select count(*) = 0 from leaseq.jobs", S20).await;

    let payload = std::fs::read_to_string(out.path(&format!("{id}.payload"))).unwrap();
    assert_eq!(payload, "line one\nline two\n");
    let env: HashMap<String, String> = std::fs::read_to_string(out.path(&format!("{id}.env")))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(env["LEASEQ_JOB_ID"], id);
    assert_eq!(env["LEASEQ_QUEUE"], "reports");
    assert_eq!(env["LEASEQ_ATTEMPT"], "1");
    assert_eq!(env["LEASEQ_PRIORITY"], "5");
    assert_eq!(env["LEASEQ_HEADER_CONTENT_TYPE"], "text/plain");
    assert_eq!(env["LEASEQ_HEADER_X_TRACE_ID"], "abc 123");
    let headers: HashMap<String, String> = serde_json::from_str(&env["LEASEQ_HEADERS"]).unwrap();
    assert_eq!(headers.len(), 2);
    assert_eq!(headers["x.trace-id"], "abc 123");
    let enqueued = chrono::DateTime::parse_from_rfc3339(&env["LEASEQ_ENQUEUED_AT"]).unwrap();
    let db_enqueued: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("select now()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!((db_enqueued - enqueued.to_utc()).num_seconds().abs() < 60);
    assert!(
        !env.contains_key("LEASEQ_LAST_ERROR"),
        "first attempt has no last error"
    );
    assert!(
        !env.contains_key("LEASEQ_HEADER_STALE"),
        "inherited header vars are removed"
    );
    assert!(
        env["LEASEQ_ADDR"].starts_with("http://127.0.0.1:"),
        "own environment is passed on"
    );

    sigterm(&work);
    assert!(exit_status(&mut work, S20).await.success());
    broker.stop().await;
}

#[tokio::test]
async fn failing_command_is_nacked_with_the_tail_of_its_stderr() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let out = Scratch::new("work");
    // Retries at once; the second attempt sees the first one's error.
    let (mut work, _lines) = spawn_work(
        &broker,
        out.dir(),
        &["--queue", "fragile", "--stderr-tail", "32"],
        r#"if [ "$LEASEQ_ATTEMPT" = 1 ]; then
             echo "this early line is cut off by the tail limit" >&2
             echo "fatal: disk on fire" >&2
             exit 3
           fi
           printf '%s' "$LEASEQ_LAST_ERROR" > "$OUT/last_error""#,
    );
    let mut client = broker.client().await;
    client.enqueue(job("fragile", "x")).await.unwrap();
    sqlx::query("update leaseq.queues set backoff_base_ms = 0")
        .execute(&db.pool)
        .await
        .unwrap();
    until(&db, "select count(*) = 0 from leaseq.jobs", S20).await;
    let last = std::fs::read_to_string(out.path("last_error")).unwrap();
    assert!(last.starts_with("exit code 3: "), "{last:?}");
    assert!(last.ends_with("fatal: disk on fire"), "{last:?}");
    assert!(
        !last.contains("early line"),
        "only the tail is kept: {last:?}"
    );

    // Out of attempts: dead-lettered with that error.
    let mut dead = job("fragile", "y");
    dead.max_attempts = 1;
    client.enqueue(dead).await.unwrap();
    until(&db, "select count(*) = 1 from leaseq.dead_jobs", S20).await;
    let error: String = sqlx::query_scalar("select last_error from leaseq.dead_jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        error.starts_with("exit code 3: ") && error.ends_with("fatal: disk on fire"),
        "{error:?}"
    );

    sigterm(&work);
    assert!(exit_status(&mut work, S20).await.success());
    broker.stop().await;
}

#[tokio::test]
async fn sigterm_drains_and_leases_are_extended_while_the_command_runs() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let out = Scratch::new("work");
    let (mut work, mut lines) = spawn_work(
        &broker,
        out.dir(),
        &[
            "--queue",
            "drain",
            "--concurrency",
            "2",
            "--lease",
            "1s",
            "--grace",
            "20s",
        ],
        r#"touch "$OUT/$LEASEQ_JOB_ID.started"
           while [ ! -e "$OUT/go" ]; do sleep 0.05; done
           touch "$OUT/$LEASEQ_JOB_ID.done""#,
    );
    let mut client = broker.client().await;
    let running = client
        .enqueue(job("drain", "a"))
        .await
        .unwrap()
        .into_inner()
        .job_id;
    until_file(&out.path(&format!("{running}.started")), S20).await;
    let token: String = sqlx::query_scalar("select lease_token::text from leaseq.jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();

    // Past twice its 1 s lease, the job is still leased under the same token.
    until(
        &db,
        "select now() > (select enqueued_at from leaseq.jobs) + interval '2.5 s'",
        S20,
    )
    .await;
    let (state, now_token): (String, String) =
        sqlx::query_as("select state, lease_token::text from leaseq.jobs")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (state.as_str(), now_token.as_str()),
        ("leased", token.as_str())
    );

    sigterm(&work);
    // Logged once the worker took the signal: nothing starts after this.
    until_line(&mut lines, "SIGTERM received", S20).await;
    // A job enqueued after SIGTERM reaches the draining worker but never runs.
    let late = client
        .enqueue(job("drain", "b"))
        .await
        .unwrap()
        .into_inner()
        .job_id;
    until(
        &db,
        "select count(*) = 2 from leaseq.jobs where state = 'leased'",
        S20,
    )
    .await;
    assert!(
        work.try_wait().unwrap().is_none(),
        "waits for the running command"
    );
    std::fs::write(out.path("go"), "").unwrap();
    assert!(exit_status(&mut work, S20).await.success());
    assert!(out.path(&format!("{running}.done")).exists());
    assert!(!out.path(&format!("{late}.started")).exists());
    // The broker releases the late job when it sees the stream close.
    until(
        &db,
        "select count(*) = 1 from leaseq.jobs where state = 'available'",
        S20,
    )
    .await;
    let rows: Vec<(String, String)> = sqlx::query_as("select id::text, state from leaseq.jobs")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![(late, "available".to_owned())],
        "running acked, late released"
    );

    // Still consumable: a plain stream gets the released job.
    let mut stream = subscribe(&mut client, &["drain"], 1, None).await;
    let d: pb::Delivery = next_delivery(&mut stream, S20).await;
    assert_eq!(d.job.unwrap().payload, b"b");
    broker.stop().await;
}

#[test]
fn help_documents_flags_env_twins_and_job_variables() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
        .args(["work", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--addr",
        "LEASEQ_ADDR",
        "--queue",
        "LEASEQ_WORK_QUEUE",
        "--concurrency",
        "LEASEQ_WORK_CONCURRENCY",
        "--lease",
        "LEASEQ_WORK_LEASE",
        "--grace",
        "LEASEQ_WORK_GRACE",
        "--consumer",
        "LEASEQ_WORK_CONSUMER",
        "--stderr-tail",
        "LEASEQ_WORK_STDERR_TAIL",
        "LEASEQ_JOB_ID",
        "LEASEQ_HEADER_CONTENT_TYPE",
    ] {
        assert!(help.contains(needle), "help mentions {needle}");
    }
    // A concurrency of 0 could never run a job: refused up front.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
        .args(["work", "--queue", "q", "--concurrency", "0", "--", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--concurrency"));
}

#[tokio::test]
async fn command_exit_settles_even_if_a_background_child_keeps_its_pipes() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let out = Scratch::new("work");
    // The background sleep inherits stdin and stderr and outlives CMD.
    let (mut work, _lines) = spawn_work(
        &broker,
        out.dir(),
        &["--queue", "bg"],
        r#"sleep 30 & echo "$!" > "$OUT/bg.pid"; echo "gave up" >&2; exit 1"#,
    );
    let mut client = broker.client().await;
    let mut req = job("bg", "x");
    req.max_attempts = 1;
    client.enqueue(req).await.unwrap();
    until(&db, "select count(*) = 1 from leaseq.dead_jobs", S20).await;
    let error: String = sqlx::query_scalar("select last_error from leaseq.dead_jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(error, "exit code 1: gave up");
    if let Ok(pid) = std::fs::read_to_string(out.path("bg.pid"))
        && let Ok(pid) = pid.trim().parse::<i32>()
    {
        // SAFETY: kill(2) on the sleep the script started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    sigterm(&work);
    assert!(exit_status(&mut work, S20).await.success());
    broker.stop().await;
}
