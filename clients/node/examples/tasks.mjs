// Tasks: a payload type declared once for producer and worker, middleware
// around every handler, and burst mode (work what is waiting, then exit).
import { Client, defineTask, Worker } from '@leaseq/client';

const client = new Client(process.env.LEASEQ_ADDR ?? '127.0.0.1:50051');

/** @type {import('@leaseq/client').Task<{ to: string, subject: string }>} */
const sendEmail = defineTask(process.env.QUEUE ?? 'emails', async ({ to, subject }, job) => {
  if (!to.includes('@')) throw new Error(`bad address: ${to}`);
  console.log(`mail to ${to}: ${subject} (attempt ${job.attempt})`);
});

// The producer: the payload is JSON of the task's type.
await sendEmail.enqueueMany(client, [
  { to: 'ada@example.com', subject: 'hello' },
  { to: 'bob@example.com', subject: 'again' },
]);

// The worker: burst mode stops once nothing was delivered or running for 500 ms.
const worker = new Worker(client, { burst: true, burstIdleMs: 500 });
worker.register(sendEmail);
worker.use(async (job, ctx, next) => {
  const started = Date.now();
  try {
    return await next();
  } finally {
    console.log(`${job.queue} took ${Date.now() - started} ms`);
  }
});
await worker.run(); // resolves once the queue is drained
console.log('drained');
client.close();
