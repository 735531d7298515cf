//! The Rust client for leaseq: [`Client`] for the unary calls (enqueue,
//! ack, nack, extend), [`Worker`] for consuming, and [`AdminClient`] for the
//! operator API; TLS, mutual TLS and bearer tokens through
//! [`ConnectOptions`].
//!
//! The [`Worker`] keeps a `Consume` stream open (acks, nacks and lease
//! extensions travel on it; Subscribe + AckBatch on a broker without it),
//! reconnects when it breaks, runs a handler per queue with bounded
//! concurrency and an optional timeout, extends leases while handlers run,
//! and settles each job from its handler's result: `Ok(())` acks,
//! [`Retry`] and [`DeadLetter`] nack as they say, any other error nacks
//! with its text.
//!
//! ```no_run
//! use std::time::Duration;
//! use leaseq_client::{Client, ConnectOptions, DeadLetter, Delivery, Job, Retry, Worker};
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let client = Client::connect_with(
//!     "https://leaseq.internal:50051",
//!     ConnectOptions::default().tls_ca("ca.pem").token("s3cret"),
//! )
//! .await?;
//! let sent = client
//!     .enqueue(Job::new("emails", r#"{"to":"a@b.c"}"#).header("content-type", "application/json"))
//!     .await?;
//! println!("enqueued {}", sent.job_id);
//!
//! Worker::builder(client)
//!     .handle("emails", |job: Delivery| async move {
//!         if job.payload.is_empty() {
//!             return Err(DeadLetter::new("empty payload").into());
//!         }
//!         if job.attempt < 3 {
//!             return Err(Retry::after(Duration::from_secs(10)).into());
//!         }
//!         Ok::<(), anyhow::Error>(())
//!     })
//!     .handle("sms", |_job: Delivery| async { Ok::<(), anyhow::Error>(()) })
//!     .concurrency(8)
//!     .timeout(Duration::from_secs(60))
//!     .serve(async { tokio::signal::ctrl_c().await.ok(); })
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! Every call returns the broker's [`tonic::Status`] unchanged, so callers
//! can match on `status.code()` (see the error table in the README).

// Tests may be long (a scenario reads top to bottom); the code they test
// may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod admin;
pub mod connect;
mod consumer;
#[cfg(feature = "otel")]
pub mod otel;
mod outcome;
mod produce;
mod schedules;
mod session;
mod stats;
pub mod testing;
pub mod trace;
mod typed;
mod worker;

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use tonic::Status;
use tonic::transport::Channel;

/// The generated API (`leaseq.v1`): messages, and the gRPC clients for
/// anything the wrappers here do not cover.
pub use leaseq_proto as pb;
use pb::queue_service_client::QueueServiceClient;

pub use admin::{AdminClient, DeadLetters, KeyOverride, QueueUpdate};
pub use connect::{ClientChannel, ConnectError, ConnectOptions, DEFAULT_ADDR, connect};
pub use consumer::{ConsumeOptions, Consumer, ConsumerSettler};
pub use outcome::{Ack, BoxError, DeadLetter, HandlerError, Retry};
pub use schedules::{CatchUp, Overlap, Schedule, ScheduleRun, ScheduleSpec, ScheduleUpdate};
pub use stats::WorkerStats;
pub use trace::TraceParent;
pub use typed::{JSON, Task, json_result};
pub use worker::{DEFAULT_CONCURRENCY, Next, Worker, progress};

/// Largest message the client accepts from the broker. Matches the broker's
/// default `--max-message-bytes`, so a delivery of any accepted payload fits.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A connection to a leaseq broker (or a load balancer in front of several).
///
/// Cheap to clone (`Send + Sync`): clones share one HTTP/2 connection, which
/// reconnects on its own when it breaks, and its TLS and token settings.
#[derive(Clone)]
pub struct Client {
    channel: ClientChannel,
    queue: QueueServiceClient<ClientChannel>,
    /// The Produce stream single enqueues go on (shared by the clones).
    producer: std::sync::Arc<produce::Producer>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl Client {
    /// Connects now, without TLS files or a token, to `addr`: `host:port` or
    /// `http://host:port` (plaintext), or `https://host:port` (TLS, the
    /// system's roots); fails if the broker cannot be reached. See
    /// [`Client::connect_with`] for TLS files and tokens.
    pub async fn connect(addr: impl AsRef<str>) -> Result<Client, ConnectError> {
        Client::connect_with(addr, ConnectOptions::default()).await
    }

    /// Connects on first use; fails only on a malformed address. A [`Worker`]
    /// built on it waits for a broker that is not up yet.
    pub fn connect_lazy(addr: impl AsRef<str>) -> Result<Client, ConnectError> {
        Client::connect_lazy_with(addr, ConnectOptions::default())
    }

    /// Connects now to the broker the environment names: `LEASEQ_ADDR`
    /// (default `127.0.0.1:50051`) with `LEASEQ_TOKEN` and the TLS files of
    /// `LEASEQ_TLS_CA`, `LEASEQ_CLIENT_CERT` and `LEASEQ_CLIENT_KEY`, as
    /// every leaseq client reads them ([`connect`](crate::connect) module).
    pub async fn connect_env() -> Result<Client, ConnectError> {
        Client::connect_with(connect::addr_from_env(), ConnectOptions::from_env()).await
    }

    /// Connects now to `addr` (`host:port`, `http://` or `https://`; see the
    /// [`connect`](crate::connect) module) with `options`' TLS files and
    /// bearer token, which every call then carries.
    pub async fn connect_with(
        addr: impl AsRef<str>,
        options: ConnectOptions,
    ) -> Result<Client, ConnectError> {
        Ok(Client::from_client_channel(
            connect::connect(addr.as_ref(), &options).await?,
        ))
    }

    /// [`Client::connect_with`], connecting on first use: fails only on a
    /// malformed address or unusable options (unreadable TLS files).
    pub fn connect_lazy_with(
        addr: impl AsRef<str>,
        options: ConnectOptions,
    ) -> Result<Client, ConnectError> {
        Ok(Client::from_client_channel(connect::connect_lazy(
            addr.as_ref(),
            &options,
        )?))
    }

    /// Wraps a channel configured by the caller (no token is added; see
    /// [`connect::with_token`]).
    pub fn from_channel(channel: Channel) -> Client {
        Client::from_client_channel(ClientChannel::new(channel, connect::Bearer::default()))
    }

    /// Wraps a channel from [`connect()`] / [`connect::connect_lazy`].
    pub fn from_client_channel(channel: ClientChannel) -> Client {
        let queue = QueueServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Client {
            channel,
            queue,
            producer: Default::default(),
        }
    }

    /// The underlying channel (with the token, if any), for other services
    /// on the same broker (health, reflection).
    pub fn channel(&self) -> ClientChannel {
        self.channel.clone()
    }

    /// The generated gRPC client, for anything this wrapper does not cover.
    pub fn queue_service(&self) -> QueueServiceClient<ClientChannel> {
        self.queue.clone()
    }

    /// An admin client on the same connection (and token).
    pub fn admin(&self) -> AdminClient {
        AdminClient::from_client_channel(self.channel.clone())
    }
    /// Adds one job; returns once it is committed.
    ///
    /// The jobs go on one Produce stream shared by the client's clones
    /// (opened by the first enqueue), so concurrent enqueues cost a message
    /// each rather than a call; against a broker without Produce, each is a
    /// unary Enqueue. If the stream breaks before the answer (the broker
    /// restarted), the error is UNAVAILABLE and the job may or may not be
    /// enqueued, as with any call whose answer was lost: give it a
    /// `dedup_key` to send it again safely.
    ///
    /// With the `otel` feature, the current OpenTelemetry span's context goes
    /// into the job's headers unless the job has a `traceparent` already.
    pub async fn enqueue(&self, job: Job) -> Result<Enqueued, Status> {
        let req = job.into_pb();
        // A copy for Enqueue until a broker has answered on a stream.
        let copy = (!self.producer.confirmed()).then(|| req.clone());
        match self.producer.enqueue(&self.queue, req).await {
            produce::Sent::Answered(r) => r,
            produce::Sent::Unsupported(unsent) => {
                let Some(req) = unsent.map(|b| *b).or(copy) else {
                    return Err(Status::unavailable(
                        "the broker stopped serving Produce (an older broker?); the job was not enqueued: send it again",
                    ));
                };
                let resp = self.queue.clone().enqueue(req).await?.into_inner();
                Ok(Enqueued::from(resp))
            }
        }
    }

    /// Adds many jobs atomically (all or none). Results are in request order.
    pub async fn enqueue_batch(
        &self,
        jobs: impl IntoIterator<Item = Job>,
    ) -> Result<Vec<Enqueued>, Status> {
        let req = pb::EnqueueBatchRequest {
            jobs: jobs.into_iter().map(Job::into_pb).collect(),
        };
        let resp = self.queue.clone().enqueue_batch(req).await?.into_inner();
        Ok(resp.results.into_iter().map(Enqueued::from).collect())
    }

    /// The job is done: removes it. `FAILED_PRECONDITION` when the token is
    /// no longer the job's current lease.
    pub async fn ack(&self, job_id: &str, lease_token: &str) -> Result<(), Status> {
        self.queue
            .clone()
            .ack(pb::AckRequest {
                job_id: job_id.to_owned(),
                lease_token: lease_token.to_owned(),
                enqueue: Vec::new(),
                result: Vec::new(),
            })
            .await?;
        Ok(())
    }

    /// Acks many jobs in one call: `(job_id, lease_token)` pairs in, one
    /// result per pair out, each what [`Client::ack`] would have returned.
    /// The outer error is for the call itself (e.g. an invalid pair, which
    /// fails the whole call and acks nothing).
    pub async fn ack_batch(
        &self,
        acks: &[(String, String)],
    ) -> Result<Vec<Result<(), Status>>, Status> {
        let resp = self
            .queue
            .clone()
            .ack_batch(pb::AckBatchRequest {
                acks: acks
                    .iter()
                    .map(|(job_id, lease_token)| pb::AckRequest {
                        job_id: job_id.clone(),
                        lease_token: lease_token.clone(),
                        enqueue: Vec::new(),
                        result: Vec::new(),
                    })
                    .collect(),
            })
            .await?
            .into_inner();
        Ok(resp
            .results
            .into_iter()
            .map(|r| match r.code {
                0 => Ok(()),
                code => Err(Status::new(tonic::Code::from(code), r.message)),
            })
            .collect())
    }

    /// The job failed: `error` is kept as its `last_error`. Returns whether
    /// the job went to the dead letters.
    pub async fn nack(
        &self,
        job_id: &str,
        lease_token: &str,
        error: &str,
        options: Nack,
    ) -> Result<bool, Status> {
        let resp = self
            .queue
            .clone()
            .nack(pb::NackRequest {
                job_id: job_id.to_owned(),
                lease_token: lease_token.to_owned(),
                error: error.to_owned(),
                retry_after: options.retry_after.map(pb_duration),
                dead_letter: options.dead_letter,
            })
            .await?
            .into_inner();
        Ok(resp.dead_lettered)
    }

    /// Keeps the job leased for `lease` more (1 s to 12 h), counted from now.
    /// Returns the new expiry (broker clock).
    pub async fn extend_lease(
        &self,
        job_id: &str,
        lease_token: &str,
        lease: Duration,
    ) -> Result<DateTime<Utc>, Status> {
        let resp = self
            .queue
            .clone()
            .extend_lease(pb::ExtendLeaseRequest {
                job_id: job_id.to_owned(),
                lease_token: lease_token.to_owned(),
                lease: Some(pb_duration(lease)),
            })
            .await?
            .into_inner();
        resp.lease_expires_at
            .and_then(timestamp)
            .ok_or_else(|| Status::internal("ExtendLease response without lease_expires_at"))
    }

    /// Says how far a held job is (`ReportProgress`): `fraction` 0 to 1,
    /// `message` at most 256 bytes; read back by `GetJob`. Checked here
    /// first (`INVALID_ARGUMENT` naming the field, nothing sent);
    /// `FAILED_PRECONDITION` when the lease token is not current,
    /// `UNIMPLEMENTED` from a broker that predates progress.
    pub async fn report_progress(
        &self,
        job_id: &str,
        lease_token: &str,
        fraction: f32,
        message: &str,
    ) -> Result<(), Status> {
        check_progress(fraction, message)?;
        self.queue
            .clone()
            .report_progress(pb::ReportProgressRequest {
                job_id: job_id.to_owned(),
                lease_token: lease_token.to_owned(),
                fraction,
                message: message.to_owned(),
            })
            .await?;
        Ok(())
    }

    /// Waits for a job to end (WaitJob) and returns its outcome: `state`
    /// is COMPLETED (with `result`), DEAD (with `dead_reason` and
    /// `last_error`), CANCELLED or UNKNOWN (no live job and no record:
    /// acked without a record, purged, or never enqueued). `timeout` is at
    /// most an hour (None: an hour); past it, `DEADLINE_EXCEEDED`. The
    /// broker pushes the outcome: nothing polls on this side.
    pub async fn wait_job(
        &self,
        job_id: &str,
        timeout: Option<Duration>,
    ) -> Result<pb::WaitJobResponse, Status> {
        let mut stream = self
            .queue
            .clone()
            .wait_job(pb::WaitJobRequest {
                job_id: job_id.to_owned(),
                timeout: timeout.map(pb_duration),
                changes: false,
            })
            .await?
            .into_inner();
        stream
            .message()
            .await?
            .ok_or_else(|| Status::internal("WaitJob ended without an outcome"))
    }
}

/// `Progress.message`'s limit, in bytes.
pub const MAX_PROGRESS_MESSAGE: usize = 256;

/// `INVALID_ARGUMENT` naming the field for a report the broker would refuse.
pub(crate) fn check_progress(fraction: f32, message: &str) -> Result<(), Status> {
    if !(0.0..=1.0).contains(&fraction) {
        return Err(Status::invalid_argument(format!(
            "fraction: must be 0 to 1, not {fraction}"
        )));
    }
    if message.len() > MAX_PROGRESS_MESSAGE {
        return Err(Status::invalid_argument(format!(
            "message: is {} bytes, the limit is {MAX_PROGRESS_MESSAGE} bytes",
            message.len()
        )));
    }
    if message.contains('\0') {
        return Err(Status::invalid_argument("message: must not contain NUL"));
    }
    Ok(())
}

/// A job to enqueue: `Job::new(queue, payload)` plus optional settings.
#[derive(Clone, Debug, Default)]
pub struct Job {
    req: pb::EnqueueRequest,
}

impl Job {
    /// The request, with the caller's trace context where the `otel`
    /// feature adds it.
    fn into_pb(self) -> pb::EnqueueRequest {
        #[allow(unused_mut)]
        let mut req = self.req;
        #[cfg(feature = "otel")]
        otel::inject_current(&mut req.headers);
        req
    }

    pub fn new(queue: impl Into<String>, payload: impl Into<Vec<u8>>) -> Job {
        Job {
            req: pb::EnqueueRequest {
                queue: queue.into(),
                payload: payload.into(),
                ..Default::default()
            },
        }
    }

    /// Adds a header delivered with the job (content type, trace context).
    pub fn header(mut self, key: impl Into<String>, value: impl Into<String>) -> Job {
        self.req.headers.insert(key.into(), value.into());
        self
    }

    /// Adds several headers, e.g. the carrier an OpenTelemetry propagator
    /// filled (`propagator.inject_context(&cx, &mut map)` on a
    /// `HashMap<String, String>`).
    pub fn headers<K, V>(mut self, headers: impl IntoIterator<Item = (K, V)>) -> Job
    where
        K: Into<String>,
        V: Into<String>,
    {
        self.req
            .headers
            .extend(headers.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Sets the W3C `traceparent` header (e.g.
    /// `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`), which the
    /// worker hands back as [`Delivery::traceparent`]. Any SDK's worker
    /// reads the same header.
    pub fn traceparent(self, traceparent: impl fmt::Display) -> Job {
        self.header(trace::TRACEPARENT, traceparent.to_string())
    }

    /// Sets the W3C `tracestate` header that goes with `traceparent`.
    pub fn tracestate(self, tracestate: impl Into<String>) -> Job {
        self.header(trace::TRACESTATE, tracestate)
    }

    /// Higher is delivered first (default 0).
    pub fn priority(mut self, priority: i32) -> Job {
        self.req.priority = priority;
        self
    }

    /// Deliver no earlier than this long after the enqueue commits.
    pub fn delay(mut self, delay: Duration) -> Job {
        self.req.delay = Some(pb_duration(delay));
        self
    }

    /// Deliver no earlier than this instant.
    pub fn run_at(mut self, at: SystemTime) -> Job {
        self.req.run_at = Some(at.into());
        self
    }

    /// While a job with this key is live in the queue (or holds it after
    /// completing: [`Job::unique_for`]), enqueue returns that job's id with
    /// `duplicate = true` instead of adding another.
    pub fn dedup_key(mut self, key: impl Into<String>) -> Job {
        self.req.dedup_key = key.into();
        self
    }

    /// Unique for a window: once this job completes (is acked), its dedup
    /// key stays held for `window` (at most 366 days), so an enqueue with
    /// the same key in that time returns this job's id with `duplicate =
    /// true`. A dead-lettered, cancelled or expired job holds nothing.
    /// Needs [`Job::dedup_key`].
    pub fn unique_for(mut self, window: Duration) -> Job {
        self.req.unique_for = Some(pb_duration(window));
        self
    }

    /// Debounce: if a job with the same dedup key is waiting (not leased),
    /// it takes this job's payload, headers, priority and delivery time
    /// (a [`Job::delay`] counts from this enqueue) and keeps its id; the
    /// result has `replaced = true`. A leased job is left as it is
    /// (`duplicate = true`, `replaced = false`). Needs [`Job::dedup_key`].
    pub fn replace_waiting(mut self) -> Job {
        self.req.on_duplicate = pb::OnDuplicate::Replace as i32;
        self
    }

    /// The job's key inside its queue (a customer, an account, a
    /// document; at most 256 bytes). In a queue with `ordered_by_key`, the
    /// jobs of one key are delivered in enqueue order; the queue's per-key
    /// limits (`key_concurrency`, `key_rate_limit`, key overrides) and
    /// fair shares (`fair_by_key`) apply per key ([`QueueUpdate`]).
    pub fn key(mut self, key: impl Into<String>) -> Job {
        self.req.key = key.into();
        self
    }

    /// Deliveries before the job is dead-lettered (default: the queue's).
    pub fn max_attempts(mut self, n: i32) -> Job {
        self.req.max_attempts = n;
        self
    }

    /// Dead-letter the job (reason `expired`) if not completed within `ttl`.
    pub fn ttl(mut self, ttl: Duration) -> Job {
        self.req.ttl = Some(pb_duration(ttl));
        self
    }
}

impl From<Job> for pb::EnqueueRequest {
    fn from(j: Job) -> Self {
        j.req
    }
}

impl From<pb::EnqueueRequest> for Job {
    fn from(req: pb::EnqueueRequest) -> Self {
        Job { req }
    }
}

/// The result of one enqueue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enqueued {
    pub job_id: String,
    /// The dedup key matched a live job (or one holding it after
    /// completing); `job_id` is that job's.
    pub duplicate: bool,
    /// The waiting job `job_id` took this job's payload
    /// ([`Job::replace_waiting`]).
    pub replaced: bool,
}

impl From<pb::EnqueueResponse> for Enqueued {
    fn from(r: pb::EnqueueResponse) -> Self {
        Enqueued {
            job_id: r.job_id,
            duplicate: r.duplicate,
            replaced: r.replaced,
        }
    }
}

/// How to fail a job (see [`Client::nack`]).
#[derive(Clone, Debug, Default)]
pub struct Nack {
    /// None = the queue's backoff policy; zero = retry at once.
    pub retry_after: Option<Duration>,
    /// Give up now: move the job to the dead letters.
    pub dead_letter: bool,
}

/// A job delivered to a [`Worker`] handler.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub id: String,
    pub queue: String,
    pub payload: Vec<u8>,
    pub headers: HashMap<String, String>,
    pub priority: i32,
    /// 1 on first delivery.
    pub attempt: i32,
    pub enqueued_at: Option<DateTime<Utc>>,
    /// The error of the previous failed attempt, if any.
    pub last_error: Option<String>,
    /// The job's key inside its queue ([`Job::key`]), if it has one.
    pub key: Option<String>,
    /// Required to settle or extend this delivery; the worker does both.
    pub lease_token: String,
    /// When the lease was first due to expire (broker clock). The worker
    /// extends it while the handler runs.
    pub lease_expires_at: Option<DateTime<Utc>>,
}

impl Delivery {
    /// The job's W3C `traceparent` header, as the producer set it.
    pub fn traceparent(&self) -> Option<&str> {
        self.headers.get(trace::TRACEPARENT).map(String::as_str)
    }

    /// The job's W3C `tracestate` header.
    pub fn tracestate(&self) -> Option<&str> {
        self.headers.get(trace::TRACESTATE).map(String::as_str)
    }

    /// The producer's trace context, parsed: None without a well-formed
    /// `traceparent`.
    pub fn trace_parent(&self) -> Option<TraceParent> {
        self.traceparent().and_then(TraceParent::parse)
    }

    fn from_pb(d: pb::Delivery) -> Option<Delivery> {
        let job = d.job?;
        Some(Delivery {
            id: job.id,
            queue: job.queue,
            payload: job.payload,
            headers: job.headers,
            priority: job.priority,
            attempt: job.attempt,
            enqueued_at: job.enqueued_at.and_then(timestamp),
            last_error: Some(job.last_error).filter(|e| !e.is_empty()),
            key: Some(job.key).filter(|k| !k.is_empty()),
            lease_token: d.lease_token,
            lease_expires_at: d.lease_expires_at.and_then(timestamp),
        })
    }
}

fn pb_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

fn timestamp(t: prost_types::Timestamp) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_cheap_to_share() {
        fn shareable<T: Clone + Send + Sync + 'static>() {}
        shareable::<Client>();
        shareable::<AdminClient>();
        shareable::<ConnectOptions>();
    }

    #[tokio::test]
    async fn lazy_connections_check_their_options_first() {
        let opts = ConnectOptions::default().token("t\u{f6}ken");
        match Client::connect_lazy_with("http://127.0.0.1:1", opts) {
            Err(ConnectError::Config(msg)) => assert!(msg.starts_with("token:"), "{msg}"),
            other => panic!("{other:?}"),
        }
        let opts = ConnectOptions::default().tls_ca("/nonexistent/ca.pem");
        match Client::connect_lazy_with("https://127.0.0.1:1", opts) {
            Err(ConnectError::Config(msg)) => assert!(msg.starts_with("tls_ca:"), "{msg}"),
            other => panic!("{other:?}"),
        }
        assert!(Client::connect_lazy_with("http://127.0.0.1:1", ConnectOptions::default()).is_ok());
        assert!(format!("{:?}", ConnectOptions::default().token("s3cret")).contains("<redacted>"));
    }

    #[test]
    fn jobs_carry_trace_context() {
        let tp =
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let req = pb::EnqueueRequest::from(
            Job::new("q", "p")
                .traceparent(tp)
                .tracestate("a=b")
                .headers([("x", "1")]),
        );
        assert_eq!(req.headers["traceparent"], tp.to_string());
        assert_eq!(req.headers["tracestate"], "a=b");
        assert_eq!(req.headers["x"], "1");
    }
}
