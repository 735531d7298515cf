-- Schedules (issue 34): cron expressions that enqueue a job per tick
-- (crates/server/src/schedule/, docs/design/schedules.md). Every cluster gets
-- both tables (one schema everywhere); schedules are kept on the home
-- cluster only, the ticks on the cluster of the job they record.

-- A schedule. Every broker's schedule loop takes the due ones with
-- `for update skip locked`, enqueues their ticks' jobs and advances
-- next_run_at in the same transaction: the row lock, not a leader, makes
-- one broker fire a tick.
create table leaseq.schedules (
    id             uuid primary key,
    name           text not null unique,
    -- A cron expression, five fields or six (seconds first), and the IANA
    -- time zone it is read in. Checked by the broker (croner, chrono-tz).
    cron           text not null,
    time_zone      text not null,
    -- The template of each tick's job (the fields of an EnqueueRequest).
    queue          text not null,
    payload        bytea not null,
    headers        jsonb not null default '{}',
    priority       integer not null default 0,
    max_attempts   integer,
    ttl_ms         bigint,
    -- 'allow': a tick enqueues whatever became of the last one; 'skip': a
    -- tick whose previous job is still live (waiting or leased) enqueues
    -- nothing.
    overlap        text not null check (overlap in ('allow', 'skip')),
    -- Ticks more than the broker's grace late (no broker was up to fire
    -- them): 'none' fires none of them, 'one' the latest, 'all' the latest
    -- catch_up_limit of them.
    catch_up       text not null check (catch_up in ('none', 'one', 'all')),
    catch_up_limit integer not null check (catch_up_limit between 1 and 1000),
    paused         boolean not null default false,
    -- The next tick to fire; ticks before it are done (fired or skipped).
    next_run_at    timestamptz not null,
    -- The last job a tick (or RunSchedule) enqueued, and that tick.
    last_tick_at   timestamptz,
    last_job_id    uuid,
    created_at     timestamptz not null default now(),
    updated_at     timestamptz not null default now()
);
create index schedules_due on leaseq.schedules (next_run_at) where not paused;

-- One row per fired tick, inserted in the transaction that inserts the
-- tick's job, on the job's cluster: the primary key makes a second job for
-- the same tick impossible, whichever broker, and whatever became of the
-- transaction on the home cluster that advanced next_run_at (several
-- clusters: two commits, the job's first). A manual run (RunSchedule) is a
-- tick at the time it was asked for. Kept a day (the schedule loop deletes
-- older ones).
create table leaseq.schedule_ticks (
    schedule_id uuid not null,
    tick_at     timestamptz not null,
    job_id      uuid not null,
    manual      boolean not null default false,
    at          timestamptz not null default now(),
    primary key (schedule_id, tick_at)
);
create index schedule_ticks_at on leaseq.schedule_ticks (at);
