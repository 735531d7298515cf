#!/usr/bin/env bash
# Where one job's Enqueue call spends its time, hop by hop, from the system
# calls of the broker and the PostgreSQL backends (docs/BENCHMARKS.md,
# "Inside the hops"). A broker on a fresh durable embedded cluster, warmed
# (10 s flat out), then `leaseq bench --scenario latency --rate RATE
# --consumers 2` for 10 s, with `perf record` of every system call entry and
# exit of the broker and the cluster's processes for 3 s of it. Tracing
# slows each system call: the run's own p50 comes out higher than untraced.
# With FLOOR set (or the floor broker built), the same trace of the floor
# broker (examples/floor_broker.rs) on the same cluster follows each of
# leaseq's, ROUNDS times, so the two calls can be split side by side.
# Run as root; needs linux-perf.
#   usage: scripts/trace-hops.sh OUTDIR [RATE] [ROUNDS]
#   out:   OUTDIR/{leaseq,floor}-N.{txt,hops}
set -uo pipefail
OUT=${1:?OUTDIR}; RATE=${2:-1000}; ROUNDS=${3:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd); BIN=${BIN:-$ROOT/target/release/leaseq}
FLOOR=${FLOOR:-$ROOT/target/release/examples/floor_broker}
mkdir -p "$OUT"
# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"
pkill -f 'leaseq[^ ]* serve'; pkill -f floor_broker; sleep 1
warmed_broker /tmp/leaseq-trace-pg 127.0.0.1:50061 "$OUT/broker.log"
F_PIDS=
[ -x "$FLOOR" ] && floor_brokers "$FLOOR" "$OUT" && sleep 2 \
  && "$BIN" bench --addr http://127.0.0.1:50063 --scenario latency --rate 1000 --duration 3 >/dev/null 2>&1
# trace NAME PID ADDR: the latency run against ADDR, PID's system calls traced.
trace() {
  local name=$1 pid=$2 addr=$3 pp
  (sleep 5
   perf record -q -e 'raw_syscalls:sys_enter,raw_syscalls:sys_exit' \
     -p "$pid,$(pgrep -d, -u postgres -f "postgres")" -o "$OUT/$name.data" -- sleep 3 >/dev/null 2>&1) &
  pp=$!
  "$BIN" bench --addr "$addr" --scenario latency --rate "$RATE" --consumers 2 \
    --duration 10 --payload-bytes 100 > "$OUT/$name.txt" 2>&1
  wait $pp
  echo "== $name: $(grep -a '^scenario' "$OUT/$name.txt")"
  perf script -i "$OUT/$name.data" -F comm,pid,tid,time,event,trace 2>/dev/null \
    | python3 "$ROOT/scripts/trace-hops.py" | tee "$OUT/$name.hops"
  [ -n "${KEEP:-}" ] || rm -f "$OUT/$name.data"
}
for r in $(seq "$ROUNDS"); do
  trace "leaseq-$r" "$A_PID" http://127.0.0.1:50061
  [ -n "$F_PIDS" ] && trace "floor-$r" "$F_PID" http://127.0.0.1:50063
done
kill "$A_PID" $F_PIDS; wait "$A_PID" 2>/dev/null
