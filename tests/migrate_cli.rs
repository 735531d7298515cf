//! `leaseq migrate` as the real binary: it refuses to guess a database,
//! `migrate status` says what a database applied, `migrate --print` prints
//! SQL that brings a database to the same state `migrate` does, and both
//! speak `-o json`. Also `-o json` of `placement` and `bench`, the other
//! commands that print.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::common::*;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        assert_eq!(self.code, 0, "stderr: {}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not one JSON document ({e}): {}", self.stdout))
    }
}

/// `leaseq ARGS` with only `env` (and PATH) in its environment: no
/// DATABASE_URL, PG* or LEASEQ_* from outside.
async fn leaseq(args: &[&str], env: &[(&str, &str)]) -> Out {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("finishes within 60s")
    .expect("runs");
    Out {
        code: out.status.code().expect("exited"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A new database with nothing in it, on the suite's cluster (named as test
/// databases are, so a run that dies leaves nothing behind for long).
async fn empty_database(db: &TestDb) -> String {
    let name = format!(
        "t_{}_{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let admin = sqlx::PgPool::connect(&with_database(&db.url, "postgres"))
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("create database {name}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    with_database(&db.url, &name)
}

fn states(status: &Value) -> Vec<(i64, String)> {
    status
        .as_array()
        .expect("an array")
        .iter()
        .map(|m| {
            (
                m["version"].as_i64().unwrap(),
                m["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn versions() -> Vec<i64> {
    leaseq_server::store::MIGRATOR
        .iter()
        .map(|m| m.version)
        .collect()
}

#[tokio::test]
async fn migrate_names_its_database_prints_its_sql_and_reports_status() {
    // No database named: it refuses (it used to migrate the embedded
    // cluster under ~/.local/share or /var/lib/leaseq).
    let home = Scratch::new("migrate-home");
    let home_dir = home.dir().to_str().unwrap();
    for args in [
        &["migrate"][..],
        &["migrate", "status"],
        &["migrate", "--print"],
    ] {
        let out = leaseq(args, &[("HOME", home_dir)]).await;
        assert_eq!(out.code, 1, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("which database?") && out.stderr.contains("DATABASE_URL"),
            "{args:?}: {}",
            out.stderr
        );
    }
    assert_eq!(
        std::fs::read_dir(home.dir()).unwrap().count(),
        0,
        "no embedded cluster was made"
    );
    // --print --all needs none: every migration.
    let all = leaseq(&["migrate", "--print", "--all"], &[]).await;
    assert_eq!(all.code, 0, "{}", all.stderr);
    for v in versions() {
        assert!(all.stdout.contains(&format!("\n-- {v} ")), "{v}");
    }

    let db = TestDb::new().await;
    let url = empty_database(&db).await;
    let env = [("DATABASE_URL", url.as_str())];
    let status = leaseq(&["migrate", "status", "-o", "json"], &env)
        .await
        .json();
    assert!(
        states(&status).iter().all(|(_, s)| s == "pending"),
        "{status}"
    );
    assert_eq!(
        states(&status).iter().map(|m| m.0).collect::<Vec<_>>(),
        versions()
    );

    // The printed SQL, run as a DBA would run it, is what `migrate` does:
    // afterwards every migration counts as applied, with sqlx's checksums.
    let print = leaseq(&["migrate", "--print"], &env).await;
    assert_eq!(print.code, 0, "{}", print.stderr);
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(print.stdout.clone()))
        .execute(&pool)
        .await
        .unwrap_or_else(|e| panic!("the printed SQL runs: {e}\n{}", print.stdout));
    let status = leaseq(&["migrate", "status", "-o", "json"], &env)
        .await
        .json();
    assert!(
        states(&status).iter().all(|(_, s)| s == "applied"),
        "{status}"
    );
    let applied = leaseq(&["migrate", "-o", "json"], &env).await.json();
    assert_eq!(
        applied["applied"],
        Value::Array(vec![]),
        "nothing left: {applied}"
    );
    let again = leaseq(&["migrate", "--print"], &env).await;
    assert!(
        again
            .stdout
            .contains("0 migration(s) this database has not applied"),
        "{}",
        again.stdout
    );

    // A migration changed after it was applied: status says which, exit 1.
    let last = *versions().last().unwrap();
    sqlx::query("update leaseq._sqlx_migrations set checksum = '\\x00' where version = $1")
        .bind(last)
        .execute(&pool)
        .await
        .unwrap();
    let changed = leaseq(&["migrate", "status"], &env).await;
    assert_eq!(changed.code, 1, "{}", changed.stderr);
    assert!(
        changed.stdout.contains("changed") && changed.stderr.contains(&format!("{last} (changed)")),
        "{}\n{}",
        changed.stdout,
        changed.stderr
    );
    pool.close().await;

    // `migrate` on a fresh database applies every migration.
    let fresh = empty_database(&db).await;
    let applied = leaseq(&["migrate", "-o", "json"], &[("DATABASE_URL", &fresh)])
        .await
        .json();
    let got: Vec<i64> = applied["applied"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(got, versions());
    let table = leaseq(&["migrate"], &[("DATABASE_URL", &fresh)]).await;
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(table.stdout.starts_with("up to date"), "{}", table.stdout);
}

#[tokio::test]
async fn placement_prints_json() {
    let home = TestDb::new().await;
    let other = TestDb::new().await;
    let a = format!("main={}", home.url);
    let b = format!("b={}", other.url);
    let dbs = ["--database-url", &a, "--database-url", &b];
    let run = async |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&dbs);
        all.extend_from_slice(&["-o", "json"]);
        leaseq(&all, &[]).await.json()
    };
    let show = run(&["placement", "show"]).await;
    let clusters = show["clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 2, "{show}");
    assert_eq!(clusters[0]["name"], "main");
    let buckets: u64 = clusters
        .iter()
        .map(|c| c["buckets"].as_u64().unwrap())
        .sum();
    assert_eq!(buckets, 1024, "{show}");
    // Bucket 0 is on the home cluster under the first map (b mod 2).
    let bucket = 0;
    let moved = run(&[
        "placement",
        "move",
        "--bucket",
        &bucket.to_string(),
        "--to",
        "b",
    ])
    .await;
    assert_eq!(
        (&moved["bucket"], &moved["to"]),
        (&Value::from(bucket), &Value::from("b"))
    );
    let pinned = run(&["placement", "pin", "pay*", "b"]).await;
    assert_eq!(pinned["cluster"], "b");
    let show = run(&["placement", "show"]).await;
    assert_eq!(show["pins"][0]["pattern"], "pay*", "{show}");
    assert!(show["epoch"].as_i64().unwrap() > 0, "{show}");

    // On a terminal (util-linux `script` gives it one) a move shows its
    // progress while it runs (here: its grace period, nothing to copy).
    let mut argv = vec![env!("CARGO_BIN_EXE_leaseq").to_owned()];
    argv.extend(
        ["placement", "move", "--bucket", "2", "--to", "b"]
            .iter()
            .chain(dbs.iter())
            .map(|a| a.to_string()),
    );
    let command = argv
        .iter()
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ");
    let out = tokio::process::Command::new("script")
        .args(["--quiet", "--return", "--command", &command, "/dev/null"])
        .env("TERM", "xterm")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("script (util-linux) runs");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("moving bucket 2 to b"), "{shown}");
    assert!(shown.contains("bucket 2 moved to b"), "{shown}");
}

#[tokio::test]
async fn bench_prints_its_summary_alone_with_output_json() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let out = leaseq(
        &[
            "bench",
            "--addr",
            &broker.url(),
            "--scenario",
            "ping",
            "--rate",
            "50",
            "--duration",
            "1",
            "--warmup",
            "0",
            "-o",
            "json",
        ],
        &[],
    )
    .await;
    let summary = out.json();
    assert_eq!(summary["scenario"], "Ping", "{summary}");
    assert!(summary["jobs"].as_u64().unwrap() > 0, "{summary}");
    // The result lines went to stderr.
    assert!(out.stderr.contains("scenario=Ping"), "{}", out.stderr);
}
