-- The queue tables keep their pages when they empty out.
--
-- VACUUM truncates empty pages at the end of a table. A drained queue table
-- then shrinks to a few pages, and a statement planned while it is that
-- small is priced for a tiny table: PostgreSQL reads a table's current size
-- at planning time, and a cached generic plan is kept until the next VACUUM
-- or ANALYZE of the table. Such a plan then runs against the backlog that
-- builds up next: one ttl sweep, planned to read every waiting job through
-- jobs_ready, ran for minutes under load (docs/BENCHMARKS.md, "Plans made
-- on an empty table"; the sweeps and the hot statements now also price
-- sequential scans out, src/store/mod.rs). Truncating also
-- takes an ACCESS EXCLUSIVE lock on the table, which every queue statement
-- waits for. Empty pages are reused by new rows either way.
alter table leaseq.jobs set (vacuum_truncate = false);
alter table leaseq.completed_jobs set (vacuum_truncate = false);
