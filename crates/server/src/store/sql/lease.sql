-- Leases jobs for many streams of this broker in one statement.
--
-- Each `want` row asks for the jobs numbered (lo, hi] of its queue, in
-- delivery order (priority desc, run_at, enqueue order), for one stream slot.
-- Rows are claimed with `for update skip locked`, so concurrent brokers never
-- take the same job, and each leased job gets a fresh fencing token.
-- Paused queues and jobs past their ttl are never leased.
--
-- In a queue with `ordered_by_key`, a keyed job is leased only while fewer
-- than the queue's key_concurrency (default 1) jobs of its key are either
-- enqueued before it and still in leaseq.jobs (waiting, delayed for a
-- retry, or leased) or leased: so a key's jobs go out in enqueue order, a
-- retry keeps its place at the head, a dead-lettered, acked or cancelled
-- job (deleted from jobs) lets the next go, and never more than
-- key_concurrency of a key are leased, even when a job enqueued
-- concurrently with a smaller id commits after a later one was leased.
-- The probes count, for each candidate J the scan meets, the key's jobs
-- enqueued before J and not leased (jobs_key, which holds no leased row: a
-- lease then writes no entry there) and the key's leased jobs whatever
-- their id (jobs_key_leased): the same count, as J is not leased. A key
-- held back is passed over, so one slow key holds back only itself.
-- Ordered queues are leased only with $8 (store/limits.rs), under their
-- queue row's lock: each round's snapshot sees the previous round's leases,
-- so two rounds cannot each lease a job of one key.
--
-- Queues with per-key limits or fair shares (see lease_keys.sql) are never
-- leased here: store/limits.rs leases them with lease_keys.sql.
--
-- Queues with a concurrency or rate limit, or ordered by key, are leased
-- only when $8 is true:
-- the caller (store/limits.rs) has then locked their queue rows and trimmed
-- the asks to what the limits allow. Otherwise such a queue is skipped and
-- reported by a marker row (slot -1) so the dispatcher sends it there.
--
-- Times are the statement's (statement_timestamp()), not the transaction's
-- now(): in a limited round this statement runs after the wait for the
-- queue rows' lock, and a lease stamped at the transaction's start began,
-- by its expiry, before the rate bucket that allowed it was read
-- (limits.sql reads the bucket at its statement's time). Alone, in its own
-- transaction, the two are the same.
with want as (
    select * from unnest($1::text[], $2::int4[], $3::int4[], $4::int8[], $5::int4[], $6::text[])
        as w(queue, lo, hi, lease_ms, slot, consumer)
),
per_queue as (
    select w.queue, max(w.hi) as n, q.default_lease_ms,
        case when q.ordered_by_key then coalesce(q.key_concurrency, 1) end as key_n
    from want w join leaseq.queues q on q.name = w.queue and not q.paused
        and not leaseq.walks_keys(q)
        and ($8 or (q.concurrency_limit is null and q.rate_limit is null and not q.ordered_by_key))
    group by w.queue, q.default_lease_ms, q.ordered_by_key, q.key_concurrency
),
picked as (
    select j.ctid, j.id, j.queue, pq.default_lease_ms,
        row_number() over (partition by j.queue order by j.priority desc, j.run_at, j.id) as rn
    from per_queue pq
    cross join lateral (
        select c.ctid, c.id, c.queue, c.priority, c.run_at
        from leaseq.jobs c
        where c.queue = pq.queue
          and c.state = 'available'
          and c.run_at <= statement_timestamp()
          and (c.expires_at is null or c.expires_at > statement_timestamp())
          and (pq.key_n is null or c.key is null or (
              select count(*) from (
                  select from leaseq.jobs e
                  where e.queue = c.queue and e.key = c.key and e.state <> 'leased'
                    and e.id < c.id
                  limit pq.key_n
              ) ahead
          ) + (
              select count(*) from (
                  select from leaseq.jobs e
                  where e.queue = c.queue and e.key = c.key and e.state = 'leased'
                  limit pq.key_n
              ) leased
          ) < pq.key_n)
        order by c.priority desc, c.run_at, c.id
        limit pq.n
        for update skip locked
    ) j
),
assigned as (
    select p.ctid, p.id, p.rn, w.slot, w.consumer, coalesce(w.lease_ms, p.default_lease_ms) as lease_ms
    from picked p
    join want w on w.queue = p.queue and p.rn > w.lo and p.rn <= w.hi
),
leased as (
    update leaseq.jobs j set
        state = 'leased',
        attempt = j.attempt + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = statement_timestamp() + a.lease_ms * interval '1 millisecond',
        lease_broker = $7,
        leased_by = a.consumer
    from assigned a
    -- Rows are reached by ctid (a parameterised Tid Scan per row): we hold their
    -- row locks, so the tuple cannot have moved, and the planner can neither
    -- hash-join the whole table (it cannot estimate `assigned`) nor re-probe the
    -- primary key with an id array per row, which cost half the statement.
    where j.ctid = a.ctid
    returning a.slot, a.lease_ms, j.id, j.queue, j.payload, j.headers::text as headers, j.priority,
        j.attempt, j.enqueued_at, j.last_error, j.lease_token, j.lease_expires_at, a.rn, j.run_at,
        j.key
)
select * from leased
union all
select -1, null, null, q.name, null, null, null, null, null, null, null, null, null, null, null
from leaseq.queues q
where not $8
  and q.name in (select queue from want)
  and (q.concurrency_limit is not null or q.rate_limit is not null or q.ordered_by_key
       or leaseq.walks_keys(q))
-- Each stream gets its jobs in delivery order (the update returns them in
-- whatever order it met them).
order by 1, 13
