-- Extends leases, counted from now (database clock). Only the holder of the
-- current token may extend, and only while the lease has not yet expired: an
-- expired lease may already be on its way to another consumer. Rows are
-- locked in id order (see ack.sql).
with target as (
    -- As in ack.sql: each id locked in a lateral subquery of its own (a
    -- primary-key probe whatever the statistics say), in the order the
    -- broker passes them (sorted by id); the update finds its rows by an
    -- id array.
    select j.id, i.lease_ms
    from unnest($1::uuid[], $2::uuid[], $3::int8[]) with ordinality as i(id, token, lease_ms, n)
    cross join lateral (
        select j.id from leaseq.jobs j
        where j.id = i.id and j.lease_token = i.token and j.lease_expires_at > now()
        for update of j
    ) j
    order by i.n
)
update leaseq.jobs j set
    lease_expires_at = now() + t.lease_ms * interval '1 millisecond'
from target t
where j.id = t.id and j.id = any(array(select t2.id from target t2))
returning j.id, j.lease_token as "lease_token!", j.lease_expires_at as "lease_expires_at!", j.lease_broker, t.lease_ms as "lease_ms!"
