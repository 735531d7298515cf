-- Exactly-once effects: leaseq.ack() and leaseq.nack(), callable in SQL in
-- the consumer's own transaction on the job's database, so that the job's
-- effect and its settle commit or roll back together. See docs/clients.md,
-- "Ack from SQL".
--
-- leaseq.settle_ack and leaseq.settle_fail are the broker's settle
-- statements (crates/server/src/store/sql/ack.sql and fail.sql) as SQL
-- functions, their text verbatim (the store's tests compare them), so a
-- settle from SQL does what the broker's does: the fencing check, the
-- retention copy, attempts, backoff and dead letters, the failed-attempt
-- record (the jobs_failed_attempt trigger). The brokers keep running their
-- own copy of the text on their hot path, unchanged. Should ack.sql or
-- fail.sql change, a new migration replaces the function with the new text
-- (`create or replace`), and the test then reads that migration.

create function leaseq.settle_ack(uuid[], uuid[])
returns table (id uuid, lease_token uuid, lease_broker uuid, slot_freed text, queue text)
language sql volatile
set search_path = pg_catalog, pg_temp
as $settle_ack$
-- Completes jobs. Only the holder of the current lease token may settle a
-- job: a stale token matches no row and the caller gets FAILED_PRECONDITION.
-- Rows are locked in id order (the broker passes the ids sorted, and each
-- is locked in its turn): concurrent settle statements (acks, nacks,
-- releases, extends) then never deadlock on each other.
--
-- Each id is looked up in a lateral subquery that holds its own lock, which
-- PostgreSQL plans apart: a primary-key probe is its only plan, whatever
-- the table's statistics say. Joined to the array instead, a statement
-- planned on a drained, vacuumed table read all of jobs_pkey for every
-- call (docs/BENCHMARKS.md, "Plans made on an empty table"). The DELETE
-- finds the rows by id, not by ctid: a row an extension updated since the
-- statement's snapshot is locked in its new version, which a ctid lookup
-- under that snapshot would miss.
--
-- A job of a queue with completed_retention_ms > 0 is copied to
-- leaseq.completed_jobs by this same statement (the retention loop in
-- src/maintenance.rs deletes it later). This is the hottest statement of the
-- broker, so queues without retention pay only for one lookup of the
-- retaining queues per statement (a partial index, empty unless some queue
-- retains) and an insert of no rows: their payloads and headers are not
-- carried past the lock (the CASEs below).
--
-- `slot_freed` names the job's queue when it has a concurrency limit: its
-- waiting consumers (on any replica) are woken, since a slot just freed.
with retaining as (
    select array(select q.name from leaseq.queues q where q.completed_retention_ms > 0) as queues,
        array(select q.name from leaseq.queues q where q.concurrency_limit is not null) as limited
),
target as (
    select j.*
    from unnest($1::uuid[], $2::uuid[]) with ordinality as i(id, token, n)
    cross join retaining r
    cross join lateral (
        select j.id, k.keep,
            case when k.keep then j.payload end as payload,
            case when k.keep then j.headers end as headers,
            j.queue, j.priority, j.attempt, j.max_attempts, j.dedup_key, j.enqueued_at,
            j.last_error, j.leased_by, j.lease_token, j.lease_broker,
            case when j.queue = any(r.limited) then j.queue end as slot_freed
        from leaseq.jobs j
        cross join lateral (select j.queue = any(r.queues) as keep) k
        where j.id = i.id and j.lease_token = i.token
        for update of j
    ) j
    order by i.n
),
kept as (
    -- Job ids are never reused, so a conflict cannot happen; should one
    -- anyway, the ack still succeeds.
    insert into leaseq.completed_jobs
        (id, queue, priority, payload, headers, attempt, max_attempts, dedup_key, enqueued_at,
         last_error, completed_by)
    select t.id, t.queue, t.priority, t.payload, t.headers, t.attempt, t.max_attempts, t.dedup_key,
        t.enqueued_at, t.last_error, t.leased_by
    from target t
    where t.keep
    on conflict (id) do nothing
),
gone as (
    delete from leaseq.jobs j
    where j.id = any(array(select t.id from target t))
    returning j.id
)
-- Every target row is deleted (its lock is ours): answer from the locked
-- versions, once per job.
select distinct on (t.id) t.id, t.lease_token as "lease_token!", t.lease_broker, t.slot_freed, t.queue
from target t
join gone g on g.id = t.id
$settle_ack$;

comment on function leaseq.settle_ack(uuid[], uuid[]) is
    'The broker''s ack statement (ack.sql) for leaseq.ack(); not for direct use.';

create function leaseq.settle_fail(uuid[], uuid[], text[], int8[], bool[], bool[])
returns table (id uuid, token uuid, queue text, lease_broker uuid, death text, retry_ms int8, slot_freed boolean)
language sql volatile
set search_path = pg_catalog, pg_temp
as $settle_fail$
-- Ends leases that did not succeed: Nack, a stream closing with unsettled
-- jobs, a broker draining, an expired lease. Only rows whose current lease
-- token matches are touched (fencing).
--
-- A job is dead-lettered when asked (reason 'nacked'), when its ttl has passed
-- ('expired'), or when this was its last attempt ('max_attempts'); otherwise it
-- is made available again after `retry_ms` (null = the queue's exponential
-- backoff with jitter). `refund` gives the attempt back (the broker, not the
-- consumer, ended the lease) and never dead-letters for attempts.
-- `slot_freed`: the queue has a concurrency limit, so its waiting consumers
-- are woken at once whatever happens to the job.
--
-- As in ack.sql: each id is locked in a lateral subquery of its own (a
-- primary-key probe whatever the statistics say), in the order the broker
-- passes them (sorted by id), and the writes find their rows by an id array.
with input as (
    select * from unnest($1::uuid[], $2::uuid[], $3::text[], $4::int8[], $5::bool[], $6::bool[])
        with ordinality as i(id, token, error, retry_ms, dead, refund, n)
),
cur as (
    select j.id, i.token, j.queue, j.lease_broker, i.error, i.refund,
        q.concurrency_limit is not null as slot_freed,
        case
            when i.dead then 'nacked'
            when j.expires_at is not null and j.expires_at <= now() then 'expired'
            when not i.refund and j.attempt >= coalesce(j.max_attempts, q.max_attempts) then 'max_attempts'
        end as death,
        coalesce(
            i.retry_ms,
            (least(q.backoff_cap_ms, q.backoff_base_ms * power(2, least(greatest(j.attempt - 1, 0), 40)))
                * (0.5 + random() / 2))::int8
        ) as retry_ms
    from input i
    cross join lateral (
        select j.id, j.queue, j.lease_broker, j.expires_at, j.attempt, j.max_attempts
        from leaseq.jobs j
        where j.id = i.id and j.lease_token = i.token
        for update of j
    ) j
    join leaseq.queues q on q.name = j.queue
    -- Locked in id order, like every settle statement: no deadlocks.
    order by i.n
),
buried as (
    delete from leaseq.jobs j
    using cur c
    where j.id = c.id and c.death is not null
        and j.id = any(array(select d.id from cur d where d.death is not null))
    returning j.id, j.queue, j.priority, j.payload, j.headers, j.attempt, j.max_attempts,
        j.dedup_key, j.enqueued_at, c.error, c.death
),
dead as (
    insert into leaseq.dead_jobs
        (id, queue, priority, payload, headers, attempt, max_attempts, dedup_key, enqueued_at, last_error, reason)
    select id, queue, priority, payload, headers, attempt, max_attempts, dedup_key, enqueued_at, error, death
    from buried
    on conflict (id) do nothing
),
retried as (
    update leaseq.jobs j set
        state = 'available',
        lease_token = null,
        lease_expires_at = null,
        lease_broker = null,
        leased_by = null,
        -- A refunded lease (the broker let go of it: a drain, or a stream
        -- that closed before the job reached it) leaves no trace: the job
        -- keeps its place in line and its last consumer's error.
        last_error = case when c.refund then j.last_error else c.error end,
        attempt = case when c.refund then greatest(j.attempt - 1, 0) else j.attempt end,
        run_at = case when c.refund then j.run_at
                      else now() + c.retry_ms * interval '1 millisecond' end
    from cur c
    where j.id = c.id and c.death is null
        and j.id = any(array(select r.id from cur r where r.death is null))
    returning j.id
)
select c.id, c.token as "token!", c.queue, c.lease_broker, c.death, c.retry_ms as "retry_ms!", c.slot_freed as "slot_freed!" from cur c
$settle_fail$;

comment on function leaseq.settle_fail(uuid[], uuid[], text[], int8[], bool[], bool[]) is
    'The broker''s nack statement (fail.sql) for leaseq.nack(); not for direct use.';

-- A lease token as delivered (`UUID`, or `UUID.N` for cluster N of a
-- broker over several PostgreSQL clusters) checked against this database:
-- returns its UUID. A token naming another cluster than this database is
-- refused (22023): its job is not here, so no transaction here can settle
-- it. A database with no leaseq.cluster_identity row is the home cluster
-- (id 0, whose tokens are bare UUIDs).
create function leaseq.lease_token_uuid(lease_token text) returns uuid
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    bad constant text := 'lease_token: is not a lease token issued by leaseq';
    dot        integer;
    suffix     text;
    token_of   integer := 0;
    here       integer;
    u          uuid;
begin
    if lease_token is null or lease_token = '' then
        raise exception 'lease_token: is required' using errcode = '22023';
    end if;
    dot := strpos(lease_token, '.');
    if dot > 0 then
        suffix := substr(lease_token, dot + 1);
        -- Canonical digits only (1 to 65535, no leading zero), as the broker parses.
        if suffix !~ '^[1-9][0-9]{0,4}$' or suffix::integer > 65535 then
            raise exception '%', bad using errcode = '22023';
        end if;
        token_of := suffix::integer;
        lease_token := substr(lease_token, 1, dot - 1);
    end if;
    if lease_token !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' then
        raise exception '%', bad using errcode = '22023';
    end if;
    u := lease_token::uuid;
    select c.id into here from leaseq.cluster_identity c;
    here := coalesce(here, 0);
    if token_of <> here then
        raise exception 'lease_token: names cluster %, and this database is cluster %: settle it on the database of cluster % (the broker''s --database-url for it)',
            token_of, here, token_of
            using errcode = '22023';
    end if;
    return u;
end
$$;

-- Completes a leased job in the calling transaction, as the broker's Ack
-- does: checked against the fencing token (the delivery's lease_token,
-- exactly as delivered); the job is deleted, copied to
-- leaseq.completed_jobs when its queue retains completed jobs, and a queue
-- with a concurrency limit has its waiting consumers woken. The broker
-- that leased the job is told on its settle channel, so its stream gets
-- the credit back and forgets the lease. Every NOTIFY is delivered at
-- commit only: a rollback leaves the job leased (it is redelivered when
-- the lease runs out) and tells nobody anything.
--
-- A token that is not the job's current lease (the lease expired and the
-- job went to another consumer, or it was settled already) raises SQLSTATE
-- 55000 (object_not_in_prerequisite_state) with a message that begins
-- `lease_token:`, so the caller's transaction, and its effect, roll back.
-- Malformed arguments raise 22023 (invalid_parameter_value) naming the
-- argument.
create function leaseq.ack(job_id uuid, lease_token text) returns void
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    token uuid;
    r     record;
begin
    if ack.job_id is null then
        raise exception 'job_id: is required' using errcode = '22023';
    end if;
    token := leaseq.lease_token_uuid(ack.lease_token);
    select * into r from leaseq.settle_ack(array[ack.job_id], array[token]);
    if not found then
        raise exception 'lease_token: job % is not leased under this lease_token (lease expired, job re-leased or already settled)', ack.job_id
            using errcode = '55000';
    end if;
    -- The payloads of channels.rs: `job:token` on the leasing broker's
    -- settle channel; `sql:0:<queue>` on leaseq_wake.
    if r.lease_broker is not null then
        perform pg_notify('leaseq_settle_' || replace(r.lease_broker::text, '-', ''), ack.job_id::text || ':' || token::text);
    end if;
    if r.slot_freed is not null then
        perform pg_notify('leaseq_wake', 'sql:0:' || r.slot_freed);
    end if;
end
$$;

comment on function leaseq.ack(uuid, text) is
    'Acks a leased job in the calling transaction (exactly-once effects); raises 55000 when lease_token is not current. See docs/clients.md.';

-- Fails a leased job in the calling transaction, as the broker's Nack
-- does: `error` is kept as the job's last_error; the job is retried after
-- `retry_after` (null: the queue's backoff with jitter; zero: at once), or
-- dead-lettered when `dead_letter`, when its ttl has passed, or on its
-- last attempt. Returns whether it went to the dead letters. Fencing,
-- errors and notifications as leaseq.ack().
create function leaseq.nack(
    job_id      uuid,
    lease_token text,
    error       text     default null,
    retry_after interval default null,
    dead_letter boolean  default false
) returns boolean
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    -- Ten years, as MAX_DELAY in crates/proto/src/lib.rs.
    max_delay constant interval := interval '3660 days';
    token     uuid;
    retry_ms  int8;
    delay_ms  int8;
    r         record;
begin
    if nack.job_id is null then
        raise exception 'job_id: is required' using errcode = '22023';
    end if;
    token := leaseq.lease_token_uuid(nack.lease_token);
    if octet_length(nack.error) > 65536 then
        raise exception 'error: must be at most 65536 bytes' using errcode = '22023';
    end if;
    if nack.retry_after is not null then
        if nack.retry_after < interval '0' then
            raise exception 'retry_after: must not be negative' using errcode = '22023';
        end if;
        if nack.retry_after > max_delay then
            raise exception 'retry_after: must be at most 316224000s' using errcode = '22023';
        end if;
        -- Whole milliseconds, rounded up, as the gRPC Nack.
        retry_ms := ceil(extract(epoch from nack.retry_after) * 1000)::int8;
    end if;
    select * into r from leaseq.settle_fail(
        array[nack.job_id], array[token], array[coalesce(nack.error, '')], array[retry_ms],
        array[coalesce(nack.dead_letter, false)], array[false]);
    if not found then
        raise exception 'lease_token: job % is not leased under this lease_token (lease expired, job re-leased or already settled)', nack.job_id
            using errcode = '55000';
    end if;
    if r.lease_broker is not null then
        perform pg_notify('leaseq_settle_' || replace(r.lease_broker::text, '-', ''), nack.job_id::text || ':' || token::text);
    end if;
    -- As settle::wakes_for: at once when a slot freed, else when the retry is due.
    if r.slot_freed then
        delay_ms := 0;
    elsif r.death is null then
        delay_ms := r.retry_ms;
    end if;
    if delay_ms is not null then
        perform pg_notify('leaseq_wake', 'sql:' || delay_ms || ':' || r.queue);
    end if;
    return r.death is not null;
end
$$;

comment on function leaseq.nack(uuid, text, text, interval, boolean) is
    'Nacks a leased job in the calling transaction; returns whether it was dead-lettered; raises 55000 when lease_token is not current. See docs/clients.md.';
