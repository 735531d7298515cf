-- Deletes dedup keys held after their job completed (unique_for) once the
-- window has passed, at most $1 rows a pass. The enqueue statements ignore
-- a hold past its `until` already, so this only keeps the table small.
-- Rows another broker is deleting are skipped.
with gone as (
    select h.ctid
    from leaseq.dedup_holds h
    where h.until <= now()
    limit $1
    for update skip locked
)
delete from leaseq.dedup_holds h
using gone
where h.ctid = gone.ctid
