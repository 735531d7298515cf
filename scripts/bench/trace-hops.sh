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
#   usage: scripts/bench/trace-hops.sh OUTDIR [RATE] [ROUNDS]
#   env:   BIN, FLOOR, KEEP=1 (also keeps the perf data; scripts/bench/lib.sh)
#   out:   OUTDIR/{leaseq,floor}-N.{txt,hops}
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
RATE=${2:-1000}; ROUNDS=${3:-1}
bench_init "${1:?usage: scripts/bench/trace-hops.sh OUTDIR [RATE] [ROUNDS]}"
warmed_broker broker
floor_brokers
[ -n "$F_PIDS" ] && sleep 2 && run_json warm "$BIN" bench --json --addr "$F" --scenario latency --rate 1000 --duration 3
# trace NAME PID ADDR: the latency run against ADDR, the system calls of
# PID and of this run's cluster (the postmaster and its children) traced.
trace() {
  local name=$1 pid=$2 addr=$3 pp
  (sleep 5
   exec perf record -q -e 'raw_syscalls:sys_enter,raw_syscalls:sys_exit' \
     -p "$pid,$(pg_pids)" -o "$OUT/$name.data" -- sleep 3 >/dev/null 2>&1) &
  pp=$!; track "$pp"
  run_wait "$OUT/$name.txt" "$BIN" bench --addr "$addr" --scenario latency --rate "$RATE" --consumers 2 \
    --duration 10 --payload-bytes 100
  wait "$pp"; forget "$pp"
  echo "== $name: $(grep -a '^scenario' "$OUT/$name.txt")"
  perf script -i "$OUT/$name.data" -F comm,pid,tid,time,event,trace 2>/dev/null \
    | python3 "$BENCH_DIR/trace-hops.py" | tee "$OUT/$name.hops"
  [ -n "${KEEP:-}" ] || rm -f "$OUT/$name.data"
}
for r in $(seq "$ROUNDS"); do
  trace "leaseq-$r" "$A_PID" "$A"
  [ -n "$F_PIDS" ] && trace "floor-$r" "$F_PID" "$F"
done
stop_all
