-- Keys inside a queue (issue 33): a key on every job, and queues that
-- deliver the jobs of one key in enqueue order, at most `key_concurrency`
-- of a key leased at once. See docs/design/keys.md.
--
-- jobs.key: optional, at most 256 bytes (checked by the broker and by
-- leaseq.enqueue()). Kept through dead letters, retention and requeue.
-- jobs_key: a key's unsettled jobs in enqueue order, for the lease
-- statement's "is this job among the first N of its key" probe.
alter table leaseq.jobs add column key text;
alter table leaseq.dead_jobs add column key text;
alter table leaseq.completed_jobs add column key text;
create index jobs_key on leaseq.jobs (queue, key, id) where key is not null;
-- jobs_key_leased: a key's leased jobs, for the same statement's "and not
-- already key_concurrency of them leased" probe, which must not walk a
-- key's whole backlog.
create index jobs_key_leased on leaseq.jobs (queue, key, id)
    where key is not null and state = 'leased';

-- ordered_by_key: the jobs of one key are delivered in enqueue order; a
-- retry keeps its place at the head of its key; a dead-lettered job lets
-- the key go on. key_concurrency: at most this many of a key leased at
-- once (null = 1); only with ordered_by_key for now.
alter table leaseq.queues
    add column ordered_by_key boolean not null default false,
    add column key_concurrency integer check (key_concurrency between 1 and 1000);
-- The queues whose settles wake their consumers (a slot or a key's next
-- job freed): read by every ack and nack (ack.sql, fail.sql).
create index queues_woken_on_settle on leaseq.queues (name)
    where concurrency_limit is not null or ordered_by_key;

-- leaseq.enqueue() takes the key (a new last argument, so calls without it
-- work as before).
drop function leaseq.enqueue(text, bytea, jsonb, integer, interval, timestamptz, text, integer, interval);

create function leaseq.enqueue(
    queue        text,
    payload      bytea,
    headers      jsonb       default '{}',
    priority     integer     default 0,
    delay        interval    default null,
    run_at       timestamptz default null,
    dedup_key    text        default null,
    max_attempts integer     default null,
    ttl          interval    default null,
    key          text        default null
) returns uuid
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    max_payload bigint := coalesce(nullif(current_setting('leaseq.max_payload_bytes', true), '')::bigint, 1048576);
    -- Ten years, as MAX_DELAY in src/domain.rs.
    max_delay   constant interval := interval '3660 days';
    queue_rule  constant text := 'must be 1-128 characters of [A-Za-z0-9._:-] starting with a letter or digit';
    h_count     integer;
    bad_key     text;
    job_id      uuid;
    deliver_at  timestamptz;
    wake_ms     bigint;
begin
    -- Arguments are referred to as enqueue.<name>: columns share the names.
    if enqueue.queue is null
       or enqueue.queue !~ '^[A-Za-z0-9][-A-Za-z0-9._:]*$'
       or octet_length(enqueue.queue) > 128 then
        raise exception 'queue: %', queue_rule using errcode = '22023';
    end if;
    if enqueue.payload is null then
        raise exception 'payload: is required (use ''''::bytea for an empty payload)' using errcode = '22023';
    end if;
    if octet_length(enqueue.payload) > max_payload then
        raise exception 'payload: is % bytes, the limit is % bytes', octet_length(enqueue.payload), max_payload
            using errcode = '54000';
    end if;

    enqueue.headers := coalesce(enqueue.headers, '{}'::jsonb);
    if jsonb_typeof(enqueue.headers) <> 'object' then
        raise exception 'headers: must be a JSON object of strings' using errcode = '22023';
    end if;
    select count(*) into h_count from jsonb_object_keys(enqueue.headers);
    if h_count > 64 then
        raise exception 'headers: at most 64 entries' using errcode = '22023';
    end if;
    select k into bad_key from jsonb_each(enqueue.headers) as e(k, v)
        where jsonb_typeof(e.v) <> 'string' limit 1;
    if found then
        raise exception 'headers[%]: must be a string', to_json(bad_key) using errcode = '22023';
    end if;
    if exists (select 1 from jsonb_object_keys(enqueue.headers) as k where k = '') then
        raise exception 'headers: keys must not be empty' using errcode = '22023';
    end if;
    select k into bad_key from jsonb_object_keys(enqueue.headers) as k where octet_length(k) > 256 limit 1;
    if found then
        raise exception 'headers[%] key: must be at most 256 bytes', to_json(bad_key) using errcode = '22023';
    end if;
    select k into bad_key from jsonb_each_text(enqueue.headers) as e(k, v) where octet_length(e.v) > 16384 limit 1;
    if found then
        raise exception 'headers[%]: must be at most 16384 bytes', to_json(bad_key) using errcode = '22023';
    end if;

    if enqueue.priority is null then
        raise exception 'priority: must not be null (default 0)' using errcode = '22023';
    end if;

    if enqueue.delay is not null and enqueue.run_at is not null then
        raise exception 'delay, run_at: set at most one of them' using errcode = '22023';
    end if;
    if enqueue.delay is not null then
        if enqueue.delay < interval '0' then
            raise exception 'delay: must not be negative' using errcode = '22023';
        end if;
        if enqueue.delay > max_delay then
            raise exception 'delay: must be at most 316224000s' using errcode = '22023';
        end if;
        deliver_at := now() + enqueue.delay;
    elsif enqueue.run_at is not null then
        if enqueue.run_at < timestamptz '1970-01-01 00:00:00+00'
           or enqueue.run_at >= timestamptz '10000-01-01 00:00:00+00'
           or not isfinite(enqueue.run_at) then
            raise exception 'run_at: must be between 1970-01-01 and 9999-12-31' using errcode = '22023';
        end if;
        deliver_at := enqueue.run_at;
    else
        deliver_at := now();
    end if;

    -- Empty means no de-duplication, as in the gRPC API.
    enqueue.dedup_key := nullif(enqueue.dedup_key, '');
    if octet_length(enqueue.dedup_key) > 512 then
        raise exception 'dedup_key: must be at most 512 bytes' using errcode = '22023';
    end if;

    -- 0 means the queue's default, as in the gRPC API.
    enqueue.max_attempts := nullif(enqueue.max_attempts, 0);
    if enqueue.max_attempts is not null and enqueue.max_attempts not between 1 and 1000 then
        raise exception 'max_attempts: must be 0 (queue default) or 1 to 1000' using errcode = '22023';
    end if;

    if enqueue.ttl is not null then
        if enqueue.ttl < interval '0' then
            raise exception 'ttl: must not be negative' using errcode = '22023';
        end if;
        if enqueue.ttl > max_delay then
            raise exception 'ttl: must be at most 316224000s' using errcode = '22023';
        end if;
    end if;
    enqueue.ttl := nullif(enqueue.ttl, interval '0');

    -- Empty means no key, as in the gRPC API.
    enqueue.key := nullif(enqueue.key, '');
    if octet_length(enqueue.key) > 256 then
        raise exception 'key: must be at most 256 bytes' using errcode = '22023';
    end if;

    insert into leaseq.queues (name) values (enqueue.queue) on conflict do nothing;

    -- A skipped duplicate whose live job was settled before we looked it up
    -- is inserted again; this converges at once in practice.
    for try_no in 1..5 loop
        insert into leaseq.jobs
            (id, queue, priority, run_at, payload, headers, max_attempts, dedup_key, expires_at, key)
        values
            (leaseq.uuid_v7(), enqueue.queue, enqueue.priority, deliver_at, enqueue.payload,
             enqueue.headers, enqueue.max_attempts, enqueue.dedup_key, now() + enqueue.ttl,
             enqueue.key)
        on conflict (queue, dedup_key) where dedup_key is not null do nothing
        returning id into job_id;
        if job_id is not null then
            -- Same payload as the broker's: <broker>:<delay ms>:<queue>. The
            -- broker part is "sql", never a broker's id, so every broker
            -- (including one sharing this database) acts on it. Computed
            -- against clock_timestamp(): the delay left now, not at the
            -- transaction's start.
            wake_ms := greatest(0, ceil(extract(epoch from (deliver_at - clock_timestamp())) * 1000))::bigint;
            if deliver_at <= now() then
                wake_ms := 0;
            end if;
            perform pg_notify('leaseq_wake', 'sql:' || wake_ms || ':' || enqueue.queue);
            return job_id;
        end if;
        select j.id into job_id from leaseq.jobs j
            where j.queue = enqueue.queue and j.dedup_key = enqueue.dedup_key;
        if job_id is not null then
            return job_id;
        end if;
    end loop;
    raise exception 'dedup_key: the live job kept changing; retry' using errcode = '40001';
end
$$;

comment on function leaseq.enqueue(text, bytea, jsonb, integer, interval, timestamptz, text, integer, interval, text) is
    'Enqueues a job in the calling transaction (outbox pattern); returns its id, or the live job''s id when dedup_key matches. See docs/clients.md.';

-- ack.sql and fail.sql changed (they copy the key, and wake an ordered
-- queue's consumers when a key's job settles): leaseq.ack() and
-- leaseq.nack() run their new text (see 20261202000001_sql_ack.sql).
create or replace function leaseq.settle_ack(uuid[], uuid[])
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
-- `slot_freed` names the job's queue when it has a concurrency limit or is
-- ordered by key: its waiting consumers (on any replica) are woken, since a
-- slot, or the next job of the key, just freed.
with retaining as (
    select array(select q.name from leaseq.queues q where q.completed_retention_ms > 0) as queues,
        array(select q.name from leaseq.queues q
            where q.concurrency_limit is not null or q.ordered_by_key) as limited
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
            j.key, j.last_error, j.leased_by, j.lease_token, j.lease_broker,
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
         last_error, completed_by, key)
    select t.id, t.queue, t.priority, t.payload, t.headers, t.attempt, t.max_attempts, t.dedup_key,
        t.enqueued_at, t.last_error, t.leased_by, t.key
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

create or replace function leaseq.settle_fail(uuid[], uuid[], text[], int8[], bool[], bool[])
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
-- `slot_freed`: the queue has a concurrency limit or is ordered by key, so
-- its waiting consumers are woken at once whatever happens to the job (a
-- slot, or a dead-lettered job's key, freed).
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
        (q.concurrency_limit is not null or q.ordered_by_key) as slot_freed,
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
        j.dedup_key, j.enqueued_at, c.error, c.death, j.key
),
dead as (
    insert into leaseq.dead_jobs
        (id, queue, priority, payload, headers, attempt, max_attempts, dedup_key, enqueued_at, last_error, reason,
         key)
    select id, queue, priority, payload, headers, attempt, max_attempts, dedup_key, enqueued_at, error, death,
        key
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
