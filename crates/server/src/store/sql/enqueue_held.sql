-- Jobs just inserted (ids $1, each with a dedup key) whose key is held by a
-- job that completed with a window (unique_for) while the insert waited for
-- that job's ack: the insert statement's snapshot missed the hold, this
-- statement's sees it (Store::held_since_insert). They are deleted again,
-- in the enqueue's own transaction, and answered with the holder.
delete from leaseq.jobs j
using leaseq.dedup_holds h
where j.id = any($1::uuid[])
  and h.queue = j.queue and h.dedup_key = j.dedup_key and h.until > now()
  and h.job_id <> j.id
returning j.id, h.job_id as holder
