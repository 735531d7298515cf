//! Request messages, as they arrive: `--max-message-bytes` and the
//! connection's request budget (`--max-request-bytes-per-connection`,
//! [`crate::conn_limit`]), and the refusal of calls on a connection over
//! `--max-connections`.
//!
//! [`RequestLimitLayer`] wraps every gRPC service. It reads the 5-byte
//! length prefix of each request message as the bytes go past on their way
//! to tonic's decoder. A message longer than `--max-message-bytes` fails the
//! call before its body is read, with RESOURCE_EXHAUSTED naming the limit
//! (tonic's own check, kept behind this one, would say OUT_OF_RANGE without
//! naming the flag; gRPC's convention for an oversized request is
//! RESOURCE_EXHAUSTED). A message that fits is charged to its connection
//! from its first byte, for its declared length, or fails the call with
//! RESOURCE_EXHAUSTED if the connection has no room: failing rather than
//! waiting, because a stream that stopped being read while holding the
//! connection's flow-control window would stall its other streams too.
//!
//! The charge is given back when the call is answered (a unary call: the
//! decoded request is gone then too), or, for a message that comes after the
//! answer started (a client stream's), when it has been read in full. A
//! Consume stream's messages are different: the handler takes each charge
//! ([`CallCharges::take`]) and holds it until the message's settles have
//! been answered and their results sent, so a client that does not read its
//! responses stops being read once its connection's budget is used. A
//! Produce stream's likewise, until each job's answer is sent.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::Status;
use tonic::body::Body;

use crate::config::Config;
use crate::conn_limit::{Conn, ConnInfo, RequestCharge, StreamHold};
use crate::domain::{
    MAX_DEDUP_KEY_LEN, MAX_ERROR_LEN, MAX_HEADER_KEY_LEN, MAX_HEADER_VALUE_LEN, MAX_HEADERS,
    MAX_QUEUE_LEN,
};
use crate::error::Error;

/// The most an encoded job adds to its payload in an Enqueue or
/// EnqueueBatch message: the largest headers, queue name and dedup key, the
/// other fields and the protobuf framing (about 1.02 MiB, nearly all of it
/// the headers: 64 of 16 KiB).
pub const JOB_OVERHEAD: usize = MAX_HEADERS * (MAX_HEADER_KEY_LEN + MAX_HEADER_VALUE_LEN + 16)
    + MAX_QUEUE_LEN
    + MAX_DEDUP_KEY_LEN
    + 256;
/// The most a Delivery adds to its job's payload: [`JOB_OVERHEAD`], the
/// job's last error, its id and its lease (about 1.08 MiB).
pub const DELIVERY_OVERHEAD: usize = JOB_OVERHEAD + MAX_ERROR_LEN + 256;
/// An encoded AckRequest with a valid job id and lease token.
const ACK_BYTES: usize = 80;

/// Checks that the limits agree: a job of the largest payload fits in one
/// message both ways, a full AckBatch fits in one message, and a connection
/// may receive at least one message of the largest size. Each error names
/// the flags.
pub fn check_settings(cfg: &Config) -> anyhow::Result<()> {
    let r = &cfg.request_limits;
    let s = &cfg.security;
    let least = r.max_payload_bytes.saturating_add(DELIVERY_OVERHEAD);
    anyhow::ensure!(
        r.max_message_bytes >= least,
        "--max-message-bytes ({}) must be at least --max-payload-bytes ({}) + {DELIVERY_OVERHEAD} (the largest headers and last error a job may carry), {least}: \
         otherwise a job could be accepted whose delivery does not fit in a message",
        r.max_message_bytes,
        r.max_payload_bytes,
    );
    anyhow::ensure!(
        r.max_batch_jobs >= 1 && r.max_batch_jobs.saturating_mul(ACK_BYTES) <= r.max_message_bytes,
        "--max-batch-jobs ({}) must be at least 1, and an AckBatch of that many acks ({ACK_BYTES} bytes each) must fit in --max-message-bytes ({})",
        r.max_batch_jobs,
        r.max_message_bytes,
    );
    anyhow::ensure!(
        r.max_result_bytes.saturating_add(ACK_BYTES) <= r.max_message_bytes,
        "--max-result-bytes ({}) plus an ack's {ACK_BYTES} bytes must fit in --max-message-bytes ({}): otherwise a result could be accepted by no message",
        r.max_result_bytes,
        r.max_message_bytes,
    );
    anyhow::ensure!(
        s.max_request_bytes_per_connection >= r.max_message_bytes,
        "--max-request-bytes-per-connection ({}) must be at least --max-message-bytes ({}): a message of the largest size must fit",
        s.max_request_bytes_per_connection,
        r.max_message_bytes,
    );
    anyhow::ensure!(
        s.max_connections >= 1,
        "--max-connections must be at least 1"
    );
    anyhow::ensure!(
        s.max_subscriptions_per_connection >= 1,
        "--max-subscriptions-per-connection must be at least 1"
    );
    anyhow::ensure!(
        s.max_in_flight_per_connection >= 1,
        "--max-in-flight-per-connection must be at least 1"
    );
    Ok(())
}

/// gRPC's message prefix: a compression flag and a big-endian u32 length.
const PREFIX: usize = 5;
/// The methods whose handlers take their messages' charges (and hold each
/// until the message is answered).
const HANDOFF: [&str; 2] = [
    "/leaseq.v1.QueueService/Consume",
    "/leaseq.v1.QueueService/Produce",
];
/// Answered on a connection over `--max-connections` (probes keep working).
const HEALTH: &str = "/grpc.health.v1.Health/";

/// Applies the request limits to every call of the services it wraps.
#[derive(Clone, Copy, Debug)]
pub struct RequestLimitLayer {
    max_message: usize,
}

impl RequestLimitLayer {
    pub fn new(max_message_bytes: usize) -> RequestLimitLayer {
        RequestLimitLayer {
            max_message: max_message_bytes,
        }
    }
}

impl<S> tower_layer::Layer<S> for RequestLimitLayer {
    type Service = RequestLimit<S>;

    fn layer(&self, inner: S) -> RequestLimit<S> {
        RequestLimit {
            inner,
            max_message: self.max_message,
        }
    }
}

/// [`RequestLimitLayer`]'s service.
#[derive(Clone, Debug)]
pub struct RequestLimit<S> {
    inner: S,
    max_message: usize,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S> tower_service::Service<http::Request<Body>> for RequestLimit<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let conn = ConnInfo::of(req.extensions());
        if let Some(conn) = &conn
            && let Err(e) = conn.check_admitted()
            && !req.uri().path().starts_with(HEALTH)
        {
            let refused = Status::from(e).into_http();
            return Box::pin(std::future::ready(Ok(refused)));
        }
        let call = Arc::new(Call {
            conn,
            handoff: HANDOFF.contains(&req.uri().path()),
            max_message: self.max_message,
            state: Mutex::new(CallState::default()),
        });
        req.extensions_mut().insert(CallCharges(call.clone()));
        let req = req.map(|body| {
            Body::new(Metered {
                inner: body,
                call: call.clone(),
                prefix: [0; PREFIX],
                have: 0,
                remaining: 0,
                current: None,
                failed: false,
            })
        });
        // The service that was polled ready answers this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let response = inner.call(req).await;
            call.answered();
            response
        })
    }
}

/// One call's charges.
struct Call {
    /// None when the request did not come through
    /// [`crate::conn_limit::Admission`]: only the message size applies.
    conn: Option<Arc<Conn>>,
    /// Consume and Produce: every message's charge waits for the handler
    /// to take it.
    handoff: bool,
    max_message: usize,
    state: Mutex<CallState>,
}

#[derive(Default)]
struct CallState {
    answered: bool,
    /// Charges of messages read in full, in order.
    held: VecDeque<RequestCharge>,
}

impl Call {
    /// A message was read in full.
    fn completed(&self, charge: Option<RequestCharge>) {
        let Some(charge) = charge else { return };
        let mut state = self.state.lock().expect("poisoned");
        if self.handoff || !state.answered {
            state.held.push_back(charge);
        }
    }

    /// The call was answered (a unary call's response, a stream's headers).
    fn answered(&self) {
        let mut state = self.state.lock().expect("poisoned");
        state.answered = true;
        if !self.handoff {
            state.held.clear();
        }
    }
}

/// The charges of one call's messages, for a handler that holds them while
/// it works on them (Consume). In the request's extensions.
#[derive(Clone)]
pub struct CallCharges(Arc<Call>);

impl CallCharges {
    /// The charge of the oldest message read in full and not yet taken.
    pub fn take(&self) -> Option<RequestCharge> {
        self.0.state.lock().expect("poisoned").held.pop_front()
    }

    /// Waits until the connection has room for a message of the largest
    /// size (`--max-message-bytes`).
    pub async fn room(&self) {
        if let Some(conn) = &self.0.conn {
            conn.request_room(self.0.max_message).await;
        }
    }
}

/// A request body that charges each message as its prefix goes past.
struct Metered {
    inner: Body,
    call: Arc<Call>,
    /// The prefix of the next message, `have` bytes of it so far.
    prefix: [u8; PREFIX],
    have: usize,
    /// Bytes of the current message still to come.
    remaining: usize,
    current: Option<RequestCharge>,
    /// A limit was passed: the body ends with that error.
    failed: bool,
}

impl Metered {
    fn observe(&mut self, mut data: &[u8]) -> Result<(), Status> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data = &data[n..];
                if self.remaining == 0 {
                    self.call.completed(self.current.take());
                }
                continue;
            }
            let n = (PREFIX - self.have).min(data.len());
            self.prefix[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have < PREFIX {
                break;
            }
            self.have = 0;
            let len = u32::from_be_bytes([
                self.prefix[1],
                self.prefix[2],
                self.prefix[3],
                self.prefix[4],
            ]) as usize;
            self.start(len)?;
        }
        Ok(())
    }

    /// A message of `len` bytes begins.
    fn start(&mut self, len: usize) -> Result<(), Status> {
        let max = self.call.max_message;
        if len > max {
            return Err(Error::LimitReached {
                limit: "max-message-bytes",
                what: format!(
                    "a request message of {len} bytes; this broker accepts messages of at most {max} bytes"
                ),
            }
            .into());
        }
        let charge = match &self.call.conn {
            Some(conn) => Some(conn.charge_request(len)?),
            None => None,
        };
        if len == 0 {
            self.call.completed(charge);
        } else {
            self.current = charge;
            self.remaining = len;
        }
        Ok(())
    }
}

impl HttpBody for Metered {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
            && let Err(status) = this.observe(data)
        {
            this.failed = true;
            this.current = None;
            return Poll::Ready(Some(Err(status)));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What a Consume stream holds of its connection's budgets, for its reader:
/// the charges of its messages, its place and its credit.
#[derive(Default)]
pub struct StreamBudget {
    charges: Option<CallCharges>,
    hold: Option<StreamHold>,
    /// The opening message's charge, held until its settles are answered.
    opening: Option<RequestCharge>,
}

impl StreamBudget {
    pub fn new(
        charges: Option<CallCharges>,
        hold: Option<StreamHold>,
        opening: Option<RequestCharge>,
    ) -> StreamBudget {
        StreamBudget {
            charges,
            hold,
            opening,
        }
    }

    /// The opening message's charge (once).
    pub fn opening(&mut self) -> Option<Arc<RequestCharge>> {
        self.opening.take().map(Arc::new)
    }

    /// Waits until the connection has room for another message.
    pub async fn room(&self) {
        if let Some(c) = &self.charges {
            c.room().await;
        }
    }

    /// The stream's next message, read once the connection has room for
    /// one of the largest size, with its charge (held until the message is
    /// answered); None at the client's half-close.
    pub async fn read<T>(
        &self,
        requests: &mut tonic::Streaming<T>,
    ) -> Result<Option<(T, Option<Arc<RequestCharge>>)>, Status> {
        self.room().await;
        Ok(requests.message().await?.map(|m| (m, self.next())))
    }

    /// The charge of the message just read.
    fn next(&self) -> Option<Arc<RequestCharge>> {
        self.charges
            .as_ref()
            .and_then(CallCharges::take)
            .map(Arc::new)
    }

    /// The stream's credit becomes `credit`, or RESOURCE_EXHAUSTED naming
    /// `--max-in-flight-per-connection`.
    pub fn raise_credit(&self, credit: u32) -> crate::error::Result<()> {
        match &self.hold {
            Some(hold) => hold.raise(credit),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;
    use prost::Message;

    /// A job with every field at its largest and no payload.
    fn largest_job() -> pb::EnqueueRequest {
        let big = prost_types::Duration {
            seconds: i64::MIN,
            nanos: i32::MIN,
        };
        pb::EnqueueRequest {
            queue: "q".repeat(MAX_QUEUE_LEN),
            payload: Vec::new(),
            headers: (0..MAX_HEADERS)
                .map(|i| {
                    let key = format!("{i:0>width$}", width = MAX_HEADER_KEY_LEN);
                    (key, "v".repeat(MAX_HEADER_VALUE_LEN))
                })
                .collect(),
            priority: i32::MIN,
            delay: Some(big),
            run_at: Some(prost_types::Timestamp {
                seconds: i64::MIN,
                nanos: i32::MIN,
            }),
            dedup_key: "d".repeat(MAX_DEDUP_KEY_LEN),
            max_attempts: i32::MIN,
            ttl: Some(big),
            key: "k".repeat(leaseq_proto::limits::MAX_KEY_LEN),
            unique_for: Some(big),
            on_duplicate: i32::MIN,
        }
    }

    #[test]
    fn the_overheads_bound_the_largest_job_both_ways() {
        let job = largest_job();
        let batch = pb::EnqueueBatchRequest {
            jobs: vec![job.clone()],
        };
        assert!(
            batch.encoded_len() <= JOB_OVERHEAD,
            "{} > {JOB_OVERHEAD}",
            batch.encoded_len()
        );
        let delivery = pb::ConsumeResponse {
            kind: Some(pb::consume_response::Kind::Delivery(pb::Delivery {
                job: Some(pb::Job {
                    id: uuid::Uuid::now_v7().to_string(),
                    queue: job.queue,
                    payload: Vec::new(),
                    headers: job.headers,
                    priority: i32::MIN,
                    attempt: i32::MIN,
                    enqueued_at: Some(prost_types::Timestamp {
                        seconds: i64::MIN,
                        nanos: i32::MIN,
                    }),
                    last_error: "e".repeat(MAX_ERROR_LEN),
                    key: "k".repeat(leaseq_proto::limits::MAX_KEY_LEN),
                }),
                lease_token: uuid::Uuid::new_v4().to_string(),
                lease_expires_at: Some(prost_types::Timestamp {
                    seconds: i64::MIN,
                    nanos: i32::MIN,
                }),
            })),
        };
        assert!(
            delivery.encoded_len() <= DELIVERY_OVERHEAD,
            "{} > {DELIVERY_OVERHEAD}",
            delivery.encoded_len()
        );
        // The figure --help, README and docs/SECURITY.md give.
        assert_eq!(DELIVERY_OVERHEAD, 1_132_672);
        let ack = pb::AckRequest {
            job_id: uuid::Uuid::now_v7().to_string(),
            lease_token: uuid::Uuid::new_v4().to_string(),
            enqueue: Vec::new(),
            result: Vec::new(),
        };
        let acks = pb::AckBatchRequest {
            acks: vec![ack; 1000],
        };
        assert!(acks.encoded_len() <= 1000 * ACK_BYTES);
    }

    #[test]
    fn the_settings_must_agree() {
        let ok = Config::default();
        check_settings(&ok).expect("the defaults agree");
        let err = |f: fn(&mut Config)| {
            let mut c = Config::default();
            f(&mut c);
            check_settings(&c).unwrap_err().to_string()
        };
        let e = err(|c| c.request_limits.max_message_bytes = 2 * 1024 * 1024);
        assert!(
            e.contains("--max-message-bytes (2097152)")
                && e.contains("--max-payload-bytes (1048576)")
                && e.contains("2181248"),
            "{e}"
        );
        let e = err(|c| c.request_limits.max_batch_jobs = 100_000);
        assert!(e.contains("--max-batch-jobs (100000)"), "{e}");
        let e = err(|c| c.request_limits.max_batch_jobs = 0);
        assert!(e.contains("--max-batch-jobs (0)"), "{e}");
        let e = err(|c| c.security.max_request_bytes_per_connection = 1024);
        assert!(
            e.contains("--max-request-bytes-per-connection (1024)")
                && e.contains("--max-message-bytes (4194304)"),
            "{e}"
        );
        let e = err(|c| c.security.max_connections = 0);
        assert!(e.contains("--max-connections"), "{e}");
        let e = err(|c| c.security.max_in_flight_per_connection = 0);
        assert!(e.contains("--max-in-flight-per-connection"), "{e}");
        // The smallest message that fits the default payload is accepted.
        let mut c = Config::default();
        c.request_limits.max_message_bytes = 1024 * 1024 + DELIVERY_OVERHEAD;
        check_settings(&c).expect("exactly the least");
    }
}
