#!/usr/bin/env bash
# A burst after a drain, on plans made on the empty table (docs/BENCHMARKS.md,
# "Plans made on an empty table"). On a fresh private durable cluster (the
# embedded cluster's settings, Unix socket only) and one broker on
# 127.0.0.1:50096: 5 s at 1,000 jobs/s, then `VACUUM ANALYZE leaseq.jobs`
# while it is empty (reltuples = 0: the broker's connections plan their
# statements again), 3 s at 200 jobs/s (the plans are made then, on the
# empty table), then 15 s flat out: jobs/s, CPU per job, and the top
# statements by time (pg_stat_statements). Whether the new plans are made
# before autovacuum looks at the table again varies: run it a few times.
# Run as root; everything it starts is stopped at the end.
#   usage: scripts/bench-replan.sh [BIN] [TAG]
set -u
BIN=${1:-$(cd "$(dirname "$0")/.." && pwd)/target/release/leaseq}
TAG=${2:-run}
PGB=${LEASEQ_PG_BIN:-$(dirname "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")}
R=/tmp/leaseq-bench-replan
rm -rf "$R"
mkdir -p "$R/run"
chown -R postgres "$R"
runuser -u postgres -- "$PGB/initdb" -D "$R/data" -U leaseq --auth=trust --no-sync >/dev/null
runuser -u postgres -- "$PGB/pg_ctl" -D "$R/data" -l "$R/log" -w -o "-k $R/run -p 54397 -c listen_addresses= \
    -c max_wal_size=4GB -c min_wal_size=512MB -c checkpoint_timeout=15min -c wal_compression=on \
    -c wal_buffers=16MB -c shared_preload_libraries=pg_stat_statements" start >/dev/null
PM=$(head -1 "$R/data/postmaster.pid")
U="postgres://leaseq@localhost:54397/leaseq?host=$R/run"
BP=
cleanup() {
    [ -n "$BP" ] && kill "$BP" 2>/dev/null && wait "$BP" 2>/dev/null
    runuser -u postgres -- "$PGB/pg_ctl" -D "$R/data" -m fast -w stop >/dev/null
}
trap cleanup EXIT
PSQL() { runuser -u postgres -- psql -qAtX "$U" "$@"; }
runuser -u postgres -- psql -qX "postgres://leaseq@localhost:54397/postgres?host=$R/run" -c "create database leaseq"
PSQL -c "create extension pg_stat_statements"
RUST_LOG=warn "$BIN" serve --listen 127.0.0.1:50096 --database-url "$U" >"$R/broker.log" 2>&1 &
BP=$!
sleep 3
A=http://127.0.0.1:50096
"$BIN" bench --addr $A --queues 6 --consumers 6 --scenario latency --rate 1000 --duration 5 --json >/dev/null 2>&1
sleep 1
PSQL -c "vacuum analyze leaseq.jobs" -c "select 'jobs left: ' || count(*) from leaseq.jobs"
"$BIN" bench --addr $A --queues 6 --consumers 6 --scenario latency --rate 200 --duration 3 --json >/dev/null 2>&1
PSQL -c "select pg_stat_statements_reset()" >/dev/null
"$BIN" bench --addr $A --queues 6 --consumers 6 --producers 6 --duration 15 --json --payload-bytes 100 \
    --broker-pid $BP --postgres-pid "$PM" 2>/dev/null | tail -1 |
    python3 -c "import json,sys; d=json.load(sys.stdin); print('$TAG', round(d['jobs_per_s']), 'jobs/s, CPU µs per job', d.get('cpu_us_per_job'))"
PSQL -c "select calls, round(mean_exec_time::numeric, 2) as mean_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 50) from pg_stat_statements order by total_exec_time desc limit 4"
