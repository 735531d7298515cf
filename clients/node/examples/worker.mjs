// A worker: a handler per queue, outcomes, timeouts, graceful stop.
import { setTimeout as sleep } from 'node:timers/promises';
import { Client, DeadLetter, Retry, Worker } from '@leaseq/client';

const { EMAILS = 'emails', THUMBNAILS = 'thumbnails' } = process.env;
const client = new Client(process.env.LEASEQ_ADDR ?? '127.0.0.1:50051');
const worker = new Worker(client, { concurrency: 8, timeoutMs: 30_000, graceMs: 10_000 });

worker.handle(EMAILS, async (job, { signal }) => {
  console.log(`${job.queue} ${job.id} attempt ${job.attempt}: started`);
  const { to, ms = 10 } = job.json();
  if (!to) return new DeadLetter('no recipient'); // returned or thrown, the same
  if (to.endsWith('.invalid')) throw new DeadLetter(`bad domain: ${to}`);
  if (to.startsWith('busy@') && job.attempt === 1) return new Retry({ after: 1_000 }); // again in 1 s
  await sleep(ms, undefined, { signal }); // the work; stops if the signal aborts
  // Resolving acks; any other error nacks with its message (retried with backoff).
});

// This queue's own timeout: after 500 ms the signal aborts and the job is nacked.
worker.handle(THUMBNAILS, async (job, { signal }) => {
  await sleep(job.json().ms, undefined, { signal });
}, { timeoutMs: 500 });

worker.on('job', (e) => {
  console.log(`${e.job.queue} ${e.job.id} attempt ${e.job.attempt}: ${e.outcome}${e.error ? ` (${e.error})` : ''}`);
});
worker.stopOnSignals(); // SIGTERM / SIGINT: no new jobs, running ones finish and settle
await worker.run();
client.close();
