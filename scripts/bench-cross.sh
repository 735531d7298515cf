#!/usr/bin/env bash
# Latency with the producer on one replica and the consumer on another
# (docs/BENCHMARKS.md, "Hand-off across replicas"): broker A on a fresh
# durable embedded cluster, broker B on the same database, the warm-up of
# bench-sitting.sh, then RUNS runs of `leaseq bench --addr A --consume-addr B
# --scenario latency --rate RATE --consumers 2` (brokers' and PostgreSQL's
# CPU per job included) and one run on broker A alone. One JSON line per run
# in OUTDIR/cross.jsonl, one.jsonl (and tp.jsonl). Run as root; to compare
# two binaries, alternate them: each run of this script starts afresh.
#   usage: scripts/bench-cross.sh BIN OUTDIR [RUNS=2]
#   env:   RATE=1000; TP=1 adds flat-out runs across the replicas (stream
#          acks, unary Acks, 64 enqueuers); LATLOG=1 writes each cross run's
#          deliveries to OUTDIR/lat-N.csv (scripts/latency-tail.py reads it)
set -uo pipefail
BIN=${1:?binary}; OUT=${2:?outdir}; RUNS=${3:-2}
mkdir -p "$OUT"
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
pkill -f 'leaseq[^ ]* serve'; sleep 1
D=/tmp/cross-pg
embedded_broker $D 127.0.0.1:50061 "$OUT/A.log"
DATABASE_URL="$U" LEASEQ_LISTEN=127.0.0.1:50062 RUST_LOG=${RUST_LOG:-warn} "$BIN" serve > "$OUT/B.log" 2>&1 &
BP=$!
sleep 3
A=http://127.0.0.1:50061; B=http://127.0.0.1:50062
"$BIN" bench --addr $A --scenario latency --rate 500 --duration 3 --json >/dev/null 2>&1
"$BIN" bench --addr $A --duration 10 --json >/dev/null 2>&1
runuser -u postgres -- psql -qAtX "$U" -c checkpoint >/dev/null
show() { # label file keys...
  local label=$1 file=$2; shift 2
  tail -1 | tee -a "$OUT/$file" | python3 -c "import json,sys; d=json.load(sys.stdin); print('$label', {k: d.get(k) for k in sys.argv[1:]})" "$@"
}
LAT="p50_ms p99_ms enqueue_p50_ms delivered cpu_us_per_job"
for i in $(seq "$RUNS"); do
  # shellcheck disable=SC2046
  "$BIN" bench --json --payload-bytes 100 --addr $A --consume-addr $B --scenario latency \
    --rate "${RATE:-1000}" --consumers 2 --duration 10 --broker-pid $A_PID,$BP --postgres-pid $PM \
    $([ -n "${LATLOG:-}" ] && echo --latency-log "$OUT/lat-$i.csv") \
    2>>"$OUT/err" | show cross cross.jsonl $LAT
  sleep 1
done
"$BIN" bench --json --payload-bytes 100 --addr $A --scenario latency --rate "${RATE:-1000}" \
  --consumers 2 --duration 10 --broker-pid $A_PID --postgres-pid $PM 2>>"$OUT/err" | show one one.jsonl $LAT
if [ -n "${TP:-}" ]; then
  for m in "" "--ack unary" "--scenario enqueue --producers 64"; do
    # shellcheck disable=SC2086
    "$BIN" bench --json --payload-bytes 100 --addr $A --consume-addr $B --duration 10 $m \
      --broker-pid $A_PID,$BP --postgres-pid $PM 2>>"$OUT/err" | show "tp $m" tp.jsonl jobs_per_s cpu_us_per_job
  done
fi
kill $A_PID $BP; sleep 3; pkill -f "postgres -D $D/data"
