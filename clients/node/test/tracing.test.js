'use strict';
// Trace context through job headers: enqueue writes the active span's
// traceparent / tracestate; the worker's handler span is its child. The OTel
// SDK's in-memory exporter collects the spans.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const otel = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { AdminClient, Client, Worker } = require('@leaseq/client');
const { suiteBroker, queueName, Inbox, quietLog, eventually } = require('../harness/helpers');

const { trace, context, SpanKind, SpanStatusCode } = otel;
const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
trace.setGlobalTracerProvider(provider);
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
const tracer = trace.getTracer('leaseq-node-tests');

let broker;
let client;
let admin;
before(async () => {
  broker = await suiteBroker();
  client = new Client(broker.addr);
  admin = new AdminClient(client);
});
after(async () => {
  client.close();
  await broker.stop();
  await provider.shutdown();
});

/** Works `q` with `handler` until `n` jobs were settled; returns the worker's events. */
async function work(q, n, handler) {
  const w = new Worker(client, { log: quietLog() }).handle(q, handler);
  const events = new Inbox();
  w.on('job', (e) => events.put(e));
  const run = w.run();
  const got = [];
  for (let i = 0; i < n; i++) got.push(await events.get());
  await w.stop();
  await run;
  return got;
}

const spansNamed = (name) => exporter.getFinishedSpans().filter((s) => s.name === name);

test('enqueue carries traceparent; the handler span is its child, with queue, job id and attempt', { timeout: 30000 }, async () => {
  const q = queueName();
  let producer;
  const { jobId } = await tracer.startActiveSpan('checkout', async (span) => {
    producer = span.spanContext();
    try {
      return await client.enqueue(q, 'order 42');
    } finally {
      span.end();
    }
  });
  const job = await admin.getJob(jobId);
  assert.equal(job.headers.traceparent, `00-${producer.traceId}-${producer.spanId}-01`);

  let inHandler;
  await work(q, 1, async () => {
    inHandler = trace.getActiveSpan()?.spanContext();
    // Spans the handler starts are children of the job's span.
    tracer.startSpan('send-email').end();
  });

  const [processSpan] = await eventually(() => spansNamed(`${q} process`).length === 1 && spansNamed(`${q} process`), 5000, 'process span');
  assert.equal(processSpan.kind, SpanKind.CONSUMER);
  assert.equal(processSpan.spanContext().traceId, producer.traceId);
  assert.equal(processSpan.parentSpanContext.spanId, producer.spanId);
  assert.equal(processSpan.parentSpanContext.isRemote, true);
  assert.deepEqual(inHandler, processSpan.spanContext());
  assert.equal(processSpan.attributes['leaseq.queue'], q);
  assert.equal(processSpan.attributes['leaseq.job.id'], jobId);
  assert.equal(processSpan.attributes['leaseq.job.attempt'], 1);
  assert.equal(processSpan.attributes['messaging.system'], 'leaseq');
  assert.equal(processSpan.attributes['leaseq.outcome'], 'ack');
  const child = spansNamed('send-email').find((s) => s.parentSpanContext?.spanId === processSpan.spanContext().spanId);
  assert.ok(child, 'the handler span parents the spans the handler starts');
});

test('tracestate travels too; a failed attempt marks its span as an error', { timeout: 30000 }, async () => {
  const q = queueName();
  const parent = {
    traceId: '0af7651916cd43dd8448eb211c80319c',
    spanId: 'b7ad6b7169203331',
    traceFlags: 1,
    isRemote: true,
    traceState: otel.createTraceState('vendor=abc,other=1'),
  };
  const ctx = trace.setSpanContext(context.active(), parent);
  const { jobId } = await context.with(ctx, () => client.enqueue(q, 'x'));
  const headers = (await admin.getJob(jobId)).headers;
  assert.equal(headers.traceparent, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01');
  assert.equal(headers.tracestate, 'vendor=abc,other=1');

  await work(q, 2, async (job) => {
    if (job.attempt === 1) throw new Error('smtp down');
  });
  const spans = spansNamed(`${q} process`).sort((a, b) => a.attributes['leaseq.job.attempt'] - b.attributes['leaseq.job.attempt']);
  assert.equal(spans.length, 2);
  for (const s of spans) {
    assert.equal(s.spanContext().traceId, parent.traceId);
    assert.equal(s.parentSpanContext.spanId, parent.spanId);
    assert.equal(s.parentSpanContext.traceState.serialize(), 'vendor=abc,other=1');
  }
  assert.deepEqual(spans.map((s) => [s.attributes['leaseq.job.attempt'], s.status.code, s.attributes['leaseq.outcome']]), [
    [1, SpanStatusCode.ERROR, 'nack'],
    [2, SpanStatusCode.UNSET, 'ack'],
  ]);
  assert.equal(spans[0].status.message, 'smtp down');
});

test('no active span, an explicit traceparent, or propagateTrace false: headers left alone', { timeout: 30000 }, async () => {
  const q = queueName();
  const plain = await client.enqueue(q, 'x');
  assert.equal((await admin.getJob(plain.jobId)).headers.traceparent, undefined);
  const mine = '00-11111111111111111111111111111111-2222222222222222-00';
  const off = new Client(broker.addr, { propagateTrace: false });
  try {
    const [explicit, disabled] = await tracer.startActiveSpan('producer', async (span) => {
      try {
        return [
          await client.enqueue(q, 'y', { headers: { traceparent: mine } }),
          await off.enqueue(q, 'z'),
        ];
      } finally {
        span.end();
      }
    });
    assert.equal((await admin.getJob(explicit.jobId)).headers.traceparent, mine);
    assert.deepEqual((await admin.getJob(disabled.jobId)).headers, {});
  } finally {
    off.close();
  }
  await admin.purgeQueue(q);
});
