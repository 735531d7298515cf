//! [`Worker`]: a Subscribe stream kept open across broker restarts and
//! drains, a handler per job with bounded concurrency, automatic lease
//! extension, Ack / Nack, and a graceful stop.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status, Streaming};
use tracing::{Instrument, debug, info, info_span, warn};

use super::{Client, Delivery, Nack, pb_duration};
use leaseq_proto as pb;
use leaseq_proto::limits::{MAX_ERROR_LEN, MAX_IN_FLIGHT, MAX_LEASE, MIN_LEASE};

/// Settle (Ack / Nack) tries before giving up on a transient error; the
/// job's lease then runs out and it is delivered again.
const SETTLE_TRIES: u32 = 5;

/// Consumes one or more queues: subscribes, runs `handler` for each job, and
/// settles it (Ack on `Ok`, Nack with the error's text on `Err`).
///
/// - **Reconnects** when the stream ends or fails (broker restart, drain,
///   network) or cannot be opened (`UNAVAILABLE` and other transient codes),
///   after an exponential backoff with jitter (`reconnect_backoff`). Codes
///   that retrying cannot fix (`INVALID_ARGUMENT`, `PERMISSION_DENIED`,
///   `UNAUTHENTICATED`, `UNIMPLEMENTED`, ...) end [`Worker::run`] with that
///   status.
/// - **Bounded concurrency**: at most `concurrency` handlers run at once. It
///   is also the stream's credit (`max_in_flight`), so the broker never hands
///   this worker more jobs than it can run; a semaphore keeps the bound when
///   handlers of a broken stream still run after a reconnect.
/// - **Lease extension**: the worker asks for an explicit `lease` (default
///   30 s) and extends it by that much every half lease until the handler
///   returns, so a handler may run far longer than the lease. If an extension
///   is refused (`FAILED_PRECONDITION`: the lease was lost, e.g. after a long
///   network partition) the handler keeps running, but the job may be
///   delivered again meanwhile: handlers must be idempotent.
/// - **Settling**: Ack or Nack is retried on transient errors. A handler's
///   panic is a Nack with the panic message. Nack uses the queue's backoff.
/// - **Graceful stop**: when `shutdown` completes, no new handler starts;
///   running handlers get `grace` (default 30 s) to finish and settle; then
///   any still running are cancelled and the stream is closed, which makes
///   the broker release every job this worker had not settled (jobs that
///   arrived after the stop and never started included; the broker counts
///   that release as an attempt).
pub struct Worker {
    client: Client,
    queues: Vec<String>,
    consumer: String,
    concurrency: u32,
    lease: Duration,
    grace: Duration,
    reconnect_min: Duration,
    reconnect_max: Duration,
    idle_timeout: Duration,
}

impl Worker {
    /// A worker for `queues` with concurrency 1, a 30 s lease and a 30 s
    /// grace.
    pub fn new(client: Client, queues: impl IntoIterator<Item = impl Into<String>>) -> Worker {
        Worker {
            client,
            queues: queues.into_iter().map(Into::into).collect(),
            consumer: default_consumer(),
            concurrency: 1,
            lease: Duration::from_secs(30),
            grace: Duration::from_secs(30),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }

    /// Consumer name shown in admin views (default `<hostname>-<pid>`).
    pub fn consumer(mut self, name: impl Into<String>) -> Worker {
        self.consumer = name.into();
        self
    }

    /// Most handlers running at once, and the stream's credit (1 to 10,000).
    pub fn concurrency(mut self, n: u32) -> Worker {
        self.concurrency = n;
        self
    }

    /// Lease asked for each job and added at each extension (1 s to 12 h).
    pub fn lease(mut self, lease: Duration) -> Worker {
        self.lease = lease;
        self
    }

    /// How long running handlers may take to finish after `shutdown`.
    pub fn grace(mut self, grace: Duration) -> Worker {
        self.grace = grace;
        self
    }

    /// First and longest wait between reconnect attempts. Each wait doubles
    /// up to `max` and is scaled by a random factor in [0.5, 1), so workers
    /// cut off together do not reconnect together.
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Worker {
        self.reconnect_min = min;
        self.reconnect_max = max.max(min);
        self
    }

    /// A stream silent for this long is treated as dead and reopened. The
    /// broker sends heartbeats on idle streams (every 15 s by default), so
    /// keep this well above the broker's `--heartbeat-interval`. Default 60 s.
    pub fn idle_timeout(mut self, timeout: Duration) -> Worker {
        self.idle_timeout = timeout;
        self
    }

    /// Runs until `shutdown` completes, then stops gracefully (see the type's
    /// documentation). Returns `Err` only for a status that retrying cannot
    /// fix, such as `INVALID_ARGUMENT` for a bad queue name.
    pub async fn run<H, F, E>(
        self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Status>
    where
        H: Fn(Delivery) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        if !(1..=MAX_IN_FLIGHT).contains(&self.concurrency) {
            return Err(Status::invalid_argument(format!(
                "concurrency: must be 1 to {MAX_IN_FLIGHT}"
            )));
        }
        if self.lease < MIN_LEASE || self.lease > MAX_LEASE {
            return Err(Status::invalid_argument(
                "lease: must be between 1s and 12h",
            ));
        }
        let ctx = Arc::new(Ctx {
            client: self.client.clone(),
            acker: Acker::spawn(self.client.clone()),
            handler,
            lease: self.lease,
            permits: Arc::new(Semaphore::new(self.concurrency as usize)),
            stop: CancellationToken::new(),
        });
        // One task per delivered job (waiting for a permit, running, settling).
        // Ended by the graceful stop below: awaited, then aborted after grace.
        let mut tasks: JoinSet<()> = JoinSet::new();
        let mut backoff = Backoff::new(self.reconnect_min, self.reconnect_max);
        let mut shutdown = pin!(shutdown);
        // The open stream. It is kept through the stop so running handlers
        // can still settle on it, and dropped last: closing it makes the
        // broker release whatever is left unsettled.
        let mut stream: Option<Streaming<pb::SubscribeResponse>> = None;

        let result = loop {
            let Some(open) = stream.as_mut() else {
                let opened = tokio::select! {
                    _ = &mut shutdown => break Ok(()),
                    r = self.subscribe() => r,
                };
                match opened {
                    Ok(s) => {
                        debug!(queues = ?self.queues, "subscribed");
                        stream = Some(s);
                    }
                    Err(status) if fatal(&status) => break Err(status),
                    Err(status) => {
                        let wait = backoff.next();
                        warn!(code = ?status.code(), message = status.message(), retry_in = ?wait,
                            "subscribe failed; retrying");
                        tokio::select! {
                            _ = &mut shutdown => break Ok(()),
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                }
                continue;
            };
            let event = tokio::select! {
                _ = &mut shutdown => break Ok(()),
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    log_join(done);
                    continue;
                }
                msg = tokio::time::timeout(self.idle_timeout, open.message()) => msg,
            };
            let ended = match event {
                Ok(Ok(Some(msg))) => {
                    // A live stream: the next failure starts from the
                    // shortest wait again.
                    backoff.reset();
                    if let Some(pb::subscribe_response::Kind::Delivery(d)) = msg.kind {
                        match Delivery::from_pb(d) {
                            Some(job) => {
                                let span = info_span!("job", job_id = %job.id, queue = %job.queue, attempt = job.attempt);
                                tasks.spawn(process(ctx.clone(), job).instrument(span));
                            }
                            None => warn!("delivery without a job; ignored"),
                        }
                    }
                    continue;
                }
                Ok(Ok(None)) => "stream ended by the broker".to_owned(),
                Ok(Err(status)) => format!("{:?}: {}", status.code(), status.message()),
                Err(_) => format!("no message for {:?}", self.idle_timeout),
            };
            // Running handlers keep going; their jobs were released with the
            // stream, so their settles will be refused and the jobs redelivered.
            stream = None;
            let wait = backoff.next();
            info!(reason = %ended, retry_in = ?wait, "stream lost; reconnecting");
            tokio::select! {
                _ = &mut shutdown => break Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
        };

        // Graceful stop: no new handler starts; running ones get the grace.
        ctx.stop.cancel();
        let running = tasks.len();
        if running > 0 {
            info!(running, grace = ?self.grace, "stopping: waiting for running handlers");
        }
        let finished = tokio::time::timeout(self.grace, async {
            while let Some(done) = tasks.join_next().await {
                log_join(done);
            }
        })
        .await;
        if finished.is_err() {
            warn!(
                left = tasks.len(),
                "grace elapsed; cancelling handlers still running (their jobs are released)"
            );
            tasks.shutdown().await;
        }
        drop(stream);
        result
    }

    async fn subscribe(&self) -> Result<Streaming<pb::SubscribeResponse>, Status> {
        let req = pb::SubscribeRequest {
            queues: self.queues.clone(),
            consumer: self.consumer.clone(),
            max_in_flight: self.concurrency,
            lease: Some(pb_duration(self.lease)),
        };
        Ok(self
            .client
            .queue_service()
            .subscribe(req)
            .await?
            .into_inner())
    }
}

/// What every job task shares.
struct Ctx<H> {
    client: Client,
    /// Coalesces this worker's acks into AckBatch calls.
    acker: Acker,
    handler: H,
    lease: Duration,
    /// One permit per handler allowed to run: the concurrency bound.
    permits: Arc<Semaphore>,
    /// Cancelled at the graceful stop: jobs not yet started are left alone.
    stop: CancellationToken,
}

/// One delivered job: wait for a permit, run the handler while keeping the
/// lease alive, settle.
async fn process<H, F, E>(ctx: Arc<Ctx<H>>, job: Delivery)
where
    H: Fn(Delivery) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    // The lease is extended from receipt on, not from the handler's start:
    // time spent waiting for a permit also runs against it.
    let outcome = tokio::select! {
        outcome = run_handler(&ctx, job.clone()) => outcome,
        never = keep_leased(&ctx, &job) => match never {},
    };
    match outcome {
        None => debug!("not started before the stop; released when the stream closes"),
        Some(outcome) => settle(&ctx, &job, outcome).await,
    }
}

/// Runs the handler under a permit. None = stopped before it could start.
async fn run_handler<H, F, E>(ctx: &Ctx<H>, job: Delivery) -> Option<Result<(), String>>
where
    H: Fn(Delivery) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    let _permit = tokio::select! {
        biased;
        _ = ctx.stop.cancelled() => return None,
        p = ctx.permits.clone().acquire_owned() => p.ok()?,
    };
    // A task of its own so a panic becomes a Nack rather than a lost job;
    // aborted with this future (grace elapsed).
    let mut task = AbortOnDrop(tokio::spawn((ctx.handler)(job)));
    Some(match (&mut task.0).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(e) => Err(match e.try_into_panic() {
            Ok(p) => match p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
            {
                Some(msg) => format!("handler panicked: {msg}"),
                None => "handler panicked".to_owned(),
            },
            Err(_) => "handler cancelled".to_owned(),
        }),
    })
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Extends the job's lease every half lease. Never returns: it is dropped
/// when the handler finishes.
async fn keep_leased<H>(ctx: &Ctx<H>, job: &Delivery) -> Infallible {
    let mut wait = ctx.lease / 2;
    loop {
        tokio::time::sleep(wait).await;
        match ctx
            .client
            .extend_lease(&job.id, &job.lease_token, ctx.lease)
            .await
        {
            Ok(_) => {
                debug!("lease extended");
                wait = ctx.lease / 2;
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                warn!(
                    message = s.message(),
                    "lease lost; the job may be delivered again while the handler runs"
                );
                return std::future::pending().await;
            }
            Err(s) => {
                // Half the lease is left: try again soon.
                wait = (ctx.lease / 10).max(Duration::from_millis(100));
                warn!(code = ?s.code(), message = s.message(), "lease extension failed; retrying");
            }
        }
    }
}

type AckReply = oneshot::Sender<Result<(), Status>>;

/// Client-side group commit for acks: handlers that finish while an
/// AckBatch call is in flight are acked together by the next call, so a busy
/// worker makes one call per batch instead of one per job, and an idle one
/// sends a lone ack at once. Falls back to unary Ack against a broker without
/// AckBatch (`UNIMPLEMENTED`).
#[derive(Clone)]
struct Acker {
    /// To the task below; it ends when the last handle (the worker's `Ctx`)
    /// is dropped.
    tx: mpsc::UnboundedSender<((String, String), AckReply)>,
}

impl Acker {
    fn spawn(client: Client) -> Acker {
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

    async fn ack(&self, job_id: &str, lease_token: &str) -> Result<(), Status> {
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

/// Acks (`Ok`) or nacks (`Err(text)`), retrying transient failures.
async fn settle<H>(ctx: &Ctx<H>, job: &Delivery, outcome: Result<(), String>) {
    let error = outcome.as_ref().err().map(|e| error_text(e));
    let mut wait = Duration::from_millis(100);
    for attempt in 1..=SETTLE_TRIES {
        let r = match &error {
            None => ctx.acker.ack(&job.id, &job.lease_token).await,
            Some(text) => ctx
                .client
                .nack(&job.id, &job.lease_token, text, Nack::default())
                .await
                .map(|dead| {
                    if dead {
                        info!("job dead-lettered");
                    }
                }),
        };
        match r {
            Ok(()) => {
                match &error {
                    None => debug!("acked"),
                    Some(e) => info!(error = %e, "handler failed; nacked"),
                }
                return;
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                warn!(
                    message = s.message(),
                    "lease lost before settling; the job will be delivered again"
                );
                return;
            }
            Err(s) if !fatal(&s) && attempt < SETTLE_TRIES => {
                debug!(code = ?s.code(), "settle failed; retrying");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            Err(s) => {
                warn!(code = ?s.code(), message = s.message(),
                    "settle failed; the job will be delivered again when its lease ends");
                return;
            }
        }
    }
}

/// A Nack `error` the broker accepts: no NUL (PostgreSQL text cannot hold
/// it), at most 64 KiB (the start kept: it usually says what went wrong).
fn error_text(e: &str) -> String {
    let mut s = e.replace('\0', "\u{FFFD}");
    if s.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Statuses that retrying the same request cannot fix.
fn fatal(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::InvalidArgument
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
            | Code::NotFound
            | Code::OutOfRange
            | Code::AlreadyExists
    )
}

fn log_join(done: Result<(), JoinError>) {
    if let Err(e) = done
        && e.is_panic()
    {
        warn!(error = %e, "job task panicked");
    }
}

/// Exponential backoff with jitter for reconnects.
struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// The wait before the next try: the current step scaled by [0.5, 1).
    fn next(&mut self) -> Duration {
        let step = self.next;
        self.next = (step * 2).min(self.max);
        step.mul_f64(0.5 + 0.5 * random_unit())
    }

    fn reset(&mut self) {
        self.next = self.min;
    }
}

/// A random number in [0, 1), from the OS generator that `uuid` already
/// uses (no extra dependency for a little jitter).
fn random_unit() -> f64 {
    (uuid::Uuid::new_v4().as_u128() as u64 >> 11) as f64 / (1u64 << 53) as f64
}

fn default_consumer() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let host = if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "worker".to_owned()
    };
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let waits: Vec<Duration> = (0..6).map(|_| b.next()).collect();
        for (i, w) in waits.iter().enumerate() {
            let step = Duration::from_millis(100 * (1 << i)).min(Duration::from_secs(1));
            assert!(
                *w >= step / 2 && *w < step,
                "wait {i} = {w:?}, step {step:?}"
            );
        }
        b.reset();
        assert!(b.next() < Duration::from_millis(100));
    }

    #[test]
    fn error_text_is_storable() {
        assert_eq!(error_text("a\0b"), "a\u{FFFD}b");
        let long = "é".repeat(MAX_ERROR_LEN);
        let t = error_text(&long);
        assert!(t.len() <= MAX_ERROR_LEN && t.len() >= MAX_ERROR_LEN - 1);
    }
}
