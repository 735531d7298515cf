-- Retention of completed jobs. queues.completed_retention_ms, added by
-- 20261123000002_admin.sql as "stored, not yet enforced", is enforced from
-- this migration on (that file's comment is out of date; migrations are
-- never edited once shipped).
--
-- An Ack of a job whose queue has completed_retention_ms > 0 copies the job
-- here in the same statement that deletes it from leaseq.jobs (ack.sql);
-- jobs of other queues are deleted as before. Every broker's retention loop
-- (src/maintenance.rs) deletes records older than their queue's retention,
-- in bounded batches; a queue whose retention is cleared (null or 0) keeps
-- none. PurgeQueue deletes the queue's records. Nacked, dead-lettered,
-- expired, cancelled and purged jobs are not completions and never come here.
create table leaseq.completed_jobs (
    id           uuid primary key,
    queue        text not null,
    priority     integer not null,
    payload      bytea not null,
    headers      jsonb not null,
    -- Deliveries, the successful one included.
    attempt      integer not null,
    max_attempts integer,
    dedup_key    text,
    enqueued_at  timestamptz not null,
    -- The error of an earlier failed attempt, if any.
    last_error   text,
    -- Consumer name of the stream that held the lease when it was acked.
    completed_by text,
    completed_at timestamptz not null default now()
);
-- Expiry (per queue, oldest first) and PurgeQueue.
create index completed_jobs_queue on leaseq.completed_jobs (queue, completed_at);

-- The queues that keep completed jobs, which every ack statement looks up:
-- usually none, so the lookup reads an empty index instead of every queue.
create index queues_retaining on leaseq.queues (name) where completed_retention_ms > 0;
