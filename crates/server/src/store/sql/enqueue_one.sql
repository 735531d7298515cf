-- enqueue.sql for exactly one job: the same insert, the same hand-off and
-- the same result, with the job's fields as plain parameters instead of
-- arrays. A light load enqueues one job per statement, and there this form
-- costs PostgreSQL 60-100 us less CPU per job than unnest over thirteen
-- one-element arrays (docs/BENCHMARKS.md, "The hops measured apart").
-- Keep the two statements alike. The lease token of a job handed off comes
-- from the broker ($15): gen_random_uuid() goes through OpenSSL's RAND, which
-- cost PostgreSQL about 35 us per job at 100 jobs/s (docs/BENCHMARKS.md,
-- "PostgreSQL's share of the Enqueue call at 100/s").
insert into leaseq.jobs
    (id, queue, priority, run_at, payload, headers, max_attempts, dedup_key, expires_at,
     key, state, attempt, lease_token, lease_expires_at, lease_broker, leased_by,
     unique_for_ms)
select
    i.id, i.queue, i.priority,
    coalesce(i.run_at, now() + i.delay_ms * interval '1 millisecond'),
    i.payload, i.headers::jsonb, i.max_attempts, i.dedup_key,
    now() + i.ttl_ms * interval '1 millisecond',
    i.key,
    case when h.lease_ms is null then 'available' else 'leased' end,
    case when h.lease_ms is null then 0 else 1 end,
    case when h.lease_ms is not null then i.token end,
    now() + h.lease_ms * interval '1 millisecond',
    case when h.lease_ms is not null then i.broker end,
    case when h.lease_ms is not null then i.consumer end,
    i.unique_for_ms
from (select $1::uuid as id, $2::text as queue, $3::int4 as priority,
             $4::timestamptz as run_at, $5::int8 as delay_ms, $6::bytea as payload,
             $7::text as headers, $8::int4 as max_attempts, $9::text as dedup_key,
             $10::int8 as ttl_ms, $11::bool as handoff, $12::int8 as lease_ms,
             $13::text as consumer, $14::uuid as broker, $15::uuid as token,
             $16::text as key, $17::int8 as unique_for_ms) as i
left join lateral (
    select coalesce(i.lease_ms, q.default_lease_ms) as lease_ms
    from leaseq.queues q
    where i.handoff and q.name = i.queue and not q.paused
      and q.concurrency_limit is null and q.rate_limit is null
      -- Per-key limits or fair shares: the key walk decides (lease_keys.sql).
      and not leaseq.walks_keys(q)
      -- A keyed job of a queue ordered by key: only while its key is free,
      -- checked under the queue row's lock (migration keys_handoff). The
      -- CASE calls the function for a job with a claim only: as a plain AND
      -- qual it was called for every keyed row, each taking the lock.
      and case when i.handoff and q.ordered_by_key and i.key is not null
          then leaseq.key_free_for_handoff(q.name, i.key, coalesce(q.key_concurrency, 1))
          else true end
) h on true
-- A dedup key held after its job completed (unique_for): not inserted,
-- the caller answers with the holding job (leaseq.dedup_holds).
where i.dedup_key is null or not exists (
    select 1 from leaseq.dedup_holds d
    where d.queue = i.queue and d.dedup_key = i.dedup_key and d.until > now())
on conflict (queue, dedup_key) where dedup_key is not null do nothing
returning id, queue,
    -- Milliseconds until deliverable (0 = now): feeds the wake-up notification.
    greatest(0, ceil(extract(epoch from (run_at - now())) * 1000))::int8 as "delay_ms!",
    lease_token, lease_expires_at, enqueued_at,
    -- The lease given (lease_expires_at was now() plus exactly this).
    (extract(epoch from (lease_expires_at - now())) * 1000)::int8 as lease_ms,
    -- Set by enqueue_handover.sql when it sent the hand-over.
    null::text as notified
