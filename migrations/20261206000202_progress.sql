-- Progress (issue 34): a held job's latest progress report
-- (ConsumeRequest.progress, ReportProgress), fenced by its lease token and
-- written by progress.sql, at most once a second per stream. A table of
-- its own, not columns of leaseq.jobs: a report rewrites this small row,
-- never the job's (whose payload and indexes the lease path reads). Rows
-- of jobs that are gone (acked, dead, cancelled) are deleted by the
-- retention loop (delete_orphan_progress.sql); GetJob shows a live job's.
create table leaseq.job_progress (
    job_id   uuid primary key,
    fraction real not null check (fraction >= 0 and fraction <= 1),
    message  text not null,
    at       timestamptz not null default now()
);
