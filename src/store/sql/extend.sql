-- Extends leases, counted from now (database clock). Only the holder of the
-- current token may extend, and only while the lease has not yet expired: an
-- expired lease may already be on its way to another consumer.
update leaseq.jobs j set
    lease_expires_at = now() + i.lease_ms * interval '1 millisecond'
from unnest($1::uuid[], $2::uuid[], $3::int8[]) as i(id, token, lease_ms)
where j.id = i.id and j.lease_token = i.token and j.lease_expires_at > now()
returning j.id, j.lease_expires_at, j.lease_broker, i.lease_ms
