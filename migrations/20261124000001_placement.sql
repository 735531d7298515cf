-- Queues over several PostgreSQL clusters (docs/SCALING.md). Every cluster
-- gets these tables (one schema everywhere); the placement itself is read
-- from the home cluster (the first --database-url) only. A broker given one
-- database never reads or writes them.

-- Clusters by name, each with a small id that lease tokens carry. Ids are
-- assigned once and never reused; home is 0.
create table leaseq.placement_clusters (
    id   smallint primary key check (id >= 0),
    name text not null unique
);

-- The epoch of the placement: bumped by every change of the tables below,
-- so brokers re-read them only when it moved.
create table leaseq.placement_epoch (
    one   boolean primary key default true check (one),
    epoch bigint not null
);

-- Bucket -> cluster (a queue's bucket is FNV-1a of its name mod 1024).
-- moving_to: a move is under way; enqueues and lease rounds go there.
create table leaseq.placement (
    bucket    integer primary key check (bucket >= 0),
    cluster   smallint not null,
    moving_to smallint
);

-- Queue name, or a prefix ending in '*', -> cluster; overrides the bucket.
create table leaseq.placement_pins (
    pattern text primary key,
    cluster smallint not null
);

-- The epoch each live broker routes by, so a move can wait for all of them.
create table leaseq.placement_brokers (
    broker  uuid primary key,
    epoch   bigint not null,
    seen_at timestamptz not null default now()
);

-- Which cluster this database is (written on first start with several
-- clusters): a broker refuses a URL whose database knows itself by another
-- name, so swapped URLs cannot send one cluster's tokens to another.
create table leaseq.cluster_identity (
    one  boolean primary key default true check (one),
    id   smallint not null,
    name text not null
);

-- Tombstones of jobs a bucket move copied into this cluster, written in the
-- copy's own transaction: a copy repeated after a mover died between the two
-- commits finds them and copies nothing twice.
create table leaseq.moved_jobs (
    id       uuid primary key,
    moved_at timestamptz not null default now()
);
