'use strict';
// AdminClient: every AdminService call against a real broker.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { AdminClient, Client, status } = require('@leaseq/client');
const { suiteBroker, queueName, quietLog } = require('../harness/helpers');

let broker;
let client;
let admin;
before(async () => {
  broker = await suiteBroker();
  client = new Client(broker.addr);
  admin = new AdminClient(broker.addr); // a channel of its own
});
after(async () => {
  admin.close();
  client.close();
  await broker.stop();
});

/** Takes `n` jobs of `q` and dead-letters them with `reason`. */
async function deadLetter(q, n, reason) {
  let left = n;
  for await (const job of client.consume({ queues: [q], maxInFlight: n, log: quietLog() })) {
    await job.deadLetter(reason);
    if (--left === 0) break;
  }
}

test('queues: update (create), get, list, pause, resume, purge', { timeout: 30000 }, async () => {
  const q = queueName();
  await assert.rejects(admin.getQueue(q), { code: status.NOT_FOUND });
  const created = await admin.updateQueue(q, {
    create: true, defaultLeaseMs: 45000, maxAttempts: 7, backoffBaseMs: 500, backoffCapMs: 60000,
    completedRetentionMs: 3600000, concurrencyLimit: 3, rateLimit: 2.5,
  });
  assert.equal(created.name, q);
  assert.deepEqual(created.settings, {
    defaultLeaseMs: 45000, maxAttempts: 7, backoffBaseMs: 500, backoffCapMs: 60000,
    completedRetentionMs: 3600000, paused: false, concurrencyLimit: 3, rateLimit: 2.5, rateBurst: 3,
    orderedByKey: false, keyConcurrency: 0, fairByKey: false, keyRateLimit: 0, keyRateBurst: 0, keyOverrides: [],
  });
  // Only the fields given change.
  const updated = await admin.updateQueue(q, { maxAttempts: 9, concurrencyLimit: 0, rateLimit: 0, completedRetentionMs: 0 });
  assert.deepEqual(
    [updated.settings.maxAttempts, updated.settings.defaultLeaseMs, updated.settings.concurrencyLimit, updated.settings.rateLimit, updated.settings.completedRetentionMs],
    [9, 45000, 0, 0, null],
  );
  await client.enqueueBatch([{ queue: q }, { queue: q }, { queue: q, delayMs: 60000 }]);
  const info = await admin.getQueue(q);
  assert.deepEqual([info.stats.available, info.stats.scheduled, info.stats.leased, info.stats.dead], [2, 1, 0, 0]);
  assert.ok(info.stats.oldestAvailableAgeMs >= 0);
  assert.ok(info.createdAt instanceof Date);

  assert.equal((await admin.pauseQueue(q)).settings.paused, true);
  assert.equal((await admin.getQueue(q)).settings.paused, true);
  assert.equal((await admin.resumeQueue(q)).settings.paused, false);

  // Paginated listing: every queue once, in name order.
  const names = [];
  let pageToken = '';
  do {
    const page = await admin.listQueues({ pageSize: 50, pageToken });
    names.push(...page.queues.map((x) => x.name));
    pageToken = page.nextPageToken;
  } while (pageToken);
  assert.ok(names.includes(q));
  assert.deepEqual(names, [...names].sort());

  assert.deepEqual(await admin.purgeQueue(q), { purged: 3, purgedCompleted: 0 });
  assert.equal((await admin.getQueue(q)).stats.available, 0);
});

test('jobs: get, list (states, payloads), cancel', { timeout: 30000 }, async () => {
  const q = queueName();
  const now = await client.enqueue(q, 'now', { headers: { k: 'v' }, priority: 2, dedupKey: 'd', maxAttempts: 4 });
  const later = await client.enqueue(q, 'later', { delayMs: 60000, ttlMs: 120000 });
  const job = await admin.getJob(now.jobId);
  assert.deepEqual(
    [job.id, job.queue, job.state, job.payload.toString(), job.headers, job.priority, job.attempt, job.maxAttempts, job.dedupKey],
    [now.jobId, q, 'available', 'now', { k: 'v' }, 2, 0, 4, 'd'],
  );
  const scheduled = await admin.getJob(later.jobId);
  assert.equal(scheduled.state, 'scheduled');
  assert.ok(scheduled.runAt > new Date(Date.now() + 50000));
  assert.ok(scheduled.expiresAt > scheduled.runAt);

  const all = await admin.listJobs({ queue: q });
  assert.deepEqual(all.jobs.map((j) => j.id), [now.jobId, later.jobId]);
  assert.equal(all.jobs[0].payload.length, 0, 'no payloads unless asked');
  const withPayloads = await admin.listJobs({ queue: q, state: 'scheduled', includePayload: true });
  assert.deepEqual(withPayloads.jobs.map((j) => [j.id, j.payload.toString()]), [[later.jobId, 'later']]);
  const paged = await admin.listJobs({ queue: q, pageSize: 1 });
  assert.equal(paged.jobs.length, 1);
  assert.ok(paged.nextPageToken);
  assert.deepEqual((await admin.listJobs({ queue: q, pageSize: 1, pageToken: paged.nextPageToken })).jobs.map((j) => j.id), [later.jobId]);

  // A leased job: cancel says so, and its holder's settle is refused.
  for await (const leased of client.consume({ queues: [q], log: quietLog() })) {
    const held = await admin.getJob(leased.id);
    assert.deepEqual([held.state, held.attempt], ['leased', 1]);
    assert.ok(held.leaseExpiresAt > new Date());
    assert.deepEqual(await admin.cancelJob(leased.id), { wasLeased: true });
    await assert.rejects(leased.ack(), { code: status.FAILED_PRECONDITION });
    break;
  }
  assert.deepEqual(await admin.cancelJob(later.jobId), { wasLeased: false });
  await assert.rejects(admin.getJob(later.jobId), { code: status.NOT_FOUND });
  await assert.rejects(admin.getJob('not-a-uuid'), (e) => e.code === status.INVALID_ARGUMENT && /job_id/.test(e.details));
});

test('dead letters: list, requeue by id and all, purge', { timeout: 30000 }, async () => {
  const q = queueName();
  const ids = (await client.enqueueBatch([1, 2, 3].map((i) => ({ queue: q, payload: `p${i}` })))).map((r) => r.jobId);
  await deadLetter(q, 3, 'poison');
  const dead = await admin.listDeadLetters({ queue: q, includePayload: true });
  assert.deepEqual(dead.jobs.map((j) => [j.id, j.state, j.deadReason, j.lastError, j.payload.toString()]), [
    [ids[0], 'dead', 'nacked', 'poison', 'p1'],
    [ids[1], 'dead', 'nacked', 'poison', 'p2'],
    [ids[2], 'dead', 'nacked', 'poison', 'p3'],
  ]);
  assert.ok(dead.jobs.every((j) => j.diedAt instanceof Date));
  assert.deepEqual((await admin.listJobs({ queue: q, state: 'dead' })).jobs.map((j) => j.id), ids);

  assert.deepEqual(await admin.requeueDeadLetters({ ids: [ids[0]] }), { requeued: 1, skippedDuplicates: 0 });
  assert.deepEqual(await admin.purgeDeadLetters({ queue: q, ids: [ids[1]] }), { purged: 1 });
  assert.deepEqual(await admin.requeueDeadLetters({ queue: q, all: true }), { requeued: 1, skippedDuplicates: 0 });
  assert.equal((await admin.getQueue(q)).stats.available, 2);
  await deadLetter(q, 2, 'again');
  assert.deepEqual(await admin.purgeDeadLetters({ queue: q, all: true }), { purged: 2 });
  assert.equal((await admin.listDeadLetters({ queue: q })).jobs.length, 0);
});

test('watchQueues: pushed at once, again on a change; the signal ends it', { timeout: 30000 }, async () => {
  const q = queueName();
  await client.enqueue(q, 'x');
  const ac = new AbortController();
  const seen = [];
  for await (const update of admin.watchQueues({ queues: [q], intervalMs: 1000, signal: ac.signal })) {
    const info = update.queues.find((x) => x.name === q);
    seen.push(info.stats.available);
    assert.ok(update.sentAt instanceof Date);
    if (seen.length === 1) await client.enqueue(q, 'y');
    if (info.stats.available === 2) ac.abort();
  }
  assert.deepEqual([seen[0], seen.at(-1)], [1, 2]);
});
