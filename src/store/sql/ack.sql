-- Completes jobs. Only the holder of the current lease token may settle a
-- job: a stale token matches no row and the caller gets FAILED_PRECONDITION.
-- Rows are locked in id order first: concurrent settle statements (acks,
-- nacks, releases, extends) then never deadlock on each other.
-- `slot_freed` names the queue when it has a concurrency limit: its waiting
-- consumers (on any replica) are woken, since a slot just freed.
with target as (
    select j.id, j.queue
    from leaseq.jobs j
    join unnest($1::uuid[], $2::uuid[]) as i(id, token) on j.id = i.id and j.lease_token = i.token
    order by j.id
    for update of j
)
delete from leaseq.jobs j
using target t
left join leaseq.queues q on q.name = t.queue and q.concurrency_limit is not null
where j.id = t.id
returning j.id, j.lease_token, j.lease_broker, q.name as slot_freed
