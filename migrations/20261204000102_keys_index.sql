-- jobs_key without the leased rows (issue 33, "A million keys" in
-- docs/BENCHMARKS.md). A lease is an UPDATE that PostgreSQL can never make
-- HOT (it changes `state`), so every index whose predicate the new version
-- meets gets an entry for it. jobs_key held every keyed row, so each lease
-- of a keyed job wrote an entry into it: a random page of an index the size
-- of the backlog, which with a million keys cost more than the lease of a
-- job without a key. Leased rows are in jobs_key_leased already: lease.sql's
-- key rule now counts a key's jobs ahead of J that are not leased (here)
-- and the key's leased jobs whatever their id (jobs_key_leased), which is
-- the same count as before (J itself is not leased).
drop index leaseq.jobs_key;
create index jobs_key on leaseq.jobs (queue, key, id) where key is not null and state <> 'leased';

-- The hand-off check counts the key's live jobs through both indexes.
create or replace function leaseq.key_free_for_handoff(queue text, key text, n integer)
returns boolean
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    waiting bigint;
    leased bigint;
begin
    perform 1 from leaseq.queues q where q.name = key_free_for_handoff.queue
        for update skip locked;
    if not found then
        return false;
    end if;
    select count(*) into waiting from (
        select from leaseq.jobs j
        where j.queue = key_free_for_handoff.queue and j.key = key_free_for_handoff.key
          and j.state <> 'leased'
        limit n
    ) k;
    select count(*) into leased from (
        select from leaseq.jobs j
        where j.queue = key_free_for_handoff.queue and j.key = key_free_for_handoff.key
          and j.state = 'leased'
        limit n
    ) k;
    return waiting + leased < n;
end
$$;
