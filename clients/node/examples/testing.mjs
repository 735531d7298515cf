// Your handlers' tests against a throwaway broker (`node --test`): the real
// `leaseq serve` (LEASEQ_BIN, else `leaseq` on PATH) on an embedded
// PostgreSQL in a temporary directory, and drain() to run the handlers.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { DeadLetter, defineTask, testing } from '@leaseq/client';

const sendEmail = defineTask('emails', async ({ to }) => {
  if (!to.includes('@')) throw new DeadLetter(`bad address: ${to}`);
});

let broker;
before(async () => (broker = await testing.startBroker())); // one per file: initdb takes seconds
after(() => broker.stop());

test('a bad address is dead-lettered', async () => {
  await sendEmail.enqueueMany(broker.client, [{ to: 'ada@example.com' }, { to: 'nobody' }]);
  const events = await testing.drain(broker.client, sendEmail); // until the queue is empty
  assert.deepEqual(events.map((e) => e.outcome).sort(), ['ack', 'dead-letter']);
  assert.equal((await broker.admin.getQueue('emails')).stats.dead, 1);
});
