'use strict';
// The worker's prefetch (issue 36): `concurrency` handlers at once on a
// stream whose credit is `prefetch`; jobs delivered beyond the running ones
// wait in the worker, their leases kept, dropped on a cancel, released at
// stop. Against a real broker process.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { AdminClient, Client, Worker } = require('@leaseq/client');
const { suiteBroker, queueName, deferred, Inbox, jobGone, quietLog, streamCounter } = require('../harness/helpers');

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
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('concurrency 2 with prefetch 8: at most 2 handlers run while up to 8 jobs are delivered', { timeout: 30000 }, async () => {
  const q = queueName();
  const total = 16;
  await client.enqueueBatch(Array.from({ length: total }, (_, i) => ({ queue: q, payload: String(i) })));
  const counter = streamCounter();
  const c = new Client(broker.addr, { interceptors: [counter.interceptor] });
  let running = 0;
  let peakRunning = 0;
  let peakHeld = 0; // delivered and not yet finished: waiting, running or settling
  let ended = 0;
  const allDone = deferred();
  const w = new Worker(c, [q], async () => {
    running += 1;
    peakRunning = Math.max(peakRunning, running);
    peakHeld = Math.max(peakHeld, counter.delivered - ended);
    await sleep(150); // the work
    running -= 1;
  }, { concurrency: 2, prefetch: 8, leaseMs: 5000, protocol: 'consume' });
  assert.deepEqual([w.concurrency, w.prefetch], [2, 8]);
  w.on('job', (e) => {
    assert.equal(e.outcome, 'ack');
    ended += 1;
    if (ended === total) allDone.resolve();
  });
  const run = w.run();
  try {
    await allDone.promise;
  } finally {
    w.stop();
    await run;
    c.close();
  }
  assert.equal(counter.opening[0].maxInFlight, 8); // the stream's credit
  assert.equal(peakRunning, 2);
  // More than the running handlers were delivered (the credit, full while
  // handlers sleep): what prefetch is for. With credit = concurrency this
  // stays at 2 (or 3 while an ack is on its way).
  assert.ok(peakHeld >= 8, `at most ${peakHeld} jobs held at once`);
  assert.equal(w.stats.acked, total);
});

test('waiting jobs keep their leases: a job that waits 2 leases long runs as attempt 1', { timeout: 30000 }, async () => {
  const q = queueName();
  const total = 4;
  await client.enqueueBatch(Array.from({ length: total }, (_, i) => ({ queue: q, payload: String(i) })));
  const attempts = [];
  const deliveredAtStart = [];
  const allDone = deferred();
  // One handler at a time, 700 ms each, all 4 delivered at once on a 1 s
  // lease: the last one waits 2.1 s for its slot.
  const w = new Worker(client, [q], async (job) => {
    attempts.push(job.attempt);
    deliveredAtStart.push(w.stats.delivered);
    await sleep(700);
  }, { concurrency: 1, prefetch: total, leaseMs: 1000 });
  const events = [];
  w.on('job', (e) => {
    events.push(e.outcome);
    if (events.length === total) allDone.resolve();
  });
  const run = w.run();
  try {
    await allDone.promise;
  } finally {
    w.stop();
    await run;
  }
  // All 4 were delivered while the first ran: the others waited.
  assert.deepEqual(deliveredAtStart.slice(1), [total, total, total]);
  assert.deepEqual(attempts, [1, 1, 1, 1]);
  assert.deepEqual(events, ['ack', 'ack', 'ack', 'ack']);
  assert.deepEqual([w.stats.delivered, w.stats.acked, w.stats.leaseLost], [total, total, 0]);
});

test('a cancelled waiting job never runs; stop releases the jobs still waiting', { timeout: 30000 }, async () => {
  const q = queueName();
  const started = new Inbox();
  const release = deferred();
  const w = new Worker(client, [q], async (job) => {
    started.put(job.text());
    if (job.text() === 'long') await release.promise;
  }, { concurrency: 1, prefetch: 4, leaseMs: 600_000, graceMs: 10_000, log: quietLog() });
  const events = new Inbox();
  w.on('job', (e) => events.put(e));
  const run = w.run();
  let rest;
  try {
    await client.enqueue(q, 'long');
    assert.equal(await started.get(), 'long');
    const cancelled = await client.enqueue(q, 'cancelled');
    rest = [await client.enqueue(q, 'left-1'), await client.enqueue(q, 'left-2')];
    // Delivered (prefetch 4) while 'long' holds the only slot.
    for (let i = 0; i < 50 && w.stats.delivered < 4; i++) await sleep(100);
    assert.equal(w.stats.delivered, 4);
    assert.deepEqual(await admin.cancelJob(cancelled.jobId), { wasLeased: true });
    const e = await events.get();
    assert.deepEqual([e.job.id, e.outcome, e.durationMs], [cancelled.jobId, 'cancelled', 0]);
    assert.ok(await jobGone(admin, cancelled.jobId));
    // Stop while 'long' runs: the two waiting jobs never run and are released
    // when the stream closes; 'long' finishes within the grace and is acked.
    const stopped = w.stop();
    release.resolve();
    await stopped;
  } finally {
    release.resolve();
    w.stop();
    await run;
  }
  const outcomes = [];
  for (let i = 0; i < 3; i++) {
    const e = await events.get();
    outcomes.push(`${e.job.text()}:${e.outcome}`);
  }
  assert.deepEqual(outcomes.sort(), ['left-1:abandoned', 'left-2:abandoned', 'long:ack']);
  const st = w.stats;
  assert.deepEqual([st.delivered, st.acked, st.cancelled, st.abandoned], [4, 1, 1, 2]);
  // Released, not held for their 600 s leases: another consumer gets them
  // (as attempt 2: the lease at the stopped worker was their first).
  const got = [];
  for await (const job of client.consume({ queues: [q], maxInFlight: 2 })) {
    got.push([job.id, job.attempt]);
    await job.ack();
    if (got.length === 2) break;
  }
  assert.deepEqual(got.sort(), rest.map((r) => [r.jobId, 2]).sort());
});

test('prefetch is validated; concurrency or maxInFlight alone also set the credit, as before', () => {
  const cases = [
    [{}, [16, 16]],
    [{ concurrency: 3 }, [3, 3]],
    [{ maxInFlight: 5 }, [5, 5]], // the old alias of concurrency
    [{ concurrency: 4, maxInFlight: 9 }, [4, 4]], // concurrency wins, as before
    [{ concurrency: 2, prefetch: 8 }, [2, 8]],
    [{ maxInFlight: 2, prefetch: 2 }, [2, 2]],
    [{ prefetch: 64 }, [16, 64]],
  ];
  for (const [opts, want] of cases) {
    const w = new Worker(client, opts);
    assert.deepEqual([w.concurrency, w.prefetch], want, JSON.stringify(opts));
  }
  const bad = [
    [{ concurrency: 4, prefetch: 2 }, /^prefetch: must be an integer of at least concurrency \(4\), not 2$/],
    [{ maxInFlight: 4, prefetch: 3 }, /^prefetch: must be an integer of at least maxInFlight \(4\), not 3$/],
    [{ prefetch: 8 }, /^prefetch: must be an integer of at least concurrency \(16\), not 8$/],
    [{ concurrency: 2, prefetch: 2.5 }, /^prefetch: .* not 2.5$/],
    [{ concurrency: 2, prefetch: 0 }, /^prefetch: /],
    [{ concurrency: 2, prefetch: '8' }, /^prefetch: /],
    [{ concurrency: 0 }, /^concurrency: must be an integer of at least 1, not 0$/],
    [{ maxInFlight: -1 }, /^maxInFlight: must be an integer of at least 1, not -1$/],
  ];
  for (const [opts, re] of bad) {
    assert.throws(() => new Worker(client, opts), (e) => e instanceof RangeError && re.test(e.message), JSON.stringify(opts));
  }
});
