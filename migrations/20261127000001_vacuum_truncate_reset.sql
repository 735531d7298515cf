-- Undoes 20261126000001_vacuum_truncate: the queue tables are truncated by
-- VACUUM again, as PostgreSQL does by default.
--
-- That migration was deleted from migrations/ after it had been applied
-- (98b0ff8: keeping the pages did not keep the sweeps' plans right; the
-- sweeps now price sequential scans out instead, src/store/mod.rs), and a
-- database that had applied it then refused every later start (sqlx: an
-- applied migration is missing). It is back, unchanged, and this one
-- resets what it set, so that every database ends with the same schema
-- whichever commit migrated it first. Migrations are only ever added:
-- migrations/SHA256SUMS lists each with its digest, and tests/release.rs
-- fails if one changes or disappears.
alter table leaseq.jobs reset (vacuum_truncate);
alter table leaseq.completed_jobs reset (vacuum_truncate);
