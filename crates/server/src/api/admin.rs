//! `leaseq.v1.AdminService`: queues, jobs and dead letters for operators.
//!
//! Handlers validate (INVALID_ARGUMENT names the field), call
//! [`crate::store::admin`], and convert. Unknown queues and jobs are
//! `Error::NotFound`. Queues that get jobs back (resume, requeue) are woken on
//! every replica the way enqueue does: in-process and by NOTIFY.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{info, instrument};
use uuid::Uuid;

use super::schedules::Schedules;
use crate::broker::Broker;
use crate::config::RequestLimits;
use crate::domain::Wake;
use crate::domain::{self, JobId, MAX_ATTEMPTS, MAX_DELAY, MAX_SUBSCRIBE_QUEUES, QueueName};
use crate::error::{Error, Result};
use crate::fanout;
use crate::pb;
use crate::pb::admin_service_server::AdminService;
use crate::placement::Clusters;
use crate::schedule::run::Scheduler;
use crate::store::admin::{
    self as sql, JobFilter, JobRow, JobState, KeyOrder, QueueRow, QueueUpdate,
};
use leaseq_proto::limits::{MAX_KEY_CONCURRENCY, MAX_KEY_OVERRIDES, MAX_KEY_WEIGHT};

/// Page size when the request says 0, and the most a page may hold.
pub const DEFAULT_PAGE_SIZE: u32 = 100;
pub const MAX_PAGE_SIZE: u32 = 1000;
/// Most ids in one dead-letter selector.
pub const MAX_SELECTOR_IDS: usize = 1000;
/// WatchQueues: default and bounds of the push interval, and how often job
/// counts are sampled to push on change.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_secs(5);
pub const MIN_WATCH_INTERVAL: Duration = Duration::from_secs(1);
pub const MAX_WATCH_INTERVAL: Duration = Duration::from_secs(3600);
const WATCH_SAMPLE: Duration = Duration::from_secs(1);
/// Most queues one WatchQueues message carries when watching every queue.
const WATCH_ALL_LIMIT: i64 = 1000;

pub struct AdminApi {
    broker: Arc<Broker>,
    /// The schedule RPCs (api/schedules.rs).
    schedules: Schedules,
    /// Cancelled at the start of a drain: WatchQueues streams end with
    /// UNAVAILABLE so the server can stop.
    draining: CancellationToken,
}

impl AdminApi {
    pub fn new(
        broker: Arc<Broker>,
        draining: CancellationToken,
        scheduler: Scheduler,
        limits: RequestLimits,
    ) -> Self {
        let schedules = Schedules {
            scheduler,
            clusters: broker.clusters().clone(),
            limits,
        };
        AdminApi {
            broker,
            schedules,
            draining,
        }
    }

    /// Every cluster: calls over all queues or jobs fan out and merge
    /// (docs/SCALING.md); calls about one queue's settings go to its cluster.
    pub fn clusters(&self) -> &crate::placement::Clusters {
        self.broker.clusters()
    }

    /// The queue's settings and statistics (from the clusters that answer:
    /// the names of those that did not come along).
    async fn queue_info(&self, name: &QueueName) -> Result<fanout::Partial<pb::QueueInfo>> {
        let found = fanout::queue(self.clusters(), name).await?;
        let missing = found.missing;
        let info = found
            .value
            .map(queue_info)
            .ok_or_else(|| unknown_queue(name))?;
        Ok(fanout::Partial {
            value: info,
            missing,
        })
    }

    /// Runs a write on the queue's cluster; an outage of it names it.
    async fn on_queue_cluster<'a, T, Fut>(
        &'a self,
        name: &QueueName,
        f: impl FnOnce(&'a crate::store::Store) -> Fut,
    ) -> Result<T>
    where
        Fut: std::future::Future<Output = Result<T>>,
    {
        let store = self.clusters().store_for(name)?;
        let r = f(store).await;
        if self.clusters().is_single() {
            r
        } else {
            r.map_err(|e| e.on_cluster(store.cluster_name()))
        }
    }

    /// Wakes the queue's streams here and on every replica.
    async fn wake(&self, queues: impl IntoIterator<Item = QueueName>) -> Result<()> {
        let wakes: Vec<Wake> = queues
            .into_iter()
            .map(|queue| Wake { queue, delay_ms: 0 })
            .collect();
        self.broker.settle().wake(wakes);
        Ok(())
    }

    /// Resumes and wakes: ready jobs at once, and the next delayed job at its
    /// run_at (a dispatcher may have dropped that timer while paused).
    async fn resumed(&self, name: &QueueName) -> Result<()> {
        self.wake([name.clone()]).await?;
        let due = self
            .on_queue_cluster(name, |store| store.next_due(std::slice::from_ref(name)))
            .await?;
        let wakes: Vec<Wake> = due
            .into_iter()
            .filter_map(|d| {
                d.due_ms.map(|delay_ms| Wake {
                    queue: d.queue,
                    delay_ms,
                })
            })
            .collect();
        self.broker.settle().wake(wakes);
        Ok(())
    }
}

/// A response, with the clusters it lacks named in its metadata
/// ([`fanout::UNAVAILABLE_CLUSTERS_HEADER`]) when some did not answer.
fn partial_response<T>(value: T, missing: &[String]) -> Response<T> {
    let mut r = Response::new(value);
    if !missing.is_empty()
        && let Ok(v) = missing.join(",").parse()
    {
        r.metadata_mut()
            .insert(fanout::UNAVAILABLE_CLUSTERS_HEADER, v);
    }
    r
}

fn unknown_queue(name: &QueueName) -> Error {
    Error::NotFound(format!("queue {name:?} does not exist"))
}

fn queue_field(s: &str, field: &str) -> Result<QueueName> {
    if s.is_empty() {
        return Err(Error::invalid(field, "is required"));
    }
    QueueName::parse_field(s, field)
}

fn optional_queue(s: &str, field: &str) -> Result<Option<QueueName>> {
    if s.is_empty() {
        Ok(None)
    } else {
        QueueName::parse_field(s, field).map(Some)
    }
}

pub(super) fn page_size(n: u32, field: &str) -> Result<i64> {
    match n {
        0 => Ok(i64::from(DEFAULT_PAGE_SIZE)),
        n if n <= MAX_PAGE_SIZE => Ok(i64::from(n)),
        _ => Err(Error::invalid(
            field,
            format!("must be at most {MAX_PAGE_SIZE}"),
        )),
    }
}

/// Page tokens are opaque to clients: a kind letter and the last key seen,
/// hex-encoded. The kind stops a token of one listing being used in another.
pub(super) fn encode_token(kind: char, key: &str) -> String {
    let mut out = String::with_capacity(2 + key.len() * 2);
    for b in format!("{kind}:{key}").bytes() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

pub(super) fn decode_token(token: &str, kind: char) -> Result<Option<String>> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || Error::invalid("page_token", "is not a token from a previous response");
    if !token.len().is_multiple_of(2) || token.len() > 1024 {
        return Err(bad());
    }
    let bytes: Vec<u8> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
        .collect::<Result<_>>()?;
    let s = String::from_utf8(bytes).map_err(|_| bad())?;
    let key = s
        .strip_prefix(kind)
        .and_then(|s| s.strip_prefix(':'))
        .ok_or_else(bad)?;
    Ok(Some(key.to_owned()))
}

fn decode_job_token(token: &str, kind: char) -> Result<Option<Uuid>> {
    decode_token(token, kind)?
        .map(|k| {
            Uuid::try_parse(&k).map_err(|_| {
                Error::invalid("page_token", "is not a token from a previous response")
            })
        })
        .transpose()
}

fn proto_duration(ms: i64) -> Option<prost_types::Duration> {
    Duration::from_millis(ms.max(0) as u64).try_into().ok()
}

pub(super) fn ts(t: chrono::DateTime<chrono::Utc>) -> prost_types::Timestamp {
    std::time::SystemTime::from(t).into()
}

pub fn queue_info(q: QueueRow) -> pb::QueueInfo {
    pb::QueueInfo {
        settings: Some(pb::QueueSettings {
            default_lease: proto_duration(q.default_lease_ms),
            max_attempts: q.max_attempts,
            backoff_base: proto_duration(q.backoff_base_ms),
            backoff_cap: proto_duration(q.backoff_cap_ms),
            completed_retention: q.completed_retention_ms.and_then(proto_duration),
            paused: q.paused,
            concurrency_limit: q.concurrency_limit.unwrap_or(0),
            rate_limit: q.rate_limit.unwrap_or(0.0),
            rate_burst: q.rate_burst.unwrap_or(0),
            ordered_by_key: q.ordered_by_key,
            key_concurrency: if q.ordered_by_key {
                q.key_concurrency.unwrap_or(1)
            } else {
                q.key_concurrency.unwrap_or(0)
            },
            fair_by_key: q.fair_by_key,
            key_rate_limit: q.key_rate_limit.unwrap_or(0.0),
            key_rate_burst: q.key_rate_burst.unwrap_or(0),
            key_overrides: q
                .key_overrides
                .into_iter()
                .map(|o| pb::KeyOverride {
                    key: o.key,
                    concurrency: o.concurrency.unwrap_or(0),
                    rate_limit: o.rate_limit.unwrap_or(0.0),
                    weight: o.weight.unwrap_or(0),
                })
                .collect(),
        }),
        stats: Some(pb::QueueStats {
            available: q.available,
            scheduled: q.scheduled,
            leased: q.leased,
            dead: q.dead,
            oldest_available_age: q.oldest_age_ms.and_then(proto_duration),
            streams: q.streams,
            consumers: q.consumers,
            keys_waiting: q.keys_waiting,
            keys_leased: q.keys_leased,
            keys_waiting_capped: q.keys_waiting_capped,
        }),
        created_at: Some(ts(q.created_at)),
        name: q.name,
    }
}

pub fn job_info(j: JobRow) -> pb::JobInfo {
    pb::JobInfo {
        id: j.id.to_string(),
        queue: j.queue,
        state: match j.state {
            JobState::Available => pb::JobState::Available,
            JobState::Scheduled => pb::JobState::Scheduled,
            JobState::Leased => pb::JobState::Leased,
            JobState::Dead => pb::JobState::Dead,
            JobState::Completed => pb::JobState::Completed,
        } as i32,
        payload: j.payload,
        headers: j.headers,
        priority: j.priority,
        attempt: j.attempt,
        max_attempts: j.max_attempts.unwrap_or(0),
        dedup_key: j.dedup_key.unwrap_or_default(),
        key: j.key.unwrap_or_default(),
        enqueued_at: Some(ts(j.enqueued_at)),
        run_at: j.run_at.map(ts),
        expires_at: j.expires_at.map(ts),
        last_error: j.last_error.unwrap_or_default(),
        leased_by: j.leased_by.unwrap_or_default(),
        lease_expires_at: j.lease_expires_at.map(ts),
        dead_reason: j.dead_reason.unwrap_or_default(),
        died_at: j.died_at.map(ts),
        completed_at: j.completed_at.map(ts),
        completed_by: j.completed_by.unwrap_or_default(),
        result: j.result.unwrap_or_default(),
        progress: j.progress.as_ref().map_or(0.0, |p| p.fraction),
        progress_at: j.progress.as_ref().map(|p| ts(p.at)),
        progress_message: j.progress.map(|p| p.message).unwrap_or_default(),
    }
}

fn jobs_page(rows: Vec<JobRow>, more: bool, kind: char) -> pb::ListJobsResponse {
    let next_page_token = match rows.last() {
        Some(last) if more => encode_token(kind, &last.id.to_string()),
        _ => String::new(),
    };
    pb::ListJobsResponse {
        jobs: rows.into_iter().map(job_info).collect(),
        next_page_token,
        unavailable_clusters: Vec::new(),
    }
}

/// A validated dead-letter selector: (ids, queue).
type Selector = (Option<Vec<JobId>>, Option<QueueName>);

fn selector(r: &pb::DeadLettersSelector) -> Result<Selector> {
    let queue = optional_queue(&r.queue, "queue")?;
    match (r.ids.is_empty(), r.all) {
        (true, false) => Err(Error::invalid(
            "ids, all",
            "give ids, or all = true with queue",
        )),
        (false, true) => Err(Error::invalid("ids, all", "give ids or all, not both")),
        (true, true) => match queue {
            Some(q) => Ok((None, Some(q))),
            None => Err(Error::invalid("queue", "is required with all = true")),
        },
        (false, false) => {
            if r.ids.len() > MAX_SELECTOR_IDS {
                return Err(Error::invalid(
                    "ids",
                    format!("at most {MAX_SELECTOR_IDS} ids"),
                ));
            }
            let ids = r
                .ids
                .iter()
                .enumerate()
                .map(|(i, id)| JobId::parse_field(id, &format!("ids[{i}]")))
                .collect::<Result<Vec<_>>>()?;
            Ok((Some(ids), queue))
        }
    }
}

/// Largest concurrency limit, rate limit (jobs/s) and burst.
const MAX_LIMIT: i32 = 1_000_000;
/// Smallest rate limit: one job every 1,000 s.
const MIN_RATE: f64 = 0.001;

/// A concurrency limit or burst: 0 clears it.
fn limit_field(n: i32, field: &str) -> Result<Option<i32>> {
    match n {
        0 => Ok(None),
        1..=MAX_LIMIT => Ok(Some(n)),
        _ => Err(Error::invalid(
            field,
            format!("must be 1 to {MAX_LIMIT}, or 0 for none"),
        )),
    }
}

/// A rate limit in jobs per second: 0 clears it.
fn rate_field(r: f64, field: &str) -> Result<Option<f64>> {
    if r == 0.0 {
        Ok(None)
    } else if (MIN_RATE..=f64::from(MAX_LIMIT)).contains(&r) {
        Ok(Some(r))
    } else {
        Err(Error::invalid(
            field,
            format!("must be {MIN_RATE} to {MAX_LIMIT} jobs per second, or 0 for none"),
        ))
    }
}

/// A per-key concurrency: 0 = none.
fn key_concurrency_field(n: i32, field: &str) -> Result<Option<i32>> {
    match n {
        0 => Ok(None),
        1..=MAX_KEY_CONCURRENCY => Ok(Some(n)),
        _ => Err(Error::invalid(
            field,
            format!("must be 1 to {MAX_KEY_CONCURRENCY}, or 0 for none"),
        )),
    }
}

/// A queue's key overrides: at most [`MAX_KEY_OVERRIDES`], keys unique and
/// valid, at least one setting each.
fn key_overrides_field(list: &[pb::KeyOverride]) -> Result<Vec<domain::KeyOverride>> {
    if list.len() > MAX_KEY_OVERRIDES {
        return Err(Error::invalid(
            "key_overrides",
            format!("at most {MAX_KEY_OVERRIDES} keys"),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(list.len());
    for (i, o) in list.iter().enumerate() {
        let field = |f: &str| format!("key_overrides[{i}].{f}");
        if o.key.is_empty() {
            return Err(Error::invalid(field("key"), "is required"));
        }
        domain::check_key(&o.key, &field("key"))?;
        if !seen.insert(o.key.as_str()) {
            return Err(Error::invalid(
                field("key"),
                format!("{:?} is given twice", o.key),
            ));
        }
        let weight = match o.weight {
            0 => None,
            1..=MAX_KEY_WEIGHT => Some(o.weight),
            _ => {
                return Err(Error::invalid(
                    field("weight"),
                    format!("must be 1 to {MAX_KEY_WEIGHT}, or 0 for 1"),
                ));
            }
        };
        let o = domain::KeyOverride {
            key: o.key.clone(),
            concurrency: key_concurrency_field(o.concurrency, &field("concurrency"))?,
            rate_limit: rate_field(o.rate_limit, &field("rate_limit"))?,
            weight,
        };
        if o.concurrency.is_none() && o.rate_limit.is_none() && o.weight.is_none() {
            return Err(Error::invalid(
                field("key"),
                "sets nothing: give a concurrency, rate_limit or weight",
            ));
        }
        out.push(o);
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// Validates an UpdateQueueRequest into a settings change.
fn queue_update(r: &pb::UpdateQueueRequest) -> Result<QueueUpdate> {
    let max_attempts = match r.max_attempts {
        None => None,
        Some(n) if (1..=MAX_ATTEMPTS).contains(&n) => Some(n),
        Some(_) => {
            return Err(Error::invalid(
                "max_attempts",
                format!("must be 1 to {MAX_ATTEMPTS}"),
            ));
        }
    };
    let update = QueueUpdate {
        default_lease_ms: r
            .default_lease
            .as_ref()
            .map(|d| domain::lease_ms(d, "default_lease"))
            .transpose()?,
        max_attempts,
        backoff_base_ms: r
            .backoff_base
            .as_ref()
            .map(|d| domain::duration_ms(d, "backoff_base", MAX_DELAY))
            .transpose()?,
        backoff_cap_ms: r
            .backoff_cap
            .as_ref()
            .map(|d| domain::duration_ms(d, "backoff_cap", MAX_DELAY))
            .transpose()?,
        // Zero clears it.
        completed_retention_ms: r
            .completed_retention
            .as_ref()
            .map(|d| domain::duration_ms(d, "completed_retention", MAX_DELAY))
            .transpose()?
            .map(|ms| (ms > 0).then_some(ms)),
        paused: r.paused,
        concurrency_limit: r
            .concurrency_limit
            .map(|n| limit_field(n, "concurrency_limit"))
            .transpose()?,
        rate_limit: r
            .rate_limit
            .map(|r| rate_field(r, "rate_limit"))
            .transpose()?,
        rate_burst: r
            .rate_burst
            .map(|n| limit_field(n, "rate_burst"))
            .transpose()?,
        ordered_by_key: r.ordered_by_key,
        key_concurrency: r
            .key_concurrency
            .map(|n| key_concurrency_field(n, "key_concurrency"))
            .transpose()?,
        fair_by_key: r.fair_by_key,
        key_rate_limit: r
            .key_rate_limit
            .map(|r| rate_field(r, "key_rate_limit"))
            .transpose()?,
        key_rate_burst: r
            .key_rate_burst
            .map(|n| limit_field(n, "key_rate_burst"))
            .transpose()?,
        key_overrides: r
            .key_overrides
            .as_ref()
            .map(|o| key_overrides_field(&o.overrides))
            .transpose()?,
    };
    Ok(update)
}

type WatchStream = ReceiverStream<Result<pb::WatchQueuesResponse, Status>>;

#[tonic::async_trait]
impl AdminService for AdminApi {
    #[instrument(skip_all)]
    async fn list_queues(
        &self,
        request: Request<pb::ListQueuesRequest>,
    ) -> Result<Response<pb::ListQueuesResponse>, Status> {
        let r = request.into_inner();
        let limit = page_size(r.page_size, "page_size")?;
        let after = decode_token(&r.page_token, 'q')?;
        let found = fanout::queue_page(self.clusters(), None, after.as_deref(), limit).await?;
        let (rows, next) = found.value;
        let next_page_token = next.map_or_else(String::new, |last| encode_token('q', &last));
        Ok(partial_response(
            pb::ListQueuesResponse {
                queues: rows.into_iter().map(queue_info).collect(),
                next_page_token,
                unavailable_clusters: found.missing.clone(),
            },
            &found.missing,
        ))
    }

    #[instrument(skip_all, fields(queue = %request.get_ref().queue))]
    async fn get_queue(
        &self,
        request: Request<pb::GetQueueRequest>,
    ) -> Result<Response<pb::QueueInfo>, Status> {
        let name = queue_field(&request.get_ref().queue, "queue")?;
        let info = self.queue_info(&name).await?;
        Ok(partial_response(info.value, &info.missing))
    }

    #[instrument(skip_all, fields(queue = %request.get_ref().queue))]
    async fn update_queue(
        &self,
        request: Request<pb::UpdateQueueRequest>,
    ) -> Result<Response<pb::QueueInfo>, Status> {
        let r = request.into_inner();
        let name = queue_field(&r.queue, "queue")?;
        let update = queue_update(&r)?;
        if !self
            .on_queue_cluster(&name, |store| {
                sql::update_queue(store, &name, &update, r.create)
            })
            .await?
        {
            return Err(unknown_queue(&name).into());
        }
        info!(queue = %name, ?update, "queue settings changed");
        if update.paused == Some(false) {
            self.resumed(&name).await?;
        } else if update.concurrency_limit.is_some()
            || update.rate_limit.is_some()
            || update.rate_burst.is_some()
            || update.ordered_by_key.is_some()
            || update.key_concurrency.is_some()
            || update.fair_by_key.is_some()
            || update.key_rate_limit.is_some()
            || update.key_rate_burst.is_some()
            || update.key_overrides.is_some()
        {
            // A raised or removed limit lets waiting jobs go at once, on
            // every replica.
            self.wake([name.clone()]).await?;
        }
        let info = self.queue_info(&name).await?;
        Ok(partial_response(info.value, &info.missing))
    }

    #[instrument(skip_all, fields(queue = %request.get_ref().queue))]
    async fn pause_queue(
        &self,
        request: Request<pb::PauseQueueRequest>,
    ) -> Result<Response<pb::QueueInfo>, Status> {
        let name = queue_field(&request.get_ref().queue, "queue")?;
        let update = QueueUpdate {
            paused: Some(true),
            ..Default::default()
        };
        if !self
            .on_queue_cluster(&name, |store| {
                sql::update_queue(store, &name, &update, false)
            })
            .await?
        {
            return Err(unknown_queue(&name).into());
        }
        info!(queue = %name, "queue paused");
        let info = self.queue_info(&name).await?;
        Ok(partial_response(info.value, &info.missing))
    }

    #[instrument(skip_all, fields(queue = %request.get_ref().queue))]
    async fn resume_queue(
        &self,
        request: Request<pb::ResumeQueueRequest>,
    ) -> Result<Response<pb::QueueInfo>, Status> {
        let name = queue_field(&request.get_ref().queue, "queue")?;
        let update = QueueUpdate {
            paused: Some(false),
            ..Default::default()
        };
        if !self
            .on_queue_cluster(&name, |store| {
                sql::update_queue(store, &name, &update, false)
            })
            .await?
        {
            return Err(unknown_queue(&name).into());
        }
        self.resumed(&name).await?;
        info!(queue = %name, "queue resumed");
        let info = self.queue_info(&name).await?;
        Ok(partial_response(info.value, &info.missing))
    }

    #[instrument(skip_all, fields(queue = %request.get_ref().queue))]
    async fn purge_queue(
        &self,
        request: Request<pb::PurgeQueueRequest>,
    ) -> Result<Response<pb::PurgeQueueResponse>, Status> {
        let name = queue_field(&request.get_ref().queue, "queue")?;
        let purged = fanout::purge_queue(self.clusters(), &name)
            .await?
            .ok_or_else(|| unknown_queue(&name))?;
        info!(queue = %name, purged = purged.waiting, completed = purged.completed, "queue purged");
        Ok(Response::new(pb::PurgeQueueResponse {
            purged: purged.waiting as i64,
            purged_completed: purged.completed as i64,
        }))
    }

    #[instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::JobInfo>, Status> {
        let id = JobId::parse_field(&request.get_ref().job_id, "job_id")?;
        let job = fanout::get_job(self.clusters(), id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("job {id} does not exist")))?;
        Ok(Response::new(job_info(job)))
    }

    #[instrument(skip_all, fields(queue = %request.get_ref().queue))]
    async fn list_jobs(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let r = request.into_inner();
        let queue = optional_queue(&r.queue, "queue")?;
        let state = match pb::JobState::try_from(r.state) {
            Ok(pb::JobState::Unspecified) => None,
            Ok(pb::JobState::Available) => Some(JobState::Available),
            Ok(pb::JobState::Scheduled) => Some(JobState::Scheduled),
            Ok(pb::JobState::Leased) => Some(JobState::Leased),
            Ok(pb::JobState::Dead) => Some(JobState::Dead),
            Ok(pb::JobState::Completed) => Some(JobState::Completed),
            Err(_) => return Err(Error::invalid("state", "is not a JobState").into()),
        };
        let key = domain::key_filter(&r.key, "key")?;
        let limit = page_size(r.page_size, "page_size")?;
        // Live, dead and completed listings have their own tokens: ids are
        // keys of different tables.
        let kind = match state {
            Some(JobState::Dead) => 'd',
            Some(JobState::Completed) => 'c',
            _ => 'j',
        };
        let after = decode_job_token(&r.page_token, kind)?;
        if let Some(q) = &queue
            && !fanout::queue_exists(self.clusters(), q).await?
        {
            return Err(unknown_queue(q).into());
        }
        let filter = JobFilter {
            queue,
            state,
            key,
            search: None,
        };
        let found =
            fanout::list_jobs(self.clusters(), &filter, after, limit, r.include_payload).await?;
        let (rows, more) = found.value;
        let mut page = jobs_page(rows, more, kind);
        page.unavailable_clusters = found.missing.clone();
        Ok(partial_response(page, &found.missing))
    }

    #[instrument(skip_all, fields(queue = %request.get_ref().queue))]
    async fn list_keys(
        &self,
        request: Request<pb::ListKeysRequest>,
    ) -> Result<Response<pb::ListKeysResponse>, Status> {
        let r = request.into_inner();
        let queue = queue_field(&r.queue, "queue")?;
        let limit = page_size(r.page_size, "page_size")?;
        let order = match pb::KeyOrder::try_from(r.order) {
            Ok(pb::KeyOrder::Unspecified | pb::KeyOrder::Key) => KeyOrder::Key,
            Ok(pb::KeyOrder::Waiting) => KeyOrder::Waiting,
            Err(_) => return Err(Error::invalid("order", "is not a KeyOrder").into()),
        };
        let after = decode_token(&r.page_token, 'k')?;
        if after.is_some() && order == KeyOrder::Waiting {
            return Err(Error::invalid(
                "page_token",
                "KEY_ORDER_WAITING has one page: no page_token",
            )
            .into());
        }
        if !fanout::queue_exists(self.clusters(), &queue).await? {
            return Err(unknown_queue(&queue).into());
        }
        let found =
            fanout::list_keys(self.clusters(), &queue, order, after.as_deref(), limit).await?;
        let (rows, more) = found.value;
        let next_page_token = match rows.last() {
            Some(last) if more => encode_token('k', &last.key),
            _ => String::new(),
        };
        let keys = rows
            .into_iter()
            .map(|k| pb::KeyInfo {
                key: k.key,
                waiting: k.waiting,
                leased: k.leased,
                oldest_available_age: k.oldest_age_ms.and_then(proto_duration),
            })
            .collect();
        Ok(partial_response(
            pb::ListKeysResponse {
                keys,
                next_page_token,
                unavailable_clusters: found.missing.clone(),
            },
            &found.missing,
        ))
    }

    #[instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn cancel_job(
        &self,
        request: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::CancelJobResponse>, Status> {
        let id = JobId::parse_field(&request.get_ref().job_id, "job_id")?;
        let done = fanout::cancel_job(self.clusters(), id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("job {id} is not a live job")))?;
        info!(job_id = %id, queue = %done.queue, leased = done.lease.is_some(), "job cancelled");
        let was_leased = done.lease.is_some();
        // Its waiters (WaitJob) learn at once that it is gone.
        self.broker.settle().waits().poke();
        // The stream holding it gets its credit back, as after an Ack, and
        // tells its client (a `Cancelled`: the handler stops).
        if let Some((broker, token)) = done.lease {
            self.broker.settle().cancelled(broker, id, token);
        }
        // In a queue ordered by key, the key's next job may go now.
        if let Some(q) = QueueName::parse(&done.queue) {
            self.wake([q]).await?;
        }
        Ok(Response::new(pb::CancelJobResponse { was_leased }))
    }

    #[instrument(skip_all, fields(queue = %request.get_ref().queue))]
    async fn list_dead_letters(
        &self,
        request: Request<pb::ListDeadLettersRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let r = request.into_inner();
        self.list_jobs(Request::new(pb::ListJobsRequest {
            queue: r.queue,
            state: pb::JobState::Dead as i32,
            page_size: r.page_size,
            page_token: r.page_token,
            include_payload: r.include_payload,
            key: String::new(),
        }))
        .await
    }

    #[instrument(skip_all, fields(queue = %request.get_ref().queue))]
    async fn requeue_dead_letters(
        &self,
        request: Request<pb::DeadLettersSelector>,
    ) -> Result<Response<pb::RequeueDeadLettersResponse>, Status> {
        let (ids, queue) = selector(request.get_ref())?;
        if let (None, Some(q)) = (&ids, &queue)
            && !fanout::queue_exists(self.clusters(), q).await?
        {
            return Err(unknown_queue(q).into());
        }
        let (moved, matched) =
            fanout::requeue_dead(self.clusters(), ids.as_deref(), queue.as_ref()).await?;
        let requeued: i64 = moved.iter().map(|(_, n)| n).sum();
        if requeued > 0 {
            self.wake(moved.into_iter().map(|(q, _)| q)).await?;
        }
        info!(requeued, matched, "dead letters requeued");
        Ok(Response::new(pb::RequeueDeadLettersResponse {
            requeued,
            skipped_duplicates: matched - requeued,
        }))
    }

    #[instrument(skip_all, fields(queue = %request.get_ref().queue))]
    async fn purge_dead_letters(
        &self,
        request: Request<pb::DeadLettersSelector>,
    ) -> Result<Response<pb::PurgeDeadLettersResponse>, Status> {
        let (ids, queue) = selector(request.get_ref())?;
        if let (None, Some(q)) = (&ids, &queue)
            && !fanout::queue_exists(self.clusters(), q).await?
        {
            return Err(unknown_queue(q).into());
        }
        let purged = fanout::purge_dead(self.clusters(), ids.as_deref(), queue.as_ref()).await?;
        info!(purged, "dead letters purged");
        Ok(Response::new(pb::PurgeDeadLettersResponse {
            purged: purged as i64,
        }))
    }

    type WatchQueuesStream = WatchStream;

    #[instrument(skip_all)]
    async fn create_schedule(
        &self,
        request: Request<pb::CreateScheduleRequest>,
    ) -> Result<Response<pb::ScheduleInfo>, Status> {
        Ok(Response::new(
            self.schedules.create(request.into_inner()).await?,
        ))
    }

    #[instrument(skip_all, fields(schedule = %request.get_ref().name))]
    async fn get_schedule(
        &self,
        request: Request<pb::GetScheduleRequest>,
    ) -> Result<Response<pb::ScheduleInfo>, Status> {
        Ok(Response::new(
            self.schedules.get(&request.get_ref().name).await?,
        ))
    }

    #[instrument(skip_all)]
    async fn list_schedules(
        &self,
        request: Request<pb::ListSchedulesRequest>,
    ) -> Result<Response<pb::ListSchedulesResponse>, Status> {
        Ok(Response::new(
            self.schedules.list(request.into_inner()).await?,
        ))
    }

    #[instrument(skip_all, fields(schedule = %request.get_ref().name))]
    async fn update_schedule(
        &self,
        request: Request<pb::UpdateScheduleRequest>,
    ) -> Result<Response<pb::ScheduleInfo>, Status> {
        Ok(Response::new(
            self.schedules.update(request.into_inner()).await?,
        ))
    }

    #[instrument(skip_all, fields(schedule = %request.get_ref().name))]
    async fn pause_schedule(
        &self,
        request: Request<pb::PauseScheduleRequest>,
    ) -> Result<Response<pb::ScheduleInfo>, Status> {
        let name = request.into_inner().name;
        Ok(Response::new(self.schedules.set_paused(name, true).await?))
    }

    #[instrument(skip_all, fields(schedule = %request.get_ref().name))]
    async fn resume_schedule(
        &self,
        request: Request<pb::ResumeScheduleRequest>,
    ) -> Result<Response<pb::ScheduleInfo>, Status> {
        let name = request.into_inner().name;
        Ok(Response::new(self.schedules.set_paused(name, false).await?))
    }

    #[instrument(skip_all, fields(schedule = %request.get_ref().name))]
    async fn delete_schedule(
        &self,
        request: Request<pb::DeleteScheduleRequest>,
    ) -> Result<Response<pb::DeleteScheduleResponse>, Status> {
        Ok(Response::new(
            self.schedules.delete(&request.get_ref().name).await?,
        ))
    }

    #[instrument(skip_all, fields(schedule = %request.get_ref().name))]
    async fn run_schedule(
        &self,
        request: Request<pb::RunScheduleRequest>,
    ) -> Result<Response<pb::RunScheduleResponse>, Status> {
        Ok(Response::new(
            self.schedules.run(&request.get_ref().name).await?,
        ))
    }

    #[instrument(skip_all)]
    async fn watch_queues(
        &self,
        request: Request<pb::WatchQueuesRequest>,
    ) -> Result<Response<Self::WatchQueuesStream>, Status> {
        let (names, interval) = watch_request(request.into_inner())?;
        let clusters = self.clusters().clone();
        if let Some(names) = &names {
            check_known(&clusters, names).await?;
        }
        // Small buffer: a slow watcher makes the sampler wait, it does not
        // make it queue snapshots.
        let (tx, rx) = mpsc::channel(2);
        tokio::spawn(watch(clusters, names, interval, self.draining.clone(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// A WatchQueues request's queues (None: every queue) and interval,
/// checked.
fn watch_request(r: pb::WatchQueuesRequest) -> Result<(Option<Vec<QueueName>>, Duration)> {
    if r.queues.len() > MAX_SUBSCRIBE_QUEUES {
        return Err(Error::invalid(
            "queues",
            format!("at most {MAX_SUBSCRIBE_QUEUES} queues"),
        ));
    }
    let names = r
        .queues
        .iter()
        .enumerate()
        .map(|(i, q)| queue_field(q, &format!("queues[{i}]")))
        .collect::<Result<Vec<_>>>()?;
    let interval = match &r.interval {
        None => DEFAULT_WATCH_INTERVAL,
        Some(d) => {
            let ms = domain::duration_ms(d, "interval", MAX_WATCH_INTERVAL)?;
            if ms < MIN_WATCH_INTERVAL.as_millis() as i64 {
                return Err(Error::invalid("interval", "must be between 1s and 1h"));
            }
            Duration::from_millis(ms as u64)
        }
    };
    Ok(((!names.is_empty()).then_some(names), interval))
}

/// NOT_FOUND naming the first of `names` that no cluster has (UNAVAILABLE
/// when it may be on a cluster that did not answer).
async fn check_known(clusters: &Clusters, names: &[QueueName]) -> Result<()> {
    let found = fanout::queue_stats(clusters, Some(names), None, names.len() as i64).await?;
    if let Some(unknown) = names
        .iter()
        .find(|n| !found.value.iter().any(|f| f.name == n.as_str()))
    {
        // It may be on a cluster that did not answer.
        return Err(found
            .missing_error()
            .unwrap_or_else(|| unknown_queue(unknown)));
    }
    Ok(())
}

/// What a WatchQueues message is compared by: each queue's counts
/// (available, scheduled, leased, dead, streams, consumers, keys waiting,
/// keys leased) and whether it is paused, and the clusters that did not
/// answer.
type WatchCounts = (Vec<(String, [i64; 8], bool)>, Vec<String>);

/// A WatchQueues stream's sampler: the queues' statistics every
/// [`WATCH_SAMPLE`] (at most every `interval`), sent when their counts
/// change and at least every `interval`, until the watcher leaves or a
/// drain begins.
async fn watch(
    clusters: Clusters,
    names: Option<Vec<QueueName>>,
    interval: Duration,
    draining: CancellationToken,
    tx: mpsc::Sender<Result<pb::WatchQueuesResponse, Status>>,
) {
    let mut last: Option<WatchCounts> = None;
    let mut last_sent = tokio::time::Instant::now();
    loop {
        let limit = names.as_ref().map_or(WATCH_ALL_LIMIT, |n| n.len() as i64);
        // A cluster that does not answer leaves its queues out of the
        // message, named in it; every cluster down ends the stream.
        let (rows, missing) =
            match fanout::queue_stats(&clusters, names.as_deref(), None, limit).await {
                Ok(found) => (found.value, found.missing),
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
            };
        // Ages change every sample; a push "on change" is about counts.
        let counts: Vec<(String, [i64; 8], bool)> = rows
            .iter()
            .map(|q| {
                let c = [
                    q.available,
                    q.scheduled,
                    q.leased,
                    q.dead,
                    q.streams,
                    q.consumers,
                    q.keys_waiting,
                    q.keys_leased,
                ];
                (q.name.clone(), c, q.paused)
            })
            .collect();
        let counts: WatchCounts = (counts, missing);
        if last.as_ref() != Some(&counts) || last_sent.elapsed() >= interval {
            let msg = pb::WatchQueuesResponse {
                queues: rows.into_iter().map(queue_info).collect(),
                sent_at: Some(std::time::SystemTime::now().into()),
                unavailable_clusters: counts.1.clone(),
            };
            if tx.send(Ok(msg)).await.is_err() {
                return; // the watcher is gone
            }
            last = Some(counts);
            last_sent = tokio::time::Instant::now();
        }
        tokio::select! {
            _ = tx.closed() => return,
            _ = draining.cancelled() => {
                let _ = tx.send(Err(Status::unavailable("broker is shutting down; reconnect"))).await;
                return;
            }
            _ = tokio::time::sleep(WATCH_SAMPLE.min(interval)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_are_kind_bound() {
        let t = encode_token('q', "emails.high");
        assert_eq!(
            decode_token(&t, 'q').unwrap().as_deref(),
            Some("emails.high")
        );
        assert!(decode_token(&t, 'j').is_err());
        assert!(decode_token("zz", 'q').is_err());
        assert!(decode_token("abc", 'q').is_err());
        assert_eq!(decode_token("", 'q').unwrap(), None);
    }
}
