//! The PostgreSQL server's clock jumps forward under load: a private
//! cluster runs under libfaketime (its offset read from a file at every
//! clock call, `FAKETIME_TIMESTAMP_FILE` with `FAKETIME_NO_CACHE`; the
//! monotonic clock left true), and the test moves its clock 10 minutes
//! ahead, then an hour more, as an NTP step or a VM restored from a
//! snapshot would. Every lease then runs out at once by the database clock
//! (the one leases are counted by, docs/RELIABILITY.md): the jobs come back
//! and are delivered again, which is the contract; but no lease may be
//! given twice, no valid settle refused, no job lost. The checker knows
//! the jumps (`History::db_clock_jump`): its database clock follows them.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::history::History;
use crate::common::load::*;
use crate::common::*;
use crate::faults::pg::PrivatePg;
use sqlx::PgPool;
use tokio::time::sleep;

/// How far the database clock is ahead of this process's, in seconds (on
/// a new connection: a new backend, which reads the offset afresh).
async fn db_offset(pool: &PgPool) -> f64 {
    let db: f64 = sqlx::query_scalar("select extract(epoch from clock_timestamp())::float8")
        .fetch_one(pool)
        .await
        .expect("clock_timestamp()");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    db - now
}

/// Moves the server's clock to `total` ahead of the true one, and waits
/// until a backend sees it.
async fn jump(h: &History, spec: &std::path::Path, pool: &PgPool, total: Duration) {
    let secs = total.as_secs();
    let tmp = spec.with_extension("tmp");
    std::fs::write(&tmp, format!("+{secs}\n")).expect("writing the faketime spec");
    std::fs::rename(&tmp, spec).expect("moving the faketime spec into place");
    h.db_clock_jump(total);
    let offset = db_offset(pool).await;
    assert!(
        (offset - secs as f64).abs() < 5.0,
        "the database clock is {offset:.1}s ahead, not {secs}s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_clock_jumps_forward_under_load() {
    let pg = PrivatePg::start().await;
    let scratch = Scratch::new("pgclock");
    let spec = scratch.path("faketime.rc");
    std::fs::write(&spec, "+0\n").unwrap();
    let lib = super::libfaketime();
    pg.restart_with_env(&[
        ("LD_PRELOAD", lib.to_str().unwrap()),
        ("FAKETIME_TIMESTAMP_FILE", spec.to_str().unwrap()),
        ("FAKETIME_NO_CACHE", "1"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ]);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg.url)
        .await
        .expect("a pool on the private cluster");
    let start_offset = db_offset(&pool).await;
    assert!(
        start_offset.abs() < 5.0,
        "the database clock starts {start_offset:.1}s off"
    );

    let logs = log_dir("pgclock");
    let mut reps = Vec::new();
    for i in 0..2 {
        let mut r = Replica::new(i, &pg.url, &[], logs.clone());
        r.start().await;
        reps.push(r);
    }
    let addrs: Vec<SocketAddr> = reps.iter().map(|r| r.addr).collect();
    let h = History::new();
    let mut load = Load::start(&h, &addrs, "pgclock", 4, super::mixed(), 100);
    load.watch(&pool);
    wait_acked(&h, 20, Duration::from_secs(20)).await;

    let phase = fault_seconds();
    sleep(phase / 4).await;
    let f = h.fault("database clock +10 min", None);
    jump(&h, &spec, &pool, Duration::from_secs(600)).await;
    h.healed(f);
    let acked = h.acked_count();
    sleep(phase * 3 / 8).await;
    assert!(h.acked_count() > acked, "nothing acked after the jump");
    let f = h.fault("database clock +1 h more", None);
    jump(&h, &spec, &pool, Duration::from_secs(600 + 3600)).await;
    h.healed(f);
    sleep(phase * 3 / 8).await;
    let report = load
        .finish("postgres-clock-jump", &pool, addrs[0], "pgclock")
        .await;

    // The jumps were real for the leases: some were given under the
    // shifted clock (their end an hour or more past the true time).
    let wall0 = h.db_at(std::time::Duration::ZERO) as f64 / 1e6;
    let shifted = h
        .deliveries()
        .iter()
        .filter(|d| d.expires_us as f64 / 1e6 - (wall0 + d.t.as_secs_f64()) > 3600.0)
        .count();
    assert!(shifted > 0, "no lease was taken under the shifted clock");
    // Leases current at a jump ran out at once and came back: a job leased
    // again less than its lease (2 s) after it was leased, by the true
    // clock, and after that lease's end by the database's.
    let mut by_job: std::collections::HashMap<String, Vec<_>> = Default::default();
    for d in h.deliveries() {
        by_job.entry(d.id.clone()).or_default().push(d);
    }
    let cut_short = by_job
        .values_mut()
        .map(|ds| {
            ds.sort_by_key(|d| d.t);
            ds.windows(2)
                .filter(|w| {
                    w[1].t - w[0].t < Duration::from_millis(1900)
                        && w[1].start_us >= w[0].expires_us
                })
                .count()
        })
        .sum::<usize>();
    assert!(cut_short > 0, "no lease was ended early by a jump");
    assert!(report.consume_acks > 0, "no job acked on a Consume stream");
    assert!(
        report.errors.is_empty(),
        "only the clock moved, yet clients saw errors: {:?}",
        report.errors
    );
    eprintln!(
        "FAULTS postgres-clock-jump: leases under the shifted clock={shifted}, \
         ended early by a jump={cut_short}"
    );
    for mut r in reps {
        r.signal(libc::SIGTERM);
        let exit = r.wait(Duration::from_secs(10)).await;
        assert!(exit.success(), "replica after SIGTERM: {exit:?}");
    }
}
