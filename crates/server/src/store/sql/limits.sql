-- What the limits of these queues allow right now. The caller has locked the
-- queue rows in an earlier statement of its transaction, so this statement's
-- snapshot is taken after the previous lock holder committed: its leases are
-- counted and its token bucket update is seen.
--
-- slots: concurrency limit minus the queue's unexpired leases (null = no
-- concurrency limit). tokens: the rate bucket refilled up to now (null = no
-- rate limit); a bucket never set (or just changed) starts full.
select q.name, q.paused, q.ordered_by_key,
    -- Leased by lease_keys.sql.
    leaseq.walks_keys(q) as "walks_keys!",
    case when q.concurrency_limit is not null then
        q.concurrency_limit - (
            select count(*) from leaseq.jobs j
            where j.queue = q.name and j.state = 'leased'
              and j.lease_expires_at > statement_timestamp())
    end as slots,
    q.rate_limit,
    case when q.rate_limit is not null then
        least(b.burst, case
            when q.rate_tokens is null or q.rate_at is null then b.burst
            else q.rate_tokens + q.rate_limit
                * greatest(0, extract(epoch from statement_timestamp() - q.rate_at))::float8
        end)
    end as tokens,
    statement_timestamp() as "at!"
from leaseq.queues q
cross join lateral (
    select coalesce(q.rate_burst, greatest(1, ceil(q.rate_limit)))::float8 as burst
) b
where q.name = any($1)
