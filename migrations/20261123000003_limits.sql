-- Per-queue limits, enforced across every replica in the lease path.
--
-- concurrency_limit: most jobs of the queue leased at once (unexpired leases).
-- rate_limit: jobs started (leased) per second, as a token bucket of
-- rate_burst tokens (null = max(1, ceil(rate_limit))); rate_tokens / rate_at
-- are the bucket's level and when it was last computed (null = full).
--
-- A lease round for a limited queue locks its queues row first, then counts
-- and leases in a new snapshot (src/store/limits.rs), so replicas take turns
-- and the limits hold exactly. Unlimited queues never take that lock.
alter table leaseq.queues
    add column concurrency_limit integer check (concurrency_limit >= 1),
    add column rate_limit double precision check (rate_limit > 0),
    add column rate_burst integer check (rate_burst >= 1),
    add column rate_tokens double precision,
    add column rate_at timestamptz;

-- Ack looks up the queues with a concurrency limit once per statement.
create index queues_limited on leaseq.queues (name) where concurrency_limit is not null;
