// Produce: one job, then a batch (all or none).
import { Client } from '@leaseq/client';

const client = new Client(process.env.LEASEQ_ADDR ?? '127.0.0.1:50051');
const queue = process.env.QUEUE ?? 'emails';

const { jobId, duplicate } = await client.enqueue(queue, JSON.stringify({ to: 'ada@example.com' }), {
  headers: { 'content-type': 'application/json' },
  priority: 5, // higher first
  dedupKey: 'welcome-ada', // while this job is live, the same key returns it
  uniqueForMs: 24 * 3600 * 1000, // and for a day after it completes
  key: 'customer-ada', // in a queue ordered by key, a key's jobs go out in enqueue order
  maxAttempts: 5,
});
console.log(`enqueued ${jobId} duplicate=${duplicate}`);

// Debounce: the key's job is still waiting, so it takes this payload (and
// headers, priority, delay) and keeps its id (and its window).
const latest = await client.enqueue(queue, JSON.stringify({ to: 'ada@example.com', lang: 'fr' }), {
  headers: { 'content-type': 'application/json' },
  priority: 5,
  dedupKey: 'welcome-ada',
  onDuplicate: 'replace',
});
if (!latest.replaced || latest.jobId !== jobId) throw new Error('the waiting job was not replaced');

const results = await client.enqueueBatch([
  { queue, payload: JSON.stringify({ to: 'bob@example.com' }) },
  { queue, payload: JSON.stringify({ to: 'eve@example.com' }), delayMs: 1000 },
]);
console.log(`enqueued ${results.length} more`);
client.close();
