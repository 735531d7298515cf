-- Admin API: per-queue retention of completed jobs.
--
-- Stored and reported by the admin API but NOT YET ENFORCED: completed jobs
-- are deleted at once (there is no archive table yet). Null = not set.
alter table leaseq.queues
    add column completed_retention_ms bigint check (completed_retention_ms >= 0);
