-- Live leases stamped with this broker ($1) on jobs enqueued more than $2
-- ms ago: the dispatcher releases those none of its streams holds. They are
-- jobs another replica handed to a stream here whose hand-over notification
-- was lost (dispatch/remote.rs). Read through jobs_lease_expiry: as many
-- rows as there are jobs in flight, whatever the backlog.
select id, lease_token as "lease_token!"
from leaseq.jobs
where state = 'leased' and lease_expires_at > now()
  and lease_broker = $1
  and enqueued_at < now() - $2::int8 * interval '1 millisecond'
