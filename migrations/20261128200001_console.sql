-- The console for many replicas (issue 35): sessions every replica accepts,
-- the deployment's rates and history, and each failed attempt's error.
-- With several PostgreSQL clusters (docs/SCALING.md) every cluster gets these
-- tables; sessions and history are kept on the home cluster only, attempt
-- errors on the cluster that holds the job.

-- Console sessions (crates/server/src/console/sessions.rs). The browser holds
-- a random session id in an HttpOnly cookie; the database holds only its
-- SHA-256, so reading this table does not let anyone in. A session names the
-- bearer token it logged in with by the token's SHA-256, as --auth-file does
-- (null: an anonymous session of a broker without --auth-file): a replica
-- accepts it only while that token is in its own auth file.
create table leaseq.console_sessions (
    id_sha256    text primary key,
    token_sha256 text,
    -- The session's CSRF token, sent back by the page in X-CSRF-Token.
    csrf         text not null,
    created_at   timestamptz not null default now(),
    expires_at   timestamptz not null
);
create index console_sessions_expiry on leaseq.console_sessions (expires_at);

-- Each broker's enqueue and ack rates per queue, over its last
-- --metrics-interval (period_ms), written every interval while the queue
-- has traffic on that broker, and once more when it stops
-- (crates/server/src/history.rs). A row counts until at + 2.5 periods: a
-- broker that stopped writing drops out on its own. The deployment's rate
-- of a queue is the sum over brokers.
create table leaseq.queue_rates (
    queue        text not null,
    broker       uuid not null,
    at           timestamptz not null default now(),
    period_ms    integer not null check (period_ms > 0),
    enqueue_rate double precision not null,
    ack_rate     double precision not null,
    primary key (queue, broker)
);

-- The same rates over time, and the queue's depth when the broker sampled
-- it (null when it does not: a broker without --http-listen or
-- --metrics-listen), for the console's charts. Kept for 15 minutes.
create table leaseq.queue_samples (
    queue        text not null,
    broker       uuid not null,
    at           timestamptz not null default now(),
    period_ms    integer not null check (period_ms > 0),
    enqueue_rate double precision not null,
    ack_rate     double precision not null,
    available    bigint,
    scheduled    bigint,
    leased       bigint,
    dead         bigint
);
create index queue_samples_queue on leaseq.queue_samples (queue, at);
create index queue_samples_at on leaseq.queue_samples (at);

-- The error of each failed attempt of a job (a Nack, an expired lease, a
-- stream that closed holding it), recorded by the trigger below when
-- fail.sql makes a leased job available again. The last attempt of a job
-- that died is its dead letter's own last_error. Rows outlive nothing: the
-- retention loop deletes those whose job is in none of jobs, dead_jobs and
-- completed_jobs any more (crates/server/src/maintenance.rs). A job moved to
-- another cluster leaves its rows behind (they are deleted the same way).
create table leaseq.job_errors (
    job_id  uuid not null,
    attempt integer not null,
    error   text,
    at      timestamptz not null default now()
);
create index job_errors_job on leaseq.job_errors (job_id, at);

create function leaseq.record_failed_attempt() returns trigger
language plpgsql as $$
begin
    insert into leaseq.job_errors (job_id, attempt, error)
    values (new.id, old.attempt, new.last_error);
    return null;
end
$$;

-- Fires only for statements that set last_error (fail.sql; never a lease or
-- an ack), and only for a lease that ended without its attempt given back
-- (a refunded lease, a drain, decrements the attempt and is no failure).
create trigger jobs_failed_attempt
    after update of last_error on leaseq.jobs
    for each row
    when (old.state = 'leased' and new.state = 'available' and new.attempt = old.attempt)
    execute function leaseq.record_failed_attempt();
