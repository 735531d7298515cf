'use strict';
// The README's examples (examples/*), run as programs against the broker;
// and the README shows each of them verbatim.
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const readline = require('node:readline');
const { after, before, test } = require('node:test');
const { AdminClient, Client } = require('@leaseq/client');
const { suiteBroker, queueName, jobGone, eventually, pgEnv, REPO } = require('../harness/helpers');
const { startSecureBroker } = require('../harness/secure');

const ROOT = path.join(__dirname, '..');
const EXAMPLES = fs.readdirSync(path.join(ROOT, 'examples')).sort();

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

/**
 * Starts `node examples/<name>`; `lines` collects its stdout, `waitFor(re)`
 * resolves on the first line matching, `exit` resolves to the exit code.
 */
function start(name, env = {}, timeoutMs = 30000) {
  const child = spawn(process.execPath, [path.join(ROOT, 'examples', name)], {
    cwd: ROOT,
    env: { ...process.env, LEASEQ_ADDR: broker.addr, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines = [];
  const waiters = [];
  readline.createInterface({ input: child.stdout }).on('line', (line) => {
    lines.push(line);
    for (const w of waiters) if (w.re.test(line)) w.resolve(line);
  });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const exit = new Promise((resolve) => child.on('exit', (code, signal) => {
    clearTimeout(timer);
    resolve(code ?? signal);
  }));
  return {
    child,
    lines,
    exit,
    get stderr() {
      return stderr;
    },
    waitFor(re) {
      const seen = lines.find((l) => re.test(l));
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        waiters.push({ re, resolve });
        exit.then((code) => reject(new Error(`${name} exited (${code}) before printing ${re}; stderr: ${stderr}`)));
      });
    },
  };
}

async function runToEnd(name, env) {
  const p = start(name, env);
  const code = await p.exit;
  assert.equal(code, 0, `${name} exited ${code}: ${p.stderr}`);
  return p.lines;
}

test('README shows every example verbatim', () => {
  const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
  for (const name of EXAMPLES) {
    const body = fs.readFileSync(path.join(ROOT, 'examples', name), 'utf8');
    assert.ok(readme.includes(body), `README.md should contain examples/${name} verbatim`);
  }
});

test('examples/exactly_once.mjs: each order shipped once, each shipping job acked with its email', { timeout: 30000 }, async () => {
  const q = queueName();
  const lines = await runToEnd('exactly_once.mjs', { QUEUE: q, ...pgEnv() });
  assert.deepEqual(lines.filter((l) => l.startsWith('shipped ')), ['shipped order-0', 'shipped order-1', 'shipped order-2']);
  assert.equal(lines.at(-1), 'settled in SQL 3 acked 2 follow-ups 2');
  const { jobs } = await admin.listJobs({ queue: `${q}.emails`, includePayload: true });
  assert.deepEqual(jobs.map((j) => j.payload.toString()).sort(), ['parcel-0 has shipped', 'parcel-1 has shipped']);
  assert.equal((await admin.getQueue(`${q}.orders`)).stats.available, 0);
});

test('examples/produce.mjs', { timeout: 30000 }, async () => {
  const q = queueName();
  const lines = await runToEnd('produce.mjs', { QUEUE: q });
  assert.match(lines[0], /^enqueued [0-9a-f-]{36} duplicate=false$/);
  assert.equal(lines[1], 'enqueued 2 more');
  const { jobs } = await admin.listJobs({ queue: q, includePayload: true });
  assert.deepEqual(jobs.map((j) => JSON.parse(j.payload).to).sort(), ['ada@example.com', 'bob@example.com', 'eve@example.com']);
  assert.deepEqual(jobs.map((j) => j.key).sort(), ['', '', 'customer-ada']);
  await admin.purgeQueue(q);
});

test('examples/consume.mjs: acks, dead-letters, stops on SIGTERM', { timeout: 30000 }, async () => {
  const q = queueName();
  const good = await client.enqueue(q, JSON.stringify({ to: 'ada@example.com' }));
  const bad = await client.enqueue(q, JSON.stringify({}));
  const p = start('consume.mjs', { QUEUE: q });
  await p.waitFor(/mail to ada@example.com/);
  await eventually(async () => (await admin.getQueue(q)).stats.dead === 1, 10000, 'dead letter');
  p.child.kill('SIGTERM');
  assert.equal(await p.exit, 0, p.stderr);
  assert.ok(await jobGone(admin, good.jobId));
  assert.equal((await admin.getJob(bad.jobId)).lastError, 'no recipient');
});

test('examples/worker.mjs: outcomes, a timeout, and a graceful SIGTERM', { timeout: 40000 }, async () => {
  const [emails, thumbs] = [queueName('emails'), queueName('thumbs')];
  const send = (to, extra = {}) => client.enqueue(emails, JSON.stringify({ to, ...extra }));
  const ok = await send('ada@example.com');
  const none = await client.enqueue(emails, '{}');
  const invalid = await send('x@example.invalid');
  const busy = await send('busy@example.com');
  const slow = await client.enqueue(thumbs, JSON.stringify({ ms: 5000 }), { maxAttempts: 1 });
  const p = start('worker.mjs', { EMAILS: emails, THUMBNAILS: thumbs });
  await p.waitFor(new RegExp(`${ok.jobId} attempt 1: ack$`));
  await p.waitFor(new RegExp(`${none.jobId} attempt 1: dead-letter \\(no recipient\\)$`));
  await p.waitFor(new RegExp(`${invalid.jobId} attempt 1: dead-letter \\(bad domain: x@example.invalid\\)$`));
  await p.waitFor(new RegExp(`${busy.jobId} attempt 1: retry`));
  await p.waitFor(new RegExp(`${busy.jobId} attempt 2: ack$`));
  await p.waitFor(new RegExp(`${slow.jobId} attempt 1: timeout \\(timeout: the handler did not finish within 500 ms\\)$`));
  assert.equal((await admin.getJob(slow.jobId)).deadReason, 'max_attempts');

  // SIGTERM while a job runs: it finishes, is acked, and the worker exits 0.
  const last = await send('last@example.com', { ms: 1500 });
  // Its handler started (a job only leased may still be on its way to the
  // worker: a stop releases it unrun).
  await p.waitFor(new RegExp(`${last.jobId} attempt 1: started$`));
  p.child.kill('SIGTERM');
  assert.equal(await p.exit, 0, p.stderr);
  assert.ok(p.lines.some((l) => l.endsWith(`${last.jobId} attempt 1: ack`)), p.lines.join('\n'));
  assert.ok(await jobGone(admin, last.jobId));
});

test('examples/tls.mjs against a TLS broker with tokens', { timeout: 30000 }, async () => {
  const sec = await startSecureBroker();
  try {
    const q = queueName('tls');
    const lines = await runToEnd('tls.mjs', {
      LEASEQ_ADDR: `https://${sec.addr}`,
      LEASEQ_TLS_CA: sec.certs.ca,
      LEASEQ_CLIENT_CERT: sec.certs.clientCert,
      LEASEQ_CLIENT_KEY: sec.certs.clientKey,
      LEASEQ_TLS_SERVER_NAME: 'localhost',
      LEASEQ_TOKEN: sec.tokens.ops,
      QUEUE: q,
    });
    assert.deepEqual(lines, ['got our job: over TLS', `queue ${q}: 0 available`]);
  } finally {
    await sec.stop();
  }
});

test('examples/tracing.mjs: the handler runs in the producer\'s trace', { timeout: 30000 }, async () => {
  const lines = await runToEnd('tracing.mjs', { QUEUE: queueName() });
  const producer = lines.find((l) => l.startsWith('producer trace ')).split(' ')[2];
  const handler = lines.find((l) => l.startsWith('handler trace ')).split(' ')[2];
  assert.match(producer, /^[0-9a-f]{32}$/);
  assert.equal(handler, producer);
});

test('examples/tasks.mjs: a typed task, middleware, burst mode exits when drained', { timeout: 30000 }, async () => {
  const q = queueName('emails');
  const lines = await runToEnd('tasks.mjs', { QUEUE: q });
  assert.deepEqual(lines.filter((l) => l.startsWith('mail')).sort(), [
    'mail to ada@example.com: hello (attempt 1)',
    'mail to bob@example.com: again (attempt 1)',
  ]);
  assert.equal(lines.filter((l) => new RegExp(`^${q} took \\d+ ms$`).test(l)).length, 2, lines.join('\n'));
  assert.equal(lines.at(-1), 'drained');
  const { stats } = await admin.getQueue(q);
  assert.deepEqual([stats.available, stats.leased, stats.scheduled], [0, 0, 0]);
});

test('examples/testing.mjs: a user\'s test file, on a throwaway broker of its own', { timeout: 120000 }, async () => {
  // NODE_TEST_CONTEXT unset: the example reports as a program run by hand (TAP), not to this runner.
  const p = start('testing.mjs', { NODE_TEST_CONTEXT: undefined, LEASEQ_ADDR: '', LEASEQ_BIN: process.env.LEASEQ_BIN || path.join(REPO, 'target', 'debug', 'leaseq') }, 110000);
  const code = await p.exit;
  assert.equal(code, 0, `testing.mjs exited ${code}: ${p.lines.join('\n')}${p.stderr}`);
  assert.ok(p.lines.includes('# pass 1') && p.lines.includes('# fail 0'), p.lines.join('\n'));
  assert.ok(p.lines.some((l) => /^ok 1 - a bad address is dead-lettered/.test(l)), p.lines.join('\n'));
});

test('examples/admin.mjs', { timeout: 30000 }, async () => {
  const q = queueName();
  const { jobId } = await client.enqueue(q, 'x');
  for await (const job of client.consume({ queues: [q] })) {
    await job.deadLetter('for the example');
    break;
  }
  const lines = await runToEnd('admin.mjs', { QUEUE: q });
  assert.equal(lines[0], `${q}: max 10 attempts, 0 available`);
  assert.ok(lines.includes(`dead ${jobId} (nacked): for the example`), lines.join('\n'));
  assert.ok(lines.includes('requeued 1'));
  assert.equal(lines.at(-1), `watch: ${q}=1`);
  await admin.purgeQueue(q);
});

test('examples/schedules.mjs', { timeout: 30000 }, async () => {
  const [name, q] = [queueName('sched'), queueName()];
  const lines = await runToEnd('schedules.mjs', { SCHEDULE: name, QUEUE: q });
  // 02:30 in Paris: 00:30 or 01:30 UTC, by the season.
  assert.match(lines[0], new RegExp(`^${name}: next run \\d{4}-\\d\\d-\\d\\dT0[01]:30:00\\.000Z$`));
  const jobId = lines[1].match(/^ran now: job ([0-9a-f-]{36})$/)[1];
  const job = await admin.getJob(jobId);
  assert.deepEqual([job.queue, JSON.parse(job.payload).kind, job.headers['leaseq-schedule']], [q, 'daily', name]);
  assert.ok(lines.includes(`${name} 0 3 * * MON-FRI Europe/Paris (paused)`), lines.join('\n'));
  await assert.rejects(admin.getSchedule(name), /NOT_FOUND/);
  await admin.purgeQueue(q);
});

test('examples/cancel.mjs: the cancel aborts the handler, nothing is settled', { timeout: 30000 }, async () => {
  const q = queueName('reports');
  const lines = await runToEnd('cancel.mjs', { QUEUE: q });
  const jobId = lines.find((l) => l.startsWith('cancelled ')).split(' ')[1];
  assert.deepEqual([...lines].sort(), [
    `${jobId}: cancelled`,
    `cancelled ${jobId} (leased: true)`,
    `handler stopped: cancelled: job ${jobId} was cancelled (CancelJob)`,
    'stats: 1 cancelled, 0 acked',
  ].sort());
  assert.ok(await jobGone(admin, jobId));
  const { stats } = await admin.getQueue(q);
  assert.deepEqual([stats.available, stats.leased, stats.dead], [0, 0, 0]);
});

test('examples/require.cjs', { timeout: 30000 }, async () => {
  assert.deepEqual(await runToEnd('require.cjs', { QUEUE: queueName() }), ['round trip: from CommonJS']);
});
