'use strict';
// Issue 36 item 5: tasks (a JSON payload type declared once), middleware
// around handlers, burst mode; against a real broker.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { AdminClient, Client, defineTask, Worker } = require('@leaseq/client');
const { suiteBroker, queueName } = require('../harness/helpers');

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

test('a task: enqueue sends JSON, register hands the handler the parsed payload', { timeout: 30000 }, async () => {
  const got = [];
  const task = defineTask(queueName(), (payload, job) => {
    got.push([payload, job.headers['content-type'], job.json()]);
  });
  await task.enqueue(client, { n: 1 });
  await task.enqueueMany(client, [{ n: 2 }, { n: 3 }]);
  await new Worker(client, { burst: true, burstIdleMs: 300 }).register(task).run();
  got.sort((a, b) => a[0].n - b[0].n);
  assert.deepEqual(got, [1, 2, 3].map((n) => [{ n }, 'application/json', { n }]));
});

test('middleware: the first added runs outermost; what it returns or throws is the outcome', { timeout: 30000 }, async () => {
  const q = queueName();
  const [ok, failing] = await client.enqueueBatch([{ queue: q, payload: 'ok' }, { queue: q, payload: 'fail' }]);
  const order = [];
  const events = [];
  const w = new Worker(client, { burst: true, burstIdleMs: 300 })
    .handle(q, (job) => {
      order.push(`handler ${job.text()}`);
      if (job.text() === 'fail') throw new Error('handler failed');
    })
    .use(async (job, ctx, next) => {
      order.push(`outer ${job.text()}`);
      try {
        return await next();
      } catch (e) {
        throw new Error(`policy: ${e.message}`); // the error the job is nacked with
      }
    })
    .use((job, ctx, next) => {
      order.push(`inner ${job.text()}`);
      return next();
    });
  w.on('job', (e) => events.push([e.job.id, e.outcome, e.error]));
  await w.run();
  for (const p of ['ok', 'fail']) {
    const mine = order.filter((l) => l.endsWith(` ${p}`));
    assert.deepEqual(mine.slice(0, 3), [`outer ${p}`, `inner ${p}`, `handler ${p}`]);
  }
  const first = new Map(events.map(([id, outcome, error]) => [id, [outcome, error]]).reverse());
  assert.deepEqual(first.get(ok.jobId), ['ack', undefined]);
  assert.deepEqual(first.get(failing.jobId), ['nack', 'policy: handler failed']);
});

test('burst mode on an empty queue: run() resolves once the stream is up and idle', { timeout: 30000 }, async () => {
  const q = queueName();
  const t0 = Date.now();
  await new Worker(client, { burst: true, burstIdleMs: 300 }).handle(q, () => assert.fail('no job')).run();
  const ms = Date.now() - t0;
  assert.ok(ms >= 300 && ms < 10000, `resolved after ${ms} ms`);
  const { stats } = await admin.getQueue(q).catch(() => ({ stats: { available: 0 } }));
  assert.equal(stats.available, 0);
});
