-- Settings and live statistics of a page of queues (by name), or of the named
-- queues. Counts are exact (count(*) over the page's jobs): the admin API and
-- the metrics timer run this every few seconds at most, never per job.
--
-- Keys (issue 33): `keys_leased` is exact (the partial index jobs_key_leased
-- holds only leased jobs, bounded by the streams' credit). `keys_waiting`
-- walks the queue's waiting keys in key order, one probe of jobs_key each
-- (a loose index scan: the jobs of a key are skipped, not read), and stops
-- after $5 + 1 keys: its cost is bounded by $5 probes whatever the number
-- of keys or of jobs per key, and a queue without keyed jobs pays one probe
-- that finds nothing. A count of $5 + 1 means "more than $5". The probes
-- read a job's state from the table (it is not in the index); they pass
-- over leased jobs only, which are few.
--
-- $1 names (null = all), $2 after this name (null = from the start), $3 page
-- size, $4 this broker's id (its leases, for free credit), $5 the most
-- waiting keys counted.
with recursive page as (
    select q.* from leaseq.queues q
    where ($1::text[] is null or q.name = any($1))
      and ($2::text is null or q.name > $2)
    order by q.name
    limit $3
),
live as (
    select j.queue,
        count(*) filter (where j.state = 'available' and j.run_at <= now()) as available,
        count(*) filter (where j.state = 'available' and j.run_at > now()) as scheduled,
        count(*) filter (where j.state = 'leased') as leased,
        count(*) filter (where j.state = 'leased' and j.lease_broker = $4) as leased_here,
        count(distinct j.leased_by) filter (where j.state = 'leased') as consumers,
        min(j.run_at) filter (where j.state = 'available' and j.run_at <= now()) as oldest
    from leaseq.jobs j
    where j.queue in (select name from page)
    group by j.queue
),
waiting_keys (queue, key, n) as (
    select p.name,
        (select j.key from leaseq.jobs j
         where j.queue = p.name and j.key is not null and j.state <> 'leased'
         order by j.key limit 1),
        1::int8
    from page p
    union all
    select w.queue,
        (select j.key from leaseq.jobs j
         where j.queue = w.queue and j.key > w.key and j.state <> 'leased'
         order by j.key limit 1),
        w.n + 1
    from waiting_keys w
    where w.key is not null and w.n <= $5
),
keys as (
    select w.queue, count(w.key) as waiting
    from waiting_keys w
    group by w.queue
),
leased_keys as (
    select j.queue, count(distinct j.key) as leased
    from leaseq.jobs j
    where j.queue in (select name from page) and j.key is not null and j.state = 'leased'
    group by j.queue
),
dead as (
    select d.queue, count(*) as dead
    from leaseq.dead_jobs d
    where d.queue in (select name from page)
    group by d.queue
)
select p.name, p.default_lease_ms, p.max_attempts, p.backoff_base_ms, p.backoff_cap_ms,
    p.completed_retention_ms, p.paused, p.created_at,
    p.concurrency_limit, p.rate_limit, p.ordered_by_key, p.key_concurrency,
    case when p.rate_limit is not null
        then coalesce(p.rate_burst, greatest(1, ceil(p.rate_limit))::int4) end as rate_burst,
    p.fair_by_key, p.key_rate_limit, p.key_overrides,
    case when p.key_rate_limit is not null
        then coalesce(p.key_rate_burst, greatest(1, ceil(p.key_rate_limit))::int4) end as key_rate_burst,
    coalesce(l.available, 0) as "available!",
    coalesce(l.scheduled, 0) as "scheduled!",
    coalesce(l.leased, 0) as "leased!",
    coalesce(l.leased_here, 0) as "leased_here!",
    coalesce(l.consumers, 0) as "consumers!",
    (extract(epoch from (now() - l.oldest)) * 1000)::int8 as oldest_age_ms,
    coalesce(d.dead, 0) as "dead!",
    coalesce(k.waiting, 0) as "keys_waiting!",
    coalesce(lk.leased, 0) as "keys_leased!"
from page p
left join live l on l.queue = p.name
left join dead d on d.queue = p.name
left join keys k on k.queue = p.name
left join leased_keys lk on lk.queue = p.name
order by p.name
