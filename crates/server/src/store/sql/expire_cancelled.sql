-- Deletes at most $1 records of cancelled jobs older than $2 ms (the
-- broker's --result-retention): WaitJob tells a cancel apart only that
-- long. Oldest first, by cancelled_jobs_at.
delete from leaseq.cancelled_jobs
where id = any(array(
    select c.id from leaseq.cancelled_jobs c
    where c.at <= now() - $2::int8 * interval '1 millisecond'
    order by c.at
    limit $1
))
