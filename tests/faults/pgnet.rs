//! The network between brokers and PostgreSQL, broken under load: two
//! broker processes reach the database through a TCP proxy in this process
//! (tests/common/pgproxy.rs) that blackholes, half-opens, slows down and
//! resets their connections. The brokers run with a statement timeout of
//! 2 s (`LEASEQ_PG_STATEMENT_TIMEOUT`), so every wait of theirs on PostgreSQL is bounded by 3 s (2 s + the
//! 1 s margin; a new connection by 5 s, a ping by 2 s: store/conn.rs).
//!
//! Each test checks the history as the other fault tests do (0 lost, 0
//! acked twice, 0 lease overlap), that clients get answers (UNAVAILABLE)
//! instead of hanging while PostgreSQL cannot be reached, what health says,
//! and that work resumes within a stated bound once the network is whole.
//! docs/RELIABILITY.md has the figures.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::history::History;
use crate::common::load::*;
use crate::common::pgproxy::PgProxy;
use crate::common::*;
use tokio::time::{Instant, sleep, timeout};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

/// The brokers' `--pg-statement-timeout`.
const STATEMENT_TIMEOUT: &str = "2s";
/// The longest a call waits for its answer while PostgreSQL does not
/// answer: a statement of the broker's waits at most 8 s (a connection, the
/// acquire timeout, 5 s; the statement's bound, 3 s); a call may wait for
/// the statement of its kind already in flight (group commit: it joins the
/// next one), then for its own; and a second of slack.
const ANSWER_WITHIN: Duration = Duration::from_secs(2 * 8 + 1);

/// Two brokers whose database URL points at a proxy, and a load on them.
struct Rig {
    db: TestDb,
    proxy: PgProxy,
    reps: Vec<Replica>,
    addrs: Vec<SocketAddr>,
    h: History,
    load: Load,
}

async fn rig(test: &str, queue: &'static str) -> Rig {
    let db = TestDb::new().await;
    let proxy = PgProxy::start(&db.url).await;
    let url = proxy.url(&db.url);
    let logs = log_dir(test);
    let mut reps = Vec::new();
    for i in 0..2 {
        // The setting by its variable (LEASEQ_PG_STATEMENT_TIMEOUT), which
        // a broker without it ignores: so the same test runs against one.
        let mut r = Replica::new(i, &url, &[], logs.clone())
            .env("LEASEQ_PG_STATEMENT_TIMEOUT", STATEMENT_TIMEOUT)
            .env(
                "RUST_LOG",
                "warn,leaseq_server::server=info,leaseq_server::notify=info",
            );
        r.start().await;
        reps.push(r);
    }
    let addrs: Vec<SocketAddr> = reps.iter().map(|r| r.addr).collect();
    let h = History::new();
    let load = Load::start(&h, &addrs, queue, 4, Behaviour::default(), 100);
    wait_acked(&h, 20, Duration::from_secs(20)).await;
    assert!(
        proxy.accepted() >= 4,
        "the brokers do not go through the proxy"
    );
    Rig {
        db,
        proxy,
        reps,
        addrs,
        h,
        load,
    }
}

impl Rig {
    /// Stops the load, drains, checks the history; stops the brokers.
    async fn finish(self, name: &str, queue: &'static str) -> crate::common::history::Report {
        // The probes' jobs ([`enqueue_timed`]) are no part of the load.
        sqlx::query("delete from leaseq.jobs where queue like '%-probe'")
            .execute(&self.db.pool)
            .await
            .expect("deleting the probes' jobs");
        let report = self
            .load
            .finish(name, &self.db.pool, self.addrs[0], queue)
            .await;
        for mut r in self.reps {
            r.signal(libc::SIGTERM);
            r.wait(Duration::from_secs(15)).await;
        }
        report
    }

    /// Waits until every broker's health is `want`; returns how long that took.
    async fn all_health(&self, want: ServingStatus, limit: Duration, why: &str) -> Duration {
        let started = Instant::now();
        for (i, a) in self.addrs.iter().enumerate() {
            let left = limit.saturating_sub(started.elapsed());
            let deadline = Instant::now() + left;
            let mut seen = Vec::new();
            loop {
                let h = health(*a, "").await;
                if h == Some(want) {
                    break;
                }
                if seen.last() != Some(&h) {
                    seen.push(h);
                }
                assert!(
                    Instant::now() < deadline,
                    "broker {i} not {want:?} within {limit:?} {why}; health seen: {seen:?}"
                );
                sleep(Duration::from_millis(50)).await;
            }
        }
        started.elapsed()
    }
}

/// An Enqueue with no deadline of its own, through `addr`: how long until
/// it was answered, and with what.
async fn enqueue_timed(addr: SocketAddr, queue: &str) -> (Duration, Result<(), Code>) {
    let mut c = lazy_client(addr);
    let sent = Instant::now();
    // The test's own limit, far past every bound of the broker's: a hang.
    let r = timeout(
        Duration::from_secs(60),
        c.enqueue(job(queue, "probe-during-fault")),
    )
    .await
    .expect("an Enqueue was not answered within 60 s: the broker hangs on PostgreSQL");
    (sent.elapsed(), r.map(|_| ()).map_err(|s| s.code()))
}

/// 8. A partition between brokers and PostgreSQL (the proxy forwards
///    nothing, new connections reach nothing) for 5 s, then healed: the
///    bytes held meanwhile are delivered, as TCP would retransmit them.
///    While it lasts every broker reports NOT_SERVING (within the 2 s
///    ping's bound) and a client's call is answered UNAVAILABLE within
///    [`ANSWER_WITHIN`] instead of hanging; once healed they report SERVING
///    and acks flow again within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_blackhole_under_load() {
    let rig = rig("pg-blackhole", "hole").await;
    let f = rig.h.fault("postgres blackholed", None);
    let sent = Instant::now();
    rig.proxy.blackhole();
    let not_serving = rig
        .all_health(
            ServingStatus::NotServing,
            Duration::from_secs(5),
            "after PostgreSQL was blackholed",
        )
        .await;
    // A call that reaches PostgreSQL during the partition (a queue of its
    // own, so no lease round of the load's queue is involved).
    let (took, answer) = enqueue_timed(rig.addrs[1], "hole-probe").await;
    assert_eq!(
        answer,
        Err(Code::Unavailable),
        "an Enqueue while PostgreSQL is unreachable (answered after {took:?})"
    );
    assert!(
        took <= ANSWER_WITHIN,
        "an Enqueue during the partition took {took:?} to be answered"
    );
    let held = sent.elapsed();
    if held < Duration::from_secs(5) {
        sleep(Duration::from_secs(5) - held).await;
    }
    rig.proxy.heal();
    rig.h.healed(f);
    let healed_at = rig.h.now();
    let serving = rig
        .all_health(
            ServingStatus::Serving,
            Duration::from_secs(3),
            "after the partition healed",
        )
        .await;
    let resumed = rig
        .h
        .wait_recovered(None, healed_at, Duration::from_secs(10))
        .await;
    sleep(Duration::from_secs(2)).await;
    eprintln!(
        "FAULTS pg-blackhole: not_serving_after_s={:.2} enqueue_answered_s={:.2} \
         serving_after_heal_s={:.2} first_ack_after_heal_s={resumed:.2}",
        not_serving.as_secs_f64(),
        took.as_secs_f64(),
        serving.as_secs_f64(),
    );
    let report = rig.finish("pg-blackhole", "hole").await;
    assert!(report.faults >= 1);
}

/// 9. Half-open connections, twice under load: (a) the server vanishes
///    without a FIN for every connection the brokers hold (what they send
///    is swallowed, nothing comes back, for good), while new connections
///    work; (b) later, every connection loses its replies (statements reach
///    PostgreSQL and are done; their answers never arrive). The brokers
///    notice no error: only their bounds end the waits. Acks flow again
///    within 15 s each time (a statement's bound, 3 s; a sweep on the
///    pool's connection, acquire + bound, 8 s; the LISTEN connection's
///    check, 2.2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_half_open_under_load() {
    let rig = rig("pg-half-open", "half").await;
    let mut resumed = Vec::new();
    for (kind, cut) in [
        (
            "postgres vanished (half-open)",
            PgProxy::half_open as fn(&PgProxy) -> usize,
        ),
        ("postgres replies lost", PgProxy::lose_replies),
    ] {
        let f = rig.h.fault(kind, None);
        let at = rig.h.now();
        let n = cut(&rig.proxy);
        assert!(n >= 4, "{kind}: only {n} connections open to cut");
        // An Ack OK recorded in the first second may have been answered
        // before the cut; one after it went through a connection opened
        // since (every older one is dead for good).
        let after = at + Duration::from_secs(1);
        let took = 1.0
            + rig
                .h
                .wait_recovered(None, after, Duration::from_secs(14))
                .await;
        rig.h.healed(f);
        resumed.push(took);
        // Every broker serves again (a probe cut mid-ping reconnects).
        rig.all_health(
            ServingStatus::Serving,
            Duration::from_secs(5),
            &format!("after {kind}"),
        )
        .await;
        // A call made now is answered at once, from new connections (within
        // a ping's bound, 2 s, if it meets a dead idle one first: then all
        // idle ones are closed).
        let (took, answer) = enqueue_timed(rig.addrs[0], "half-probe").await;
        assert_eq!(answer, Ok(()), "an Enqueue after {kind}");
        assert!(
            took < Duration::from_secs(3),
            "an Enqueue after {kind} took {took:?}"
        );
        sleep(Duration::from_secs(2)).await;
    }
    eprintln!("FAULTS pg-half-open: first_ack_after_cut_s={resumed:.2?}");
    let report = rig.finish("pg-half-open", "half").await;
    assert!(report.faults >= 2);
}

/// 10. A slow network: first 150 ms more each way (every round trip 300 ms
///     slower) for 4 s, which the brokers must ride out: health stays
///     SERVING and acks keep coming; then 2.5 s each way, slower than the
///     statement bound, for 5 s: clients get UNAVAILABLE, never a hang,
///     health NOT_SERVING; healed, acks flow again within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_slow_network_under_load() {
    let rig = rig("pg-slow", "slow").await;
    let f = rig.h.fault("postgres 300 ms slower", None);
    let at = rig.h.now();
    rig.proxy.delay(Duration::from_millis(150));
    let until = Instant::now() + Duration::from_secs(4);
    let mut seen = Vec::new();
    while Instant::now() < until {
        for a in &rig.addrs {
            seen.push(health(*a, "").await);
        }
        sleep(Duration::from_millis(200)).await;
    }
    assert!(
        seen.iter().all(|h| *h == Some(ServingStatus::Serving)),
        "health with 300 ms more per round trip: {seen:?}"
    );
    let acks_slow = rig.h.wait_recovered(None, at, Duration::from_secs(4)).await;
    let errors = rig.h.errors_between(at, rig.h.now());
    assert!(
        errors.is_empty(),
        "with 300 ms more per round trip clients saw {errors:?}"
    );
    rig.proxy.delay(Duration::ZERO);
    rig.h.healed(f);

    let f = rig.h.fault("postgres 5 s slower", None);
    rig.proxy.delay(Duration::from_millis(2500));
    rig.all_health(
        ServingStatus::NotServing,
        Duration::from_secs(6),
        "with 5 s more per round trip",
    )
    .await;
    let (took, answer) = enqueue_timed(rig.addrs[0], "slow-probe").await;
    assert_eq!(
        answer,
        Err(Code::Unavailable),
        "an Enqueue at 5 s per round trip (answered after {took:?})"
    );
    assert!(
        took <= ANSWER_WITHIN,
        "an Enqueue at 5 s per round trip took {took:?}"
    );
    rig.proxy.heal();
    rig.h.healed(f);
    let healed_at = rig.h.now();
    rig.all_health(
        ServingStatus::Serving,
        Duration::from_secs(10),
        "after the network was fast again",
    )
    .await;
    let resumed = rig
        .h
        .wait_recovered(None, healed_at, Duration::from_secs(10))
        .await;
    sleep(Duration::from_secs(2)).await;
    eprintln!(
        "FAULTS pg-slow: first_ack_at_300ms_s={acks_slow:.2} enqueue_at_5s_answered_s={:.2} \
         first_ack_after_heal_s={resumed:.2}",
        took.as_secs_f64()
    );
    let report = rig.finish("pg-slow", "slow").await;
    assert!(report.faults >= 2);
}

/// 11. Every connection between brokers and PostgreSQL reset (RST) four
///     times under load, then closed (FIN) once, ~1.5 s apart: clients see
///     UNAVAILABLE at worst, and acks flow again within 5 s each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_connections_reset_under_load() {
    let rig = rig("pg-reset", "reset").await;
    let mut resumed = Vec::new();
    for round in 0..5 {
        sleep(Duration::from_millis(1500)).await;
        let (kind, n) = if round < 4 {
            ("postgres connections reset", rig.proxy.reset_all())
        } else {
            ("postgres connections closed", rig.proxy.drop_all())
        };
        let f = rig.h.fault(kind, None);
        let at = rig.h.now();
        assert!(n >= 4, "{kind}: only {n} connections open");
        rig.h.healed(f);
        resumed.push(rig.h.wait_recovered(None, at, Duration::from_secs(5)).await);
    }
    sleep(Duration::from_secs(1)).await;
    eprintln!("FAULTS pg-reset: first_ack_after_s={resumed:.2?}");
    let report = rig.finish("pg-reset", "reset").await;
    assert!(
        report.errors_not_unavailable().is_empty(),
        "a reset connection to PostgreSQL must look like an outage (UNAVAILABLE): {:?}",
        report.errors
    );
}

/// `url` with libpq keywords added.
fn with_params(url: &str, params: &[(&str, &str)]) -> String {
    let uri = url.contains("://");
    let mut out = url.to_owned();
    for (k, v) in params {
        out.push_str(if uri { "&" } else { " " });
        out.push_str(&format!("{k}={v}"));
    }
    out
}

/// The descriptors of this process's TCP sockets whose peer is `peer`.
fn sockets_to(peer: SocketAddr) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
    {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: getpeername(2) writes at most `len` bytes into `addr`.
        let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let rc =
            unsafe { libc::getpeername(fd, &mut addr as *mut _ as *mut libc::sockaddr, &mut len) };
        if rc != 0 || i32::from(addr.ss_family) != libc::AF_INET {
            continue;
        }
        // SAFETY: the family says it is a sockaddr_in.
        let sin = unsafe { &*(&addr as *const _ as *const libc::sockaddr_in) };
        let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        let port = u16::from_be(sin.sin_port);
        if SocketAddr::from((ip, port)) == peer {
            out.push(fd);
        }
    }
    out
}

/// An integer socket option of `fd`, as the kernel reports it.
fn sockopt(fd: i32, level: i32, name: i32) -> i32 {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt(2) writes at most `len` bytes into `v`.
    let rc = unsafe { libc::getsockopt(fd, level, name, &mut v as *mut _ as *mut _, &mut len) };
    assert_eq!(rc, 0, "getsockopt({fd}, {level}, {name})");
    v
}

/// (SO_KEEPALIVE, TCP_KEEPIDLE s, TCP_KEEPINTVL s, TCP_KEEPCNT,
/// TCP_USER_TIMEOUT ms) of `fd`.
fn tcp_options(fd: i32) -> (i32, i32, i32, i32, i32) {
    (
        sockopt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE),
        sockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
        sockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
        sockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
        sockopt(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
    )
}

/// 12. Every TCP connection a broker opens to PostgreSQL (the pool's, the
///     hot path's, the LISTEN one, the health probe's) has TCP keepalive
///     and TCP_USER_TIMEOUT set, as the kernel reports them: leaseq's
///     defaults (15 s idle, 5 s apart, 3 probes; 30 s) unless the
///     connection string gives libpq's keywords, which win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_sockets_have_keepalive_and_user_timeout() {
    let db = TestDb::new().await;
    let cases = [
        (vec![], (1, 15, 5, 3, 30_000)),
        (
            vec![
                ("keepalives_idle", "7"),
                ("keepalives_interval", "3"),
                ("keepalives_count", "4"),
                ("tcp_user_timeout", "9000"),
            ],
            (1, 7, 3, 4, 9000),
        ),
    ];
    for (params, want) in cases {
        let proxy = PgProxy::start(&db.url).await;
        let url = with_params(&proxy.url(&db.url), &params);
        let broker = TestBroker::on_url(&url).start().await;
        let addr = broker.addr;
        // Use the hot path, the LISTEN connection and the health probe.
        let mut c = connect(addr).await;
        let mut s = subscribe(&mut c, &["ka"], 1, None).await;
        enqueue(&mut c, "ka", "x").await;
        let d = next_delivery(&mut s, Duration::from_secs(5)).await;
        crate::common::ack(&mut c, &d).await.expect("ack");
        // The options are set just after a connection opens (pgsock.rs):
        // one the broker opens while we look (the pool's, a VACUUM's) can
        // be seen in between, so the look is repeated for a while.
        let start = std::time::Instant::now();
        loop {
            let fds = sockets_to(proxy.addr);
            // At least: the pool's, two warm hot ones, LISTEN, the probe's.
            assert!(
                fds.len() >= 5 && fds.len() as u64 <= proxy.accepted(),
                "{} sockets to the proxy, {} accepted by it",
                fds.len(),
                proxy.accepted()
            );
            let untuned: Vec<_> = fds
                .iter()
                .map(|&fd| (fd, tcp_options(fd)))
                .filter(|(_, got)| *got != want)
                .collect();
            if untuned.is_empty() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(3),
                "sockets to PostgreSQL without {want:?} ({params:?}) for 3 s: {untuned:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        broker.stop().await;
    }
}
