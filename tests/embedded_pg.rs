//! The embedded cluster on its own: start in a fresh directory, query, reuse
//! from a second `start`, stop, start again after the stop, report a server
//! that cannot start; concurrent starts; a directory only the caller can
//! enter (refused as root, whose server runs as `postgres`; used by anyone
//! else).

use std::path::{Path, PathBuf};
use std::time::Duration;

use leaseq::embedded::{EmbeddedError, EmbeddedOptions, EmbeddedPostgres};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

fn postmaster_pid(dir: &Path) -> Option<i32> {
    std::fs::read_to_string(dir.join("data/postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

async fn select_one(pg: &EmbeddedPostgres) {
    let mut conn = PgConnection::connect(&pg.url("leaseq"))
        .await
        .expect("connect to database leaseq");
    let one: i32 = sqlx::query_scalar("select 1")
        .fetch_one(&mut conn)
        .await
        .expect("select 1");
    assert_eq!(one, 1);
    conn.close().await.expect("close");
}

#[tokio::test]
async fn start_reuse_stop_restart() {
    let dir = fresh_dir("basic");
    let opts = EmbeddedOptions {
        dir: dir.clone(),
        durable: false,
    };

    let first = EmbeddedPostgres::start(opts.clone())
        .await
        .expect("first start");
    assert!(
        first.started_here(),
        "a fresh directory must start a server"
    );
    assert!(first.socket_dir().join(".s.PGSQL.5432").exists());
    let pid = postmaster_pid(&dir).expect("postmaster.pid after start");
    assert!(alive(pid));
    select_one(&first).await;

    let second = EmbeddedPostgres::start(opts.clone())
        .await
        .expect("second start");
    assert!(!second.started_here(), "the running server must be reused");
    assert_eq!(postmaster_pid(&dir), Some(pid));
    select_one(&second).await;
    drop(second);

    first.stop().await.expect("stop");
    assert!(!alive(pid), "postmaster {pid} still running after stop");
    assert_eq!(postmaster_pid(&dir), None, "postmaster.pid left behind");

    // A stopped cluster starts again, without initdb.
    let third = EmbeddedPostgres::start(opts.clone())
        .await
        .expect("restart");
    assert!(third.started_here());
    let pid3 = postmaster_pid(&dir).expect("postmaster.pid after restart");
    select_one(&third).await;
    third.stop().await.expect("stop again");
    assert!(!alive(pid3));

    // A server that cannot start is reported at once, with its log.
    let conf = dir.join("data/postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).expect("reading postgresql.conf");
    text.push_str("\nleaseq_no_such_setting = 1\n");
    std::fs::write(&conf, text).expect("writing postgresql.conf");
    let started = std::time::Instant::now();
    let err = EmbeddedPostgres::start(opts)
        .await
        .expect_err("a broken configuration must fail");
    let msg = err.to_string();
    assert!(matches!(err, EmbeddedError::Start { .. }), "{msg}");
    assert!(msg.contains("leaseq_no_such_setting"), "{msg}");
    assert!(started.elapsed() < Duration::from_secs(20), "{msg}");

    std::fs::remove_dir_all(&dir).expect("removing the cluster directory");
}

/// A new cluster directory under the system temp dir, never under the
/// checkout: as root the server runs as `postgres`, which must be able to
/// enter every directory above it, and a checkout may live where only root
/// can (a 0700 home or `mktemp -d`).
fn fresh_dir(tag: &str) -> PathBuf {
    crate::common::scratch_path(&format!("embedded-pg-{tag}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_starts_share_one_server() {
    let dir = fresh_dir("race");
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let opts = EmbeddedOptions {
                dir: dir.clone(),
                durable: false,
            };
            tokio::spawn(EmbeddedPostgres::start(opts))
        })
        .collect();
    let mut handles = Vec::new();
    for start in starts {
        handles.push(start.await.expect("join").expect("start"));
    }
    let started: Vec<_> = handles.iter().filter(|pg| pg.started_here()).collect();
    assert_eq!(started.len(), 1, "exactly one start runs the server");
    for pg in &handles {
        select_one(pg).await;
    }
    let pid = postmaster_pid(&dir).expect("postmaster.pid");
    let owner = handles
        .into_iter()
        .find(EmbeddedPostgres::started_here)
        .expect("the starter");
    owner.stop().await.expect("stop");
    assert!(!alive(pid));
    std::fs::remove_dir_all(&dir).expect("removing the cluster directory");
}

/// A cluster directory inside one only its owner can enter (mode 0700, like
/// a home directory or `mktemp -d`). As root the server runs as `postgres`,
/// which could not reach it: `start` refuses it up front, naming the blocking
/// directory and `LEASEQ_DATA_DIR`, instead of failing inside initdb. As any
/// other user the server runs as that user, and the same directory is fine:
/// the check must not refuse it. (CI runs the root case; a developer's
/// `./test.sh` as themselves runs the other.)
#[tokio::test]
async fn a_directory_only_its_owner_can_enter_is_refused_as_root_and_used_otherwise() {
    use std::os::unix::fs::PermissionsExt;
    let locked = fresh_dir("locked");
    std::fs::create_dir_all(&locked).expect("mkdir");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let opts = EmbeddedOptions {
        dir: locked.join("pg"),
        durable: false,
    };
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    eprintln!(
        "running as {}: the {} case",
        if root { "root" } else { "a normal user" },
        if root { "refusal" } else { "acceptance" }
    );
    if root {
        let err = EmbeddedPostgres::start(opts)
            .await
            .expect_err("an unreachable directory must be refused");
        let msg = err.to_string();
        match &err {
            EmbeddedError::Unreachable { blocked, .. } => assert_eq!(blocked, &locked, "{msg}"),
            other => panic!("expected Unreachable, got: {other}"),
        }
        assert!(msg.contains("LEASEQ_DATA_DIR"), "{msg}");
    } else {
        let pg = EmbeddedPostgres::start(opts)
            .await
            .expect("a directory of our own, mode 0700, must be usable");
        assert!(pg.started_here());
        select_one(&pg).await;
        let pid = postmaster_pid(&locked.join("pg")).expect("postmaster.pid");
        pg.stop().await.expect("stop");
        assert!(!alive(pid));
    }
    std::fs::remove_dir_all(&locked).expect("removing the directory");
}
