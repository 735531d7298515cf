//! A frozen replica: one of three brokers stopped with SIGSTOP for longer
//! than a lease (3 s against 2 s leases) while the others run, then
//! continued with SIGCONT, in turn, under load. As a VM paused by its host,
//! a process stalled by swapping or a long garbage-collection pause would:
//! its TCP connections stay open, its clients wait, and when it runs again
//! its timers are late and what it held in memory is stale. Its leases run
//! out while it sleeps and its jobs go to the other replicas' streams; once
//! it runs again it must not deliver a job whose lease it lost, nor accept a
//! settle of one, and its streams must receive again.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::history::History;
use crate::common::load::*;
use crate::common::*;
use tokio::time::{Instant, sleep};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_replica_under_load() {
    let db = TestDb::new().await;
    let mut reps = super::start_replicas(&db.url, 3, &[], "frozen").await;
    let addrs: Vec<SocketAddr> = reps.iter().map(|r| r.addr).collect();
    let h = History::new();
    let mut load = Load::start(&h, &addrs, "frozen", 6, super::mixed(), 150);
    load.watch(&db.pool);
    wait_acked(&h, 20, Duration::from_secs(20)).await;

    let until = Instant::now() + fault_seconds();
    let mut victim = 0;
    let mut freezes = 0;
    let mut recovered = Vec::new();
    while Instant::now() < until {
        sleep(Duration::from_millis(1500)).await;
        let f = h.fault("SIGSTOP 3 s", Some(victim));
        reps[victim].signal(libc::SIGSTOP);
        sleep(Duration::from_secs(3)).await;
        reps[victim].signal(libc::SIGCONT);
        h.healed(f);
        freezes += 1;
        // It serves again: an Ack through it succeeds.
        let took = h
            .wait_recovered(Some(victim), h.now(), Duration::from_secs(15))
            .await;
        recovered.push(took);
        victim = (victim + 1) % reps.len();
    }
    let report = load
        .finish("frozen-replica", &db.pool, addrs[0], "frozen")
        .await;
    eprintln!("FAULTS frozen-replica: freezes={freezes} first_ack_after_sigcont_s={recovered:.2?}");
    assert!(freezes >= 2, "only {freezes} freezes");
    // The frozen replicas' leases ran out and their jobs came back.
    assert!(report.dup_expiry > 0, "no job came back by expiry");
    assert!(report.consume_acks > 0, "no job acked on a Consume stream");
    // No stream of a replica that was running failed.
    let failed = h.unexplained_stream_failures();
    assert!(failed.is_empty(), "streams failed: {failed:#?}");
    for r in &mut reps {
        r.signal(libc::SIGTERM);
        let exit = r.wait(Duration::from_secs(10)).await;
        assert!(
            exit.success(),
            "replica {} after SIGTERM: {exit:?}",
            r.index
        );
    }
}
