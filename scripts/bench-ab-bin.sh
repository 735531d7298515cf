#!/usr/bin/env bash
# A/B of two broker binaries (docs/BENCHMARKS.md, "What each change bought"),
# alternating, on one durable embedded cluster owned by an idle broker (run by
# BIN_A), warmed first; flat-out stream run and 64 single-Enqueue clients,
# one JSON line per run in OUTDIR/results.jsonl. Run as root.
#   usage: scripts/bench-ab-bin.sh OUTDIR ROUNDS BIN_A BIN_B
#   env:   RUNS="stream enq64" (the runs of each round; also unary (the
#          stream run with unary Acks), keepup (the stream run with
#          --max-backlog 500, under the streams' credit; keepupN: with
#          --max-backlog N; ukeepupN: the same with unary Acks), lat1000 and
#          lat100: latency at that rate, --consumers 2, 20 s, with its p50
#          and p99 in the line; one1000: the same with one credit per
#          stream)
set -uo pipefail
OUT=$1; ROUNDS=$2; A=$3; B=$4; BENCH=$A
mkdir -p $OUT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
pkill -f 'leaseq[^ ]* serve'; sleep 1
BIN=$A embedded_broker /tmp/ab-pg 127.0.0.1:50061 "$OUT/owner.log"
# warm-up, as bench-sitting.sh
$BENCH bench --addr http://127.0.0.1:50061 --duration 15 --json >/dev/null 2>&1
runuser -u postgres -- psql -qAtX "$U" -c checkpoint >/dev/null
for r in $(seq $ROUNDS); do for V in A B; do
  BIN=$A; [ $V = B ] && BIN=$B
  DATABASE_URL="$U" LEASEQ_LISTEN=127.0.0.1:50062 RUST_LOG=warn $BIN serve > $OUT/b.log 2>&1 &
  BP=$!; sleep 3
  for s in ${RUNS:-stream enq64}; do
    case $s in
      stream) args="--duration 15" ;;
      unary) args="--duration 15 --ack unary" ;;
      keepup*) n=${s#keepup}; args="--duration 15 --max-backlog ${n:-500}" ;;
      ukeepup*) n=${s#ukeepup}; args="--duration 15 --ack unary --max-backlog ${n:-500}" ;;
      enq64) args="--scenario enqueue --producers 64 --duration 10" ;;
      lat*) args="--scenario latency --rate ${s#lat} --consumers 2 --duration 20" ;;
      one*) args="--scenario latency --rate ${s#one} --consumers 2 --max-in-flight 1 --duration 20" ;;
      *) echo "unknown run $s"; exit 2 ;;
    esac
    # shellcheck disable=SC2086
    $BENCH bench --json --payload-bytes 100 --addr http://127.0.0.1:50062 $args --broker-pid $BP --postgres-pid $PM 2>/dev/null | tail -1 \
    | python3 -c "import json,sys; d=json.load(sys.stdin); c=d['cpu_us_per_job']; print(json.dumps({'run':'$V-$s-$r','jobs_per_s':round(d['jobs_per_s']),'p50_ms':d['p50_ms'],'p99_ms':d['p99_ms'],'broker':c['broker'],'client':c['client'],'postgres':c['postgres']}))" | tee -a $OUT/results.jsonl
    sleep 2
  done
  kill $BP; wait $BP 2>/dev/null; sleep 1
done; done
pkill -f 'leaseq[^ ]* serve'; sleep 2
