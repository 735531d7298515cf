//! [`AdminClient`]: the operator API (`leaseq.v1.AdminService`) as thin typed
//! wrappers over the generated client, on the same connection options as
//! [`Client`](crate::Client).

use std::fmt;
use std::time::Duration;

use tonic::transport::Channel;
use tonic::{Status, Streaming};

use crate::connect::{self, ClientChannel, ConnectError, ConnectOptions};
use crate::{MAX_MESSAGE_BYTES, pb, pb_duration};
use pb::admin_service_client::AdminServiceClient;

/// The admin service of a broker: queues (settings, pause, purge, stats),
/// jobs (inspect, list, cancel) and dead letters (list, requeue, purge).
/// With tokens on, every call needs a token granted `admin` on every queue
/// (`"queues": "*"`).
///
/// Cheap to clone; the responses are the generated messages of
/// [`pb`](crate::pb) (`QueueInfo`, `JobInfo`, ...). Errors are the broker's
/// [`Status`]: `NOT_FOUND` for an unknown queue or job, `INVALID_ARGUMENT`
/// naming the field.
#[derive(Clone)]
pub struct AdminClient {
    admin: AdminServiceClient<ClientChannel>,
}

impl fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminClient").finish_non_exhaustive()
    }
}

impl AdminClient {
    /// Connects now to `addr` (`host:port`, `http://` or `https://`) with
    /// `options`.
    pub async fn connect_with(
        addr: impl AsRef<str>,
        options: ConnectOptions,
    ) -> Result<AdminClient, ConnectError> {
        Ok(AdminClient::from_client_channel(
            connect::connect(addr.as_ref(), &options).await?,
        ))
    }

    /// Connects on first use.
    pub fn connect_lazy_with(
        addr: impl AsRef<str>,
        options: ConnectOptions,
    ) -> Result<AdminClient, ConnectError> {
        Ok(AdminClient::from_client_channel(connect::connect_lazy(
            addr.as_ref(),
            &options,
        )?))
    }

    /// Connects now, without TLS files or a token (`https://` still verifies
    /// against the system's roots).
    pub async fn connect(addr: impl AsRef<str>) -> Result<AdminClient, ConnectError> {
        AdminClient::connect_with(addr, ConnectOptions::default()).await
    }

    /// Connects now to the broker the environment names (`LEASEQ_ADDR`,
    /// `LEASEQ_TOKEN`, `LEASEQ_TLS_CA`, `LEASEQ_CLIENT_CERT`,
    /// `LEASEQ_CLIENT_KEY`), as [`Client::connect_env`](crate::Client::connect_env).
    pub async fn connect_env() -> Result<AdminClient, ConnectError> {
        AdminClient::connect_with(connect::addr_from_env(), ConnectOptions::from_env()).await
    }

    pub fn from_channel(channel: Channel) -> AdminClient {
        AdminClient::from_client_channel(ClientChannel::new(channel, connect::Bearer::default()))
    }

    pub fn from_client_channel(channel: ClientChannel) -> AdminClient {
        AdminClient {
            admin: AdminServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        }
    }

    /// The generated client.
    pub fn admin_service(&self) -> AdminServiceClient<ClientChannel> {
        self.admin.clone()
    }

    fn c(&self) -> AdminServiceClient<ClientChannel> {
        self.admin.clone()
    }

    /// One page of queues in name order (`page_size` 0 = 100; `page_token`
    /// from the previous page's `next_page_token`, empty for the first).
    pub async fn list_queues(
        &self,
        page_size: u32,
        page_token: &str,
    ) -> Result<pb::ListQueuesResponse, Status> {
        let req = pb::ListQueuesRequest {
            page_size,
            page_token: page_token.to_owned(),
        };
        Ok(self.c().list_queues(req).await?.into_inner())
    }

    /// Every queue, all pages.
    pub async fn queues(&self) -> Result<Vec<pb::QueueInfo>, Status> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let page = self.list_queues(1000, &token).await?;
            out.extend(page.queues);
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            token = page.next_page_token;
        }
    }

    /// One queue's settings and live statistics.
    pub async fn get_queue(&self, queue: &str) -> Result<pb::QueueInfo, Status> {
        let req = pb::GetQueueRequest {
            queue: queue.to_owned(),
        };
        Ok(self.c().get_queue(req).await?.into_inner())
    }

    /// Changes the settings `update` sets (see [`QueueUpdate`]).
    pub async fn update_queue(
        &self,
        queue: &str,
        update: QueueUpdate,
    ) -> Result<pb::QueueInfo, Status> {
        let mut req = update.req;
        req.queue = queue.to_owned();
        Ok(self.c().update_queue(req).await?.into_inner())
    }

    /// Stops delivery (enqueues are still accepted; held leases stay valid).
    pub async fn pause_queue(&self, queue: &str) -> Result<pb::QueueInfo, Status> {
        let req = pb::PauseQueueRequest {
            queue: queue.to_owned(),
        };
        Ok(self.c().pause_queue(req).await?.into_inner())
    }

    pub async fn resume_queue(&self, queue: &str) -> Result<pb::QueueInfo, Status> {
        let req = pb::ResumeQueueRequest {
            queue: queue.to_owned(),
        };
        Ok(self.c().resume_queue(req).await?.into_inner())
    }

    /// Deletes the queue's waiting jobs (and kept completed ones); leased
    /// jobs are left alone.
    pub async fn purge_queue(&self, queue: &str) -> Result<pb::PurgeQueueResponse, Status> {
        let req = pb::PurgeQueueRequest {
            queue: queue.to_owned(),
        };
        Ok(self.c().purge_queue(req).await?.into_inner())
    }

    /// A live, dead or kept completed job, with its payload.
    pub async fn get_job(&self, job_id: &str) -> Result<pb::JobInfo, Status> {
        let req = pb::GetJobRequest {
            job_id: job_id.to_owned(),
        };
        Ok(self.c().get_job(req).await?.into_inner())
    }

    /// One page of jobs, e.g.
    /// `pb::ListJobsRequest { queue: "emails".into(), state: pb::JobState::Available as i32, ..Default::default() }`.
    pub async fn list_jobs(
        &self,
        req: pb::ListJobsRequest,
    ) -> Result<pb::ListJobsResponse, Status> {
        Ok(self.c().list_jobs(req).await?.into_inner())
    }

    /// One page of a queue's keys with their jobs waiting and leased, e.g.
    /// `pb::ListKeysRequest { queue: "emails".into(), order: pb::KeyOrder::Waiting as i32, ..Default::default() }`
    /// for the keys with the most jobs waiting.
    pub async fn list_keys(
        &self,
        req: pb::ListKeysRequest,
    ) -> Result<pb::ListKeysResponse, Status> {
        Ok(self.c().list_keys(req).await?.into_inner())
    }

    /// Deletes a live job. Returns whether it was leased (its holder's
    /// settles then fail with `FAILED_PRECONDITION`).
    pub async fn cancel_job(&self, job_id: &str) -> Result<bool, Status> {
        let req = pb::CancelJobRequest {
            job_id: job_id.to_owned(),
        };
        Ok(self.c().cancel_job(req).await?.into_inner().was_leased)
    }

    /// One page of dead letters of `queue` (empty: every queue).
    pub async fn list_dead_letters(
        &self,
        queue: &str,
        page_size: u32,
        page_token: &str,
        include_payload: bool,
    ) -> Result<pb::ListJobsResponse, Status> {
        let req = pb::ListDeadLettersRequest {
            queue: queue.to_owned(),
            page_size,
            page_token: page_token.to_owned(),
            include_payload,
        };
        Ok(self.c().list_dead_letters(req).await?.into_inner())
    }

    /// Moves dead letters back to their queue with attempt 0.
    pub async fn requeue_dead_letters(
        &self,
        which: DeadLetters,
    ) -> Result<pb::RequeueDeadLettersResponse, Status> {
        Ok(self.c().requeue_dead_letters(which.0).await?.into_inner())
    }

    /// Deletes dead letters for good; returns how many.
    pub async fn purge_dead_letters(&self, which: DeadLetters) -> Result<i64, Status> {
        Ok(self
            .c()
            .purge_dead_letters(which.0)
            .await?
            .into_inner()
            .purged)
    }

    /// Statistics of `queues` (empty: all) pushed at once, then on every
    /// change and at least every `interval` (None = 5 s).
    pub async fn watch_queues(
        &self,
        queues: impl IntoIterator<Item = impl Into<String>>,
        interval: Option<Duration>,
    ) -> Result<Streaming<pb::WatchQueuesResponse>, Status> {
        let req = pb::WatchQueuesRequest {
            queues: queues.into_iter().map(Into::into).collect(),
            interval: interval.map(pb_duration),
        };
        Ok(self.c().watch_queues(req).await?.into_inner())
    }
}

/// Which settings [`AdminClient::update_queue`] changes: only those set.
///
/// ```
/// # use std::time::Duration;
/// use leaseq_client::QueueUpdate;
///
/// let update = QueueUpdate::new()
///     .create()
///     .max_attempts(5)
///     .backoff(Duration::from_secs(1), Duration::from_secs(60))
///     .rate_limit(100.0);
/// ```
#[derive(Clone, Debug, Default)]
pub struct QueueUpdate {
    req: pb::UpdateQueueRequest,
}

impl QueueUpdate {
    pub fn new() -> QueueUpdate {
        QueueUpdate::default()
    }

    /// Create the queue (defaults, then these settings) if it does not exist.
    pub fn create(mut self) -> QueueUpdate {
        self.req.create = true;
        self
    }

    /// Lease of deliveries whose stream asks for none (1 s to 12 h).
    pub fn default_lease(mut self, lease: Duration) -> QueueUpdate {
        self.req.default_lease = Some(pb_duration(lease));
        self
    }

    /// Deliveries before a failing job is dead-lettered (1 to 1000).
    pub fn max_attempts(mut self, n: i32) -> QueueUpdate {
        self.req.max_attempts = Some(n);
        self
    }

    /// Backoff after a nack without `retry_after`:
    /// `min(cap, base * 2^(attempt-1))`, jittered.
    pub fn backoff(mut self, base: Duration, cap: Duration) -> QueueUpdate {
        self.req.backoff_base = Some(pb_duration(base));
        self.req.backoff_cap = Some(pb_duration(cap));
        self
    }

    /// How long acked jobs are kept; zero stops keeping them.
    pub fn completed_retention(mut self, keep: Duration) -> QueueUpdate {
        self.req.completed_retention = Some(pb_duration(keep));
        self
    }

    pub fn paused(mut self, paused: bool) -> QueueUpdate {
        self.req.paused = Some(paused);
        self
    }

    /// Most jobs of the queue leased at once, across replicas; 0 = no limit.
    pub fn concurrency_limit(mut self, n: i32) -> QueueUpdate {
        self.req.concurrency_limit = Some(n);
        self
    }

    /// Jobs started per second, across replicas; 0 = no limit.
    pub fn rate_limit(mut self, per_second: f64) -> QueueUpdate {
        self.req.rate_limit = Some(per_second);
        self
    }

    /// Bucket size of the rate limit; 0 = the default.
    pub fn rate_burst(mut self, n: i32) -> QueueUpdate {
        self.req.rate_burst = Some(n);
        self
    }

    /// Deliver the jobs of one key ([`Job::key`](crate::Job::key)) in
    /// enqueue order, at most `key_concurrency` of a key leased at once; a
    /// retry keeps its place at the head of its key, a dead letter or a
    /// cancel lets the key go on; jobs without a key are not held back.
    /// Turning it on sets `key_concurrency` to 1 unless it is given;
    /// turning it off clears `key_concurrency`.
    pub fn ordered_by_key(mut self, on: bool) -> QueueUpdate {
        self.req.ordered_by_key = Some(on);
        self
    }

    /// Most jobs of one key leased at once, across replicas (1 to 1000; 0
    /// clears it). With `ordered_by_key` the first N of the key in enqueue
    /// order; without, any N of them.
    pub fn key_concurrency(mut self, n: i32) -> QueueUpdate {
        self.req.key_concurrency = Some(n);
        self
    }

    /// Fair shares across keys: each lease round serves the keys with jobs
    /// waiting in turn (up to a key's [`KeyOverride::weight`] jobs per
    /// turn) instead of in delivery order, so one key's backlog does not
    /// delay another key's jobs. Give every job of a fair queue a key: jobs
    /// without one share a single turn.
    pub fn fair_by_key(mut self, on: bool) -> QueueUpdate {
        self.req.fair_by_key = Some(on);
        self
    }

    /// Jobs of one key started per second, across replicas, as a token
    /// bucket per key (0.001 to 1,000,000; 0 removes it and its burst).
    pub fn key_rate_limit(mut self, per_second: f64) -> QueueUpdate {
        self.req.key_rate_limit = Some(per_second);
        self
    }

    /// Bucket size of the per-key rate limit (1 to 1,000,000; 0 = the
    /// default, `max(1, ceil(key_rate_limit))`).
    pub fn key_rate_burst(mut self, n: i32) -> QueueUpdate {
        self.req.key_rate_burst = Some(n);
        self
    }

    /// Named keys' own settings. Replaces the queue's whole list (at most
    /// 1000, keys unique); an empty list removes them all, as
    /// [`clear_key_overrides`](QueueUpdate::clear_key_overrides) does.
    ///
    /// ```
    /// use leaseq_client::{KeyOverride, QueueUpdate};
    ///
    /// let update = QueueUpdate::new().key_concurrency(2).key_overrides([
    ///     KeyOverride::new("enterprise-7").concurrency(10).weight(5),
    ///     KeyOverride::new("trial-3").rate_limit(0.5),
    /// ]);
    /// ```
    pub fn key_overrides(
        mut self,
        overrides: impl IntoIterator<Item = impl Into<pb::KeyOverride>>,
    ) -> QueueUpdate {
        self.req.key_overrides = Some(pb::KeyOverrides {
            overrides: overrides.into_iter().map(Into::into).collect(),
        });
        self
    }

    /// Removes every key override.
    pub fn clear_key_overrides(self) -> QueueUpdate {
        self.key_overrides(std::iter::empty::<pb::KeyOverride>())
    }
}

/// What one named key of a queue gets instead of the queue's per-key
/// settings ([`QueueUpdate::key_overrides`]); a setting left out (0) is the
/// queue's. The broker checks the ranges: `INVALID_ARGUMENT` naming
/// `key_overrides[i].field`. `GetQueue` returns them as
/// [`pb::KeyOverride`], in key order.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyOverride(pb::KeyOverride);

impl KeyOverride {
    /// The key (1 to 256 bytes); give it at least one setting.
    pub fn new(key: impl Into<String>) -> KeyOverride {
        KeyOverride(pb::KeyOverride {
            key: key.into(),
            ..Default::default()
        })
    }

    /// Most jobs of this key leased at once (1 to 1000).
    pub fn concurrency(mut self, n: i32) -> KeyOverride {
        self.0.concurrency = n;
        self
    }

    /// Jobs of this key started per second (0.001 to 1,000,000); its
    /// bucket holds `max(1, ceil(rate))` tokens.
    pub fn rate_limit(mut self, per_second: f64) -> KeyOverride {
        self.0.rate_limit = per_second;
        self
    }

    /// Jobs of this key per turn in a fair round (1 to 100; the default 1).
    pub fn weight(mut self, n: i32) -> KeyOverride {
        self.0.weight = n;
        self
    }
}

impl From<KeyOverride> for pb::KeyOverride {
    fn from(o: KeyOverride) -> Self {
        o.0
    }
}

impl From<QueueUpdate> for pb::UpdateQueueRequest {
    fn from(u: QueueUpdate) -> Self {
        u.req
    }
}

/// Which dead letters to requeue or purge.
#[derive(Clone, Debug)]
pub struct DeadLetters(pb::DeadLettersSelector);

impl DeadLetters {
    /// Every dead letter of `queue`.
    pub fn all(queue: impl Into<String>) -> DeadLetters {
        DeadLetters(pb::DeadLettersSelector {
            queue: queue.into(),
            ids: Vec::new(),
            all: true,
        })
    }

    /// These dead letters (at most 1000), of any queue.
    pub fn ids(ids: impl IntoIterator<Item = impl Into<String>>) -> DeadLetters {
        DeadLetters(pb::DeadLettersSelector {
            queue: String::new(),
            ids: ids.into_iter().map(Into::into).collect(),
            all: false,
        })
    }

    /// Restricts `ids` to this queue.
    pub fn in_queue(mut self, queue: impl Into<String>) -> DeadLetters {
        self.0.queue = queue.into();
        self
    }
}
