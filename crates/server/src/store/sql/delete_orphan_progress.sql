-- Deletes at most $1 progress reports of jobs that are gone (acked,
-- dead-lettered, cancelled, purged): leaseq.job_progress holds a row per
-- live job that reported, and the ones whose job ended since. One pass of
-- the retention loop; the table is small (jobs held now), so it is read
-- whole, each row's job probed by its primary key.
delete from leaseq.job_progress
where job_id = any(array(
    select p.job_id from leaseq.job_progress p
    where not exists (select 1 from leaseq.jobs j where j.id = p.job_id)
    limit $1
))
