//! Every client command as the real `leaseq` binary: one set of connection
//! options (address, TLS CA, client certificate and key, token; flags and
//! environment twins) that reaches a broker run with TLS, mutual TLS and an
//! `--auth-file`; the documented exit codes when they are wrong; `-o json`;
//! enqueue's options taking effect; `tail` over Consume with acks on the
//! stream; durations as usage errors; shell completions; `bench`'s open-loop
//! scenarios against a real broker.

use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use leaseq::pb::admin_service_client::AdminServiceClient;
use leaseq::pb::queue_service_server::{QueueService, QueueServiceServer};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

const S5: Duration = Duration::from_secs(5);
const S20: Duration = Duration::from_secs(20);

/// Exit codes (README, docs/ADMIN.md, `leaseq::cli::exit`).
const USAGE: i32 = 2;
const UNAVAILABLE: i32 = 4;
const DENIED: i32 = 5;

/// Every variable the connection options read, so the caller's environment
/// cannot leak into a run.
const CONNECT_VARS: &[&str] = &[
    "LEASEQ_ADDR",
    "LEASEQ_TLS_CA",
    "LEASEQ_CLIENT_CERT",
    "LEASEQ_CLIENT_KEY",
    "LEASEQ_TOKEN",
];

#[derive(Debug)]
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    /// Exit 0 and stdout one JSON document.
    fn json(&self) -> Value {
        assert_eq!(self.code, 0, "stderr: {}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }

    /// Exit 0 and stdout one JSON object per line.
    fn json_lines(&self) -> Vec<Value> {
        assert_eq!(self.code, 0, "stderr: {}", self.stderr);
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }
}

fn command(args: &[&str], env: &[(String, String)]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"));
    c.args(args).env("RUST_LOG", "warn").kill_on_drop(true);
    for v in CONNECT_VARS {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Runs `leaseq ARGS` to completion with `env` (and `stdin`, if any).
async fn leaseq(args: &[&str], env: &[(String, String)], stdin: Option<&str>) -> Out {
    let mut c = command(args, env);
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().expect("run leaseq");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input.as_bytes()).await.unwrap();
    }
    let out = tokio::time::timeout(S20, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("leaseq {args:?} finishes within 20s"))
        .expect("wait");
    let out = Out {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!out.stderr.contains("panicked"), "{args:?}: {}", out.stderr);
    out
}

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// ---- a broker with TLS, mutual TLS and tokens ------------------------------

/// A token allowed everything, and one that may only enqueue.
const OPS: &str = "ops-secret-0123456789";
const PRODUCER: &str = "producer-secret-0123456789";

/// A broker in this process serving TLS with `pki`'s certificate, requiring
/// a client certificate from `pki`'s CA and a bearer token ([`OPS`],
/// [`PRODUCER`]).
async fn secure_broker(db: &TestDb, pki: &Pki) -> TestBroker {
    let h = leaseq_server::hash_token;
    let tokens = serde_json::json!({"tokens": [
        {"name": "ops", "sha256": h(OPS),
         "grants": [{"queues": "*", "actions": ["enqueue", "consume", "admin"]}]},
        {"name": "producer", "sha256": h(PRODUCER),
         "grants": [{"queues": "*", "actions": ["enqueue"]}]},
    ]});
    let (_scratch, auth_file) = Scratch::with_file("cli", "tokens.json", &tokens.to_string());
    TestBroker::on(db)
        .mutual_tls(pki)
        .auth_file(&auth_file)
        .start()
        .await
}

/// Every connection option to `broker` as its environment twin.
fn secure_env(broker: &TestBroker, pki: &Pki, token: Option<&str>) -> Vec<(String, String)> {
    let mut e = env(&[
        ("LEASEQ_ADDR", &broker.url()),
        ("LEASEQ_TLS_CA", pki.ca.to_str().unwrap()),
        ("LEASEQ_CLIENT_CERT", pki.client_cert.to_str().unwrap()),
        ("LEASEQ_CLIENT_KEY", pki.client_key.to_str().unwrap()),
    ]);
    if let Some(t) = token {
        e.push(("LEASEQ_TOKEN".into(), t.into()));
    }
    e
}

/// `leaseq work` running `sh -c script` until `done`, then SIGTERM: it must
/// exit 0.
async fn work_until(
    args: &[&str],
    env: &[(String, String)],
    script: &str,
    done: impl AsyncFnMut() -> bool,
) {
    let mut argv = vec!["work"];
    argv.extend_from_slice(args);
    argv.extend(["--", "sh", "-c", script]);
    let mut child = command(&argv, env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn leaseq work");
    let mut done = done;
    let deadline = tokio::time::Instant::now() + S20;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "leaseq work did not get there in 20s"
        );
        if let Ok(Some(status)) = child.try_wait() {
            panic!("leaseq work exited early: {status}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = child.id().expect("running") as i32;
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(S20, child.wait())
        .await
        .expect("leaseq work drains in time")
        .unwrap();
    assert_eq!(status.code(), Some(0), "leaseq work after SIGTERM");
}

/// Every client command once, in an order that gives each something to do,
/// over TLS with a client certificate and a token from the environment
/// twins; each printing command's `-o json` parses. Then the same commands
/// without the token, with a token outside their grants, with a CA that did
/// not sign the broker's certificate, and without the client certificate:
/// each exits with the documented code and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_reaches_a_tls_broker_with_a_token() {
    let db = TestDb::new().await;
    let pki = Pki::new();
    let broker = secure_broker(&db, &pki).await;
    let ops = secure_env(&broker, &pki, Some(OPS));
    let run = async |args: &[&str]| leaseq(args, &ops, None).await;

    // Flags instead of environment twins, and the payload from stdin.
    let flags = [
        "enqueue",
        "-q",
        "cli",
        "--addr",
        &broker.url(),
        "--tls-ca",
        pki.ca.to_str().unwrap(),
        "--tls-cert",
        pki.client_cert.to_str().unwrap(),
        "--tls-key",
        pki.client_key.to_str().unwrap(),
        "--token",
        OPS,
        "-o",
        "json",
    ];
    let first = leaseq(&flags, &[], Some("from stdin")).await.json();
    let first_id = first["job_id"].as_str().unwrap().to_owned();
    assert_eq!(
        (&first["queue"], &first["duplicate"]),
        (&Value::from("cli"), &Value::from(false))
    );

    let keyed = run(&[
        "enqueue",
        "-q",
        "cli",
        "-p",
        "k",
        "--dedup-key",
        "k",
        "-o",
        "json",
    ])
    .await
    .json();
    let again = run(&[
        "enqueue",
        "-q",
        "cli",
        "-p",
        "k",
        "--dedup-key",
        "k",
        "-o",
        "json",
    ])
    .await
    .json();
    assert_eq!(again["job_id"], keyed["job_id"]);
    assert_eq!(again["duplicate"], true);
    let table = run(&["enqueue", "-q", "cli", "-p", "k", "--dedup-key", "k"]).await;
    assert_eq!(
        table.stdout.trim(),
        format!("{} (duplicate)", keyed["job_id"].as_str().unwrap())
    );
    // --replace (debounce): the waiting job takes the new payload.
    let replaced = run(&[
        "enqueue",
        "-q",
        "cli",
        "-p",
        "k2",
        "--dedup-key",
        "k",
        "--replace",
        "-o",
        "json",
    ])
    .await
    .json();
    assert_eq!(replaced["job_id"], keyed["job_id"]);
    assert_eq!(
        (&replaced["duplicate"], &replaced["replaced"]),
        (&Value::from(true), &Value::from(true))
    );
    let table = run(&[
        "enqueue",
        "-q",
        "cli",
        "-p",
        "k3",
        "--dedup-key",
        "k",
        "--replace",
    ])
    .await;
    assert_eq!(
        table.stdout.trim(),
        format!("{} (replaced)", keyed["job_id"].as_str().unwrap())
    );
    let payload: Vec<u8> =
        sqlx::query_scalar("select payload from leaseq.jobs where id = $1::uuid")
            .bind(keyed["job_id"].as_str().unwrap())
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(payload, b"k3");
    // --unique-for and --replace need --dedup-key: a usage error.
    for bad in [&["--unique-for", "1h"][..], &["--replace"]] {
        let mut args = vec!["enqueue", "-q", "cli", "-p", "x"];
        args.extend(bad);
        let out = run(&args).await;
        assert_eq!(out.code, 2, "{bad:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("--dedup-key"),
            "{bad:?}: {}",
            out.stderr
        );
    }
    let windowed = run(&[
        "enqueue",
        "-q",
        "cli",
        "-p",
        "w",
        "--dedup-key",
        "w",
        "--unique-for",
        "1h",
        "-o",
        "json",
    ])
    .await
    .json();
    let unique_for_ms: Option<i64> =
        sqlx::query_scalar("select unique_for_ms from leaseq.jobs where id = $1::uuid")
            .bind(windowed["job_id"].as_str().unwrap())
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(unique_for_ms, Some(3_600_000));
    // The rest of this test counts the two jobs above.
    sqlx::query("delete from leaseq.jobs where id = $1::uuid")
        .bind(windowed["job_id"].as_str().unwrap())
        .execute(&db.pool)
        .await
        .unwrap();

    let stats = run(&["stats", "-o", "json"]).await.json();
    assert_eq!(stats[0]["name"], "cli");
    assert_eq!(stats[0]["available"], 2);
    for args in [
        &["stats", "cli", "-o", "json"][..],
        &["queues", "-o", "json"],
        &["jobs", "--queue", "cli", "-o", "json"],
        &["jobs", "--state", "dead", "-o", "json"],
        &["dlq", "list", "-o", "json"],
        &["pause", "cli", "-o", "json"],
        &["resume", "cli", "-o", "json"],
        &[
            "queue",
            "update",
            "cli",
            "--max-attempts",
            "7",
            "-o",
            "json",
        ],
    ] {
        let out = run(args).await;
        out.json();
        let table = run(&args[..args.len() - 2]).await;
        assert_eq!(table.code, 0, "{args:?}: {}", table.stderr);
    }
    let job = run(&["job", "get", &first_id, "-o", "json"]).await.json();
    assert_eq!(
        (&job["payload"], &job["max_attempts"]),
        (&Value::from("from stdin"), &Value::Null)
    );

    // tail takes the oldest job and acks it on the stream.
    let got = run(&["tail", "-q", "cli", "--count", "1", "-o", "json"])
        .await
        .json_lines();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (&got[0]["id"], &got[0]["payload"], &got[0]["attempt"]),
        (
            &Value::from(first_id.as_str()),
            &Value::from("from stdin"),
            &Value::from(1)
        )
    );
    assert_eq!(db.live_jobs().await, 1, "acked");

    let cancelled = run(&[
        "job",
        "cancel",
        keyed["job_id"].as_str().unwrap(),
        "--yes",
        "-o",
        "json",
    ])
    .await
    .json();
    assert_eq!(cancelled["was_leased"], false);

    // work: a job allowed one attempt, a command that fails: dead letter.
    run(&["enqueue", "-q", "cli", "-p", "w", "--max-attempts", "1"]).await;
    work_until(&["-q", "cli"], &ops, "exit 3", async || {
        db.dead_jobs().await == 1
    })
    .await;
    let r = run(&["dlq", "requeue", "--queue", "cli", "--all", "-o", "json"])
        .await
        .json();
    assert_eq!(r["requeued"], 1);
    let r = run(&[
        "dlq", "purge", "--queue", "cli", "--all", "--yes", "-o", "json",
    ])
    .await
    .json();
    assert_eq!(r["purged"], 0);
    // ... and once more with a command that succeeds: acked.
    work_until(&["-q", "cli"], &ops, "cat >/dev/null", async || {
        db.live_jobs().await == 0
    })
    .await;
    run(&["enqueue", "-q", "cli", "-p", "left"]).await;
    let r = run(&["purge", "cli", "--yes", "-o", "json"]).await.json();
    assert_eq!(r["purged"], 1);
    assert_eq!(db.live_jobs().await, 0);

    // Refused: every command, the same arguments, wrong connection options.
    let id = uuid::Uuid::now_v7().to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec!["enqueue", "-q", "cli", "-p", "x"],
        vec!["tail", "-q", "cli", "--count", "1"],
        vec!["work", "-q", "cli", "--", "true"],
        vec!["stats"],
        vec!["stats", "--watch", "cli"],
        vec!["queues"],
        vec!["jobs"],
        vec!["job", "get", &id],
        vec!["job", "cancel", &id, "--yes"],
        vec!["dlq", "list"],
        vec!["dlq", "requeue", "--queue", "cli", "--all"],
        vec!["dlq", "purge", "--queue", "cli", "--all", "--yes"],
        vec!["pause", "cli"],
        vec!["resume", "cli"],
        vec!["purge", "cli", "--yes"],
        vec!["queue", "update", "cli", "--max-attempts", "3"],
    ];
    let no_token = secure_env(&broker, &pki, None);
    let producer = secure_env(&broker, &pki, Some(PRODUCER));
    let mut wrong_ca = ops.clone();
    wrong_ca[1].1 = pki.rogue_ca.to_str().unwrap().into();
    let no_client_cert: Vec<_> = ops
        .iter()
        .filter(|(k, _)| !k.starts_with("LEASEQ_CLIENT_"))
        .cloned()
        .collect();
    let mut plaintext = ops.clone();
    plaintext[0].1 = format!("http://{}", broker.addr);
    plaintext.retain(|(k, _)| k == "LEASEQ_ADDR" || k == "LEASEQ_TOKEN");
    // A broker that wants a client certificate and gets none hangs up just
    // after the handshake; whether the client reads its alert first (5) or
    // only sees the connection close (4) is a race.
    for (what, env, codes, skip) in [
        ("without a token", &no_token, &[DENIED][..], ""),
        (
            "with a token for enqueue only",
            &producer,
            &[DENIED],
            "enqueue",
        ),
        (
            "with a CA that did not sign the broker's certificate",
            &wrong_ca,
            &[DENIED],
            "",
        ),
        (
            "without a client certificate",
            &no_client_cert,
            &[UNAVAILABLE, DENIED],
            "",
        ),
        ("in plaintext", &plaintext, &[UNAVAILABLE], ""),
    ] {
        for args in commands.iter().filter(|a| a[0] != skip) {
            let out = leaseq(args, env, None).await;
            eprintln!("leaseq {args:?} {what}: {} {}", out.code, out.stderr.trim());
            assert!(codes.contains(&out.code), "{args:?} {what}: {out:?}");
            assert!(!out.stderr.is_empty(), "{args:?} {what} explains itself");
            assert!(!out.stderr.contains(OPS), "token echoed: {}", out.stderr);
        }
    }
    assert_eq!(db.live_jobs().await, 0, "nothing enqueued");
    assert_eq!(db.dead_jobs().await, 0);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_options_take_effect() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let e = env(&[("LEASEQ_ADDR", &broker.url())]);
    let mut admin = AdminServiceClient::connect(broker.url()).await.unwrap();
    let mut get = async |out: Out| {
        let id = out.json()["job_id"].as_str().unwrap().to_owned();
        admin
            .get_job(pb::GetJobRequest { job_id: id })
            .await
            .unwrap()
            .into_inner()
    };
    let secs = |t: &Option<prost_types::Timestamp>| t.as_ref().unwrap().seconds;

    let run_at = "2099-01-02T03:04:05Z";
    let args = [
        "enqueue",
        "-q",
        "opts",
        "-p",
        "p",
        "--run-at",
        run_at,
        "--ttl",
        "1h30m",
        "--max-attempts",
        "3",
        "--dedup-key",
        "key-1",
        "--priority",
        "-5",
        "-H",
        "content-type=text/plain",
        "-H",
        "traceparent=00-abc-def-01",
        "-o",
        "json",
    ];
    let job = get(leaseq(&args, &e, None).await).await;
    assert_eq!(job.state(), pb::JobState::Scheduled);
    let want = chrono::DateTime::parse_from_rfc3339(run_at).unwrap();
    assert_eq!(secs(&job.run_at), want.timestamp(), "run_at {run_at}");
    assert_eq!(secs(&job.expires_at) - secs(&job.enqueued_at), 5400, "ttl");
    assert_eq!(job.max_attempts, 3);
    assert_eq!(job.dedup_key, "key-1");
    assert_eq!(job.priority, -5);
    assert_eq!(job.headers["content-type"], "text/plain");
    assert_eq!(job.headers["traceparent"], "00-abc-def-01");
    let dup = leaseq(&args, &e, None).await.json();
    assert_eq!(
        (dup["job_id"].as_str(), &dup["duplicate"]),
        (Some(job.id.as_str()), &Value::from(true))
    );

    // --delay as users write it: 2d, 90s, bare seconds.
    for (delay, want) in [("2d", 172_800), ("90s", 90), ("120", 120)] {
        let out = leaseq(
            &[
                "enqueue", "-q", "opts", "-p", "d", "--delay", delay, "-o", "json",
            ],
            &e,
            None,
        )
        .await;
        let job = get(out).await;
        let d = secs(&job.run_at) - secs(&job.enqueued_at);
        assert!((want..=want + 1).contains(&d), "--delay {delay}: {d}s");
    }

    // Usage errors, before anything is sent.
    let before = db.live_jobs().await;
    for (args, says) in [
        (vec!["--delay", "99999999999999999999999h"], "100 years"),
        (vec!["--delay", "200y"], "100 years"),
        (vec!["--ttl", "99999999999999999999"], "100 years"),
        (vec!["--delay", "soon"], "not a duration"),
        (vec!["--run-at", "tomorrow"], "RFC 3339"),
        (
            vec!["--run-at", run_at, "--delay", "1s"],
            "cannot be used with",
        ),
        (vec!["--max-attempts", "0"], "--max-attempts"),
        (vec!["-H", "no-equals"], "KEY=VALUE"),
    ] {
        let mut argv = vec!["enqueue", "-q", "opts", "-p", "x"];
        argv.extend(args.iter());
        let out = leaseq(&argv, &e, None).await;
        assert_eq!(out.code, USAGE, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
    // A value the broker refuses (INVALID_ARGUMENT) is a usage error too.
    let out = leaseq(&["enqueue", "-q", "bad queue!", "-p", "x"], &e, None).await;
    assert_eq!(out.code, USAGE, "{}", out.stderr);
    assert_eq!(db.live_jobs().await, before);

    // Durations of other commands too.
    for args in [
        &[
            "work",
            "-q",
            "opts",
            "--lease",
            "99999999999999999999999h",
            "--",
            "true",
        ][..],
        &["stats", "--watch", "--interval", "99999999999999999999999h"],
        &[
            "queue",
            "update",
            "opts",
            "--default-lease",
            "99999999999999999999999h",
        ],
    ] {
        let out = leaseq(args, &e, None).await;
        assert_eq!(out.code, USAGE, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("100 years"), "{args:?}: {}", out.stderr);
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_print_a_script_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef leaseq"),
        ("fish", "complete -c leaseq"),
    ] {
        let out = leaseq(&["completions", shell], &[], None).await;
        assert_eq!(out.code, 0, "{shell}: {}", out.stderr);
        assert!(out.stdout.contains(marker), "{shell}: {}", out.stdout);
        for word in ["enqueue", "tail", "dlq", "tls-ca", "token"] {
            assert!(out.stdout.contains(word), "{shell} script lacks {word}");
        }
    }
    let out = leaseq(&["completions", "tcsh"], &[], None).await;
    assert_eq!(out.code, USAGE, "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_token_prints_json() {
    let out = leaseq(&["hash-token", "-o", "json"], &[], Some("secret\n")).await;
    assert_eq!(out.json()["sha256"], leaseq_server::hash_token("secret"));
    let made = leaseq(&["hash-token", "--generate", "-o", "json"], &[], None)
        .await
        .json();
    let token = made["token"].as_str().unwrap();
    assert_eq!(made["sha256"], leaseq_server::hash_token(token));
    let out = leaseq(&["hash-token"], &[], Some("")).await;
    assert_eq!(out.code, USAGE, "{}", out.stderr);
}

// ---- tail over Consume -----------------------------------------------------

/// A QueueService that serves only Consume: it delivers `jobs`, records
/// what the client sends on the stream, and ends the stream when the client
/// half-closes. Any other call is recorded and refused.
struct FakeBroker {
    jobs: Vec<(&'static str, &'static str)>,
    seen: Arc<Mutex<Vec<String>>>,
}

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

impl FakeBroker {
    fn refuse<T>(&self, call: &str) -> Result<Response<T>, Status> {
        self.seen.lock().unwrap().push(format!("unary {call}"));
        Err(Status::unimplemented("only Consume here"))
    }
}

#[tonic::async_trait]
impl QueueService for FakeBroker {
    async fn enqueue(
        &self,
        _: Request<pb::EnqueueRequest>,
    ) -> Result<Response<pb::EnqueueResponse>, Status> {
        self.refuse("Enqueue")
    }
    async fn enqueue_batch(
        &self,
        _: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueBatchResponse>, Status> {
        self.refuse("EnqueueBatch")
    }
    type SubscribeStream = Stream<pb::SubscribeResponse>;
    async fn subscribe(
        &self,
        _: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        self.refuse("Subscribe")
    }
    async fn ack(&self, _: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        self.refuse("Ack")
    }
    async fn ack_batch(
        &self,
        _: Request<pb::AckBatchRequest>,
    ) -> Result<Response<pb::AckBatchResponse>, Status> {
        self.refuse("AckBatch")
    }
    async fn nack(
        &self,
        _: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        self.refuse("Nack")
    }
    async fn extend_lease(
        &self,
        _: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        self.refuse("ExtendLease")
    }
    async fn report_progress(
        &self,
        _: Request<pb::ReportProgressRequest>,
    ) -> Result<Response<pb::ReportProgressResponse>, Status> {
        Err(Status::unimplemented(
            "leaseq.v1.QueueService/ReportProgress",
        ))
    }

    type ProduceStream = Stream<pb::ProduceResponse>;
    async fn produce(
        &self,
        _: Request<Streaming<pb::ProduceRequest>>,
    ) -> Result<Response<Self::ProduceStream>, Status> {
        self.refuse("Produce")
    }

    type WaitJobStream = Stream<pb::WaitJobResponse>;
    async fn wait_job(
        &self,
        _: Request<pb::WaitJobRequest>,
    ) -> Result<Response<Self::WaitJobStream>, Status> {
        Err(Status::unimplemented("leaseq.v1.QueueService/WaitJob"))
    }
    type ConsumeStream = Stream<pb::ConsumeResponse>;
    async fn consume(
        &self,
        req: Request<Streaming<pb::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let (seen, jobs) = (self.seen.clone(), self.jobs.clone());
        tokio::spawn(async move {
            let record = |s: String| seen.lock().unwrap().push(s);
            let first = inbound.message().await.unwrap().unwrap();
            let sub = first.subscribe.unwrap();
            record(format!(
                "subscribe {} credit {}",
                sub.queues.join(","),
                sub.max_in_flight
            ));
            let kind = |k| Ok(pb::ConsumeResponse { kind: Some(k) });
            let heartbeat = pb::consume_response::Kind::Heartbeat(pb::Heartbeat::default());
            tx.send(kind(heartbeat)).await.unwrap();
            for (id, token) in jobs {
                let d = pb::Delivery {
                    job: Some(pb::Job {
                        id: id.into(),
                        queue: "fq".into(),
                        payload: format!("payload of {id}").into_bytes(),
                        attempt: 1,
                        ..Default::default()
                    }),
                    lease_token: token.into(),
                    lease_expires_at: None,
                };
                let _ = tx.send(kind(pb::consume_response::Kind::Delivery(d))).await;
            }
            while let Ok(Some(m)) = inbound.message().await {
                for a in m.acks {
                    record(format!("ack {} {}", a.job_id, a.lease_token));
                }
                if m.max_in_flight > 0 {
                    record(format!("credit {}", m.max_in_flight));
                }
            }
            record("half-closed".into());
            // Dropping `tx` ends the response stream with OK.
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

async fn fake_broker(jobs: Vec<(&'static str, &'static str)>) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = QueueServiceServer::new(FakeBroker {
        jobs,
        seen: seen.clone(),
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (format!("http://{addr}"), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_acks_on_the_consume_stream_and_half_closes() {
    let jobs = vec![("j1", "t1"), ("j2", "t2"), ("j3", "t3")];
    let (url, seen) = fake_broker(jobs.clone()).await;
    let e = env(&[("LEASEQ_ADDR", &url)]);
    let got = leaseq(
        &["tail", "-q", "fq", "--count", "2", "-o", "json"],
        &e,
        None,
    )
    .await
    .json_lines();
    let ids: Vec<_> = got.iter().map(|j| j["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["j1", "j2"]);
    assert_eq!(got[0]["payload"], "payload of j1");
    // Credit no larger than the jobs wanted, each printed job acked on the
    // stream (never by a unary call), then the stream half-closed: the
    // third job is left to the broker to release.
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "subscribe fq credit 2",
            "ack j1 t1",
            "credit 1",
            "ack j2 t2",
            "half-closed"
        ]
    );

    let (url, seen) = fake_broker(jobs).await;
    let e = env(&[("LEASEQ_ADDR", &url)]);
    let out = leaseq(&["tail", "-q", "fq", "--count", "1", "--no-ack"], &e, None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        "j1 queue=fq attempt=1 priority=0 payload=payload of j1\n"
    );
    assert_eq!(
        *seen.lock().unwrap(),
        ["subscribe fq credit 1", "half-closed"]
    );
}

/// Against a real broker: jobs printed by `tail` are acked (gone), and a
/// job it did not take is left waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_acks_what_it_prints_on_a_real_broker() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    for i in 0..3 {
        enqueue(&mut c, "tq", &format!("t{i}")).await;
    }
    let e = env(&[("LEASEQ_ADDR", &broker.url())]);
    let out = leaseq(&["tail", "-q", "tq", "--count", "2"], &e, None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout.lines().count(), 2, "{}", out.stdout);
    assert_eq!(db.live_jobs().await, 1);
    // Released at once on the half-close, not after a lease: available now.
    let mut s = subscribe(&mut c, &["tq"], 1, None).await;
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(payload_of(&d), "t2");
    drop(s);

    // --no-ack: as many as --count (more than the default credit of 16),
    // none acked, all released when it exits.
    for i in 0..20 {
        enqueue(&mut c, "tq", &format!("n{i}")).await;
    }
    let got = leaseq(
        &[
            "tail", "-q", "tq", "--no-ack", "--count", "21", "-o", "json",
        ],
        &e,
        None,
    )
    .await
    .json_lines();
    assert_eq!(got.len(), 21);
    assert_eq!(db.live_jobs().await, 21);
    // Released as the stream closes (the broker may end the stream a moment
    // before the release commits).
    eventually(S5, "released on exit", || async {
        db.leased_in("tq").await == 0
    })
    .await;
    broker.stop().await;
}

/// `leaseq work` with a token goes on working across a broker restart (the
/// token rides on every reconnection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_with_a_token_survives_a_broker_restart() {
    let db = TestDb::new().await;
    let scratch = Scratch::new("cli");
    let tokens = scratch.path("tokens.json");
    let h = leaseq_server::hash_token;
    std::fs::write(
        &tokens,
        serde_json::json!({"tokens": [{"name": "ops", "sha256": h(OPS),
            "grants": [{"queues": "*", "actions": ["enqueue", "consume"]}]}]})
        .to_string(),
    )
    .unwrap();
    let serve = ["--auth-file", tokens.to_str().unwrap()];
    let mut broker = BinaryBroker::start(&db, &serve).await;
    let e = env(&[
        ("LEASEQ_ADDR", &format!("http://{}", broker.addr)),
        ("LEASEQ_TOKEN", OPS),
    ]);
    let mut work = command(
        &["work", "-q", "rq", "--", "sh", "-c", "cat >/dev/null"],
        &e,
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::inherit())
    .spawn()
    .expect("spawn leaseq work");
    let done = async |db: &TestDb| {
        eventually(S20, "the job is acked", || async {
            db.live_jobs().await == 0
        })
        .await;
    };
    let out = leaseq(&["enqueue", "-q", "rq", "-p", "1"], &e, None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    done(&db).await;

    broker.signal(libc::SIGTERM);
    assert!(broker.wait(S20).await.success());
    let addr = broker.addr;
    broker = BinaryBroker::on(&db).addr(addr).args(&serve).start().await;
    let out = leaseq(&["enqueue", "-q", "rq", "-p", "2"], &e, None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    done(&db).await;
    assert_eq!(work.try_wait().unwrap(), None, "leaseq work still running");

    let pid = work.id().unwrap() as i32;
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(S20, work.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    broker.signal(libc::SIGTERM);
    broker.wait(S20).await;
}

/// `leaseq bench --scenario baseline` (the raw-SQL loop) against a real
/// database: it runs, and with --raw-backlog it leases from a backlog that
/// is still waiting at the end (docs/BENCHMARKS.md, "A raw loop with a
/// backlog"); without, its table ends with about its workers' last
/// batches. It drops its table afterwards.
#[tokio::test]
async fn bench_baseline_leases_from_the_backlog_it_was_given() {
    let db = TestDb::new().await;
    let e = env(&[]);
    let run = async |backlog: &str| {
        let args = [
            "bench",
            "--scenario",
            "baseline",
            "--database-url",
            &db.url,
            "--producers",
            "1",
            "--batch",
            "10",
            "--duration",
            "1",
            "--raw-backlog",
            backlog,
            "--json",
        ];
        let out = leaseq(&args, &e, None).await;
        assert_eq!(out.code, 0, "{}", out.stderr);
        let last = out.stdout.lines().last().unwrap_or_default();
        serde_json::from_str::<Value>(last).unwrap_or_else(|e| panic!("not JSON ({e}): {last}"))
    };
    let with = run("3000").await;
    assert_eq!(with["scenario"], "Baseline", "{with}");
    assert!(with["jobs"].as_u64().unwrap() > 0, "{with}");
    // Every leased row is replaced by an inserted one: the backlog stays.
    assert!(with["waiting"].as_u64().unwrap() >= 3000, "{with}");
    let without = run("0").await;
    assert!(without["jobs"].as_u64().unwrap() > 0, "{without}");
    // About two workers' last batches, far below the backlog above.
    assert!(without["waiting"].as_u64().unwrap() < 100, "{without}");
    let left: Option<String> = sqlx::query_scalar("select to_regclass('leaseq_bench_raw')::text")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, None, "the raw loop's table is dropped");
}

/// `leaseq bench`'s open-loop scenarios against a real broker: `ping`
/// (health checks, the gRPC hop alone) and `latency` (Enqueue → delivery)
/// send at the rate asked, without errors, and report their latencies; the
/// latency run's jobs are delivered and acked (counts as the window closed:
/// on a loaded machine many are still in flight then).
#[tokio::test]
async fn bench_open_loop_scenarios_measure_a_real_broker() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let e = env(&[]);
    let run = async |scenario: &str, warmup: &str, seconds: &str| {
        let addr = broker.url();
        let args = [
            "bench",
            "--addr",
            &addr,
            "--scenario",
            scenario,
            "--rate",
            "200",
            "--duration",
            seconds,
            "--warmup",
            warmup,
            "--consumers",
            "1",
            "--json",
        ];
        let out = leaseq(&args, &e, None).await;
        assert_eq!(out.code, 0, "{}", out.stderr);
        let last = out.stdout.lines().last().unwrap_or_default();
        serde_json::from_str::<Value>(last).unwrap_or_else(|e| panic!("not JSON ({e}): {last}"))
    };
    // With a warm-up of 1 s (200 more sends, left out of every figure).
    let ping = run("ping", "1", "1").await;
    assert_eq!(ping["scenario"], "Ping", "{ping}");
    assert_eq!(ping["errors"], 0, "{ping}");
    assert_eq!(ping["rate"], 200, "{ping}");
    let answered = ping["jobs"].as_u64().unwrap();
    // At most the 200 sends due in the window, none of the warm-up's; on a
    // loaded machine, fewer answered before it closed.
    assert!((1..=200).contains(&answered), "{ping}");
    let (from_due, call) = (
        ping["p50_ms"].as_f64().unwrap(),
        ping["enqueue_p50_ms"].as_f64().unwrap(),
    );
    assert!(call > 0.0 && from_due >= call, "{ping}");
    assert_eq!(ping["delivered"], 0, "{ping}");
    assert_eq!(db.live_jobs().await, 0, "a ping enqueues nothing");

    // No warm-up: a warm-up job acked after the window opened would count
    // as acked but not as delivered. Two seconds, so that on a loaded
    // machine some ack's confirmation is back before the window closes.
    let lat = run("latency", "0", "2").await;
    assert_eq!(lat["scenario"], "Latency", "{lat}");
    assert_eq!(lat["errors"], 0, "{lat}");
    let enqueued = lat["enqueued"].as_u64().unwrap();
    assert!((1..=400).contains(&enqueued), "{lat}");
    let (delivered, acked) = (
        lat["delivered"].as_u64().unwrap(),
        lat["acked"].as_u64().unwrap(),
    );
    // (A delivery may be counted before its Enqueue call's answer.)
    assert!(acked >= 1 && acked <= delivered, "{lat}");
    assert!(lat["p50_ms"].as_f64().unwrap() > 0.0, "{lat}");
}

/// Every address form every leaseq client takes (`host:port`, `http://`,
/// `https://`), and TLS without a CA trusting the system's roots: the CLI,
/// and so the Rust client crate it connects with. The system's roots are
/// the operating system's store, which `SSL_CERT_FILE` replaces here (as
/// for OpenSSL): the broker's CA there, an `https://` address needs no
/// `--tls-ca`; another CA there, the handshake fails (exit 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_address_form_and_the_system_roots() {
    let db = TestDb::new().await;
    let pki = Pki::new();
    let secure = secure_broker(&db, &pki).await;
    let cert = pki.client_cert.to_str().unwrap();
    let key = pki.client_key.to_str().unwrap();
    let host_port = secure.addr.to_string();
    let roots = |file: &PathBuf| {
        env(&[
            ("SSL_CERT_FILE", file.to_str().unwrap()),
            ("LEASEQ_CLIENT_CERT", cert),
            ("LEASEQ_CLIENT_KEY", key),
            ("LEASEQ_TOKEN", OPS),
        ])
    };
    let queues = |addr: &str| {
        ["queues", "--addr", addr, "-o", "json"]
            .map(str::to_owned)
            .to_vec()
    };
    let run = async |args: Vec<String>, env: &[(String, String)]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut c = command(&args, env);
        c.env_remove("SSL_CERT_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = tokio::time::timeout(S20, c.output())
            .await
            .expect("finishes within 20s")
            .unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let args = |a: Vec<&str>| a.into_iter().map(str::to_owned).collect::<Vec<_>>();

    // https:// without --tls-ca: the system's roots.
    let (code, err) = run(queues(&secure.url()), &roots(&pki.ca)).await;
    assert_eq!(code, 0, "system roots holding the broker's CA: {err}");
    let (code, err) = run(queues(&secure.url()), &roots(&pki.rogue_ca)).await;
    assert_eq!(code, DENIED, "system roots without it: {err}");
    // A CA given wins over the system's roots.
    let mut with_ca = queues(&secure.url());
    with_ca.extend(["--tls-ca".to_owned(), pki.ca.to_str().unwrap().to_owned()]);
    let (code, err) = run(with_ca, &roots(&pki.rogue_ca)).await;
    assert_eq!(code, 0, "--tls-ca over the system's roots: {err}");
    // host:port with a CA (here from LEASEQ_TLS_CA) is TLS.
    let mut e = roots(&pki.rogue_ca);
    e.push(("LEASEQ_TLS_CA".into(), pki.ca.to_str().unwrap().into()));
    e.push(("LEASEQ_ADDR".into(), host_port.clone()));
    let (code, err) = run(args(vec!["queues", "-o", "json"]), &e).await;
    assert_eq!(code, 0, "LEASEQ_ADDR=host:port with LEASEQ_TLS_CA: {err}");
    // http:// with TLS files cannot work: a usage error, before connecting.
    let mut e = roots(&pki.ca);
    e.push(("LEASEQ_TLS_CA".into(), pki.ca.to_str().unwrap().into()));
    let (code, err) = run(queues(&format!("http://{host_port}")), &e).await;
    assert_eq!(code, USAGE, "{err}");
    assert!(err.contains("http:// is plaintext"), "{err}");
    secure.stop().await;

    // A plaintext broker: host:port and http:// alike; LEASEQ_ADDR too.
    let plain = TestBroker::start(&db).await;
    let addr = plain.addr.to_string();
    for a in [
        addr.clone(),
        format!("http://{addr}"),
        format!("http://{addr}/"),
    ] {
        let (code, err) = run(queues(&a), &[]).await;
        assert_eq!(code, 0, "{a}: {err}");
    }
    let (code, err) = run(
        args(vec!["queues", "-o", "json"]),
        &env(&[("LEASEQ_ADDR", &addr)]),
    )
    .await;
    assert_eq!(code, 0, "LEASEQ_ADDR={addr}: {err}");
    // Addresses that cannot work: usage errors naming the address.
    for (a, why) in [
        (format!("grpc://{addr}"), "scheme"),
        ("127.0.0.1".to_owned(), "port"),
        (format!("{addr}/queues"), "only a host and a port"),
    ] {
        let (code, err) = run(queues(&a), &[]).await;
        assert_eq!(code, USAGE, "{a}: {err}");
        assert!(err.contains(why), "{a}: {err}");
    }
    plain.stop().await;
}
