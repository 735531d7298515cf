'use strict';
// Worker: handlers per queue, outcomes (Retry, DeadLetter, errors), the job
// timeout and its AbortSignal, lost leases; against a real broker.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const {
  AdminClient, Client, DeadLetter, JobTimeoutError, LeaseLostError, Retry, Worker,
} = require('@leaseq/client');
const { suiteBroker, queueName, deferred, Inbox, quietLog, jobGone, eventually, untold } = require('../harness/helpers');

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

/** Runs `worker` until `done` resolves, then stops it; returns the 'job' events. */
async function runUntil(worker, done) {
  const events = [];
  worker.on('job', (e) => events.push(e));
  const run = worker.run();
  try {
    await Promise.race([done, run.then(() => assert.fail('run() ended early'))]);
  } finally {
    await worker.stop();
  }
  await run;
  return events;
}

test('handlers per queue: each queue its own handler', { timeout: 30000 }, async () => {
  const [qa, qb] = [queueName('a'), queueName('b')];
  await client.enqueue(qa, 'for a');
  await client.enqueue(qb, 'for b');
  const got = new Inbox();
  const log = quietLog();
  const w = new Worker(client, { concurrency: 2, log })
    .handle(qa, async (job) => got.put(['a', job.text()]))
    .handle(qb, async (job) => got.put(['b', job.text()]));
  const events = await runUntil(w, Promise.all([got.get(), got.get()]).then((xs) => {
    assert.deepEqual(xs.sort(), [['a', 'for a'], ['b', 'for b']]);
  }));
  assert.deepEqual(events.map((e) => e.outcome), ['ack', 'ack']);
  assert.deepEqual(log.lines, []);
});

test('Retry({after}) thrown or returned: back after that delay, with its reason', { timeout: 30000 }, async () => {
  const [q1, q2] = [queueName(), queueName()];
  const a = await client.enqueue(q1, 'thrown');
  const b = await client.enqueue(q2, 'returned');
  const seen = new Inbox();
  const handler = async (job) => {
    seen.put({ id: job.id, attempt: job.attempt, lastError: job.lastError, at: Date.now() });
    if (job.attempt > 1) return undefined;
    const retry = new Retry({ after: 1500, reason: `later (${job.text()})` });
    if (job.text() === 'thrown') throw retry;
    return retry;
  };
  const w = new Worker(client, [q1, q2], handler, { log: quietLog() });
  const deliveries = [];
  const events = await runUntil(w, (async () => {
    for (let i = 0; i < 4; i++) deliveries.push(await seen.get());
  })());
  for (const [id, text] of [[a.jobId, 'thrown'], [b.jobId, 'returned']]) {
    const [first, second] = deliveries.filter((d) => d.id === id);
    assert.deepEqual([first.attempt, second.attempt], [1, 2]);
    assert.equal(second.lastError, `later (${text})`);
    assert.ok(second.at - first.at >= 1400, `retried after ${second.at - first.at} ms, asked 1500`);
    assert.ok(await jobGone(admin, id));
  }
  assert.deepEqual(events.map((e) => e.outcome).sort(), ['ack', 'ack', 'retry', 'retry']);
});

test('DeadLetter thrown or returned: in the dead letters with its reason', { timeout: 30000 }, async () => {
  const q = queueName();
  const a = await client.enqueue(q, 'thrown');
  const b = await client.enqueue(q, 'returned');
  const w = new Worker(client, { log: quietLog() }).handle(q, async (job) => {
    if (job.text() === 'thrown') throw new DeadLetter('bad payload (thrown)');
    return new DeadLetter('bad payload (returned)');
  });
  const done = deferred();
  let n = 0;
  w.on('job', () => ++n === 2 && done.resolve());
  const events = await runUntil(w, done.promise);
  assert.deepEqual(events.map((e) => [e.outcome, e.deadLettered]), [['dead-letter', true], ['dead-letter', true]]);
  const dead = await admin.listDeadLetters({ queue: q });
  assert.deepEqual(
    dead.jobs.map((j) => [j.id, j.state, j.deadReason, j.lastError]).sort(),
    [
      [a.jobId, 'dead', 'nacked', 'bad payload (thrown)'],
      [b.jobId, 'dead', 'nacked', 'bad payload (returned)'],
    ].sort(),
  );
  // And back from the dead letters with attempt 0: delivered as attempt 1.
  assert.deepEqual(await admin.requeueDeadLetters({ queue: q, all: true }), { requeued: 2, skippedDuplicates: 0 });
  assert.equal((await admin.getQueue(q)).stats.available, 2);
});

test('any other error nacks with its message; the last attempt dead-letters', { timeout: 30000 }, async () => {
  const q = queueName();
  const { jobId } = await client.enqueue(q, 'x', { maxAttempts: 2 });
  await admin.updateQueue(q, { backoffBaseMs: 100, backoffCapMs: 100 });
  const w = new Worker(client, { log: quietLog() }).handle(q, async (job) => {
    throw new Error(`failure ${job.attempt}`);
  });
  const done = deferred();
  w.on('job', (e) => e.deadLettered && done.resolve());
  const events = await runUntil(w, done.promise);
  assert.deepEqual(events.map((e) => [e.outcome, e.error, e.deadLettered]), [
    ['nack', 'failure 1', false],
    ['nack', 'failure 2', true],
  ]);
  const dead = await admin.getJob(jobId);
  assert.deepEqual([dead.state, dead.deadReason, dead.lastError, dead.attempt], ['dead', 'max_attempts', 'failure 2', 2]);
});

test('timeout: the signal aborts, the job is nacked and comes back as attempt 2', { timeout: 30000 }, async () => {
  const q = queueName();
  const { jobId } = await client.enqueue(q, 'slow');
  await admin.updateQueue(q, { backoffBaseMs: 100, backoffCapMs: 100 });
  const reasons = new Inbox();
  const attempts = new Inbox();
  const w = new Worker(client, { timeoutMs: 60000, log: quietLog() }).handle(
    q,
    async (job, { signal }) => {
      attempts.put({ attempt: job.attempt, lastError: job.lastError });
      if (job.attempt > 1) return;
      // Cooperative: stops when told, like fetch(url, { signal }) would.
      await new Promise((resolve, reject) => {
        const t = setTimeout(resolve, 20000);
        signal.addEventListener('abort', () => {
          clearTimeout(t);
          reasons.put(signal.reason);
          reject(signal.reason);
        });
      });
    },
    { timeoutMs: 500 }, // this queue's own, instead of the worker's 60 s
  );
  const started = Date.now();
  const events = await runUntil(w, (async () => {
    await attempts.get();
    await attempts.get();
  })());
  const reason = await reasons.get();
  assert.ok(reason instanceof JobTimeoutError);
  assert.equal(reason.timeoutMs, 500);
  assert.ok(Date.now() - started < 10000);
  assert.deepEqual(events.map((e) => e.outcome), ['timeout', 'ack']);
  assert.match(events[0].error, /timeout: the handler did not finish within 500 ms/);
  assert.ok(await jobGone(admin, jobId));
});

test('timeout: a handler that ignores its signal still has its job nacked', { timeout: 30000 }, async () => {
  const q = queueName();
  await client.enqueue(q, 'stubborn');
  await admin.updateQueue(q, { backoffBaseMs: 100, backoffCapMs: 100 });
  const attempts = new Inbox();
  const w = new Worker(client, { timeoutMs: 300, concurrency: 1, log: quietLog() }).handle(q, async (job) => {
    attempts.put(job);
    if (job.attempt === 1) await sleep(2000); // ignores the signal
  });
  await runUntil(w, (async () => {
    await attempts.get();
    const second = await attempts.get();
    // The slot was freed at the timeout: attempt 2 ran while attempt 1 slept.
    assert.deepEqual([second.attempt, second.lastError], [2, 'timeout: the handler did not finish within 300 ms']);
  })());
});

test('lost lease at settle: the ack is dropped quietly', { timeout: 30000 }, async () => {
  const q = queueName();
  const { jobId } = await client.enqueue(q, 'x');
  const started = deferred();
  const proceed = deferred();
  const log = quietLog();
  // The cancel is hidden from the stream: the lease is lost untold, and
  // only the ack's refusal says so (a told cancel: test/cancel.test.js).
  const hide = untold();
  const c = new Client(broker.addr, { interceptors: [hide.interceptor] });
  const w = new Worker(c, { leaseMs: 30000, log }).handle(q, async () => {
    started.resolve();
    await proceed.promise;
  });
  const done = deferred();
  w.on('job', (e) => done.resolve(e));
  const events = await runUntil(w, (async () => {
    await started.promise;
    assert.deepEqual(await admin.cancelJob(jobId), { wasLeased: true });
    proceed.resolve();
    await done.promise;
  })());
  c.close();
  assert.equal(hide.hidden, 1);
  assert.deepEqual(events.map((e) => [e.outcome, e.settleError]), [['lease-lost', undefined]]);
  assert.deepEqual(log.lines, [], 'no warning for a lost lease');
});

test('lost lease while running: the extension fails and the signal aborts', { timeout: 30000 }, async () => {
  const q = queueName();
  const { jobId } = await client.enqueue(q, 'x');
  const started = deferred();
  const reason = deferred();
  const log = quietLog();
  // Untold (see above): only the refused extension says the lease is gone.
  const hide = untold();
  const c = new Client(broker.addr, { interceptors: [hide.interceptor] });
  const w = new Worker(c, { leaseMs: 1000, log }).handle(q, async (job, { signal }) => {
    started.resolve();
    await new Promise((resolve) => signal.addEventListener('abort', resolve));
    reason.resolve(signal.reason);
  });
  const done = deferred();
  w.on('job', (e) => done.resolve(e));
  const events = await runUntil(w, (async () => {
    await started.promise;
    await admin.cancelJob(jobId);
    await done.promise;
  })());
  c.close();
  assert.equal(hide.hidden, 1);
  const r = await reason.promise;
  assert.ok(r instanceof LeaseLostError, `abort reason ${r}`);
  assert.deepEqual(events.map((e) => e.outcome), ['lease-lost']);
  assert.deepEqual(log.lines, []);
  await eventually(async () => jobGone(admin, jobId), 2000, 'job stays cancelled');
});
