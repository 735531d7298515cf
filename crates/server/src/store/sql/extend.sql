-- Extends leases, counted from now (database clock). Only the holder of the
-- current token may extend, and only while the lease has not yet expired: an
-- expired lease may already be on its way to another consumer. Rows are
-- locked in id order (see ack.sql).
with target as (
    select j.id, i.lease_ms
    from leaseq.jobs j
    join unnest($1::uuid[], $2::uuid[], $3::int8[]) as i(id, token, lease_ms)
        on j.id = i.id and j.lease_token = i.token
    where j.lease_expires_at > now()
    order by j.id
    for update of j
)
update leaseq.jobs j set
    lease_expires_at = now() + t.lease_ms * interval '1 millisecond'
from target t
where j.id = t.id
returning j.id, j.lease_expires_at as "lease_expires_at!", j.lease_broker, t.lease_ms as "lease_ms!"
