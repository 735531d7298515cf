//! The console API's handlers. Each checks the caller's grant on the
//! queue, calls the AdminService's own method (or the QueueService's, for
//! a test job), and renders the answer as JSON: the console and `leaseq
//! admin` cannot disagree.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tracing::info;

use super::access::Caller;
use super::json::{
    ApiError, ApiResult, bad, duration, forbidden, int, job_json, job_state, millis, queue_json,
    queues_json, schedule_json, secs, selector,
};
use super::{Console, live};
use crate::auth::{Action, Identity};
use crate::pb;
use crate::pb::admin_service_server::AdminService;
use crate::pb::queue_service_server::QueueService;

pub(super) async fn list_queues(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> ApiResult {
    let mut all = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    let mut page_token = String::new();
    // Every page, bounded: 20 pages of 1,000 queues.
    for _ in 0..20 {
        let r = c
            .api
            .list_queues(tonic::Request::new(pb::ListQueuesRequest {
                page_size: 1000,
                page_token,
            }))
            .await?
            .into_inner();
        all.extend(r.queues);
        for m in r.unavailable_clusters {
            if !missing.contains(&m) {
                missing.push(m);
            }
        }
        if r.next_page_token.is_empty() {
            break;
        }
        page_token = r.next_page_token;
    }
    let rates = c.rates().await;
    Ok(axum::Json(
        json!({ "queues": queues_json(&caller, &all, &rates), "unavailable_clusters": missing }),
    ))
}

/// Server-sent events: `queues` events from the broker's one live sampler
/// ([`live`]: a snapshot when counts change, at most once a second, and at
/// least every 5 s), each filtered by this browser's grants.
pub(super) async fn events(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> ApiResult<Response> {
    let mut snapshots = c.live.subscribe(&c);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, std::convert::Infallible>>(2);
    let shutdown = c.shutdown.clone();
    tokio::spawn(async move {
        // The current snapshot first (a browser arriving sees the queues at
        // once), then each new one.
        snapshots.mark_changed();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
                changed = snapshots.changed() => if changed.is_err() { return },
            }
            let snapshot = snapshots.borrow_and_update().clone();
            let event = match snapshot {
                live::Snapshot::Pending => continue,
                live::Snapshot::Queues(s) => Event::default().event("queues").data(
                    json!({
                        "queues": queues_json(&caller, &s.watch.queues, &s.rates),
                        "sent_at": millis(&s.watch.sent_at),
                        "unavailable_clusters": s.watch.unavailable_clusters,
                    })
                    .to_string(),
                ),
                live::Snapshot::Failed(why) => {
                    let _ = tx
                        .send(Ok(Event::default()
                            .event("error")
                            .data(json!({ "error": why }).to_string())))
                        .await;
                    return;
                }
            };
            if tx.send(Ok(event)).await.is_err() {
                return;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

async fn queue_info(c: &Console, caller: &Caller, name: &str) -> ApiResult<pb::QueueInfo> {
    caller.read(name)?;
    Ok(c.api
        .get_queue(tonic::Request::new(pb::GetQueueRequest {
            queue: name.to_owned(),
        }))
        .await?
        .into_inner())
}

/// Per consumer name, the jobs of `queue` it holds (every replica, every
/// cluster that answers: the names of those that did not come along).
async fn in_flight(
    c: &Console,
    queue: &str,
) -> ApiResult<crate::fanout::Partial<Vec<(String, i64)>>> {
    let name = crate::domain::QueueName::parse_field(queue, "queue")?;
    Ok(crate::fanout::in_flight(c.api.clusters(), &name).await?)
}

pub(super) async fn get_queue(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    let q = queue_info(&c, &caller, &name).await?;
    let rates = c.rates().await;
    let held = in_flight(&c, &name).await?;
    let unavailable_clusters = held.missing;
    let held = held.value;
    let streams = c.metrics().streams.on_queue(&name);
    // One row per consumer name: this broker's streams and credit, and the
    // jobs it holds on any replica.
    let mut consumers: Vec<Value> = Vec::new();
    let mut names: Vec<&str> = streams.iter().map(|s| s.consumer.as_str()).collect();
    names.extend(held.iter().map(|(n, _)| n.as_str()));
    names.sort_unstable();
    names.dedup();
    for n in names {
        let mine: Vec<_> = streams.iter().filter(|s| s.consumer == n).collect();
        consumers.push(json!({
            "consumer": n,
            "streams": mine.len(),
            "credit": mine.iter().map(|s| u64::from(s.credit)).sum::<u64>(),
            "in_flight": held.iter().find(|(h, _)| h == n).map_or(0, |(_, k)| *k),
            "connected_for": mine.iter().map(|s| s.opened.elapsed().as_secs()).max(),
        }));
    }
    // The deployment's history, from the database (empty, and logged, when
    // it does not answer: the rest of the page still shows).
    let points = crate::history::series(&c.store, &name)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "console: reading the queue's history failed");
            Vec::new()
        });
    let history: Vec<Value> = points
        .iter()
        .map(|p| {
            json!([
                p.at_ms,
                p.depth[0],
                p.depth[1],
                p.depth[2],
                p.depth[3],
                p.enqueue_rate,
                p.ack_rate
            ])
        })
        .collect();
    Ok(axum::Json(json!({
        "queue": queue_json(&q, rates.get(&name), &caller),
        "consumers": consumers,
        "history": history,
        "history_columns": ["at_ms", "available", "scheduled", "leased", "dead", "enqueue_rate", "ack_rate"],
        "unavailable_clusters": unavailable_clusters,
    })))
}

/// A page of the queue's keys with their jobs waiting and leased
/// (ListKeys): `order` `key` (the default; `after` is the previous page's
/// `next`) or `waiting` (the 20 with the most jobs waiting).
pub(super) async fn list_keys(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    caller.read(&name)?;
    let order = match q.get("order").map(String::as_str).unwrap_or("") {
        "" | "key" => pb::KeyOrder::Key,
        "waiting" => pb::KeyOrder::Waiting,
        other => {
            return Err(bad(format!("order: {other:?} is not one of key, waiting")));
        }
    };
    let r = c
        .api
        .list_keys(tonic::Request::new(pb::ListKeysRequest {
            queue: name,
            page_size: 20,
            page_token: q.get("after").cloned().unwrap_or_default(),
            order: order as i32,
        }))
        .await?
        .into_inner();
    Ok(axum::Json(json!({
        "keys": r.keys.iter().map(|k| json!({
            "key": k.key,
            "waiting": k.waiting,
            "leased": k.leased,
            "oldest_available_age": secs(&k.oldest_available_age),
        })).collect::<Vec<_>>(),
        "next": (!r.next_page_token.is_empty()).then_some(r.next_page_token),
        "unavailable_clusters": r.unavailable_clusters,
    })))
}

pub(super) async fn pause_queue(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    caller.admin(&name)?;
    let q = c
        .api
        .pause_queue(tonic::Request::new(pb::PauseQueueRequest { queue: name }))
        .await?
        .into_inner();
    Ok(axum::Json(queue_json(&q, None, &caller)))
}

pub(super) async fn resume_queue(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    caller.admin(&name)?;
    let q = c
        .api
        .resume_queue(tonic::Request::new(pb::ResumeQueueRequest { queue: name }))
        .await?
        .into_inner();
    Ok(axum::Json(queue_json(&q, None, &caller)))
}

/// Settings in seconds and plain numbers (0 clears a limit or the
/// retention), validated by UpdateQueue itself.
pub(super) async fn update_queue(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
    axum::Json(v): axum::Json<Value>,
) -> ApiResult {
    caller.admin(&name)?;
    let rate_limit = match v.get("rate_limit") {
        None | Some(Value::Null) => None,
        Some(x) => Some(
            x.as_f64()
                .ok_or_else(|| bad("rate_limit: must be a number"))?,
        ),
    };
    let key_rate_limit = match v.get("key_rate_limit") {
        None | Some(Value::Null) => None,
        Some(x) => Some(
            x.as_f64()
                .ok_or_else(|| bad("key_rate_limit: must be a number"))?,
        ),
    };
    let key_overrides = match v.get("key_overrides") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) => Some(pb::KeyOverrides {
            overrides: list
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    let bad_field =
                        |f: &str, t: &str| bad(format!("key_overrides[{i}].{f}: must be {t}"));
                    Ok(pb::KeyOverride {
                        key: o
                            .get("key")
                            .and_then(Value::as_str)
                            .ok_or_else(|| bad_field("key", "a string"))?
                            .to_owned(),
                        concurrency: int(o, "concurrency")?.unwrap_or(0),
                        rate_limit: match o.get("rate_limit") {
                            None | Some(Value::Null) => 0.0,
                            Some(x) => x
                                .as_f64()
                                .ok_or_else(|| bad_field("rate_limit", "a number"))?,
                        },
                        weight: int(o, "weight")?.unwrap_or(0),
                    })
                })
                .collect::<Result<_, ApiError>>()?,
        }),
        Some(_) => return Err(bad("key_overrides: must be a list")),
    };
    let req = pb::UpdateQueueRequest {
        queue: name,
        default_lease: duration(&v, "default_lease")?,
        max_attempts: int(&v, "max_attempts")?,
        backoff_base: duration(&v, "backoff_base")?,
        backoff_cap: duration(&v, "backoff_cap")?,
        completed_retention: duration(&v, "completed_retention")?,
        paused: v.get("paused").and_then(Value::as_bool),
        create: false,
        concurrency_limit: int(&v, "concurrency_limit")?,
        ordered_by_key: v.get("ordered_by_key").and_then(Value::as_bool),
        key_concurrency: int(&v, "key_concurrency")?,
        rate_limit,
        rate_burst: int(&v, "rate_burst")?,
        fair_by_key: v.get("fair_by_key").and_then(Value::as_bool),
        key_rate_limit,
        key_rate_burst: int(&v, "key_rate_burst")?,
        key_overrides,
    };
    let q = c
        .api
        .update_queue(tonic::Request::new(req))
        .await?
        .into_inner();
    Ok(axum::Json(queue_json(&q, None, &caller)))
}

pub(super) async fn list_dead(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let queue = q.get("queue").cloned().unwrap_or_default();
    if queue.is_empty() {
        if let Identity::Token(p) = &caller.0
            && !p.allows_everywhere(Action::Admin)
            && ![Action::Enqueue, Action::Consume]
                .into_iter()
                .any(|a| p.allows_everywhere(a))
        {
            return Err(bad("queue: choose a queue"));
        }
    } else {
        caller.read(&queue)?;
    }
    let r = c
        .api
        .list_dead_letters(tonic::Request::new(pb::ListDeadLettersRequest {
            queue,
            page_size: 100,
            page_token: q.get("page_token").cloned().unwrap_or_default(),
            include_payload: false,
        }))
        .await?
        .into_inner();
    Ok(axum::Json(json!({
        "jobs": r.jobs.iter().map(|j| job_json(j, false)).collect::<Vec<_>>(),
        "next_page_token": r.next_page_token,
    })))
}

pub(super) async fn requeue_dead(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    axum::Json(v): axum::Json<Value>,
) -> ApiResult {
    let sel = selector(&v)?;
    caller.admin(&sel.queue)?;
    let r = c
        .api
        .requeue_dead_letters(tonic::Request::new(sel))
        .await?
        .into_inner();
    Ok(axum::Json(json!({
        "requeued": r.requeued,
        "skipped_duplicates": r.skipped_duplicates,
    })))
}

pub(super) async fn purge_dead(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    axum::Json(v): axum::Json<Value>,
) -> ApiResult {
    let sel = selector(&v)?;
    caller.admin(&sel.queue)?;
    if v.get("confirm").and_then(Value::as_bool) != Some(true) {
        return Err(bad(
            "confirm: a purge must be confirmed (\"confirm\": true)",
        ));
    }
    let r = c
        .api
        .purge_dead_letters(tonic::Request::new(sel))
        .await?
        .into_inner();
    Ok(axum::Json(json!({ "purged": r.purged })))
}

/// Most attempt errors shown for one job (the latest).
const MAX_ATTEMPTS_SHOWN: i64 = 100;

/// A job, with the error of each failed attempt.
pub(super) async fn get_job(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult {
    let j = readable_job(&c, &caller, &id).await?;
    let job_id = crate::domain::JobId::parse_field(&id, "job_id")?;
    let mut attempts: Vec<Value> = crate::fanout::attempt_errors(
        c.api.clusters(),
        job_id,
        MAX_ATTEMPTS_SHOWN,
    )
    .await?
    .into_iter()
    .map(|e| json!({ "attempt": e.attempt, "at": e.at.timestamp_millis(), "error": e.error }))
    .collect();
    // A dead letter's last attempt is the dead letter itself.
    if job_state(j.state) == "dead" {
        attempts.push(json!({
            "attempt": j.attempt,
            "at": millis(&j.died_at),
            "error": j.last_error,
        }));
    }
    let mut v = job_json(&j, true);
    v["attempts"] = json!(attempts);
    v["can_admin"] = json!(caller.can_admin(&j.queue));
    Ok(axum::Json(v))
}

/// Jobs by state (`available`, `scheduled`, `leased`, `dead`, `completed`;
/// none = every live job), of one queue or every queue the token may read,
/// of one `key` (exact), matching `search` (an id, or text in the dedup
/// key, last error or payload), 50 a page after `after` (the last id of the
/// previous page).
pub(super) async fn list_jobs(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    use crate::store::admin::JobState;
    let queue = match q.get("queue").map(String::as_str).unwrap_or("") {
        "" => {
            if let Identity::Token(p) = &caller.0
                && ![Action::Enqueue, Action::Consume, Action::Admin]
                    .into_iter()
                    .any(|a| p.allows_everywhere(a))
            {
                return Err(bad("queue: choose a queue"));
            }
            None
        }
        name => {
            caller.read(name)?;
            Some(crate::domain::QueueName::parse_field(name, "queue")?)
        }
    };
    let state = match q.get("state").map(String::as_str).unwrap_or("") {
        "" | "live" => None,
        "available" => Some(JobState::Available),
        "scheduled" => Some(JobState::Scheduled),
        "leased" => Some(JobState::Leased),
        "dead" => Some(JobState::Dead),
        "completed" => Some(JobState::Completed),
        other => {
            return Err(bad(format!(
                "state: {other:?} is not one of live, available, scheduled, leased, dead, completed"
            )));
        }
    };
    let search = q.get("search").map(|s| s.trim()).filter(|s| !s.is_empty());
    if search.is_some_and(|s| s.len() > 256) {
        return Err(bad("search: at most 256 bytes"));
    }
    let key = crate::domain::key_filter(q.get("key").map_or("", String::as_str), "key")?;
    let after = match q.get("after").map(String::as_str).unwrap_or("") {
        "" => None,
        id => Some(crate::domain::JobId::parse_field(id, "after")?.0),
    };
    const PAGE: i64 = 50;
    let filter = crate::store::admin::JobFilter {
        queue,
        state,
        key,
        search: search.map(str::to_owned),
    };
    let found = crate::fanout::list_jobs(c.api.clusters(), &filter, after, PAGE, false).await?;
    let (rows, more) = found.value;
    let jobs: Vec<pb::JobInfo> = rows.into_iter().map(crate::api::admin::job_info).collect();
    let next = if more {
        jobs.last().map(|j| j.id.clone())
    } else {
        None
    };
    Ok(axum::Json(json!({
        "jobs": jobs
            .iter()
            .filter(|j| caller.can_read(&j.queue))
            .map(|j| job_json(j, false))
            .collect::<Vec<_>>(),
        "next": next,
        "unavailable_clusters": found.missing,
    })))
}

/// Cancels a live job (deleted; a leased one's stream gets its credit
/// back): `admin` on its queue.
pub(super) async fn cancel_job(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult {
    let j = readable_job(&c, &caller, &id).await?;
    caller.admin(&j.queue)?;
    let r = c
        .api
        .cancel_job(tonic::Request::new(pb::CancelJobRequest { job_id: id }))
        .await?
        .into_inner();
    Ok(axum::Json(json!({ "was_leased": r.was_leased })))
}

/// Deletes the queue's waiting jobs (and its completed records): `admin`
/// on the queue, and `{"confirm": "<the queue's name>"}`.
pub(super) async fn purge_queue(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
    axum::Json(v): axum::Json<Value>,
) -> ApiResult {
    caller.admin(&name)?;
    if v.get("confirm").and_then(Value::as_str) != Some(name.as_str()) {
        return Err(bad(
            "confirm: a purge must be confirmed with the queue's name (\"confirm\": \"<queue>\")",
        ));
    }
    let r = c
        .api
        .purge_queue(tonic::Request::new(pb::PurgeQueueRequest { queue: name }))
        .await?
        .into_inner();
    Ok(axum::Json(json!({
        "purged": r.purged,
        "purged_completed": r.purged_completed,
    })))
}

/// Enqueues a test job: `{"payload": text, "headers": {k: v}, "priority":
/// n, "delay": seconds, "dedup_key": text}` (all optional), through the
/// QueueService's own Enqueue (its validation and limits): the `enqueue` or
/// the `admin` action on the queue.
pub(super) async fn enqueue_job(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
    axum::Json(v): axum::Json<Value>,
) -> ApiResult {
    caller.read(&name)?;
    if !caller.can_enqueue(&name) {
        let who = caller.0.name().unwrap_or("anonymous");
        return Err(forbidden(format!(
            "permission denied: token {who:?} lacks \"enqueue\" and \"admin\" on queue {name:?}"
        )));
    }
    let payload = match v.get("payload") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("payload: must be text")),
    };
    let headers = match v.get("headers") {
        None | Some(Value::Null) => HashMap::new(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
            .collect::<Option<HashMap<_, _>>>()
            .ok_or_else(|| bad("headers: values must be text"))?,
        Some(_) => return Err(bad("headers: must be an object of text values")),
    };
    let dedup_key = match v.get("dedup_key") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("dedup_key: must be text")),
    };
    let mut req = tonic::Request::new(pb::EnqueueRequest {
        queue: name,
        payload: payload.into_bytes(),
        headers,
        priority: int(&v, "priority")?.unwrap_or(0),
        delay: duration(&v, "delay")?,
        dedup_key,
        ..Default::default()
    });
    // Checked above (enqueue or admin); the handler's own check would
    // refuse an admin-only token.
    req.extensions_mut().insert(Identity::Anonymous);
    let r = c.queue.enqueue(req).await?.into_inner();
    info!(
        token = caller.0.name().unwrap_or("anonymous"),
        job_id = %r.job_id,
        "console: test job enqueued"
    );
    Ok(axum::Json(
        json!({ "job_id": r.job_id, "duplicate": r.duplicate }),
    ))
}

/// The job `id`, if the caller may read its queue: a job of a queue it may
/// not see is a job it does not know (404, as for queues).
async fn readable_job(c: &Console, caller: &Caller, id: &str) -> ApiResult<pb::JobInfo> {
    let j = c
        .api
        .get_job(tonic::Request::new(pb::GetJobRequest {
            job_id: id.to_owned(),
        }))
        .await?
        .into_inner();
    if !caller.can_read(&j.queue) {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("job {id} does not exist"),
        ));
    }
    Ok(j)
}

/// The schedules whose queue the caller may read, in name order (every
/// page, bounded by the deployment's limit of 10,000 schedules).
pub(super) async fn list_schedules(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> ApiResult {
    let mut all = Vec::new();
    let mut page_token = String::new();
    for _ in 0..10 {
        let r = c
            .api
            .list_schedules(tonic::Request::new(pb::ListSchedulesRequest {
                page_size: 1000,
                page_token,
            }))
            .await?
            .into_inner();
        all.extend(r.schedules);
        if r.next_page_token.is_empty() {
            break;
        }
        page_token = r.next_page_token;
    }
    let shown: Vec<Value> = all
        .iter()
        .filter(|i| caller.can_read(&schedule_queue(i)))
        .map(|i| schedule_json(i, &caller))
        .collect();
    Ok(axum::Json(json!({ "schedules": shown })))
}

fn schedule_queue(i: &pb::ScheduleInfo) -> String {
    i.schedule
        .as_ref()
        .and_then(|s| s.job.as_ref())
        .map(|j| j.queue.clone())
        .unwrap_or_default()
}

/// The schedule `name`, if the caller may change it: `admin` on the queue
/// its jobs go to. A schedule whose queue the caller may not read does not
/// exist for it (404), as a queue.
async fn schedule_for_admin(c: &Console, caller: &Caller, name: &str) -> ApiResult<String> {
    let i = c
        .api
        .get_schedule(tonic::Request::new(pb::GetScheduleRequest {
            name: name.to_owned(),
        }))
        .await?
        .into_inner();
    let queue = schedule_queue(&i);
    if !caller.can_read(&queue) {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("schedule {name:?} does not exist"),
        ));
    }
    caller.admin(&queue)?;
    Ok(queue)
}

pub(super) async fn pause_schedule(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    schedule_for_admin(&c, &caller, &name).await?;
    let i = c
        .api
        .pause_schedule(tonic::Request::new(pb::PauseScheduleRequest { name }))
        .await?
        .into_inner();
    Ok(axum::Json(schedule_json(&i, &caller)))
}

pub(super) async fn resume_schedule(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    schedule_for_admin(&c, &caller, &name).await?;
    let i = c
        .api
        .resume_schedule(tonic::Request::new(pb::ResumeScheduleRequest { name }))
        .await?
        .into_inner();
    Ok(axum::Json(schedule_json(&i, &caller)))
}

/// Run now: the schedule's job enqueued at once (RunSchedule), whatever
/// its pause and overlap.
pub(super) async fn run_schedule(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    schedule_for_admin(&c, &caller, &name).await?;
    let r = c
        .api
        .run_schedule(tonic::Request::new(pb::RunScheduleRequest { name }))
        .await?
        .into_inner();
    Ok(axum::Json(
        json!({ "job_id": r.job_id, "tick_at": millis(&r.tick_at) }),
    ))
}

/// Deletes the schedule: `admin` on its queue, and `{"confirm": "<the
/// schedule's name>"}`. Jobs it enqueued stay.
pub(super) async fn delete_schedule(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
    axum::Json(v): axum::Json<Value>,
) -> ApiResult {
    schedule_for_admin(&c, &caller, &name).await?;
    if v.get("confirm").and_then(Value::as_str) != Some(name.as_str()) {
        return Err(bad(
            "confirm: a delete must be confirmed with the schedule's name (\"confirm\": \"<schedule>\")",
        ));
    }
    c.api
        .delete_schedule(tonic::Request::new(pb::DeleteScheduleRequest {
            name: name.clone(),
        }))
        .await?;
    info!(schedule = %name, "console: schedule deleted");
    Ok(axum::Json(json!({ "deleted": name })))
}
