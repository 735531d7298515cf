-- Moves waiting jobs past their ttl to the dead letters with reason 'expired'.
-- (Leased jobs past their ttl are dead-lettered when their lease ends.)
with gone as (
    delete from leaseq.jobs
    -- An array, not `in (...)`: planned on an empty table, a semi join read
    -- all of jobs_pkey to match the ids.
    where id = any(array(
        select id from leaseq.jobs
        where expires_at <= now() and state = 'available'
        -- Through jobs_ttl, oldest first: Store::expire_ttl prices
        -- sequential scans and sorts out, so no plan reads every waiting job.
        order by expires_at
        limit $1
        for update skip locked
    ))
    returning id, queue, priority, payload, headers, attempt, max_attempts, dedup_key, enqueued_at, last_error, key
)
-- Returns how many per queue (for the per-queue metrics).
, dead as (
    insert into leaseq.dead_jobs
        (id, queue, priority, payload, headers, attempt, max_attempts, dedup_key, enqueued_at, last_error, reason, key)
    select id, queue, priority, payload, headers, attempt, max_attempts, dedup_key, enqueued_at, last_error, 'expired', key
    from gone
    on conflict (id) do nothing
    returning queue
)
select queue, count(*) as "n!" from dead group by queue
