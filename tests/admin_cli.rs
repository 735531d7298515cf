//! The operator CLI as the real `leaseq` binary against a broker over real
//! gRPC: `-o json` output and exit codes.

use std::process::Stdio;
use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

const S5: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        assert_eq!(self.code, 0, "stderr: {}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

async fn cli(addr: &str, args: &[&str]) -> Out {
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
            .args(args)
            .env("LEASEQ_ADDR", addr)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("cli finishes within 20s")
    .expect("run leaseq");
    Out {
        code: out.status.code().expect("exited"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn queue<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .expect("array")
        .iter()
        .find(|q| q["name"] == name)
        .unwrap_or_else(|| panic!("queue {name} in {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_print_json_and_exit_with_useful_codes() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let addr = broker.url();
    let a = addr.as_str();
    let mut c = broker.client().await;
    for i in 0..3 {
        enqueue(&mut c, "cli", &format!("job-{i}")).await;
    }
    let mut s = subscribe(&mut c, &["cli"], 1, None).await;
    let d = next_delivery(&mut s, S5).await;
    let dead_id = d.job.as_ref().unwrap().id.clone();
    c.nack(pb::NackRequest {
        job_id: dead_id.clone(),
        lease_token: d.lease_token.clone(),
        error: "bad".into(),
        retry_after: None,
        dead_letter: true,
    })
    .await
    .unwrap();
    // The stream takes the next job and holds it.
    next_delivery(&mut s, S5).await;

    let stats = cli(a, &["stats", "-o", "json"]).await.json();
    let q = queue(&stats, "cli");
    assert_eq!(
        (&q["available"], &q["leased"], &q["dead"], &q["streams"]),
        (
            &Value::from(1),
            &Value::from(1),
            &Value::from(1),
            &Value::from(1)
        ),
        "{q}"
    );
    let one = cli(a, &["stats", "cli", "-o", "json"]).await.json();
    assert_eq!(one.as_array().unwrap().len(), 1);
    let table = cli(a, &["stats"]).await;
    assert_eq!(table.code, 0);
    assert!(table.stdout.starts_with("QUEUE"), "{}", table.stdout);
    assert!(table.stdout.contains("cli"));

    let queues = cli(a, &["queues", "-o", "json"]).await.json();
    assert_eq!(queue(&queues, "cli")["max_attempts"], 20);

    let paused = cli(a, &["pause", "cli", "-o", "json"]).await.json();
    assert_eq!(paused["paused"], true);
    let resumed = cli(a, &["resume", "cli", "-o", "json"]).await.json();
    assert_eq!(resumed["paused"], false);

    let updated = cli(
        a,
        &[
            "queue",
            "update",
            "cli",
            "--max-attempts",
            "5",
            "--default-lease",
            "2m",
            "-o",
            "json",
        ],
    )
    .await
    .json();
    assert_eq!(updated["max_attempts"], 5);
    assert_eq!(updated["default_lease_seconds"], 120.0);

    let jobs = cli(
        a,
        &[
            "jobs",
            "--queue",
            "cli",
            "--limit",
            "5",
            "--payload",
            "-o",
            "json",
        ],
    )
    .await
    .json();
    let jobs = jobs.as_array().unwrap();
    assert_eq!(jobs.len(), 2, "live jobs only");
    assert!(
        jobs.iter()
            .all(|j| j["payload"].as_str().unwrap().starts_with("job-"))
    );
    let leased = cli(a, &["jobs", "--state", "leased", "-o", "json"])
        .await
        .json();
    assert_eq!(leased.as_array().unwrap().len(), 1);

    let job = cli(a, &["job", "get", &dead_id, "-o", "json"]).await.json();
    assert_eq!(
        (&job["state"], &job["dead_reason"]),
        (&Value::from("dead"), &Value::from("nacked"))
    );
    let dlq = cli(a, &["dlq", "list", "-o", "json"]).await.json();
    assert_eq!(dlq.as_array().unwrap()[0]["id"], dead_id.as_str());
    let r = cli(
        a,
        &["dlq", "requeue", "--queue", "cli", "--all", "-o", "json"],
    )
    .await
    .json();
    assert_eq!(r["requeued"], 1);
    assert_eq!(db.dead_jobs().await, 0);

    let waiting = jobs.iter().find(|j| j["state"] == "available").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = cli(a, &["job", "cancel", &waiting, "--yes", "-o", "json"])
        .await
        .json();
    assert_eq!(r["was_leased"], false);

    let r = cli(a, &["purge", "cli", "--yes", "-o", "json"])
        .await
        .json();
    assert_eq!(r["purged"], 1, "the requeued job");

    // Exit codes: NOT_FOUND 3, bad input 2, usage 2, unreachable 4.
    let unknown = uuid::Uuid::now_v7().to_string();
    for (args, code) in [
        (vec!["job", "get", unknown.as_str()], 3),
        (vec!["stats", "nope"], 3),
        (vec!["pause", "nope"], 3),
        (vec!["dlq", "purge", "--queue", "nope", "--all", "--yes"], 3),
        (vec!["dlq", "purge", "--queue", "cli", "--all"], 2),
        (vec!["job", "cancel", unknown.as_str()], 2),
        (vec!["queue", "update", "cli", "--max-attempts", "0"], 2),
        (vec!["job", "get", "not-a-uuid"], 2),
        (vec!["purge", "cli"], 2),
        (vec!["dlq", "requeue"], 2),
        (vec!["stats", "--output", "yaml"], 2),
        (vec!["stats", "--addr", "http://127.0.0.1:1"], 4),
    ] {
        let out = cli(a, &args).await;
        assert_eq!(out.code, code, "{args:?}: {}", out.stderr);
        assert!(!out.stderr.is_empty(), "{args:?} explains itself");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_watch_prints_a_json_line_per_update() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    enqueue(&mut c, "wq", "1").await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
        .args(["stats", "--watch", "--interval", "1h", "-o", "json", "wq"])
        .env("LEASEQ_ADDR", broker.url())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || -> Value {
        let line = tokio::time::timeout(S5, lines.next_line())
            .await
            .expect("a line within 5s")
            .unwrap()
            .expect("still running");
        serde_json::from_str(&line).unwrap()
    };
    let first = next().await;
    assert_eq!(first["queues"][0]["available"], 1);
    enqueue(&mut c, "wq", "2").await;
    let second = next().await;
    assert_eq!(second["queues"][0]["available"], 2);
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_jobs_are_listed_shown_and_purged() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let addr = broker.url();
    let a = addr.as_str();
    let mut c = broker.client().await;
    let q = cli(
        a,
        &[
            "queue",
            "update",
            "kq",
            "--retention",
            "1h",
            "--create",
            "-o",
            "json",
        ],
    )
    .await
    .json();
    assert_eq!(q["completed_retention_seconds"], 3600.0);
    let id = enqueue(&mut c, "kq", "done").await;
    let mut s = subscribe(&mut c, &["kq"], 1, None).await;
    let d = next_delivery(&mut s, S5).await;
    ack(&mut c, &d).await.unwrap();

    let jobs = cli(
        a,
        &["jobs", "--state", "completed", "--payload", "-o", "json"],
    )
    .await
    .json();
    let jobs = jobs.as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(
        (&jobs[0]["id"], &jobs[0]["state"], &jobs[0]["payload"]),
        (
            &Value::from(id.as_str()),
            &Value::from("completed"),
            &Value::from("done")
        )
    );
    let job = cli(a, &["job", "get", &id, "-o", "json"]).await.json();
    assert_eq!(job["completed_by"], "test");
    assert!(job["completed_at"].is_string(), "{job}");
    let r = cli(a, &["purge", "kq", "--yes", "-o", "json"]).await.json();
    assert_eq!(
        (&r["purged"], &r["purged_completed"]),
        (&Value::from(0), &Value::from(1))
    );
    assert_eq!(cli(a, &["job", "get", &id]).await.code, 3);
}

/// `leaseq wait` prints a job's outcome and says it in its exit code;
/// `leaseq job get` shows a completed job's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_prints_the_outcome_and_job_get_the_result() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let addr = broker.url();
    let a = addr.as_str();
    let mut c = broker.client().await;
    let mut s = subscribe(&mut c, &["cw"], 1, None).await;

    // Waiting while the job is live: the outcome comes when it is acked.
    let id = enqueue(&mut c, "cw", "x").await;
    let waiter = {
        let (a, id) = (a.to_owned(), id.clone());
        tokio::spawn(async move { cli(&a, &["wait", &id, "--changes"]).await })
    };
    let d = next_delivery(&mut s, S5).await;
    // (Whether the CLI's wait opens before the ack or after, the outcome is
    // the same: the result keeps the record. tests/wait_job.rs has the
    // order-sensitive cases.)
    c.ack(pb::AckRequest {
        result: b"forty-two".to_vec(),
        job_id: id.clone(),
        lease_token: d.lease_token.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let out = waiter.await.unwrap();
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        out.stdout.lines().last(),
        Some("completed forty-two"),
        "{out:?}"
    );
    // With --changes, the live states the broker saw before it (a poll's
    // view: it may miss a state that lasted less than a poll).
    assert!(
        out.stdout
            .lines()
            .rev()
            .skip(1)
            .all(|l| ["available", "leased"].contains(&l)),
        "{out:?}"
    );

    // Already done: at once, as JSON; `job get` shows the result.
    let done = cli(a, &["wait", &id, "-o", "json"]).await.json();
    assert_eq!(
        (&done["state"], &done["result"]),
        (&Value::from("completed"), &Value::from("forty-two"))
    );
    let job = cli(a, &["job", "get", &id, "-o", "json"]).await.json();
    assert_eq!(job["result"], "forty-two");
    let table = cli(a, &["job", "get", &id]).await;
    assert!(
        table
            .stdout
            .lines()
            .any(|l| l.starts_with("result") && l.ends_with("forty-two")),
        "{table:?}"
    );

    // Dead: exit 1 with its reason; unknown: exit 3; a timeout: exit 4.
    let id = enqueue(&mut c, "cw", "bad").await;
    let d = next_delivery(&mut s, S5).await;
    nack_dead(&mut c, &d, "broken").await;
    let out = cli(a, &["wait", &id]).await;
    assert_eq!(
        (out.code, out.stdout.trim()),
        (1, "dead nacked: broken"),
        "{out:?}"
    );
    let out = cli(a, &["wait", &uuid::Uuid::now_v7().to_string()]).await;
    assert_eq!(out.code, 3, "{out:?}");
    let id = enqueue(&mut c, "cw-idle", "never").await;
    let out = cli(a, &["wait", &id, "--timeout", "300ms"]).await;
    assert_eq!(out.code, 4, "{out:?}");
    assert_eq!(cli(a, &["wait", "not-an-id"]).await.code, 2);
}

/// `leaseq ARGS` on a terminal (util-linux `script` runs it on a pty) with
/// `typed` as the keyboard's input: its exit code and all the terminal
/// showed (stdout and stderr together, the input echoed).
async fn on_terminal(addr: &str, args: &[&str], typed: &str) -> (i32, String) {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let command = std::iter::once(env!("CARGO_BIN_EXE_leaseq"))
        .chain(args.iter().copied())
        .map(quote)
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = tokio::process::Command::new("script")
        .args(["--quiet", "--return", "--command", &command, "/dev/null"])
        .env("LEASEQ_ADDR", addr)
        .env("RUST_LOG", "warn")
        .env("TERM", "xterm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("script (util-linux) runs");
    use tokio::io::AsyncWriteExt;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(typed.as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("finishes within 60s")
        .unwrap();
    (
        out.status.code().expect("exited"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The commands that delete jobs ask first on a terminal and refuse to
/// guess elsewhere (`--yes`); `dlq requeue|purge --all` on a terminal goes
/// a page at a time under a progress bar. 2,500 dead letters: three pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destructive_commands_ask_on_a_terminal_and_long_ones_show_progress() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let addr = broker.url();
    let a = addr.as_str();
    cli(a, &["queue", "update", "dq", "--create", "-o", "json"])
        .await
        .json();
    let bury = async |n: i32| {
        sqlx::query(
            "insert into leaseq.dead_jobs (id, queue, priority, payload, headers, attempt, enqueued_at, reason)
             select gen_random_uuid(), 'dq', 0, '', '{}', 1, now(), 'nacked' from generate_series(1, $1)",
        )
        .bind(n)
        .execute(&db.pool)
        .await
        .unwrap();
    };
    bury(2500).await;
    let id = enqueue(&mut broker.client().await, "dq", "live").await;

    // No terminal: nothing is deleted without --yes (exit 2, naming it).
    for args in [
        vec!["dlq", "purge", "--queue", "dq", "--all"],
        vec!["dlq", "purge", "--queue", "dq", &id],
        vec!["job", "cancel", &id],
        vec!["purge", "dq"],
        vec!["queue", "update", "dq", "--retention", "0"],
    ] {
        let out = cli(a, &args).await;
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("--yes"), "{args:?}: {}", out.stderr);
    }
    assert_eq!((db.dead_jobs().await, db.live_jobs().await), (2500, 1));

    // On a terminal it asks; anything but y leaves everything as it was.
    let (code, shown) = on_terminal(a, &["dlq", "purge", "--queue", "dq", "--all"], "n\n").await;
    assert_eq!(code, 1, "{shown}");
    assert!(
        shown.contains("dlq purge deletes every dead letter of dq. Continue? [y/N]")
            && shown.contains("cancelled"),
        "{shown}"
    );
    let (code, shown) = on_terminal(a, &["job", "cancel", &id], "\n").await;
    assert_eq!(code, 1, "{shown}");
    assert_eq!((db.dead_jobs().await, db.live_jobs().await), (2500, 1));

    // Requeue (not destructive: no question) with a progress bar.
    let (code, shown) = on_terminal(
        a,
        &["dlq", "requeue", "--queue", "dq", "--all", "-o", "json"],
        "",
    )
    .await;
    assert_eq!(code, 0, "{shown}");
    assert!(
        shown.contains("requeueing the dead letters of dq"),
        "{shown}"
    );
    assert!(shown.contains(r#""requeued": 2500"#), "{shown}");
    assert_eq!((db.dead_jobs().await, db.live_jobs().await), (0, 2501));

    // y: purged, a page at a time under the bar.
    bury(2500).await;
    let (code, shown) = on_terminal(
        a,
        &["dlq", "purge", "--queue", "dq", "--all", "-o", "json"],
        "y\n",
    )
    .await;
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains("purging the dead letters of dq"), "{shown}");
    assert!(shown.contains(r#""purged": 2500"#), "{shown}");
    assert_eq!(db.dead_jobs().await, 0);
    let (code, shown) = on_terminal(a, &["purge", "dq"], "yes\n").await;
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains("purged 2501 waiting"), "{shown}");
    assert_eq!(db.live_jobs().await, 0);
}
