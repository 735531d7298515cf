-- Moves dead letters back to their queue as fresh jobs: attempt 0,
-- deliverable now, enqueued_at = now (their ttl is not restored).
--
-- $1 ids (null = every dead letter of queue $2), $2 queue (null = any).
--
-- Invariant: at most one live job per (queue, dedup_key) (jobs_dedup). A dead
-- letter whose key is held by a live job stays dead (counted as skipped), and
-- of several dead letters sharing a key only the oldest is requeued. Rows are
-- deleted and inserted in one statement: a dead letter is never lost.
with matched as (
    select d.* from leaseq.dead_jobs d
    where ($1::uuid[] is null or d.id = any($1))
      and ($2::text is null or d.queue = $2)
),
pick as (
    select distinct on (m.queue, coalesce(m.dedup_key, m.id::text)) m.id
    from matched m
    where m.dedup_key is null
       or not exists (
           select 1 from leaseq.jobs j where j.queue = m.queue and j.dedup_key = m.dedup_key)
    order by m.queue, coalesce(m.dedup_key, m.id::text), m.id
),
moved as (
    delete from leaseq.dead_jobs d
    where d.id in (select id from pick)
    returning d.*
),
ins as (
    insert into leaseq.jobs
        (id, queue, state, priority, run_at, payload, headers, attempt, max_attempts, dedup_key, enqueued_at, last_error, key)
    select id, queue, 'available', priority, now(), payload, headers, 0, max_attempts, dedup_key, now(), last_error, key
    from moved
    returning queue
)
-- One row with how many matched, then one per queue with how many moved.
select null::text as queue, 0::int8 as "n!", (select count(*) from matched) as "matched!"
union all
select queue, count(*), 0 from ins group by queue
