// Schedules: a cron expression, read in a time zone, enqueues a job made
// from a template at each tick, once per tick whatever the number of brokers.
import { AdminClient } from '@leaseq/client';

const admin = new AdminClient(process.env.LEASEQ_ADDR ?? '127.0.0.1:50051');
const name = process.env.SCHEDULE ?? 'nightly-report';

const s = await admin.createSchedule(name, {
  cron: '30 2 * * *', // 02:30 every day
  timeZone: 'Europe/Paris',
  job: { queue: process.env.QUEUE ?? 'reports', payload: JSON.stringify({ kind: 'daily' }), ttlMs: 3_600_000 },
  overlap: 'skip', // no new job while the last one is still waiting or running
});
console.log(`${s.name}: next run ${s.nextRunAt.toISOString()}`);

const { jobId } = await admin.runSchedule(name); // once, now, whatever the cron
console.log(`ran now: job ${jobId}`);

await admin.updateSchedule(name, { cron: '0 3 * * MON-FRI' }); // only the fields given change
await admin.pauseSchedule(name);
for (const sch of (await admin.listSchedules()).schedules) {
  console.log(`${sch.name} ${sch.cron} ${sch.timeZone}${sch.paused ? ' (paused)' : ''}`);
}
await admin.deleteSchedule(name); // the jobs it enqueued stay
admin.close();
