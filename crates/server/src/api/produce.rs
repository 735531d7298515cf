//! `QueueService.Produce`: enqueues on a stream, one job per request, each
//! answered by a response with the request's id once the job is committed
//! (or refused), as the unary Enqueue would have answered it.
//!
//! A task reads the requests. Each job is validated and authorised on its
//! own (a refused one is answered with the unary call's status and message,
//! naming the field as Enqueue does, and the stream goes on) and handed to
//! the same group-commit batcher as the unary Enqueue, in a task of its own
//! (polling them all in the reader's task instead measured no faster, with
//! more context switches: docs/BENCHMARKS.md): jobs of one stream share
//! statements with each other and with everyone else's, and are answered
//! as they commit. At most [`MAX_PENDING`] jobs of a stream are under way;
//! past it the next request is read when one is answered. Each message's
//! charge on its connection's request budget (`crate::request_limit`) is
//! held until its answer is handed to the response, and the next message is
//! read only once the connection has room, as on a Consume stream: a client
//! that does not read its answers stops being read.
//!
//! When the client half-closes, the jobs sent are answered, then the stream
//! ends with OK. When the broker drains, no more requests are read, the jobs
//! under way are answered, and the stream ends with UNAVAILABLE. A message
//! past a limit ends the stream with its status. A call with a deadline
//! (`grpc-timeout`) ends at it with DEADLINE_EXCEEDED, whatever is under
//! way (tonic applies the header to the opening only; gRPC clients cancel
//! the call at its deadline too). An enqueue already started
//! runs to its end whatever becomes of the stream (the batcher detaches it):
//! a job answered nowhere may be committed, as with an Enqueue whose client
//! went away.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use opentelemetry::trace::SpanContext;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::{Status, Streaming};

use crate::auth::{Action, Identity};
use crate::broker::Broker;
use crate::config::RequestLimits;
use crate::conn_limit::RequestCharge;
use crate::domain::NewJob;
use crate::error::Error;
use crate::pb;
use crate::request_limit::StreamBudget;
use crate::telemetry::Traces;

/// Jobs one stream may have under way; past it the stream's next request is
/// read only when one is answered.
pub const MAX_PENDING: usize = 1024;
/// Answers waiting to be sent, per stream.
const ANSWERS_BACKLOG: usize = 256;

/// An answer (or the status that ends the stream), with the charge of the
/// message it answers: the connection's budget counts a message until its
/// answer is sent.
type Outgoing = (
    Result<pb::ProduceResponse, Status>,
    Option<Arc<RequestCharge>>,
);

/// The deadline a `grpc-timeout` header asks for (`<digits><unit>`, at most
/// 8 digits, unit H, M, S, m, u or n: the gRPC over HTTP/2 spec); None
/// without one or with one malformed.
pub(super) fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<std::time::Duration> {
    let v = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    use std::time::Duration;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Starts the stream: the reader task, and the response it feeds.
#[allow(clippy::too_many_arguments)]
pub(super) fn start(
    broker: Arc<Broker>,
    limits: RequestLimits,
    traces: Traces,
    who: Identity,
    caller: Option<SpanContext>,
    budget: StreamBudget,
    deadline: Option<tokio::time::Instant>,
    requests: Streaming<pb::ProduceRequest>,
) -> ProduceStream {
    let (tx, rx) = mpsc::channel(ANSWERS_BACKLOG);
    let reader = Reader {
        broker,
        limits,
        traces,
        who,
        caller,
        budget,
        answers: tx,
        pending: JoinSet::new(),
        deadline,
    };
    tokio::spawn(reader.run(requests));
    ProduceStream { answers: rx }
}

struct Reader {
    broker: Arc<Broker>,
    limits: RequestLimits,
    traces: Traces,
    who: Identity,
    /// The trace context of the stream's opening (its metadata).
    caller: Option<SpanContext>,
    budget: StreamBudget,
    answers: mpsc::Sender<Outgoing>,
    /// Enqueues under way (their answers go to `answers` when done).
    pending: JoinSet<()>,
    /// The call's deadline (`grpc-timeout`), if it has one.
    deadline: Option<tokio::time::Instant>,
}

impl Reader {
    async fn run(mut self, mut requests: Streaming<pb::ProduceRequest>) {
        let broker = self.broker.clone();
        let deadline = self.deadline;
        let past_deadline = async move {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(past_deadline);
        loop {
            while self.pending.len() >= MAX_PENDING {
                tokio::select! {
                    _ = self.pending.join_next() => {}
                    () = &mut past_deadline => return self.past_deadline().await,
                }
            }
            tokio::select! {
                biased;
                // The call's deadline: it ends now, with what is under
                // way left to run to its end.
                () = &mut past_deadline => return self.past_deadline().await,
                // A drain: read no more, answer what was sent, then end
                // with UNAVAILABLE.
                () = broker.drain_started() => {
                    while self.pending.join_next().await.is_some() {}
                    let _ = self.answers.send((Err(Error::Draining.into()), None)).await;
                    return;
                }
                msg = self.budget.read(&mut requests) => match msg {
                    Ok(Some((msg, charge))) => self.apply(msg, charge),
                    // Half-close: answer what was sent, then end with OK.
                    Ok(None) => break,
                    // A message past a limit (the stream ends with its
                    // status), or the client is gone. The enqueues under
                    // way run to their end.
                    Err(status) => {
                        let _ = self.answers.send((Err(status), None)).await;
                        self.pending.detach_all();
                        return;
                    }
                },
                Some(_) = self.pending.join_next(), if !self.pending.is_empty() => {}
            }
        }
        loop {
            tokio::select! {
                r = self.pending.join_next() => if r.is_none() { return },
                () = &mut past_deadline => return self.past_deadline().await,
            }
        }
    }

    /// Ends the call with DEADLINE_EXCEEDED; the enqueues under way run to
    /// their end (their jobs may be committed, as for any call cut by its
    /// deadline).
    async fn past_deadline(mut self) {
        self.pending.detach_all();
        let status = Status::deadline_exceeded("the call's deadline (grpc-timeout) passed");
        let _ = self.answers.send((Err(status), None)).await;
    }

    /// Validates and authorises one request's job, then enqueues it in a
    /// task of its own; its answer (an error at once) goes to the response.
    fn apply(&mut self, msg: pb::ProduceRequest, charge: Option<Arc<RequestCharge>>) {
        let id = msg.id;
        let parsed = msg
            .job
            .ok_or_else(|| Error::invalid("job", "a job is required"))
            // Named as Enqueue names them (`queue: ...`): an answer is what
            // the unary call would have said.
            .and_then(|j| NewJob::parse(j, &self.limits))
            .and_then(|job| {
                self.who
                    .require(Action::Enqueue, [&job.queue])
                    .map(|()| job)
            });
        let tx = self.answers.clone();
        let job = match parsed {
            Ok(job) => job,
            Err(e) => {
                self.pending
                    .spawn(async move { answer(&tx, id, Err(e), charge).await });
                return;
            }
        };
        let span = self.traces.enqueue("Produce", self.caller.as_ref(), &job);
        let broker = self.broker.clone();
        self.pending.spawn(async move {
            let result = broker
                .enqueue(vec![job])
                .await
                .and_then(|mut r| r.pop().ok_or(Error::Internal("enqueue lost its result")));
            span.enqueued(result.as_ref());
            answer(&tx, id, result, charge).await;
        });
    }
}

async fn answer(
    tx: &mpsc::Sender<Outgoing>,
    id: u64,
    result: crate::error::Result<crate::domain::Enqueued>,
    charge: Option<Arc<RequestCharge>>,
) {
    let resp = match result {
        Ok(e) => pb::ProduceResponse {
            id,
            code: 0,
            message: String::new(),
            enqueued: Some(super::queue::enqueued(e)),
        },
        Err(e) => {
            let status = Status::from(e);
            pb::ProduceResponse {
                id,
                code: status.code() as i32,
                message: status.message().to_owned(),
                enqueued: None,
            }
        }
    };
    let _ = tx.send((Ok(resp), charge)).await;
}

/// The response of one Produce call: the answers, in the order the jobs
/// were settled; it ends when the reader is done (OK) or with the status
/// the reader sent.
pub struct ProduceStream {
    answers: mpsc::Receiver<Outgoing>,
}

impl Stream for ProduceStream {
    type Item = Result<pb::ProduceResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // The charge is dropped here: its answer is on its way.
        self.answers
            .poll_recv(cx)
            .map(|o| o.map(|(answer, _charge)| answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(v: &str) -> Option<Duration> {
        let mut m = tonic::metadata::MetadataMap::new();
        m.insert("grpc-timeout", v.parse().unwrap());
        grpc_timeout(&m)
    }

    #[test]
    fn grpc_timeout_is_read_as_the_spec_writes_it() {
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(parse("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "123456789m", "1x", "-1S", "1.5S", "S1"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&tonic::metadata::MetadataMap::new()), None);
    }
}
