'use strict';
// Issue 36: fewer messages per job, both ways, against the real broker.
// The broker packs deliveries that are ready together into one Deliveries
// message for a stream that accepts them (the SDK asks by default; a
// broker that does not know them says so by listing no features); the SDK
// coalesces the settles that finish together into one request. Counted
// through a grpc-js client interceptor (harness/helpers.js streamCounter).
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { AdminClient, Client, JobTimeoutError, Worker } = require('@leaseq/client');
const { suiteBroker, queueName, streamCounter, deferred } = require('../harness/helpers');
const { startPreBatchProxy } = require('../harness/pre-batch-proxy');

const N = 1000;
let broker;
let admin;
let old;
before(async () => {
  broker = await suiteBroker();
  admin = new AdminClient(broker.addr);
  old = await startPreBatchProxy(broker.addr);
});
after(async () => {
  admin.close();
  old.close();
  await broker.stop();
});

/** A queue with n jobs waiting (enqueued before any worker starts); their ids. */
async function filled(c, n) {
  const q = queueName();
  const ids = [];
  for (let i = 0; i < n; i += 500) {
    const batch = Array.from({ length: Math.min(500, n - i) }, (_, k) => ({ queue: q, payload: `job ${i + k}` }));
    for (const r of await c.enqueueBatch(batch)) ids.push(r.jobId);
  }
  return { q, ids };
}

/** Runs a worker over q until every one of ids was handled; the ids seen, in order. */
async function drain(c, q, ids, opts = {}) {
  const seen = [];
  const all = deferred();
  const w = new Worker(c, [q], async (job) => {
    seen.push(job.id);
    if (seen.length === ids.length) all.resolve();
  }, { concurrency: 256, ...opts });
  const run = w.run();
  await Promise.race([all.promise, run]);
  const features = w.features;
  await w.stop();
  await run;
  return { seen, features };
}

async function queueIsEmpty(q) {
  const { stats } = await admin.getQueue(q);
  return stats.available === 0 && stats.leased === 0 && stats.scheduled === 0;
}

test('a worker reads batched deliveries: several jobs a message, each handled once, all acked', { timeout: 60000 }, async () => {
  const counter = streamCounter();
  const c = new Client(broker.addr, { interceptors: [counter.interceptor] });
  try {
    const { q, ids } = await filled(c, N);
    const { seen, features } = await drain(c, q, ids);
    assert.ok(features.includes('deliveries'), `the broker lists "deliveries" among its features: ${JSON.stringify(features)}`);
    assert.deepEqual(counter.opening.map((s) => s.accept), [['deliveries']], 'the SDK asks for batched deliveries');
    assert.deepEqual([...seen].sort(), [...ids].sort(), 'every job handled exactly once');
    assert.equal(counter.delivered, N, 'no job delivered twice');
    assert.ok((counter.kinds.deliveries ?? 0) > 0, `some Deliveries messages: ${JSON.stringify(counter.kinds)}`);
    const messages = (counter.kinds.deliveries ?? 0) + (counter.kinds.delivery ?? 0);
    assert.ok(messages <= N / 4, `${N} jobs in ${messages} messages: batched`);
    assert.ok(await queueIsEmpty(q), 'every job acked');
  } finally {
    c.close();
  }
});

test('settles are coalesced: a worker draining N jobs writes far fewer than N requests', { timeout: 60000 }, async () => {
  const counter = streamCounter();
  const c = new Client(broker.addr, { interceptors: [counter.interceptor] });
  try {
    const { q, ids } = await filled(c, N);
    await drain(c, q, ids);
    assert.equal(counter.acks, N, 'one ack per job, on the stream');
    assert.ok(counter.writes <= N / 10, `${N} acks in ${counter.writes} writes`);
    assert.ok(await queueIsEmpty(q), 'every job acked');
  } finally {
    c.close();
  }
});

test('batchDeliveries: false asks for none: one delivery a message, as an older client', { timeout: 60000 }, async () => {
  const counter = streamCounter();
  const c = new Client(broker.addr, { interceptors: [counter.interceptor] });
  try {
    const n = 300;
    const { q, ids } = await filled(c, n);
    const { seen } = await drain(c, q, ids, { batchDeliveries: false });
    assert.deepEqual(counter.opening.map((s) => s.accept), [undefined], 'no accept sent');
    assert.equal(counter.kinds.deliveries, undefined, 'no Deliveries message');
    assert.equal(counter.kinds.delivery, n, 'one message per delivery');
    assert.deepEqual([...seen].sort(), [...ids].sort());
    assert.ok(await queueIsEmpty(q), 'every job acked');
  } finally {
    c.close();
  }
});

test('a broker from before batched deliveries (no features, one delivery a message): the worker drains it all', { timeout: 60000 }, async () => {
  const counter = streamCounter();
  const c = new Client(old.addr, { interceptors: [counter.interceptor] });
  try {
    const { q, ids } = await filled(c, N);
    const { seen, features } = await drain(c, q, ids);
    assert.deepEqual(features, [], 'an older broker lists no features');
    assert.deepEqual(counter.opening.map((s) => s.accept), [['deliveries']], 'asked all the same');
    assert.equal(counter.kinds.deliveries, undefined, 'no Deliveries message');
    assert.equal(counter.kinds.delivery, N, 'one message per delivery');
    assert.deepEqual([...seen].sort(), [...ids].sort(), 'every job handled exactly once');
    assert.equal(counter.acks, N);
    // One delivery a message, through a proxy: fewer handlers finish in one
    // turn of the event loop, but still more than one a write.
    assert.ok(counter.writes < N / 2, `${N} acks in ${counter.writes} writes`);
    assert.ok(await queueIsEmpty(q), 'every job acked');
  } finally {
    c.close();
  }
});

test('consume(): batched deliveries, acked through the promise API', { timeout: 60000 }, async () => {
  const counter = streamCounter();
  const c = new Client(broker.addr, { interceptors: [counter.interceptor] });
  try {
    const n = 600;
    const { q, ids } = await filled(c, n);
    const stream = c.consume({ queues: [q], maxInFlight: 256 });
    const seen = [];
    const acks = [];
    for await (const job of stream) {
      seen.push(job.id);
      acks.push(job.ack());
      if (seen.length === n) break;
    }
    await Promise.all(acks);
    assert.ok(stream.features.includes('deliveries'));
    assert.deepEqual([...seen].sort(), [...ids].sort());
    assert.ok((counter.kinds.deliveries ?? 0) > 0, JSON.stringify(counter.kinds));
    assert.ok(counter.writes < n / 4, `${n} acks in ${counter.writes} writes`);
    assert.ok(await queueIsEmpty(q));
  } finally {
    c.close();
  }
});

test('plain-function handlers (no promise) ack and nack; a signal read after the timeout is already aborted', { timeout: 60000 }, async () => {
  const c = new Client(broker.addr);
  try {
    const q = queueName();
    await c.enqueueBatch([{ queue: q, payload: 'ok' }, { queue: q, payload: 'throw' }, { queue: q, payload: 'slow' }]);
    const late = deferred();
    const events = [];
    const three = deferred();
    const w = new Worker(c, { concurrency: 4, timeoutMs: 300 });
    w.handle(q, (job, ctx) => {
      const p = job.text();
      if (p === 'throw') throw new Error('sync failure');
      if (p === 'slow') {
        // Reads the signal only after its timeout ran out.
        return new Promise((resolve) => setTimeout(() => {
          late.resolve([ctx.signal.aborted, ctx.signal.reason]);
          resolve();
        }, 800));
      }
      return 'fine';
    });
    w.on('job', (e) => {
      if (e.job.attempt === 1) events.push([e.job.text(), e.outcome, e.error]);
      if (events.length === 3) three.resolve();
    });
    const run = w.run();
    await three.promise;
    const [aborted, reason] = await late.promise;
    await w.stop();
    await run;
    events.sort();
    assert.deepEqual(events, [
      ['ok', 'ack', undefined],
      ['slow', 'timeout', 'timeout: the handler did not finish within 300 ms'],
      ['throw', 'nack', 'sync failure'],
    ]);
    assert.equal(aborted, true);
    assert.ok(reason instanceof JobTimeoutError);
  } finally {
    c.close();
  }
});
