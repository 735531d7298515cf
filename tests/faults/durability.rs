//! The broker's startup warning about PostgreSQL settings that lose
//! committed work in a crash (`fsync`, `synchronous_commit`,
//! `full_page_writes` off), read from the real binary's log.

use std::time::Duration;

use crate::common::load::{Replica, log_dir};
use crate::common::*;

use super::pg::PrivatePg;

/// What the broker's log says about each setting.
fn warned(log: &str, setting: &str) -> bool {
    log.lines()
        .any(|l| l.contains("WARN") && l.contains(&format!("PostgreSQL runs with {setting} = off")))
}

/// Starts the binary on `url`, stops it, returns its log (warnings and up).
async fn broker_log(url: &str, test: &str, index: usize) -> String {
    let logs = log_dir(test);
    let mut r = Replica::new(index, url, &[], logs.clone());
    r.start().await;
    r.signal(libc::SIGTERM);
    r.wait(Duration::from_secs(15)).await;
    std::fs::read_to_string(logs.join(format!("broker{index}-1.log"))).expect("broker log")
}

/// A durable cluster: no warning. The same cluster with `synchronous_commit
/// = off` for the broker's database (ALTER DATABASE: the session's value is
/// what counts): that one warning. The shared test cluster, which runs with
/// all three off for speed: three warnings, each saying what it risks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_warns_when_postgres_is_not_durable() {
    let pg = PrivatePg::start().await;
    let log = broker_log(&pg.url, "durability", 0).await;
    for s in ["fsync", "synchronous_commit", "full_page_writes"] {
        assert!(
            !warned(&log, s),
            "warned of {s} on a durable cluster:\n{log}"
        );
    }

    let admin = sqlx::PgPool::connect(&pg.url).await.expect("admin");
    sqlx::query("alter database leaseq set synchronous_commit = off")
        .execute(&admin)
        .await
        .expect("alter database");
    admin.close().await;
    let log = broker_log(&pg.url, "durability", 1).await;
    assert!(warned(&log, "synchronous_commit"), "{log}");
    assert!(
        log.contains("can lose its last commits") && log.contains("acked jobs"),
        "the warning says what is at risk:\n{log}"
    );
    assert!(
        !warned(&log, "fsync") && !warned(&log, "full_page_writes"),
        "{log}"
    );

    // The shared test cluster (embedded, non-durable) runs with all three
    // off; a DATABASE_URL given to the suite may not.
    let db = TestDb::new().await;
    let off: Vec<String> = sqlx::query_scalar(
        "select name from pg_settings
         where name in ('fsync', 'synchronous_commit', 'full_page_writes') and setting = 'off'",
    )
    .fetch_all(&db.pool)
    .await
    .expect("settings");
    let log = broker_log(&db.url, "durability", 2).await;
    for s in ["fsync", "synchronous_commit", "full_page_writes"] {
        assert_eq!(
            warned(&log, s),
            off.iter().any(|o| o == s),
            "{s} (off here: {off:?}):\n{log}"
        );
    }
    if off.iter().any(|o| o == "fsync") {
        assert!(log.contains("corrupt the database"), "{log}");
    }
}
