-- Which of these leases are still current, and for how many milliseconds.
select j.id, ceil(extract(epoch from (j.lease_expires_at - now())) * 1000)::int8 as "remaining_ms!"
from leaseq.jobs j
join unnest($1::uuid[], $2::uuid[]) as i(id, token) on j.id = i.id and j.lease_token = i.token
where j.lease_expires_at > now()
