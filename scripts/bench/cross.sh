#!/usr/bin/env bash
# Latency with the producer on one replica and the consumer on another
# (docs/BENCHMARKS.md, "Hand-off across replicas"): broker A on a fresh
# durable embedded cluster, broker B on the same database, the warm-up of
# sitting.sh, then RUNS runs of `leaseq bench --addr A --consume-addr B
# --scenario latency --rate RATE --consumers 2` (brokers' and PostgreSQL's
# CPU per job included) and one run on broker A alone. One JSON line per run
# in OUTDIR/cross.jsonl, one.jsonl (and tp.jsonl). Run as root; to compare
# two binaries, alternate them: each run of this script starts afresh.
#   usage: scripts/bench/cross.sh BIN OUTDIR [RUNS=2]
#   env:   RATE=1000; TP=1 adds flat-out runs across the replicas (stream
#          acks, unary Acks, 64 enqueuers); LATLOG=1 writes each cross run's
#          deliveries to OUTDIR/lat-N.csv (scripts/bench/latency-tail.py
#          reads it); QUICK=1, KEEP=1 (scripts/bench/lib.sh)
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
BIN=${1:?binary}; RUNS=${3:-2}
bench_init "${2:?outdir}"
embedded_broker A
serve B
B=$S; BP=$S_PID
run_json warm "$BIN" bench --addr "$A" --scenario latency --rate 500 --duration "$(secs 3)" --json
warm "$A" 10
show() { # label file keys...
  local label=$1 file=$2; shift 2
  [ -n "$LINE" ] || return 0
  echo "$LINE" >>"$OUT/$file"
  python3 -c "import json,sys; d=json.loads(sys.argv[1]); print('$label', {k: d.get(k) for k in sys.argv[2:]})" "$LINE" "$@"
}
LAT="p50_ms p99_ms enqueue_p50_ms delivered cpu_us_per_job"
D=$(secs 10)
for i in $(seq "$RUNS"); do
  # shellcheck disable=SC2046,SC2086
  run_json "cross-$i" "$BIN" bench --json --payload-bytes 100 --addr "$A" --consume-addr "$B" --scenario latency \
    --rate "${RATE:-1000}" --consumers 2 --duration "$D" --broker-pid "$A_PID,$BP" --postgres-pid "$PM" \
    $([ -n "${LATLOG:-}" ] && echo --latency-log "$OUT/lat-$i.csv") && show cross cross.jsonl $LAT
  sleep 1
done
# shellcheck disable=SC2086
run_json one "$BIN" bench --json --payload-bytes 100 --addr "$A" --scenario latency --rate "${RATE:-1000}" \
  --consumers 2 --duration "$D" --broker-pid "$A_PID" --postgres-pid "$PM" && show one one.jsonl $LAT
if [ -n "${TP:-}" ]; then
  for m in "" "--ack unary" "--scenario enqueue --producers 64"; do
    # shellcheck disable=SC2086
    run_json "tp $m" "$BIN" bench --json --payload-bytes 100 --addr "$A" --consume-addr "$B" --duration "$D" $m \
      --broker-pid "$A_PID,$BP" --postgres-pid "$PM" && show "tp $m" tp.jsonl jobs_per_s cpu_us_per_job
  done
fi
