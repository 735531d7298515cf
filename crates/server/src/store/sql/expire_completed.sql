-- Deletes completed records older than their queue's retention, at most $1
-- rows, oldest first within each queue. A queue whose retention was cleared
-- (null or 0) keeps none. Every broker runs this: rows another one is
-- deleting are skipped, so running it twice at once is harmless.
--
-- One index range scan per queue (completed_jobs_queue); the rows are then
-- reached by ctid (a Tid Scan): we hold their row locks, so they cannot move.
-- Runs with the sweeps' planner settings (Store::expire_completed): with the
-- defaults, its generic plan made on an empty table read all of
-- completed_jobs for the ctids instead (tests/plans.rs).
with doomed as (
    select c.ctid
    from leaseq.queues q
    cross join lateral (
        select c.ctid from leaseq.completed_jobs c
        where c.queue = q.name
          and c.completed_at <= now() - coalesce(q.completed_retention_ms, 0) * interval '1 millisecond'
        order by c.completed_at
        limit $1
        for update skip locked
    ) c
    limit $1
)
delete from leaseq.completed_jobs
where ctid = any(array(select d.ctid from doomed d))
