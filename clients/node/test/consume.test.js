'use strict';
// client.consume(): the async iterator, settles on the Consume stream (and
// the Subscribe + AckBatch fallback), against a real broker.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { AdminClient, Client, LeaseLostError, Retry, Worker, status } = require('@leaseq/client');
const { suiteBroker, queueName, callCounter, quietLog, jobGone, eventually, deferred, NO_CONSUME } = require('../harness/helpers');

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

test('for await yields jobs; ack, retry and deadLetter settle them', { timeout: 30000 }, async () => {
  const q = queueName();
  const ids = await client.enqueueBatch(['a', 'b', 'c'].map((p) => ({ queue: q, payload: p })));
  const seen = [];
  for await (const job of client.consume({ queues: [q], maxInFlight: 4, log: quietLog() })) {
    seen.push([job.text(), job.attempt]);
    if (job.text() === 'a') await job.ack();
    else if (job.text() === 'b' && job.attempt === 1) await job.retry({ after: 0, reason: 'again' });
    else if (job.text() === 'b') {
      assert.equal(job.lastError, 'again');
      await job.ack();
    } else await job.deadLetter('poison');
    if (seen.length === 4) break;
  }
  assert.deepEqual(seen.sort(), [['a', 1], ['b', 1], ['b', 2], ['c', 1]]);
  assert.ok(await jobGone(admin, ids[0].jobId));
  assert.ok(await jobGone(admin, ids[1].jobId));
  const dead = await admin.getJob(ids[2].jobId);
  assert.deepEqual([dead.state, dead.deadReason, dead.lastError], ['dead', 'nacked', 'poison']);
});

test('acks travel on the Consume stream: no unary settle call', { timeout: 30000 }, async () => {
  const q = queueName();
  const calls = callCounter();
  const c = new Client(broker.addr, { interceptors: [calls.interceptor] });
  try {
    const sent = await c.enqueueBatch(Array.from({ length: 20 }, (_, i) => ({ queue: q, payload: String(i) })));
    const stream = c.consume({ queues: [q], maxInFlight: 8, log: quietLog() });
    let n = 0;
    const extended = [];
    for await (const job of stream) {
      assert.equal(stream.protocol, 'consume', NO_CONSUME);
      if (n === 0) extended.push(await job.extendLease(60000)); // an extension on the stream too
      await job.ack();
      if (++n === sent.length) break;
    }
    assert.ok(extended[0] - Date.now() > 30000, 'the extension answered with the new expiry');
    for (const r of sent) assert.ok(await jobGone(admin, r.jobId), `job ${r.jobId} acked`);
    assert.equal(calls.counts.Consume, 1);
    for (const unary of ['Ack', 'AckBatch', 'Nack', 'ExtendLease', 'Subscribe']) {
      assert.equal(calls.counts[unary] ?? 0, 0, `${unary} calls: settles should all have gone on the stream`);
    }
  } finally {
    c.close();
  }
});

test('Worker: acks, nacks and extensions on the Consume stream; stop half-closes it', { timeout: 30000 }, async () => {
  const q = queueName();
  const calls = callCounter();
  const log = quietLog();
  const c = new Client(broker.addr, { interceptors: [calls.interceptor] });
  let w;
  try {
    const sent = await c.enqueueBatch(Array.from({ length: 10 }, (_, i) => ({ queue: q, payload: String(i) })));
    const slowDone = deferred();
    let acked = 0;
    const allDone = deferred();
    w = new Worker(c, { concurrency: 4, leaseMs: 1000, log }).handle(q, async (job) => {
      if (job.text() === '0' && job.attempt === 1) return new Retry({ after: 0 }); // a nack
      if (job.text() === '1') {
        await new Promise((r) => setTimeout(r, 1500)); // outlives its 1 s lease: extended
        slowDone.resolve(job.attempt);
      }
      return undefined;
    });
    w.on('job', (e) => e.outcome === 'ack' && ++acked === 10 && allDone.resolve());
    const run = w.run();
    await allDone.promise;
    assert.equal(w.protocol, 'consume', NO_CONSUME);
    assert.equal(await slowDone.promise, 1, 'the slow job kept its lease');
    await w.stop();
    await run;
    for (const r of sent) assert.ok(await jobGone(admin, r.jobId));
    assert.equal(calls.counts.Consume, 1);
    for (const unary of ['Ack', 'AckBatch', 'Nack', 'ExtendLease', 'Subscribe']) {
      assert.equal(calls.counts[unary] ?? 0, 0, `${unary} calls: settles should all have gone on the stream`);
    }
    // A warning would say the broker did not end the stream after the half-close.
    assert.deepEqual(log.lines, []);
  } finally {
    await w?.stop();
    c.close();
  }
});

test('a settle the broker refuses rejects that job only (stale lease)', { timeout: 30000 }, async () => {
  const q = queueName();
  const { jobId } = await client.enqueue(q, 'x');
  await client.enqueue(q, 'y');
  const stream = client.consume({ queues: [q], maxInFlight: 2, log: quietLog() });
  const jobs = [];
  for await (const job of stream) {
    jobs.push(job);
    if (jobs.length === 2) break;
  }
  // break released both; a fresh stream gets them again with new leases.
  const stale = jobs.find((j) => j.id === jobId);
  await assert.rejects(stale.ack(), (e) => {
    assert.ok(e instanceof LeaseLostError);
    assert.equal(e.code, status.FAILED_PRECONDITION);
    return true;
  });
  const again = [];
  for await (const job of client.consume({ queues: [q], maxInFlight: 2, log: quietLog() })) {
    again.push(job.attempt);
    await job.ack();
    if (again.length === 2) break;
  }
  assert.deepEqual(again, [2, 2]);
});

test('leaving the loop releases the jobs not settled, at once', { timeout: 30000 }, async () => {
  const q = queueName();
  const { jobId } = await client.enqueue(q, 'held', { dedupKey: 'held' });
  for await (const job of client.consume({ queues: [q], maxInFlight: 1, leaseMs: 60000, log: quietLog() })) {
    assert.equal(job.id, jobId);
    break; // not settled
  }
  // Back in the queue long before its 60 s lease, as attempt 2.
  await eventually(async () => (await admin.getJob(jobId)).state === 'available', 5000, 'job released');
  for await (const job of client.consume({ queues: [q], maxInFlight: 1, log: quietLog() })) {
    assert.deepEqual([job.id, job.attempt], [jobId, 2]);
    await job.ack();
    break;
  }
});

test('credits: no more than maxInFlight unsettled jobs', { timeout: 30000 }, async () => {
  const q = queueName();
  await client.enqueueBatch(Array.from({ length: 6 }, (_, i) => ({ queue: q, payload: String(i) })));
  const stream = client.consume({ queues: [q], maxInFlight: 2, log: quietLog() });
  const it = stream[Symbol.asyncIterator]();
  const a = (await it.next()).value;
  const b = (await it.next()).value;
  // A third job only comes once one of the two is settled.
  const third = it.next();
  const early = await Promise.race([third.then(() => 'delivered'), new Promise((r) => setTimeout(r, 700, 'waiting'))]);
  assert.equal(early, 'waiting');
  await a.ack();
  const c = (await third).value;
  assert.ok(c && c.id !== a.id && c.id !== b.id);
  await Promise.all([b.ack(), c.ack()]);
  await stream.close();
  // The rest (some delivered meanwhile, unsettled) are released by the close.
  await eventually(async () => {
    const { stats } = await admin.getQueue(q);
    return stats.available === 3 && stats.leased === 0;
  }, 5000, 'three jobs available again');
});

test('an AbortSignal ends the loop gracefully', { timeout: 30000 }, async () => {
  const q = queueName();
  const { jobId } = await client.enqueue(q, 'one');
  const ac = new AbortController();
  let got = 0;
  for await (const job of client.consume({ queues: [q], signal: ac.signal, log: quietLog() })) {
    got += 1;
    await job.ack();
    ac.abort();
  }
  assert.equal(got, 1);
  assert.ok(await jobGone(admin, jobId));
});

test("protocol 'subscribe' settles with AckBatch and unary calls", { timeout: 30000 }, async () => {
  const q = queueName();
  const calls = callCounter();
  const c = new Client(broker.addr, { interceptors: [calls.interceptor] });
  try {
    const sent = await c.enqueueBatch(['a', 'b', 'c'].map((p) => ({ queue: q, payload: p })));
    const stream = c.consume({ queues: [q], maxInFlight: 3, protocol: 'subscribe', log: quietLog() });
    const jobs = [];
    for await (const job of stream) {
      assert.equal(stream.protocol, 'subscribe');
      jobs.push(job);
      if (jobs.length === 3) {
        // Three acks in one turn of the event loop: one AckBatch call.
        await Promise.all(jobs.map((j) => j.ack()));
        break;
      }
    }
    for (const r of sent) assert.ok(await jobGone(admin, r.jobId));
    assert.equal(calls.counts.AckBatch, 1);
    assert.equal(calls.counts.Ack ?? 0, 0);
    assert.equal(calls.counts.Consume ?? 0, 0);
  } finally {
    c.close();
  }
});

test('a bad queue name ends the loop with INVALID_ARGUMENT', { timeout: 30000 }, async () => {
  await assert.rejects(
    (async () => {
      for await (const job of client.consume({ queues: ['no spaces'], log: quietLog() })) await job.ack();
    })(),
    (e) => {
      assert.equal(e.code, status.INVALID_ARGUMENT);
      return true;
    },
  );
});
