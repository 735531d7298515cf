'use strict';
// Client calls against a real broker: results, and documented status codes.
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { after, before, test } = require('node:test');
const { Client, status } = require('@leaseq/client');
const { suiteBroker, queueName, firstDelivery, callCounter } = require('../harness/helpers');
const { spawnSync } = require('node:child_process');

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

test('enqueue then delivery carries every field', { timeout: 30000 }, async () => {
  const q = queueName();
  const r = await client.enqueue(q, 'hello', { headers: { 'content-type': 'text/plain' }, priority: 3 });
  assert.equal(r.duplicate, false);
  const job = await firstDelivery(client, q);
  assert.deepEqual([job.id, job.queue, job.payload.toString()], [r.jobId, q, 'hello']);
  assert.deepEqual(job.headers, { 'content-type': 'text/plain' });
  assert.deepEqual([job.priority, job.attempt, job.lastError], [3, 1, '']);
  assert.ok(job.leaseToken);
  assert.ok(job.leaseExpiresAt > job.enqueuedAt);
});

test('enqueue: concurrent jobs are messages on one Produce stream; a refused one names its field alone', { timeout: 30000 }, async () => {
  const calls = callCounter();
  const c = new Client(broker.addr, { interceptors: [calls.interceptor] });
  try {
    const q = queueName();
    const sent = await Promise.all(Array.from({ length: 50 }, (_, i) => c.enqueue(q, `p${i}`)));
    assert.equal(new Set(sent.map((r) => r.jobId)).size, 50);
    await assert.rejects(c.enqueue('bad queue', 'x'), (e) => e.code === status.INVALID_ARGUMENT && /^queue:/.test(e.details));
    const after = await c.enqueue(q, 'after');
    assert.ok(after.jobId);
    assert.deepEqual(calls.counts, { Produce: 1 });
  } finally {
    c.close();
  }
});

test('enqueue: a script that never calls close() still exits (the idle stream is half-closed)', { timeout: 30000 }, () => {
  const script = `const { Client } = require(${JSON.stringify(require.resolve('@leaseq/client'))});
    new Client(${JSON.stringify(broker.addr)}).enqueue('idle-exit', 'x').then((r) => console.log(r.jobId));`;
  const t0 = Date.now();
  const r = spawnSync(process.execPath, ['-e', script], { timeout: 15000, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^[0-9a-f-]{36}\n$/);
  assert.ok(Date.now() - t0 < 10000, `exited after ${Date.now() - t0} ms`);
});

test('dedup key returns the live job', { timeout: 30000 }, async () => {
  const q = queueName();
  const a = await client.enqueue(q, '1', { dedupKey: 'k' });
  const b = await client.enqueue(q, '2', { dedupKey: 'k' });
  assert.deepEqual(b, { jobId: a.jobId, duplicate: true, replaced: false });
});

test('onDuplicate replace (debounce) and uniqueForMs', { timeout: 30000 }, async () => {
  const q = queueName();
  const a = await client.enqueue(q, 'v1', { dedupKey: 'doc', delayMs: 3_600_000 });
  const b = await client.enqueue(q, 'v2', { dedupKey: 'doc', onDuplicate: 'replace' });
  assert.deepEqual(b, { jobId: a.jobId, duplicate: true, replaced: true });
  // Replaced without a delay: delivered now, with the new payload.
  const job = await firstDelivery(client, q);
  assert.deepEqual([job.id, job.payload.toString()], [a.jobId, 'v2']);
  // A window without a dedup key is bad input, naming the field.
  await assert.rejects(client.enqueue(q, 'w', { uniqueForMs: 60_000 }), {
    code: status.INVALID_ARGUMENT,
    details: /unique_for/,
  });
  // Held for the window after its ack: a later enqueue returns it.
  const q2 = queueName();
  const w = await client.enqueue(q2, 'w', { dedupKey: 'once', uniqueForMs: 3_600_000 });
  for await (const done of client.consume({ queues: [q2] })) {
    assert.equal(done.id, w.jobId);
    await done.ack();
    break;
  }
  const [r] = await client.enqueueBatch([{ queue: q2, payload: 'w2', dedupKey: 'once' }]);
  assert.deepEqual(r, { jobId: w.jobId, duplicate: true, replaced: false });
});

test('enqueueBatch keeps order', { timeout: 30000 }, async () => {
  const q = queueName();
  const results = await client.enqueueBatch([0, 1, 2, 3, 4].map((i) => ({ queue: q, payload: `j${i}` })));
  assert.equal(new Set(results.map((r) => r.jobId)).size, 5);
  const job = await firstDelivery(client, q);
  assert.deepEqual([job.id, job.payload.toString()], [results[0].jobId, 'j0']);
});

test('extendLease, nack and fencing', { timeout: 30000 }, async () => {
  const q = queueName();
  const r = await client.enqueue(q, 'y');
  const call = client.subscribe([q], { maxInFlight: 1, leaseMs: 5000 });
  call.on('error', () => {}); // the CANCELLED at the end is ours
  try {
    const d = await new Promise((resolve) => call.on('data', (m) => m.kind === 'delivery' && resolve(m.delivery)));
    assert.equal(d.job.id, r.jobId);
    const expires = await client.extendLease(d.job.id, d.leaseToken, 60000);
    // Same machine, so the database clock and ours agree closely.
    assert.ok(expires - Date.now() > 30000, `lease extended to ${expires.toISOString()}`);
    // A malformed token is bad input, naming the field.
    await assert.rejects(client.ack(d.job.id, 'not-a-token'), { code: status.INVALID_ARGUMENT, details: /lease_token/ });
    // A well-formed token that is not the current one changes nothing.
    await assert.rejects(client.ack(d.job.id, crypto.randomUUID()), { code: status.FAILED_PRECONDITION });
    assert.equal(await client.nack(d.job.id, d.leaseToken, 'gave up', { deadLetter: true }), true);
    // Settled: the token is no longer current.
    await assert.rejects(client.ack(d.job.id, d.leaseToken), { code: status.FAILED_PRECONDITION });
  } finally {
    call.cancel();
  }
});

for (const bad of ['bad name', '', '-leading-dash', 'x'.repeat(129)]) {
  test(`bad queue name ${JSON.stringify(bad.slice(0, 20))} is INVALID_ARGUMENT`, { timeout: 30000 }, async () => {
    await assert.rejects(client.enqueue(bad, 'x'), (err) => {
      assert.equal(err.code, status.INVALID_ARGUMENT);
      assert.match(err.details, /queue/);
      return true;
    });
    await assert.rejects(client.enqueueBatch([{ queue: 'fine' }, { queue: bad }]), (err) => {
      assert.equal(err.code, status.INVALID_ARGUMENT);
      assert.match(err.details, /jobs\[1\]\.queue/);
      return true;
    });
  });
}

test('host:port, http:// and LEASEQ_ADDR reach a plaintext broker; the default concurrency is 16', { timeout: 30000 }, async () => {
  const { DEFAULT_CONCURRENCY, Worker } = require('@leaseq/client');
  const q = queueName();
  for (const addr of [broker.addr, `http://${broker.addr}`, `http://${broker.addr}/`]) {
    const c = new Client(addr, { callTimeoutMs: 10000 });
    try {
      await c.enqueue(q, addr);
    } finally {
      c.close();
    }
  }
  const saved = process.env.LEASEQ_ADDR;
  process.env.LEASEQ_ADDR = broker.addr;
  let fromEnv;
  try {
    fromEnv = new Client();
  } finally {
    if (saved === undefined) delete process.env.LEASEQ_ADDR;
    else process.env.LEASEQ_ADDR = saved;
  }
  try {
    await fromEnv.enqueue(q, 'LEASEQ_ADDR');
  } finally {
    fromEnv.close();
  }
  assert.equal(DEFAULT_CONCURRENCY, 16);
  assert.equal(new Worker(client).concurrency, 16);
});
