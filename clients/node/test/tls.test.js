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

// The same address forms and settings as every leaseq client.
function withEnv(vars, fn) {
  const saved = {};
  for (const [k, v] of Object.entries(vars)) {
    saved[k] = process.env[k];
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  try {
    return fn();
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

test('https:// without a CA trusts the system roots (SSL_CERT_FILE)', { timeout: 30000 }, async () => {
  const certOnly = { certFile: sec.certs.clientCert, keyFile: sec.certs.clientKey };
  const trusted = withEnv({ SSL_CERT_FILE: sec.certs.ca }, () =>
    connect({ tls: certOnly, token: sec.tokens.ops }));
  const forced = new Client(`https://${sec.addr}`, { tls: certOnly, token: sec.tokens.ops, callTimeoutMs: 10000 });
  clients.push(forced);
  // The https:// form itself turns TLS on, with the system's roots.
  const viaScheme = withEnv({ SSL_CERT_FILE: sec.certs.ca }, () =>
    new Client(`https://${sec.addr}`, { tls: certOnly, token: sec.tokens.ops, callTimeoutMs: 10000 }));
  clients.push(viaScheme);
  const untrusted = withEnv({ SSL_CERT_FILE: sec.certs.otherCa }, () =>
    connect({ tls: certOnly, token: sec.tokens.ops, callTimeoutMs: 5000 }));
  await trusted.enqueue(queueName('tls'), 'system roots');
  await viaScheme.enqueue(queueName('tls'), 'system roots, https://');
  await assert.rejects(untrusted.enqueue(queueName('tls'), 'x'), { code: status.UNAVAILABLE });
});

test('LEASEQ_ADDR, LEASEQ_TOKEN and the TLS variables fill what is not given', { timeout: 30000 }, async () => {
  const vars = {
    LEASEQ_ADDR: sec.addr, // host:port: TLS because LEASEQ_TLS_CA names a CA
    LEASEQ_TLS_CA: sec.certs.ca,
    LEASEQ_CLIENT_CERT: sec.certs.clientCert,
    LEASEQ_CLIENT_KEY: sec.certs.clientKey,
    LEASEQ_TOKEN: sec.tokens.ops,
  };
  const c = withEnv(vars, () => new Client());
  clients.push(c);
  const admin = withEnv(vars, () => new AdminClient());
  try {
    const { jobId } = await c.enqueue(queueName('tls'), 'from the environment');
    assert.equal((await admin.getJob(jobId)).id, jobId);
  } finally {
    admin.close();
  }
  // An explicit option wins over its variable.
  const anonymous = withEnv(vars, () => new Client(null, { token: () => 'not-a-token-of-this-broker' }));
  clients.push(anonymous);
  await assert.rejects(anonymous.enqueue(queueName('tls'), 'x'), { code: status.UNAUTHENTICATED });
});

test('address forms that cannot work are refused up front', () => {
  assert.throws(() => new Client(`http://${sec.addr}`, { tls: sec.tls }), /http:\/\/ is plaintext/);
  assert.throws(() => new Client(`grpc://${sec.addr}`), /scheme/);
  assert.throws(
    () => withEnv({ LEASEQ_TLS_CA: sec.certs.ca }, () => new Client(`http://${sec.addr}`)),
    /http:\/\/ is plaintext/,
  );
});
