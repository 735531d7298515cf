-- For each queue, milliseconds until its next delayed job becomes deliverable
-- (null: none), so dispatchers wake at run_at without polling.
select q.name as "name!",
    (select ceil(extract(epoch from (j.run_at - now())) * 1000)::int8
     from leaseq.jobs j
     where j.queue = q.name and j.state = 'available' and j.run_at > now()
       and j.run_at > j.enqueued_at
     order by j.run_at
     limit 1) as due_ms
from unnest($1::text[]) as q(name)
