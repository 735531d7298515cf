//! The broker's own timings under load, with the strict checker: the
//! shortest fallback poll with the longest ack linger (the settings of case
//! 1 of issue 32: a lingering stream ack released by the poll's sweep), and
//! handlers that work for longer than their lease and than several polls,
//! keeping their leases with ExtendLease.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::history::{History, Op};
use crate::common::load::*;
use crate::common::slow::{Slow, slow_consumer};
use crate::common::*;

/// `--poll-interval 300ms --ack-linger 1s` (both allowed settings) on two
/// replicas, every consumer on a Consume stream with its acks and nacks on
/// the stream (each answered, `confirm_settles`), a backlog older than the
/// sweep's bound (a second) so that the sweep of "leases no stream holds"
/// lists the jobs whose acks linger. A valid ack refused, or a job
/// delivered again while its ack lingered, is an anomaly of the checker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_poll_and_long_linger_under_load() {
    let db = TestDb::new().await;
    let settings = ["--poll-interval", "300ms", "--ack-linger", "1s"];
    let reps = super::start_replicas(&db.url, 2, &settings, "linger").await;
    let addrs: Vec<SocketAddr> = reps.iter().map(|r| r.addr).collect();
    let h = History::new();
    // Each consumer handles its deliveries one at a time, awaiting each
    // settle's answer (up to the linger): the backlog grows, and a lease
    // long enough for a stream's credit's worth of lingering acks keeps
    // expiries out of the picture.
    let behaviour = Behaviour {
        protocol: Protocol::Consume,
        credit: 16,
        lease: Duration::from_secs(20),
        ..Behaviour::default()
    };
    let mut load = Load::start(&h, &addrs, "linger", 6, behaviour, 40);
    load.watch(&db.pool);
    wait_acked(&h, 20, Duration::from_secs(20)).await;
    tokio::time::sleep(fault_seconds()).await;
    let report = load
        .finish("short-poll-long-linger", &db.pool, addrs[0], "linger")
        .await;
    assert!(report.consume_acks > 0, "no job acked on a Consume stream");
    // The acks did linger: some answers waited most of a second.
    let waited = h
        .settle_times(Op::Ack)
        .iter()
        .filter(|t| t.2)
        .map(|t| t.1)
        .max()
        .unwrap_or_default();
    assert!(
        waited >= Duration::from_millis(500),
        "no stream ack lingered (longest answer {waited:?})"
    );
    eprintln!("FAULTS short-poll-long-linger: longest lingering ack answer {waited:.2?}");
    drop(reps);
}

/// Handlers that take 0.3 to 2.5 s against a 1 s lease (and a 300 ms
/// fallback poll), extending by 1 s every 300 ms, on eight consumers (half
/// on Consume, extending on the stream) of two replicas; 5 % of handlers
/// die mid-work and their jobs come back when the lease they last extended
/// runs out. An extended lease taken by another stream before its extended
/// end is a lease overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handlers_extend_their_leases_under_load() {
    let db = TestDb::new().await;
    let reps = super::start_replicas(&db.url, 2, &["--poll-interval", "300ms"], "extend").await;
    let addrs: Vec<SocketAddr> = reps.iter().map(|r| r.addr).collect();
    let h = History::new();
    let mut load = Load::consumers_only(&h, &addrs, "slow", 0, Behaviour::default());
    for i in 0..8 {
        let slow = Slow {
            lease: Duration::from_secs(1),
            credit: 4,
            work: (Duration::from_millis(300), Duration::from_millis(2500)),
            extend_every: Duration::from_millis(300),
            die: 0.05,
            nack: 0.03,
            consume: i % 2 == 1,
        };
        load.consume(slow_consumer(
            h.clone(),
            addrs.clone(),
            i % addrs.len(),
            "slow",
            slow,
            i as u64 + 1,
            load.consumers_stop(),
        ));
    }
    let max = (fault_seconds().as_secs_f64() * 15.0 * 2.0) as usize;
    for prefix in ["pa", "pb"] {
        let stop = load.producers_stop();
        load.produce(producer(
            h.clone(),
            addrs.clone(),
            "slow",
            prefix,
            max / 2,
            Duration::from_secs_f64(2.0 / 15.0),
            stop,
        ));
    }
    load.watch(&db.pool);
    wait_acked(&h, 20, Duration::from_secs(30)).await;
    tokio::time::sleep(fault_seconds()).await;
    let report = load
        .finish("slow-handlers-extend", &db.pool, addrs[0], "slow")
        .await;
    assert!(report.extends > 0, "no lease was extended");
    assert!(report.dup_expiry > 0, "no dead handler's job came back");
    // Jobs were held past their lease and acked OK, on both protocols.
    let held: Vec<(Duration, bool)> = h
        .settle_times(Op::Ack)
        .into_iter()
        .map(|t| (t.0, t.2))
        .collect();
    for consume in [false, true] {
        let longest = held
            .iter()
            .filter(|t| t.1 == consume)
            .map(|t| t.0)
            .max()
            .unwrap_or_default();
        assert!(
            longest > Duration::from_millis(1500),
            "no job held past its lease and acked (Consume: {consume}): {longest:?}"
        );
    }
    drop(reps);
}
