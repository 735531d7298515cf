//! `leaseq.v1.QueueService`.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::instrument;

use crate::auth::{Action, Identity};
use crate::broker::Broker;
use crate::config::RequestLimits;
use crate::conn_limit::ConnInfo;
use crate::dispatch::SubscriptionStream;
use crate::domain::{
    AckReq, ExtendReq, JobId, NackReq, NewJob, ProgressReq, QueueName, Subscription,
};
use crate::error::Error;
use crate::pb;
use crate::pb::queue_service_server::QueueService;
use crate::request_limit::{CallCharges, StreamBudget};
use crate::stream_limit::{Limited, StreamLimit};
use crate::telemetry::{Settle, Traced, Traces};

/// Response metadata of Subscribe and Consume: the id of the broker process
/// serving the stream (32 hex digits, a new one at every start; the
/// `lease_broker` its leases carry in `leaseq.jobs`). It names a process,
/// not a host or an address.
pub const BROKER_HEADER: &str = "leaseq-broker";

/// The longest WaitJob (`WaitJobRequest.timeout`, and its default).
const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Served wrapped in [`crate::auth::Authenticator`]: every handler reads the
/// caller's [`Identity`] and checks its grants after validating the request
/// and before anything changes.
pub struct QueueApi {
    broker: Arc<Broker>,
    limits: RequestLimits,
    streams: StreamLimit,
    /// Spans of the jobs' enqueues, deliveries and settles (off by default).
    traces: Traces,
}

impl QueueApi {
    pub fn new(broker: Arc<Broker>, limits: RequestLimits) -> Self {
        QueueApi {
            broker,
            limits,
            streams: StreamLimit::new(usize::MAX),
            traces: Traces::off(),
        }
    }

    /// Exports spans of the jobs it handles (`--otlp-endpoint`).
    pub fn with_traces(mut self, traces: Traces) -> Self {
        self.traces = traces;
        self
    }

    /// A stream's response, its metadata naming this broker process
    /// ([`BROKER_HEADER`]): behind a load balancer a client can tell which
    /// replica serves its stream.
    fn served_here<T>(&self, stream: T) -> Response<T> {
        let mut r = Response::new(stream);
        if let Ok(v) = self.broker.store().broker_id().simple().to_string().parse() {
            r.metadata_mut().insert(BROKER_HEADER, v);
        }
        r
    }

    /// Caps open Subscribe streams on this broker (`--max-streams`).
    pub fn with_stream_limit(mut self, streams: StreamLimit) -> Self {
        self.streams = streams;
        self
    }
}

/// Checks a repeated request field's size (1 to `max` entries) and parses
/// each entry, naming the entry in errors (`jobs[3].queue: ...`). Nothing is
/// acted on unless every entry is valid.
fn parse_batch<T, U>(
    field: &str,
    noun: &str,
    items: Vec<T>,
    max: usize,
    parse: impl Fn(T) -> Result<U, Error>,
) -> Result<Vec<U>, Error> {
    if items.is_empty() {
        return Err(Error::invalid(
            field,
            format!("at least one {noun} is required"),
        ));
    }
    if items.len() > max {
        return Err(Error::too_large(
            field,
            format!("{} {field}, the limit is {max} per batch", items.len()),
        ));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| parse(item).map_err(|e| e.in_field(&format!("{field}[{i}]"))))
        .collect()
}

/// An ack's follow-up jobs (`AckRequest.enqueue`), validated as an
/// EnqueueBatch's (errors name `enqueue[2].queue`; at most the batch limit)
/// and authorised for enqueue on their queues. Empty when it has none.
pub(super) fn follow_ups(
    jobs: Vec<pb::EnqueueRequest>,
    limits: &RequestLimits,
    who: &Identity,
) -> Result<Vec<NewJob>, Error> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let jobs = parse_batch("enqueue", "job", jobs, limits.max_batch_jobs, |j| {
        NewJob::parse(j, limits)
    })?;
    who.require(Action::Enqueue, jobs.iter().map(|j| &j.queue))?;
    Ok(jobs)
}

pub(super) fn enqueued(e: crate::domain::Enqueued) -> pb::EnqueueResponse {
    pb::EnqueueResponse {
        job_id: e.job_id.to_string(),
        duplicate: e.duplicate,
        replaced: e.replaced,
    }
}

#[tonic::async_trait]
impl QueueService for QueueApi {
    #[instrument(level = "debug", skip_all, fields(queue = %request.get_ref().queue))]
    async fn enqueue(
        &self,
        request: Request<pb::EnqueueRequest>,
    ) -> Result<Response<pb::EnqueueResponse>, Status> {
        let who = Identity::of(&request)?;
        let caller = self.traces.caller(request.metadata());
        let job = NewJob::parse(request.into_inner(), &self.limits)?;
        who.require(Action::Enqueue, [&job.queue])?;
        let span = self.traces.enqueue("Enqueue", caller.as_ref(), &job);
        let result = self
            .broker
            .enqueue(vec![job])
            .await
            .and_then(|mut r| r.pop().ok_or(Error::Internal("enqueue lost its result")));
        span.enqueued(result.as_ref());
        Ok(Response::new(enqueued(result?)))
    }

    #[instrument(level = "debug", skip_all, fields(jobs = request.get_ref().jobs.len()))]
    async fn enqueue_batch(
        &self,
        request: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueBatchResponse>, Status> {
        let who = Identity::of(&request)?;
        let caller = self.traces.caller(request.metadata());
        let req = request.into_inner();
        let jobs = parse_batch("jobs", "job", req.jobs, self.limits.max_batch_jobs, |j| {
            NewJob::parse(j, &self.limits)
        })?;
        who.require(Action::Enqueue, jobs.iter().map(|j| &j.queue))?;
        let spans = self.traces.enqueues("EnqueueBatch", caller.as_ref(), &jobs);
        // One transaction: every job's span ends with the same outcome.
        let results = self.broker.enqueue(jobs).await;
        match &results {
            Ok(r) => spans
                .into_iter()
                .zip(r)
                .for_each(|(s, e)| s.enqueued(Ok(e))),
            Err(e) => spans.into_iter().for_each(|s| s.enqueued(Err(e))),
        }
        let results = results?;
        Ok(Response::new(pb::EnqueueBatchResponse {
            results: results.into_iter().map(enqueued).collect(),
        }))
    }

    type SubscribeStream = Limited<Traced<SubscriptionStream>>;

    #[instrument(level = "debug", skip_all, fields(consumer = %request.get_ref().consumer))]
    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let who = Identity::of(&request)?;
        let conn = ConnInfo::of(request.extensions());
        let sub = Subscription::parse(request.into_inner())?;
        who.require(Action::Consume, &sub.queues)?;
        let hold = conn.map(|c| c.open_stream(sub.max_in_flight)).transpose()?;
        let permit = self.streams.acquire()?;
        let stream = self.broker.subscribe(sub).await?;
        let stream = Traced::new(stream, self.traces.clone(), "Subscribe");
        Ok(self.served_here(Limited::new(stream, permit).holding(hold)))
    }

    #[instrument(level = "debug", skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn ack(
        &self,
        request: Request<pb::AckRequest>,
    ) -> Result<Response<pb::AckResponse>, Status> {
        let req = AckReq::parse(request.get_ref(), &self.limits)?;
        // The lease token is the capability for its job (docs/SECURITY.md).
        let who = Identity::of(&request)?;
        who.require_somewhere(Action::Consume)?;
        let span = self
            .traces
            .settle("Ack", Settle::Ack, &request.get_ref().job_id);
        let jobs = follow_ups(request.into_inner().enqueue, &self.limits, &who)?;
        if jobs.is_empty() {
            let result = self.broker.ack(req).await;
            span.settled(result.as_ref().err());
            result?;
            return Ok(Response::new(pb::AckResponse::default()));
        }
        let result = self.broker.ack_enqueue(req, jobs).await;
        span.settled(result.as_ref().err());
        Ok(Response::new(pb::AckResponse {
            enqueued: result?.iter().map(|e| e.job_id.to_string()).collect(),
        }))
    }

    #[instrument(level = "debug", skip_all, fields(acks = request.get_ref().acks.len()))]
    async fn ack_batch(
        &self,
        request: Request<pb::AckBatchRequest>,
    ) -> Result<Response<pb::AckBatchResponse>, Status> {
        let who = Identity::of(&request)?;
        let req = request.into_inner();
        let ids: Vec<String> = req.acks.iter().map(|a| a.job_id.clone()).collect();
        let acks = parse_batch("acks", "ack", req.acks, self.limits.max_batch_jobs, |a| {
            if !a.enqueue.is_empty() {
                // One statement acks the batch; follow-ups need a
                // transaction per ack, and AckResult has no place for their
                // ids.
                return Err(Error::invalid(
                    "enqueue",
                    "follow-up jobs are not accepted by AckBatch; send that ack with Ack or on a Consume stream",
                ));
            }
            AckReq::parse(&a, &self.limits)
        })?;
        // As for Ack: each lease token is the capability for its job.
        who.require_somewhere(Action::Consume)?;
        let spans = self
            .traces
            .settles("AckBatch", Settle::Ack, ids.iter().map(String::as_str));
        let results = self.broker.ack_many(acks).await;
        match &results {
            Ok(r) => spans
                .into_iter()
                .zip(r)
                .for_each(|(s, r)| s.settled(r.as_ref().err())),
            Err(e) => spans.into_iter().for_each(|s| s.settled(Some(e))),
        }
        let results = results?;
        Ok(Response::new(pb::AckBatchResponse {
            results: ids
                .into_iter()
                .zip(results)
                .map(|(job_id, r)| {
                    // The per-entry status, mapped like the unary Ack's.
                    let status = r.err().map(Status::from);
                    pb::AckResult {
                        job_id,
                        code: status.as_ref().map_or(0, |s| s.code() as i32),
                        message: status.map(|s| s.message().to_owned()).unwrap_or_default(),
                    }
                })
                .collect(),
        }))
    }

    #[instrument(level = "debug", skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn nack(
        &self,
        request: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        Identity::of(&request)?.require_somewhere(Action::Consume)?;
        let req = NackReq::parse(request.into_inner())?;
        let span = self
            .traces
            .settle("Nack", Settle::Nack, &req.job_id.to_string());
        let result = self.broker.nack(req).await;
        span.nacked(result.as_ref().copied());
        let dead_lettered = result?;
        Ok(Response::new(pb::NackResponse { dead_lettered }))
    }

    #[instrument(level = "debug", skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn extend_lease(
        &self,
        request: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        let req = ExtendReq::parse(request.get_ref())?;
        Identity::of(&request)?.require_somewhere(Action::Consume)?;
        let span = self
            .traces
            .settle("ExtendLease", Settle::Extend, &request.get_ref().job_id);
        let result = self.broker.extend(req).await;
        span.settled(result.as_ref().err());
        let at = result?;
        Ok(Response::new(pb::ExtendLeaseResponse {
            lease_expires_at: Some(std::time::SystemTime::from(at).into()),
        }))
    }

    type WaitJobStream = crate::waits::WaitStream;

    #[instrument(level = "debug", skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn wait_job(
        &self,
        request: Request<pb::WaitJobRequest>,
    ) -> Result<Response<Self::WaitJobStream>, Status> {
        let who = Identity::of(&request)?;
        let req = request.into_inner();
        let id = JobId::parse_field(&req.job_id, "job_id")?;
        let timeout = match &req.timeout {
            Some(d) => std::time::Duration::from_millis(crate::domain::duration_ms(
                d, "timeout", MAX_WAIT,
            )? as u64),
            None => MAX_WAIT,
        };
        let timeout = if timeout.is_zero() { MAX_WAIT } else { timeout };
        who.require_somewhere(Action::Enqueue)
            .or_else(|_| who.require_somewhere(Action::Consume))?;
        // Where the job is now: answered at once if it has ended.
        let settle = self.broker.settle();
        let row = crate::waits::status(settle.clusters(), &[id.0])
            .await?
            .pop()
            .ok_or(Error::Internal("wait status lost its row"))?;
        if let Some(q) = row.queue.as_deref().and_then(QueueName::parse) {
            // The job's queue, as for its enqueue or its consumers: a
            // token of other queues learns nothing of it.
            who.require(Action::Enqueue, [&q])
                .or_else(|_| who.require(Action::Consume, [&q]))?;
        }
        let now = crate::waits::response(&row);
        if crate::waits::is_final(now.state()) {
            return Ok(Response::new(crate::waits::WaitStream::answered(now)));
        }
        let state = now.state();
        let (reg, rx) = settle.waits().register(id.0, req.changes, Some(state))?;
        let first = req.changes.then_some(now);
        Ok(Response::new(crate::waits::WaitStream::open(
            first, reg, rx, timeout,
        )))
    }

    #[instrument(level = "debug", skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn report_progress(
        &self,
        request: Request<pb::ReportProgressRequest>,
    ) -> Result<Response<pb::ReportProgressResponse>, Status> {
        let who = Identity::of(&request)?;
        let r = request.into_inner();
        let req = ProgressReq::parse(&r.job_id, &r.lease_token, r.fraction, r.message)?;
        // As for Ack: the lease token is the capability for its job.
        who.require_somewhere(Action::Consume)?;
        let written = self.broker.progress(std::slice::from_ref(&req)).await?;
        if written.first() != Some(&true) {
            return Err(Error::StaleLease(req.job_id.0).into());
        }
        Ok(Response::new(pb::ReportProgressResponse {}))
    }

    type ConsumeStream = super::consume::ConsumeResponse;

    #[instrument(level = "debug", skip_all)]
    async fn consume(
        &self,
        request: Request<tonic::Streaming<pb::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        let who = Identity::of(&request)?;
        let conn = ConnInfo::of(request.extensions());
        let charges = request.extensions().get::<CallCharges>().cloned();
        let mut requests = request.into_inner();
        let first = requests
            .message()
            .await?
            .ok_or_else(|| Error::invalid("subscribe", "the stream ended before opening"))?;
        let charge = charges.as_ref().and_then(CallCharges::take);
        let mut opening = super::consume::Opening::parse(first)?;
        who.require(Action::Consume, &opening.sub.queues)?;
        let hold = conn
            .map(|c| c.open_stream(opening.sub.max_in_flight))
            .transpose()?;
        opening.budget = StreamBudget::new(charges, hold, charge);
        let permit = self.streams.acquire()?;
        let (id, deliveries) = self.broker.consume(opening.sub.clone()).await?;
        let stream = super::consume::start(
            self.broker.clone(),
            self.limits,
            self.traces.clone(),
            who,
            id,
            deliveries,
            opening,
            requests,
        );
        let stream = Traced::new(stream, self.traces.clone(), "Consume");
        Ok(self.served_here(Limited::new(stream, permit)))
    }

    type ProduceStream = super::produce::ProduceStream;

    #[instrument(level = "debug", skip_all)]
    async fn produce(
        &self,
        request: Request<tonic::Streaming<pb::ProduceRequest>>,
    ) -> Result<Response<Self::ProduceStream>, Status> {
        let who = Identity::of(&request)?;
        // Any queue's enqueue permission opens it; each job is checked
        // against its own queue.
        who.require_somewhere(Action::Enqueue)?;
        if self.broker.is_draining() {
            return Err(Error::Draining.into());
        }
        let caller = self.traces.caller(request.metadata());
        let deadline = super::produce::grpc_timeout(request.metadata())
            .map(|d| tokio::time::Instant::now() + d);
        let charges = request.extensions().get::<CallCharges>().cloned();
        let budget = StreamBudget::new(charges, None, None);
        Ok(Response::new(super::produce::start(
            self.broker.clone(),
            self.limits,
            self.traces.clone(),
            who,
            caller,
            budget,
            deadline,
            request.into_inner(),
        )))
    }
}
