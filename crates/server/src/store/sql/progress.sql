-- Records held jobs' progress (ConsumeRequest.progress, ReportProgress).
-- Only the holder of the current lease token may report: a stale token
-- matches no job and writes nothing (the caller answers it
-- FAILED_PRECONDITION). The latest report per job is kept. Returns the
-- jobs written.
--
-- The broker passes one entry per job, in id order (the upsert locks the
-- rows in that order, so two statements never deadlock). The job's row is
-- only read, not locked: progress is advice, and a report racing the
-- job's ack may leave a row for a job that is gone, which the retention
-- loop deletes (delete_orphan_progress.sql). Each id is probed by its
-- primary key in a lateral subquery of its own, as ack.sql does.
insert into leaseq.job_progress as p (job_id, fraction, message, at)
select j.id, i.fraction, i.message, now()
from unnest($1::uuid[], $2::uuid[], $3::float4[], $4::text[]) with ordinality
    as i(id, token, fraction, message, n)
cross join lateral (
    select j.id from leaseq.jobs j where j.id = i.id and j.lease_token = i.token
) j
order by i.n
on conflict (job_id) do update
    set fraction = excluded.fraction, message = excluded.message, at = excluded.at
returning p.job_id
