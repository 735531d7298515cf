-- Hand-off for queues ordered by key (issue 33; docs/design/keys.md, "Hand-off
-- in ordered queues"): the enqueue statements may insert a keyed job of an
-- ordered queue already leased to an idle stream, as they do any job of a
-- queue without limits, when this function says its key is free.
--
-- The key rule (lease.sql) reads other rows than the one it writes, so its
-- answers are only safe under the queue row's lock, with a snapshot taken
-- after the lock (store/limits.rs says why). An enqueue statement's own
-- snapshot is taken before it could lock anything, so the check is a
-- VOLATILE function: each of its queries takes a fresh snapshot. It
--
-- 1. locks the queue's row as a lease round does (`for update`), held until
--    the enqueue's transaction ends: lease rounds of the queue, on every
--    replica, and other hand-offs of it wait for that commit, and see the
--    job leased. It never waits itself (`skip locked`): a queue whose row a
--    round holds gets no hand-off (false), the job is inserted available
--    and that round's successor leases it. So an enqueue never waits for a
--    lease round, nor for an operator's open transaction, and two enqueue
--    statements locking rows of two queues in opposite orders cannot
--    deadlock;
-- 2. counts the key's live jobs, in any state, up to n: fewer than n (the
--    queue's key_concurrency) and the new job, the newest of its key, may go
--    now. That is the key rule for a job with nothing enqueued after it,
--    made stricter (every live job counts, not only those before it or
--    leased).
--
-- Jobs enqueued by the same statement earlier are seen (each query of a
-- VOLATILE function sees its calling statement's changes so far), and the
-- brokers hand off at most one job of a key per statement anyway.
create function leaseq.key_free_for_handoff(queue text, key text, n integer)
returns boolean
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    live bigint;
begin
    perform 1 from leaseq.queues q where q.name = key_free_for_handoff.queue
        for update skip locked;
    if not found then
        return false;
    end if;
    select count(*) into live from (
        select from leaseq.jobs j
        where j.queue = key_free_for_handoff.queue and j.key = key_free_for_handoff.key
        limit n
    ) k;
    return live < n;
end
$$;

comment on function leaseq.key_free_for_handoff(text, text, integer) is
    'Whether an enqueue may insert a job of this key leased (hand-off) in a queue ordered by key; locks the queue row. Internal: called by the enqueue statements.';
