//! [`Worker`]: a `Consume` stream (or Subscribe + AckBatch) kept open across
//! broker restarts and drains, handlers per queue with bounded concurrency
//! and an optional timeout, automatic lease extension, outcomes, and a
//! graceful stop.

use std::collections::HashMap;
use std::future::Future;
use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::Arc;

use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::Semaphore;
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};
use tracing::{Instrument, Level, Span, debug, field, info, info_span, warn};

use crate::outcome::{Ack, BoxError, HandlerError, NackKind, NackOutcome, Outcome};
use crate::session::{Acker, Event, Session, SettleBase, Settler};
use crate::stats::WorkerStats;
use crate::{Client, Delivery, Nack, pb, pb_duration};
use leaseq_proto::limits::{MAX_IN_FLIGHT, MAX_LEASE, MIN_LEASE};

/// Settle (Ack / Nack) tries before giving up on a transient error; the
/// job's lease then runs out and it is delivered again.
const SETTLE_TRIES: u32 = 5;

/// Handlers at once, and the stream's credit, unless
/// [`Worker::concurrency`] says otherwise: 16 in every leaseq SDK (Python,
/// Node, Go too). It is the credit a bare `Subscribe` gets by default, so a
/// worker holds what any stream would; handlers mostly wait on I/O, where
/// one at a time leaves the worker idle at every round trip. A handler that
/// must not run beside itself asks for `concurrency(1)`.
pub const DEFAULT_CONCURRENCY: u32 = 16;

/// How long a stopping worker waits for the broker to end a half-closed
/// Consume stream.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// A handler's future, its error already turned into an outcome (where the
/// error's type is still known).
type HandlerFuture = Pin<Box<dyn Future<Output = Result<Ack, Outcome>> + Send>>;
type DynHandler = Arc<dyn Fn(Delivery) -> HandlerFuture + Send + Sync>;
type DynMiddleware = Arc<dyn Fn(Delivery, Next) -> HandlerFuture + Send + Sync>;

/// The rest of the chain, for a middleware ([`Worker::middleware`]): the
/// next middleware, or the queue's handler.
pub struct Next(DynHandler);

impl Next {
    /// Runs the rest of the chain. Its error is what the handler's became
    /// ([`HandlerError`]): return it to settle the job as the handler said.
    /// Its success is the handler's [`Ack`] (follow-up jobs, or settled in
    /// SQL): return it too, or its follow-ups are not enqueued.
    pub async fn run(self, job: Delivery) -> Result<Ack, HandlerError> {
        (self.0)(job).await.map_err(HandlerError)
    }
}

/// `handler` behind `middleware`.
fn wrap(middleware: &DynMiddleware, handler: DynHandler) -> DynHandler {
    let middleware = middleware.clone();
    Arc::new(move |job| middleware(job, Next(handler.clone())))
}

/// A tracing event at a level chosen at run time (the macros want a
/// constant one).
macro_rules! event_at {
    ($level:expr, $($arg:tt)+) => {
        match $level {
            Level::ERROR => tracing::error!($($arg)+),
            Level::WARN => tracing::warn!($($arg)+),
            Level::INFO => tracing::info!($($arg)+),
            Level::DEBUG => tracing::debug!($($arg)+),
            _ => tracing::trace!($($arg)+),
        }
    };
}

fn boxed<H, F, R, E>(handler: H) -> DynHandler
where
    H: Fn(Delivery) -> F + Send + Sync + 'static,
    F: Future<Output = Result<R, E>> + Send + 'static,
    R: Into<Ack>,
    E: Into<BoxError> + 'static,
{
    Arc::new(move |job| {
        let fut = handler(job);
        Box::pin(async move { fut.await.map(Into::into).map_err(Outcome::of) })
    })
}

/// Consumes one or more queues: keeps a stream open, runs the queue's
/// handler for each job, and settles it from the handler's result.
///
/// Two ways to give handlers, which mix: [`Worker::new`]`(client, queues)`
/// then [`Worker::run`]`(handler, shutdown)` runs one handler for every
/// queue listed; [`Worker::builder`]`(client)` then
/// [`handle`](Worker::handle)`(queue, handler)` per queue and
/// [`Worker::serve`]`(shutdown)`. A queue given to `handle` uses that
/// handler, even if also listed in `new`.
///
/// - **Outcomes**: a handler returns `Result<(), E>` (or `Result<Ack, E>`)
///   for any error type that converts into [`BoxError`] (`anyhow::Error`,
///   `String`, any `std::error::Error`). `Ok(())` acks; `Ok(`[`Ack`]`)`
///   acks with follow-up jobs ([`Ack::then`]) or sends nothing for a job the
///   handler settled in SQL ([`Ack::settled_in_sql`]). An error whose chain holds a
///   [`Retry`](crate::Retry) nacks with its `after` as `retry_after`; one
///   holding a [`DeadLetter`](crate::DeadLetter) dead-letters the job; any
///   other nacks it with its text (the error and its sources joined by
///   `": "`, NUL replaced, cut to 64 KiB), the queue's backoff deciding the
///   retry. A panic nacks with `handler panicked: <message>`.
/// - **Timeout** ([`timeout`](Worker::timeout), or per queue with
///   [`queue_timeout`](Worker::queue_timeout)): a handler still running then
///   is dropped (cancelled at its next `.await`) and the job nacked with
///   `timeout: the handler ran longer than <t>` and the queue's backoff, so
///   it comes back as the next attempt. A handler blocking its thread
///   cannot be cancelled: use `spawn_blocking` for such work.
/// - **Settles on the stream**: the worker opens `Consume`; acks, nacks and
///   lease extensions travel on it, many per message when they pile up
///   (whatever finished while the previous message was in flight goes in
///   the next). A broker that answers `UNIMPLEMENTED` (an older one) gets
///   `Subscribe`, acks coalesced into `AckBatch` calls and unary `Nack` /
///   `ExtendLease`; so does every broker with
///   [`stream_acks(false)`](Worker::stream_acks).
/// - **Lost lease**: a settle refused with `FAILED_PRECONDITION` (the lease
///   expired, was taken over, the job was cancelled or released with its
///   stream) ends that job quietly (a debug log —
///   [`lost_lease_log_level`](Worker::lost_lease_log_level) —, counted in
///   [`WorkerStats::lease_lost`]); if a lease extension is refused so while
///   the handler runs, the handler is cancelled: the job is someone else's.
/// - **Reconnects** when the stream ends or fails (broker restart, drain —
///   `UNAVAILABLE` —, network) or cannot be opened, after an exponential
///   backoff with jitter ([`reconnect_backoff`](Worker::reconnect_backoff)).
///   Codes that retrying cannot fix (`INVALID_ARGUMENT`,
///   `PERMISSION_DENIED`, `UNAUTHENTICATED`, `NOT_FOUND`, ...) end the run
///   with that status.
/// - **Bounded concurrency**: at most `concurrency` handlers run at once. It
///   is also the stream's credit (`max_in_flight`), so the broker never
///   hands this worker more jobs than it can run; a semaphore keeps the
///   bound when handlers of a broken stream still run after a reconnect.
/// - **Lease extension**: the worker asks for an explicit `lease` (default
///   30 s) and extends it by that much every half lease from delivery until
///   the handler returns, so a handler may run far longer than the lease.
///   One task of the worker's keeps every job's lease (looking a tenth of a
///   lease at a time for those due), so a handler that holds its thread
///   still has its lease kept while another thread of the runtime is free.
/// - **Graceful stop**: when `shutdown` completes, no new handler starts;
///   running handlers get `grace` (default 30 s) to finish and settle (the
///   stream stays open meanwhile); then any still running are cancelled,
///   and the stream is half-closed (Consume: the broker applies every
///   settle it was sent, releases the rest and ends the stream, which the
///   worker waits for) or closed (Subscribe). Jobs delivered after the stop
///   and never started are released at once (the broker counts that as an
///   attempt).
pub struct Worker {
    client: Client,
    /// Queues for the handler given to [`Worker::run`].
    queues: Vec<String>,
    routes: Vec<(String, DynHandler)>,
    timeout: Option<Duration>,
    timeouts: HashMap<String, Duration>,
    consumer: String,
    concurrency: u32,
    /// The stream's credit, when more than `concurrency` ([`Worker::prefetch`]).
    prefetch: Option<u32>,
    lease: Duration,
    grace: Duration,
    reconnect_min: Duration,
    reconnect_max: Duration,
    idle_timeout: Duration,
    stream_acks: bool,
    lost_lease_level: Level,
    stats: Arc<WorkerStats>,
    /// Outermost first.
    middlewares: Vec<DynMiddleware>,
    /// Burst mode: return once nothing was delivered or running this long.
    burst: Option<Duration>,
}

impl Worker {
    /// A worker for `queues`, whose handler [`Worker::run`] takes; with
    /// concurrency 16 (see [`Worker::concurrency`]), a 30 s lease, a 30 s
    /// grace and no timeout.
    pub fn new(client: Client, queues: impl IntoIterator<Item = impl Into<String>>) -> Worker {
        let mut w = Worker::builder(client);
        w.queues = queues.into_iter().map(Into::into).collect();
        w
    }

    /// A worker without queues yet: add them with [`Worker::handle`], then
    /// [`Worker::serve`].
    pub fn builder(client: Client) -> Worker {
        Worker {
            client,
            queues: Vec::new(),
            routes: Vec::new(),
            timeout: None,
            timeouts: HashMap::new(),
            consumer: default_consumer(),
            concurrency: DEFAULT_CONCURRENCY,
            prefetch: None,
            lease: Duration::from_secs(30),
            grace: Duration::from_secs(30),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            stream_acks: true,
            lost_lease_level: Level::DEBUG,
            stats: Arc::new(WorkerStats::default()),
            middlewares: Vec::new(),
            burst: None,
        }
    }

    /// Runs `handler` for the jobs of `queue` (a queue may be given once).
    ///
    /// ```no_run
    /// use leaseq_client::{Client, Delivery, Worker};
    ///
    /// async fn send_email(job: Delivery) -> anyhow::Result<()> { Ok(()) }
    /// async fn send_sms(job: Delivery) -> Result<(), String> { Ok(()) }
    ///
    /// # async fn demo(client: Client) -> Result<(), tonic::Status> {
    /// Worker::builder(client)
    ///     .handle("emails", send_email)
    ///     .handle("sms", send_sms)
    ///     .serve(async { tokio::signal::ctrl_c().await.ok(); })
    ///     .await
    /// # }
    /// ```
    pub fn handle<H, F, R, E>(mut self, queue: impl Into<String>, handler: H) -> Worker
    where
        H: Fn(Delivery) -> F + Send + Sync + 'static,
        F: Future<Output = Result<R, E>> + Send + 'static,
        R: Into<Ack>,
        E: Into<BoxError> + 'static,
    {
        self.routes.push((queue.into(), boxed(handler)));
        self
    }

    /// Runs `handler` for the jobs of `task`'s queue, each payload read
    /// into `T` first (JSON). A payload that is not a `T` never will be:
    /// its job is dead-lettered with `payload is not a valid <T>: <why>`.
    pub fn task<T, H, F, R, E>(self, task: crate::Task<T>, handler: H) -> Worker
    where
        T: serde::de::DeserializeOwned + Send + 'static,
        H: Fn(T, Delivery) -> F + Send + Sync + 'static,
        F: Future<Output = Result<R, E>> + Send + 'static,
        R: Into<Ack>,
        E: Into<BoxError> + 'static,
    {
        let handler = Arc::new(handler);
        self.handle(task.queue(), move |job: Delivery| {
            let parsed = job.json::<T>();
            let handler = handler.clone();
            async move {
                match parsed {
                    Ok(payload) => handler(payload, job)
                        .await
                        .map(Into::into)
                        .map_err(Into::into),
                    Err(e) => Err(crate::DeadLetter::new(format!(
                        "payload is not a valid {}: {e}",
                        std::any::type_name::<T>()
                    ))
                    .into()),
                }
            }
        })
    }

    /// Runs every job through `middleware`, which gets the job and the rest
    /// of the chain ([`Next`]): logging, metrics, an error policy. The
    /// first one added is the outermost. Its result settles the job as a
    /// handler's would; returning what [`Next::run`] gave keeps the
    /// handler's outcome (a [`Retry`](crate::Retry) stays a retry).
    ///
    /// ```no_run
    /// use leaseq_client::{Client, Delivery, Next, Worker};
    ///
    /// # async fn demo(client: Client) -> Result<(), tonic::Status> {
    /// Worker::builder(client)
    ///     .middleware(|job: Delivery, next: Next| async move {
    ///         let (id, started) = (job.id.clone(), std::time::Instant::now());
    ///         let result = next.run(job).await;
    ///         tracing::info!(%id, took = ?started.elapsed(), ok = result.is_ok());
    ///         result
    ///     })
    ///     .handle("emails", |_job: Delivery| async { Ok::<(), anyhow::Error>(()) })
    ///     .serve(async { tokio::signal::ctrl_c().await.ok(); })
    ///     .await
    /// # }
    /// ```
    pub fn middleware<M, F, R, E>(mut self, middleware: M) -> Worker
    where
        M: Fn(Delivery, Next) -> F + Send + Sync + 'static,
        F: Future<Output = Result<R, E>> + Send + 'static,
        R: Into<Ack>,
        E: Into<BoxError> + 'static,
    {
        self.middlewares.push(Arc::new(move |job, next| {
            let fut = middleware(job, next);
            Box::pin(async move { fut.await.map(Into::into).map_err(Outcome::of) })
        }));
        self
    }

    /// Burst mode: [`serve`](Worker::serve) and [`run`](Worker::run)
    /// return (after the graceful stop) once the stream is open and no job
    /// was delivered or running for `idle`: the worker works what is
    /// waiting, then exits (a cron job, a test, a one-off backfill). A job
    /// delayed past that is left for the next run.
    pub fn burst(mut self, idle: Duration) -> Worker {
        self.burst = Some(idle);
        self
    }

    /// Cancels a handler that runs longer than this, and nacks its job
    /// (default: no timeout).
    pub fn timeout(mut self, timeout: Duration) -> Worker {
        self.timeout = Some(timeout);
        self
    }

    /// The timeout of `queue`'s handler, instead of [`Worker::timeout`].
    pub fn queue_timeout(mut self, queue: impl Into<String>, timeout: Duration) -> Worker {
        self.timeouts.insert(queue.into(), timeout);
        self
    }

    /// Consumer name shown in admin views (default `<hostname>-<pid>`).
    pub fn consumer(mut self, name: impl Into<String>) -> Worker {
        self.consumer = name.into();
        self
    }

    /// Most handlers running at once, and the stream's credit (1 to 10,000;
    /// default [`DEFAULT_CONCURRENCY`], 16).
    pub fn concurrency(mut self, n: u32) -> Worker {
        self.concurrency = n;
        self
    }

    /// The stream's credit: how many jobs the broker may deliver ahead of
    /// the handlers, delivered and not settled (at least
    /// [`concurrency`](Worker::concurrency), at most 10,000; default: the
    /// concurrency). Jobs beyond the running ones wait in the worker, their
    /// leases extended as a running job's: a handler that ends finds the
    /// next job here instead of waiting for the ack, the broker and a lease
    /// round (a few milliseconds) to bring one, as RabbitMQ's prefetch
    /// above a consumer's concurrency. For short handlers, e.g.
    /// `concurrency(64).prefetch(256)`.
    pub fn prefetch(mut self, n: u32) -> Worker {
        self.prefetch = Some(n);
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

    /// Settles on the Consume stream (true, the default; Subscribe +
    /// AckBatch on a broker without Consume), or always Subscribe + AckBatch
    /// and unary calls (false: e.g. behind a proxy that cannot carry
    /// bidirectional streams).
    pub fn stream_acks(mut self, on: bool) -> Worker {
        self.stream_acks = on;
        self
    }

    /// The level of the log line for a lost lease (default DEBUG: with
    /// at-least-once delivery it is an expected event, and the job is
    /// someone else's). A program whose handlers have side effects an
    /// operator should hear about when they may be repeated (`leaseq work`
    /// running commands) may want WARN.
    pub fn lost_lease_log_level(mut self, level: Level) -> Worker {
        self.lost_lease_level = level;
        self
    }

    /// This worker's counters, live while it runs.
    pub fn stats(&self) -> Arc<WorkerStats> {
        self.stats.clone()
    }

    /// Runs `handler` for the queues given to [`Worker::new`] (and the
    /// handlers given to [`Worker::handle`] for theirs) until `shutdown`
    /// completes, then stops gracefully (see the type's documentation).
    /// Returns `Err` only for a status that retrying cannot fix, such as
    /// `INVALID_ARGUMENT` for a bad queue name.
    pub async fn run<H, F, R, E>(
        mut self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Status>
    where
        H: Fn(Delivery) -> F + Send + Sync + 'static,
        F: Future<Output = Result<R, E>> + Send + 'static,
        R: Into<Ack>,
        E: Into<BoxError> + 'static,
    {
        let handler = boxed(handler);
        for q in std::mem::take(&mut self.queues) {
            if !self.routes.iter().any(|(r, _)| *r == q) {
                self.routes.push((q, handler.clone()));
            }
        }
        self.serve(shutdown).await
    }

    /// Runs the handlers given to [`Worker::handle`] until `shutdown`
    /// completes, then stops gracefully. Returns `Err` only for a status
    /// that retrying cannot fix.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), Status> {
        let routes = self.routes()?;
        let mut running = self.start(routes);
        let mut shutdown = pin!(shutdown);
        let result = loop {
            let step = if running.session.is_none() {
                running.open(shutdown.as_mut()).await
            } else {
                running.next_event(shutdown.as_mut()).await
            };
            if let ControlFlow::Break(result) = step {
                break result;
            }
        };
        running.stop(self.grace).await;
        result
    }

    /// Each queue's handler and timeout, once the settings are checked.
    fn routes(&self) -> Result<HashMap<String, Route>, Status> {
        if !self.queues.is_empty() {
            return Err(Status::invalid_argument(
                "queues: Worker::new's queues need the handler of Worker::run",
            ));
        }
        if self.routes.is_empty() {
            return Err(Status::invalid_argument(
                "queues: no handler (Worker::handle) registered",
            ));
        }
        let mut routes = HashMap::new();
        for (queue, handler) in &self.routes {
            let timeout = self.timeouts.get(queue).copied().or(self.timeout);
            let handler = self
                .middlewares
                .iter()
                .rev()
                .fold(handler.clone(), |h, m| wrap(m, h));
            let route = Route { handler, timeout };
            if routes.insert(queue.clone(), route).is_some() {
                return Err(Status::invalid_argument(format!(
                    "queues: {queue:?} has two handlers"
                )));
            }
        }
        if let Some(q) = self.timeouts.keys().find(|q| !routes.contains_key(*q)) {
            return Err(Status::invalid_argument(format!(
                "queue_timeout: no handler for queue {q:?}"
            )));
        }
        if !(1..=MAX_IN_FLIGHT).contains(&self.concurrency) {
            return Err(Status::invalid_argument(format!(
                "concurrency: must be 1 to {MAX_IN_FLIGHT}"
            )));
        }
        if let Some(n) = self.prefetch
            && !(self.concurrency..=MAX_IN_FLIGHT).contains(&n)
        {
            return Err(Status::invalid_argument(format!(
                "prefetch: must be the concurrency ({}) to {MAX_IN_FLIGHT}",
                self.concurrency
            )));
        }
        if self.lease < MIN_LEASE || self.lease > MAX_LEASE {
            return Err(Status::invalid_argument(
                "lease: must be between 1s and 12h",
            ));
        }
        if routes.values().any(|r| r.timeout == Some(Duration::ZERO)) {
            return Err(Status::invalid_argument("timeout: must be above zero"));
        }
        Ok(routes)
    }

    /// What [`Worker::serve`] keeps while it runs; no stream open yet.
    fn start(&self, routes: HashMap<String, Route>) -> Running {
        let queues: Vec<String> = self.routes.iter().map(|(q, _)| q.clone()).collect();
        let ctx = Arc::new(Ctx {
            routes,
            lease: self.lease,
            permits: Arc::new(Semaphore::new(self.concurrency as usize)),
            stop: CancellationToken::new(),
            stats: self.stats.clone(),
            lost_lease_level: self.lost_lease_level,
            running: std::sync::Mutex::new(HashMap::new()),
        });
        let base = SettleBase {
            client: self.client.clone(),
            acker: Acker::spawn(self.client.clone()),
            stats: self.stats.clone(),
        };
        let sub = pb::SubscribeRequest {
            queues,
            consumer: self.consumer.clone(),
            max_in_flight: self.prefetch.unwrap_or(self.concurrency),
            lease: Some(pb_duration(self.lease)),
            accept: vec![leaseq_proto::features::DELIVERIES.to_owned()],
        };
        Running {
            client: self.client.clone(),
            idle_timeout: self.idle_timeout,
            base,
            sub,
            tasks: JoinSet::new(),
            backoff: Backoff::new(self.reconnect_min, self.reconnect_max),
            use_consume: self.stream_acks,
            session: None,
            burst: self.burst,
            last_busy: tokio::time::Instant::now(),
            _keeper: AbortOnDrop(tokio::spawn(keep_leases(ctx.clone()))),
            ctx,
        }
    }
}

/// A running worker: its stream, when one is open, and its job tasks.
struct Running {
    client: Client,
    idle_timeout: Duration,
    ctx: Arc<Ctx>,
    base: SettleBase,
    sub: pb::SubscribeRequest,
    /// One task per delivered job (waiting for a permit, running,
    /// settling). Ended by the graceful stop ([`Running::stop`]): awaited,
    /// then aborted after the grace.
    tasks: JoinSet<()>,
    backoff: Backoff,
    /// Consume, until the broker says it does not serve it.
    use_consume: bool,
    /// The open stream, and whether it has said anything yet. It is kept
    /// through the stop so running handlers can still settle on it.
    session: Option<(Session, bool)>,
    /// Burst mode's idle time ([`Worker::burst`]).
    burst: Option<Duration>,
    /// The last delivery or handler end.
    last_busy: tokio::time::Instant,
    /// [`keep_leases`], for as long as the worker runs.
    _keeper: AbortOnDrop<()>,
}

impl Running {
    /// Opens a stream (or waits before trying again); Break once `shutdown`
    /// completed or opening failed for good.
    async fn open(
        &mut self,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> ControlFlow<Result<(), Status>> {
        let (client, sub, base, use_consume) =
            (&self.client, &self.sub, &self.base, self.use_consume);
        let opened = tokio::select! {
            _ = shutdown.as_mut() => return ControlFlow::Break(Ok(())),
            Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                log_join(done);
                return ControlFlow::Continue(());
            }
            r = async {
                if use_consume {
                    Session::consume(client, sub.clone(), base.clone()).await
                } else {
                    Session::subscribe(client, sub.clone(), base.clone()).await
                }
            } => r,
        };
        match opened {
            Ok(s) => {
                debug!(queues = ?self.sub.queues, consume = s.is_consume(), "stream opened");
                self.session = Some((s, false));
            }
            Err(status) if self.use_consume && status.code() == Code::Unimplemented => {
                info!(
                    "the broker does not serve Consume (UNIMPLEMENTED): using Subscribe and AckBatch"
                );
                self.use_consume = false;
            }
            Err(status) if fatal(&status) => return ControlFlow::Break(Err(status)),
            Err(status) => {
                let wait = self.backoff.next();
                warn!(code = ?status.code(), message = status.message(), retry_in = ?wait,
                    "opening the stream failed; retrying");
                tokio::select! {
                    _ = shutdown.as_mut() => return ControlFlow::Break(Ok(())),
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
        ControlFlow::Continue(())
    }

    /// Takes the open stream's next message (a job starts its task), or
    /// ends the stream when it is lost and waits before the next; Break
    /// once `shutdown` completed.
    async fn next_event(
        &mut self,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> ControlFlow<Result<(), Status>> {
        let Some((open, heard)) = self.session.as_mut() else {
            return ControlFlow::Continue(());
        };
        let idle_until = self.burst.map(|idle| self.last_busy + idle);
        let event = tokio::select! {
            _ = shutdown.as_mut() => return ControlFlow::Break(Ok(())),
            Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                log_join(done);
                self.last_busy = tokio::time::Instant::now();
                return ControlFlow::Continue(());
            }
            // Burst mode: nothing delivered or running for its idle time.
            () = tokio::time::sleep_until(idle_until.unwrap_or_else(tokio::time::Instant::now)),
                if idle_until.is_some() && *heard && self.tasks.is_empty() =>
            {
                debug!("burst: nothing left to work; stopping");
                return ControlFlow::Break(Ok(()));
            }
            msg = tokio::time::timeout(self.idle_timeout, open.next()) => msg,
        };
        let ended = match event {
            Ok(Ok(Some(event))) => {
                if !*heard || matches!(event, Event::Deliveries(_)) {
                    self.last_busy = tokio::time::Instant::now();
                }
                // A live stream: the next failure starts from the
                // shortest wait again.
                *heard = true;
                self.backoff.reset();
                if let Event::Cancelled(c) = &event {
                    self.ctx.cancel(c);
                }
                if let Event::Deliveries(ds) = event {
                    let settler = open.settler();
                    for d in ds {
                        match Delivery::from_pb(d) {
                            Some(job) => self.spawn_job(settler.clone(), job),
                            None => warn!("delivery without a job; ignored"),
                        }
                    }
                }
                return ControlFlow::Continue(());
            }
            Ok(Ok(None)) => "stream ended by the broker".to_owned(),
            Ok(Err(status)) => {
                // A proxy may only say UNIMPLEMENTED once the stream runs.
                if status.code() == Code::Unimplemented && open.is_consume() && !*heard {
                    info!(
                        "the broker does not serve Consume (UNIMPLEMENTED): using Subscribe and AckBatch"
                    );
                    self.use_consume = false;
                    if let Some((s, _)) = self.session.take() {
                        s.end();
                    }
                    return ControlFlow::Continue(());
                }
                format!("{:?}: {}", status.code(), status.message())
            }
            Err(_) => format!("no message for {:?}", self.idle_timeout),
        };
        // Running handlers keep going; their jobs were released with the
        // stream, so their settles will be refused and the jobs redelivered.
        if let Some((s, _)) = self.session.take() {
            s.end();
        }
        let wait = self.backoff.next();
        info!(reason = %ended, retry_in = ?wait, "stream lost; reconnecting");
        tokio::select! {
            _ = shutdown.as_mut() => return ControlFlow::Break(Ok(())),
            _ = tokio::time::sleep(wait) => {}
        }
        ControlFlow::Continue(())
    }

    /// Starts a delivered job's task, in its span.
    fn spawn_job(&mut self, settler: Arc<Settler>, job: Delivery) {
        let span = job_span(&job);
        #[cfg(feature = "otel")]
        let otel_cx = crate::otel::handler_context(&job);
        // Boxed where it is made: the job's future is large (its handler's
        // and its settle's), and moving it into the span, the context and
        // the task's cell was a tenth of the worker's CPU.
        let task = Box::pin(process(self.ctx.clone(), settler, job)).instrument(span);
        #[cfg(feature = "otel")]
        let task = opentelemetry::context::FutureExt::with_context(task, otel_cx);
        self.tasks.spawn(task);
    }

    /// Graceful stop: no new handler starts; running ones get the `grace`,
    /// while the stream stays open for their settles.
    async fn stop(mut self, grace: Duration) {
        self.ctx.stop.cancel();
        let tasks = &mut self.tasks;
        let session = &mut self.session;
        if !tasks.is_empty() {
            info!(running = tasks.len(), grace = ?grace, "stopping: waiting for running handlers");
        }
        let deadline = tokio::time::Instant::now() + grace;
        while !tasks.is_empty() {
            tokio::select! {
                Some(done) = tasks.join_next() => log_join(done),
                _ = tokio::time::sleep_until(deadline) => {
                    warn!(left = tasks.len(),
                        "grace elapsed; cancelling handlers still running (their jobs are released)");
                    tasks.shutdown().await;
                }
                next = async { session.as_mut().expect("checked").0.next().await },
                    if session.is_some() =>
                {
                    match next {
                        // Left unsettled: released when the stream closes.
                        Ok(Some(Event::Deliveries(_))) => debug!("deliveries while stopping; released at the close"),
                        Ok(Some(Event::Activity)) => {}
                        Ok(Some(Event::Cancelled(c))) => self.ctx.cancel(&c),
                        Ok(None) | Err(_) => {
                            // Settles go by unary calls from now on.
                            if let Some((s, _)) = session.take() {
                                s.end();
                            }
                        }
                    }
                }
            }
        }
        if let Some((s, _)) = session.take() {
            s.close(CLOSE_WAIT).await;
        }
    }
}

/// A queue's handler and its timeout.
struct Route {
    handler: DynHandler,
    timeout: Option<Duration>,
}

/// What every job task shares.
struct Ctx {
    routes: HashMap<String, Route>,
    lease: Duration,
    /// One permit per handler allowed to run: the concurrency bound.
    permits: Arc<Semaphore>,
    /// Cancelled at the graceful stop: jobs not yet started are left alone.
    stop: CancellationToken,
    stats: Arc<WorkerStats>,
    lost_lease_level: Level,
    /// Each job from its receipt to its handler's end, by lease token: its
    /// lease kept ([`keep_leases`]), and cancelled when the broker says
    /// its job was cancelled or an extension is refused.
    running: std::sync::Mutex<HashMap<String, Held>>,
}

/// A job in [`Ctx::running`].
struct Held {
    job_id: String,
    settler: Arc<Settler>,
    /// Its handler stops (the job task's `select!`).
    cancel: CancellationToken,
    /// Why `cancel` fired: an extension was refused (else the broker
    /// cancelled the job).
    lease_lost: bool,
    /// When its next extension is due; None while one is under way.
    extend_at: Option<tokio::time::Instant>,
}

impl Ctx {
    /// The broker cancelled this job (`CancelJob`): its handler stops.
    fn cancel(&self, c: &pb::Cancelled) {
        let running = self.running.lock().expect("poisoned");
        if let Some(held) = running.get(&c.lease_token)
            && held.job_id == c.job_id
        {
            held.cancel.cancel();
        }
    }
}

/// A job's place in [`Ctx::running`], given up when its handler is done
/// (or its task ends).
struct Registered<'a>(&'a Ctx, String);

impl Registered<'_> {
    fn lease_lost(&self) -> bool {
        let running = self.0.running.lock().expect("poisoned");
        running.get(&self.1).is_some_and(|h| h.lease_lost)
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.running.lock().expect("poisoned").remove(&self.1);
    }
}

fn job_span(job: &Delivery) -> Span {
    let span = info_span!("job", job_id = %job.id, queue = %job.queue, attempt = job.attempt,
        trace_id = field::Empty);
    if let Some(tp) = job.trace_parent() {
        span.record("trace_id", tp.trace_id_hex());
    }
    span
}

/// How a job task ended, before settling.
enum Ran {
    /// Stopped before a permit came: released when the stream closes.
    NotStarted,
    Done(Outcome),
    /// An extension was refused: the handler was cancelled.
    LeaseLost,
    /// The job was cancelled (`CancelJob`): the handler was dropped.
    Cancelled,
}

/// One delivered job: wait for a permit, run the handler while keeping the
/// lease alive, settle.
/// The job a handler's task runs, for [`progress`].
#[derive(Clone)]
struct Current {
    settler: Arc<Settler>,
    job_id: String,
    lease_token: String,
}

tokio::task_local! {
    static CURRENT: Current;
}

/// Reports how far the running handler's job is (advice, read back by
/// `GetJob`): `fraction` 0 to 1, `message` at most 256 bytes
/// (`INVALID_ARGUMENT` naming the field, nothing sent). Call it from a
/// [`Worker`]'s handler (its own task: not from a task it spawned,
/// `FAILED_PRECONDITION` there). On a Consume stream the report goes with
/// the stream's next message and nothing is waited for (the broker keeps
/// the latest per job and writes a stream's at most once a second; a
/// refusal, such as a lost lease, is not reported back); on Subscribe it is
/// a `ReportProgress` call. `UNIMPLEMENTED`, nothing sent, from a broker
/// that did not list `"progress"`.
///
/// ```no_run
/// # use leaseq_client::{Delivery, progress};
/// async fn resize(job: Delivery) -> anyhow::Result<()> {
///     progress(0.5, "resized").await?;
///     Ok(())
/// }
/// ```
pub async fn progress(fraction: f32, message: &str) -> Result<(), Status> {
    let Ok(current) = CURRENT.try_with(Current::clone) else {
        return Err(Status::failed_precondition(
            "progress: only inside a Worker's handler (its own task)",
        ));
    };
    current
        .settler
        .progress((&current.job_id, &current.lease_token), fraction, message)
        .await
}

async fn process(ctx: Arc<Ctx>, settler: Arc<Settler>, job: Delivery) {
    WorkerStats::inc(&ctx.stats.delivered);
    let cancelled = CancellationToken::new();
    // The lease is kept from receipt on, not from the handler's start:
    // time spent waiting for a permit also runs against it.
    ctx.running.lock().expect("poisoned").insert(
        job.lease_token.clone(),
        Held {
            job_id: job.id.clone(),
            settler: settler.clone(),
            cancel: cancelled.clone(),
            lease_lost: false,
            extend_at: Some(tokio::time::Instant::now() + ctx.lease / 2),
        },
    );
    let registered = Registered(&ctx, job.lease_token.clone());
    // What the settle needs; the handler takes the job.
    let (job_id, lease_token) = (job.id.clone(), job.lease_token.clone());
    let ran = tokio::select! {
        ran = run_handler(&ctx, &settler, job) => ran,
        () = cancelled.cancelled() => if registered.lease_lost() {
            Ran::LeaseLost
        } else {
            Ran::Cancelled
        },
    };
    // Settling is not extended, nor cancelled.
    drop(registered);
    #[cfg(feature = "otel")]
    match &ran {
        Ran::NotStarted => crate::otel::record(None, false),
        Ran::LeaseLost | Ran::Cancelled => crate::otel::record(None, true),
        Ran::Done(outcome) => crate::otel::record(Some(outcome), false),
    }
    match ran {
        Ran::Cancelled => {
            WorkerStats::inc(&ctx.stats.cancelled);
            info!("job cancelled by the broker (CancelJob): handler stopped, nothing settled");
        }
        Ran::NotStarted => debug!("not started before the stop; released when the stream closes"),
        Ran::LeaseLost => {
            WorkerStats::inc(&ctx.stats.lease_lost);
            event_at!(
                ctx.lost_lease_level,
                "lease lost before settling: an extension was refused while the handler ran; \
                 handler cancelled, the job may be delivered again"
            );
        }
        Ran::Done(outcome) => settle(&ctx, &settler, (&job_id, &lease_token), outcome).await,
    }
}

/// Runs the queue's handler under a permit, within its timeout.
async fn run_handler(ctx: &Ctx, settler: &Arc<Settler>, job: Delivery) -> Ran {
    let Some(route) = ctx.routes.get(&job.queue) else {
        let error = format!("no handler for queue {:?} in this worker", job.queue);
        return Ran::Done(Outcome::nack(NackKind::Failed, &error));
    };
    let _permit = tokio::select! {
        biased;
        _ = ctx.stop.cancelled() => return Ran::NotStarted,
        p = ctx.permits.clone().acquire_owned() => match p {
            Ok(p) => p,
            Err(_) => return Ran::NotStarted,
        },
    };
    // Run in this job's task (in its span and OpenTelemetry context), a
    // panic caught so that it becomes a Nack rather than a lost job; dropped
    // with this future (timeout, lost lease, cancel, grace elapsed). Its
    // lease is kept by [`keep_leases`], another task, so a handler that
    // holds its thread does not hold back its own extensions.
    let current = Current {
        settler: settler.clone(),
        job_id: job.id.clone(),
        lease_token: job.lease_token.clone(),
    };
    let handler = AssertUnwindSafe(CURRENT.scope(current, (route.handler)(job))).catch_unwind();
    let joined = match route.timeout {
        None => handler.await,
        Some(limit) => match tokio::time::timeout(limit, handler).await {
            Ok(joined) => joined,
            Err(_) => {
                // Dropped (its destructors ran) before the nack.
                WorkerStats::inc(&ctx.stats.timed_out);
                return Ran::Done(Outcome::nack(
                    NackKind::Timeout,
                    &format!("timeout: the handler ran longer than {limit:?}"),
                ));
            }
        },
    };
    Ran::Done(match joined {
        Ok(Ok(ack)) => Outcome::Ack(ack),
        Ok(Err(outcome)) => outcome,
        Err(p) => Outcome::nack(
            NackKind::Panic,
            &match p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
            {
                Some(msg) => format!("handler panicked: {msg}"),
                None => "handler panicked".to_owned(),
            },
        ),
    })
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keeps the leases of every job in [`Ctx::running`]: each is extended by
/// the worker's lease every half lease, from its receipt until its handler
/// ends. A refused extension (FAILED_PRECONDITION: the lease is lost)
/// cancels its handler; another failure is tried again a tenth of a lease
/// later (at least 100 ms), with half the lease still left. One task and
/// one timer for the whole worker, not one per job: it looks every tenth
/// of a lease (50 ms to 1 s) for the extensions that are due.
async fn keep_leases(ctx: Arc<Ctx>) {
    let tick = (ctx.lease / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut extensions = JoinSet::new();
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            Some(_) = extensions.join_next(), if !extensions.is_empty() => continue,
        }
        let now = tokio::time::Instant::now();
        let due: Vec<(String, String, Arc<Settler>)> = {
            let mut running = ctx.running.lock().expect("poisoned");
            running
                .iter_mut()
                .filter(|(_, h)| h.extend_at.is_some_and(|at| at <= now))
                .map(|(token, h)| {
                    h.extend_at = None;
                    (token.clone(), h.job_id.clone(), h.settler.clone())
                })
                .collect()
        };
        for (token, job_id, settler) in due {
            let ctx = ctx.clone();
            extensions.spawn(async move {
                let r = settler.extend((&job_id, &token), ctx.lease).await;
                let retry = (ctx.lease / 10).max(Duration::from_millis(100));
                let mut running = ctx.running.lock().expect("poisoned");
                let Some(held) = running.get_mut(&token) else {
                    return; // its handler ended meanwhile
                };
                let now = tokio::time::Instant::now();
                match r {
                    Ok(()) => held.extend_at = Some(now + ctx.lease / 2),
                    Err(s) if s.code() == Code::FailedPrecondition => {
                        debug!(%job_id, message = s.message(), "lease lost");
                        held.lease_lost = true;
                        held.cancel.cancel();
                    }
                    Err(s) => {
                        // Half the lease is left: try again soon.
                        held.extend_at = Some(now + retry);
                        warn!(%job_id, code = ?s.code(), message = s.message(),
                            "lease extension failed; retrying");
                    }
                }
            });
        }
    }
}

/// What a handler's [`Ack`] can become before anything is sent: nothing
/// to send (settled in SQL), or a nack when its follow-ups cannot go.
fn checked(ctx: &Ctx, settler: &Settler, outcome: Outcome) -> Option<Outcome> {
    let Outcome::Ack(ack) = &outcome else {
        return Some(outcome);
    };
    if ack.in_sql {
        if !ack.result.is_empty() {
            // leaseq.ack() in SQL takes no result: it is lost.
            WorkerStats::inc(&ctx.stats.results_refused);
            warn!("the handler settled its job in SQL and returned a result: it was not kept");
        }
        if ack.follow_ups.is_empty() {
            WorkerStats::inc(&ctx.stats.settled_in_sql);
            debug!("settled in SQL by the handler; nothing sent");
        } else {
            // The job is gone already: nothing can carry them now.
            WorkerStats::inc(&ctx.stats.follow_ups_refused);
            warn!(
                follow_ups = ack.follow_ups.len(),
                "the handler settled its job in SQL and asked for follow-ups: they were not enqueued \
                 (enqueue them in that transaction with leaseq.enqueue)"
            );
        }
        return None;
    }
    if !ack.follow_ups.is_empty() && !settler.supports(leaseq_proto::features::ACK_ENQUEUE) {
        // Never an ack without its follow-ups (docs/design/stream-messages.md,
        // principle 2): the job fails, and comes back.
        WorkerStats::inc(&ctx.stats.follow_ups_refused);
        let error = format!(
            "ack.enqueue: the broker did not list \"ack.enqueue\" in its first heartbeat (it predates \
             follow-up jobs), so the ack and its {} follow-up job(s) could not be sent together; \
             nacked instead",
            ack.follow_ups.len()
        );
        warn!(%error, "follow-ups refused");
        return Some(Outcome::nack(NackKind::Failed, &error));
    }
    if !ack.result.is_empty() && !settler.supports(leaseq_proto::features::ACK_RESULT) {
        // Nor without its result.
        WorkerStats::inc(&ctx.stats.results_refused);
        let error = format!(
            "ack.result: the broker did not list \"ack.result\" in its first heartbeat (it predates \
             results), so the ack and its {}-byte result could not be sent together; nacked instead",
            ack.result.len()
        );
        warn!(%error, "result refused");
        return Some(Outcome::nack(NackKind::Failed, &error));
    }
    Some(outcome)
}

/// Acks or nacks, retrying transient failures.
/// `held`: the job's id and lease token.
async fn settle(ctx: &Ctx, settler: &Settler, held: (&str, &str), outcome: Outcome) {
    let Some(outcome) = checked(ctx, settler, outcome) else {
        return;
    };
    let mut wait = Duration::from_millis(100);
    for attempt in 1..=SETTLE_TRIES {
        let r = match &outcome {
            Outcome::Ack(ack) => settler
                .ack(held, &ack.follow_ups, &ack.result)
                .await
                .map(|ids| {
                    if !ids.is_empty() {
                        ctx.stats
                            .follow_ups
                            .fetch_add(ids.len() as u64, std::sync::atomic::Ordering::Relaxed);
                        debug!(follow_ups = ?ids, "follow-up jobs enqueued with the ack");
                    }
                    false
                }),
            Outcome::Nack(NackOutcome {
                error,
                retry_after,
                dead_letter,
                ..
            }) => {
                let options = Nack {
                    retry_after: *retry_after,
                    dead_letter: *dead_letter,
                };
                settler.nack(held, error, &options).await
            }
        };
        match r {
            Ok(dead) => {
                match &outcome {
                    Outcome::Ack(_) => {
                        WorkerStats::inc(&ctx.stats.acked);
                        debug!("acked");
                    }
                    Outcome::Nack(n) => {
                        WorkerStats::inc(&ctx.stats.nacked);
                        if dead {
                            WorkerStats::inc(&ctx.stats.dead_lettered);
                        }
                        info!(outcome = n.kind.as_str(), error = %n.error, dead_lettered = dead,
                            retry_after = ?n.retry_after, "nacked");
                    }
                }
                return;
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                // Expired, taken over, released with its stream, or the job
                // was cancelled: it is (or will be) someone else's.
                WorkerStats::inc(&ctx.stats.lease_lost);
                event_at!(
                    ctx.lost_lease_level,
                    message = s.message(),
                    "lease lost before settling; the job may be delivered again"
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

    fn client() -> Client {
        Client::connect_lazy("http://127.0.0.1:1").unwrap()
    }

    async fn refused(w: Worker) -> String {
        w.serve(std::future::pending())
            .await
            .unwrap_err()
            .message()
            .to_owned()
    }

    #[tokio::test]
    async fn configuration_errors_are_reported_before_connecting() {
        let ok = |_: Delivery| async { Ok::<(), String>(()) };
        assert!(
            refused(Worker::builder(client()))
                .await
                .starts_with("queues:")
        );
        assert!(
            refused(Worker::builder(client()).handle("a", ok).handle("a", ok))
                .await
                .contains("two handlers")
        );
        assert!(
            refused(
                Worker::builder(client())
                    .handle("a", ok)
                    .queue_timeout("b", Duration::from_secs(1))
            )
            .await
            .starts_with("queue_timeout:")
        );
        assert!(
            refused(
                Worker::builder(client())
                    .handle("a", ok)
                    .lease(Duration::ZERO)
            )
            .await
            .starts_with("lease:")
        );
        assert!(
            refused(Worker::new(client(), ["a"]))
                .await
                .starts_with("queues:"),
            "serve without run's handler"
        );
    }
}
