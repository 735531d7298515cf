//! One stream of a [`Worker`](crate::Worker) and how the settles of its jobs
//! travel: on the `Consume` stream itself (many per message), or, on a
//! broker without it, a `Subscribe` stream with acks in `AckBatch` calls and
//! unary `Nack` / `ExtendLease`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status, Streaming};
use tracing::{debug, warn};

use crate::stats::WorkerStats;
use crate::{Client, Nack, pb, pb_duration, timestamp};

/// Most settles in one ConsumeRequest: well under the broker's default
/// per-list limit (1000).
const MAX_SETTLES_PER_MESSAGE: usize = 500;

/// What the worker's loop reads from a stream.
pub(crate) enum Event {
    /// One delivery, or several the broker packed together (`Deliveries`).
    Deliveries(Vec<pb::Delivery>),
    /// A held job was cancelled (`CancelJob`): its handler stops.
    Cancelled(pb::Cancelled),
    /// A heartbeat, or settle results (already handed to their waiters).
    Activity,
}

enum Responses {
    Consume(Streaming<pb::ConsumeResponse>),
    Subscribe(Streaming<pb::SubscribeResponse>),
}

/// An open stream.
pub(crate) struct Session {
    responses: Responses,
    settler: Arc<Settler>,
}

impl Session {
    /// Opens a Consume stream asking for confirmed settles. `UNIMPLEMENTED`
    /// means the broker does not serve Consume.
    pub async fn consume(
        client: &Client,
        sub: pb::SubscribeRequest,
        base: SettleBase,
    ) -> Result<Session, Status> {
        // Capacity 1: while one message waits for the transport, settles
        // pile up in the outbox and go together in the next one.
        let (requests, rx) = mpsc::channel(1);
        let first = pb::ConsumeRequest {
            subscribe: Some(sub),
            confirm_settles: true,
            ..Default::default()
        };
        requests
            .try_send(first)
            .expect("an empty channel takes one message");
        let responses = client
            .queue_service()
            .consume(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let (outbox, pending) = mpsc::unbounded_channel();
        tokio::spawn(write(pending, requests));
        let stream = StreamSide {
            shared: Mutex::new(Shared {
                outbox: Some(outbox),
                pending: HashMap::new(),
            }),
        };
        base.stats.consume_streams.fetch_add(1, Ordering::Relaxed);
        Ok(Session {
            responses: Responses::Consume(responses),
            settler: Arc::new(Settler {
                base,
                stream: Some(stream),
                features: OnceLock::new(),
            }),
        })
    }

    /// Opens a Subscribe stream (settles by unary calls and AckBatch).
    pub async fn subscribe(
        client: &Client,
        sub: pb::SubscribeRequest,
        base: SettleBase,
    ) -> Result<Session, Status> {
        let responses = client.queue_service().subscribe(sub).await?.into_inner();
        base.stats.subscribe_streams.fetch_add(1, Ordering::Relaxed);
        Ok(Session {
            responses: Responses::Subscribe(responses),
            settler: Arc::new(Settler {
                base,
                stream: None,
                features: OnceLock::new(),
            }),
        })
    }

    pub fn is_consume(&self) -> bool {
        matches!(self.responses, Responses::Consume(_))
    }

    /// How the jobs of this stream are settled.
    pub fn settler(&self) -> Arc<Settler> {
        self.settler.clone()
    }

    /// The next message: `Ok(None)` when the broker ended the stream.
    pub async fn next(&mut self) -> Result<Option<Event>, Status> {
        let event = self.read().await;
        if let Ok(Some(_)) = &event {
            // The first message of a stream is its heartbeat with the
            // broker's features; anything else first: a broker without them.
            let _ = self.settler.features.set(Vec::new());
        }
        event
    }

    async fn read(&mut self) -> Result<Option<Event>, Status> {
        let features = &self.settler.features;
        let first_heartbeat = |h: pb::Heartbeat| {
            let _ = features.set(h.features);
            Event::Activity
        };
        match &mut self.responses {
            Responses::Subscribe(s) => Ok(s.message().await?.map(|m| match m.kind {
                Some(pb::subscribe_response::Kind::Heartbeat(h)) => first_heartbeat(h),
                Some(pb::subscribe_response::Kind::Delivery(d)) => Event::Deliveries(vec![d]),
                Some(pb::subscribe_response::Kind::Deliveries(d)) => {
                    Event::Deliveries(d.deliveries)
                }
                Some(pb::subscribe_response::Kind::Cancelled(c)) => Event::Cancelled(c),
                _ => Event::Activity,
            })),
            Responses::Consume(s) => Ok(match s.message().await? {
                None => None,
                Some(m) => Some(match m.kind {
                    Some(pb::consume_response::Kind::Delivery(d)) => Event::Deliveries(vec![d]),
                    Some(pb::consume_response::Kind::Deliveries(d)) => {
                        Event::Deliveries(d.deliveries)
                    }
                    Some(pb::consume_response::Kind::Cancelled(c)) => Event::Cancelled(c),
                    Some(pb::consume_response::Kind::Heartbeat(h)) => first_heartbeat(h),
                    Some(pb::consume_response::Kind::Settled(r)) => {
                        self.settler.resolve(r.results);
                        Event::Activity
                    }
                    _ => Event::Activity,
                }),
            }),
        }
    }

    /// Marks the stream gone: settles waiting for an answer fail with
    /// `UNAVAILABLE` (and are retried by unary calls), later ones go by
    /// unary calls. Dropping the responses cancels the call if it is open,
    /// which makes the broker release whatever is still unsettled.
    pub fn end(self) {
        self.settler.end();
    }

    /// Graceful end: half-closes a Consume stream (the broker finishes the
    /// settles it was sent, releases the rest and ends the stream with OK)
    /// and waits up to `limit` for that end, handing out settle results
    /// meanwhile. A Subscribe stream is just closed.
    pub async fn close(mut self, limit: Duration) {
        if let Some(stream) = &self.settler.stream {
            stream.shared.lock().expect("poisoned").outbox = None;
            let ended = tokio::time::timeout(limit, async {
                loop {
                    match self.next().await {
                        Ok(Some(_)) => {}
                        Ok(None) => return Ok(()),
                        Err(s) => return Err(s),
                    }
                }
            })
            .await;
            match ended {
                Ok(Ok(())) => debug!("stream closed"),
                // UNAVAILABLE: the broker could not release the stream's
                // jobs; they come back when their leases run out.
                Ok(Err(s)) => {
                    warn!(code = ?s.code(), message = s.message(), "stream failed while closing")
                }
                Err(_) => debug!(
                    ?limit,
                    "no end of the stream after the half-close; cancelled"
                ),
            }
        }
        self.end();
    }
}

/// Writes the outbox to the request stream, coalescing whatever queued up
/// while the previous message was in flight. Ends when the outbox closes
/// (half-close: dropping `requests` ends the request stream) or the call is
/// gone.
async fn write(
    mut outbox: mpsc::UnboundedReceiver<Outgoing>,
    requests: mpsc::Sender<pb::ConsumeRequest>,
) {
    while let Some(first) = outbox.recv().await {
        // Let handlers finishing at the same moment add theirs.
        tokio::task::yield_now().await;
        let mut req = pb::ConsumeRequest::default();
        first.add_to(&mut req);
        for _ in 1..MAX_SETTLES_PER_MESSAGE {
            match outbox.try_recv() {
                Ok(more) => more.add_to(&mut req),
                Err(_) => break,
            }
        }
        if requests.send(req).await.is_err() {
            return;
        }
    }
}

enum Outgoing {
    Ack(pb::AckRequest),
    Nack(pb::NackRequest),
    Extend(pb::ExtendLeaseRequest),
    /// A progress report: no answer is waited for (the broker answers
    /// only refusals); the latest of a job in one message replaces the rest.
    Progress(pb::Progress),
}

impl Outgoing {
    fn add_to(self, req: &mut pb::ConsumeRequest) {
        match self {
            Outgoing::Ack(a) => req.acks.push(a),
            Outgoing::Nack(n) => req.nacks.push(n),
            Outgoing::Extend(x) => req.extends.push(x),
            Outgoing::Progress(p) => match req.progress.iter_mut().find(|q| q.job_id == p.job_id) {
                Some(q) => *q = p,
                None => req.progress.push(p),
            },
        }
    }
}

type Reply = oneshot::Sender<pb::SettleResult>;

struct StreamSide {
    shared: Mutex<Shared>,
}

struct Shared {
    /// To the writer; None once the stream is closing or gone.
    outbox: Option<mpsc::UnboundedSender<Outgoing>>,
    /// Settles sent and not yet answered, oldest first per (op, job id),
    /// each with its lease token: the broker answers two settles of one job
    /// in no set order, and echoes the token to tell them apart.
    pending: HashMap<(i32, String), VecDeque<(String, Reply)>>,
}

/// What every stream's settler shares: the unary client, the AckBatch
/// coalescer and the counters.
#[derive(Clone)]
pub(crate) struct SettleBase {
    pub client: Client,
    pub acker: Acker,
    pub stats: Arc<WorkerStats>,
}

/// Settles the jobs one stream delivered: on that stream while it is open
/// (Consume), otherwise by AckBatch and unary calls. Errors are the
/// statuses the unary calls would have returned.
pub(crate) struct Settler {
    base: SettleBase,
    stream: Option<StreamSide>,
    /// What the broker said it understands, from the stream's first
    /// message (`Heartbeat.features`; empty from a broker before them).
    /// Unset until that message came.
    features: OnceLock<Vec<String>>,
}

impl Settler {
    /// Queues one settle on the stream; None when the stream is closing or
    /// gone (the caller goes unary).
    fn send(
        &self,
        op: pb::SettleOp,
        (job_id, token): (&str, &str),
        msg: Outgoing,
    ) -> Option<oneshot::Receiver<pb::SettleResult>> {
        let stream = self.stream.as_ref()?;
        let mut shared = stream.shared.lock().expect("poisoned");
        let outbox = shared.outbox.as_ref()?;
        outbox.send(msg).ok()?;
        let (tx, rx) = oneshot::channel();
        shared
            .pending
            .entry((op as i32, job_id.to_owned()))
            .or_default()
            .push_back((token.to_owned(), tx));
        Some(rx)
    }

    /// Sends on the stream and waits for the broker's answer. None: not
    /// sent (use a unary call). `Some(Err(UNAVAILABLE))`: the stream ended
    /// before the answer came (the settle may or may not have been applied).
    async fn on_stream(
        &self,
        op: pb::SettleOp,
        held: (&str, &str),
        msg: Outgoing,
    ) -> Option<Result<pb::SettleResult, Status>> {
        let rx = self.send(op, held, msg)?;
        self.base
            .stats
            .settled_on_stream
            .fetch_add(u64::from(op != pb::SettleOp::Extend), Ordering::Relaxed);
        Some(match rx.await {
            Ok(r) if r.code == 0 => Ok(r),
            Ok(r) => Err(Status::new(Code::from(r.code), r.message)),
            Err(_) => Err(Status::unavailable(
                "the stream ended before the broker answered; the settle may or may not have been applied",
            )),
        })
    }

    /// Hands settle results to their waiters.
    fn resolve(&self, results: Vec<pb::SettleResult>) {
        let Some(stream) = &self.stream else { return };
        let mut shared = stream.shared.lock().expect("poisoned");
        for r in results {
            let key = (r.op, r.job_id.clone());
            let Some(waiters) = shared.pending.get_mut(&key) else {
                debug!(job_id = %r.job_id, op = r.op, "settle result nobody waits for");
                continue;
            };
            // The waiter with the echoed token; a broker from before the
            // echo sends none: the oldest.
            let at = match r.lease_token.as_str() {
                "" => Some(0),
                t => waiters.iter().position(|(token, _)| token == t),
            };
            let waiter = at.and_then(|i| waiters.remove(i)).map(|(_, w)| w);
            if waiters.is_empty() {
                shared.pending.remove(&key);
            }
            if let Some(w) = waiter {
                let _ = w.send(r);
            } else {
                debug!(job_id = %r.job_id, op = r.op, "settle result for a token nobody waits for");
            }
        }
    }

    /// The stream is gone: nothing more is sent on it, and the settles
    /// waiting for an answer fail (their senders are dropped).
    fn end(&self) {
        if let Some(stream) = &self.stream {
            let mut shared = stream.shared.lock().expect("poisoned");
            shared.outbox = None;
            shared.pending.clear();
        }
    }

    /// Whether the stream's broker listed `feature` in its first message
    /// (false before that message came).
    pub fn supports(&self, feature: &str) -> bool {
        self.features
            .get()
            .is_some_and(|f| f.iter().any(|x| x == feature))
    }

    /// Acks the job, with its follow-ups (`AckRequest.enqueue`, only to a
    /// broker that [`supports`](Settler::supports) `"ack.enqueue"`) and its
    /// result (only with `"ack.result"`: the caller checks both); the
    /// follow-ups' ids, in order.
    pub async fn ack(
        &self,
        held: (&str, &str),
        follow_ups: &[pb::EnqueueRequest],
        result: &[u8],
    ) -> Result<Vec<String>, Status> {
        let (job_id, lease_token) = held;
        let req = || pb::AckRequest {
            job_id: job_id.to_owned(),
            lease_token: lease_token.to_owned(),
            enqueue: follow_ups.to_vec(),
            result: result.to_vec(),
        };
        if let Some(r) = self
            .on_stream(pb::SettleOp::Ack, held, Outgoing::Ack(req()))
            .await
        {
            return r.map(|r| r.enqueued);
        }
        if !follow_ups.is_empty() || !result.is_empty() {
            // AckBatch refuses follow-ups (its results have no place for
            // their ids): a unary Ack; a result too (the batch stays plain).
            self.base
                .stats
                .settled_unary
                .fetch_add(1, Ordering::Relaxed);
            let resp = self.base.client.queue_service().ack(req()).await?;
            return Ok(resp.into_inner().enqueued);
        }
        self.base
            .stats
            .settled_batched
            .fetch_add(1, Ordering::Relaxed);
        self.base
            .acker
            .ack(job_id, lease_token)
            .await
            .map(|()| Vec::new())
    }

    /// A progress report of a job this stream delivered: with the stream's
    /// next message (nothing waited for), or `ReportProgress` once the
    /// stream is gone or on Subscribe. Checked first (`INVALID_ARGUMENT`
    /// naming the field); `UNIMPLEMENTED` when the broker did not list
    /// `"progress"`.
    pub async fn progress(
        &self,
        (job_id, lease_token): (&str, &str),
        fraction: f32,
        message: &str,
    ) -> Result<(), Status> {
        crate::check_progress(fraction, message)?;
        if !self.supports(leaseq_proto::features::PROGRESS) {
            return Err(Status::unimplemented(
                "progress: the broker did not list \"progress\" in its first heartbeat (it predates \
                 progress reports): nothing was sent",
            ));
        }
        if let Some(stream) = &self.stream {
            let shared = stream.shared.lock().expect("poisoned");
            if let Some(outbox) = &shared.outbox {
                let msg = Outgoing::Progress(pb::Progress {
                    job_id: job_id.to_owned(),
                    lease_token: lease_token.to_owned(),
                    fraction,
                    message: message.to_owned(),
                });
                if outbox.send(msg).is_ok() {
                    return Ok(());
                }
            }
        }
        self.base
            .client
            .report_progress(job_id, lease_token, fraction, message)
            .await
    }

    /// Returns whether the job went to the dead letters.
    pub async fn nack(
        &self,
        held: (&str, &str),
        error: &str,
        options: &Nack,
    ) -> Result<bool, Status> {
        let (job_id, lease_token) = held;
        let msg = Outgoing::Nack(pb::NackRequest {
            job_id: job_id.to_owned(),
            lease_token: lease_token.to_owned(),
            error: error.to_owned(),
            retry_after: options.retry_after.map(pb_duration),
            dead_letter: options.dead_letter,
        });
        if let Some(r) = self.on_stream(pb::SettleOp::Nack, held, msg).await {
            return r.map(|r| r.dead_lettered);
        }
        self.base
            .stats
            .settled_unary
            .fetch_add(1, Ordering::Relaxed);
        self.base
            .client
            .nack(job_id, lease_token, error, options.clone())
            .await
    }

    /// Keeps the job (its id and lease token) leased for `lease` more.
    pub async fn extend(&self, held: (&str, &str), lease: Duration) -> Result<(), Status> {
        let (job_id, lease_token) = held;
        let msg = Outgoing::Extend(pb::ExtendLeaseRequest {
            job_id: job_id.to_owned(),
            lease_token: lease_token.to_owned(),
            lease: Some(pb_duration(lease)),
        });
        if let Some(r) = self.on_stream(pb::SettleOp::Extend, held, msg).await {
            return r.map(|r| {
                debug!(until = ?r.lease_expires_at.and_then(timestamp), "lease extended");
            });
        }
        self.base
            .client
            .extend_lease(job_id, lease_token, lease)
            .await
            .map(|until| debug!(?until, "lease extended"))
    }
}

type AckReply = oneshot::Sender<Result<(), Status>>;

/// Client-side group commit for acks: handlers that finish while an
/// AckBatch call is in flight are acked together by the next call, so a busy
/// worker makes one call per batch instead of one per job, and an idle one
/// sends a lone ack at once. Falls back to unary Ack against a broker without
/// AckBatch (`UNIMPLEMENTED`).
#[derive(Clone)]
pub(crate) struct Acker {
    /// To the task below; it ends when the last handle is dropped.
    tx: mpsc::UnboundedSender<((String, String), AckReply)>,
}

impl Acker {
    pub fn spawn(client: Client) -> Acker {
        let (tx, mut rx) = mpsc::unbounded_channel::<((String, String), AckReply)>();
        tokio::spawn(async move {
            let mut batch_supported = true;
            while let Some(first) = rx.recv().await {
                let mut pending = vec![first];
                while pending.len() < ACK_BATCH_MAX {
                    match rx.try_recv() {
                        Ok(more) => pending.push(more),
                        Err(_) => break,
                    }
                }
                let (acks, replies): (Vec<_>, Vec<_>) = pending.into_iter().unzip();
                if batch_supported {
                    match client.ack_batch(&acks).await {
                        Ok(results) => {
                            for (reply, r) in replies.into_iter().zip(results) {
                                let _ = reply.send(r);
                            }
                            continue;
                        }
                        Err(s) if s.code() == Code::Unimplemented => batch_supported = false,
                        // A broker configured with a smaller batch limit:
                        // these go one by one.
                        Err(s) if s.code() == Code::ResourceExhausted => {}
                        Err(s) => {
                            for reply in replies {
                                let _ = reply.send(Err(s.clone()));
                            }
                            continue;
                        }
                    }
                }
                for ((id, token), reply) in acks.iter().zip(replies) {
                    let _ = reply.send(client.ack(id, token).await);
                }
            }
        });
        Acker { tx }
    }

    pub async fn ack(&self, job_id: &str, lease_token: &str) -> Result<(), Status> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(((job_id.to_owned(), lease_token.to_owned()), reply))
            .map_err(|_| Status::cancelled("worker stopped"))?;
        rx.await
            .unwrap_or_else(|_| Err(Status::cancelled("worker stopped")))
    }
}

/// Most acks in one AckBatch call: well under the broker's default batch
/// limit (1000), and already a hundredfold fewer calls.
const ACK_BATCH_MAX: usize = 100;
