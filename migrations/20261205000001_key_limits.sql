-- Per-key limits and fair shares across keys (issue 33; docs/design/keys.md).
--
-- key_concurrency now applies without ordered_by_key too (at most N of a
-- key leased at once, in any order). fair_by_key: lease rounds serve a
-- queue's keys in turn. key_rate_limit / key_rate_burst: a token bucket per
-- key (leaseq.key_buckets). key_overrides: settings for named keys, a JSON
-- object {key: {"concurrency": n, "rate_limit": r, "weight": w}} (at most
-- 1000 keys, checked by the broker). fair_cursor: the last key a fair round
-- served; the next round starts after it.
alter table leaseq.queues
    add column fair_by_key boolean not null default false,
    add column key_rate_limit float8 check (key_rate_limit > 0),
    add column key_rate_burst integer check (key_rate_burst between 1 and 1000000),
    add column key_overrides jsonb check (jsonb_typeof(key_overrides) = 'object'),
    add column fair_cursor text;

-- Whether a queue is leased by the key walk (lease_keys.sql) rather than
-- lease.sql, and never handed off: one definition for the lease, limits
-- and enqueue statements. A single-expression SQL function without a SET
-- clause, so the planner inlines it (it names no object a search_path
-- could resolve: only the argument's fields).
create function leaseq.walks_keys(q leaseq.queues) returns boolean
language sql immutable
as $$
    select q.fair_by_key or q.key_rate_limit is not null or q.key_overrides is not null
        or (q.key_concurrency is not null and not q.ordered_by_key)
$$;

drop index leaseq.queues_woken_on_settle;
-- A settle wakes these queues' consumers: a slot, a key's slot or a key's
-- next job freed (ack.sql, fail.sql).
create index queues_woken_on_settle on leaseq.queues (name)
    where concurrency_limit is not null or ordered_by_key or key_concurrency is not null
        or key_overrides is not null;

-- A key's rate bucket: tokens at `at`. A key without a row has a full
-- bucket; rows of full buckets are deleted by the retention pass
-- (expire_key_buckets.sql).
create table leaseq.key_buckets (
    queue  text not null references leaseq.queues (name) on delete cascade,
    key    text not null,
    tokens float8 not null,
    at     timestamptz not null,
    primary key (queue, key)
);

-- ack.sql and fail.sql wake per-key limited queues too: leaseq.ack() and
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
-- `slot_freed` names the job's queue when it has a concurrency limit, a
-- per-key concurrency limit (key_concurrency, key_overrides) or is
-- ordered by key: its waiting consumers (on any replica) are woken, since a
-- slot, or the next job of the key, just freed.
with retaining as (
    select array(select q.name from leaseq.queues q where q.completed_retention_ms > 0) as queues,
        array(select q.name from leaseq.queues q
            where q.concurrency_limit is not null or q.ordered_by_key
                or q.key_concurrency is not null or q.key_overrides is not null) as limited
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
-- `slot_freed`: the queue has a concurrency limit, a per-key concurrency
-- limit or is ordered by key, so
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
        (q.concurrency_limit is not null or q.ordered_by_key
            or q.key_concurrency is not null or q.key_overrides is not null) as slot_freed,
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
