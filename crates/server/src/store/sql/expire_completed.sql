-- Deletes completed records older than their queue's retention, at most $1
-- rows of each kind, oldest first within each queue. A queue whose
-- retention was cleared (null or 0) keeps none, but for records with a
-- result (AckRequest.result): those are kept for the longer of the queue's
-- retention and $2 ms (the broker's --result-retention). Every broker runs
-- this: rows another one is deleting are skipped, so running it twice at
-- once is harmless.
--
-- Two index range scans per queue (completed_jobs_queue is on (queue,
-- result is not null, completed_at)): one over the records without a
-- result, one over those with one, each ending at its own cutoff, so that
-- results younger than theirs are never read by a pass. `is false`, not
-- `= false` nor `result is null`: the planner folds those to `result is
-- null`, which the index's `(result is not null)` column cannot serve (a
-- filter and a sort of the whole range instead). The rows are then
-- reached by ctid (a Tid Scan): we hold their row locks, so they cannot
-- move. Runs with the sweeps' planner settings (Store::expire_completed):
-- with the defaults, its generic plan made on an empty table read all of
-- completed_jobs for the ctids instead (tests/plans.rs).
with plain as (
    select c.ctid
    from leaseq.queues q
    cross join lateral (
        select c.ctid from leaseq.completed_jobs c
        where c.queue = q.name
          and (c.result is not null) is false
          and c.completed_at <= now() - coalesce(q.completed_retention_ms, 0) * interval '1 millisecond'
        order by c.completed_at
        limit $1
        for update skip locked
    ) c
    limit $1
),
results as (
    select c.ctid
    from leaseq.queues q
    cross join lateral (
        select c.ctid from leaseq.completed_jobs c
        where c.queue = q.name
          and (c.result is not null) is true
          and c.completed_at <= now()
              - greatest(coalesce(q.completed_retention_ms, 0), $2::int8) * interval '1 millisecond'
        order by c.completed_at
        limit $1
        for update skip locked
    ) c
    limit $1
)
delete from leaseq.completed_jobs
where ctid = any(array(select d.ctid from plain d union all select r.ctid from results r))
