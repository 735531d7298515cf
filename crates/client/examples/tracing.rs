// OpenTelemetry with `leaseq-client` (feature `otel`): a job enqueued inside
// a span carries that span's W3C trace context, and the worker runs its
// handler in a `process <queue>` consumer span, child of the producer's.
// Spans go to whatever tracer provider the program installs: in production
// an OTLP exporter (opentelemetry-otlp), here one that prints each span.
//
//     cargo run --release -- serve                                          # the broker
//     cargo run -p leaseq-client --features otel --example tracing          # this
//
// (tests/client.rs runs `traced_round_trip` against a real broker and checks
// the spans.)

use std::time::Duration;

use leaseq_client::{Client, Delivery, Job, Worker};
use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::{Span as _, TraceContextExt, Tracer};
use opentelemetry::{Context, global};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // LEASEQ_ADDR (default 127.0.0.1:50051), LEASEQ_TOKEN and the TLS
    // variables, as every leaseq client reads them.
    let client = Client::connect_env().await?;
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(Printer)
        .build();
    global::set_tracer_provider(provider.clone());
    let id = traced_round_trip(&client, "traced-emails").await?;
    println!("job {id} handled");
    provider.shutdown()?;
    Ok(())
}

/// Enqueues one job inside a span `signup`, then works it with a handler
/// that opens a span of its own; returns the job's id once it is acked.
/// Spans go to the global tracer provider.
pub async fn traced_round_trip(client: &Client, queue: &str) -> anyhow::Result<String> {
    // Producer: the enqueue runs in the context of the span `signup`; the
    // client writes that span's `traceparent` into the job's headers.
    let tracer = global::tracer("example-app");
    let cx = Context::current_with_span(tracer.start("signup"));
    let sent = client
        .enqueue(Job::new(queue, r#"{"to":"ada@example.com"}"#))
        .with_context(cx.clone())
        .await?;
    cx.span().end();

    // Worker: the handler runs in `process <queue>`, a child of `signup`;
    // spans it starts are children of that.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let done_tx = std::sync::Mutex::new(Some(done_tx));
    let worker = Worker::builder(client.clone()).handle(queue, move |job: Delivery| {
        let done = done_tx.lock().unwrap().take();
        async move {
            let mut span = global::tracer("example-app").start("send email");
            span.set_attribute(opentelemetry::KeyValue::new("job.id", job.id.clone()));
            span.end();
            if let Some(done) = done {
                let _ = done.send(());
            }
            Ok::<(), anyhow::Error>(())
        }
    });
    // Stop once the job was handled, and give its ack a moment to go out.
    worker
        .serve(async move {
            let _ = done_rx.await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        })
        .await?;
    Ok(sent.job_id)
}

/// Prints each finished span: name, trace, span and parent ids.
#[derive(Debug)]
struct Printer;

impl SpanExporter for Printer {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        for span in batch {
            println!(
                "{:<22} trace {} span {} parent {}",
                span.name,
                span.span_context.trace_id(),
                span.span_context.span_id(),
                span.parent_span_id
            );
        }
        Ok(())
    }
}
