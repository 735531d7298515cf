-- The state of each waited job (WaitJob, src/waits.rs), in one snapshot:
-- live (its state, 'scheduled' for an available job not yet due), dead,
-- completed, cancelled (recorded by CancelJob for --result-retention), or
-- none of these (every column but the id null). An ack
-- deletes the live row and writes the completed one in one statement, so
-- a job is never seen in neither while it ends (nor in both).
--
-- Four primary-key probes per id (each in a lateral subquery of its own,
-- as ack.sql does, so that no plan reads a whole table).
select i.id as "id!",
    coalesce(j.state, case when d.id is not null then 'dead' end,
        case when c.id is not null then 'completed' end,
        case when x.id is not null then 'cancelled' end) as state,
    coalesce(j.queue, d.queue, c.queue, x.queue) as queue,
    d.reason as "dead_reason?", d.last_error,
    coalesce(d.died_at, c.completed_at, x.at) as finished_at,
    c.result
from unnest($1::uuid[]) as i(id)
left join lateral (
    select case when j.state = 'available' and j.run_at > now() then 'scheduled' else j.state end as state,
        j.queue
    from leaseq.jobs j where j.id = i.id
) j on true
left join lateral (
    select d.id, d.queue, d.reason, d.last_error, d.died_at from leaseq.dead_jobs d where d.id = i.id
) d on true
left join lateral (
    select c.id, c.queue, c.result, c.completed_at from leaseq.completed_jobs c where c.id = i.id
) c on true
left join lateral (
    select x.id, x.queue, x.at from leaseq.cancelled_jobs x where x.id = i.id
) x on true
