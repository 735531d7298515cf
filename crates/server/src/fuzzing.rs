//! The path untrusted bytes take before anything touches the database:
//! protobuf decoding of each request type, then the validation in
//! [`crate::domain`] (and the bearer-token check of [`crate::auth`]).
//!
//! Shared by the `cargo fuzz` target in `fuzz/` and by the deterministic
//! stable-toolchain test `tests/fuzz_decode.rs`, so both exercise exactly the
//! code the handlers run. Whatever the bytes, this must not panic, and every
//! rejection must be a client error (never INTERNAL).

use prost::Message;
use tonic::{Code, Request};

use crate::auth::{Authenticator, TokenSet};
use crate::config::RequestLimits;
use crate::domain::{AckReq, ExtendReq, NackReq, NewJob, Subscription};
use crate::error::Error;
use crate::pb;

/// What became of one input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Not a valid encoding of the chosen request type.
    Undecodable,
    /// Decoded, then rejected with this status code.
    Rejected(Code),
    /// Decoded and valid.
    Accepted,
}

impl Outcome {
    /// False only for a rejection with a server-side code: bad input must be
    /// INVALID_ARGUMENT, RESOURCE_EXHAUSTED or UNAUTHENTICATED, never INTERNAL.
    pub fn is_client_error_or_ok(self) -> bool {
        match self {
            Outcome::Rejected(code) => matches!(
                code,
                Code::InvalidArgument | Code::ResourceExhausted | Code::Unauthenticated
            ),
            Outcome::Undecodable | Outcome::Accepted => true,
        }
    }
}

/// Request kinds, chosen by the first input byte.
pub const KINDS: u8 = 7;

fn verdict(r: Result<(), Error>) -> Outcome {
    match r {
        Ok(()) => Outcome::Accepted,
        Err(e) => Outcome::Rejected(tonic::Status::from(e).code()),
    }
}

/// Decodes `data[1..]` as the request type chosen by `data[0]` and validates
/// it as the handler would. Limits are the defaults, except a smaller batch
/// cap so the batch rule is reachable from small inputs.
pub fn decode_and_validate(data: &[u8]) -> Outcome {
    let Some((&kind, body)) = data.split_first() else {
        return Outcome::Undecodable;
    };
    let limits = RequestLimits {
        max_batch_jobs: 16,
        ..RequestLimits::default()
    };
    match kind % KINDS {
        0 => match pb::EnqueueRequest::decode(body) {
            Ok(r) => verdict(NewJob::parse(r, &limits).map(|j| check_job(&j, &limits))),
            Err(_) => Outcome::Undecodable,
        },
        1 => match pb::EnqueueBatchRequest::decode(body) {
            // The same order of checks as `QueueApi::enqueue_batch`.
            Ok(r) if r.jobs.is_empty() => Outcome::Rejected(Code::InvalidArgument),
            Ok(r) if r.jobs.len() > limits.max_batch_jobs => {
                Outcome::Rejected(Code::ResourceExhausted)
            }
            Ok(r) => verdict(r.jobs.into_iter().enumerate().try_for_each(|(i, j)| {
                NewJob::parse(j, &limits)
                    .map(|j| check_job(&j, &limits))
                    .map_err(|e| e.in_field(&format!("jobs[{i}]")))
            })),
            Err(_) => Outcome::Undecodable,
        },
        2 => match pb::SubscribeRequest::decode(body) {
            Ok(r) => verdict(Subscription::parse(r).map(|s| {
                assert!(
                    !s.queues.is_empty() && s.queues.len() <= crate::domain::MAX_SUBSCRIBE_QUEUES
                );
                assert!((1..=crate::domain::MAX_IN_FLIGHT).contains(&s.max_in_flight));
            })),
            Err(_) => Outcome::Undecodable,
        },
        3 => match pb::AckRequest::decode(body) {
            Ok(r) => verdict(AckReq::parse(&r, &limits).map(|a| {
                assert!(a.result.as_ref().map_or(0, |b| b.len()) <= limits.max_result_bytes);
            })),
            Err(_) => Outcome::Undecodable,
        },
        4 => match pb::NackRequest::decode(body) {
            Ok(r) => verdict(NackReq::parse(r).map(drop)),
            Err(_) => Outcome::Undecodable,
        },
        5 => match pb::ExtendLeaseRequest::decode(body) {
            Ok(r) => verdict(ExtendReq::parse(&r).map(|e| {
                assert!((1000..=crate::domain::MAX_LEASE.as_millis() as i64).contains(&e.lease_ms));
            })),
            Err(_) => Outcome::Undecodable,
        },
        _ => bearer(body),
    }
}

/// What parsing promises the rest of the broker about a job.
fn check_job(j: &NewJob, limits: &RequestLimits) {
    assert!(j.payload.len() <= limits.max_payload_bytes);
    assert!(!j.queue.as_str().is_empty() && j.queue.as_str().len() <= crate::domain::MAX_QUEUE_LEN);
    assert!(
        j.max_attempts
            .is_none_or(|n| (1..=crate::domain::MAX_ATTEMPTS).contains(&n))
    );
}

/// The bytes as an `authorization` metadata value, against a one-token set.
fn bearer(body: &[u8]) -> Outcome {
    static TOKENS: std::sync::LazyLock<Authenticator> = std::sync::LazyLock::new(|| {
        let file = format!(
            r#"{{"tokens":[{{"name":"fuzz","sha256":"{}","grants":[{{"queues":"*","actions":["consume"]}}]}}]}}"#,
            crate::auth::hash_token("fuzz-token")
        );
        Authenticator::new(Some(TokenSet::parse(&file).expect("fuzz token file")))
    });
    let Ok(value) = tonic::metadata::MetadataValue::try_from(body) else {
        return Outcome::Undecodable;
    };
    let mut request = Request::new(());
    request.metadata_mut().insert("authorization", value);
    verdict(TOKENS.identify(&request).map(drop))
}
