#!/usr/bin/env bash
# How long the threads of a light-load job wait for a CPU (docs/BENCHMARKS.md,
# "Inside the hops"). A broker on a fresh durable embedded cluster, warmed
# (10 s flat out), then `leaseq bench --scenario latency --rate RATE
# --consumers 2` for 10 s; over 8 s of it, /proc/PID/task/TID/schedstat of
# every thread of the broker, the cluster and the load generator: time on a
# CPU, time runnable but waiting for one, and time slices, per job.
# Run as root.
#   usage: scripts/runqueue.sh OUTDIR [RATE]
set -uo pipefail
OUT=${1:?OUTDIR}; RATE=${2:-1000}
ROOT=$(cd "$(dirname "$0")/.." && pwd); BIN=${BIN:-$ROOT/target/release/leaseq}
mkdir -p "$OUT"
# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"
pkill -f 'leaseq[^ ]* serve'; sleep 1
warmed_broker /tmp/leaseq-runqueue-pg 127.0.0.1:50061 "$OUT/broker.log"
(sleep 3; python3 "$ROOT/scripts/runqueue.py" snap "$OUT/s0.json"
 sleep 8; python3 "$ROOT/scripts/runqueue.py" snap "$OUT/s1.json") &
SP=$!
$BIN bench --addr http://127.0.0.1:50061 --scenario latency --rate "$RATE" --consumers 2 \
  --duration 10 --payload-bytes 100 --json > "$OUT/bench.json" 2>/dev/null
wait $SP; kill "$A_PID"; wait "$A_PID" 2>/dev/null
tail -1 "$OUT/bench.json" | python3 -c "import json,sys; d=json.load(sys.stdin); print(f\"latency at {d['rate']}/s: p50 {d['p50_ms']} ms, p99 {d['p99_ms']} ms\")"
python3 "$ROOT/scripts/runqueue.py" diff "$OUT/s0.json" "$OUT/s1.json" $((RATE * 8))
