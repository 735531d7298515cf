'use strict';
// Keys inside a queue (issue 33): the `key` enqueue option, job.key on
// deliveries and JobInfo.key, and the queue settings orderedByKey,
// keyConcurrency (with and without order), fairByKey, keyRateLimit /
// keyRateBurst and keyOverrides; against a real broker.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { AdminClient, Client, Worker, defineTask, status } = require('@leaseq/client');
const { suiteBroker, queueName, quietLog, Inbox } = require('../harness/helpers');

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

// How long a held-back job must stay undelivered: the broker hands a
// deliverable job to an open stream with free credit within milliseconds.
const QUIET_MS = 600;
const within = (p, ms, what) =>
  Promise.race([p, new Promise((_, reject) => setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms).unref())]);
/** Resolves true when `p` settles within `ms`, false otherwise (p stays pending for later). */
const settlesWithin = (p, ms) => Promise.race([p.then(() => true), new Promise((r) => setTimeout(r, ms, false))]);

test('an ordered queue delivers a key\'s next job once the one before is acked; others are not held back', { timeout: 30000 }, async () => {
  const q = queueName('keys');
  const created = await admin.updateQueue(q, { create: true, orderedByKey: true });
  assert.deepEqual([created.settings.orderedByKey, created.settings.keyConcurrency], [true, 1], '1 when not given');
  const a1 = await client.enqueue(q, 'a1', { key: 'alice' });
  const [a2] = await client.enqueueBatch([
    { queue: q, payload: 'a2', key: 'alice' },
    { queue: q, payload: 'b1', key: 'bob' },
    { queue: q, payload: 'free' },
  ]);
  const stream = client.consume({ queues: [q], maxInFlight: 10, leaseMs: 30000, log: quietLog() });
  const it = stream[Symbol.asyncIterator]();
  try {
    const first = [];
    for (let i = 0; i < 3; i++) first.push((await within(it.next(), 10000, 'a first delivery')).value);
    assert.deepEqual(first.map((j) => [j.text(), j.key]).sort(), [['a1', 'alice'], ['b1', 'bob'], ['free', '']]);
    const pending = it.next();
    assert.equal(await settlesWithin(pending, QUIET_MS), false, 'a2 was delivered while a1 was unsettled');
    assert.equal((await admin.getJob(a2.jobId)).state, 'available');
    await first.find((j) => j.id === a1.jobId).ack();
    const next = (await within(pending, 10000, 'a2 after a1\'s ack')).value;
    assert.deepEqual([next.id, next.text(), next.key], [a2.jobId, 'a2', 'alice']);
    for (const j of [next, ...first.filter((j) => j.id !== a1.jobId)]) await j.ack();
  } finally {
    await it.return();
  }
});

test('a retry keeps its place at the head of its key; a dead letter lets the key go on', { timeout: 30000 }, async () => {
  const q = queueName('keys');
  await admin.updateQueue(q, { create: true, orderedByKey: true, keyConcurrency: 1 });
  await client.enqueueBatch([{ queue: q, payload: 'k1', key: 'k' }, { queue: q, payload: 'k2', key: 'k' }]);
  const stream = client.consume({ queues: [q], maxInFlight: 10, leaseMs: 30000, log: quietLog() });
  const it = stream[Symbol.asyncIterator]();
  try {
    let job = (await within(it.next(), 10000, 'k1')).value;
    assert.deepEqual([job.text(), job.attempt], ['k1', 1]);
    await job.retry({ after: 1000, reason: 'again' });
    const pending = it.next();
    assert.equal(await settlesWithin(pending, QUIET_MS), false, 'k2 went ahead of k1\'s retry');
    // Due in 1 s; the broker's wake-up at the retry is the Rust suite's to
    // check (tests/keys.rs): this waits out even its 10 s fallback poll,
    // since it checks the order.
    job = (await within(pending, 15000, 'k1 again')).value;
    assert.deepEqual([job.text(), job.attempt, job.lastError, job.key], ['k1', 2, 'again', 'k']);
    await job.deadLetter('poison');
    job = (await within(it.next(), 10000, 'k2 after the dead letter')).value;
    assert.equal(job.text(), 'k2');
    await job.ack();
  } finally {
    await it.return();
  }
  const dead = await admin.listDeadLetters({ queue: q });
  assert.deepEqual(dead.jobs.map((j) => [j.key, j.lastError]), [['k', 'poison']]);
});

test('the key travels from every producer to Worker handlers and JobInfo', { timeout: 30000 }, async () => {
  const q = queueName('keys');
  const seen = new Inbox();
  const task = defineTask(q, () => {});
  const plain = await client.enqueue(q, 'plain', { key: 'acct-1' });
  const [batched] = await client.enqueueBatch([{ queue: q, payload: 'batched', key: 'acct-2' }]);
  const typed = await task.enqueue(client, { n: 3 }, { key: 'acct-3' });
  const [many] = await task.enqueueMany(client, [{ n: 4 }], { key: 'acct-4' });
  const none = await client.enqueue(q, 'none');
  const want = [[plain, 'acct-1'], [batched, 'acct-2'], [typed, 'acct-3'], [many, 'acct-4'], [none, '']].map(([r, k]) => [r.jobId, k]);
  assert.deepEqual((await admin.listJobs({ queue: q })).jobs.map((j) => [j.id, j.key]), want);
  assert.equal((await admin.getJob(plain.jobId)).key, 'acct-1');
  // (Not the task's handler: the plain payloads are not JSON.)
  const w = new Worker(client, { burst: true, burstIdleMs: 300, concurrency: 5, log: quietLog() });
  await w.handle(q, (job) => seen.put([job.id, job.key])).run();
  const got = [];
  for (let i = 0; i < want.length; i++) got.push(await seen.get());
  assert.deepEqual(got.sort(), [...want].sort());
});

test('orderedByKey and keyConcurrency round-trip and are validated', { timeout: 30000 }, async () => {
  const q = queueName('keys');
  const pair = (info) => [info.settings.orderedByKey, info.settings.keyConcurrency];
  assert.deepEqual(pair(await admin.updateQueue(q, { create: true })), [false, 0]);
  assert.deepEqual(pair(await admin.updateQueue(q, { orderedByKey: true, keyConcurrency: 3 })), [true, 3]);
  assert.deepEqual(pair(await admin.getQueue(q)), [true, 3]);
  const other = await admin.updateQueue(q, { maxAttempts: 4 }); // not given: unchanged
  assert.deepEqual([...pair(other), other.settings.maxAttempts], [true, 3, 4]);
  for (const keyConcurrency of [1001, -1]) {
    await assert.rejects(admin.updateQueue(q, { keyConcurrency }), { code: status.INVALID_ARGUMENT, details: /^key_concurrency/ });
  }
  assert.deepEqual(pair(await admin.updateQueue(q, { orderedByKey: false })), [false, 0], 'turning ordering off clears keyConcurrency');
  assert.deepEqual(pair(await admin.updateQueue(q, { keyConcurrency: 2 })), [false, 2], 'a per-key limit without order');
});

test('fairByKey, keyRateLimit, keyRateBurst and keyOverrides round-trip and are validated', { timeout: 30000 }, async () => {
  const q = queueName('keylim');
  const keys = (s) => [s.fairByKey, s.keyConcurrency, s.keyRateLimit, s.keyRateBurst, s.keyOverrides];
  assert.deepEqual(keys((await admin.updateQueue(q, { create: true })).settings), [false, 0, 0, 0, []]);
  const vip = { key: 'vip', concurrency: 5, weight: 3 };
  const slow = { key: 'slow', rateLimit: 0.5 };
  const set = (await admin.updateQueue(q, { fairByKey: true, keyConcurrency: 2, keyRateLimit: 2.5, keyOverrides: [vip, slow] })).settings;
  assert.deepEqual(keys(set), [true, 2, 2.5, 3, [slow, vip]], 'burst ceil(2.5); overrides in key order');
  assert.deepEqual((await admin.getQueue(q)).settings, set);
  for (const [update, field] of [
    [{ keyOverrides: [{ key: 'x' }] }, 'key_overrides[0].key'], // sets nothing
    [{ keyOverrides: [{ key: 'a', weight: 1 }, { key: 'b', weight: 101 }] }, 'key_overrides[1].weight'],
    [{ keyOverrides: [{ key: 'a', concurrency: 1 }, { key: 'a', weight: 2 }] }, 'key_overrides[1].key'],
    [{ keyOverrides: [{ key: 'a', rateLimit: 1e9 }] }, 'key_overrides[0].rate_limit'],
    [{ keyRateLimit: -1 }, 'key_rate_limit'],
    [{ keyRateBurst: 2000000 }, 'key_rate_burst'],
  ]) {
    await assert.rejects(admin.updateQueue(q, update), (e) => e.code === status.INVALID_ARGUMENT && e.details.startsWith(`${field}:`), field);
  }
  await assert.rejects(admin.updateQueue(q, { keyOverrides: 'vip' }), TypeError);
  await assert.rejects(admin.updateQueue(q, { keyOverrides: [{ key: 'vip', concurrency: '3' }] }), /keyOverrides\[0\]\.concurrency/);
  assert.deepEqual((await admin.getQueue(q)).settings, set, 'nothing changed');
  assert.deepEqual(keys((await admin.updateQueue(q, { keyRateBurst: 10 })).settings), [true, 2, 2.5, 10, [slow, vip]]);
  const cleared = (await admin.updateQueue(q, { keyOverrides: [], keyRateLimit: 0, fairByKey: false })).settings;
  assert.deepEqual(keys(cleared), [false, 2, 0, 0, []]);
});

test('a key override gives a named key its own concurrency beside the queue\'s per-key limit', { timeout: 30000 }, async () => {
  const q = queueName('keylim');
  await admin.updateQueue(q, { create: true, keyConcurrency: 1, keyOverrides: [{ key: 'vip', concurrency: 3 }] });
  const jobs = [];
  for (const key of ['vip', 'std']) for (let i = 0; i < 5; i++) jobs.push({ queue: q, payload: `${key}${i}`, key });
  await client.enqueueBatch(jobs);
  const stream = client.consume({ queues: [q], maxInFlight: 20, leaseMs: 30000, log: quietLog() });
  const it = stream[Symbol.asyncIterator]();
  try {
    const first = [];
    for (let i = 0; i < 4; i++) first.push((await within(it.next(), 10000, 'the first deliveries')).value);
    assert.deepEqual(first.map((j) => j.key).sort(), ['std', 'vip', 'vip', 'vip'], '3 of vip, 1 of std');
    const pending = it.next();
    assert.equal(await settlesWithin(pending, QUIET_MS), false, 'each key is at its limit');
    await first.find((j) => j.key === 'std').ack();
    const next = (await within(pending, 10000, 'std\'s next after the ack')).value;
    assert.equal(next.key, 'std');
    for (const j of [next, ...first.filter((j) => j.key === 'vip')]) await j.ack();
  } finally {
    await it.return();
  }
});

test('a key longer than 256 bytes is INVALID_ARGUMENT, and nothing is enqueued', { timeout: 30000 }, async () => {
  const q = queueName('keys');
  await admin.updateQueue(q, { create: true });
  await assert.rejects(client.enqueue(q, 'x', { key: 'k'.repeat(257) }), {
    code: status.INVALID_ARGUMENT,
    details: /^key: must be at most 256 bytes/,
  });
  // 129 characters, 258 bytes: the limit is in bytes.
  await assert.rejects(client.enqueueBatch([{ queue: q, payload: 'ok' }, { queue: q, payload: 'x', key: 'é'.repeat(129) }]), {
    code: status.INVALID_ARGUMENT,
    details: /^jobs\[1\]\.key: must be at most 256 bytes/,
  });
  assert.equal((await admin.getQueue(q)).stats.available, 0);
  await client.enqueue(q, 'fits', { key: 'k'.repeat(256) });
  assert.equal((await admin.listJobs({ queue: q })).jobs[0].key, 'k'.repeat(256));
});

test('the admin client shows the keys and lists a key\'s jobs', { timeout: 30000 }, async () => {
  const q = queueName('keysvis');
  const x1 = await client.enqueue(q, 'x1', { key: 'x' });
  await client.enqueue(q, 'y1', { key: 'y' });
  await client.enqueue(q, 'y2', { key: 'y' });
  await client.enqueue(q, 'plain');
  const st = (await admin.getQueue(q)).stats;
  assert.deepEqual([st.keysWaiting, st.keysLeased, st.keysWaitingCapped], [2, 0, false]);
  const jobs = await admin.listJobs({ queue: q, key: 'x' });
  assert.deepEqual(jobs.jobs.map((j) => j.id), [x1.jobId]);
  const keys = await admin.listKeys(q);
  assert.deepEqual(keys.keys.map((k) => [k.key, k.waiting, k.leased]), [['x', 1, 0], ['y', 2, 0]]);
  assert.equal(keys.nextPageToken, '');
  assert.ok(keys.keys[0].oldestAvailableAgeMs !== null);
  const first = await admin.listKeys(q, { pageSize: 1 });
  assert.deepEqual(first.keys.map((k) => k.key), ['x']);
  const rest = await admin.listKeys(q, { pageSize: 1, pageToken: first.nextPageToken });
  assert.deepEqual(rest.keys.map((k) => k.key), ['y']);
  const top = await admin.listKeys(q, { order: 'waiting', pageSize: 1 });
  assert.deepEqual(top.keys.map((k) => [k.key, k.waiting]), [['y', 2]]);
  await assert.rejects(admin.listJobs({ key: 'k'.repeat(257) }), (e) => e.code === status.INVALID_ARGUMENT && /key/.test(e.details));
});
