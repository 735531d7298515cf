-- Ends leases that did not succeed: Nack, a stream closing with unsettled
-- jobs, a broker draining, an expired lease. Only rows whose current lease
-- token matches are touched (fencing).
--
-- A job is dead-lettered when asked (reason 'nacked'), when its ttl has passed
-- ('expired'), or when this was its last attempt ('max_attempts'); otherwise it
-- is made available again after `retry_ms` (null = the queue's exponential
-- backoff with jitter). `refund` gives the attempt back (the broker, not the
-- consumer, ended the lease) and never dead-letters for attempts.
-- `slot_freed`: the queue has a concurrency limit, a per-key concurrency
-- limit or is ordered by key, so
-- its waiting consumers are woken at once whatever happens to the job (a
-- slot, or a dead-lettered job's key, freed).
--
-- As in ack.sql: each id is locked in a lateral subquery of its own (a
-- primary-key probe whatever the statistics say), in the order the broker
-- passes them (sorted by id), and the writes find their rows by an id array.
with input as (
    select * from unnest($1::uuid[], $2::uuid[], $3::text[], $4::int8[], $5::bool[], $6::bool[])
        with ordinality as i(id, token, error, retry_ms, dead, refund, n)
),
cur as (
    select j.id, i.token, j.queue, j.lease_broker, i.error, i.refund,
        (q.concurrency_limit is not null or q.ordered_by_key
            or q.key_concurrency is not null or q.key_overrides is not null) as slot_freed,
        case
            when i.dead then 'nacked'
            when j.expires_at is not null and j.expires_at <= now() then 'expired'
            when not i.refund and j.attempt >= coalesce(j.max_attempts, q.max_attempts) then 'max_attempts'
        end as death,
        coalesce(
            i.retry_ms,
            (least(q.backoff_cap_ms, q.backoff_base_ms * power(2, least(greatest(j.attempt - 1, 0), 40)))
                * (0.5 + random() / 2))::int8
        ) as retry_ms
    from input i
    cross join lateral (
        select j.id, j.queue, j.lease_broker, j.expires_at, j.attempt, j.max_attempts
        from leaseq.jobs j
        where j.id = i.id and j.lease_token = i.token
        for update of j
    ) j
    join leaseq.queues q on q.name = j.queue
    -- Locked in id order, like every settle statement: no deadlocks.
    order by i.n
),
buried as (
    delete from leaseq.jobs j
    using cur c
    where j.id = c.id and c.death is not null
        and j.id = any(array(select d.id from cur d where d.death is not null))
    returning j.id, j.queue, j.priority, j.payload, j.headers, j.attempt, j.max_attempts,
        j.dedup_key, j.enqueued_at, c.error, c.death, j.key
),
dead as (
    insert into leaseq.dead_jobs
        (id, queue, priority, payload, headers, attempt, max_attempts, dedup_key, enqueued_at, last_error, reason,
         key)
    select id, queue, priority, payload, headers, attempt, max_attempts, dedup_key, enqueued_at, error, death,
        key
    from buried
    on conflict (id) do nothing
),
retried as (
    update leaseq.jobs j set
        state = 'available',
        lease_token = null,
        lease_expires_at = null,
        lease_broker = null,
        leased_by = null,
        -- A refunded lease (the broker let go of it: a drain, or a stream
        -- that closed before the job reached it) leaves no trace: the job
        -- keeps its place in line and its last consumer's error.
        last_error = case when c.refund then j.last_error else c.error end,
        attempt = case when c.refund then greatest(j.attempt - 1, 0) else j.attempt end,
        run_at = case when c.refund then j.run_at
                      else now() + c.retry_ms * interval '1 millisecond' end
    from cur c
    where j.id = c.id and c.death is null
        and j.id = any(array(select r.id from cur r where r.death is null))
    returning j.id
)
select c.id, c.token as "token!", c.queue, c.lease_broker, c.death, c.retry_ms as "retry_ms!", c.slot_freed as "slot_freed!" from cur c
