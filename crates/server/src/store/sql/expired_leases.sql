-- Leases that have run out (database clock), oldest first; the reaper passes
-- them to fail.sql, which re-checks the token under a row lock.
select id, lease_token as "lease_token!"
from leaseq.jobs
where state = 'leased' and lease_expires_at <= now()
  and ($1::uuid[] is null or id = any($1))
order by lease_expires_at
limit $2
