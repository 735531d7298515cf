-- Cancelled jobs, remembered for WaitJob (issue 34): CancelJob deletes a
-- live job and leaves no other trace, so a wait on another replica could
-- not tell a cancel from an ack that kept no record. CancelJob's statement
-- records the id here (cancels are rare, admin calls: nothing on the hot
-- path writes this table); wait_status.sql reads it; the retention loop
-- deletes rows older than --result-retention (expire_cancelled.sql).
create table leaseq.cancelled_jobs (
    id    uuid primary key,
    queue text not null,
    at    timestamptz not null default now()
);
create index cancelled_jobs_at on leaseq.cancelled_jobs (at);
