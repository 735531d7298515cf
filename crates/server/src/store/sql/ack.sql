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
