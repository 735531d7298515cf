-- Completes jobs. Only the holder of the current lease token may settle a
-- job: a stale token matches no row and the caller gets FAILED_PRECONDITION.
delete from leaseq.jobs j
using unnest($1::uuid[], $2::uuid[]) as i(id, token)
where j.id = i.id and j.lease_token = i.token
returning j.id, j.lease_broker
