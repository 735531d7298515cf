-- Transactional enqueue from SQL (the outbox pattern): an application calls
-- leaseq.enqueue(...) inside its own transaction, so the job exists if and
-- only if the business data commits. See docs/clients.md.

-- A UUIDv7 from clock_timestamp() (PostgreSQL 15 has no uuidv7()): 48 bits
-- of Unix milliseconds, then the microseconds within that millisecond in the
-- 12 "rand_a" bits (RFC 9562, method 3), then random bits. Ids therefore sort
-- in creation order to the microsecond, which lease.sql relies on: among jobs
-- of equal priority and run_at it delivers in `id` order. They interleave by
-- millisecond with the broker's ids (uuid crate, also v7).
create function leaseq.uuid_v7() returns uuid
language plpgsql volatile parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    us    bigint := (extract(epoch from clock_timestamp()) * 1000000)::bigint;
    ms    bigint := us / 1000;
    sub   integer := ((us % 1000) * 4096 / 1000)::integer;
    b     bytea := uuid_send(gen_random_uuid());
begin
    b := overlay(b placing substring(int8send(ms) from 3 for 6) from 1 for 6);
    b := set_byte(b, 6, 112 | (sub >> 8));           -- version 7, high 4 bits of sub
    b := set_byte(b, 7, sub & 255);
    b := set_byte(b, 8, (get_byte(b, 8) & 63) | 128); -- RFC 9562 variant
    return encode(b, 'hex')::uuid;
end
$$;

comment on function leaseq.uuid_v7() is
    'A time-ordered UUIDv7 (microsecond precision), as leaseq job ids are.';

-- Enqueues one job in the caller's transaction and returns its id.
--
-- Validates like the gRPC Enqueue (same rules, same limits; errors name the
-- argument, SQLSTATE 22023 invalid_parameter_value, or 54000
-- program_limit_exceeded for the payload size), creates the queue on first
-- use, and honours dedup_key: while a job with the same key is live in the
-- queue, nothing is inserted and that job's id is returned. The NOTIFY that
-- wakes subscribers is queued with the transaction and delivered only at
-- commit; a rollback leaves neither job nor wake-up behind.
--
-- The payload limit is the broker's default, 1 MiB; a database whose
-- brokers run with another --max-payload-bytes sets the same number with
-- `alter database ... set leaseq.max_payload_bytes = '...'`.
create function leaseq.enqueue(
    queue        text,
    payload      bytea,
    headers      jsonb       default '{}',
    priority     integer     default 0,
    delay        interval    default null,
    run_at       timestamptz default null,
    dedup_key    text        default null,
    max_attempts integer     default null,
    ttl          interval    default null
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

    insert into leaseq.queues (name) values (enqueue.queue) on conflict do nothing;

    -- A skipped duplicate whose live job was settled before we looked it up
    -- is inserted again; this converges at once in practice.
    for try_no in 1..5 loop
        insert into leaseq.jobs
            (id, queue, priority, run_at, payload, headers, max_attempts, dedup_key, expires_at)
        values
            (leaseq.uuid_v7(), enqueue.queue, enqueue.priority, deliver_at, enqueue.payload,
             enqueue.headers, enqueue.max_attempts, enqueue.dedup_key, now() + enqueue.ttl)
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

comment on function leaseq.enqueue(text, bytea, jsonb, integer, interval, timestamptz, text, integer, interval) is
    'Enqueues a job in the calling transaction (outbox pattern); returns its id, or the live job''s id when dedup_key matches. See docs/clients.md.';
