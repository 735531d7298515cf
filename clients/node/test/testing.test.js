'use strict';
// testing.startBroker (a throwaway broker of its own: the real binary on an
// embedded cluster in a fresh temporary directory) and testing.drain.
const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { promisify } = require('node:util');
const { after, before, test } = require('node:test');
const { DeadLetter, defineTask, Retry, testing } = require('@leaseq/client');
const { queueName, eventually, REPO } = require('../harness/helpers');

// The binary the suite tests (run-tests.sh sets LEASEQ_BIN).
process.env.LEASEQ_BIN ||= path.join(REPO, 'target', 'debug', 'leaseq');

const alive = (pid) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    if (e.code === 'ESRCH') return false;
    throw e;
  }
};
const postmasterPid = (dir) => Number(fs.readFileSync(path.join(dir, 'pg', 'data', 'postmaster.pid'), 'utf8').split('\n')[0]);

let broker;
before(async () => {
  broker = await testing.startBroker();
});
after(async () => {
  await broker?.stop();
});

test('startBroker: a broker of its own on loopback, with a client and an admin client', { timeout: 30000 }, async () => {
  assert.match(broker.address, /^127\.0\.0\.1:\d+$/);
  assert.notEqual(broker.address, process.env.LEASEQ_ADDR);
  assert.ok(broker.dir && fs.existsSync(path.join(broker.dir, 'pg', 'data', 'PG_VERSION')), 'the cluster lives in the temp dir');
  const q = queueName();
  const { jobId } = await broker.client.enqueue(q, 'x');
  assert.equal((await broker.admin.getJob(jobId)).queue, q);
  assert.ok(fs.readFileSync(broker.logFile, 'utf8').includes('leaseq serving'));
});

test('drain: each job\'s outcome, middleware, and the queue empty afterwards', { timeout: 30000 }, async () => {
  const q = queueName();
  const task = defineTask(q, ({ n }) => {
    if (n === 2) throw new DeadLetter('two is bad');
    if (n === 3) throw new Error('three failed');
    if (n === 4) return new Retry({ after: 60000, reason: 'later' });
  });
  await task.enqueueMany(broker.client, [1, 2, 3, 4].map((n) => ({ n })), { maxAttempts: 5 });
  const seen = [];
  const events = await testing.drain(broker.client, task, {
    use: [(job, ctx, next) => {
      seen.push(job.json().n);
      return next();
    }],
  });
  const byN = Object.fromEntries(events.map((e) => [e.job.json().n, [e.outcome, e.error ?? null]]));
  assert.deepEqual(byN, {
    1: ['ack', null],
    2: ['dead-letter', 'two is bad'],
    3: ['nack', 'three failed'],
    4: ['retry', 'later'],
  });
  assert.deepEqual(seen.sort(), [1, 2, 3, 4]);
  const { stats } = await broker.admin.getQueue(q);
  // Nothing deliverable or leased is left; the nack and the retry wait for their backoff.
  assert.deepEqual([stats.available, stats.leased, stats.scheduled, stats.dead], [0, 0, 2, 1]);
});

test('drain: handlers by queue name, or a function setting up the worker', { timeout: 30000 }, async () => {
  const [a, b] = [queueName(), queueName()];
  await broker.client.enqueueBatch([{ queue: a, payload: 'a1' }, { queue: b, payload: 'b1' }, { queue: b, payload: 'b2' }]);
  const got = [];
  const events = await testing.drain(broker.client, { [a]: (job) => got.push(job.text()), [b]: (job) => got.push(job.text()) });
  assert.deepEqual(got.sort(), ['a1', 'b1', 'b2']);
  assert.deepEqual(events.map((e) => e.outcome), ['ack', 'ack', 'ack']);

  await broker.client.enqueue(a, 'a2');
  const events2 = await testing.drain(broker.client, (worker) => worker.handle(a, (job) => got.push(job.text())));
  assert.deepEqual(events2.map((e) => [e.outcome, e.job.text()]), [['ack', 'a2']]);
  // Drained: a second drain finds nothing.
  assert.deepEqual(await testing.drain(broker.client, { [a]: () => {}, [b]: () => {} }), []);
});

test('drain: rejects when the queue is not drained in time', { timeout: 30000 }, async () => {
  const q = queueName();
  await broker.client.enqueue(q, 'stuck');
  const started = Date.now();
  await assert.rejects(
    testing.drain(broker.client, { [q]: (job, { signal }) => new Promise((resolve) => signal.addEventListener('abort', resolve)) }, { timeoutMs: 1000, log: { warn() {} } }),
    /drain: the queues were not drained within 1000 ms/,
  );
  assert.ok(Date.now() - started < 10000);
  // The worker was stopped: the job went back to the queue.
  await eventually(async () => (await broker.admin.getQueue(q)).stats.available === 1, 10000, 'the job released');
});

test('startBroker: no binary is an error naming LEASEQ_BIN and PATH', async () => {
  const saved = { bin: process.env.LEASEQ_BIN, path: process.env.PATH };
  try {
    delete process.env.LEASEQ_BIN;
    process.env.PATH = '/nonexistent';
    await assert.rejects(testing.startBroker(), /LEASEQ_BIN is not set and there is no `leaseq` on PATH/);
    const plain = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'leaseq-js-')), 'leaseq');
    fs.writeFileSync(plain, '', { mode: 0o644 });
    process.env.LEASEQ_BIN = plain;
    await assert.rejects(testing.startBroker(), { message: `leaseq testing: LEASEQ_BIN=${plain} is not an executable file` });
    fs.rmSync(path.dirname(plain), { recursive: true });
  } finally {
    process.env.LEASEQ_BIN = saved.bin;
    process.env.PATH = saved.path;
  }
});

test('stop: the broker and its cluster exit, the temporary directory goes', { timeout: 90000 }, async () => {
  const b = await testing.startBroker();
  const postmaster = postmasterPid(b.dir);
  assert.ok(alive(b.pid) && alive(postmaster));
  await b.stop();
  assert.equal(alive(b.pid), false, 'broker exited');
  await eventually(() => !alive(postmaster), 10000, 'the embedded postmaster exited');
  assert.equal(fs.existsSync(b.dir), false, 'temp dir removed');
});

test('a process that exits without stop(): its broker is stopped and the directory removed', { timeout: 90000 }, async () => {
  const script = [
    "const { testing } = require('@leaseq/client');",
    'testing.startBroker().then((b) => {',
    "  const postmaster = Number(require('fs').readFileSync(b.dir + '/pg/data/postmaster.pid', 'utf8').split('\\n')[0]);",
    '  console.log(JSON.stringify({ pid: b.pid, dir: b.dir, postmaster }));',
    '  process.exit(0);',
    '});',
  ].join('\n');
  const { stdout } = await promisify(execFile)(process.execPath, ['-e', script], { cwd: __dirname, timeout: 80000 });
  const { pid, dir, postmaster } = JSON.parse(stdout);
  assert.ok(postmaster > 1);
  await eventually(() => !alive(pid), 30000, 'the orphaned broker exited');
  await eventually(() => !alive(postmaster), 30000, 'its embedded postmaster exited');
  await eventually(() => !fs.existsSync(dir), 30000, 'its directory was removed');
});
