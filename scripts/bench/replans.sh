#!/usr/bin/env bash
# Does a VACUUM (or ANALYZE) of leaseq.jobs make the hot statements re-plan?
# pg_stat_statements' plans counters of the enqueue, ack and lease statements,
# 5 s apart, around a manual VACUUM and an ANALYZE, under a light latency run
# (200 jobs/s; the broker's own vacuum off). docs/BENCHMARKS.md, "The tail at
# 1,000 jobs/s". On a private durable cluster with the embedded cluster's
# settings and pg_stat_statements (track_planning on), its schema made by
# `leaseq migrate`. Run as root; a release build.
#   usage: scripts/bench/replans.sh [OUTDIR]
#   env:   BIN, KEEP=1 (scripts/bench/lib.sh)
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init "${1:-${TMPDIR:-/tmp}/leaseq-bench-replans}"
private_cluster pg -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_planning=on
P() { psql_at "$U" -c "$1"; }
P "create extension if not exists pg_stat_statements" >/dev/null
DATABASE_URL=$U "$BIN" migrate >"$OUT/migrate.log" 2>&1 || { echo "migrate failed: $OUT/migrate.log" >&2; exit 1; }
serve broker LEASEQ_VACUUM_INTERVAL=0
snap() { echo "-- $1"; P "select plans, calls, left(regexp_replace(query,'\s+',' ','g'),40) from pg_stat_statements where query like '%Inserts new jobs%' or query like '%Completes jobs%' or query like '%Leases jobs for many%' order by 3"; }
"$BIN" bench --addr "$S" --scenario latency --rate 200 --consumers 2 --duration 40 >"$OUT/bench.log" 2>&1 &
BENCH=$!; track "$BENCH"
sleep 10; snap "t=10"; sleep 5; snap "t=15 (no vacuum)"; P "vacuum leaseq.jobs"; echo "-- vacuum done"; sleep 3; snap "t=18 (after vacuum)"; sleep 7; snap "t=25 (no vacuum)"; P "analyze leaseq.jobs"; echo "-- analyze done"; sleep 3; snap "t=28 (after analyze)"
wait "$BENCH"; forget "$BENCH"
stop_all
