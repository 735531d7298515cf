-- Which of these leases are still current, and for how many milliseconds.
-- Runs after expired_leases.sql in the same transaction (Store::check_leases),
-- so both see the same now(): a lease held with this token is in one answer
-- or the other.
--
-- Each lease is looked up in a lateral subquery of its own (`limit 1` keeps
-- PostgreSQL from flattening it into a join), run with the sweeps' planner
-- settings: a primary-key probe per id, whatever the table's statistics
-- said when the statement was planned. Joined to the arrays instead, its
-- generic plan made on a drained, analysed table read all of leaseq.jobs
-- (or all of jobs_pkey) for every call (tests/plans.rs).
select j.id as "id!", j.remaining_ms as "remaining_ms!"
from unnest($1::uuid[], $2::uuid[]) as i(id, token)
cross join lateral (
    select j.id, ceil(extract(epoch from (j.lease_expires_at - now())) * 1000)::int8 as remaining_ms
    from leaseq.jobs j
    where j.id = i.id and j.lease_token = i.token and j.lease_expires_at > now()
    limit 1
) j
