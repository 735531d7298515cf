-- Settings and live statistics of a page of queues (by name), or of the named
-- queues. Counts are exact (count(*) over the page's jobs): the admin API and
-- the metrics timer run this every few seconds at most, never per job.
--
-- $1 names (null = all), $2 after this name (null = from the start), $3 page
-- size, $4 this broker's id (its leases, for free credit).
with page as (
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
    coalesce(d.dead, 0) as "dead!"
from page p
left join live l on l.queue = p.name
left join dead d on d.queue = p.name
order by p.name
