'use strict';
// Exactly-once effects (issue 34 item 5) in the Worker and on raw streams,
// against a real broker process and its PostgreSQL (`pg`):
// - `return new Ack({ enqueue })`: follow-up jobs enqueued in the ack's
//   transaction; none when the handler throws; the job nacked (never acked
//   without them) by a broker that does not list "ack.enqueue" (the
//   pre-batch proxy strips its heartbeat's features).
// - `return Ack.settledInSql()` after `select leaseq.ack(...)` in the
//   handler's own transaction: nothing sent, the slot freed, the stream's
//   credit given back by the broker on the commit's notice (a lost credit
//   would stall a worker of two credits after two jobs).
// The broker's side, with kill -9 between every two steps of an SQL ack, is
// tests/sql_ack.rs; the Python suite kills its example worker so too.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const pg = require('pg');
const { Ack, Client, DeadLetter, defineTask, status, Worker } = require('@leaseq/client');
const { suiteBroker, queueName, eventually, pgConfig } = require('../harness/helpers');
const { startPreBatchProxy } = require('../harness/pre-batch-proxy');

// Long enough that nothing in a test comes from a lease running out.
const LEASE_MS = 600000;

let broker;
let client;
let db;
before(async () => {
  broker = await suiteBroker();
  client = new Client(broker.addr);
  db = new pg.Pool(pgConfig());
});
after(async () => {
  client.close();
  await db.end();
  await broker.stop();
});

async function count(sql, args = []) {
  const { rows } = await db.query(sql, args);
  return Number(rows[0].count);
}

const live = (queue) => count('select count(*) from leaseq.jobs where queue = $1', [queue]);

for (const protocol of ['consume', 'subscribe']) {
  test(`follow-ups exist once the handler returns and the parent is gone (${protocol})`, { timeout: 30000 }, async () => {
    const q = queueName();
    const receipts = defineTask(`${q}.receipts`, () => {});
    const worker = new Worker(client, { concurrency: 4, leaseMs: LEASE_MS, protocol });
    const events = [];
    worker.on('job', (e) => events.push(e));
    // Through a middleware that returns what next() gave.
    worker.use(async (job, ctx, next) => next());
    worker.handle(`${q}.orders`, async (job) => {
      const order = job.text();
      if (order === 'plain') return undefined; // a plain ack, batched in the fallback
      return new Ack({
        enqueue: [
          { queue: `${q}.emails`, payload: `mail ${order}` },
          { queue: receipts.queue, payload: JSON.stringify({ order }), headers: { 'content-type': 'application/json' } },
        ],
      });
    });
    const run = worker.run();
    await client.enqueueBatch([...['o-0', 'o-1', 'o-2', 'o-3', 'o-4', 'plain'].map((payload) => ({ queue: `${q}.orders`, payload }))]);
    await eventually(async () => (await live(`${q}.orders`)) === 0 && worker.stats.acked === 6, 20000, 'parents acked');
    await worker.stop();
    await run;
    assert.equal(await live(`${q}.emails`), 5);
    assert.equal(await live(receipts.queue), 5);
    const s = worker.stats;
    assert.deepEqual([s.acked, s.followUps, s.nacked, s.followUpsRefused], [6, 10, 0, 0], JSON.stringify(s));
    // The ids, in the 'job' event, are the follow-ups'.
    const ids = events.flatMap((e) => e.enqueued ?? []);
    assert.equal(ids.length, 10);
    const { rows } = await db.query('select id::text from leaseq.jobs where id = any($1::uuid[])', [ids]);
    assert.equal(rows.length, 10);
    assert.equal(worker.protocol, protocol);
  });
}

test('a handler that throws after asking for follow-ups enqueues none', { timeout: 30000 }, async () => {
  const q = queueName();
  const worker = new Worker(client, { concurrency: 2, leaseMs: LEASE_MS });
  worker.handle(q, async (job) => {
    const ack = new Ack({ enqueue: [{ queue: `${q}.emails`, payload: 'must not exist' }] });
    assert.equal(ack.enqueue.length, 1);
    if (job.text() === 'returned') return new DeadLetter('returned after asking for follow-ups');
    throw new DeadLetter('thrown after asking for follow-ups');
  });
  const run = worker.run();
  await client.enqueue(q, 'thrown');
  await client.enqueue(q, 'returned');
  await eventually(async () => (await count('select count(*) from leaseq.dead_jobs where queue = $1', [q])) === 2, 20000, 'dead-lettered');
  await worker.stop();
  await run;
  assert.equal(await live(`${q}.emails`), 0);
  assert.deepEqual([worker.stats.nacked, worker.stats.followUps, worker.stats.acked], [2, 0, 0]);
});

test('SQL acks free the slot and the worker keeps consuming (no credit lost, no redelivery)', { timeout: 60000 }, async () => {
  const q = queueName();
  const table = `${q.replace(/[^A-Za-z0-9_]/g, '_')}_effects`;
  await db.query(`create table ${table} (job uuid not null)`);
  const worker = new Worker(client, { concurrency: 2, leaseMs: LEASE_MS });
  const outcomes = [];
  worker.on('job', (e) => outcomes.push(e.outcome));
  worker.handle(q, async (job) => {
    const tx = await db.connect();
    try {
      await tx.query('begin');
      await tx.query(`insert into ${table} values ($1)`, [job.id]);
      await tx.query('select leaseq.ack($1, $2)', [job.id, job.leaseToken]);
      await tx.query('commit');
    } catch (e) {
      await tx.query('rollback');
      throw e;
    } finally {
      tx.release();
    }
    return Ack.settledInSql();
  });
  const run = worker.run();
  await client.enqueueBatch(Array.from({ length: 30 }, (_, i) => ({ queue: q, payload: String(i) })));
  await eventually(async () => (await count(`select count(*) from ${table}`)) === 30 && (await live(q)) === 0, 40000, 'all acked in SQL');
  await worker.stop();
  await run;
  assert.equal(await count(`select count(distinct job) from ${table}`), 30, 'each effect once');
  const s = worker.stats;
  assert.deepEqual([s.delivered, s.settledInSql, s.acked, s.nacked, s.leaseLost], [30, 30, 0, 0, 0], JSON.stringify(s));
  assert.deepEqual(new Set(outcomes), new Set(['settled-in-sql']));
});

test('a broker without "ack.enqueue": the worker nacks the job; job.ack({ enqueue }) rejects UNIMPLEMENTED', { timeout: 30000 }, async () => {
  const old = await startPreBatchProxy(broker.addr);
  const oldClient = new Client(old.addr);
  try {
    const q = queueName();
    const worker = new Worker(oldClient, { concurrency: 2, leaseMs: LEASE_MS });
    worker.handle(q, async (job) => (job.text() === 'plain' ? undefined : new Ack({ enqueue: [{ queue: `${q}.emails`, payload: 'never' }] })));
    const run = worker.run();
    await client.enqueue(q, 'with follow-ups', { maxAttempts: 1 });
    await client.enqueue(q, 'plain');
    await eventually(async () => (await live(q)) === 0, 20000, 'both settled');
    assert.deepEqual(worker.features, [], 'the proxy strips the features');
    await worker.stop();
    await run;
    const { rows } = await db.query('select last_error from leaseq.dead_jobs where queue = $1', [q]);
    assert.equal(rows.length, 1);
    assert.match(rows[0].last_error, /^ack\.enqueue: the broker did not list "ack\.enqueue"/);
    assert.equal(await live(`${q}.emails`), 0);
    const s = worker.stats;
    assert.deepEqual([s.acked, s.nacked, s.followUpsRefused, s.followUps], [1, 1, 1, 0], JSON.stringify(s));

    // A raw stream: refused before anything is sent; the job stays ours.
    await client.enqueue(q, 'raw');
    const stream = oldClient.consume({ queues: [q], maxInFlight: 1, leaseMs: LEASE_MS });
    for await (const job of stream) {
      await assert.rejects(job.ack({ enqueue: [{ queue: `${q}.emails`, payload: 'never' }] }), (e) => {
        assert.equal(e.code, status.UNIMPLEMENTED);
        assert.match(e.details, /^ack\.enqueue:/);
        return true;
      });
      assert.equal(job.settled, false);
      assert.deepEqual(await job.ack(), []);
      break;
    }
    assert.equal(await live(`${q}.emails`), 0);
  } finally {
    oldClient.close();
    old.close();
  }
});

test('job.ack({ enqueue }) on a raw stream and client.ack({ enqueue }): the follow-ups\' ids', { timeout: 30000 }, async () => {
  const q = queueName();
  await client.enqueue(q, 'x');
  const stream = client.consume({ queues: [q], maxInFlight: 1, leaseMs: LEASE_MS });
  let ids = [];
  for await (const job of stream) {
    ids = await job.ack({ enqueue: [{ queue: `${q}.next`, payload: 'a' }, { queue: `${q}.next`, payload: 'b' }] });
    break;
  }
  await client.enqueue(q, 'y');
  const stream2 = client.consume({ queues: [q], maxInFlight: 1, leaseMs: LEASE_MS, protocol: 'subscribe' });
  let more = [];
  for await (const job of stream2) {
    more = await client.ack(job.id, job.leaseToken, { enqueue: [{ queue: `${q}.next`, payload: 'c' }] });
    break;
  }
  const { rows } = await db.query('select id::text from leaseq.jobs where queue = $1 order by payload', [`${q}.next`]);
  assert.deepEqual(rows.map((r) => r.id), [...ids, ...more]);
  assert.equal(rows.length, 3);
});
