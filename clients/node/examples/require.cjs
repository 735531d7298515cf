// CommonJS: the same package through require().
const { Client } = require('@leaseq/client');

async function main() {
  const client = new Client(process.env.LEASEQ_ADDR ?? '127.0.0.1:50051');
  const queue = process.env.QUEUE ?? 'emails';
  const { jobId } = await client.enqueue(queue, 'from CommonJS');
  for await (const job of client.consume({ queues: [queue] })) {
    console.log(`${job.id === jobId ? 'round trip' : 'other job'}: ${job.text()}`);
    await job.ack();
    break;
  }
  client.close();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
