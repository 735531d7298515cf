#!/usr/bin/env bash
# How long the threads of a light-load job wait for a CPU (docs/BENCHMARKS.md,
# "Inside the hops"). A broker on a fresh durable embedded cluster, warmed
# (10 s flat out), then `leaseq bench --scenario latency --rate RATE
# --consumers 2` for 10 s; over 8 s of it, /proc/PID/task/TID/schedstat of
# every thread of the broker, the cluster and the load generator: time on a
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
(sleep 3; python3 "$BENCH_DIR/runqueue.py" snap "$OUT/s0.json"
 sleep 8; python3 "$BENCH_DIR/runqueue.py" snap "$OUT/s1.json") &
SP=$!; track "$SP"
RAW=$OUT/bench.json run_json runqueue "$BIN" bench --addr "$A" --scenario latency --rate "$RATE" --consumers 2 \
  --duration 10 --payload-bytes 100 --json
wait "$SP"; forget "$SP"
stop_all
python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(f\"latency at {d['rate']}/s: p50 {d['p50_ms']} ms, p99 {d['p99_ms']} ms\")" "$LINE"
python3 "$BENCH_DIR/runqueue.py" diff "$OUT/s0.json" "$OUT/s1.json" $((RATE * 8))
