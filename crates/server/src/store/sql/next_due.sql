-- For each queue, milliseconds until its next delayed job becomes deliverable
-- (null: none), so dispatchers wake at run_at without polling; and whether a
-- job is deliverable now (`ready`). The fallback poll asks only this: a
-- queue with a job ready gets a lease round, a drained one keeps its
-- streams' hand-off offers (a poll that leased blindly took them back and
-- sent every job of the next milliseconds the slow way: a stall every
-- poll, docs/BENCHMARKS.md).
select q.name as "name!",
    (select ceil(extract(epoch from (j.run_at - now())) * 1000)::int8
     from leaseq.jobs j
     where j.queue = q.name and j.state = 'available' and j.run_at > now()
       and j.run_at > j.enqueued_at
     order by j.run_at
     limit 1) as due_ms,
    exists (
        select 1 from leaseq.jobs j
        where j.queue = q.name and j.state = 'available' and j.run_at <= now()
    ) as "ready!"
from unnest($1::text[]) as q(name)
