'use strict';
// Results, progress and waiting for a job (issue 34 item 2) in the Node
// SDK, against a real broker process:
// - `return new Ack({ result })` (and a task handler's resolved value, as
//   JSON) read back by client.wait and AdminClient.getJob, on Consume and on
//   Subscribe (whose AckBatch cannot carry it: a unary Ack);
// - job.progress(f, msg) read back by getJob while the job is held (Consume:
//   on the stream; Subscribe: ReportProgress); bad reports throw a
//   RangeError naming the field and send nothing;
// - wait for completed, dead, cancelled and unknown jobs; task.submit()
//   then handle.result();
// - a broker that did not list "ack.result"/"progress" (the pre-batch proxy
//   strips the heartbeat's features): the job with a result is nacked with a
//   reason, never acked without it; job.progress throws UNIMPLEMENTED.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { Ack, AdminClient, Client, DeadLetter, defineTask, JobFailedError, status, Worker } = require('@leaseq/client');
const { suiteBroker, queueName, eventually, quietLog } = require('../harness/helpers');
const { startPreBatchProxy } = require('../harness/pre-batch-proxy');

const LEASE_MS = 600000;

let broker;
let client;
let admin;
before(async () => {
  broker = await suiteBroker();
  client = new Client(broker.addr);
  admin = new AdminClient(broker.addr);
});
after(async () => {
  client.close();
  admin.close();
  await broker.stop();
});

for (const protocol of ['consume', 'subscribe']) {
  test(`a handler's result is read back by wait and getJob (${protocol})`, { timeout: 30000 }, async () => {
    const q = queueName();
    const worker = new Worker(client, { concurrency: 4, leaseMs: LEASE_MS, protocol });
    worker.handle(q, async (job) => new Ack({ result: Buffer.concat([Buffer.from('done:'), job.payload]) }));
    const run = worker.run();
    try {
      const ids = [];
      for (let i = 0; i < 3; i++) ids.push((await client.enqueue(q, `p${i}`)).jobId);
      const outcomes = await Promise.all(ids.map((id) => client.wait(id, 20000)));
      for (let i = 0; i < 3; i++) {
        const o = outcomes[i];
        assert.deepEqual([o.jobId, o.state, o.result.toString()], [ids[i], 'completed', `done:p${i}`]);
        assert.ok(o.finishedAt instanceof Date);
        const info = await admin.getJob(ids[i]);
        assert.deepEqual([info.state, info.result.toString()], ['completed', `done:p${i}`]);
      }
      // Answered at once for a job that already ended.
      assert.equal((await client.wait(ids[0], 5000)).result.toString(), 'done:p0');
    } finally {
      await worker.stop();
      await run;
    }
    const s = worker.stats;
    assert.deepEqual([s.acked, s.nacked, s.resultsRefused], [3, 0, 0], JSON.stringify(s));
  });

  test(`progress is read back by getJob while the job is held (${protocol})`, { timeout: 30000 }, async () => {
    const q = queueName();
    const worker = new Worker(client, { concurrency: 1, leaseMs: LEASE_MS, protocol });
    let release;
    const released = new Promise((resolve) => (release = resolve));
    const refusals = [];
    worker.handle(q, async (job) => {
      for (const [f, m, field] of [[1.5, '', 'fraction'], [Number.NaN, '', 'fraction'], [0.5, 'x'.repeat(257), 'message'], [0.5, 'a\0b', 'message']]) {
        assert.throws(() => job.progress(f, m), (e) => e instanceof RangeError && e.message.startsWith(`${field}:`));
        refusals.push(field);
      }
      job.progress(0.25, 'first');
      job.progress(0.5, 'half way'); // replaces the first before it is written (Consume)
      await released;
    });
    const run = worker.run();
    try {
      const { jobId } = await client.enqueue(q, 'x');
      let info;
      await eventually(async () => {
        info = await admin.getJob(jobId);
        return info.progressAt !== null && info.progressMessage === 'half way';
      }, 20000, 'the progress written');
      assert.equal(info.state, 'leased');
      assert.equal(info.progress, 0.5);
      assert.equal(refusals.length, 4);
    } finally {
      release();
      await worker.stop();
      await run;
    }
    assert.equal(worker.stats.acked, 1);
  });

  test(`a broker without "ack.result" and "progress": the job is nacked; progress throws UNIMPLEMENTED (${protocol})`, { timeout: 30000 }, async () => {
    const old = await startPreBatchProxy(broker.addr);
    const oldClient = new Client(old.addr);
    const log = quietLog();
    try {
      const q = queueName();
      const progressErrors = [];
      const worker = new Worker(oldClient, { concurrency: 2, leaseMs: LEASE_MS, protocol, log });
      worker.handle(q, async (job) => {
        try {
          job.progress(0.5, 'never');
        } catch (e) {
          progressErrors.push(e);
        }
        return job.text() === 'plain' ? undefined : new Ack({ result: 'lost' });
      });
      const run = worker.run();
      const withResult = (await client.enqueue(q, 'with a result', { maxAttempts: 1 })).jobId;
      const plain = (await client.enqueue(q, 'plain')).jobId;
      const o = await client.wait(withResult, 20000);
      assert.equal(o.state, 'dead');
      assert.match(o.lastError, /^ack\.result: the broker did not list "ack\.result"/);
      assert.equal((await client.wait(plain, 20000)).state, 'unknown');
      assert.deepEqual(worker.features, [], 'the proxy strips the features');
      await worker.stop();
      await run;
      assert.equal(progressErrors.length, 2);
      for (const e of progressErrors) {
        assert.equal(e.code, status.UNIMPLEMENTED);
        assert.match(e.details, /^progress: the broker did not list/);
      }
      const s = worker.stats;
      assert.deepEqual([s.acked, s.nacked, s.resultsRefused], [1, 1, 1], JSON.stringify(s));
      assert.ok(log.lines.some((l) => /ack\.result/.test(l)));

      // A raw stream: refused before anything is sent; the job stays ours.
      await client.enqueue(q, 'raw');
      const stream = oldClient.consume({ queues: [q], maxInFlight: 1, leaseMs: LEASE_MS, protocol });
      for await (const job of stream) {
        await assert.rejects(job.ack({ result: 'lost' }), (e) => {
          assert.equal(e.code, status.UNIMPLEMENTED);
          assert.match(e.details, /^ack\.result:/);
          return true;
        });
        assert.equal(job.settled, false);
        assert.deepEqual(await job.ack(), []);
        break;
      }
    } finally {
      oldClient.close();
      old.close();
    }
  });
}

test('a task handler\'s resolved value is its JSON result; submit().result() waits for it', { timeout: 30000 }, async () => {
  const q = queueName();
  const add = defineTask(q, ({ a, b }) => {
    if (a < 0) throw new DeadLetter('negative');
    return { sum: a + b };
  });
  const worker = new Worker(client, { concurrency: 2, leaseMs: LEASE_MS }).register(add);
  const run = worker.run();
  try {
    const h = await add.submit(client, { a: 2, b: 3 });
    assert.deepEqual(await h.result(20000), { sum: 5 });
    assert.deepEqual(JSON.parse((await admin.getJob(h.jobId)).result.toString()), { sum: 5 });
    const bad = await add.submit(client, { a: -1, b: 0 });
    await assert.rejects(bad.result(20000), (e) => {
      assert.ok(e instanceof JobFailedError);
      assert.equal(e.outcome.state, 'dead');
      assert.equal(e.outcome.lastError, 'negative');
      assert.match(e.message, /is dead \(nacked\): negative/);
      return true;
    });
  } finally {
    await worker.stop();
    await run;
  }
  // Nobody consumes now: the wait runs out.
  const h = await add.submit(client, { a: 1, b: 1 });
  await assert.rejects(h.result(500), (e) => e.code === status.DEADLINE_EXCEEDED);
});

test('wait for dead, cancelled and unknown jobs; reportProgress is fenced', { timeout: 30000 }, async () => {
  const q = queueName();
  const dead = (await client.enqueue(q, 'x', { maxAttempts: 1 })).jobId;
  const cancelled = (await client.enqueue(q, 'y', { delayMs: 3600000 })).jobId;
  // The waits are open before the jobs end.
  const waits = [client.wait(dead, 20000), client.wait(cancelled, 20000)];
  const stream = client.consume({ queues: [q], maxInFlight: 1, leaseMs: LEASE_MS });
  for await (const job of stream) {
    assert.equal(job.id, dead);
    await client.reportProgress(job.id, job.leaseToken, 0.75, 'unary');
    const info = await admin.getJob(job.id);
    assert.deepEqual([info.progress, info.progressMessage], [0.75, 'unary']);
    await assert.rejects(client.reportProgress(job.id, job.leaseToken, -0.1), /^RangeError: fraction:/);
    await job.nack('boom');
    await assert.rejects(client.reportProgress(job.id, job.leaseToken, 0.8), (e) => e.code === status.FAILED_PRECONDITION);
    break;
  }
  await admin.cancelJob(cancelled);
  const [d, c] = await Promise.all(waits);
  assert.deepEqual([d.state, d.lastError, d.deadReason], ['dead', 'boom', 'max_attempts']);
  assert.equal(c.state, 'cancelled');
  assert.ok(c.finishedAt instanceof Date);
  // Acked without a result in a queue without retention: nothing to read.
  const plain = (await client.enqueue(q, 'z')).jobId;
  const stream2 = client.consume({ queues: [q], maxInFlight: 1, leaseMs: LEASE_MS });
  for await (const job of stream2) {
    await job.ack();
    break;
  }
  const u = await client.wait(plain, 10000);
  assert.deepEqual([u.state, u.finishedAt, u.json()], ['unknown', null, undefined]);
  await assert.rejects(client.wait('', 1000), (e) => e.code === status.INVALID_ARGUMENT);
});
