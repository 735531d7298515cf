-- Inserts new jobs; one matching a live job's (queue, dedup_key) is skipped
-- and the caller looks that job up. Times are the database's. Returns the
-- rows inserted.
--
-- A job with `handoff` is inserted already leased to an idle stream of the
-- broker `broker` (this one, or another replica that offered its credit), as
-- lease.sql would lease it, if its queue is neither paused nor limited and,
-- for a keyed job of a queue ordered by key, its key has fewer than
-- key_concurrency live jobs (leaseq.key_free_for_handoff, which locks the
-- queue's row as a lease round does); otherwise it is inserted available
-- (dispatch/offers.rs). Its lease token
-- comes from the broker (`token`; enqueue_one.sql says why).
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
from unnest($1::uuid[], $2::text[], $3::int4[], $4::timestamptz[], $5::int8[],
            $6::bytea[], $7::text[], $8::int4[], $9::text[], $10::int8[],
            $11::bool[], $12::int8[], $13::text[], $14::uuid[], $15::uuid[], $16::text[],
            $17::int8[])
    as i(id, queue, priority, run_at, delay_ms, payload, headers, max_attempts, dedup_key,
         ttl_ms, handoff, lease_ms, consumer, broker, token, key, unique_for_ms)
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
