-- Debounce (EnqueueRequest.on_duplicate = REPLACE): the waiting job that
-- holds each (queue, dedup_key) takes the new payload, headers, priority
-- and delivery time (run_at, or now() + delay: a trailing-edge debounce);
-- its id, attempt count, max_attempts, expiry, key and unique_for stay.
--
-- Invariant: only a job that is 'available' (ready, delayed, or waiting to
-- retry) is changed, never a leased one, whose handler has the payload it
-- was given. Each row is locked in its turn (the broker passes the keys
-- sorted, so two replacing statements never deadlock). A lease round that
-- holds the row first (lease.sql, lease_keys.sql) makes it 'leased': the
-- lock waits for it, rechecks the row and finds it leased, so it is left
-- alone (the caller answers `replaced = false`). A lease round that comes
-- later skips the row while it is locked and leases the new version once
-- this transaction commits: no lease carries the old payload after the
-- replace answered.
with target as (
    select j.id, i.payload, i.headers, i.priority, i.run_at, i.delay_ms
    from unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::int4[],
                $6::timestamptz[], $7::int8[])
        with ordinality as i(queue, dedup_key, payload, headers, priority, run_at, delay_ms, n)
    cross join lateral (
        select j.id
        from leaseq.jobs j
        where j.queue = i.queue and j.dedup_key = i.dedup_key and j.state = 'available'
        for update of j
    ) j
    order by i.n
)
update leaseq.jobs j
set payload = t.payload,
    headers = t.headers::jsonb,
    priority = t.priority,
    run_at = coalesce(t.run_at, now() + t.delay_ms * interval '1 millisecond')
from target t
where j.id = t.id
returning j.id, j.queue, j.dedup_key as "dedup_key!",
    -- Milliseconds until deliverable (0 = now): feeds the wake-up notification.
    greatest(0, ceil(extract(epoch from (j.run_at - now())) * 1000))::int8 as "delay_ms!"
