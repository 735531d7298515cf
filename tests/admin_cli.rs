//! The operator CLI as the real `leaseq` binary against a broker over real
//! gRPC: `-o json` output and exit codes.

use std::process::Stdio;
use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

const S5: Duration = Duration::from_secs(5);

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
    let r = cli(a, &["job", "cancel", &waiting, "-o", "json"])
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
        (vec!["dlq", "purge", "--queue", "nope", "--all"], 3),
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
