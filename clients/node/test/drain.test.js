'use strict';
// A broker drain (SIGTERM to a broker of this file's own) under a busy
// worker, then a restart on the same port: every job is done, none is lost
// or dead-lettered.
const assert = require('node:assert/strict');
const { test } = require('node:test');
const { AdminClient, Client, Worker } = require('@leaseq/client');
const { Broker, queueName, quietLog, retryUnavailable, eventually } = require('../harness/helpers');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('drain and restart under load: nothing lost', { timeout: 90000 }, async () => {
  const own = await Broker.start();
  const client = new Client(own.addr);
  const admin = new AdminClient(client);
  const log = quietLog();
  let w;
  try {
    const q = queueName('drain');
    const total = 60;
    const sent = await client.enqueueBatch(Array.from({ length: total }, (_, i) => ({ queue: q, payload: String(i) })));
    const done = new Set();
    let drained = false;
    let afterDrain = 0;
    w = new Worker(client, { concurrency: 4, leaseMs: 5000, backoffInitialMs: 50, backoffMaxMs: 500, log }).handle(q, async () => {
      await sleep(40 + Math.random() * 60);
    });
    w.on('job', (e) => {
      if (e.outcome !== 'ack' || e.settleError) return;
      done.add(e.job.id);
      if (drained) afterDrain += 1;
    });
    const run = w.run();
    await eventually(() => done.size >= 15, 20000, '15 jobs done');
    const protocolBefore = w.protocol;

    // SIGTERM: the broker drains (streams end with UNAVAILABLE, unsettled
    // jobs are released with their attempt given back) and exits 0.
    assert.equal(await own.stop(), 0);
    drained = true;
    await own.start(); // same port
    await retryUnavailable(() => admin.getQueue(q));

    // Acked jobs are deleted; jobs whose ack was lost in the drain come again.
    await eventually(async () => {
      const { stats } = await admin.getQueue(q);
      return stats.available + stats.scheduled + stats.leased === 0;
    }, 40000, 'queue empty');
    await w.stop();
    await run;
    assert.ok(afterDrain > 0, 'the worker reconnected and went on');
    assert.ok(log.lines.some((l) => /reconnecting/.test(l)), 'the worker saw the stream end');
    const missing = sent.filter((r) => !done.has(r.jobId));
    assert.deepEqual(missing, [], 'every job acked by the worker');
    const { stats } = await admin.getQueue(q);
    assert.equal(stats.dead, 0);
    assert.equal(w.protocol, protocolBefore);
  } finally {
    w?.stop();
    client.close();
    await own.stop();
  }
});

test('enqueue: a drain ends the Produce stream; after the restart the next enqueue opens another', { timeout: 60000 }, async () => {
  const own = await Broker.start();
  const client = new Client(own.addr);
  try {
    const q = queueName('produce-restart');
    // Jobs awaited on the stream while the drain ends it: each is answered
    // (committed before the drain) or rejects UNAVAILABLE, none hangs.
    await client.enqueue(q, 'before');
    const inFlight = Array.from({ length: 20 }, (_, i) => client.enqueue(q, `during-${i}`).then(
      () => 'ok',
      (e) => (e.code === 14 ? 'unavailable' : `code ${e.code}`),
    ));
    assert.equal(await own.stop(), 0);
    const outcomes = await Promise.all(inFlight);
    assert.ok(outcomes.every((o) => o === 'ok' || o === 'unavailable'), outcomes.join());
    await own.start(); // same port
    const r = await retryUnavailable(() => client.enqueue(q, 'after'));
    assert.ok(r.jobId);
  } finally {
    client.close();
    await own.stop();
  }
});
