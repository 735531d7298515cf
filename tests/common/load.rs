//! Load for the fault runs (tests/faults.rs) and the load-balancer runs
//! (tests/lb.rs): broker replicas as real processes, producers and consumers
//! that record everything into a [`History`], and the final drain by a clean
//! consumer and the history's check ([`Load::finish`]). Consumers receive
//! jobs on Subscribe streams and settle them with unary calls, or on
//! Consume streams with the settles on the stream ([`Protocol`]).

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaseq::pb;
use leaseq::pb::admin_service_client::AdminServiceClient;
use leaseq::pb::consume_response::Kind as ConsumeKind;
use leaseq::pb::queue_service_client::QueueServiceClient;
use leaseq::pb::subscribe_response::Kind;
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Endpoint;

use super::history::{Delivered, History, Op, Report, UNKNOWN_BROKER};
use crate::common::{BinaryBroker, Client, dur, free_addr, wait_serving};

/// How long the fault phase of each test runs: `LEASEQ_FAULT_SECONDS`
/// (default 8, kept short for CI).
pub fn fault_seconds() -> Duration {
    let s: f64 = std::env::var("LEASEQ_FAULT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8.0);
    Duration::from_secs_f64(s.max(1.0))
}

/// A client on `addr` that connects lazily and reconnects by itself.
pub fn lazy_client(addr: SocketAddr) -> Client {
    let ch = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .connect_lazy();
    QueueServiceClient::new(ch)
}

/// Where brokers' logs go: one file per process start, kept for a post mortem.
pub fn log_dir(test: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("faults-{test}"));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One broker replica: the real binary, on a fixed loopback address so it
/// can be restarted where clients look for it.
pub struct Replica {
    pub index: usize,
    pub addr: SocketAddr,
    url: String,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    logs: PathBuf,
    starts: usize,
    pub child: Option<tokio::process::Child>,
}

impl Replica {
    pub fn new(index: usize, db_url: &str, extra: &[&str], logs: PathBuf) -> Replica {
        Replica {
            index,
            addr: free_addr(),
            url: db_url.to_owned(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            logs,
            starts: 0,
            child: None,
        }
    }

    pub fn env(mut self, k: &str, v: &str) -> Replica {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }

    /// Spawns the process; returns without waiting for it to serve.
    pub fn spawn(&mut self) {
        self.starts += 1;
        let log = self
            .logs
            .join(format!("broker{}-{}.log", self.index, self.starts));
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let mut broker = BinaryBroker::on_url(&self.url)
            .addr(self.addr)
            .args(&["--pool-size", "5"])
            .args(&extra)
            .log(&log);
        for (k, v) in &self.env {
            broker = broker.env(k, v);
        }
        self.child = Some(broker.spawn().child);
    }

    pub async fn start(&mut self) {
        self.spawn();
        wait_serving(self.addr, Duration::from_secs(30)).await;
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().and_then(|c| c.id()).expect("running") as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill({sig})");
    }

    /// Waits for the process to exit; panics after `limit`.
    pub async fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("running");
        let status = timeout(limit, child.wait())
            .await
            .unwrap_or_else(|_| panic!("broker {} did not exit within {limit:?}", self.index))
            .expect("wait");
        self.child = None;
        status
    }
}

/// The RPC consumers receive (and settle) jobs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Subscribe; settles by unary Ack and Nack calls.
    Subscribe,
    /// Consume; settles on the stream ([`consume_consumer`]).
    Consume,
    /// Half of each: consumer `i` uses Consume when `i` is odd.
    Mixed,
}

impl Protocol {
    /// Whether consumer `i` uses Consume.
    fn consume(self, i: usize) -> bool {
        match self {
            Protocol::Subscribe => false,
            Protocol::Consume => true,
            Protocol::Mixed => i % 2 == 1,
        }
    }
}

/// What a consumer does with each delivery (fractions of deliveries).
#[derive(Clone, Copy)]
pub struct Behaviour {
    /// Nack with retry_after 0.
    pub nack: f64,
    /// Hold the job and never settle it: it comes back when the lease expires.
    pub stall: f64,
    /// Drop the stream at once, the job unsettled (a client cut mid-lease).
    pub cut: f64,
    pub lease: Duration,
    pub credit: u32,
    /// Upper bound of the simulated work per job.
    pub work: Duration,
    pub protocol: Protocol,
    /// Of the Acks of jobs that are no follow-ups themselves, the share
    /// that carries one or two follow-up jobs into the same queue
    /// (`AckRequest.enqueue`; [`follow_ups`]).
    pub follow_ups: f64,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            nack: 0.03,
            stall: 0.02,
            cut: 0.0,
            lease: Duration::from_secs(2),
            credit: 8,
            work: Duration::from_millis(5),
            protocol: Protocol::Subscribe,
            follow_ups: 0.0,
        }
    }
}

/// A small xorshift generator: reproducible enough, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Consumes `queue` through the brokers at `addrs` (starting with `home`,
/// moving to the next one when a stream cannot be opened), recording
/// everything, until `stop`. Reconnects after every stream end.
#[allow(clippy::too_many_arguments)]
pub async fn consumer(
    history: History,
    addrs: Vec<SocketAddr>,
    home: usize,
    queue: &'static str,
    b: Behaviour,
    seed: u64,
    stop: CancellationToken,
    ids: Option<BrokerIds>,
) {
    let clients: Vec<Client> = addrs.iter().map(|a| lazy_client(*a)).collect();
    let mut rng = Rng::new(seed);
    let mut broker = home;
    while !stop.is_cancelled() {
        let mut client = clients[broker].clone();
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            r = timeout(Duration::from_secs(5), client.subscribe(pb::SubscribeRequest {
                queues: vec![queue.into()],
                consumer: format!("faults-{seed}"),
                max_in_flight: b.credit,
                lease: Some(dur(b.lease)),
                accept: Vec::new(),
            })) => r,
        };
        let Some((stream, at)) =
            opened_or_next(&history, opened, &mut broker, clients.len(), ids.as_ref()).await
        else {
            continue;
        };
        let sid = history.consumer_stream(at, b.credit, false);
        let mut reader = Reader::start(&history, sid, at, b.lease, stream);
        // Unary settles go through the balancer, to a broker not known.
        let settles_to = if ids.is_some() { UNKNOWN_BROKER } else { at };
        let away = away_from(broker, home);
        tokio::pin!(away);
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => {
                    history.stream_dropped(sid);
                    return;
                }
                _ = &mut away => {
                    history.stream_dropped(sid);
                    break;
                }
                m = reader.next() => m,
            };
            let Some(rec) = msg else { break };
            let roll = rng.next_f64();
            if roll < b.cut {
                history.client_cut(at);
                history.stream_dropped(sid);
                break;
            } else if roll < b.cut + b.stall {
                continue;
            }
            if !b.work.is_zero() {
                tokio::time::sleep(b.work.mul_f64(rng.next_f64())).await;
            }
            if roll < b.cut + b.stall + b.nack {
                nack(
                    &history,
                    &mut client,
                    &rec,
                    settles_to,
                    "faults: nacked on purpose",
                )
                .await;
            } else {
                let fu = follow_ups(&rec, b.follow_ups, &mut rng);
                let enqueue = follow_up_requests(queue, &fu);
                let sent = history.sent_ack_with(&rec, settles_to, fu);
                let r = ack_with(&mut client, &rec.id, &rec.token, enqueue).await;
                history.acked(sent, &r);
            }
        }
        // The stream is gone (its Drop ran above or below); go back home.
        drop(reader);
        broker = home;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A Subscribe stream read in a task of its own, each delivery recorded
/// the moment it arrives: a consumer busy settling the last one would read
/// the next one late, and the checker compares receipt times with leases
/// (a delivery received after its lease's end is an anomaly). Dropping the
/// reader drops the stream.
pub struct Reader {
    rx: mpsc::UnboundedReceiver<Delivered>,
    task: JoinHandle<()>,
}

impl Reader {
    pub fn start(
        history: &History,
        sid: u64,
        broker: usize,
        lease: Duration,
        mut stream: tonic::Streaming<pb::SubscribeResponse>,
    ) -> Reader {
        let (tx, rx) = mpsc::unbounded_channel();
        let history = history.clone();
        let task = tokio::spawn(async move {
            loop {
                match next(&history, sid, stream.message().await) {
                    Next::Job(d) => {
                        if tx.send(history.delivered(sid, broker, lease, &d)).is_err() {
                            return;
                        }
                    }
                    Next::Nothing => {}
                    Next::Ended => return,
                }
            }
        });
        Reader { rx, task }
    }

    /// The next delivery; None once the stream ended (recorded).
    pub async fn next(&mut self) -> Option<Delivered> {
        self.rx.recv().await
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The stream a consumer's open on `broker` gave, and the broker serving
/// it (`broker`, or behind a balancer the one its metadata names in
/// `ids`); or None, the failure recorded and `broker` moved on to the next
/// of `brokers` (after a pause when the broker answered).
async fn opened_or_next<T>(
    history: &History,
    opened: Result<Result<tonic::Response<T>, tonic::Status>, tokio::time::error::Elapsed>,
    broker: &mut usize,
    brokers: usize,
    ids: Option<&BrokerIds>,
) -> Option<(T, usize)> {
    let code = match opened {
        Ok(Ok(s)) => {
            let at = ids.map_or(*broker, |ids| ids.index_of(s.metadata()));
            return Some((s.into_inner(), at));
        }
        Ok(Err(s)) => s.code(),
        Err(_) => Code::DeadlineExceeded,
    };
    history.subscribe_err(code);
    *broker = (*broker + 1) % brokers;
    if code != Code::DeadlineExceeded {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Fires when a consumer away from home (it was down) should go back, so
/// that a restarted broker gets its consumers back; never at home.
fn away_from(broker: usize, home: usize) -> tokio::time::Sleep {
    tokio::time::sleep(if broker == home {
        Duration::MAX / 4
    } else {
        Duration::from_secs(1)
    })
}

/// As [`consumer`], on Consume streams: each Ack and Nack goes on the
/// stream (with `confirm_settles`, so every settle is answered), one at a
/// time, and its result is awaited before the next delivery is handled
/// (deliveries that arrive meanwhile are recorded as they arrive and
/// handled in order). A settle whose stream ends before its result counts
/// as unanswered, with the stream's end status. When the consumer goes back
/// home or stops it half-closes its stream and reads it to its end. A cut
/// drops the call: the response side first (the client stops reading), then
/// the request side, which the broker sees end as well; either way it
/// releases the stream's jobs at once.
#[allow(clippy::too_many_arguments)]
pub async fn consume_consumer(
    history: History,
    addrs: Vec<SocketAddr>,
    home: usize,
    queue: &'static str,
    b: Behaviour,
    seed: u64,
    stop: CancellationToken,
    ids: Option<BrokerIds>,
) {
    let clients: Vec<Client> = addrs.iter().map(|a| lazy_client(*a)).collect();
    let mut rng = Rng::new(seed);
    let mut broker = home;
    let mut opens = 0u64;
    while !stop.is_cancelled() {
        let mut client = clients[broker].clone();
        let (tx, rx) = mpsc::channel::<pb::ConsumeRequest>(16);
        // A name per stream: what the database shows leased for it
        // (`leased_by`) is checked when it ends (`ConsumeConn::close`).
        opens += 1;
        let consumer = format!("faults-consume-{seed}-{opens}");
        tx.try_send(pb::ConsumeRequest {
            subscribe: Some(pb::SubscribeRequest {
                queues: vec![queue.into()],
                consumer: consumer.clone(),
                max_in_flight: b.credit,
                lease: Some(dur(b.lease)),
                // Half the consumers read packed deliveries, half one per
                // response (as clients from before `Deliveries`).
                accept: if seed.is_multiple_of(2) {
                    vec![pb::features::DELIVERIES.to_owned()]
                } else {
                    Vec::new()
                },
            }),
            confirm_settles: true,
            ..Default::default()
        })
        .expect("room for the first message");
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            r = timeout(Duration::from_secs(5), client.consume(ReceiverStream::new(rx))) => r,
        };
        let Some((stream, at)) =
            opened_or_next(&history, opened, &mut broker, clients.len(), ids.as_ref()).await
        else {
            continue;
        };
        let sid = history.consumer_stream(at, b.credit, true);
        let mut s = ConsumeConn {
            history: &history,
            sid,
            broker: at,
            lease: b.lease,
            consumer,
            unacked: HashSet::new(),
            stream,
            tx: Some(tx),
            queued: VecDeque::new(),
        };
        let away = away_from(broker, home);
        tokio::pin!(away);
        loop {
            if stop.is_cancelled() {
                s.close().await;
                return;
            }
            // Away long enough: home, even with deliveries queued (a
            // consumer slower than its stream, as on a loaded host, always
            // has some, and would otherwise never go back: the restarted
            // broker then saw no ack for 15 s). The queued jobs are
            // released with the stream.
            if Instant::now() >= away.deadline() {
                s.close().await;
                break;
            }
            let rec = match s.queued.pop_front() {
                Some(rec) => rec,
                None => {
                    let msg = tokio::select! {
                        _ = stop.cancelled() => {
                            s.close().await;
                            return;
                        }
                        _ = &mut away => {
                            s.close().await;
                            break;
                        }
                        m = s.stream.message() => m,
                    };
                    match s.take(msg) {
                        Ok(Some(rec)) => rec,
                        Ok(None) => continue,
                        Err(()) => break,
                    }
                }
            };
            let roll = rng.next_f64();
            if roll < b.cut {
                history.client_cut(at);
                history.stream_dropped(sid);
                break;
            } else if roll < b.cut + b.stall {
                continue;
            }
            if !b.work.is_zero() {
                tokio::time::sleep(b.work.mul_f64(rng.next_f64())).await;
            }
            let mut req = pb::ConsumeRequest::default();
            let mut fu = Vec::new();
            let op = if roll < b.cut + b.stall + b.nack {
                req.nacks.push(pb::NackRequest {
                    job_id: rec.id.clone(),
                    lease_token: rec.token.clone(),
                    error: "faults: nacked on purpose".into(),
                    retry_after: Some(dur(Duration::ZERO)),
                    dead_letter: false,
                });
                pb::SettleOp::Nack
            } else {
                fu = follow_ups(&rec, b.follow_ups, &mut rng);
                req.acks.push(pb::AckRequest {
                    job_id: rec.id.clone(),
                    lease_token: rec.token.clone(),
                    enqueue: follow_up_requests(queue, &fu),
                    result: Vec::new(),
                });
                pb::SettleOp::Ack
            };
            let sent = match op {
                pb::SettleOp::Nack => history.sent(Op::Nack, &rec, at),
                _ => history.sent_ack_with(&rec, at, fu),
            };
            let (r, open) = s.settle(req, &rec, op).await;
            if op == pb::SettleOp::Ack && r.is_err() {
                // Left to its ack by the stream's release.
                s.unacked.insert(rec.id.clone());
            }
            history.acked(sent, &r);
            if !open {
                break;
            }
        }
        // The call is gone (dropped here unless it ended); go back home.
        drop(s);
        broker = home;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One Consume call of [`consume_consumer`].
struct ConsumeConn<'a> {
    history: &'a History,
    sid: u64,
    broker: usize,
    lease: Duration,
    /// Its `consumer` (the jobs' `leased_by`): this stream's only.
    consumer: String,
    /// Jobs whose ack on the stream was not answered OK: their leases are
    /// left to the ack, which may have failed, by the stream's release.
    unacked: HashSet<String>,
    /// Declared (so dropped) before `tx`: a cut stops reading first.
    stream: tonic::Streaming<pb::ConsumeResponse>,
    /// None once half-closed.
    tx: Option<mpsc::Sender<pb::ConsumeRequest>>,
    /// Deliveries received (and recorded) while a settle's result was
    /// awaited, not handled yet.
    queued: VecDeque<Delivered>,
}

impl ConsumeConn<'_> {
    /// Sorts one response: a delivery is recorded and returned; a pack of
    /// them is recorded and queued (in order); a stream end is recorded
    /// and is `Err`. Settle results are not expected here (every settle's
    /// result is awaited) and are skipped.
    fn take(
        &mut self,
        msg: Result<Option<pb::ConsumeResponse>, tonic::Status>,
    ) -> Result<Option<Delivered>, ()> {
        match msg {
            Ok(Some(m)) => match m.kind {
                Some(ConsumeKind::Delivery(d)) => Ok(Some(self.history.delivered(
                    self.sid,
                    self.broker,
                    self.lease,
                    &d,
                ))),
                Some(ConsumeKind::Deliveries(pack)) => {
                    for d in &pack.deliveries {
                        let rec = self.history.delivered(self.sid, self.broker, self.lease, d);
                        self.queued.push_back(rec);
                    }
                    Ok(None)
                }
                _ => Ok(None),
            },
            Ok(None) => {
                self.history.stream_ended(self.sid, None);
                Err(())
            }
            Err(s) => {
                self.history.stream_ended(self.sid, Some(s.code()));
                Err(())
            }
        }
    }

    /// Sends one settle and waits (10 s at most) for its result. Returns
    /// the result as the unary call's (with an Ack's follow-up ids), and
    /// whether the stream is still open.
    async fn settle(
        &mut self,
        req: pb::ConsumeRequest,
        rec: &Delivered,
        op: pb::SettleOp,
    ) -> (Result<Vec<String>, tonic::Status>, bool) {
        let sent = match &self.tx {
            Some(tx) => tx.send(req).await.is_ok(),
            None => false,
        };
        if !sent {
            // The call is over; its end (read below) says why.
            let end = timeout(Duration::from_secs(10), self.stream.message()).await;
            let code = match &end {
                Ok(Err(s)) => s.code(),
                _ => Code::Cancelled,
            };
            if let Ok(msg) = end {
                let _ = self.take(msg);
            }
            return (
                Err(tonic::Status::new(code, "stream closed before the send")),
                false,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let msg = match tokio::time::timeout_at(deadline, self.stream.message()).await {
                Ok(m) => m,
                Err(_) => {
                    return (
                        Err(tonic::Status::deadline_exceeded("no settle result in 10 s")),
                        true,
                    );
                }
            };
            let end = match &msg {
                Ok(None) => Some(Code::DataLoss),
                Err(s) => Some(s.code()),
                Ok(Some(_)) => None,
            };
            if let Ok(Some(pb::ConsumeResponse {
                kind: Some(ConsumeKind::Settled(r)),
            })) = &msg
            {
                if let Some(r) = r
                    .results
                    .iter()
                    .find(|r| r.job_id == rec.id && r.lease_token == rec.token && r.op == op as i32)
                {
                    let r = if r.code == 0 {
                        Ok(r.enqueued.clone())
                    } else {
                        Err(tonic::Status::new(Code::from(r.code), r.message.clone()))
                    };
                    return (r, true);
                }
                continue;
            }
            match self.take(msg) {
                Ok(Some(rec)) => self.queued.push_back(rec),
                Ok(None) => {}
                // The stream ended before the result: its outcome is
                // unknown. (An OK end, which a half-close alone may give,
                // would be a broker bug: DATA_LOSS makes it stand out.)
                Err(()) => {
                    let code = end.expect("an end");
                    return (
                        Err(tonic::Status::new(code, "stream ended before the result")),
                        false,
                    );
                }
            }
        }
    }

    /// Half-closes and reads the stream to its end (5 s at most), recording
    /// what still arrives. The half-close releases the stream's jobs.
    async fn close(&mut self) {
        self.history.stream_half_closed(self.sid);
        self.tx = None;
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Ok(msg) = tokio::time::timeout_at(deadline, self.stream.message()).await {
            let ok = matches!(msg, Ok(None));
            if self.take(msg).is_err() {
                if ok {
                    self.check_released().await;
                }
                return;
            }
        }
    }

    /// The stream ended OK after its half-close: the database must show
    /// none of the jobs a lease round took for it still leased, but those
    /// whose ack on it was not answered OK. Jobs leased at their insert
    /// (hand-off, the lease's start its `enqueued_at`) are left out: one
    /// handed over by another replica while the stream closed is released
    /// when the hand-over arrives, which may be after the end (what one
    /// broker's own claims do is the simulation's to check). The database
    /// out of reach: nothing to say.
    async fn check_released(&self) {
        let Some(db) = self.history.db() else {
            return;
        };
        let query = sqlx::query_scalar::<_, String>(
            "select id::text from leaseq.jobs where state = 'leased' and leased_by = $1 \
             and lease_expires_at <> enqueued_at + $2 * interval '1 millisecond'",
        )
        .bind(&self.consumer)
        .bind(self.lease.as_millis() as i64)
        .fetch_all(&db);
        let Ok(Ok(ids)) = timeout(Duration::from_secs(5), query).await else {
            return;
        };
        let left: Vec<String> = ids
            .into_iter()
            .filter(|id| !self.unacked.contains(id))
            .collect();
        self.history.half_close_left(self.sid, left);
    }
}

pub async fn ack(client: &mut Client, id: &str, token: &str) -> Result<(), tonic::Status> {
    ack_with(client, id, token, Vec::new()).await.map(|_| ())
}

/// A unary Ack carrying the follow-up jobs `enqueue`, with a 10 s timeout:
/// the follow-ups' ids (`AckResponse.enqueued`) or the error.
pub async fn ack_with(
    client: &mut Client,
    id: &str,
    token: &str,
    enqueue: Vec<pb::EnqueueRequest>,
) -> Result<Vec<String>, tonic::Status> {
    timeout(
        Duration::from_secs(10),
        client.ack(pb::AckRequest {
            job_id: id.to_owned(),
            lease_token: token.to_owned(),
            enqueue,
            result: Vec::new(),
        }),
    )
    .await
    .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("ack timed out")))
    .map(|r| r.into_inner().enqueued)
}

/// The follow-up jobs (their payloads) the Ack of `rec` carries: none for a
/// follow-up itself (a payload with `>`), else one or two, for a `share`
/// of Acks. Each payload names its parent and its lease token, so it is
/// unique in the run: `{parent payload}>{token}.{i}`.
pub fn follow_ups(rec: &Delivered, share: f64, rng: &mut Rng) -> Vec<String> {
    if share <= 0.0 || rec.payload.contains('>') || rng.next_f64() >= share {
        return Vec::new();
    }
    let n = if rng.next_f64() < 0.5 { 1 } else { 2 };
    (0..n)
        .map(|i| format!("{}>{}.{i}", rec.payload, rec.token))
        .collect()
}

/// The Enqueues of the follow-ups `payloads` into `queue`.
pub fn follow_up_requests(queue: &str, payloads: &[String]) -> Vec<pb::EnqueueRequest> {
    payloads
        .iter()
        .map(|p| pb::EnqueueRequest {
            queue: queue.to_owned(),
            payload: p.clone().into_bytes(),
            ..Default::default()
        })
        .collect()
}

/// Nacks a delivery (retry at once, not dead-lettered) through `broker`
/// with a 10 s timeout, recording the Nack and its outcome in `history`.
pub async fn nack(
    history: &History,
    client: &mut Client,
    rec: &Delivered,
    broker: usize,
    why: &str,
) {
    let sent = history.sent(Op::Nack, rec, broker);
    let r = timeout(
        Duration::from_secs(10),
        client.nack(pb::NackRequest {
            job_id: rec.id.clone(),
            lease_token: rec.token.clone(),
            error: why.into(),
            retry_after: Some(dur(Duration::ZERO)),
            dead_letter: false,
        }),
    )
    .await
    .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("nack timed out")))
    .map(|_| ());
    history.answered(sent, &r);
}

/// One message of a Subscribe stream, as a test consumer sees it.
pub enum Next {
    Job(Box<pb::Delivery>),
    /// A heartbeat: nothing to do.
    Nothing,
    /// The stream ended (recorded in the history, with its status).
    Ended,
}

/// Reads what `stream.message()` gave on stream `sid`, recording its end.
pub fn next(
    history: &History,
    sid: u64,
    msg: Result<Option<pb::SubscribeResponse>, tonic::Status>,
) -> Next {
    match msg {
        Ok(Some(m)) => match m.kind {
            Some(Kind::Delivery(d)) => Next::Job(Box::new(d)),
            _ => Next::Nothing,
        },
        Ok(None) => {
            history.stream_ended(sid, None);
            Next::Ended
        }
        Err(s) => {
            history.stream_ended(sid, Some(s.code()));
            Next::Ended
        }
    }
}

/// Enqueues unique payloads `{prefix}{n}` round-robin across `addrs` until
/// `stop` or `max` jobs, at most one every `pace`.
pub async fn producer(
    history: History,
    addrs: Vec<SocketAddr>,
    queue: &'static str,
    prefix: &'static str,
    max: usize,
    pace: Duration,
    stop: CancellationToken,
) {
    let queues = vec![queue.to_owned()];
    produce(history, addrs, queues, prefix, max, pace, stop, 0).await
}

/// As [`producer`], the jobs round-robin over `queues` as well.
pub async fn producer_over(
    history: History,
    addrs: Vec<SocketAddr>,
    queues: Vec<String>,
    prefix: &'static str,
    max: usize,
    pace: Duration,
    stop: CancellationToken,
) {
    produce(history, addrs, queues, prefix, max, pace, stop, 0).await
}

/// As [`producer`], every other job (the even `n`) with a job key
/// (`EnqueueRequest.key`): `{prefix}-k0` to `{prefix}-k{keys - 1}` in turn.
///
/// The keys are this producer's own, so each key's jobs are sent one after
/// another, each after the one before was answered and at least `pace`
/// later. The broker orders a key's jobs by the UUIDv7 it stamps on each
/// Enqueue; sent so, on brokers that share one clock (this machine), their
/// ids follow their commits. Enqueues of one key racing (two producers, or
/// brokers whose clocks differ by more than the gap between them) may
/// commit out of id order, and the broker may then lease a job whose id is
/// smaller beside one leased before it committed: the checker's
/// key_concurrency rule would report that (its order rule does not assume
/// ids follow commits; `History::check` says why).
pub async fn keyed_producer(
    history: History,
    addrs: Vec<SocketAddr>,
    queue: &'static str,
    prefix: &'static str,
    (max, pace, keys): (usize, Duration, usize),
    stop: CancellationToken,
) {
    let queues = vec![queue.to_owned()];
    produce(history, addrs, queues, prefix, max, pace, stop, keys).await
}

#[allow(clippy::too_many_arguments)]
async fn produce(
    history: History,
    addrs: Vec<SocketAddr>,
    queues: Vec<String>,
    prefix: &'static str,
    max: usize,
    pace: Duration,
    stop: CancellationToken,
    keys: usize,
) {
    let clients: Vec<Client> = addrs.iter().map(|a| lazy_client(*a)).collect();
    // Every other job (the odd `n`) goes through the Rust SDK's
    // `Client::enqueue`: a message on its long-lived Produce stream, which
    // the faults break and the SDK opens again.
    let streams: Vec<leaseq_client::Client> = addrs
        .iter()
        .map(|a| leaseq_client::Client::connect_lazy(format!("http://{a}")).expect("an address"))
        .collect();
    let mut tick = tokio::time::interval(pace);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0..max {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let payload = format!("{prefix}{n:06}");
        let broker = n % clients.len();
        let single = clients.len() == 1;
        let mut c = clients[broker].clone();
        let queue = queues[n % queues.len()].clone();
        let key = if keys > 0 && n.is_multiple_of(2) {
            let key = format!("{prefix}-k{}", (n / 2) % keys);
            history.job_key(&payload, &queue, &key);
            key
        } else {
            String::new()
        };
        let r = if n % 2 == 1 {
            let mut job = leaseq_client::Job::new(queue, payload.clone().into_bytes());
            if !key.is_empty() {
                job = job.key(key);
            }
            timeout(Duration::from_secs(10), streams[broker].enqueue(job))
                .await
                .map(|r| r.map(|e| e.job_id))
        } else {
            timeout(
                Duration::from_secs(10),
                c.enqueue(pb::EnqueueRequest {
                    queue,
                    payload: payload.clone().into_bytes(),
                    key,
                    ..Default::default()
                }),
            )
            .await
            .map(|r| r.map(|resp| resp.into_inner().job_id))
        };
        match r {
            // Through one address (a balancer, say) the broker is not known.
            Ok(Ok(id)) if single => history.enqueue_ok(&payload, &id),
            Ok(Ok(id)) => history.enqueue_ok_via(&payload, &id, broker),
            Ok(Err(s)) => history.enqueue_err(&payload, s.code()),
            Err(_) => history.enqueue_err(&payload, Code::DeadlineExceeded),
        }
    }
}

/// The final drain's Acks, up to 64 at a time (one at a time, a backlog of
/// thousands would take longer to ack than the broker took to deliver it).
#[derive(Default)]
pub struct Acks(tokio::task::JoinSet<()>);

impl Acks {
    /// Acks `rec` (recorded) in a task of its own.
    pub async fn ack(&mut self, history: &History, client: &Client, rec: Delivered) {
        while self.0.len() >= 64 {
            self.0.join_next().await;
        }
        let (history, mut client) = (history.clone(), client.clone());
        self.0.spawn(async move {
            let sent = history.sent(Op::Ack, &rec, usize::MAX);
            let r = ack(&mut client, &rec.id, &rec.token).await;
            history.answered(sent, &r);
        });
    }

    /// Waits for every Ack sent.
    pub async fn wait(&mut self) {
        while self.0.join_next().await.is_some() {}
    }
}

/// The clean consumer at the end: takes everything left in `queue` through
/// `addr` and acks it (recorded), until the jobs table holds nothing of the
/// queue. Jobs leased by dead brokers come back when their leases expire.
pub async fn final_drain(
    history: &History,
    db: &sqlx::PgPool,
    addr: SocketAddr,
    queue: &'static str,
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    let deadline = started + limit;
    let mut client = lazy_client(addr);
    let lease = Duration::from_secs(30);
    let mut reported = false;
    let mut acks = Acks::default();
    'outer: loop {
        assert!(
            Instant::now() < deadline,
            "final drain did not finish within {limit:?}: {} jobs left",
            live(db, queue).await
        );
        let opened = timeout(
            Duration::from_secs(5),
            client.subscribe(pb::SubscribeRequest {
                queues: vec![queue.into()],
                consumer: "final-drain".into(),
                max_in_flight: 256,
                lease: Some(dur(lease)),
                accept: Vec::new(),
            }),
        )
        .await;
        let mut stream = match opened {
            Ok(Ok(s)) => s.into_inner(),
            _ => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let sid = history.stream_opened(usize::MAX);
        loop {
            if live(db, queue).await == 0 {
                acks.wait().await;
                history.stream_dropped(sid);
                break 'outer;
            }
            if !reported && started.elapsed() > Duration::from_secs(3) {
                // Slow: say what is left, for a post mortem.
                reported = true;
                let rows: Vec<(String, String, i32, String)> = sqlx::query_as(
                    "select id::text, state, attempt, concat_ws(' ', 'lease left',
                        lease_expires_at - now(), 'broker', lease_broker, 'by', leased_by,
                        'run_at - now', run_at - now())
                     from leaseq.jobs where queue = $1 order by id limit 20",
                )
                .bind(queue)
                .fetch_all(db)
                .await
                .unwrap_or_default();
                eprintln!("final drain of {queue} slow after 3 s; left: {rows:?}");
            }
            let msg = match timeout(Duration::from_millis(500), stream.message()).await {
                Err(_) => continue,
                Ok(m) => m,
            };
            let d = match next(history, sid, msg) {
                Next::Job(d) => d,
                Next::Nothing => continue,
                Next::Ended => continue 'outer,
            };
            let rec = history.delivered(sid, usize::MAX, lease, &d);
            acks.ack(history, &client, rec).await;
        }
    }
    started.elapsed()
}

pub async fn live(db: &sqlx::PgPool, queue: &str) -> i64 {
    sqlx::query_scalar("select count(*) from leaseq.jobs where queue = $1")
        .bind(queue)
        .fetch_one(db)
        .await
        .expect("live jobs")
}

/// Ids in the dead letters and in the jobs table, for the checker.
pub async fn final_ids(pool: &sqlx::PgPool) -> (HashSet<String>, HashSet<String>) {
    let dead: Vec<String> = sqlx::query_scalar("select id::text from leaseq.dead_jobs")
        .fetch_all(pool)
        .await
        .expect("dead ids");
    let live: Vec<String> = sqlx::query_scalar("select id::text from leaseq.jobs")
        .fetch_all(pool)
        .await
        .expect("live ids");
    (dead.into_iter().collect(), live.into_iter().collect())
}

/// The brokers behind a load balancer, by the process id each names in its
/// streams' metadata (`leaseq-broker`, docs/DEPLOYMENT.md): a stream opened
/// through the balancer is recorded on the broker that serves it, so that
/// the checker's exemptions (a drain releases the jobs of its own streams
/// only) name that one broker. Index i is the i-th broker learned.
#[derive(Clone, Default)]
pub struct BrokerIds(Arc<Mutex<Vec<String>>>);

impl BrokerIds {
    /// Learns the id of the broker at `addr` (not through the balancer)
    /// from a stream opened on it; returns its index.
    pub async fn learn(&self, addr: SocketAddr) -> usize {
        let id = broker_id(addr).await;
        let mut ids = self.0.lock().unwrap();
        ids.push(id);
        ids.len() - 1
    }

    /// The index of the broker a response's metadata names; one not seen
    /// before (a restarted process) is given the next index.
    pub fn index_of(&self, md: &tonic::metadata::MetadataMap) -> usize {
        let id = md
            .get(leaseq_server::BROKER_HEADER)
            .and_then(|v| v.to_str().ok())
            .expect("a stream's response names its broker (leaseq-broker)")
            .to_owned();
        let mut ids = self.0.lock().unwrap();
        if let Some(i) = ids.iter().position(|x| *x == id) {
            return i;
        }
        ids.push(id);
        ids.len() - 1
    }
}

/// The id the broker at `addr` names in its streams' metadata.
pub async fn broker_id(addr: SocketAddr) -> String {
    let mut c = lazy_client(addr);
    let s = timeout(
        Duration::from_secs(10),
        c.subscribe(pb::SubscribeRequest {
            queues: vec!["broker-id".into()],
            consumer: "broker-id".into(),
            max_in_flight: 1,
            lease: None,
            accept: Vec::new(),
        }),
    )
    .await
    .expect("subscribe in time")
    .expect("subscribe");
    s.metadata()
        .get(leaseq_server::BROKER_HEADER)
        .and_then(|v| v.to_str().ok())
        .expect("a stream's response names its broker (leaseq-broker)")
        .to_owned()
}

/// Every 100 ms until `stop`, how many jobs of `queues` wait deliverable
/// (available, due, their queue not paused, not held back behind their
/// key) over `pools`, into `history`
/// (a failed or slow sample is recorded as unknown): the stall check's
/// "while jobs wait".
pub async fn sample_ready(
    history: History,
    pools: Vec<PgPool>,
    queues: Vec<String>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let mut total = Some(0);
        for pool in &pools {
            let n = timeout(
                Duration::from_secs(1),
                // In a queue ordered by key, a keyed job is deliverable only
                // while fewer than key_concurrency jobs of its key are in
                // the table with a smaller id, or leased (lease.sql's rule);
                // with a per-key limit and no order, while fewer than
                // key_concurrency of its key hold an unexpired lease
                // (lease_keys.sql). Key overrides and rates: not used here.
                sqlx::query_scalar::<_, i64>(
                    "select count(*) from leaseq.jobs j
                     left join leaseq.queues q on q.name = j.queue
                     cross join lateral (
                         select case when q.ordered_by_key then coalesce(q.key_concurrency, 1)
                             else q.key_concurrency end as n
                     ) k
                     where j.queue = any($1) and j.state = 'available' and j.run_at <= now()
                       and not coalesce(q.paused, false)
                       and (j.key is null or k.n is null or (
                           select count(*) from (
                               select from leaseq.jobs e
                               where e.queue = j.queue and e.key = j.key
                                 and case when q.ordered_by_key
                                     then e.id < j.id or e.state = 'leased'
                                     else e.state = 'leased' and e.lease_expires_at > now() end
                               limit k.n
                           ) busy
                       ) < k.n)",
                )
                .bind(&queues)
                .fetch_one(pool),
            )
            .await;
            total = match (total, n) {
                (Some(t), Ok(Ok(n))) => Some(t + n),
                _ => None,
            };
        }
        history.ready(total);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Producers and consumers of one run.
pub struct Load {
    history: History,
    queue: &'static str,
    producers_stop: CancellationToken,
    consumers_stop: CancellationToken,
    producers: Vec<JoinHandle<()>>,
    consumers: Vec<JoinHandle<()>>,
    sampler_stop: CancellationToken,
    sampler: Option<JoinHandle<()>>,
    started: Instant,
}

impl Load {
    /// `consumers` consumers, the i-th at home on broker `i % addrs.len()`,
    /// and two producers at most `rate` jobs/s between them.
    pub fn start(
        history: &History,
        addrs: &[SocketAddr],
        queue: &'static str,
        consumers: usize,
        behaviour: Behaviour,
        rate: u32,
    ) -> Load {
        Load::start_keyed(history, addrs, queue, consumers, behaviour, (rate, 0))
    }

    /// As [`Load::start`], half the jobs with a job key, `keys` keys in
    /// all (half of them each producer's: [`keyed_producer`]); 0: none.
    pub fn start_keyed(
        history: &History,
        addrs: &[SocketAddr],
        queue: &'static str,
        consumers: usize,
        behaviour: Behaviour,
        (rate, keys): (u32, usize),
    ) -> Load {
        let mut load = Load::consumers_only(history, addrs, queue, consumers, behaviour);
        // Jobs: up to twice what the fault phase needs, since the load also
        // runs while the test starts and while it waits for recoveries.
        let max = (fault_seconds().as_secs_f64() * f64::from(rate) * 2.0) as usize;
        let pace = Duration::from_secs_f64(2.0 / f64::from(rate));
        for prefix in ["pa", "pb"] {
            load.produce(keyed_producer(
                history.clone(),
                addrs.to_vec(),
                queue,
                prefix,
                (max / 2, pace, keys.div_ceil(2)),
                load.producers_stop(),
            ));
        }
        load
    }

    /// Consumers as [`Load::start`] starts them, and no producer: the test
    /// adds its own with [`Load::produce`].
    pub fn consumers_only(
        history: &History,
        addrs: &[SocketAddr],
        queue: &'static str,
        consumers: usize,
        behaviour: Behaviour,
    ) -> Load {
        Load::consumers_behind(history, addrs, queue, consumers, behaviour, None)
    }

    /// As [`Load::consumers_only`]; with `ids`, the addresses are a
    /// balancer's and each stream is recorded on the broker its metadata
    /// names.
    pub fn consumers_behind(
        history: &History,
        addrs: &[SocketAddr],
        queue: &'static str,
        consumers: usize,
        behaviour: Behaviour,
        ids: Option<BrokerIds>,
    ) -> Load {
        let consumers_stop = CancellationToken::new();
        let consumers = (0..consumers)
            .map(|i| {
                let (h, addrs, home) = (history.clone(), addrs.to_vec(), i % addrs.len());
                let (seed, stop, ids) = (i as u64 + 1, consumers_stop.clone(), ids.clone());
                if behaviour.protocol.consume(i) {
                    tokio::spawn(consume_consumer(
                        h, addrs, home, queue, behaviour, seed, stop, ids,
                    ))
                } else {
                    tokio::spawn(consumer(h, addrs, home, queue, behaviour, seed, stop, ids))
                }
            })
            .collect();
        Load {
            history: history.clone(),
            queue,
            producers_stop: CancellationToken::new(),
            consumers_stop,
            producers: Vec::new(),
            consumers,
            sampler_stop: CancellationToken::new(),
            sampler: None,
            started: Instant::now(),
        }
    }

    /// Samples the jobs waiting deliverable in the queue through `pool`
    /// (the stall check) until [`Load::finish`] has drained; the Consume
    /// consumers check their half-closes through it too.
    pub fn watch(&mut self, pool: &PgPool) {
        self.history.set_db(pool);
        self.sampler = Some(tokio::spawn(sample_ready(
            self.history.clone(),
            vec![pool.clone()],
            vec![self.queue.to_owned()],
            self.sampler_stop.clone(),
        )));
    }

    /// Runs `task` as one more producer: [`Load::finish`] waits for it.
    pub fn produce(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.producers.push(tokio::spawn(task));
    }

    /// Runs `task` as one more consumer, stopping on
    /// [`Load::consumers_stop`]: [`Load::finish`] waits for it.
    pub fn consume(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.consumers.push(tokio::spawn(task));
    }

    /// The token consumers stop on.
    pub fn consumers_stop(&self) -> CancellationToken {
        self.consumers_stop.clone()
    }

    /// The token producers stop on (for [`producer`]s the test adds).
    pub fn producers_stop(&self) -> CancellationToken {
        self.producers_stop.clone()
    }

    /// Stops producers and consumers, and checks nothing (for a test about
    /// where streams go rather than about jobs).
    pub async fn stop(self) {
        self.producers_stop.cancel();
        self.consumers_stop.cancel();
        self.sampler_stop.cancel();
        for t in self.producers.into_iter().chain(self.consumers) {
            timeout(Duration::from_secs(20), t)
                .await
                .expect("load task stops")
                .expect("load task");
        }
    }

    /// Stops the load, drains what is left through `drain_addr`, checks the
    /// history, prints the figures and asserts the invariants.
    pub async fn finish(
        self,
        name: &str,
        pool: &PgPool,
        drain_addr: SocketAddr,
        queue: &'static str,
    ) -> Report {
        self.history.faults_over();
        self.producers_stop.cancel();
        for p in self.producers {
            timeout(Duration::from_secs(20), p)
                .await
                .expect("producer stops")
                .expect("producer task");
        }
        self.consumers_stop.cancel();
        for c in self.consumers {
            timeout(Duration::from_secs(20), c)
                .await
                .expect("consumer stops")
                .expect("consumer task");
        }
        let drained = final_drain(
            &self.history,
            pool,
            drain_addr,
            queue,
            Duration::from_secs(60),
        )
        .await;
        self.sampler_stop.cancel();
        if let Some(s) = self.sampler {
            s.await.expect("sampler");
        }
        let (dead, live) = final_ids(pool).await;
        let report = self.history.check(&dead, &live);
        eprintln!(
            "{} drain_s={:.1}",
            report.figures(name, self.started.elapsed()),
            drained.as_secs_f64()
        );
        report.assert_ok();
        assert!(live.is_empty(), "jobs left after the drain: {live:?}");
        report
    }
}

/// How a fault scenario's queue treats keys (issue 33).
#[derive(Clone, Copy, Debug)]
pub struct KeySettings {
    /// `ordered_by_key`: a key's jobs in enqueue order.
    pub ordered: bool,
    /// At most this many jobs of a key leased at once.
    pub key_concurrency: i32,
    /// `fair_by_key`: lease rounds serve the keys in turn (lease_keys.sql).
    pub fair: bool,
}

/// Sets `queue`'s key settings through the broker at `addr`, and tells
/// `history` what to check.
pub async fn set_keys(history: &History, addr: SocketAddr, queue: &str, k: KeySettings) {
    let mut admin =
        leaseq::pb::admin_service_client::AdminServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("admin connect");
    let s = admin
        .update_queue(pb::UpdateQueueRequest {
            queue: queue.to_owned(),
            create: true,
            ordered_by_key: Some(k.ordered),
            key_concurrency: Some(k.key_concurrency),
            fair_by_key: Some(k.fair),
            ..Default::default()
        })
        .await
        .expect("update_queue")
        .into_inner()
        .settings
        .expect("settings");
    assert_eq!(
        (s.ordered_by_key, s.key_concurrency, s.fair_by_key),
        (k.ordered, k.key_concurrency, k.fair),
        "{s:?}"
    );
    if k.ordered {
        history.ordered_by_key(queue, k.key_concurrency as usize);
    } else {
        history.key_concurrency(queue, k.key_concurrency as usize);
    }
}

pub async fn wait_acked(history: &History, n: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    while history.acked_count() < n {
        assert!(
            Instant::now() < deadline,
            "only {} jobs acked within {limit:?}",
            history.acked_count()
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// A schedule firing every second into a fault run's queue, its jobs
/// consumed with the rest and its ticks checked by the history
/// ([`History::schedule_started`]): cron `* * * * * *` in UTC, catch-up
/// `all` (limit 100: a tick missed during a fault must still fire), the
/// template's payload `tick:{name}`.
pub struct Ticker {
    name: String,
}

impl Ticker {
    /// Creates the schedule through the broker at `addr`.
    pub async fn start(history: &History, addr: SocketAddr, name: &str, queue: &str) -> Ticker {
        let mut admin = AdminServiceClient::new(lazy_client_channel(addr));
        let info = admin
            .create_schedule(pb::CreateScheduleRequest {
                schedule: Some(pb::Schedule {
                    name: name.to_owned(),
                    cron: "* * * * * *".into(),
                    time_zone: String::new(),
                    job: Some(pb::JobTemplate {
                        queue: queue.to_owned(),
                        payload: format!("tick:{name}").into_bytes(),
                        ..Default::default()
                    }),
                    overlap: pb::OverlapPolicy::Allow as i32,
                    catch_up: pb::CatchUpPolicy::All as i32,
                    catch_up_limit: 100,
                    paused: false,
                }),
            })
            .await
            .expect("create schedule")
            .into_inner();
        let first = info.next_run_at.as_ref().expect("next_run_at");
        history.schedule_started(name, super::history::ts_us(first));
        Ticker {
            name: name.to_owned(),
        }
    }

    /// Once the faults are over: waits (20 s at most) until the schedule
    /// has fired its tick of the database's last whole second, then
    /// deletes it through the broker at `addr` and tells the history which
    /// ticks were due (up to that one) and when the delete was answered.
    /// A tick not fired by then is left to the checker to report.
    pub async fn stop(self, history: &History, addr: SocketAddr, pool: &PgPool) {
        let mut admin = AdminServiceClient::new(lazy_client_channel(addr));
        let now_us = db_now_us(pool).await;
        let due_us = now_us - now_us.rem_euclid(1_000_000);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let got = admin
                .get_schedule(pb::GetScheduleRequest {
                    name: self.name.clone(),
                })
                .await;
            let last = got
                .ok()
                .and_then(|i| i.into_inner().last_tick_at)
                .map(|t| super::history::ts_us(&t));
            if last.is_some_and(|l| l >= due_us) {
                break;
            }
            sleep(Duration::from_millis(100)).await;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = admin
                .delete_schedule(pb::DeleteScheduleRequest {
                    name: self.name.clone(),
                })
                .await;
            match r {
                Ok(_) => break,
                Err(s) if s.code() == Code::Unavailable && Instant::now() < deadline => {
                    sleep(Duration::from_millis(100)).await;
                }
                Err(s) => panic!("delete schedule {}: {s:?}", self.name),
            }
        }
        history.schedule_stopped(&self.name, due_us, db_now_us(pool).await);
    }
}

/// A lazily connecting channel to `addr`.
fn lazy_client_channel(addr: SocketAddr) -> tonic::transport::Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .connect_lazy()
}

/// The database's clock, µs since the epoch.
async fn db_now_us(pool: &PgPool) -> i64 {
    let now: chrono::DateTime<chrono::Utc> = timeout(
        Duration::from_secs(20),
        sqlx::query_scalar("select now()").fetch_one(pool),
    )
    .await
    .expect("select now() in time")
    .expect("select now()");
    now.timestamp_micros()
}
