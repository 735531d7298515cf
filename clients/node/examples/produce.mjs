// Produce: one job, then a batch (all or none).
import { Client } from '@leaseq/client';

const client = new Client(process.env.LEASEQ_ADDR ?? '127.0.0.1:50051');
const queue = process.env.QUEUE ?? 'emails';

const { jobId, duplicate } = await client.enqueue(queue, JSON.stringify({ to: 'ada@example.com' }), {
  headers: { 'content-type': 'application/json' },
  priority: 5, // higher first
  dedupKey: 'welcome-ada', // while this job is live, the same key returns it
  key: 'customer-ada', // in a queue ordered by key, a key's jobs go out in enqueue order
  maxAttempts: 5,
});
console.log(`enqueued ${jobId} duplicate=${duplicate}`);

const results = await client.enqueueBatch([
  { queue, payload: JSON.stringify({ to: 'bob@example.com' }) },
  { queue, payload: JSON.stringify({ to: 'eve@example.com' }), delayMs: 1000 },
]);
console.log(`enqueued ${results.length} more`);
client.close();
