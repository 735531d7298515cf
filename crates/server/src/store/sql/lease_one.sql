-- lease.sql for a round of one want (one stream's slot, one queue) outside
-- the limited path ($8 false there): the same jobs, leased the same way, in
-- a leaner statement. A round for a single stream is the common one (a
-- stream draining a backlog, or taking what a wake-up found), and lease.sql
-- pays for its many wants on every row: the window numbering the rows for
-- the wants' ranges, its sort, and the UPDATE's join back to the picked
-- rows (a parameterised Tid Scan per row). Here the picked rows' ctids go
-- to one Tid Scan as an array, and the values lease.sql takes from the
-- want are parameters: 10.8 µs a job against 14.6 for 256 jobs of a
-- 60,000-job queue (docs/BENCHMARKS.md, "One stream's drain").
--
-- As lease.sql without $8: paused queues, jobs not due and jobs past their
-- ttl are never leased; a queue with a concurrency or rate limit, ordered
-- by key, or walking its keys (lease_keys.sql) is not leased here but named
-- by a marker row (slot -1) so the dispatcher sends it to the limited path.
-- So the key rule never applies here (it is for ordered queues only).
-- Times are the statement's, as in lease.sql.
--
-- $1 queue, $2 how many, $3 lease_ms (null: the queue's default), $4 slot,
-- $5 consumer, $6 this broker's id.
with queue as (
    select q.default_lease_ms, not q.paused as open,
        (q.concurrency_limit is not null or q.rate_limit is not null or q.ordered_by_key
         or leaseq.walks_keys(q)) as limited
    from leaseq.queues q
    where q.name = $1
),
picked as (
    select c.ctid
    from leaseq.jobs c
    where c.queue = $1
      and exists (select from queue q where q.open and not q.limited)
      and c.state = 'available'
      and c.run_at <= statement_timestamp()
      and (c.expires_at is null or c.expires_at > statement_timestamp())
    order by c.priority desc, c.run_at, c.id
    limit $2
    for update skip locked
),
lease as (
    select coalesce($3::int8, (select default_lease_ms from queue)) as lease_ms
),
leased as (
    update leaseq.jobs j set
        state = 'leased',
        attempt = j.attempt + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = statement_timestamp() + (select lease_ms from lease) * interval '1 millisecond',
        lease_broker = $6,
        leased_by = $5
    -- We hold the picked rows' locks, so their tuples cannot have moved.
    where j.ctid = any(array(select ctid from picked))
    returning $4::int4 as slot, (select lease_ms from lease) as lease_ms, j.id, j.queue,
        j.payload, j.headers::text as headers, j.priority, j.attempt, j.enqueued_at,
        j.last_error, j.lease_token, j.lease_expires_at, j.run_at, j.key
)
select slot, lease_ms, id, queue, payload, headers, priority, attempt, enqueued_at, last_error,
    lease_token, lease_expires_at, run_at, key
from leased
union all
select -1, null, null, $1, null, null, null, null, null, null, null, null, null, null
from queue q
where q.limited
-- The stream gets its jobs in delivery order (the update returns them in
-- whatever order it met them); the marker first.
order by slot, priority desc, run_at, id
