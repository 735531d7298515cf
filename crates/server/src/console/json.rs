//! The console API's JSON: its errors (`{"error": ...}` with an HTTP
//! status mapped from the gRPC code), the renditions of the AdminService's
//! messages the page shows, and the parsing of request bodies.

use std::collections::HashMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tonic::Code;

use super::access::Caller;
use crate::pb;

/// An error as JSON `{"error": ...}` with its HTTP status.
#[derive(Debug)]
pub(super) struct ApiError(pub(super) StatusCode, pub(super) String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, axum::Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<tonic::Status> for ApiError {
    fn from(s: tonic::Status) -> ApiError {
        let code = match s.code() {
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, s.message().to_owned())
    }
}

impl From<crate::error::Error> for ApiError {
    fn from(e: crate::error::Error) -> ApiError {
        tonic::Status::from(e).into()
    }
}

pub(super) type ApiResult<T = axum::Json<Value>> = Result<T, ApiError>;

pub(super) fn bad(what: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, what.into())
}

pub(super) fn forbidden(what: impl Into<String>) -> ApiError {
    ApiError(StatusCode::FORBIDDEN, what.into())
}

// ---- JSON renditions of the AdminService's messages ----

pub(super) fn secs(d: &Option<prost_types::Duration>) -> Value {
    match d {
        Some(d) => json!(d.seconds as f64 + f64::from(d.nanos) / 1e9),
        None => Value::Null,
    }
}

pub(super) fn millis(t: &Option<prost_types::Timestamp>) -> Value {
    match t {
        Some(t) => json!(t.seconds * 1000 + i64::from(t.nanos) / 1_000_000),
        None => Value::Null,
    }
}

pub(super) fn queue_json(q: &pb::QueueInfo, rates: Option<&(f64, f64)>, caller: &Caller) -> Value {
    let s = q.settings.clone().unwrap_or_default();
    let st = q.stats.unwrap_or_default();
    json!({
        "name": q.name,
        "created_at": millis(&q.created_at),
        "can_admin": caller.can_admin(&q.name),
        "can_enqueue": caller.can_enqueue(&q.name),
        "stats": {
            "available": st.available,
            "scheduled": st.scheduled,
            "leased": st.leased,
            "dead": st.dead,
            "oldest_available_age": secs(&st.oldest_available_age),
            "streams": st.streams,
            "consumers": st.consumers,
            "keys_waiting": st.keys_waiting,
            "keys_waiting_capped": st.keys_waiting_capped,
            "keys_leased": st.keys_leased,
            // No row: no traffic on any replica over its last intervals.
            "enqueue_rate": rates.map_or(0.0, |r| r.0),
            "ack_rate": rates.map_or(0.0, |r| r.1),
        },
        "settings": {
            "paused": s.paused,
            "default_lease": secs(&s.default_lease),
            "max_attempts": s.max_attempts,
            "backoff_base": secs(&s.backoff_base),
            "backoff_cap": secs(&s.backoff_cap),
            "completed_retention": secs(&s.completed_retention),
            "concurrency_limit": s.concurrency_limit,
            "rate_limit": s.rate_limit,
            "rate_burst": s.rate_burst,
            "ordered_by_key": s.ordered_by_key,
            "key_concurrency": s.key_concurrency,
            "fair_by_key": s.fair_by_key,
            "key_rate_limit": s.key_rate_limit,
            "key_rate_burst": s.key_rate_burst,
            "key_overrides": s.key_overrides.iter().map(|o| json!({
                "key": o.key,
                "concurrency": o.concurrency,
                "rate_limit": o.rate_limit,
                "weight": o.weight,
            })).collect::<Vec<_>>(),
        },
    })
}

pub(super) fn job_state(state: i32) -> &'static str {
    match pb::JobState::try_from(state) {
        Ok(pb::JobState::Available) => "available",
        Ok(pb::JobState::Scheduled) => "scheduled",
        Ok(pb::JobState::Leased) => "leased",
        Ok(pb::JobState::Dead) => "dead",
        Ok(pb::JobState::Completed) => "completed",
        _ => "unknown",
    }
}

/// Standard base64 with padding (the page decodes it with `atob`).
pub(super) fn b64(bytes: &[u8]) -> String {
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes)
}

/// The most bytes of a job's result the job page gets (a preview: the
/// page says how many there are; GetJob and `leaseq job get` give all).
pub(super) const RESULT_PREVIEW: usize = 4096;

pub(super) fn job_json(j: &pb::JobInfo, with_payload: bool) -> Value {
    let mut headers: Vec<(&String, &String)> = j.headers.iter().collect();
    headers.sort();
    json!({
        "id": j.id,
        "queue": j.queue,
        "state": job_state(j.state),
        "payload_b64": with_payload.then(|| b64(&j.payload)),
        "payload_bytes": j.payload.len(),
        "headers": headers.into_iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        "priority": j.priority,
        "attempt": j.attempt,
        "max_attempts": j.max_attempts,
        "dedup_key": j.dedup_key,
        "key": j.key,
        "enqueued_at": millis(&j.enqueued_at),
        "run_at": millis(&j.run_at),
        "expires_at": millis(&j.expires_at),
        "last_error": j.last_error,
        "leased_by": j.leased_by,
        "lease_expires_at": millis(&j.lease_expires_at),
        "dead_reason": j.dead_reason,
        "died_at": millis(&j.died_at),
        "completed_at": millis(&j.completed_at),
        "completed_by": j.completed_by,
        "result_b64": (with_payload && !j.result.is_empty())
            .then(|| b64(&j.result[..j.result.len().min(RESULT_PREVIEW)])),
        "result_bytes": j.result.len(),
        "progress": j.progress_at.is_some().then_some(j.progress),
        "progress_message": j.progress_message,
        "progress_at": millis(&j.progress_at),
    })
}

pub(super) fn queues_json(
    caller: &Caller,
    queues: &[pb::QueueInfo],
    rates: &HashMap<String, (f64, f64)>,
) -> Vec<Value> {
    queues
        .iter()
        .filter(|q| caller.can_read(&q.name))
        .map(|q| queue_json(q, rates.get(&q.name), caller))
        .collect()
}

// ---- the API's request bodies ----

pub(super) fn duration(v: &Value, field: &str) -> ApiResult<Option<prost_types::Duration>> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => {
            let s = x
                .as_f64()
                .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e10)
                .ok_or_else(|| bad(format!("{field}: must be a number of seconds")))?;
            Ok(Some(prost_types::Duration {
                seconds: s.trunc() as i64,
                nanos: (s.fract() * 1e9).round() as i32,
            }))
        }
    }
}

pub(super) fn int(v: &Value, field: &str) -> ApiResult<Option<i32>> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| bad(format!("{field}: must be an integer"))),
    }
}

/// `{"queue": q, "ids": [...]}` or `{"queue": q, "all": true}`.
pub(super) fn selector(v: &Value) -> ApiResult<pb::DeadLettersSelector> {
    let queue = v.get("queue").and_then(Value::as_str).unwrap_or("");
    if queue.is_empty() {
        return Err(bad("queue: is required"));
    }
    let ids = match v.get("ids") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("ids: must be strings"))?,
        Some(_) => return Err(bad("ids: must be an array")),
    };
    Ok(pb::DeadLettersSelector {
        queue: queue.to_owned(),
        ids,
        all: v.get("all").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// A schedule (`ScheduleInfo`) for the Schedules page; `can_admin`: the
/// caller may pause, resume, run or delete it (`admin` on its queue).
pub(super) fn schedule_json(i: &pb::ScheduleInfo, caller: &Caller) -> Value {
    let s = i.schedule.clone().unwrap_or_default();
    let job = s.job.unwrap_or_default();
    let overlap = match pb::OverlapPolicy::try_from(s.overlap) {
        Ok(pb::OverlapPolicy::Skip) => "skip",
        _ => "allow",
    };
    let catch_up = match pb::CatchUpPolicy::try_from(s.catch_up) {
        Ok(pb::CatchUpPolicy::None) => "none",
        Ok(pb::CatchUpPolicy::All) => "all",
        _ => "one",
    };
    json!({
        "name": s.name,
        "cron": s.cron,
        "time_zone": if s.time_zone.is_empty() { "UTC" } else { s.time_zone.as_str() },
        "queue": job.queue,
        "paused": s.paused,
        "overlap": overlap,
        "catch_up": catch_up,
        "catch_up_limit": s.catch_up_limit,
        "next_run_at": millis(&i.next_run_at),
        "last_tick_at": millis(&i.last_tick_at),
        "last_job_id": (!i.last_job_id.is_empty()).then_some(&i.last_job_id),
        "can_admin": caller.can_admin(&job.queue),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(b64(b""), "");
        assert_eq!(b64(b"f"), "Zg==");
        assert_eq!(b64(b"fo"), "Zm8=");
        assert_eq!(b64(b"foo"), "Zm9v");
        assert_eq!(b64(b"<script>"), "PHNjcmlwdD4=");
        assert_eq!(b64(&[0xff, 0x00, 0x80]), "/wCA");
    }
}
