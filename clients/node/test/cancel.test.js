'use strict';
// A cancel that reaches the handler (issue 34 item 3): AdminService.CancelJob
// on a leased job sends Cancelled on the stream that holds it; the worker
// aborts the handler's signal, settles nothing, and its slot goes to the next
// job. Against a real broker process.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { AdminClient, Client, JobCancelledError, Worker } = require('@leaseq/client');
const { Broker, suiteBroker, queueName, deferred, Inbox, jobGone, quietLog, streamCounter, callCounter, retryUnavailable } = require('../harness/helpers');

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

// A job event for `jobId`, from the worker's 'job' events.
function eventsOf(worker) {
  const all = [];
  const inbox = new Inbox();
  worker.on('job', (e) => {
    all.push(e);
    inbox.put(e);
  });
  return {
    all,
    async next(jobId) {
      for (;;) {
        const e = await inbox.get();
        if (e.job.id === jobId) return e;
      }
    },
  };
}

for (const protocol of ['consume', 'subscribe']) {
  test(`${protocol}: a handler awaiting its signal is aborted by CancelJob, not settled, and the next job runs at once`, { timeout: 30000 }, async () => {
    const q = queueName();
    const counter = streamCounter();
    const unary = callCounter();
    const c = new Client(broker.addr, { interceptors: [counter.interceptor, unary.interceptor] });
    const started = new Inbox();
    const aborted = deferred();
    // concurrency 1 and a 600 s lease: the second job can only run if the
    // cancel freed the slot and the broker gave the credit back.
    const w = new Worker(c, [q], async (job, { signal }) => {
      started.put(job);
      if (job.text() !== 'long') return;
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      aborted.resolve({ reason: signal.reason, at: Date.now() });
      return 'done anyway'; // a normal return: would ack, were it settled
    }, { concurrency: 1, leaseMs: 600_000, protocol });
    const events = eventsOf(w);
    const run = w.run();
    try {
      const long = await c.enqueue(q, 'long');
      const next = await c.enqueue(q, 'next');
      assert.equal((await started.get()).id, long.jobId);
      assert.ok(w.features.includes('cancel'), `features: ${w.features}`);
      assert.equal(w.protocol, protocol);

      const cancelledAt = Date.now();
      assert.deepEqual(await admin.cancelJob(long.jobId), { wasLeased: true });
      const { reason, at } = await aborted.promise;
      assert.ok(reason instanceof JobCancelledError, `reason: ${reason}`);
      assert.equal(reason.reason, 'cancelled');
      assert.equal(reason.jobId, long.jobId);
      // Promptly: the lease had 600 s to run, so the broker's message did it.
      assert.ok(at - cancelledAt < 10_000, `aborted ${at - cancelledAt} ms after the cancel`);

      const e = await events.next(long.jobId);
      assert.equal(e.outcome, 'cancelled');
      assert.equal((await started.get()).id, next.jobId);
      assert.equal((await events.next(next.jobId)).outcome, 'ack');
      assert.ok(await jobGone(admin, long.jobId));
      assert.ok(await jobGone(admin, next.jobId));
    } finally {
      w.stop();
      await run;
      c.close();
    }
    // One job event for the cancelled job, and the only settle sent is the
    // next job's ack.
    assert.equal(events.all.length, 2);
    const st = w.stats;
    assert.deepEqual([st.delivered, st.cancelled, st.acked, st.nacked, st.leaseLost, st.settleFailed], [2, 1, 1, 0, 0, 0]);
    if (protocol === 'consume') {
      assert.deepEqual([counter.acks, counter.nacks], [1, 0]);
      assert.equal(counter.kinds.cancelled, 1);
    } else {
      assert.equal(unary.counts.Nack ?? 0, 0);
      assert.equal(unary.counts.AckBatch ?? unary.counts.Ack, 1, JSON.stringify(unary.counts));
    }
  });
}

test('a handler that never read its signal is not settled when it returns after the cancel', { timeout: 30000 }, async () => {
  const q = queueName();
  const counter = streamCounter();
  const c = new Client(broker.addr, { interceptors: [counter.interceptor] });
  const started = new Inbox();
  const release = deferred();
  const returned = deferred();
  const w = new Worker(c, [q], async (job) => {
    started.put(job);
    if (job.text() === 'stuck') {
      await release.promise; // never looks at ctx.signal
      returned.resolve();
    }
  }, { concurrency: 1, leaseMs: 600_000, protocol: 'consume' });
  const events = eventsOf(w);
  const run = w.run();
  try {
    const stuck = await c.enqueue(q, 'stuck');
    assert.equal((await started.get()).id, stuck.jobId);
    await admin.cancelJob(stuck.jobId);
    assert.equal((await events.next(stuck.jobId)).outcome, 'cancelled');
    // Its slot is free while it still runs.
    const second = await c.enqueue(q, 'second');
    assert.equal((await started.get()).id, second.jobId);
    assert.equal((await events.next(second.jobId)).outcome, 'ack');
    // Now it returns normally: nothing is sent for it.
    release.resolve();
    await returned.promise;
    const third = await c.enqueue(q, 'third');
    assert.equal((await started.get()).id, third.jobId);
    assert.equal((await events.next(third.jobId)).outcome, 'ack');
  } finally {
    w.stop();
    await run;
    c.close();
  }
  assert.deepEqual([counter.acks, counter.nacks], [2, 0]);
  assert.deepEqual(events.all.map((e) => e.outcome), ['cancelled', 'ack', 'ack']);
  assert.deepEqual([w.stats.cancelled, w.stats.acked, w.stats.leaseLost], [1, 2, 0]);
});

test('a job cancelled before its handler started never runs', { timeout: 60000 }, async () => {
  // A job waits for a slot only after a reconnect, while a handler of the
  // old stream still runs: a hung broker (SIGSTOP) makes the stream go idle.
  const own = await Broker.start();
  const c = new Client(own.addr);
  const a = new AdminClient(c);
  const log = quietLog();
  const started = new Inbox();
  const release = deferred();
  let w;
  try {
    const q = queueName();
    w = new Worker(c, [q], async (job) => {
      started.put(job);
      await release.promise;
    }, { concurrency: 1, leaseMs: 600_000, idleTimeoutMs: 2000, backoffInitialMs: 50, backoffMaxMs: 500, log });
    const events = eventsOf(w);
    const run = w.run();
    const { jobId } = await c.enqueue(q, 'once');
    const first = await started.get();
    assert.equal(first.id, jobId);

    own.child.kill('SIGSTOP');
    try {
      await log.waitFor(/no message on the stream/);
    } finally {
      own.child.kill('SIGCONT');
    }
    // The old stream's close released the job; the new stream delivers it
    // again, and it waits: the old handler holds the only slot.
    await retryUnavailable(async () => {
      const info = await a.getJob(jobId);
      if (!(info.state === 'leased' && info.attempt === 2)) throw Object.assign(new Error('not redelivered yet'), { code: 14 });
    }, 20000);
    assert.equal(w.stats.delivered, 2);
    assert.equal(w.running, 1);

    assert.deepEqual(await a.cancelJob(jobId), { wasLeased: true });
    const e = await events.next(jobId);
    assert.deepEqual([e.outcome, e.job.attempt, e.durationMs, e.job.cancelled], ['cancelled', 2, 0, true]);
    release.resolve();
    // The old delivery's handler returns: its ack is refused (its lease went
    // with the old stream).
    assert.equal((await events.next(jobId)).outcome, 'lease-lost');
    w.stop();
    await run;
    assert.deepEqual([w.stats.cancelled, w.stats.leaseLost, w.stats.acked], [1, 1, 0]);
    // The handler ran once: for the first delivery only.
    const more = await Promise.race([started.get(), new Promise((r) => setTimeout(r, 200, null))]);
    assert.equal(more, null);
  } finally {
    release.resolve();
    w?.stop();
    c.close();
    await own.stop();
  }
});

test('consume(): the stream emits cancelled, and the Job says so', { timeout: 30000 }, async () => {
  const q = queueName();
  const { jobId } = await client.enqueue(q, 'x');
  const stream = client.consume({ queues: [q], leaseMs: 600_000 });
  const seen = deferred();
  stream.on('cancelled', (c) => seen.resolve(c));
  for await (const job of stream) {
    assert.equal(job.id, jobId);
    assert.equal(job.cancelled, false);
    await admin.cancelJob(job.id);
    const c = await seen.promise;
    assert.deepEqual([c.jobId, c.leaseToken, c.job], [job.id, job.leaseToken, job]);
    assert.equal(job.cancelled, true);
    await assert.rejects(job.ack(), { name: 'LeaseLostError' });
    break;
  }
});

test('client.subscribe(): the raw stream carries the Cancelled message', { timeout: 30000 }, async () => {
  const q = queueName();
  const { jobId } = await client.enqueue(q, 'raw');
  const call = client.subscribe([q], { maxInFlight: 1, leaseMs: 600_000 });
  const kinds = [];
  let token = null;
  const cancelled = new Promise((resolve, reject) => {
    call.on('data', (msg) => {
      kinds.push(msg.kind);
      if (msg.kind === 'delivery') {
        token = msg.delivery.leaseToken;
        admin.cancelJob(msg.delivery.job.id).then(() => {}, reject);
      }
      if (msg.kind === 'cancelled') resolve(msg);
    });
    call.on('error', (e) => (e.code === 1 ? null : reject(e)));
  });
  try {
    const msg = await cancelled;
    assert.deepEqual(msg.cancelled, { jobId, leaseToken: token });
    assert.ok(kinds.indexOf('delivery') < kinds.indexOf('cancelled'));
  } finally {
    call.cancel();
  }
});
