// Cancel reaches the handler: AdminClient.cancelJob on a running job aborts
// its signal; the job is gone, and nothing the handler does next is settled.
import { setTimeout as sleep } from 'node:timers/promises';
import { AdminClient, Client, JobCancelledError, Worker } from '@leaseq/client';

const { QUEUE = 'reports' } = process.env;
const client = new Client(process.env.LEASEQ_ADDR ?? '127.0.0.1:50051');
const admin = new AdminClient(client);
const worker = new Worker(client, { concurrency: 1 });

let started;
const running = new Promise((resolve) => (started = resolve));
worker.handle(QUEUE, async (job, { signal }) => {
  started(job.id);
  try {
    await sleep(3_600_000, undefined, { signal }); // an hour of work, unless aborted
  } catch (e) {
    if (signal.reason instanceof JobCancelledError) console.log(`handler stopped: ${signal.reason.message}`);
    throw e; // thrown or returned, nothing is settled now
  }
});
worker.on('job', (e) => {
  console.log(`${e.job.id}: ${e.outcome}`);
  if (e.outcome === 'cancelled') void worker.stop();
});

const work = worker.run();
const { jobId } = await client.enqueue(QUEUE, JSON.stringify({ report: 'monthly' }));
await running;
const { wasLeased } = await admin.cancelJob(jobId); // from anywhere: the CLI, the console, another process
console.log(`cancelled ${jobId} (leased: ${wasLeased})`);
await work;
console.log(`stats: ${worker.stats.cancelled} cancelled, ${worker.stats.acked} acked`);
client.close();
