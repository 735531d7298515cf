#!/usr/bin/env bash
# A burst after a drain, on plans made on the empty table (docs/BENCHMARKS.md,
# "Plans made on an empty table"). On a fresh private durable cluster (the
# embedded cluster's settings, Unix socket only) and one broker: 5 s at 1,000 jobs/s, then `VACUUM ANALYZE leaseq.jobs`
# while it is empty (reltuples = 0: the broker's connections plan their
# statements again), 3 s at 200 jobs/s (the plans are made then, on the
# empty table), then 15 s flat out: jobs/s, CPU per job, and the top
# statements by time (pg_stat_statements). Whether the new plans are made
# before autovacuum looks at the table again varies: run it a few times.
# Run as root; everything it starts is stopped at the end.
#   usage: scripts/bench/replan.sh [BIN] [TAG]
#   env:   OUTDIR (the broker's log; default $TMPDIR/leaseq-bench-replan),
#          KEEP=1 (scripts/bench/lib.sh)
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
[ -n "${1:-}" ] && BIN=$1
TAG=${2:-run}
bench_init "${OUTDIR:-${TMPDIR:-/tmp}/leaseq-bench-replan}"
private_cluster pg -c shared_preload_libraries=pg_stat_statements
PSQL() { psql_at "$U" "$@"; }
PSQL -c "create extension pg_stat_statements"
serve broker
BP=$S_PID
run_wait "$OUT/burst.log" "$BIN" bench --addr "$S" --queues 6 --consumers 6 --scenario latency --rate 1000 --duration 5 --json
sleep 1
PSQL -c "vacuum analyze leaseq.jobs" -c "select 'jobs left: ' || count(*) from leaseq.jobs"
run_wait "$OUT/plans.log" "$BIN" bench --addr "$S" --queues 6 --consumers 6 --scenario latency --rate 200 --duration 3 --json
PSQL -c "select pg_stat_statements_reset()" >/dev/null
run_json "$TAG" "$BIN" bench --addr "$S" --queues 6 --consumers 6 --producers 6 --duration 15 --json --payload-bytes 100 \
    --broker-pid "$BP" --postgres-pid "$PM" &&
    python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(d['run'], round(d['jobs_per_s']), 'jobs/s, CPU µs per job', d.get('cpu_us_per_job'))" "$LINE"
PSQL -c "select calls, round(mean_exec_time::numeric, 2) as mean_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 50) from pg_stat_statements order by total_exec_time desc limit 4"
