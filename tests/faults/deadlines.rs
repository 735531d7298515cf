//! Client deadlines and cancellations on every RPC of the queue service,
//! under load, with the strict checker. Every production gRPC client sets
//! deadlines, and every database is sometimes slow: here impatient clients
//! call Enqueue, EnqueueBatch, Ack, Nack, ExtendLease, and open Produce
//! (three jobs each), Subscribe and Consume streams, each call either with a deadline of 1 to 300 ms
//! (`grpc-timeout`, which the broker enforces as well) or cancelled by the
//! client dropping it after as long (an HTTP/2 reset the broker sees), and
//! drop their streams after up to 1.5 s; meanwhile the jobs table is
//! locked (`lock table leaseq.jobs in share mode`) for 400 ms every second,
//! so that many of those calls end while their statement waits. Ordinary
//! consumers and producers run beside them: nothing may be lost or settled
//! twice, no lease may overlap, no valid settle may be refused, and no
//! stream may be left without deliveries while jobs wait (case 2 of issue
//! 32 was a stream left so by one Enqueue cancelled mid-statement).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::history::{History, Op, ts_us};
use crate::common::load::*;
use crate::common::*;
use leaseq::pb;
use leaseq::pb::consume_response::Kind as ConsumeKind;
use leaseq::pb::subscribe_response::Kind;
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, timeout};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Status};

const QUEUE: &str = "impatient";

/// How a call ends early: a deadline (`grpc-timeout`, and the client's own
/// timer), or the client dropping the call after this long.
#[derive(Clone, Copy, Debug)]
enum Cut {
    Deadline(Duration),
    Cancel(Duration),
}

impl Cut {
    /// 1 to 300 ms, a deadline or a cancellation at even odds.
    fn random(rng: &mut Rng) -> Cut {
        Cut::between(rng, 1.0, 300.0)
    }

    /// `from` to `to` ms (log-uniform: as many under 10 ms as over, whatever
    /// the load), a deadline or a cancellation at even odds.
    fn between(rng: &mut Rng, from: f64, to: f64) -> Cut {
        let ms = from * (to / from).powf(rng.next_f64());
        let d = Duration::from_secs_f64(ms / 1000.0);
        if rng.next_f64() < 0.5 {
            Cut::Deadline(d)
        } else {
            Cut::Cancel(d)
        }
    }

    fn request<T>(self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        if let Cut::Deadline(d) = self {
            r.set_timeout(d);
        }
        r
    }

    /// Runs the call, dropping it at a cancellation's time (a deadline's
    /// call ends by its deadline; 10 s more is a hang).
    async fn run<T>(self, call: impl Future<Output = Result<T, Status>>) -> Result<T, Status> {
        let limit = match self {
            Cut::Deadline(d) => d + Duration::from_secs(10),
            Cut::Cancel(d) => d,
        };
        match timeout(limit, call).await {
            Ok(r) => r,
            Err(_) if matches!(self, Cut::Cancel(_)) => {
                Err(Status::cancelled("dropped by the client"))
            }
            Err(_) => panic!("a call with a deadline hung 10 s past it"),
        }
    }
}

/// Per RPC: how its calls ended, and how many were cut while the jobs
/// table was locked (their statement, if they had one, was waiting).
#[derive(Clone, Default)]
struct Tally {
    counts: Arc<Mutex<BTreeMap<&'static str, BTreeMap<String, usize>>>>,
    /// Whether the injector holds the lock now.
    locked: Arc<std::sync::atomic::AtomicBool>,
}

impl Tally {
    fn locked(&self) -> bool {
        self.locked.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A call's outcome: OK, cut by its deadline or by its cancellation
    /// (whatever the code: tonic's client answers its own timer with
    /// CANCELLED, the broker's with DEADLINE_EXCEEDED), or another code.
    /// `during_lock`: the call began while the table was locked.
    fn record<T>(&self, rpc: &'static str, cut: Cut, r: &Result<T, Status>, during_lock: bool) {
        let code = r.as_ref().err().map_or(Code::Ok, |s| s.code());
        let what = match (code, cut) {
            (Code::Ok, _) => "ok".to_owned(),
            (Code::DeadlineExceeded | Code::Cancelled, Cut::Deadline(_)) => "deadline".into(),
            (Code::DeadlineExceeded | Code::Cancelled, Cut::Cancel(_)) => "cancelled".into(),
            (code, _) => format!("{code:?}"),
        };
        let cut_short = what == "deadline" || what == "cancelled";
        let mut c = self.counts.lock().unwrap();
        let m = c.entry(rpc).or_default();
        *m.entry(what).or_default() += 1;
        if during_lock && cut_short {
            *m.entry("cut while locked".into()).or_default() += 1;
        }
    }

    /// What the run has not seen yet: each RPC ok, cut by its deadline
    /// and cancelled; and mid-statement, each that writes cut while its
    /// statement waited on the table's lock.
    fn missing(&self) -> Vec<String> {
        // The RPCs that write (a statement that can wait on the lock).
        const WRITES: [&str; 6] = [
            "Enqueue",
            "EnqueueBatch",
            "Produce",
            "Ack",
            "Nack",
            "ExtendLease",
        ];
        let mut out = Vec::new();
        for rpc in WRITES.into_iter().chain(["Subscribe", "Consume"]) {
            for what in ["ok", "deadline", "cancelled"] {
                if self.get(rpc, what) == 0 {
                    out.push(format!("{rpc} {what}"));
                }
            }
        }
        for rpc in WRITES {
            if self.get(rpc, "cut while locked") == 0 {
                out.push(format!("{rpc} cut while locked"));
            }
        }
        out
    }

    fn get(&self, rpc: &str, what: &str) -> usize {
        let c = self.counts.lock().unwrap();
        c.get(rpc).and_then(|m| m.get(what)).copied().unwrap_or(0)
    }
}

/// How long an impatient client keeps a stream: 0 to 50 ms (three times
/// in ten), else 0.1 to 1.5 s.
fn life(rng: &mut Rng) -> Duration {
    if rng.next_f64() < 0.3 {
        Duration::from_secs_f64(0.05 * rng.next_f64())
    } else {
        Duration::from_secs_f64(0.1 + 1.4 * rng.next_f64())
    }
}

/// Enqueue and EnqueueBatch (5 jobs) with cut calls, until `stop`.
async fn impatient_producer(
    h: History,
    addr: SocketAddr,
    tally: Tally,
    seed: u64,
    stop: CancellationToken,
) {
    let mut c = lazy_client(addr);
    let mut rng = Rng::new(seed);
    let mut n = 0;
    while !stop.is_cancelled() {
        n += 1;
        let cut = Cut::random(&mut rng);
        let locked = tally.locked();
        if n % 4 == 0 {
            let payloads: Vec<String> = (0..5).map(|k| format!("ib{seed}-{n:05}-{k}")).collect();
            let jobs = payloads.iter().map(|p| job(QUEUE, p)).collect();
            let r = cut
                .run(c.enqueue_batch(cut.request(pb::EnqueueBatchRequest { jobs })))
                .await;
            tally.record("EnqueueBatch", cut, &r, locked);
            match r {
                Ok(resp) => {
                    for (p, e) in payloads.iter().zip(resp.into_inner().results) {
                        h.enqueue_ok(p, &e.job_id);
                    }
                }
                Err(s) => payloads.iter().for_each(|p| h.enqueue_err(p, s.code())),
            }
        } else if n % 4 == 2 {
            // A Produce stream of three jobs, half-closed after them, cut
            // like any call: each job answered OK is recorded enqueued,
            // each unanswered one as the call's error (maybe enqueued).
            let payloads: Vec<String> = (0..3).map(|k| format!("ip{seed}-{n:05}-{k}")).collect();
            let (tx, rx) = mpsc::channel(4);
            for (i, p) in payloads.iter().enumerate() {
                let req = pb::ProduceRequest {
                    id: i as u64,
                    job: Some(job(QUEUE, p)),
                };
                tx.send(req).await.expect("the channel holds four");
            }
            drop(tx);
            let answers: Arc<Mutex<HashMap<u64, pb::ProduceResponse>>> = Arc::default();
            let heard = answers.clone();
            let mut pc = c.clone();
            let r = cut
                .run(async move {
                    let mut s = pc
                        .produce(cut.request(ReceiverStream::new(rx)))
                        .await?
                        .into_inner();
                    while let Some(a) = s.message().await? {
                        heard.lock().unwrap().insert(a.id, a);
                    }
                    Ok(())
                })
                .await;
            let answers = answers.lock().unwrap().clone();
            let r = match r {
                Ok(()) if answers.len() < payloads.len() => {
                    panic!("a Produce stream ended OK with {answers:?} for 3 jobs")
                }
                r => r,
            };
            tally.record("Produce", cut, &r, locked);
            let unanswered = r.as_ref().err().map_or(Code::Unknown, |s| s.code());
            for (i, p) in payloads.iter().enumerate() {
                match answers.get(&(i as u64)) {
                    Some(a) if a.code == 0 => {
                        let id = &a.enqueued.as_ref().expect("OK carries the job").job_id;
                        h.enqueue_ok(p, id);
                    }
                    Some(a) => h.enqueue_err(p, Code::from(a.code)),
                    None => h.enqueue_err(p, unanswered),
                }
            }
        } else {
            let payload = format!("ie{seed}-{n:05}");
            let r = cut.run(c.enqueue(cut.request(job(QUEUE, &payload)))).await;
            tally.record("Enqueue", cut, &r, locked);
            match r {
                Ok(resp) => h.enqueue_ok(&payload, &resp.into_inner().job_id),
                Err(s) => h.enqueue_err(&payload, s.code()),
            }
        }
        sleep(Duration::from_millis(15)).await;
    }
}

/// A unary settle of `rec` with a cut call, recorded.
async fn settle(
    h: &History,
    c: &mut Client,
    tally: &Tally,
    rec: &crate::common::history::Delivered,
    op: Op,
    cut: Cut,
) -> Result<(), Status> {
    let locked = tally.locked();
    let sent = h.sent(op, rec, rec.broker);
    match op {
        Op::Ack => {
            let r = cut
                .run(c.ack(cut.request(pb::AckRequest {
                    job_id: rec.id.clone(),
                    lease_token: rec.token.clone(),
                    enqueue: Vec::new(),
                    result: Vec::new(),
                })))
                .await
                .map(|_| ());
            tally.record("Ack", cut, &r, locked);
            h.answered(sent, &r);
            r
        }
        Op::Nack => {
            let r = cut
                .run(c.nack(cut.request(pb::NackRequest {
                    job_id: rec.id.clone(),
                    lease_token: rec.token.clone(),
                    error: "impatient".into(),
                    retry_after: Some(dur(Duration::ZERO)),
                    dead_letter: false,
                })))
                .await
                .map(|_| ());
            tally.record("Nack", cut, &r, locked);
            h.answered(sent, &r);
            r
        }
        Op::Extend => {
            let r = cut
                .run(c.extend_lease(cut.request(pb::ExtendLeaseRequest {
                    job_id: rec.id.clone(),
                    lease_token: rec.token.clone(),
                    lease: Some(dur(Duration::from_secs(3))),
                })))
                .await
                .map(|r| ts_us(&r.into_inner().lease_expires_at.expect("expiry")));
            tally.record("ExtendLease", cut, &r, locked);
            h.extended(sent, &r);
            r.map(|_| ())
        }
    }
}

/// Opens Subscribe streams with a cut opening, keeps each for up to 1.5 s
/// ([`life`]), settles what it receives with cut calls (Ack, Nack, or
/// ExtendLease then Ack), drops it; until `stop`.
async fn impatient_subscriber(
    h: History,
    (addr, broker): (SocketAddr, usize),
    tally: Tally,
    seed: u64,
    stop: CancellationToken,
) {
    let mut c = lazy_client(addr);
    let mut rng = Rng::new(seed);
    let lease = Duration::from_secs(2);
    while !stop.is_cancelled() {
        // An opening answers within a ms or so (unloaded): cut it within
        // 0.05 to 30 ms.
        let cut = Cut::between(&mut rng, 0.05, 30.0);
        let locked = tally.locked();
        let r = cut
            .run(c.subscribe(cut.request(pb::SubscribeRequest {
                queues: vec![QUEUE.into()],
                consumer: format!("impatient-{seed}"),
                max_in_flight: 2,
                lease: Some(dur(lease)),
                accept: Vec::new(),
            })))
            .await;
        tally.record("Subscribe", cut, &r, locked);
        let Ok(resp) = r else {
            sleep(Duration::from_millis(20)).await;
            continue;
        };
        let mut stream = resp.into_inner();
        let sid = h.consumer_stream(broker, 2, false);
        let until = Instant::now() + life(&mut rng);
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(until) => break,
                m = stream.message() => m,
            };
            let d = match msg {
                Ok(Some(pb::SubscribeResponse {
                    kind: Some(Kind::Delivery(d)),
                })) => d,
                Ok(Some(_)) => continue,
                Ok(None) => {
                    h.stream_ended(sid, None);
                    break;
                }
                Err(s) => {
                    h.stream_ended(sid, Some(s.code()));
                    break;
                }
            };
            let rec = h.delivered(sid, broker, lease, &d);
            // Some work: settles spread over the time the table is locked.
            sleep(Duration::from_secs_f64(0.2 * rng.next_f64())).await;
            let roll = rng.next_f64();
            let op = if roll < 0.2 {
                Op::Nack
            } else if roll < 0.5 {
                let _ = settle(&h, &mut c, &tally, &rec, Op::Extend, Cut::random(&mut rng)).await;
                Op::Ack
            } else {
                Op::Ack
            };
            let _ = settle(&h, &mut c, &tally, &rec, op, Cut::random(&mut rng)).await;
        }
        h.stream_dropped(sid);
        drop(stream);
    }
}

/// Opens Consume streams with a cut opening, acks what it receives on the
/// stream without waiting for the answers, and drops each stream after up
/// to 1.5 s (acks still unanswered then have no known outcome); until
/// `stop`.
async fn impatient_consumer(
    h: History,
    (addr, broker): (SocketAddr, usize),
    tally: Tally,
    seed: u64,
    stop: CancellationToken,
) {
    let mut c = lazy_client(addr);
    let mut rng = Rng::new(seed);
    let lease = Duration::from_secs(2);
    while !stop.is_cancelled() {
        let (tx, rx) = mpsc::channel::<pb::ConsumeRequest>(64);
        tx.try_send(pb::ConsumeRequest {
            subscribe: Some(pb::SubscribeRequest {
                queues: vec![QUEUE.into()],
                consumer: format!("impatient-consume-{seed}"),
                max_in_flight: 2,
                lease: Some(dur(lease)),
                accept: Vec::new(),
            }),
            confirm_settles: true,
            ..Default::default()
        })
        .expect("room for the first message");
        let cut = Cut::between(&mut rng, 0.05, 30.0);
        let locked = tally.locked();
        let r = cut
            .run(c.consume(cut.request(ReceiverStream::new(rx))))
            .await;
        tally.record("Consume", cut, &r, locked);
        let Ok(resp) = r else {
            sleep(Duration::from_millis(20)).await;
            continue;
        };
        let mut stream = resp.into_inner();
        let sid = h.consumer_stream(broker, 2, true);
        let mut pending = HashMap::new();
        let until = Instant::now() + life(&mut rng);
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(until) => break,
                m = stream.message() => m,
            };
            match msg {
                Ok(Some(pb::ConsumeResponse {
                    kind: Some(ConsumeKind::Delivery(d)),
                })) => {
                    let rec = h.delivered(sid, broker, lease, &d);
                    let sent = h.sent(Op::Ack, &rec, broker);
                    pending.insert(rec.token.clone(), sent);
                    let msg = pb::ConsumeRequest {
                        acks: vec![pb::AckRequest {
                            job_id: rec.id.clone(),
                            lease_token: rec.token.clone(),
                            enqueue: Vec::new(),
                            result: Vec::new(),
                        }],
                        ..Default::default()
                    };
                    if tx.send(msg).await.is_err() {
                        break;
                    }
                }
                Ok(Some(pb::ConsumeResponse {
                    kind: Some(ConsumeKind::Settled(rs)),
                })) => {
                    for r in rs.results {
                        if let Some(sent) = pending.remove(&r.lease_token) {
                            let r = if r.code == 0 {
                                Ok(())
                            } else {
                                Err(Status::new(Code::from(r.code), r.message))
                            };
                            h.answered(sent, &r);
                        }
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => {
                    h.stream_ended(sid, None);
                    break;
                }
                Err(s) => {
                    h.stream_ended(sid, Some(s.code()));
                    break;
                }
            }
        }
        // Cut: the acks still pending may or may not commit.
        h.stream_dropped(sid);
        drop(stream);
        drop(tx);
    }
}

/// Every second, `lock table leaseq.jobs in share mode` for 400 ms: every
/// write to the jobs table waits meanwhile. Recorded as a fault (no broker
/// in particular).
async fn lock_injector(h: History, pool: PgPool, tally: Tally, stop: CancellationToken) -> usize {
    let mut n = 0;
    while !stop.is_cancelled() {
        sleep(Duration::from_millis(600)).await;
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query("lock table leaseq.jobs in share mode")
            .execute(&mut *tx)
            .await
            .expect("lock");
        let f = h.fault("jobs table locked 400 ms", None);
        tally
            .locked
            .store(true, std::sync::atomic::Ordering::SeqCst);
        sleep(Duration::from_millis(400)).await;
        tally
            .locked
            .store(false, std::sync::atomic::Ordering::SeqCst);
        tx.rollback().await.expect("unlock");
        h.healed(f);
        n += 1;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_and_cancellations_on_every_rpc() {
    let db = TestDb::new().await;
    let reps = super::start_replicas(&db.url, 2, &[], "deadlines").await;
    let addrs: Vec<SocketAddr> = reps.iter().map(|r| r.addr).collect();
    let h = History::new();
    let mut load = Load::start(&h, &addrs, QUEUE, 4, super::mixed(), 100);
    load.watch(&db.pool);
    wait_acked(&h, 20, Duration::from_secs(20)).await;

    let tally = Tally::default();
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let seed = 100 + i as u64 * 10;
        let (t, s, a) = (tally.clone(), stop.clone(), *addr);
        tasks.push(tokio::spawn(impatient_producer(h.clone(), a, t, seed, s)));
        for k in [1, 3] {
            let (t, s) = (tally.clone(), stop.clone());
            tasks.push(tokio::spawn(impatient_subscriber(
                h.clone(),
                (a, i),
                t,
                seed + k,
                s,
            )));
        }
        let (t, s) = (tally.clone(), stop.clone());
        tasks.push(tokio::spawn(impatient_consumer(
            h.clone(),
            (a, i),
            t,
            seed + 2,
            s,
        )));
    }
    let locks = tokio::spawn(lock_injector(
        h.clone(),
        db.pool.clone(),
        tally.clone(),
        stop.clone(),
    ));
    // The fault time, then on (up to twice as long again) until every
    // kind of call was seen in every way: a statistical run, where a few
    // Nacks could all miss the table's locks on a loaded host.
    sleep(fault_seconds()).await;
    let extra = Instant::now() + fault_seconds() * 2;
    while !tally.missing().is_empty() && Instant::now() < extra {
        sleep(Duration::from_millis(200)).await;
    }
    stop.cancel();
    for t in tasks {
        timeout(Duration::from_secs(20), t)
            .await
            .expect("impatient client stops")
            .expect("impatient client");
    }
    let locks = locks.await.expect("lock injector");
    let report = load
        .finish("deadlines-and-cancellations", &db.pool, addrs[0], QUEUE)
        .await;
    let counts = tally.counts.lock().unwrap().clone();
    eprintln!("FAULTS deadlines-and-cancellations: table locks={locks} calls={counts:?}");
    assert!(locks >= 2, "the table was locked {locks} times");
    let missing = tally.missing();
    assert!(
        missing.is_empty(),
        "calls not seen: {missing:?} in {counts:?}"
    );
    assert!(report.ack_unknown > 0, "no Ack ended without an answer");
    drop(reps);
}
