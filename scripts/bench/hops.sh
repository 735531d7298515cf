#!/usr/bin/env bash
# Where an Enqueue call's time goes at light load, hop by hop, in one sitting:
# for each rate, alternately and REPS times, on one broker over a fresh
# durable embedded cluster (warmed: 15 s flat out, then a CHECKPOINT):
#   floor   ../shared/anchors/commit-floor.sh: a one-row insert + commit
#   stmt    scripts/bench/statement-floor.sh: leaseq's enqueue statement (a job
#           inserted already leased) + commit, through pgbench
#   ping    `leaseq bench --scenario ping`: a gRPC health check, no database
#   latency `leaseq bench --scenario latency --consumers 2`: the Enqueue
#           call (enqueue_p50_ms) and enqueue → delivery (p50_ms)
# all open loop at the same rate, DUR seconds each. One JSON line per run in
# OUTDIR/results.jsonl (`run`: what, rate, repetition; for floor and stmt,
# `pg_cpu_us_per_tx`: the cluster's CPU over the run per transaction, as
# `leaseq bench --postgres-pid` counts it), then a table.
#   usage: scripts/bench/hops.sh OUTDIR [BIN]
#   env:   RATES="100 1000", REPS=2, DUR=10, ANCHORS=../shared/anchors,
#          QUICK=1, KEEP=1 (scripts/bench/lib.sh)
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
[ -n "${2:-}" ] && BIN=$2
bench_init "${1:?usage: scripts/bench/hops.sh OUTDIR [BIN]}"
DUR=$(secs "${DUR:-10}")
: >"$RESULTS"
embedded_broker broker
warm "$A" 15
# The cluster's CPU seconds: the postmaster, its exited children (reaped
# backends) and its live children, as src/bench/cpu.rs counts them.
pgcpu() { python3 -c "
import os, sys
hz = os.sysconf('SC_CLK_TCK'); pm = sys.argv[1]
def f(p): return open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()
t = sum(int(x) for x in f(pm)[11:15])
for c in open(f'/proc/{pm}/task/{pm}/children').read().split():
    try: t += sum(int(x) for x in f(c)[11:13])
    except OSError: pass
print(t / hz)" "$PM"; }
# A pgbench run (as postgres) with the cluster's CPU per transaction over it.
pgrun() { # NAME SCRIPT ARGS...
  local name=$1 c0 c1
  shift
  c0=$(pgcpu)
  run_json "$name" "${AS_PG[@]}" "$@" || return 0
  c1=$(pgcpu)
  emit "$(python3 -c "
import json, sys
d = json.loads(sys.argv[1])
print(json.dumps({'pg_cpu_us_per_tx': round((float(sys.argv[3]) - float(sys.argv[2])) * 1e6 / d['transactions'], 1)} if d.get('transactions') else {}))" "$LINE" "$c0" "$c1")"
  sleep "$GAP"
}
for rep in $(seq "${REPS:-2}"); do for rate in ${RATES:-100 1000}; do
  pgrun "floor-$rate-$rep" "$ANCHORS/commit-floor.sh" "$U" "$rate" "$DUR"
  pgrun "stmt-$rate-$rep" "$BENCH_DIR/statement-floor.sh" "$U" "$rate" "$DUR"
  run_json "ping-$rate-$rep" "$BIN" bench --json --addr "$A" --scenario ping --rate "$rate" --duration "$DUR" --broker-pid "$A_PID" && emit
  sleep "$GAP"
  bench "latency-$rate-$rep" --addr "$A" --scenario latency --rate "$rate" --consumers 2 \
    --duration "$DUR" --broker-pid "$A_PID" --postgres-pid "$PM"
done; done
stop_all
python3 - "$OUT/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'run':<18}{'p50':>8}{'p99':>8}{'call p50':>10}{'call p99':>10}  CPU µs per job or call (broker/client/PG)")
for d in rows:
    c = d.get('cpu_us_per_job') or {}
    cpu = '/'.join(str(c.get(k)) for k in ('broker', 'client', 'postgres')) if c else f"PG {d.get('pg_cpu_us_per_tx')}"
    print(f"{d['run']:<18}{d.get('p50_ms') or 0:>8.3f}{d.get('p99_ms') or 0:>8.3f}"
          f"{d.get('enqueue_p50_ms') or 0:>10.3f}{d.get('enqueue_p99_ms') or 0:>10.3f}  {cpu}")
PY
