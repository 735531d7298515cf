// Exactly-once effects: a job's effect and its ack commit together.
//   <QUEUE>.orders    the handler writes a shipment row and acks its job with
//                     `select leaseq.ack($1, $2)` in one transaction of the
//                     broker's database (`pg`), then returns
//                     Ack.settledInSql(): the worker sends no ack. A crash
//                     before the commit leaves neither; after it, both.
//   <QUEUE>.shipping  the handler acks with a follow-up job on <QUEUE>.emails
//                     (new Ack({ enqueue })): it exists iff the ack committed.
// The database: DATABASE_URL, else libpq's PGHOST, PGUSER, PGDATABASE...
import pg from 'pg';
import { Ack, Client, Worker } from '@leaseq/client';

const queue = process.env.QUEUE ?? 'shop';
const db = new pg.Pool(process.env.DATABASE_URL ? { connectionString: process.env.DATABASE_URL } : {});
const table = `${queue.replace(/[^A-Za-z0-9_]/g, '_')}_shipments`;
// No unique key: an effect applied twice would show as two rows.
await db.query(`create table if not exists ${table} (job_id uuid not null, order_ref text not null)`);

const client = new Client(process.env.LEASEQ_ADDR ?? '127.0.0.1:50051');
await client.enqueueBatch(['order-0', 'order-1', 'order-2'].map((payload) => ({ queue: `${queue}.orders`, payload })));
await client.enqueueBatch(['parcel-0', 'parcel-1'].map((payload) => ({ queue: `${queue}.shipping`, payload })));

const worker = new Worker(client, { concurrency: 4, burst: true });
worker.handle(`${queue}.orders`, async (job) => {
  const tx = await db.connect();
  try {
    await tx.query('begin');
    await tx.query(`insert into ${table} (job_id, order_ref) values ($1, $2)`, [job.id, job.text()]);
    await tx.query('select leaseq.ack($1, $2)', [job.id, job.leaseToken]);
    await tx.query('commit'); // the effect and the ack, together
  } catch (e) {
    await tx.query('rollback');
    throw e; // nacked (or, if the lease was lost, nothing to settle)
  } finally {
    tx.release();
  }
  return Ack.settledInSql();
});
worker.handle(`${queue}.shipping`, async (job) => new Ack({ enqueue: [{ queue: `${queue}.emails`, payload: `${job.text()} has shipped` }] }));
await worker.run(); // burst: returns once nothing is waiting or running

const { rows } = await db.query(`select order_ref from ${table} order by order_ref`);
for (const r of rows) console.log(`shipped ${r.order_ref}`);
const s = worker.stats;
console.log(`settled in SQL ${s.settledInSql} acked ${s.acked} follow-ups ${s.followUps}`);
await db.end();
client.close();
