#!/usr/bin/env bash
# How long the threads of a light-load job wait for a CPU (docs/BENCHMARKS.md,
# "Inside the hops"). A broker on a fresh durable embedded cluster, warmed
# (10 s flat out), then `leaseq bench --scenario latency --rate RATE
# --consumers 2` for 10 s; over 8 s of it, /proc/PID/task/TID/schedstat of
# every thread of this run's broker, cluster and load generator: time on a
# CPU, time runnable but waiting for one, and time slices, per job.
# Run as root.
#   usage: scripts/bench/runqueue.sh OUTDIR [RATE]
#   env:   BIN, KEEP=1 (scripts/bench/lib.sh)
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
RATE=${2:-1000}
bench_init "${1:?usage: scripts/bench/runqueue.sh OUTDIR [RATE]}"
warmed_broker broker
spawn "$OUT/bench.json" "$BIN" bench --addr "$A" --scenario latency --rate "$RATE" --consumers 2 \
  --duration 10 --payload-bytes 100 --json
LG=$SPAWNED
# Over 8 s of the run: this broker, this cluster and this load generator.
sleep 3; python3 "$BENCH_DIR/runqueue.py" snap "$OUT/s0.json" "$A_PID" "$PM" "$LG"
sleep 8; python3 "$BENCH_DIR/runqueue.py" snap "$OUT/s1.json" "$A_PID" "$PM" "$LG"
wait "$LG"; forget "$LG"
stop_all
tail -1 "$OUT/bench.json" | python3 -c "import json,sys; d=json.load(sys.stdin); print(f\"latency at {d['rate']}/s: p50 {d['p50_ms']} ms, p99 {d['p99_ms']} ms\")"
python3 "$BENCH_DIR/runqueue.py" diff "$OUT/s0.json" "$OUT/s1.json" $((RATE * 8))
