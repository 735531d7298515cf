// The operator API: queues, settings, jobs, dead letters.
import { AdminClient } from '@leaseq/client';

const admin = new AdminClient(process.env.LEASEQ_ADDR ?? '127.0.0.1:50051');
const queue = process.env.QUEUE ?? 'emails';

const info = await admin.updateQueue(queue, {
  create: true, // instead of NOT_FOUND for a queue not used yet
  maxAttempts: 10,
  backoffBaseMs: 2_000,
  defaultLeaseMs: 60_000,
});
console.log(`${info.name}: max ${info.settings.maxAttempts} attempts, ${info.stats.available} available`);

for (const q of (await admin.listQueues({ pageSize: 10 })).queues) {
  console.log(`${q.name} available=${q.stats.available} leased=${q.stats.leased} dead=${q.stats.dead}`);
}

const dead = await admin.listDeadLetters({ queue, includePayload: true });
for (const job of dead.jobs) console.log(`dead ${job.id} (${job.deadReason}): ${job.lastError}`);
if (dead.jobs.length > 0) {
  const { requeued } = await admin.requeueDeadLetters({ queue, ids: dead.jobs.map((j) => j.id) });
  console.log(`requeued ${requeued}`);
}

// Live statistics: pushed at once, then on every change (here: the first push only).
for await (const update of admin.watchQueues({ queues: [queue], intervalMs: 5_000 })) {
  console.log(`watch: ${update.queues.map((q) => `${q.name}=${q.stats.available}`).join(' ')}`);
  break;
}
admin.close();
