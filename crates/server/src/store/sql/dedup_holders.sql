-- What holds each (queue, dedup_key): the live job, else the completed job
-- whose window (unique_for) has not passed. `waiting`: the live job is not
-- leased (a REPLACE enqueue may still change it). Keys held by nothing are
-- left out (their job ended since the insert looked: the caller retries).
select k.queue as "queue!", k.dedup_key as "dedup_key!",
    coalesce(j.id, h.job_id) as "id!",
    coalesce(j.state = 'available', false) as "waiting!"
from unnest($1::text[], $2::text[]) as k(queue, dedup_key)
left join leaseq.jobs j on j.queue = k.queue and j.dedup_key = k.dedup_key
left join leaseq.dedup_holds h
    on h.queue = k.queue and h.dedup_key = k.dedup_key and h.until > now()
where j.id is not null or h.job_id is not null
