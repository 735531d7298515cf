// Consume with an async iterator until SIGINT / SIGTERM. Settles travel on
// the stream; leaving the loop releases the jobs not settled.
import { Client } from '@leaseq/client';

const client = new Client(process.env.LEASEQ_ADDR ?? '127.0.0.1:50051');
const stop = new AbortController();
process.once('SIGINT', () => stop.abort());
process.once('SIGTERM', () => stop.abort());

const jobs = client.consume({ queues: [process.env.QUEUE ?? 'emails'], maxInFlight: 8, signal: stop.signal });
for await (const job of jobs) {
  const { to } = job.json();
  if (!to) {
    await job.deadLetter('no recipient');
    continue;
  }
  console.log(`job ${job.id} attempt ${job.attempt}: mail to ${to}`);
  await job.ack();
}
client.close();
