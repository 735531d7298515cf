//! OpenTelemetry for the client (feature `otel`): enqueue carries the
//! caller's current span as W3C trace context in the job's headers, and the
//! worker runs each handler inside a consumer span that is a child of the
//! producer's span, the way the Python and Node workers do.
//!
//! The spans go to the global tracer provider
//! (`opentelemetry::global::set_tracer_provider`), under the instrumentation
//! scope `leaseq-client`; without one they are no-ops. The headers are
//! written as W3C trace context whatever the global propagator is: that is
//! what the broker and the other SDKs read.

use std::collections::HashMap;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer,
};
use opentelemetry::{Context, KeyValue, global};

use crate::Delivery;
use crate::outcome::{NackKind, Outcome};
use crate::trace::{TRACEPARENT, TRACESTATE, TraceParent};

/// The instrumentation scope of the worker's spans.
pub const SCOPE: &str = "leaseq-client";

/// Writes the current span's context into `headers` (`traceparent`, and
/// `tracestate` when it has one), unless the caller set a `traceparent`
/// already or there is no valid current span.
pub(crate) fn inject_current(headers: &mut HashMap<String, String>) {
    if headers.contains_key(TRACEPARENT) {
        return;
    }
    let cx = Context::current();
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return;
    }
    let tp = TraceParent {
        trace_id: sc.trace_id().to_bytes(),
        parent_id: sc.span_id().to_bytes(),
        flags: sc.trace_flags().to_u8(),
    };
    headers.insert(TRACEPARENT.to_owned(), tp.to_string());
    let state = sc.trace_state().header();
    if !state.is_empty() {
        headers.insert(TRACESTATE.to_owned(), state);
    }
}

/// The producer's context from the job's headers: a remote parent, or an
/// empty context (the handler's span is then a root) when the job has no
/// well-formed `traceparent`.
fn producer_context(job: &Delivery) -> Context {
    match job.trace_parent() {
        Some(tp) => {
            let state = job
                .tracestate()
                .and_then(|s| s.parse::<TraceState>().ok())
                .unwrap_or_default();
            Context::new().with_remote_span_context(SpanContext::new(
                TraceId::from_bytes(tp.trace_id),
                SpanId::from_bytes(tp.parent_id),
                TraceFlags::new(tp.flags),
                true,
                state,
            ))
        }
        None => Context::new(),
    }
}

/// The context a job's handler runs in: a span `process <queue>` of kind
/// Consumer, child of the producer's span, with the messaging attributes of
/// OpenTelemetry's semantic conventions. It ends when the job task ends.
pub(crate) fn handler_context(job: &Delivery) -> Context {
    let parent = producer_context(job);
    let tracer = global::tracer(SCOPE);
    let span = tracer
        .span_builder(format!("process {}", job.queue))
        .with_kind(SpanKind::Consumer)
        .with_attributes([
            KeyValue::new("messaging.system", "leaseq"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.destination.name", job.queue.clone()),
            KeyValue::new("messaging.message.id", job.id.clone()),
            KeyValue::new("leaseq.attempt", i64::from(job.attempt)),
        ])
        .start_with_context(&tracer, &parent);
    parent.with_span(span)
}

/// Records how the job ended on the current span: `leaseq.outcome` (ack,
/// nack, retry, dead_letter, timeout, panic, lease_lost, not_started) and
/// an error status for everything but an ack.
pub(crate) fn record(outcome: Option<&Outcome>, lease_lost: bool) {
    let cx = Context::current();
    let span = cx.span();
    let (name, error) = match (outcome, lease_lost) {
        (_, true) => (
            "lease_lost",
            Some("lease lost while the handler ran".to_owned()),
        ),
        (None, false) => ("not_started", None),
        (Some(Outcome::Ack(_)), false) => ("ack", None),
        (Some(Outcome::Nack(n)), false) => (
            match n.kind {
                NackKind::Failed => "nack",
                NackKind::Retry => "retry",
                NackKind::DeadLetter => "dead_letter",
                NackKind::Timeout => "timeout",
                NackKind::Panic => "panic",
            },
            Some(n.error.clone()),
        ),
    };
    span.set_attribute(KeyValue::new("leaseq.outcome", name));
    match error {
        Some(e) => span.set_status(Status::error(e)),
        None if name == "ack" => span.set_status(Status::Ok),
        None => {}
    }
}
