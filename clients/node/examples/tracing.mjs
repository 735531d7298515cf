// Traces that follow a job: enqueue writes the active span's traceparent
// into the job's headers; the worker runs the handler in a span that is its
// child (attributes: leaseq.queue, leaseq.job.id, leaseq.job.attempt).
// Tracing is on when @opentelemetry/api is installed and an SDK registered;
// a real program would use @opentelemetry/sdk-node with an OTLP exporter.
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider } from '@opentelemetry/sdk-trace-base';
import { Client, Worker } from '@leaseq/client';

trace.setGlobalTracerProvider(new BasicTracerProvider());
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
const tracer = trace.getTracer('checkout-service');

const client = new Client(process.env.LEASEQ_ADDR ?? '127.0.0.1:50051');
const queue = process.env.QUEUE ?? 'receipts';

await tracer.startActiveSpan('checkout', async (span) => {
  await client.enqueue(queue, 'order 42'); // carries this span's context
  console.log(`producer trace ${span.spanContext().traceId}`);
  span.end();
});

const worker = new Worker(client, { concurrency: 1 });
worker.handle(queue, async () => {
  const span = trace.getActiveSpan(); // "<queue> process", child of "checkout"
  console.log(`handler trace ${span.spanContext().traceId}`);
  void worker.stop(); // one job is enough here
});
await worker.run();
client.close();
