//! Consumers whose handlers take longer than their lease and keep it with
//! ExtendLease, as real workers do (the Rust `Worker`, `leaseq work`): each
//! delivery is handled in a task of its own while the stream is read on, and
//! every `extend_every` the handler extends its lease by `lease` (unary
//! ExtendLease on a Subscribe stream, on the stream with `confirm_settles`
//! on a Consume stream), until its work is done and it acks or nacks. Some
//! handlers die mid-work: they stop extending and never settle, and the job
//! comes back when the lease they last extended runs out. Everything is
//! recorded in the [`History`], the new expiry of every extension included.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaseq::pb;
use leaseq::pb::consume_response::Kind as ConsumeKind;
use leaseq::pb::subscribe_response::Kind;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::{sleep, timeout};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use super::history::{Delivered, History, Op, ts_us};
use super::load::{Rng, lazy_client};
use super::{Client, dur};

/// What a slow consumer does.
#[derive(Clone, Copy, Debug)]
pub struct Slow {
    /// The stream's lease, and what each extension asks for.
    pub lease: Duration,
    pub credit: u32,
    /// Work per job: uniform between the two.
    pub work: (Duration, Duration),
    /// How often a handler extends its lease while it works.
    pub extend_every: Duration,
    /// Fraction of handlers that die mid-work (never settle).
    pub die: f64,
    /// Fraction of jobs nacked (retry at once) when the work is done.
    pub nack: f64,
    /// Consume (settles and extensions on the stream) or Subscribe.
    pub consume: bool,
}

/// How a handler settles and extends: unary calls, or messages on its
/// Consume stream whose results the stream's reader hands back.
#[derive(Clone)]
enum Settler {
    Unary(Client),
    Stream {
        tx: mpsc::Sender<pb::ConsumeRequest>,
        waiting: Waiting,
    },
}

/// Handlers waiting for the result of a settle sent on the stream, by
/// (job id, op, lease token): how results are matched (queue.proto).
type Waiting = Arc<Mutex<HashMap<(String, i32, String), oneshot::Sender<pb::SettleResult>>>>;

fn status_of(r: &pb::SettleResult) -> Result<(), Status> {
    if r.code == 0 {
        Ok(())
    } else {
        Err(Status::new(Code::from(r.code), r.message.clone()))
    }
}

impl Settler {
    /// Sends `req` on the stream and waits (10 s at most) for the result of
    /// `op` on `rec`'s lease.
    async fn on_stream(
        tx: &mpsc::Sender<pb::ConsumeRequest>,
        waiting: &Waiting,
        rec: &Delivered,
        op: pb::SettleOp,
        req: pb::ConsumeRequest,
    ) -> Result<pb::SettleResult, Status> {
        let (done, result) = oneshot::channel();
        waiting
            .lock()
            .unwrap()
            .insert((rec.id.clone(), op as i32, rec.token.clone()), done);
        if tx.send(req).await.is_err() {
            return Err(Status::cancelled("stream closed before the send"));
        }
        match timeout(Duration::from_secs(10), result).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(Status::cancelled("stream ended before the result")),
            Err(_) => Err(Status::deadline_exceeded("no settle result in 10 s")),
        }
    }

    async fn ack(&self, rec: &Delivered) -> Result<(), Status> {
        match self {
            Settler::Unary(c) => super::load::ack(&mut c.clone(), &rec.id, &rec.token).await,
            Settler::Stream { tx, waiting } => {
                let req = pb::ConsumeRequest {
                    acks: vec![pb::AckRequest {
                        job_id: rec.id.clone(),
                        lease_token: rec.token.clone(),
                        enqueue: Vec::new(),
                        result: Vec::new(),
                    }],
                    ..Default::default()
                };
                Self::on_stream(tx, waiting, rec, pb::SettleOp::Ack, req)
                    .await
                    .and_then(|r| status_of(&r))
            }
        }
    }

    async fn nack(&self, rec: &Delivered) -> Result<(), Status> {
        let nack = pb::NackRequest {
            job_id: rec.id.clone(),
            lease_token: rec.token.clone(),
            error: "slow: nacked on purpose".into(),
            retry_after: Some(dur(Duration::ZERO)),
            dead_letter: false,
        };
        match self {
            Settler::Unary(c) => timeout(Duration::from_secs(10), c.clone().nack(nack))
                .await
                .unwrap_or_else(|_| Err(Status::deadline_exceeded("nack timed out")))
                .map(|_| ()),
            Settler::Stream { tx, waiting } => {
                let req = pb::ConsumeRequest {
                    nacks: vec![nack],
                    ..Default::default()
                };
                Self::on_stream(tx, waiting, rec, pb::SettleOp::Nack, req)
                    .await
                    .and_then(|r| status_of(&r))
            }
        }
    }

    /// The new expiry (database time, µs).
    async fn extend(&self, rec: &Delivered, lease: Duration) -> Result<i64, Status> {
        let ext = pb::ExtendLeaseRequest {
            job_id: rec.id.clone(),
            lease_token: rec.token.clone(),
            lease: Some(dur(lease)),
        };
        let at = match self {
            Settler::Unary(c) => {
                timeout(Duration::from_secs(10), c.clone().extend_lease(ext))
                    .await
                    .unwrap_or_else(|_| Err(Status::deadline_exceeded("extend timed out")))?
                    .into_inner()
                    .lease_expires_at
            }
            Settler::Stream { tx, waiting } => {
                let req = pb::ConsumeRequest {
                    extends: vec![ext],
                    ..Default::default()
                };
                let r = Self::on_stream(tx, waiting, rec, pb::SettleOp::Extend, req).await?;
                status_of(&r)?;
                r.lease_expires_at
            }
        };
        Ok(ts_us(
            &at.expect("an extension's answer has the new expiry"),
        ))
    }
}

/// One delivery's handler: works, extending every `extend_every`; dies
/// (returns without settling) at a random point when `dies`; stops when an
/// extension is refused (the lease is lost); then acks or nacks.
async fn handle(
    history: History,
    settler: Settler,
    broker: usize,
    rec: Delivered,
    b: Slow,
    (work, dies, nacks): (Duration, Option<Duration>, bool),
) {
    let mut done = Duration::ZERO;
    loop {
        let step = b.extend_every.min(work - done);
        if let Some(at) = dies
            && done + step >= at
        {
            sleep(at.saturating_sub(done)).await;
            return;
        }
        sleep(step).await;
        done += step;
        if done >= work {
            break;
        }
        let sent = history.sent(Op::Extend, &rec, broker);
        let r = settler.extend(&rec, b.lease).await;
        history.extended(sent, &r);
        if r.is_err_and(|s| s.code() == Code::FailedPrecondition) {
            return;
        }
    }
    let op = if nacks { Op::Nack } else { Op::Ack };
    let sent = history.sent(op, &rec, broker);
    let r = if nacks {
        settler.nack(&rec).await
    } else {
        settler.ack(&rec).await
    };
    history.answered(sent, &r);
}

/// A stream of either RPC, read as deliveries and settle results.
enum Conn {
    Subscribe(tonic::Streaming<pb::SubscribeResponse>),
    Consume(tonic::Streaming<pb::ConsumeResponse>),
}

#[allow(clippy::large_enum_variant)]
enum Msg {
    Delivery(pb::Delivery),
    Settled(Vec<pb::SettleResult>),
    Nothing,
}

impl Conn {
    async fn next(&mut self) -> Result<Option<Msg>, Status> {
        Ok(match self {
            Conn::Subscribe(s) => s.message().await?.map(|m| match m.kind {
                Some(Kind::Delivery(d)) => Msg::Delivery(d),
                _ => Msg::Nothing,
            }),
            Conn::Consume(s) => s.message().await?.map(|m| match m.kind {
                Some(ConsumeKind::Delivery(d)) => Msg::Delivery(d),
                Some(ConsumeKind::Settled(r)) => Msg::Settled(r.results),
                _ => Msg::Nothing,
            }),
        })
    }
}

/// A slow consumer of `queue` on `addrs[broker]` until `stop`: reopens its
/// stream when it ends; at `stop` it drops it (its jobs are released).
pub async fn slow_consumer(
    history: History,
    addrs: Vec<SocketAddr>,
    broker: usize,
    queue: &'static str,
    b: Slow,
    seed: u64,
    stop: CancellationToken,
) {
    let mut client = lazy_client(addrs[broker]);
    let mut rng = Rng::new(seed);
    let sub = pb::SubscribeRequest {
        queues: vec![queue.into()],
        consumer: format!("slow-{seed}"),
        max_in_flight: b.credit,
        lease: Some(dur(b.lease)),
        accept: Vec::new(),
    };
    while !stop.is_cancelled() {
        let waiting: Waiting = Default::default();
        let opened = if b.consume {
            let (tx, rx) = mpsc::channel::<pb::ConsumeRequest>(64);
            tx.try_send(pb::ConsumeRequest {
                subscribe: Some(sub.clone()),
                confirm_settles: true,
                ..Default::default()
            })
            .expect("room for the first message");
            timeout(
                Duration::from_secs(5),
                client.consume(ReceiverStream::new(rx)),
            )
            .await
            .map(|r| {
                r.map(|s| {
                    let settler = Settler::Stream {
                        tx,
                        waiting: waiting.clone(),
                    };
                    (Conn::Consume(s.into_inner()), settler)
                })
            })
        } else {
            timeout(Duration::from_secs(5), client.subscribe(sub.clone()))
                .await
                .map(|r| {
                    r.map(|s| {
                        let settler = Settler::Unary(client.clone());
                        (Conn::Subscribe(s.into_inner()), settler)
                    })
                })
        };
        let (mut conn, settler) = match opened {
            Ok(Ok(c)) => c,
            Ok(Err(s)) => {
                history.subscribe_err(s.code());
                sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(_) => {
                history.subscribe_err(Code::DeadlineExceeded);
                continue;
            }
        };
        let sid = history.consumer_stream(broker, b.credit, b.consume);
        let mut handlers = JoinSet::new();
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => {
                    history.stream_dropped(sid);
                    return;
                }
                m = conn.next() => m,
            };
            let d = match msg {
                Ok(Some(Msg::Delivery(d))) => d,
                Ok(Some(Msg::Settled(results))) => {
                    let mut w = waiting.lock().unwrap();
                    for r in results {
                        if let Some(done) =
                            w.remove(&(r.job_id.clone(), r.op, r.lease_token.clone()))
                        {
                            let _ = done.send(r);
                        }
                    }
                    continue;
                }
                Ok(Some(Msg::Nothing)) => continue,
                Ok(None) => {
                    history.stream_ended(sid, None);
                    break;
                }
                Err(s) => {
                    history.stream_ended(sid, Some(s.code()));
                    break;
                }
            };
            let rec = history.delivered(sid, broker, b.lease, &d);
            let span = b.work.1.saturating_sub(b.work.0);
            let work = b.work.0 + span.mul_f64(rng.next_f64());
            let dies = (rng.next_f64() < b.die).then(|| work.mul_f64(rng.next_f64()));
            let nacks = rng.next_f64() < b.nack;
            handlers.spawn(handle(
                history.clone(),
                settler.clone(),
                broker,
                rec,
                b,
                (work, dies, nacks),
            ));
            // Reap the handlers that are done.
            while handlers.try_join_next().is_some() {}
        }
        // The stream ended: its jobs are the broker's to release; its
        // handlers stop.
        handlers.abort_all();
        waiting.lock().unwrap().clear();
        sleep(Duration::from_millis(50)).await;
    }
}
