'use strict';
// AdminClient's schedules (issue 34 item 1) against a real broker: the eight
// RPCs, the defaults filled in, a cron that fires, and the errors.
const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { AdminClient, Client, status } = require('@leaseq/client');
const { suiteBroker, queueName, eventually } = require('../harness/helpers');

let broker;
let client;
let admin;
before(async () => {
  broker = await suiteBroker();
  client = new Client(broker.addr);
  admin = new AdminClient(client);
});
after(async () => {
  client.close();
  await broker.stop();
});

test('schedules: create, get, list, pause, resume, run now, update, delete', { timeout: 30000 }, async () => {
  const [name, q] = [queueName('sched'), queueName()];
  const created = await admin.createSchedule(name, {
    cron: '0 0 1 1 *', // once a year: only runSchedule enqueues here
    timeZone: 'Europe/Paris',
    job: { queue: q, payload: '{"report":"daily"}', headers: { team: 'ops' }, priority: 3, maxAttempts: 4, ttlMs: 60000 },
    overlap: 'skip',
    catchUp: 'all',
    catchUpLimit: 5,
  });
  assert.deepEqual(
    { ...created, nextRunAt: null, createdAt: null, updatedAt: null, job: { ...created.job, payload: created.job.payload.toString() } },
    {
      name, cron: '0 0 1 1 *', timeZone: 'Europe/Paris',
      job: { queue: q, payload: '{"report":"daily"}', headers: { team: 'ops' }, priority: 3, maxAttempts: 4, ttlMs: 60000 },
      overlap: 'skip', catchUp: 'all', catchUpLimit: 5, paused: false,
      nextRunAt: null, lastTickAt: null, lastJobId: '', createdAt: null, updatedAt: null,
    },
  );
  assert.ok(created.nextRunAt > new Date(), `next run ${created.nextRunAt} is ahead`);
  // New Year's midnight in Paris is 23:00 UTC (CET, +1).
  assert.equal(created.nextRunAt.getUTCHours(), 23);
  assert.ok(created.createdAt instanceof Date && created.updatedAt instanceof Date);
  await assert.rejects(admin.createSchedule(name, { cron: '@daily', job: { queue: q } }), { code: status.ALREADY_EXISTS });
  assert.deepEqual(await admin.getSchedule(name), created);

  // Paginated listing: every schedule once, in name order.
  const other = `${name}-b`;
  await admin.createSchedule(other, { cron: '@daily', job: { queue: q } });
  const names = [];
  let pageToken = '';
  do {
    const page = await admin.listSchedules({ pageSize: 1, pageToken });
    assert.ok(page.schedules.length <= 1);
    names.push(...page.schedules.map((s) => s.name));
    pageToken = page.nextPageToken;
  } while (pageToken);
  assert.deepEqual(names, [...names].sort());
  assert.ok(names.indexOf(name) >= 0 && names.indexOf(other) === names.indexOf(name) + 1, names.join(' '));

  assert.equal((await admin.pauseSchedule(name)).paused, true);
  assert.equal((await admin.getSchedule(name)).paused, true);

  // Run now: a job appears, from the template, whatever the pause.
  const run = await admin.runSchedule(name);
  const job = await admin.getJob(run.jobId);
  assert.equal(job.queue, q);
  assert.equal(job.payload.toString(), '{"report":"daily"}');
  assert.deepEqual([job.priority, job.maxAttempts], [3, 4]);
  assert.equal(job.headers.team, 'ops');
  assert.equal(job.headers['leaseq-schedule'], name);
  assert.equal(new Date(job.headers['leaseq-schedule-tick']).getTime(), run.tickAt.getTime());
  assert.ok(job.expiresAt instanceof Date);
  const afterRun = await admin.getSchedule(name);
  assert.equal(afterRun.lastJobId, run.jobId);
  assert.equal(afterRun.lastTickAt.getTime(), run.tickAt.getTime());
  assert.equal(afterRun.nextRunAt.getTime(), created.nextRunAt.getTime(), 'the next tick stays where it was');

  assert.equal((await admin.resumeSchedule(name)).paused, false);

  // Only the fields given change; a new job replaces the whole template.
  const updated = await admin.updateSchedule(name, { cron: '30 6 * * MON-FRI', overlap: 'allow' });
  assert.deepEqual([updated.cron, updated.overlap, updated.timeZone, updated.catchUp, updated.catchUpLimit, updated.job.headers],
    ['30 6 * * MON-FRI', 'allow', 'Europe/Paris', 'all', 5, { team: 'ops' }]);
  const replaced = await admin.updateSchedule(name, { job: { queue: q, payload: 'v2' }, paused: true, catchUp: 'none', timeZone: 'UTC' });
  assert.deepEqual(
    [replaced.job.payload.toString(), replaced.job.headers, replaced.job.priority, replaced.job.ttlMs, replaced.paused, replaced.catchUp, replaced.timeZone],
    ['v2', {}, 0, null, true, 'none', 'UTC'],
  );

  await admin.deleteSchedule(name);
  await assert.rejects(admin.getSchedule(name), { code: status.NOT_FOUND });
  await assert.rejects(admin.deleteSchedule(name), { code: status.NOT_FOUND });
  assert.equal((await admin.getJob(run.jobId)).queue, q, 'the jobs it enqueued stay');
  await admin.deleteSchedule(other);
  await admin.purgeQueue(q);
});

test('schedules: the defaults filled in, and a cron that fires on its own', { timeout: 30000 }, async () => {
  const [name, q] = [queueName('sched'), queueName()];
  const s = await admin.createSchedule(name, { cron: '* * * * * *', job: { queue: q, payload: 'tick' } });
  assert.deepEqual([s.timeZone, s.overlap, s.catchUp, s.catchUpLimit, s.paused], ['UTC', 'allow', 'one', 10, false]);
  try {
    // Every second: the broker's schedule loop enqueues the jobs.
    const { jobs } = await eventually(async () => {
      // NOT_FOUND until the first tick makes the queue.
      const list = await admin.listJobs({ queue: q, includePayload: true }).catch((e) => {
        if (e.code === status.NOT_FOUND) return { jobs: [] };
        throw e;
      });
      return list.jobs.length >= 2 && list;
    }, 15000, 'two ticks enqueued');
    for (const j of jobs) {
      assert.equal(j.payload.toString(), 'tick');
      assert.equal(j.headers['leaseq-schedule'], name);
    }
    const ticks = jobs.map((j) => Date.parse(j.headers['leaseq-schedule-tick']));
    assert.equal(new Set(ticks).size, ticks.length, 'one job per tick');
    assert.ok(ticks.every((t) => t % 1000 === 0), 'ticks on whole seconds');
  } finally {
    await admin.deleteSchedule(name);
  }
  await admin.purgeQueue(q);
});

test('schedules: bad input is INVALID_ARGUMENT naming the field, and creates nothing', { timeout: 30000 }, async () => {
  const [name, q] = [queueName('sched'), queueName()];
  const bad = async (spec, field) => {
    await assert.rejects(admin.createSchedule(name, spec), (e) => {
      assert.equal(e.code, status.INVALID_ARGUMENT, e.message);
      assert.match(e.details, new RegExp(`^${field.replace(/\./g, '\\.')}\\b`), e.details);
      return true;
    });
  };
  await bad({ cron: 'every tuesday', job: { queue: q } }, 'schedule.cron');
  await bad({ cron: '0 0 30 2 *', job: { queue: q } }, 'schedule.cron'); // never fires
  await bad({ cron: '@daily', timeZone: 'Mars/Olympus_Mons', job: { queue: q } }, 'schedule.time_zone');
  await bad({ cron: '@daily', job: { queue: '' } }, 'schedule.job.queue');
  await bad({ cron: '@daily', job: { queue: q, headers: { 'leaseq-schedule': 'x' } } }, 'schedule.job.headers');
  await bad({ cron: '@daily', job: { queue: q }, catchUp: 'all', catchUpLimit: 1001 }, 'schedule.catch_up_limit');
  await assert.rejects(admin.createSchedule('bad name!', { cron: '@daily', job: { queue: q } }), (e) => e.code === status.INVALID_ARGUMENT && /schedule\.name/.test(e.details));
  await assert.rejects(admin.getSchedule(name), { code: status.NOT_FOUND });

  // Updates: the field named, the schedule unchanged.
  const s = await admin.createSchedule(name, { cron: '@daily', job: { queue: q } });
  await assert.rejects(admin.updateSchedule(name, { cron: 'nope' }), (e) => e.code === status.INVALID_ARGUMENT && /\bcron\b/.test(e.details));
  await assert.rejects(admin.updateSchedule(name, { timeZone: 'Nowhere/Land' }), (e) => e.code === status.INVALID_ARGUMENT && /time_zone/.test(e.details));
  assert.deepEqual(await admin.getSchedule(name), s);
  // A policy the SDK does not know is refused before any call.
  await assert.rejects(admin.updateSchedule(name, { overlap: 'sometimes' }), /overlap: expected one of allow, skip, not "sometimes"/);
  await assert.rejects(admin.updateSchedule(queueName('sched'), { paused: true }), { code: status.NOT_FOUND });
  await admin.deleteSchedule(name);
});
