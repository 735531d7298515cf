#!/usr/bin/env bash
# Where one job's Enqueue call spends its time, hop by hop, from the system
# calls of the broker and the PostgreSQL backends (docs/BENCHMARKS.md,
# "Inside the hops"). A broker on a fresh durable embedded cluster, warmed
# (10 s flat out), then `leaseq bench --scenario latency --rate RATE
# --consumers 2` for 10 s, with `perf record` of every system call entry and
# exit of the broker and the cluster's processes for 3 s of it. Tracing
# slows each system call: the run's own p50 comes out higher than untraced.
# Run as root; needs linux-perf.
#   usage: scripts/trace-hops.sh OUTDIR [RATE]
set -uo pipefail
OUT=${1:?OUTDIR}; RATE=${2:-1000}
ROOT=$(cd "$(dirname "$0")/.." && pwd); BIN=${BIN:-$ROOT/target/release/leaseq}
mkdir -p "$OUT"
# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"
pkill -f 'leaseq[^ ]* serve'; sleep 1
warmed_broker /tmp/leaseq-trace-pg 127.0.0.1:50061 "$OUT/broker.log"
(sleep 5
 perf record -q -e 'raw_syscalls:sys_enter,raw_syscalls:sys_exit' \
   -p "$A_PID,$(pgrep -d, -u postgres -f "postgres")" -o "$OUT/perf.data" -- sleep 3 >/dev/null 2>&1) &
PP=$!
$BIN bench --addr http://127.0.0.1:50061 --scenario latency --rate "$RATE" --consumers 2 \
  --duration 10 --payload-bytes 100 > "$OUT/bench.txt" 2>&1
wait $PP; kill "$A_PID"; wait "$A_PID" 2>/dev/null
tail -2 "$OUT/bench.txt"
perf script -i "$OUT/perf.data" -F comm,pid,tid,time,event,trace 2>/dev/null | python3 "$ROOT/scripts/trace-hops.py"
