// The worker of tests/traces.rs (run by it, not by `node --test`): handles
// one job of $QUEUE with the package's Worker, its handler span exported over
// OTLP/gRPC to $OTLP_ENDPOINT, and prints that span's ids as JSON.
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-grpc';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { Client, Worker } from '@leaseq/client';

const provider = new BasicTracerProvider({
  resource: resourceFromAttributes({ 'service.name': 'node-worker' }),
  spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter({ url: process.env.OTLP_ENDPOINT }))],
});
trace.setGlobalTracerProvider(provider);
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

const client = new Client(process.env.LEASEQ_ADDR);
const worker = new Worker(client, { concurrency: 1 });
let seen;
worker.handle(process.env.QUEUE, async (job) => {
  const span = trace.getActiveSpan(); // "<queue> process", a child of the job's traceparent
  const sc = span.spanContext();
  seen = { trace_id: sc.traceId, span_id: sc.spanId, job_id: job.id, traceparent: job.headers.traceparent };
  void worker.stop(); // one job; the stop lets it settle first
});
await worker.run();
client.close();
console.log(JSON.stringify(seen));
await provider.shutdown(); // exports the spans before exiting (rejects if it cannot)
