//! The Go module (`clients/go`) against a broker: its generated package
//! (`leaseq/v1`, committed, and checked to be what `clients/go/generate.sh`
//! makes of proto/ today: protoc with protoc-gen-go and protoc-gen-go-grpc),
//! the worker package's own tests (`go test ./worker`: handlers per queue,
//! settles on the Consume stream, graceful stop, per-key limits), and the
//! example of docs/clients.md (`clients/go/example`): a producer, then a
//! worker whose jobs succeed, fail once and come back, and dead-letter, and
//! the per-key settings of a queue shared by tenants (`example tenants`).
//!
//! No Go module proxy is reachable here, so it builds in GOPATH mode against
//! the Go packages Debian ships in /usr/share/gocode (golang-go 1.19,
//! golang-google-grpc-dev 1.33, golang-google-protobuf-dev 1.28 and
//! golang-github-golang-protobuf-1-5-dev, which grpc-go's codec needs: with
//! the 1.3 package apt picks by default it panics on APIv2 messages;
//! ./test.sh installs them); go.mod names the same versions for module mode.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use leaseq::pb;

const IMPORT: &str = "github.com/leaseq/leaseq/clients/go";

/// Runs `cmd` to its end within `limit`; its stdout, or a panic with all of
/// its output.
async fn run(mut cmd: tokio::process::Command, what: &str, limit: Duration) -> String {
    cmd.stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A GOPATH holding the example and its generated package at their import
/// paths; removed on drop.
struct GoPath(PathBuf);

impl Drop for GoPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies a directory tree (symbolic links followed).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
}

/// The `go` command in GOPATH mode: the module at its import path in
/// `gopath`, the Go packages of /usr/share/gocode.
fn go(gopath: &GoPath, args: &[&str]) -> tokio::process::Command {
    let mut go = tokio::process::Command::new("go");
    go.args(args)
        .env("GO111MODULE", "off")
        .env(
            "GOPATH",
            format!("{}:/usr/share/gocode", gopath.0.display()),
        )
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .current_dir(&gopath.0);
    go
}

/// Lays the module out at its import path (as committed: the generated
/// package is not generated here), and checks that the committed generated
/// package is what generate.sh makes of proto/ now.
async fn lay_out(gopath: &GoPath) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let module = gopath.0.join("src").join(IMPORT);
    copy_tree(&repo.join("clients/go"), &module);

    let fresh = gopath.0.join("generated");
    let mut generate = tokio::process::Command::new("bash");
    generate
        .arg(repo.join("clients/go/generate.sh"))
        .arg(&fresh);
    run(generate, "clients/go/generate.sh", Duration::from_secs(60)).await;
    let mut names: Vec<_> = std::fs::read_dir(fresh.join("leaseq/v1"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names.len(), 4, "{names:?}");
    for name in names {
        let made = std::fs::read(fresh.join("leaseq/v1").join(&name)).unwrap();
        let committed = std::fs::read(repo.join("clients/go/leaseq/v1").join(&name))
            .unwrap_or_else(|e| panic!("clients/go/leaseq/v1/{name:?} is committed: {e}"));
        assert!(
            made == committed,
            "clients/go/leaseq/v1/{name:?} is not what clients/go/generate.sh makes of proto/ now: run it and commit the result"
        );
    }
}

/// Builds the example; the binary's path.
async fn build(gopath: &GoPath) -> PathBuf {
    let bin = gopath.0.join("example-bin");
    let out = bin.to_str().unwrap().to_owned();
    let example = format!("{IMPORT}/example");
    // The first build compiles grpc-go (later ones hit the build cache).
    run(
        go(gopath, &["build", "-o", &out, &example]),
        "go build",
        Duration::from_secs(600),
    )
    .await;
    bin
}

#[tokio::test]
async fn the_go_worker_package_passes_its_tests_against_a_broker() {
    let gopath = GoPath(scratch_path("go-worker"));
    lay_out(&gopath).await;
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let package = format!("{IMPORT}/worker");
    let mut test = go(&gopath, &["test", "-v", "-count=1", &package]);
    test.env("LEASEQ_ADDR", broker.addr.to_string());
    let out = run(test, "go test ./worker", Duration::from_secs(600)).await;
    for name in [
        "TestHandlersPerQueueSettleTheirJobs",
        "TestGracefulStopFinishesRunningJobsAndReleasesTheRest",
        "TestPerKeyLimitsHoldWhateverTheWorkersConcurrency",
    ] {
        assert!(out.contains(&format!("--- PASS: {name}")), "{out}");
    }
    assert!(!out.contains("--- SKIP"), "{out}");
    broker.stop().await;
}

#[tokio::test]
async fn the_go_example_produces_and_works_jobs_against_a_broker() {
    let gopath = GoPath(scratch_path("go-example"));
    lay_out(&gopath).await;
    let bin = build(&gopath).await;

    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let queue = format!("go-{}", uuid::Uuid::new_v4().simple());
    let example = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.args(args).env("LEASEQ_ADDR", broker.addr.to_string());
        cmd
    };

    let produced = run(
        example(&["produce", &queue, "hello", "fail:boom", "dead:bad input"]),
        "example produce",
        Duration::from_secs(30),
    )
    .await;
    let ids: Vec<&str> = produced
        .lines()
        .filter_map(|l| l.strip_prefix("enqueued "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(ids.len(), 3, "{produced}");
    assert_eq!(db.live_jobs().await, 3);

    // Four settles: hello acked, fail:boom nacked then acked on its second
    // attempt, dead:bad dead-lettered; then -count stops the worker.
    let worked = run(
        example(&[
            "work",
            &queue,
            "-concurrency",
            "2",
            "-lease",
            "5s",
            "-count",
            "4",
        ]),
        "example work",
        Duration::from_secs(60),
    )
    .await;
    let mut lines: Vec<&str> = worked.lines().collect();
    lines.sort();
    let want = {
        let mut w = vec![
            format!("failed {} dead:bad input attempt=1", ids[2]),
            format!("failed {} fail:boom attempt=1", ids[1]),
            format!("handled {} fail:boom attempt=2", ids[1]),
            format!("handled {} hello attempt=1", ids[0]),
        ];
        w.sort();
        w
    };
    assert_eq!(lines, want, "{worked}");
    assert_eq!(db.live_jobs().await, 0, "every job settled");
    let dead = db.dead_row(ids[2]).await.expect("a dead letter");
    assert!(
        dead.2.as_deref().unwrap_or_default().contains("bad input"),
        "{dead:?}"
    );
    tenants(&bin, &broker).await;
    address_forms(&bin, &db, &broker).await;
    broker.stop().await;
}

/// `example tenants QUEUE` (docs/clients.md, "Keys inside a queue"): the
/// per-key settings set through the generated AdminService client, as the
/// broker reports them, to the example and to GetQueue.
async fn tenants(bin: &Path, broker: &TestBroker) {
    let queue = format!("go-{}", uuid::Uuid::new_v4().simple());
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(["tenants", &queue])
        .env("LEASEQ_ADDR", broker.addr.to_string());
    let out = run(cmd, "example tenants", Duration::from_secs(30)).await;
    assert_eq!(
        out.trim(),
        format!("{queue} fair_by_key=true key_concurrency=2 enterprise-7:concurrency=10,weight=5")
    );
    let s = admin(broker)
        .await
        .get_queue(pb::GetQueueRequest {
            queue: queue.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .settings
        .unwrap();
    assert_eq!(
        (s.fair_by_key, s.key_concurrency, s.ordered_by_key),
        (true, 2, false)
    );
    assert_eq!(
        s.key_overrides,
        [pb::KeyOverride {
            key: "enterprise-7".into(),
            concurrency: 10,
            rate_limit: 0.0,
            weight: 5,
        }]
    );
}

/// Runs `cmd`; (exit status success, stdout and stderr).
async fn outcome(mut cmd: tokio::process::Command) -> (bool, String) {
    cmd.stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the example finishes within 30s")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The address forms and TLS settings every leaseq client takes, in the
/// example's `dial`: `http://` to the plaintext broker; `https://` to a TLS
/// broker verified against the system's roots (`SSL_CERT_FILE` holding its
/// CA: works; another CA: refused), and `host:port` with `LEASEQ_TLS_CA`.
async fn address_forms(bin: &Path, db: &TestDb, plain: &TestBroker) {
    let pki = Pki::new();
    let (ca_pem, other_pem) = (&pki.ca, &pki.rogue_ca);
    let secure = TestBroker::on(db).tls(&pki).spawn().await;
    let queue = format!("go-{}", uuid::Uuid::new_v4().simple());
    let produce = |vars: &[(&str, String)]| {
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args(["produce", &queue, "x"])
            .env_remove("LEASEQ_TLS_CA")
            .env_remove("LEASEQ_CLIENT_CERT")
            .env_remove("LEASEQ_CLIENT_KEY")
            .env_remove("LEASEQ_TOKEN")
            .env_remove("SSL_CERT_DIR");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd
    };
    let https = format!("https://{}", secure.addr);
    let trusted = [
        ("LEASEQ_ADDR", https.clone()),
        ("SSL_CERT_FILE", ca_pem.display().to_string()),
    ];
    // The TLS broker is up once the system's roots get a job through.
    let started = std::time::Instant::now();
    loop {
        let (ok, out) = outcome(produce(&trusted)).await;
        if ok {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "https:// with the CA in the system's roots: {out}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (ok, out) = outcome(produce(&[
        ("LEASEQ_ADDR", https.clone()),
        ("SSL_CERT_FILE", other_pem.display().to_string()),
    ]))
    .await;
    assert!(!ok, "another CA in the system's roots must fail: {out}");
    let (ok, out) = outcome(produce(&[
        ("LEASEQ_ADDR", secure.addr.to_string()),
        ("LEASEQ_TLS_CA", ca_pem.display().to_string()),
        ("SSL_CERT_FILE", other_pem.display().to_string()),
    ]))
    .await;
    assert!(ok, "host:port with LEASEQ_TLS_CA: {out}");
    let (ok, out) = outcome(produce(&[(
        "LEASEQ_ADDR",
        format!("http://{}", plain.addr),
    )]))
    .await;
    assert!(ok, "http:// to the plaintext broker: {out}");
    let (ok, out) = outcome(produce(&[
        ("LEASEQ_ADDR", format!("http://{}", plain.addr)),
        ("LEASEQ_TLS_CA", ca_pem.display().to_string()),
    ]))
    .await;
    assert!(!ok && out.contains("http:// is plaintext"), "{out}");
    assert_eq!(
        db.live_jobs().await,
        3,
        "three produced: two over TLS, one plaintext"
    );
    secure.stop().await;
}
