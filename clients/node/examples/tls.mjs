// TLS (here mutual TLS) and a bearer token: every client takes the same options.
import { AdminClient, Client } from '@leaseq/client';

const address = process.env.LEASEQ_ADDR ?? 'https://broker.example.com:50051';
const options = {
  tls: {
    caFile: process.env.LEASEQ_TLS_CA, // the broker's CA; leave out for the system roots
    certFile: process.env.LEASEQ_CLIENT_CERT, // a client certificate, for --tls-client-ca
    keyFile: process.env.LEASEQ_CLIENT_KEY,
    serverName: process.env.LEASEQ_TLS_SERVER_NAME, // if the address is not the certificate's name
  },
  token: process.env.LEASEQ_TOKEN, // sent as `authorization: Bearer <token>`
};
const client = new Client(address, options);
const admin = new AdminClient(address, options);

const queue = process.env.QUEUE ?? 'audit';
const { jobId } = await client.enqueue(queue, 'over TLS');
for await (const job of client.consume({ queues: [queue] })) {
  console.log(`got ${job.id === jobId ? 'our job' : job.id}: ${job.text()}`);
  await job.ack();
  break;
}
const { stats } = await admin.getQueue(queue);
console.log(`queue ${queue}: ${stats.available} available`);
admin.close();
client.close();
