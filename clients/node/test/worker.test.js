'use strict';
// Worker behaviour against a real broker process.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { Client, Worker, status } = require('@leaseq/client');
const { Broker, suiteBroker, queueName, firstDelivery, deferred, Inbox, retryUnavailable } = require('../harness/helpers');

let broker;
let client;
before(async () => {
  broker = await suiteBroker();
  client = new Client(broker.addr);
});
after(async () => {
  client.close();
  await broker.stop();
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Warnings are expected in several tests (reconnects, lost leases): keep them
// out of the test output but available to assertions.
function quiet() {
  const lines = [];
  const waiters = [];
  return {
    lines,
    warn(...a) {
      const line = a.join(' ');
      lines.push(line);
      for (const w of waiters) if (w.re.test(line)) w.resolve(line);
    },
    /** Resolves once a warning matching `re` was logged. */
    waitFor(re) {
      const seen = lines.find((l) => re.test(l));
      return seen ? Promise.resolve(seen) : new Promise((resolve) => waiters.push({ re, resolve }));
    },
  };
}

// Whether the job enqueued with `dedupKey` was acked or dead-lettered: only
// then is its key free again (a waiting or leased job keeps it).
async function jobIsGone(c, q, dedupKey) {
  const again = await c.enqueue(q, 'probe', { dedupKey });
  return !again.duplicate;
}

test('handler success acks', { timeout: 30000 }, async () => {
  const q = queueName();
  const r = await client.enqueue(q, 'hello', { dedupKey: 'one' });
  const got = new Inbox();
  const w = new Worker(client, [q], async (job) => got.put(job), { maxInFlight: 2, leaseMs: 5000 });
  const running = w.run();
  const job = await got.get();
  assert.deepEqual([job.id, job.payload.toString(), job.attempt], [r.jobId, 'hello', 1]);
  w.stop();
  await running; // a graceful stop settles before resolving
  assert.ok(await jobIsGone(client, q, 'one'));
  // And a second consumer gets the probe, not the acked job.
  assert.equal((await firstDelivery(client, q)).payload.toString(), 'probe');
});

test('handler exception nacks with its message', { timeout: 30000 }, async () => {
  const q = queueName();
  const r = await client.enqueue(q, 'flaky');
  const attempts = new Inbox();
  const w = new Worker(client, [q], async (job) => {
    attempts.put(job);
    if (job.attempt === 1) throw new Error('disk on fire');
  }, { leaseMs: 5000 });
  const running = w.run();
  const first = await attempts.get();
  // Redelivered after the queue's default backoff (about 1 s).
  const second = await attempts.get();
  w.stop();
  await running;
  assert.deepEqual([first.id, first.attempt, first.lastError], [r.jobId, 1, '']);
  assert.deepEqual([second.id, second.attempt, second.lastError], [r.jobId, 2, 'disk on fire']);
});

test('lease is extended while a slow handler runs', { timeout: 30000 }, async () => {
  const q = queueName();
  await client.enqueue(q, 'slow', { dedupKey: 'slow' });
  const deliveries = [];
  const done = deferred();
  const handler = async (job) => {
    deliveries.push(job);
    if (deliveries.length === 1) {
      await sleep(2500); // the work: 2.5 leases long
      done.resolve();
    }
  };
  // Two workers: had the 1 s lease lapsed, the job would have gone to the
  // idle one (or back to the first) with attempt 2.
  const workers = [0, 1].map(() => new Worker(client, [q], handler, { maxInFlight: 1, leaseMs: 1000 }));
  const runs = workers.map((w) => w.run());
  await done.promise;
  workers.forEach((w) => w.stop());
  await Promise.all(runs);
  assert.deepEqual(deliveries.map((j) => j.attempt), [1]);
  assert.ok(await jobIsGone(client, q, 'slow'));
});

test('concurrency never exceeds maxInFlight', { timeout: 30000 }, async () => {
  const q = queueName();
  const total = 15;
  const limit = 3;
  await client.enqueueBatch(Array.from({ length: total }, (_, i) => ({ queue: q, payload: String(i) })));
  let running = 0;
  let peak = 0;
  let finished = 0;
  const allDone = deferred();
  const w = new Worker(client, [q], async () => {
    running += 1;
    peak = Math.max(peak, running);
    await sleep(100); // the work
    running -= 1;
    finished += 1;
    if (finished === total) allDone.resolve();
  }, { maxInFlight: limit, leaseMs: 5000 });
  const run = w.run();
  await allDone.promise;
  w.stop();
  await run;
  // Reaching the limit shows the bound is what held it back.
  assert.equal(peak, limit);
});

test('stop lets running handlers finish and settle', { timeout: 30000 }, async () => {
  const q = queueName();
  await client.enqueue(q, 'x', { dedupKey: 'x' });
  const started = deferred();
  let finished = false;
  const w = new Worker(client, [q], async () => {
    started.resolve();
    await sleep(1000);
    finished = true;
  }, { leaseMs: 5000, graceMs: 10000 });
  const run = w.run();
  await started.promise;
  w.stop();
  await run;
  assert.ok(finished);
  assert.ok(await jobIsGone(client, q, 'x'));
});

test('stop grace aborts a stuck handler and its job is released', { timeout: 30000 }, async () => {
  const q = queueName();
  const r = await client.enqueue(q, 'stuck');
  const started = deferred();
  const aborted = deferred();
  const log = quiet();
  const w = new Worker(client, [q], (job, { signal }) => {
    started.resolve();
    signal.addEventListener('abort', () => aborted.resolve(signal.reason));
    return new Promise(() => {}); // never finishes by itself
  }, { leaseMs: 30000, graceMs: 500, log });
  const run = w.run();
  await started.promise;
  w.stop();
  await run;
  assert.match((await aborted.promise).message, /grace/);
  // Released when the stream closed, long before its 30 s lease.
  const again = await firstDelivery(client, q);
  assert.deepEqual([again.id, again.attempt], [r.jobId, 2]);
});

test('worker survives a broker restart', { timeout: 90000 }, async () => {
  const own = await Broker.start();
  const c = new Client(own.addr);
  let w;
  try {
    const q = queueName();
    const got = new Inbox();
    const log = quiet();
    w = new Worker(c, [q], async (job) => got.put(job), {
      leaseMs: 5000, backoffInitialMs: 50, backoffMaxMs: 500, log,
    });
    let ended = false;
    const run = w.run().finally(() => (ended = true));
    await c.enqueue(q, 'before');
    assert.equal((await got.get()).payload.toString(), 'before');

    // SIGTERM drains (streams end with UNAVAILABLE); same port again.
    assert.equal(await own.stop(), 0);
    await own.start();

    await retryUnavailable(() => c.enqueue(q, 'after', { dedupKey: 'after' }));
    // "before" may come again first: if the restart beat its Ack, the drain
    // released it (at-least-once).
    while ((await got.get()).payload.toString() !== 'after');
    assert.equal(ended, false);
    assert.ok(log.lines.some((l) => /reconnecting/.test(l)), 'the worker saw the stream end');
    w.stop();
    await run;
    assert.ok(await jobIsGone(c, q, 'after'));
  } finally {
    w?.stop();
    c.close();
    await own.stop();
  }
});

test('worker with a bad queue name fails fast', { timeout: 30000 }, async () => {
  const w = new Worker(client, ['no spaces allowed'], async () => {});
  await assert.rejects(w.run(), (err) => {
    assert.equal(err.code, status.INVALID_ARGUMENT);
    assert.match(err.details, /queues/);
    return true;
  });
});

test('a silent stream is reopened', { timeout: 60000 }, async () => {
  const own = await Broker.start();
  const c = new Client(own.addr);
  let w;
  try {
    const q = queueName();
    const got = new Inbox();
    const log = quiet();
    w = new Worker(c, [q], async (job) => got.put(job), {
      leaseMs: 5000, idleTimeoutMs: 3000, backoffInitialMs: 50, backoffMaxMs: 500, log,
    });
    const run = w.run();
    await c.enqueue(q, 'before');
    assert.equal((await got.get()).payload.toString(), 'before');

    // A hung broker: the connection stays up, heartbeats stop.
    own.child.kill('SIGSTOP');
    try {
      await log.waitFor(/no message on the stream/);
    } finally {
      own.child.kill('SIGCONT');
    }

    await retryUnavailable(() => c.enqueue(q, 'after'));
    while ((await got.get()).payload.toString() !== 'after');
    w.stop();
    await run;
  } finally {
    w?.stop();
    c.close();
    await own.stop();
  }
});
