-- Leases jobs of one queue whose keys have limits or fair shares
-- (fair_by_key, key_rate_limit, key_overrides, or key_concurrency without
-- ordered_by_key: leaseq.walks_keys), for the streams that asked.
--
-- The caller (store/limits.rs) holds the queue's row lock, so rounds on
-- this queue are serial across replicas: each statement's snapshot sees the
-- previous round's leases and rate buckets.
--
-- A round walks the keys that have jobs in leaseq.jobs, in key order,
-- starting after the key where the previous round stopped
-- (queues.fair_cursor) and wrapping around, at most $8 keys (a skip scan of
-- jobs_key, which holds a key's jobs not leased: one index probe per key
-- with jobs waiting, whatever each key's backlog). Jobs
-- without a key are one more turn, at the wrap between the last key and
-- the first, looked for among the first $8 due jobs of the queue's
-- delivery order (so a queue whose keyed jobs are at its head delivers its
-- unkeyed ones only as those go: give every job of a fair queue a key).
-- For each key it takes what the key may have:
--
--   * concurrency (key_overrides.concurrency, else key_concurrency): the
--     key's unexpired leases are counted; in a queue ordered by key, the
--     lease.sql rule instead, on the key's first N live jobs;
--   * rate (key_overrides.rate_limit, else key_rate_limit): its bucket in
--     leaseq.key_buckets refilled to now (no row = full), floored;
--   * at most $8 jobs;
--
-- in enqueue order within the key (due jobs only; priority does not
-- reorder a key's jobs). The round then takes the keys' jobs in turns:
-- every key's first job before any key's second (a key's turn holds
-- `weight` jobs), the keys of a turn in the walk's order, and hands out the
-- first max(hi) of them. Leased jobs come out of their keys' buckets, and
-- the cursor moves to the last turn served, so the next round, however
-- small, starts with the key after it.
--
-- Times are the statement's, as in lease.sql.
--
-- $1 queue, $2..$6 the asks (lo, hi, lease_ms, slot, consumer) as lease.sql's,
-- $7 this broker, $8 keys to visit.
with recursive
want as (
    select * from unnest($2::int4[], $3::int4[], $4::int8[], $5::int4[], $6::text[])
        as w(lo, hi, lease_ms, slot, consumer)
),
q as (
    select q.name, q.default_lease_ms, q.ordered_by_key, q.key_overrides,
        coalesce(q.key_concurrency, case when q.ordered_by_key then 1 end) as key_n,
        q.key_rate_limit,
        coalesce(q.key_rate_burst, greatest(1, ceil(q.key_rate_limit))) as key_burst,
        coalesce(q.fair_cursor, '') as cursor,
        (select max(hi) from want) as n
    from leaseq.queues q
    where q.name = $1 and not q.paused
),
-- Keys after the cursor, in key order. (The cursor is read by a scalar
-- subquery: as a join column it would not bound the index scan.)
walk_after(key, i) as (
    (select j.key, 1
     from leaseq.jobs j
     where j.queue = $1 and j.key > (select cursor from q) and j.state <> 'leased'
     order by j.key limit 1)
    union all
    select (select j.key from leaseq.jobs j
            where j.queue = $1 and j.key > a.key and j.state <> 'leased'
            order by j.key limit 1), a.i + 1
    from walk_after a
    where a.key is not null and a.i < $8
),
-- Then from the first key up to the cursor, while visits are left.
walk_before(key, i) as (
    (select j.key, (select count(*) from walk_after where key is not null) + 1
     from leaseq.jobs j
     where j.queue = $1 and j.key > '' and j.key <= (select cursor from q)
       and j.state <> 'leased'
     order by j.key limit 1)
    union all
    select (select j.key from leaseq.jobs j where j.queue = $1 and j.key > b.key
              and j.key <= (select cursor from q) and j.state <> 'leased'
            order by j.key limit 1), b.i + 1
    from walk_before b
    where b.key is not null and b.i < $8
),
keys as (
    select key, i::float8 as i from walk_after where key is not null
    union all
    select key, i::float8 from walk_before where key is not null and i <= $8
),
-- Where the jobs without a key take their turn: at the wrap, between the
-- last key and the first.
unkeyed_at as (
    select (select count(*) from walk_after where key is not null) + 0.5 as i
),
-- What each key may have this round.
per_key as (
    select k.key, k.i, s.weight, s.conc, s.rate, s.burst,
        case when s.rate is not null then
            least(s.burst, coalesce(b.tokens + s.rate
                * greatest(0, extract(epoch from statement_timestamp() - b.at))::float8, s.burst))
        end as tokens,
        case when s.conc is not null then (
            select count(*) from (
                select from leaseq.jobs e
                where e.queue = $1 and e.key = k.key and e.state = 'leased'
                  and (q.ordered_by_key or e.lease_expires_at > statement_timestamp())
                limit s.conc
            ) l
        ) end as leased
    from keys k
    cross join q
    cross join lateral (
        select coalesce((q.key_overrides -> k.key ->> 'weight')::int4, 1) as weight,
            coalesce((q.key_overrides -> k.key ->> 'concurrency')::int4, q.key_n) as conc,
            coalesce((q.key_overrides -> k.key ->> 'rate_limit')::float8, q.key_rate_limit) as rate,
            (case when q.key_overrides -> k.key ? 'rate_limit'
                then greatest(1, ceil((q.key_overrides -> k.key ->> 'rate_limit')::float8))
                else q.key_burst end)::float8 as burst
    ) s
    left join leaseq.key_buckets b on b.queue = $1 and b.key = k.key
),
allowed as (
    select pk.*,
        greatest(0, least(q.n::int8, pk.conc - pk.leased, floor(pk.tokens)::int8)) as allow
    from per_key pk cross join q
),
-- The jobs each key may have, in enqueue order.
keyed as (
    select a.key, a.i, a.weight, c.id, c.priority, c.run_at,
        row_number() over (partition by a.key order by c.id) as turn
    from allowed a
    cross join q
    cross join lateral (
        -- Unordered: the key's due jobs.
        select c.id, c.priority, c.run_at
        from leaseq.jobs c
        where not q.ordered_by_key
          and c.queue = $1 and c.key = a.key and c.state <> 'leased'
          and c.run_at <= statement_timestamp()
          and (c.expires_at is null or c.expires_at > statement_timestamp())
        order by c.id
        limit a.allow
    ) c
    where a.allow > 0
    union all
    select a.key, a.i, a.weight, f.id, f.priority, f.run_at,
        row_number() over (partition by a.key order by f.id) as turn
    from allowed a
    cross join q
    cross join lateral (
        -- Ordered: among the key's first N jobs not leased (N = its
        -- concurrency), those lease.sql's rule lets go: fewer than N jobs of
        -- the key not leased and ahead of it, plus the key's leased ones
        -- (whatever their id: per_key's count).
        select f.id, f.priority, f.run_at
        from (
            select e.id, e.priority, e.run_at, e.expires_at,
                row_number() over (order by e.id) - 1 as ahead
            from (
                select e.id, e.priority, e.run_at, e.expires_at
                from leaseq.jobs e
                where e.queue = $1 and e.key = a.key and e.state <> 'leased'
                order by e.id
                limit a.conc
            ) e
        ) f
        where q.ordered_by_key
          and f.run_at <= statement_timestamp()
          and (f.expires_at is null or f.expires_at > statement_timestamp())
          and f.ahead + a.leased < a.conc
        order by f.id
        limit a.allow
    ) f
    where a.allow > 0
),
-- Jobs without a key: one more turn, from the head of the delivery order.
unkeyed as (
    select null::text as key, ua.i::float8 as i, 1 as weight, u.id, u.priority, u.run_at,
        row_number() over (order by u.priority desc, u.run_at, u.id) as turn
    from q
    cross join unkeyed_at ua
    cross join lateral (
        select h.id, h.priority, h.run_at
        from (
            select c.id, c.key, c.priority, c.run_at
            from leaseq.jobs c
            where c.queue = $1 and c.state = 'available'
              and c.run_at <= statement_timestamp()
              and (c.expires_at is null or c.expires_at > statement_timestamp())
            order by c.priority desc, c.run_at, c.id
            limit $8
        ) h
        where h.key is null
    ) u
),
-- Turns, and within a turn the walk's order (from the cursor on).
chosen as (
    select c.*, row_number() over (order by ceil(c.turn::float8 / c.weight), c.i, c.id) as rn
    from (select * from keyed union all select * from unkeyed) c
    order by ceil(c.turn::float8 / c.weight), c.i, c.id
    limit (select n from q)
),
-- Rows another statement holds (a cancel, the reaper) are passed over; the
-- state is checked again on the row locked. One primary-key probe per row
-- (a lateral): as a join the planner may hash the whole table.
locked as (
    select j.ctid, c.id, c.rn, c.i
    from chosen c
    cross join lateral (
        select j.ctid from leaseq.jobs j
        where j.id = c.id and j.state = 'available'
        for update skip locked
    ) j
),
numbered as (
    select l.ctid, l.id, l.i, row_number() over (order by l.rn) as rn
    from locked l
),
assigned as (
    select n.ctid, n.id, n.rn, w.slot, w.consumer,
        coalesce(w.lease_ms, (select default_lease_ms from q)) as lease_ms
    from numbered n
    join want w on n.rn > w.lo and n.rn <= w.hi
),
-- The rows by ctid, as an array (a Tid Scan): the planner, unable to
-- estimate `assigned`, would otherwise hash-join the whole table.
updated as (
    update leaseq.jobs j set
        state = 'leased',
        attempt = j.attempt + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = statement_timestamp()
            + (select a.lease_ms from assigned a where a.ctid = j.ctid) * interval '1 millisecond',
        lease_broker = $7,
        leased_by = (select a.consumer from assigned a where a.ctid = j.ctid)
    where j.ctid = any(array(select a.ctid from assigned a))
    returning j.id, j.queue, j.payload, j.headers::text as headers,
        j.priority, j.attempt, j.enqueued_at, j.last_error, j.lease_token, j.lease_expires_at,
        j.run_at, j.key
),
leased as (
    select a.slot, a.lease_ms, u.id, u.queue, u.payload, u.headers, u.priority, u.attempt,
        u.enqueued_at, u.last_error, u.lease_token, u.lease_expires_at, a.rn, u.run_at, u.key
    from updated u
    join assigned a on a.id = u.id
),
spent as (
    select l.key, count(*) as used from leased l where l.key is not null group by l.key
),
buckets as (
    insert into leaseq.key_buckets as b (queue, key, tokens, at)
    select $1, pk.key, pk.tokens - s.used, statement_timestamp()
    from spent s join per_key pk on pk.key = s.key
    where pk.tokens is not null
    on conflict (queue, key) do update set tokens = excluded.tokens, at = excluded.at
),
moved as (
    -- The next round starts after the last turn served in the walk's order
    -- ('' = the jobs without a key, at the wrap: the next round starts at
    -- the first key), or after the last key visited when none was served.
    update leaseq.queues q set fair_cursor = coalesce(
        (select coalesce(t.key, '')
         from (select k.key, k.i from keys k union all select null, ua.i from unkeyed_at ua) t
         where exists (select from leased l where l.key is not distinct from t.key)
         order by t.i desc limit 1),
        (select k.key from keys k order by k.i desc limit 1),
        q.fair_cursor)
    where q.name = $1
),
-- Why the round may have left due jobs behind: the walk stopped at $8
-- keys, or a key's rate bucket held jobs back (and when its next token
-- is due).
held as (
    select
        (select count(*) from keys) >= $8 as walk_cut,
        (select min(ceil((1 - t.left) / a.rate * 1000))::int8
         from allowed a
         cross join lateral (
             select a.tokens - coalesce((select s.used from spent s where s.key = a.key), 0) as left
         ) t
         where a.tokens is not null and t.left < 1) as token_ms
)
select l.slot, l.lease_ms, l.id, l.queue, l.payload, l.headers, l.priority, l.attempt,
    l.enqueued_at, l.last_error, l.lease_token, l.lease_expires_at, l.rn, l.run_at, l.key,
    null::bool as walk_cut, null::int8 as token_ms
from leased l
union all
select -1, null, null, $1, null, null, null, null, null, null, null, null, null, null, null,
    h.walk_cut, h.token_ms
from held h
order by 1, 13
