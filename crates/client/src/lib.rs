//! The Rust client: [`Client`] for the unary calls (enqueue, ack, nack,
//! extend), and [`Worker`], which holds a Subscribe stream open, reconnects
//! when it breaks, runs a handler per job with bounded concurrency, extends
//! leases while handlers run and settles each job with Ack or Nack.
//!
//! ```no_run
//! use std::time::Duration;
//! use leaseq_client::{Client, Job, Worker};
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! let sent = client
//!     .enqueue(Job::new("emails", r#"{"to":"a@b.c"}"#).header("content-type", "application/json"))
//!     .await?;
//! println!("enqueued {}", sent.job_id);
//!
//! Worker::new(client, ["emails"])
//!     .concurrency(8)
//!     .lease(Duration::from_secs(30))
//!     .run(
//!         |job| async move {
//!             println!("{} attempt {}", job.id, job.attempt);
//!             Ok::<(), std::io::Error>(())
//!         },
//!         async { tokio::signal::ctrl_c().await.ok(); },
//!     )
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! Every call returns the broker's [`tonic::Status`] unchanged, so callers
//! can match on `status.code()` (see the error table in the README).

pub mod connect;
mod worker;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use leaseq_proto as pb;
use pb::queue_service_client::QueueServiceClient;

pub use connect::{ClientChannel, ConnectError, ConnectOptions, connect};
pub use worker::Worker;

/// Largest message the client accepts from the broker. Matches the broker's
/// default `--max-message-bytes`, so a delivery of any accepted payload fits.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A connection to a leaseq broker (or a load balancer in front of several).
///
/// Cheap to clone: clones share one HTTP/2 connection, which reconnects on
/// its own when it breaks.
#[derive(Clone, Debug)]
pub struct Client {
    channel: Channel,
    queue: QueueServiceClient<Channel>,
}

impl Client {
    /// Connects now; fails if the broker cannot be reached.
    pub async fn connect(addr: impl Into<String>) -> Result<Client, tonic::transport::Error> {
        let channel = endpoint(addr.into())?.connect().await?;
        Ok(Client::from_channel(channel))
    }

    /// Connects on first use; fails only on a malformed address. A [`Worker`]
    /// built on it waits for a broker that is not up yet.
    pub fn connect_lazy(addr: impl Into<String>) -> Result<Client, tonic::transport::Error> {
        Ok(Client::from_channel(endpoint(addr.into())?.connect_lazy()))
    }

    /// Wraps a channel configured by the caller (TLS, interceptors' channel).
    pub fn from_channel(channel: Channel) -> Client {
        let queue = QueueServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Client { channel, queue }
    }

    /// The underlying channel, for other services on the same broker
    /// (health, and the admin service).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The generated gRPC client, for anything this wrapper does not cover.
    pub fn queue_service(&self) -> QueueServiceClient<Channel> {
        self.queue.clone()
    }

    /// Adds one job; returns once it is committed.
    pub async fn enqueue(&self, job: Job) -> Result<Enqueued, Status> {
        let resp = self.queue.clone().enqueue(job.req).await?.into_inner();
        Ok(Enqueued::from(resp))
    }

    /// Adds many jobs atomically (all or none). Results are in request order.
    pub async fn enqueue_batch(
        &self,
        jobs: impl IntoIterator<Item = Job>,
    ) -> Result<Vec<Enqueued>, Status> {
        let req = pb::EnqueueBatchRequest {
            jobs: jobs.into_iter().map(|j| j.req).collect(),
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

    // Admin calls (queue settings, dead letters, stats) belong in
    // `src/client/admin.rs` as a second `impl Client` block, reaching the
    // admin service through `self.channel`.
}

fn endpoint(addr: String) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(addr)?
        .connect_timeout(Duration::from_secs(5))
        // A stream that goes quiet because the connection died (not because
        // the queue is idle: the broker sends heartbeats) is noticed by
        // HTTP/2 pings, so the worker reconnects.
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true))
}

/// A job to enqueue: `Job::new(queue, payload)` plus optional settings.
#[derive(Clone, Debug, Default)]
pub struct Job {
    req: pb::EnqueueRequest,
}

impl Job {
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

    /// While a job with this key is live in the queue, enqueue returns that
    /// job's id with `duplicate = true` instead of adding another.
    pub fn dedup_key(mut self, key: impl Into<String>) -> Job {
        self.req.dedup_key = key.into();
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
    /// The dedup key matched a live job; `job_id` is that job's.
    pub duplicate: bool,
}

impl From<pb::EnqueueResponse> for Enqueued {
    fn from(r: pb::EnqueueResponse) -> Self {
        Enqueued {
            job_id: r.job_id,
            duplicate: r.duplicate,
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
    /// Required to settle or extend this delivery; the worker does both.
    pub lease_token: String,
    /// When the lease was first due to expire (broker clock). The worker
    /// extends it while the handler runs.
    pub lease_expires_at: Option<DateTime<Utc>>,
}

impl Delivery {
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
