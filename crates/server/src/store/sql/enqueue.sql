-- Inserts a batch of new jobs. A job whose (queue, dedup_key) matches a live
-- job is skipped (on conflict do nothing); the caller then looks that job up.
-- run_at is computed with the database clock: `now() + delay`, or the given
-- instant. Returns the rows actually inserted.
insert into leaseq.jobs
    (id, queue, priority, run_at, payload, headers, max_attempts, dedup_key, expires_at)
select
    i.id, i.queue, i.priority,
    coalesce(i.run_at, now() + i.delay_ms * interval '1 millisecond'),
    i.payload, i.headers::jsonb, i.max_attempts, i.dedup_key,
    now() + i.ttl_ms * interval '1 millisecond'
from unnest($1::uuid[], $2::text[], $3::int4[], $4::timestamptz[], $5::int8[],
            $6::bytea[], $7::text[], $8::int4[], $9::text[], $10::int8[])
    as i(id, queue, priority, run_at, delay_ms, payload, headers, max_attempts, dedup_key, ttl_ms)
on conflict (queue, dedup_key) where dedup_key is not null do nothing
returning id, queue,
    -- Milliseconds until deliverable (0 = now): feeds the wake-up notification.
    greatest(0, ceil(extract(epoch from (run_at - now())) * 1000))::int8 as delay_ms
