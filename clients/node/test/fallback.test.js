'use strict';
// The fallback for brokers without Consume: through a pass-through proxy
// that knows only the older QueueService methods (harness/old-api-proxy.js),
// the client's Consume is answered UNIMPLEMENTED and it consumes with
// Subscribe, acks in AckBatch calls, nacks and extensions as unary calls,
// all against the real broker behind the proxy.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { AdminClient, Client, Retry, Worker } = require('@leaseq/client');
const { suiteBroker, queueName, callCounter, quietLog, jobGone, deferred } = require('../harness/helpers');
const { startOldApiProxy } = require('../harness/old-api-proxy');

let broker;
let proxy;
let admin;
before(async () => {
  broker = await suiteBroker();
  proxy = await startOldApiProxy(broker.addr);
  admin = new AdminClient(broker.addr);
});
after(async () => {
  admin.close();
  proxy.close();
  await broker.stop();
});

test('enqueue(): UNIMPLEMENTED Produce falls back to unary Enqueue, told once', { timeout: 30000 }, async () => {
  const calls = callCounter();
  const c = new Client(proxy.addr, { interceptors: [calls.interceptor] });
  try {
    const q = queueName();
    const sent = await Promise.all(Array.from({ length: 10 }, (_, i) => c.enqueue(q, `p${i}`)));
    assert.equal(new Set(sent.map((r) => r.jobId)).size, 10);
    await c.enqueue(q, 'later');
    assert.deepEqual(calls.counts, { Produce: 1, Enqueue: 11 });
    const info = await admin.getQueue(q);
    assert.equal(info.stats.available, 11);
  } finally {
    c.close();
  }
});

test('consume(): UNIMPLEMENTED Consume falls back to Subscribe + AckBatch', { timeout: 30000 }, async () => {
  const calls = callCounter();
  const log = quietLog();
  const c = new Client(proxy.addr, { interceptors: [calls.interceptor] });
  try {
    const q = queueName();
    const sent = await c.enqueueBatch(['a', 'b', 'c', 'd'].map((p) => ({ queue: q, payload: p })));
    const stream = c.consume({ queues: [q], maxInFlight: 4, log });
    const jobs = [];
    for await (const job of stream) {
      jobs.push(job);
      if (jobs.length === 4) {
        await Promise.all([jobs[0].ack(), jobs[1].ack(), jobs[2].ack()]);
        assert.equal(await jobs[3].nack('once more', { retryAfterMs: 0 }), false);
      } else if (jobs.length === 5) {
        assert.equal(job.attempt, 2);
        await job.extendLease(20000);
        await job.ack();
        break;
      }
    }
    assert.equal(stream.protocol, 'subscribe');
    for (const r of sent) assert.ok(await jobGone(admin, r.jobId));
    assert.equal(calls.counts.Consume, 1, 'Consume tried first');
    assert.equal(calls.counts.Subscribe, 1, 'then Subscribe');
    assert.ok(calls.counts.AckBatch >= 2 && calls.counts.AckBatch <= 4, `AckBatch calls: ${calls.counts.AckBatch}`);
    assert.equal(calls.counts.Ack ?? 0, 0);
    assert.equal(calls.counts.Nack, 1);
    assert.equal(calls.counts.ExtendLease, 1);
    assert.deepEqual(log.lines, [], 'the fallback is no warning');
  } finally {
    c.close();
  }
});

test('Worker: the same fallback, with outcomes, extensions and a graceful stop', { timeout: 30000 }, async () => {
  const calls = callCounter();
  const c = new Client(proxy.addr, { interceptors: [calls.interceptor] });
  try {
    const q = queueName();
    const { jobId } = await c.enqueue(q, 'x');
    const done = deferred();
    const w = new Worker(c, { leaseMs: 1000, log: quietLog() }).handle(q, async (job) => {
      if (job.attempt === 1) return new Retry({ after: 0 });
      await new Promise((r) => setTimeout(r, 1200)); // outlives the 1 s lease: extended
      done.resolve();
      return undefined;
    });
    const outcomes = [];
    w.on('job', (e) => outcomes.push(e.outcome));
    const run = w.run();
    await done.promise;
    await w.stop();
    await run;
    assert.equal(w.protocol, 'subscribe');
    assert.deepEqual(outcomes, ['retry', 'ack']);
    assert.ok(await jobGone(admin, jobId));
    assert.equal(calls.counts.Nack, 1);
    assert.ok(calls.counts.ExtendLease >= 1);
    assert.equal(calls.counts.AckBatch, 1);
  } finally {
    c.close();
  }
});
