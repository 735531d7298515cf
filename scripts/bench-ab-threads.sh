#!/usr/bin/env bash
# A/B of the broker's tokio worker threads (TOKIO_WORKER_THREADS) at light load,
# alternating, on one durable embedded cluster owned by an idle broker.
#   usage: scripts/bench-ab-threads.sh OUTDIR [ROUNDS]
#   env:   VARIANTS="2 1" (thread counts), RATES="1000 100", DUR=10, GEN_THREADS=2
set -uo pipefail
OUT=${1:?}; ROUNDS=${2:-2}; BIN=${BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release/leaseq}
mkdir -p $OUT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
pkill -f 'leaseq serve'; sleep 1
embedded_broker /tmp/ab-pg 127.0.0.1:50061 "$OUT/owner.log"
$BIN bench --addr http://127.0.0.1:50061 --scenario latency --rate 500 --duration 3 --json >/dev/null 2>&1
for r in $(seq $ROUNDS); do for W in ${VARIANTS:-2 1}; do
  DATABASE_URL="$U" LEASEQ_LISTEN=127.0.0.1:50062 TOKIO_WORKER_THREADS=$W RUST_LOG=warn $BIN serve > $OUT/b.log 2>&1 &
  BP=$!; sleep 3
  for rate in ${RATES:-1000 100}; do
    TOKIO_WORKER_THREADS=${GEN_THREADS:-2} $BIN bench --json --payload-bytes 100 --addr http://127.0.0.1:50062 --scenario latency --rate $rate --consumers 2 --duration ${DUR:-10} --broker-pid $BP --postgres-pid $PM 2>/dev/null | tail -1 \
    | python3 -c "import json,sys; d=json.load(sys.stdin); d['run']='w$W-r$rate-$r'; print(json.dumps(d))" | tee -a $OUT/results.jsonl
  done
  kill $BP; wait $BP 2>/dev/null; sleep 1
done; done
pkill -f 'leaseq serve'; sleep 2
