'use strict';
// TLS, mutual TLS and bearer tokens, against a broker of this file's own
// started with --tls-cert/--tls-key/--tls-client-ca and --auth-file.
const assert = require('node:assert/strict');
const fs = require('node:fs');
const { after, before, test } = require('node:test');
const { AdminClient, Client, Worker, status } = require('@leaseq/client');
const { queueName, Inbox, quietLog, jobGone } = require('../harness/helpers');
const { startSecureBroker } = require('../harness/secure');

let sec;
before(async () => {
  sec = await startSecureBroker();
});
after(async () => {
  await sec?.stop();
});

const clients = [];
function connect(opts) {
  const c = new Client(sec.addr, { callTimeoutMs: 10000, ...opts });
  clients.push(c);
  return c;
}
after(() => clients.forEach((c) => c.close()));

test('mTLS with tokens: produce, work, admin', { timeout: 30000 }, async () => {
  const producer = connect({ tls: sec.tls, token: sec.tokens.producer });
  const worker = connect({ tls: sec.tls, token: sec.tokens.worker });
  const ops = new AdminClient(sec.addr, { tls: sec.tls, token: sec.tokens.ops });
  try {
    const q = queueName('tls');
    const { jobId } = await producer.enqueue(q, 'secret');
    const got = new Inbox();
    const w = new Worker(worker, { log: quietLog() }).handle(q, async (job) => got.put(job));
    const run = w.run();
    const job = await got.get();
    await w.stop();
    await run;
    assert.deepEqual([job.id, job.text()], [jobId, 'secret']);
    assert.ok(await jobGone(ops, jobId));
    assert.ok((await ops.getQueue(q)).createdAt instanceof Date);
  } finally {
    ops.close();
  }
});

test('an https:// address with PEM contents and a token function', { timeout: 30000 }, async () => {
  const [host, port] = [sec.addr.slice(0, sec.addr.lastIndexOf(':')), sec.addr.slice(sec.addr.lastIndexOf(':') + 1)];
  let asked = 0;
  const c = new Client(`https://${host}:${port}`, {
    tls: {
      ca: fs.readFileSync(sec.certs.ca),
      cert: fs.readFileSync(sec.certs.clientCert, 'utf8'),
      key: fs.readFileSync(sec.certs.clientKey),
      serverName: 'localhost',
    },
    token: () => {
      asked += 1;
      return sec.tokens.ops;
    },
  });
  clients.push(c);
  const q = queueName('tls');
  await c.enqueue(q, 'x');
  for await (const job of c.consume({ queues: [q], log: quietLog() })) {
    await job.ack();
    break;
  }
  assert.ok(asked >= 2, 'the token function is asked per call');
});

test('no token: UNAUTHENTICATED', { timeout: 30000 }, async () => {
  const c = connect({ tls: sec.tls });
  await assert.rejects(c.enqueue(queueName('tls'), 'x'), { code: status.UNAUTHENTICATED });
  const w = new Worker(c, { log: quietLog() }).handle(queueName('tls'), async () => {});
  await assert.rejects(w.run(), { code: status.UNAUTHENTICATED });
});

test('an unknown token: UNAUTHENTICATED', { timeout: 30000 }, async () => {
  const c = connect({ tls: sec.tls, token: 'not-a-token-of-this-broker' });
  await assert.rejects(c.enqueue(queueName('tls'), 'x'), { code: status.UNAUTHENTICATED });
});

test('grants: a producer token cannot consume, a worker token cannot enqueue or administer', { timeout: 30000 }, async () => {
  const producer = connect({ tls: sec.tls, token: sec.tokens.producer });
  const worker = connect({ tls: sec.tls, token: sec.tokens.worker });
  const q = queueName('tls');
  await assert.rejects(
    (async () => {
      for await (const job of producer.consume({ queues: [q], log: quietLog() })) await job.ack();
    })(),
    (e) => e.code === status.PERMISSION_DENIED && /producer/.test(e.details),
  );
  await assert.rejects(worker.enqueue(q, 'x'), (e) => e.code === status.PERMISSION_DENIED && /enqueue/.test(e.details));
  await assert.rejects(producer.enqueue('elsewhere', 'x'), { code: status.PERMISSION_DENIED });
  const admin = new AdminClient(worker);
  await assert.rejects(admin.listQueues(), { code: status.PERMISSION_DENIED });
});

test('mutual TLS: no client certificate, or a server CA we do not trust, fails', { timeout: 30000 }, async () => {
  const noCert = connect({ tls: { caFile: sec.certs.ca, serverName: 'localhost' }, token: sec.tokens.ops, callTimeoutMs: 5000 });
  await assert.rejects(noCert.enqueue(queueName('tls'), 'x'), { code: status.UNAVAILABLE });
  const wrongCa = connect({ tls: { ...sec.tls, caFile: sec.certs.otherCa }, token: sec.tokens.ops, callTimeoutMs: 5000 });
  await assert.rejects(wrongCa.enqueue(queueName('tls'), 'x'), { code: status.UNAVAILABLE });
  const plaintext = connect({ token: sec.tokens.ops, callTimeoutMs: 5000 });
  await assert.rejects(plaintext.enqueue(queueName('tls'), 'x'), { code: status.UNAVAILABLE });
});

test('bad TLS options are refused up front', () => {
  assert.throws(() => new Client(sec.addr, { tls: { certFile: sec.certs.clientCert } }), /both cert and key/);
  assert.throws(() => new Client(sec.addr, { tls: { ca: 'x', caFile: sec.certs.ca } }), /not both/);
  assert.throws(() => new Client(sec.addr, { token: '' }), /token/);
});
