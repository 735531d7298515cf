-- Unique for a window and debounce (issue 34, item 4; README "Semantics",
-- De-duplication).
--
-- jobs.unique_for_ms: how long the job's dedup key stays held once it
-- completes (EnqueueRequest.unique_for); null = not at all. Only the
-- enqueue statements write it; dead letters, retention and requeue do not
-- carry it (a dead-lettered job holds nothing).
alter table leaseq.jobs add column unique_for_ms bigint;

-- Dedup keys held after their job completed: written by the ack of a job
-- with unique_for_ms (ack.sql, so leaseq.ack() too), read by every enqueue
-- with a dedup key, deleted by the retention loop once `until` has passed
-- (expire_dedup_holds.sql) and by PurgeQueue. A key has one row: a later
-- completion of the same key moves `until` and `job_id`. Not in
-- completed_jobs, which is kept only for queues with a retention.
create table leaseq.dedup_holds (
    queue     text        not null references leaseq.queues (name) on delete cascade,
    dedup_key text        not null,
    job_id    uuid        not null,
    until     timestamptz not null,
    primary key (queue, dedup_key)
);
create index dedup_holds_until on leaseq.dedup_holds (until);

-- leaseq.enqueue() takes unique_for and on_duplicate (new last arguments,
-- so calls without them work as before).
drop function leaseq.enqueue(text, bytea, jsonb, integer, interval, timestamptz, text, integer, interval, text);

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
    key          text        default null,
    unique_for   interval    default null,
    on_duplicate text        default 'keep'
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
    the_id      uuid;
    holder      uuid;
    waiting     boolean;
    replacing   boolean;
    unique_ms   bigint;
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

    -- Unique for a window (issue 34): as EnqueueRequest.unique_for.
    if enqueue.unique_for is not null then
        if enqueue.unique_for < interval '0' then
            raise exception 'unique_for: must not be negative' using errcode = '22023';
        end if;
        -- 366 days, as MAX_UNIQUE_FOR in crates/proto/src/lib.rs.
        if enqueue.unique_for > interval '366 days' then
            raise exception 'unique_for: must be at most 31622400s' using errcode = '22023';
        end if;
    end if;
    enqueue.unique_for := nullif(enqueue.unique_for, interval '0');
    if enqueue.unique_for is not null and enqueue.dedup_key is null then
        raise exception 'unique_for: needs a dedup_key' using errcode = '22023';
    end if;
    unique_ms := ceil(extract(epoch from enqueue.unique_for) * 1000)::bigint;

    -- Debounce: as EnqueueRequest.on_duplicate ('keep' or 'replace').
    if coalesce(enqueue.on_duplicate, 'keep') not in ('keep', 'replace') then
        raise exception 'on_duplicate: must be ''keep'' or ''replace''' using errcode = '22023';
    end if;
    replacing := coalesce(enqueue.on_duplicate, 'keep') = 'replace';
    if replacing and enqueue.dedup_key is null then
        raise exception 'on_duplicate: replace needs a dedup_key' using errcode = '22023';
    end if;

    insert into leaseq.queues (name) values (enqueue.queue) on conflict do nothing;

    -- A skipped duplicate whose live job was settled before we looked it up
    -- is inserted again; this converges at once in practice. The steps are
    -- the broker's (Store::enqueue_in): replace.sql, enqueue_one.sql,
    -- enqueue_held.sql, dedup_holders.sql.
    for try_no in 1..5 loop
        the_id := null;
        if replacing then
            -- Only a waiting job: a leased one keeps the payload its
            -- handler has (replace.sql says how this meets a lease round).
            update leaseq.jobs j
            set payload = enqueue.payload, headers = enqueue.headers,
                priority = enqueue.priority, run_at = deliver_at
            where j.queue = enqueue.queue and j.dedup_key = enqueue.dedup_key
              and j.state = 'available'
            returning j.id into the_id;
        end if;
        if the_id is null then
            insert into leaseq.jobs
                (id, queue, priority, run_at, payload, headers, max_attempts, dedup_key, expires_at,
                 key, unique_for_ms)
            select leaseq.uuid_v7(), enqueue.queue, enqueue.priority, deliver_at, enqueue.payload,
                enqueue.headers, enqueue.max_attempts, enqueue.dedup_key, now() + enqueue.ttl,
                enqueue.key, unique_ms
            -- A key held after its job completed (unique_for).
            where enqueue.dedup_key is null or not exists (
                select 1 from leaseq.dedup_holds d
                where d.queue = enqueue.queue and d.dedup_key = enqueue.dedup_key
                  and d.until > now())
            on conflict (queue, dedup_key) where dedup_key is not null do nothing
            returning id into the_id;
            if the_id is not null and enqueue.dedup_key is not null then
                -- A hold committed while the insert waited for its job's
                -- ack (enqueue_held.sql): this statement sees it. (The
                -- variable is not called job_id, as before: that is h's
                -- column, which variable_conflict use_column would read.)
                select h.job_id into holder
                from leaseq.dedup_holds h
                where h.queue = enqueue.queue and h.dedup_key = enqueue.dedup_key
                  and h.until > now() and h.job_id <> the_id;
                if holder is not null then
                    delete from leaseq.jobs j where j.id = the_id;
                    return holder;
                end if;
            end if;
        end if;
        if the_id is not null then
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
            return the_id;
        end if;
        -- The live job, else the completed job holding the key (unique_for).
        select coalesce(j.id, h.job_id), coalesce(j.state = 'available', false)
            into the_id, waiting
        from (select 1) as one
        left join leaseq.jobs j on j.queue = enqueue.queue and j.dedup_key = enqueue.dedup_key
        left join leaseq.dedup_holds h
            on h.queue = enqueue.queue and h.dedup_key = enqueue.dedup_key and h.until > now();
        -- A waiting job inserted since the update looked: replace it.
        if the_id is not null and not (replacing and waiting) then
            return the_id;
        end if;
    end loop;
    raise exception 'dedup_key: the live job kept changing; retry' using errcode = '40001';
end
$$;

comment on function leaseq.enqueue(text, bytea, jsonb, integer, interval, timestamptz, text, integer, interval, text, interval, text) is
    'Enqueues a job in the calling transaction (outbox pattern); returns its id, or, when dedup_key matches, the id of the live job (replaced when waiting and on_duplicate = ''replace'') or of the completed job still holding the key (unique_for). See docs/clients.md.';

-- ack.sql writes the holds: leaseq.ack() runs its new text (see
-- 20261202000001_sql_ack.sql; the signature and result of
-- 20261206000201_results.sql).
create or replace function leaseq.settle_ack(uuid[], uuid[], bytea[] default null)
returns table (id uuid, lease_token uuid, lease_broker uuid, slot_freed text, queue text,
    recheck_key text)
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
-- $3 holds the acks' results (AckRequest.result), beside $1 and $2, null
-- where an ack has none; the broker passes it empty when no ack of the
-- statement has one (unnest pads it with nulls). A job acked with a result
-- is copied whatever its queue's retention, with the result: it is kept
-- for at least the broker's --result-retention (expire_completed.sql).
--
-- `slot_freed` names the job's queue when it has a concurrency limit or a
-- per-key limit or fair shares (key_concurrency without order,
-- key_overrides): its waiting consumers (on any replica) are woken, since a
-- slot just freed. In a queue ordered by key and nothing else (`by_key`),
-- an ack frees only its key's next job: the queue is woken only when the
-- job had a key and another job of that key waits (a probe of jobs_key);
-- an ack of a job without a key wakes nobody. Waking for every ack would
-- take the idle streams' offers back until a lease round had run, so new
-- jobs would seldom go by hand-off (docs/design/keys.md, "Wake-ups").
-- When no other job of the key is seen, `recheck_key` names the key: a job
-- of it committed after this statement's snapshot, whose own wake-up's
-- round ran before this ack committed, found the key still held; the
-- broker looks for the key's waiting jobs again once this ack committed
-- (settle.rs), and any job committed after that look was woken after this
-- ack committed.
with retaining as (
    select array(select q.name from leaseq.queues q where q.completed_retention_ms > 0) as queues,
        array(select q.name from leaseq.queues q
            where q.concurrency_limit is not null or q.ordered_by_key
                or q.key_concurrency is not null or q.key_overrides is not null) as limited,
        array(select q.name from leaseq.queues q
            where (q.concurrency_limit is not null or q.ordered_by_key
                or q.key_concurrency is not null or q.key_overrides is not null)
                and q.ordered_by_key and q.concurrency_limit is null
                and not leaseq.walks_keys(q)) as by_key
),
target as (
    select j.*
    from unnest($1::uuid[], $2::uuid[], $3::bytea[]) with ordinality as i(id, token, result, n)
    cross join retaining r
    cross join lateral (
        select j.id, k.keep,
            case when k.keep then j.payload end as payload,
            case when k.keep then j.headers end as headers,
            i.result,
            j.queue, j.priority, j.attempt, j.max_attempts, j.dedup_key, j.enqueued_at,
            j.key, j.last_error, j.leased_by, j.lease_token, j.lease_broker,
            case when w.waits then j.queue
                when j.queue = any(r.limited) and w.waits is null then j.queue end as slot_freed,
            case when not w.waits then j.key end as recheck_key,
            j.unique_for_ms
        from leaseq.jobs j
        cross join lateral (select j.queue = any(r.queues) or i.result is not null as keep) k
        -- Queues ordered by key only: whether another job of the key waits
        -- (null for other queues and for jobs without a key; false, with
        -- `by_key`, when the job has no key: it wakes nobody).
        cross join lateral (
            select case when j.queue = any(r.by_key) then
                j.key is not null and exists (
                    select from leaseq.jobs o
                    where o.queue = j.queue and o.key = j.key and o.state <> 'leased')
            end as waits
        ) w
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
         last_error, completed_by, key,
         result)
    select t.id, t.queue, t.priority, t.payload, t.headers, t.attempt, t.max_attempts, t.dedup_key,
        t.enqueued_at, t.last_error, t.leased_by, t.key,
        t.result
    from target t
    where t.keep
    on conflict (id) do nothing
),
held as (
    -- Unique for a window (EnqueueRequest.unique_for): a job that asked for
    -- one keeps its dedup key held for that long after this ack, in
    -- leaseq.dedup_holds (read by the enqueue statements, deleted by the
    -- retention loop once past: expire_dedup_holds.sql). Jobs without a
    -- window insert no rows. One row per key: an id given twice is in
    -- `target` twice, and a key has at most one live job.
    insert into leaseq.dedup_holds (queue, dedup_key, job_id, until)
    select distinct on (t.queue, t.dedup_key)
        t.queue, t.dedup_key, t.id, now() + t.unique_for_ms * interval '1 millisecond'
    from target t
    where t.unique_for_ms is not null and t.dedup_key is not null
    on conflict (queue, dedup_key) do update
        set job_id = excluded.job_id, until = excluded.until
),
gone as (
    delete from leaseq.jobs j
    where j.id = any(array(select t.id from target t))
    returning j.id
)
-- Every target row is deleted (its lock is ours): answer from the locked
-- versions, once per job.
select distinct on (t.id) t.id, t.lease_token as "lease_token!", t.lease_broker, t.slot_freed, t.queue,
    t.recheck_key
from target t
join gone g on g.id = t.id
$settle_ack$;
