-- One broker's rates per queue over its last interval, and the queues'
-- depth where it counted it (crates/server/src/history.rs): the latest rate
-- per (queue, broker) is upserted, every sample appended; samples older
-- than 15 minutes (history::KEEP) and rates of brokers silent for an hour
-- are deleted on the way, by index.
with rates as (
    insert into leaseq.queue_rates as r (queue, broker, period_ms, enqueue_rate, ack_rate)
    select q, $4, $5, e, a
    from unnest($1::text[], $2::float8[], $3::float8[]) as i(q, e, a)
    on conflict (queue, broker) do update set
        at = now(),
        period_ms = excluded.period_ms,
        enqueue_rate = excluded.enqueue_rate,
        ack_rate = excluded.ack_rate
),
samples as (
    insert into leaseq.queue_samples
        (queue, broker, period_ms, enqueue_rate, ack_rate, available, scheduled, leased, dead)
    select q, $4, $5, e, a, av, sc, le, de
    from unnest($6::text[], $7::float8[], $8::float8[], $9::int8[], $10::int8[], $11::int8[], $12::int8[])
        as i(q, e, a, av, sc, le, de)
),
gone_rates as (
    delete from leaseq.queue_rates where at < now() - interval '1 hour'
)
delete from leaseq.queue_samples where at < now() - interval '15 minutes'
