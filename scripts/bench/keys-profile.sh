#!/usr/bin/env bash
# What an ordered queue's lease rounds cost (issue 33; docs/BENCHMARKS.md,
# "Queues ordered by key"): one durable cluster with pg_stat_statements, a
# broker on it, warmed; then, for each mode of MODES, one flat-out stream
# run (acks on the stream) with the statements' counters reset before it.
# Per run it writes OUTDIR/MODE.statements: every statement's calls, rows,
# mean and total execution time, the rows per call, and per job moved; and
# OUTDIR/MODE.xacts: the database's commits and rollbacks per job. With
# PERF=1 also `perf record` of the cluster's processes over the run
# (OUTDIR/MODE.perf.txt: the report by symbol). Run as root.
#   usage: scripts/bench/keys-profile.sh OUTDIR
#   env:   BIN, KEYS (10000), MODES ("unordered ordered nokeys"), SECS (15),
#          PERF=1, QUICK=1, KEEP=1 (scripts/bench/lib.sh)
# Stops only what it started, by pid; ports are picked free.
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
KEYS=${KEYS:-10000}
bench_init "${1:?usage: scripts/bench/keys-profile.sh OUTDIR}"
private_cluster pg -c shared_preload_libraries=pg_stat_statements \
    -c pg_stat_statements.track=all -c pg_stat_statements.max=1000
psql_at "$U" -c "create extension if not exists pg_stat_statements" >/dev/null
serve broker
A=$S
A_PID=$S_PID
run_json warm "$BIN" bench --json --addr "$A" --duration "$(secs 10)"
psql_at "$U" -c checkpoint >/dev/null
D=$(secs "${SECS:-15}")
for mode in ${MODES:-unordered ordered nokeys}; do
  flag=""; keys=$KEYS
  case $mode in
    ordered) flag="--ordered-by-key" ;;
    nokeys) flag="--ordered-by-key"; keys=0 ;;
  esac
  psql_at "$U" -c "select pg_stat_statements_reset()" -c "select pg_stat_reset()" >/dev/null
  perf_pid=
  if [ -n "${PERF:-}" ]; then
    perf record -g -o "$OUT/$mode.perf" -p "$(pg_pids)" >/dev/null 2>&1 &
    perf_pid=$!
    track "$perf_pid"
  fi
  # shellcheck disable=SC2086
  bench "stream-$mode" --addr "$A" --keys "$keys" $flag --duration "$D" \
    --broker-pid "$A_PID" --postgres-pid "$PM"
  if [ -n "$perf_pid" ]; then
    kill -INT "$perf_pid"; wait "$perf_pid"; forget "$perf_pid"
    perf report -i "$OUT/$mode.perf" --no-children --sort symbol --stdio 2>/dev/null |
      head -80 >"$OUT/$mode.perf.txt"
  fi
  jobs=$(echo "$LINE" | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"])')
  psql_at "$U" -F ' | ' -c "
    select calls, rows, round((rows::numeric / nullif(calls, 0)), 1) as rows_per_call,
        round(mean_exec_time::numeric * 1000, 1) as mean_us,
        round(total_exec_time::numeric * 1000 / $jobs, 2) as us_per_job,
        round(calls::numeric / $jobs, 4) as calls_per_job,
        regexp_replace(left(query, 90), '\s+', ' ', 'g')
    from pg_stat_statements where calls > 0
    order by total_exec_time desc limit 40" >"$OUT/$mode.statements"
  psql_at "$U" -c "
    select 'commits/job ' || round(xact_commit::numeric / $jobs, 3)
        || ' rollbacks/job ' || round(xact_rollback::numeric / $jobs, 3)
    from pg_stat_database where datname = current_database()" >"$OUT/$mode.xacts"
  log "$mode: $jobs jobs; $(cat "$OUT/$mode.xacts")"
  head -12 "$OUT/$mode.statements"
done
log "done: $RESULTS"
