-- Deletes per-key rate buckets (leaseq.key_buckets) that are full again,
-- and those of queues without a per-key rate any more: a key without a row
-- has a full bucket (lease_keys.sql), so the table holds only the keys that
-- started jobs within about a bucket's refill time. At most $1 rows a
-- pass; rows a lease round is writing are passed over.
with gone as (
    select b.ctid
    from leaseq.key_buckets b
    join leaseq.queues q on q.name = b.queue
    cross join lateral (
        select coalesce((q.key_overrides -> b.key ->> 'rate_limit')::float8, q.key_rate_limit) as rate,
            case when q.key_overrides -> b.key ? 'rate_limit'
                then greatest(1, ceil((q.key_overrides -> b.key ->> 'rate_limit')::float8))
                else coalesce(q.key_rate_burst, greatest(1, ceil(q.key_rate_limit)))
            end as burst
    ) s
    where s.rate is null
       or b.tokens + s.rate * greatest(0, extract(epoch from now() - b.at))::float8 >= s.burst
    limit $1
    for update of b skip locked
)
delete from leaseq.key_buckets b
using gone
where b.ctid = gone.ctid
