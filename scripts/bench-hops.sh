#!/usr/bin/env bash
# Where an Enqueue call's time goes at light load, hop by hop, in one sitting:
# for each rate, alternately and REPS times, on one broker over a fresh
# durable embedded cluster (warmed: 15 s flat out, then a CHECKPOINT):
#   floor   ../shared/anchors/commit-floor.sh: a one-row insert + commit
#   stmt    scripts/statement-floor.sh: leaseq's enqueue statement (a job
#           inserted already leased) + commit, through pgbench
#   ping    `leaseq bench --scenario ping`: a gRPC health check, no database
#   latency `leaseq bench --scenario latency --consumers 2`: the Enqueue
#           call (enqueue_p50_ms) and enqueue → delivery (p50_ms)
# all open loop at the same rate, DUR seconds each. One JSON line per run in
# OUTDIR/results.jsonl (`run`: what, rate, repetition; for floor and stmt,
# `pg_cpu_us_per_tx`: the cluster's CPU over the run per transaction, as
# `leaseq bench --postgres-pid` counts it), then a table.
#   usage: scripts/bench-hops.sh OUTDIR [BIN]
#   env:   RATES="100 1000", REPS=2, DUR=10, ANCHORS=../shared/anchors
set -uo pipefail
OUT=${1:?OUTDIR}; BIN=${2:-$(cd "$(dirname "$0")/.." && pwd)/target/release/leaseq}
HERE=$(cd "$(dirname "$0")" && pwd)
ANCHORS=${ANCHORS:-$HERE/../../shared/anchors}
DUR=${DUR:-10}
mkdir -p "$OUT"; : > "$OUT/results.jsonl"
# shellcheck source=scripts/bench-lib.sh
. "$HERE/bench-lib.sh"
pkill -f 'leaseq[^ ]* serve'; sleep 3
embedded_broker /tmp/hops-pg 127.0.0.1:50061 "$OUT/broker.log"
A=http://127.0.0.1:50061
$BIN bench --addr $A --duration 15 --json >/dev/null 2>&1
runuser -u postgres -- psql -qX "$U" -c checkpoint
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
# A pgbench run's JSON line, with the cluster's CPU per transaction over it.
pgrun() { local c0 line; c0=$(pgcpu); line=$(runuser -u postgres -- "$@")
  echo "$line" | C0=$c0 C1=$(pgcpu) python3 -c "
import json, os, sys
d = json.loads(sys.stdin.read())
if d.get('transactions'):
    d['pg_cpu_us_per_tx'] = round((float(os.environ['C1']) - float(os.environ['C0'])) * 1e6 / d['transactions'], 1)
print(json.dumps(d))"; }
tag() { RUN="$1" python3 -c "import json,os,sys; d=json.loads(sys.stdin.readlines()[-1]); d['run']=os.environ['RUN']; print(json.dumps(d))" | tee -a "$OUT/results.jsonl"; sleep 2; }
for rep in $(seq "${REPS:-2}"); do for rate in ${RATES:-100 1000}; do
  pgrun "$ANCHORS/commit-floor.sh" "$U" "$rate" "$DUR" | tag "floor-$rate-$rep"
  pgrun "$HERE/statement-floor.sh" "$U" "$rate" "$DUR" | tag "stmt-$rate-$rep"
  $BIN bench --json --addr $A --scenario ping --rate "$rate" --duration "$DUR" --broker-pid "$A_PID" 2>/dev/null | tag "ping-$rate-$rep"
  $BIN bench --json --payload-bytes 100 --addr $A --scenario latency --rate "$rate" --consumers 2 \
    --duration "$DUR" --broker-pid "$A_PID" --postgres-pid "$PM" 2>/dev/null | tag "latency-$rate-$rep"
done; done
kill "$A_PID"; wait "$A_PID" 2>/dev/null
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
