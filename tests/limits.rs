//! Per-queue concurrency and rate limits (`UpdateQueue`), enforced in the
//! lease path across replicas: two brokers on one database, real gRPC, and
//! a fallback poll far beyond each test so only wake-ups can move jobs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::*;
use leaseq::pb;
use leaseq_server::Config;

const S5: Duration = Duration::from_secs(5);

fn no_poll(c: &mut Config) {
    c.poll_interval = Duration::from_secs(600);
}

async fn enqueue_n(c: &mut Client, queue: &str, n: usize) {
    c.enqueue_batch(pb::EnqueueBatchRequest {
        jobs: (0..n).map(|i| job(queue, &i.to_string())).collect(),
    })
    .await
    .expect("enqueue_batch");
}

/// When the lease was taken (database clock): expiry minus the lease asked for.
fn leased_at(d: &pb::Delivery, lease: Duration) -> f64 {
    let t = d.lease_expires_at.as_ref().expect("lease_expires_at");
    t.seconds as f64 + f64::from(t.nanos) / 1e9 - lease.as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_limit_holds_across_replicas_and_freed_slots_wake_them() {
    let db = TestDb::new().await;
    let b1 = TestBroker::on(&db).config(no_poll).start().await;
    let b2 = TestBroker::on(&db).config(no_poll).start().await;
    let s = update(&mut admin(&b1).await, |r| {
        r.queue = "lim".into();
        r.concurrency_limit = Some(3);
    })
    .await;
    assert_eq!(s.concurrency_limit, 3);
    const JOBS: usize = 30;
    enqueue_n(&mut b1.client().await, "lim", JOBS).await;

    // Each broker's consumer holds every job 40 ms, then acks it through the
    // OTHER broker: the freed slot must wake both replicas' streams.
    let holding = Arc::new(AtomicI64::new(0));
    let max_holding = Arc::new(AtomicI64::new(0));
    let acked = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let mut consumers = Vec::new();
    for (sub, ack_via) in [(&b1, &b2), (&b2, &b1)] {
        let mut stream = subscribe(&mut sub.client().await, &["lim"], 10, None).await;
        let acker = ack_via.client().await;
        let (holding, max_holding, acked, done) = (
            holding.clone(),
            max_holding.clone(),
            acked.clone(),
            done.clone(),
        );
        consumers.push(tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let Some(d) = try_next_delivery(&mut stream, Duration::from_millis(200)).await
                else {
                    continue;
                };
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                max_holding.fetch_max(now, Ordering::SeqCst);
                let mut acker = acker.clone();
                let (holding, acked) = (holding.clone(), acked.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    holding.fetch_sub(1, Ordering::SeqCst);
                    ack(&mut acker, &d).await.expect("ack");
                    acked.fetch_add(1, Ordering::SeqCst);
                });
            }
        }));
    }
    // The database's view, sampled throughout: unexpired leases of the queue.
    let sampler = {
        let url = db.url.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let pool = sqlx::PgPool::connect(&url).await.expect("sampler pool");
            let mut max = 0i64;
            while !done.load(Ordering::SeqCst) {
                let n: i64 = sqlx::query_scalar(
                    "select count(*) from leaseq.jobs where queue = 'lim' \
                     and state = 'leased' and lease_expires_at > now()",
                )
                .fetch_one(&pool)
                .await
                .expect("sample");
                max = max.max(n);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            max
        })
    };
    eventually(Duration::from_secs(60), "every job acked", || {
        let acked = acked.clone();
        async move { acked.load(Ordering::SeqCst) == JOBS }
    })
    .await;
    done.store(true, Ordering::SeqCst);
    for c in consumers {
        c.await.unwrap();
    }
    let db_max = sampler.await.unwrap();
    assert!(db_max <= 3, "the database saw {db_max} leases at once");
    assert_eq!(
        max_holding.load(Ordering::SeqCst),
        3,
        "consumers held at most, and at some point exactly, the limit"
    );
    assert_eq!(db.live_jobs().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rate_limit_spaces_starts_across_replicas() {
    let db = TestDb::new().await;
    let b1 = TestBroker::on(&db).config(no_poll).start().await;
    let b2 = TestBroker::on(&db).config(no_poll).start().await;
    let s = update(&mut admin(&b2).await, |r| {
        r.queue = "slow".into();
        r.rate_limit = Some(20.0);
        r.rate_burst = Some(2);
    })
    .await;
    assert_eq!((s.rate_limit, s.rate_burst), (20.0, 2));
    const JOBS: usize = 40;
    enqueue_n(&mut b1.client().await, "slow", JOBS).await;

    let lease = Duration::from_secs(30);
    let mut tasks = Vec::new();
    for b in [&b1, &b2] {
        let mut c = b.client().await;
        let mut stream = subscribe(&mut c, &["slow"], 50, Some(lease)).await;
        tasks.push(tokio::spawn(async move {
            let mut starts = Vec::new();
            while let Some(d) = try_next_delivery(&mut stream, Duration::from_secs(3)).await {
                starts.push(leased_at(&d, lease));
                ack(&mut c, &d).await.expect("ack");
            }
            starts
        }));
    }
    let mut starts = Vec::new();
    for t in tasks {
        starts.extend(t.await.unwrap());
    }
    assert_eq!(starts.len(), JOBS, "every job delivered, once");
    starts.sort_by(f64::total_cmp);
    // A token bucket allows at most burst + rate * w starts in any window w
    // (one extra for clock rounding between the bucket and the lease times).
    for (i, t) in starts.iter().enumerate() {
        let in_second = starts[i..].iter().take_while(|s| **s < t + 1.0).count();
        assert!(
            in_second <= 2 + 20 + 1,
            "{in_second} starts within 1 s of {t}"
        );
    }
    let span = starts[JOBS - 1] - starts[0];
    assert!(
        span >= (JOBS - 2) as f64 / 20.0 - 0.1,
        "40 jobs at 20/s with a burst of 2 took only {span:.3} s"
    );
    assert!(
        db.count("select count(*) from leaseq.jobs").await == 0,
        "all acked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_apply_to_live_streams_and_lifting_them_releases_the_backlog() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db).config(no_poll).start().await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    // The stream is there before the queue has a limit: its dispatcher
    // learns about the limit from its next lease round.
    let mut stream = subscribe(&mut c, &["flip"], 10, None).await;
    update(&mut a, |r| {
        r.queue = "flip".into();
        r.concurrency_limit = Some(1);
    })
    .await;
    enqueue_n(&mut c, "flip", 5).await;
    let first = next_delivery(&mut stream, S5).await;
    assert_quiet(&mut stream, Duration::from_millis(700), "limit 1, one held").await;
    ack(&mut c, &first).await.expect("ack");
    let second = next_delivery(&mut stream, S5).await;
    assert_quiet(&mut stream, Duration::from_millis(300), "limit 1 again").await;
    assert_eq!(db.leased_in("flip").await, 1);

    // Removing the limit lets the other three go at once, unacked.
    let s = update(&mut a, |r| {
        r.queue = "flip".into();
        r.concurrency_limit = Some(0);
    })
    .await;
    assert_eq!(s.concurrency_limit, 0);
    let rest = take(&mut stream, 3, S5).await;
    assert_eq!(db.leased_in("flip").await, 4);
    for d in rest.iter().chain([&second]) {
        ack(&mut c, d).await.expect("ack");
    }

    // The default burst is the rate rounded up; removing the rate clears it.
    let s = update(&mut a, |r| {
        r.queue = "flip".into();
        r.rate_limit = Some(2.5);
    })
    .await;
    assert_eq!((s.rate_limit, s.rate_burst), (2.5, 3));
    let s = update(&mut a, |r| {
        r.queue = "flip".into();
        r.rate_limit = Some(0.0);
    })
    .await;
    assert_eq!((s.rate_limit, s.rate_burst), (0.0, 0));
}

/// A limited round waits for the queue rows' lock (another replica's round
/// holds it); the leases it takes then begin when it leases, not when it
/// began waiting. Stamped at its transaction's start, a lease began, by its
/// expiry, before the rate bucket that allowed it was read: two replicas'
/// rounds then looked closer together than the bucket allows, and
/// `rate_limit_spaces_starts_across_replicas` failed on it under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_round_that_waited_for_the_queue_lock_leases_from_when_it_got_it() {
    let db = TestDb::new().await;
    let b = TestBroker::on(&db).config(no_poll).start().await;
    update(&mut admin(&b).await, |r| {
        r.queue = "waited".into();
        r.rate_limit = Some(100.0);
    })
    .await;
    enqueue_n(&mut b.client().await, "waited", 1).await;

    // Hold the queue row as another replica's limited round would.
    let mut side = db.pool.begin().await.unwrap();
    sqlx::query("select 1 from leaseq.queues where name = 'waited' for update")
        .execute(&mut *side)
        .await
        .unwrap();
    let lease = Duration::from_secs(30);
    let mut c = b.client().await;
    let mut stream = subscribe(&mut c, &["waited"], 1, Some(lease)).await;
    eventually(S5, "the broker's round waits for the lock", || async {
        db.lock_waiters().await == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released: f64 = sqlx::query_scalar("select extract(epoch from clock_timestamp())::float8")
        .fetch_one(&mut *side)
        .await
        .unwrap();
    side.commit().await.unwrap();

    let d = next_delivery(&mut stream, S5).await;
    let began = leased_at(&d, lease);
    assert!(
        began >= released - 0.005,
        "the lease began {:.0} ms before the round got the lock",
        (released - began) * 1000.0
    );
}

/// A job nacked with a retry_after in a queue with a concurrency limit is
/// delivered at its retry time, not at the next fallback poll: the nack's
/// wake-ups were one per queue, and a limited queue's (at once, for the
/// freed slot) replaced the retry's (found with ordered keys, issue 33).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_in_a_limited_queue_comes_at_its_time() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db).config(no_poll).start().await;
    let mut c = broker.client().await;
    let mut a = admin(&broker).await;
    update(&mut a, |r| {
        r.queue = "limretry".into();
        r.concurrency_limit = Some(2);
    })
    .await;
    enqueue(&mut c, "limretry", "r").await;
    let mut s = subscribe(&mut c, &["limretry"], 4, Some(Duration::from_secs(30))).await;
    let d = next_delivery(&mut s, S5).await;
    c.nack(pb::NackRequest {
        job_id: id_of(&d),
        lease_token: d.lease_token.clone(),
        error: "later".into(),
        retry_after: Some(dur(Duration::from_millis(800))),
        dead_letter: false,
    })
    .await
    .unwrap();
    let t = std::time::Instant::now();
    let d = next_delivery(&mut s, S5).await;
    assert_eq!(job_of(&d).attempt, 2);
    assert!(
        t.elapsed() >= Duration::from_millis(700),
        "{:?}",
        t.elapsed()
    );
}
