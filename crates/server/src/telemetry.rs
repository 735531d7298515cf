//! Traces of the broker's work on jobs, exported over OTLP/gRPC. Off unless
//! [`Config::otlp`](crate::Config::otlp) names a collector (`leaseq serve
//! --otlp-endpoint`, or the standard `OTEL_EXPORTER_OTLP_ENDPOINT`).
//!
//! A job's trace is the one its `traceparent` header names (the SDKs write
//! the producer's span there). The broker adds to it:
//!
//! - `enqueue <queue>` (SERVER) per job of an Enqueue or EnqueueBatch: a
//!   child of the caller's `traceparent` in the gRPC metadata when there is
//!   one, else of the job's header (linked to the header's context when both
//!   are given and differ);
//! - `deliver <queue>` (PRODUCER) when a delivery leaves on a Subscribe or
//!   Consume stream, a child of the job's header;
//! - `ack <queue>`, `nack <queue>`, `extend <queue>` (SERVER) per settle, unary,
//!   in an AckBatch, or on a Consume stream: children of the header of the
//!   job as this broker delivered it.
//!
//! Each carries the job id and queue (`messaging.message.id`,
//! `messaging.destination.name`, and `leaseq.job.id` / `leaseq.queue` as the
//! Node SDK names them), and an ERROR status with the gRPC code when the call
//! failed. A job without trace context gets root spans.
//!
//! Settles carry only a job id and token, so what a settle's span needs (the
//! queue, the header's context) is remembered from the delivery, in memory,
//! for the most recent deliveries of this broker ([`RECENT`] per generation,
//! two generations). A settle of a job this broker did not deliver (another
//! replica did, or this one restarted since) is exported as a root span
//! without a queue.
//!
//! Why the OpenTelemetry API directly rather than `tracing` spans through
//! `tracing-opentelemetry`: the subscriber is process-global and belongs to
//! the binary, while the broker is a library that tests run several of in one
//! process; a [`Traces`] belongs to one broker (its own provider, flushed by
//! its own shutdown), and costs one `None` check per call when off.
//!
//! The exporter is the tonic one (the `grpc-tonic` feature of
//! opentelemetry-otlp): it is built on the same tonic 0.14, hyper and rustls
//! the broker already serves with, so it adds no HTTP client; and OTLP/gRPC
//! is what a collector listens for on 4317 by default. The SDK's batch
//! processor exports from a thread of its own, where tonic finds no tokio
//! runtime, so [`OnRuntime`] runs each export on the broker's runtime.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::Context as _;
use futures_core::Stream;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tonic::metadata::{KeyRef, MetadataMap};
use tracing::{info, warn};

pub use crate::config::OtlpConfig;
use crate::domain::NewJob;
use crate::error::Error;
use crate::pb;

/// Deliveries remembered per generation for their settles' spans (two
/// generations are kept: at most twice this many entries).
pub const RECENT: usize = 50_000;

/// The broker's tracer: a cheap handle, `off` when tracing is off.
#[derive(Clone, Default)]
pub struct Traces(Option<Arc<Inner>>);

struct Inner {
    provider: SdkTracerProvider,
    tracer: opentelemetry_sdk::trace::SdkTracer,
    /// Deliveries not yet settled, for their settles' spans.
    recent: Mutex<Recent>,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Traces(on)"
        } else {
            "Traces(off)"
        })
    }
}

/// A settle's kind, as its span names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    Ack,
    Nack,
    Extend,
}

impl Settle {
    fn name(self) -> &'static str {
        match self {
            Settle::Ack => "ack",
            Settle::Nack => "nack",
            Settle::Extend => "extend",
        }
    }
}

impl Traces {
    /// Tracing off: every method does nothing.
    pub fn off() -> Traces {
        Traces(None)
    }

    /// Starts exporting to `cfg.endpoint` (the connection is made lazily: a
    /// collector that is down costs failed exports, logged, never a failed
    /// call). Must run inside the tokio runtime that will run the exports.
    pub fn start(cfg: &OtlpConfig) -> anyhow::Result<Traces> {
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(cfg.endpoint.clone())
            .with_timeout(Duration::from_secs(10));
        if cfg.endpoint.starts_with("https://") {
            // The system's roots, and the standard variable's CA if set.
            let mut tls = tonic::transport::ClientTlsConfig::new().with_native_roots();
            if let Some(ca) = std::env::var_os("OTEL_EXPORTER_OTLP_CERTIFICATE") {
                let pem = std::fs::read(&ca).with_context(|| {
                    format!("OTEL_EXPORTER_OTLP_CERTIFICATE ({})", ca.to_string_lossy())
                })?;
                tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
            }
            builder = builder.with_tls_config(tls);
        }
        let exporter = builder
            .build()
            .with_context(|| format!("the OTLP exporter to {}", cfg.endpoint))?;
        let exporter = OnRuntime {
            inner: Arc::new(exporter),
            runtime: tokio::runtime::Handle::current(),
        };
        let service = cfg
            .service_name
            .clone()
            .or_else(|| std::env::var("OTEL_SERVICE_NAME").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "leaseq".to_owned());
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(service.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("leaseq");
        if let Ok(protocol) = std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL")
            && protocol != "grpc"
        {
            warn!(%protocol, "OTEL_EXPORTER_OTLP_PROTOCOL is not grpc: the broker exports over OTLP/gRPC only");
        }
        info!(endpoint = %cfg.endpoint, %service, "exporting traces over OTLP/gRPC");
        Ok(Traces(Some(Arc::new(Inner {
            provider,
            tracer,
            recent: Mutex::new(Recent::default()),
        }))))
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// The caller's trace context from the call's gRPC metadata, if any.
    pub fn caller(&self, metadata: &MetadataMap) -> Option<SpanContext> {
        self.0.as_ref()?;
        valid(TraceContextPropagator::new().extract(&Metadata(metadata)))
    }

    /// The span of one job's enqueue; record the result with
    /// [`JobSpan::enqueued`].
    pub fn enqueue(
        &self,
        rpc: &'static str,
        caller: Option<&SpanContext>,
        job: &NewJob,
    ) -> JobSpan {
        let Some(inner) = &self.0 else {
            return JobSpan::none();
        };
        let header = parent_in(&job.headers);
        let (parent, link) = match (caller, header) {
            (Some(c), Some(h)) if c.trace_id() != h.trace_id() => (Some(c.clone()), Some(h)),
            (Some(c), _) => (Some(c.clone()), None),
            (None, h) => (h, None),
        };
        let queue = job.queue.as_str();
        let mut span = inner.start(
            format!("enqueue {queue}"),
            SpanKind::Server,
            parent,
            link,
            job_attributes(rpc, "send", queue, Some(job.id.to_string().as_str())),
        );
        span.set_attribute(KeyValue::new(
            "leaseq.job.priority",
            i64::from(job.priority),
        ));
        JobSpan {
            span: Some(span),
            forget: None,
        }
    }

    /// A delivery is leaving on a stream: its span, and what its settles'
    /// spans will need.
    pub fn delivered(&self, rpc: &'static str, delivery: &pb::Delivery) {
        let (Some(inner), Some(job)) = (&self.0, &delivery.job) else {
            return;
        };
        let parent = parent_in(&job.headers);
        let mut span = inner.start(
            format!("deliver {}", job.queue),
            SpanKind::Producer,
            parent.clone(),
            None,
            job_attributes(rpc, "receive", &job.queue, Some(job.id.as_str())),
        );
        span.set_attribute(KeyValue::new("leaseq.job.attempt", i64::from(job.attempt)));
        span.end();
        let entry = Delivered {
            queue: job.queue.clone(),
            parent,
        };
        inner.lock().insert(job.id.clone(), entry);
    }

    /// The span of one settle of `job_id`; end it with [`JobSpan::settled`].
    pub fn settle(&self, rpc: &'static str, op: Settle, job_id: &str) -> JobSpan {
        let Some(inner) = &self.0 else {
            return JobSpan::none();
        };
        let known = inner.lock().get(job_id);
        let (name, queue, parent) = match known {
            Some(d) => (
                format!("{} {}", op.name(), d.queue),
                Some(d.queue),
                d.parent,
            ),
            None => (op.name().to_owned(), None, None),
        };
        let mut attrs = vec![
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.service", "leaseq.v1.QueueService"),
            KeyValue::new("rpc.method", rpc),
            KeyValue::new("messaging.system", "leaseq"),
            KeyValue::new("messaging.operation.type", "settle"),
            KeyValue::new("messaging.operation.name", op.name()),
            KeyValue::new("messaging.message.id", job_id.to_owned()),
            KeyValue::new("leaseq.job.id", job_id.to_owned()),
        ];
        if let Some(q) = queue {
            attrs.push(KeyValue::new("messaging.destination.name", q.clone()));
            attrs.push(KeyValue::new("leaseq.queue", q));
        }
        let span = inner.start(name, SpanKind::Server, parent, None, attrs);
        JobSpan {
            span: Some(span),
            // An ack or nack ends this delivery (a retried job comes back as
            // a new one); an extension does not.
            forget: (op != Settle::Extend).then(|| (inner.clone(), job_id.to_owned())),
        }
    }

    /// The spans of a batch's jobs (none at all when off, so zipping them
    /// with the results does nothing).
    pub fn enqueues(
        &self,
        rpc: &'static str,
        caller: Option<&SpanContext>,
        jobs: &[NewJob],
    ) -> Vec<JobSpan> {
        match self.0 {
            Some(_) => jobs.iter().map(|j| self.enqueue(rpc, caller, j)).collect(),
            None => Vec::new(),
        }
    }

    /// The spans of several settles (none at all when off).
    pub fn settles<'a>(
        &self,
        rpc: &'static str,
        op: Settle,
        ids: impl IntoIterator<Item = &'a str>,
    ) -> Vec<JobSpan> {
        match self.0 {
            Some(_) => ids.into_iter().map(|id| self.settle(rpc, op, id)).collect(),
            None => Vec::new(),
        }
    }

    /// Exports what is left and stops the exporter (at the end of a drain).
    pub async fn shutdown(&self) {
        let Some(inner) = &self.0 else { return };
        let provider = inner.provider.clone();
        // Blocking: it waits for the batch thread's last export, which runs
        // on this runtime (OnRuntime), so not on one of its workers.
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) | Ok(Err(OTelSdkError::AlreadyShutdown)) => {}
            Ok(Err(e)) => warn!(error = %e, "flushing traces at shutdown"),
            Err(e) => warn!(error = %e, "flushing traces at shutdown"),
        }
    }
}

impl Inner {
    fn start(
        &self,
        name: String,
        kind: SpanKind,
        parent: Option<SpanContext>,
        link: Option<SpanContext>,
        attributes: Vec<KeyValue>,
    ) -> opentelemetry_sdk::trace::Span {
        let cx = match parent {
            Some(p) => Context::new().with_remote_span_context(p),
            None => Context::new(),
        };
        let mut builder = self
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes);
        if let Some(l) = link {
            builder = builder.with_links(vec![Link::with_context(l)]);
        }
        builder.start_with_context(&self.tracer, &cx)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        // A panic while holding it leaves a map that is still consistent.
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn job_attributes(
    rpc: &'static str,
    op: &'static str,
    queue: &str,
    id: Option<&str>,
) -> Vec<KeyValue> {
    let mut attrs = vec![
        KeyValue::new("rpc.system", "grpc"),
        KeyValue::new("rpc.service", "leaseq.v1.QueueService"),
        KeyValue::new("rpc.method", rpc),
        KeyValue::new("messaging.system", "leaseq"),
        KeyValue::new("messaging.operation.type", op),
        KeyValue::new("messaging.destination.name", queue.to_owned()),
        KeyValue::new("leaseq.queue", queue.to_owned()),
    ];
    if let Some(id) = id {
        attrs.push(KeyValue::new("messaging.message.id", id.to_owned()));
        attrs.push(KeyValue::new("leaseq.job.id", id.to_owned()));
    }
    attrs
}

/// One job's span in a call: ended by one of its methods, or when dropped
/// (a cancelled call) without a status.
pub struct JobSpan {
    span: Option<opentelemetry_sdk::trace::Span>,
    /// The delivery to forget once this settle succeeded.
    forget: Option<(Arc<Inner>, String)>,
}

impl JobSpan {
    pub fn none() -> JobSpan {
        JobSpan {
            span: None,
            forget: None,
        }
    }

    /// Ends an enqueue's span with its result.
    pub fn enqueued(mut self, result: Result<&crate::domain::Enqueued, &Error>) {
        if let (Some(span), Ok(e)) = (self.span.as_mut(), result) {
            span.set_attribute(KeyValue::new("leaseq.job.duplicate", e.duplicate));
            if e.duplicate {
                // The live job's id, not the one this request would have had.
                span.set_attribute(KeyValue::new("messaging.message.id", e.job_id.to_string()));
                span.set_attribute(KeyValue::new("leaseq.job.id", e.job_id.to_string()));
            }
        }
        self.end(result.err());
    }

    /// Ends a settle's span with its result.
    pub fn settled(mut self, error: Option<&Error>) {
        if error.is_none()
            && let Some((inner, id)) = self.forget.take()
        {
            inner.lock().remove(&id);
        }
        self.end(error);
    }

    /// Ends a nack's span, saying whether the job went to the dead letters.
    pub fn nacked(mut self, result: Result<bool, &Error>) {
        if let (Some(span), Ok(dead)) = (self.span.as_mut(), result) {
            span.set_attribute(KeyValue::new("leaseq.job.dead_lettered", dead));
        }
        self.settled(result.err());
    }

    fn end(mut self, error: Option<&Error>) {
        let Some(mut span) = self.span.take() else {
            return;
        };
        let status = error.map(|e| tonic::Status::from(e.clone()));
        let code = status.as_ref().map_or(tonic::Code::Ok, |s| s.code());
        span.set_attribute(KeyValue::new("rpc.grpc.status_code", code as i64));
        if let Some(s) = status {
            span.set_status(Status::error(s.message().to_owned()));
        }
        span.end();
    }
}

/// A Subscribe or Consume response stream whose deliveries get their
/// `deliver` spans as they leave.
pub struct Traced<S> {
    inner: S,
    traces: Traces,
    rpc: &'static str,
}

impl<S> Traced<S> {
    pub fn new(inner: S, traces: Traces, rpc: &'static str) -> Traced<S> {
        Traced { inner, traces, rpc }
    }
}

/// A response message that may carry deliveries.
pub trait CarriesDelivery {
    fn deliveries(&self) -> &[pb::Delivery];
}

impl CarriesDelivery for pb::SubscribeResponse {
    fn deliveries(&self) -> &[pb::Delivery] {
        use pb::subscribe_response::Kind;
        match &self.kind {
            Some(Kind::Delivery(d)) => std::slice::from_ref(d),
            Some(Kind::Deliveries(d)) => &d.deliveries,
            _ => &[],
        }
    }
}

impl CarriesDelivery for pb::ConsumeResponse {
    fn deliveries(&self) -> &[pb::Delivery] {
        use pb::consume_response::Kind;
        match &self.kind {
            Some(Kind::Delivery(d)) => std::slice::from_ref(d),
            Some(Kind::Deliveries(d)) => &d.deliveries,
            _ => &[],
        }
    }
}

impl<S, T> Stream for Traced<S>
where
    S: Stream<Item = Result<T, tonic::Status>> + Unpin,
    T: CarriesDelivery,
{
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<S::Item>> {
        let this = &mut *self;
        let next = Pin::new(&mut this.inner).poll_next(cx);
        if this.traces.is_on()
            && let Poll::Ready(Some(Ok(msg))) = &next
        {
            for d in msg.deliveries() {
                this.traces.delivered(this.rpc, d);
            }
        }
        next
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

/// The valid W3C trace context in a job's headers, if any.
fn parent_in(headers: &HashMap<String, String>) -> Option<SpanContext> {
    valid(TraceContextPropagator::new().extract(headers))
}

fn valid(cx: Context) -> Option<SpanContext> {
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// gRPC metadata read by the W3C propagator (`traceparent`, `tracestate`).
struct Metadata<'a>(&'a MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                KeyRef::Ascii(k) => Some(k.as_str()),
                KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// What a settle's span needs from the job's delivery.
#[derive(Clone, Debug)]
struct Delivered {
    queue: String,
    parent: Option<SpanContext>,
}

/// Recent deliveries by job id, in two generations: when the newer one is
/// full, the older one is dropped. Bounded whatever happens to the jobs (a
/// stream that closes, a lease that runs out, a settle on another replica),
/// with no timer and O(1) work per call.
#[derive(Default)]
struct Recent {
    newer: HashMap<String, Delivered>,
    older: HashMap<String, Delivered>,
}

impl Recent {
    fn insert(&mut self, id: String, d: Delivered) {
        if self.newer.len() >= RECENT {
            self.older = std::mem::take(&mut self.newer);
        }
        self.older.remove(&id);
        self.newer.insert(id, d);
    }

    fn get(&self, id: &str) -> Option<Delivered> {
        self.newer.get(id).or_else(|| self.older.get(id)).cloned()
    }

    fn remove(&mut self, id: &str) {
        if self.newer.remove(id).is_none() {
            self.older.remove(id);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.newer.len() + self.older.len()
    }
}

/// Runs the tonic exporter's exports on the broker's tokio runtime: the
/// SDK's batch processor calls `export` from its own thread (with a plain
/// executor), where tonic's I/O would find no reactor.
#[derive(Debug)]
struct OnRuntime {
    inner: Arc<opentelemetry_otlp::SpanExporter>,
    runtime: tokio::runtime::Handle,
}

impl SpanExporter for OnRuntime {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let inner = self.inner.clone();
        let task = self.runtime.spawn(async move { inner.export(batch).await });
        async move {
            task.await
                .unwrap_or_else(|e| Err(OTelSdkError::InternalFailure(e.to_string())))
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Called while the provider is built, before any export holds a clone.
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(resource);
        }
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        // The tonic exporter holds nothing that needs closing; its channel
        // goes with it.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(tp: &str) -> HashMap<String, String> {
        HashMap::from([("traceparent".to_owned(), tp.to_owned())])
    }

    #[test]
    fn a_job_header_traceparent_is_its_parent() {
        let sc = parent_in(&header(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ))
        .expect("valid");
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert!(parent_in(&header(bad)).is_none(), "{bad:?}");
        }
        assert!(parent_in(&HashMap::new()).is_none());
    }

    #[test]
    fn the_caller_traceparent_is_read_from_grpc_metadata() {
        let mut md = MetadataMap::new();
        md.insert(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                .parse()
                .unwrap(),
        );
        md.insert("tracestate", "vendor=v1".parse().unwrap());
        let cx = TraceContextPropagator::new().extract(&Metadata(&md));
        let sc = valid(cx).expect("valid");
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(sc.trace_state().get("vendor"), Some("v1"));
        // Off, nothing is read.
        assert!(Traces::off().caller(&md).is_none());
    }

    #[test]
    fn recent_deliveries_are_bounded_and_forgotten_when_settled() {
        let d = || Delivered {
            queue: "q".into(),
            parent: None,
        };
        let mut r = Recent::default();
        r.insert("a".into(), d());
        assert!(r.get("a").is_some());
        r.remove("a");
        assert!(r.get("a").is_none());
        for i in 0..(RECENT * 2 + 10) {
            r.insert(i.to_string(), d());
        }
        assert!(r.len() <= RECENT * 2, "{}", r.len());
        // The newest are still there, the oldest are gone.
        assert!(r.get(&(RECENT * 2 + 9).to_string()).is_some());
        assert!(r.get("0").is_none());
        // A redelivery moves the job to the newer generation, once.
        r.insert((RECENT * 2 + 9).to_string(), d());
        assert!(r.len() <= RECENT * 2);
    }

    #[tokio::test]
    async fn a_malformed_endpoint_is_refused_and_a_silent_collector_delays_nothing() {
        let cfg = |endpoint: &str| OtlpConfig {
            endpoint: endpoint.to_owned(),
            service_name: Some("test".into()),
        };
        let e = Traces::start(&cfg("not a url")).expect_err("refused");
        assert!(format!("{e:#}").contains("not a url"), "{e:#}");
        // Nothing listens there: spans are made and dropped, and the drain's
        // flush gives up within the export timeout.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let t = Traces::start(&cfg(&format!("http://127.0.0.1:{port}"))).expect("lazy");
        assert!(t.is_on());
        t.settle("Ack", Settle::Ack, "x").settled(None);
        let started = std::time::Instant::now();
        t.shutdown().await;
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn off_costs_nothing_and_records_nothing() {
        let t = Traces::off();
        assert!(!t.is_on());
        let delivery = pb::Delivery {
            job: Some(pb::Job {
                id: "x".into(),
                queue: "q".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        t.delivered("Consume", &delivery);
        t.settle("Ack", Settle::Ack, "x").settled(None);
    }
}
