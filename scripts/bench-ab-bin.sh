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
#          ANCHORS=DIR (../shared/anchors) adds the same sitting's anchors:
#          the commit floor at 1,000/s and 100/s on the same cluster, before
#          and after the rounds, and RabbitMQ's quorum queue (throughput 4x4
#          and latency at 1,000/s and 100/s; rabbitmq/setup.sh once) at the
#          end, after the brokers stopped.
#          SEPARATE=1 gives each binary a cluster of its own (warmed
#          alike), for binaries whose migrations differ: a binary refuses a
#          database migrated by a newer one.
# Stops only what it started, by pid (a broker of yours on the host is left
# alone; the ports it needs must be free: bench-lib.sh's port_free).
set -uo pipefail
OUT=$1; ROUNDS=$2; A=$3; B=$4; BENCH=$A
mkdir -p $OUT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
port_free 127.0.0.1:50062
if [ -n "${SEPARATE:-}" ]; then
  BIN=$B embedded_broker /tmp/ab-pg-b 127.0.0.1:50060 "$OUT/owner-b.log"
  U_B=$U; PM_B=$PM; A_PID_B=$A_PID
  $B bench --addr http://127.0.0.1:50060 --duration 15 --json >/dev/null 2>&1
  runuser -u postgres -- psql -qAtX "$U_B" -c checkpoint >/dev/null
fi
BIN=$A embedded_broker /tmp/ab-pg 127.0.0.1:50061 "$OUT/owner.log"
U_A=$U; PM_A=$PM
floor() { # rate suffix
  [ -n "${ANCHORS:-}" ] || return 0
  runuser -u postgres -- "$ANCHORS/commit-floor.sh" "$U" "$1" 10 \
    | python3 -c "import json,sys; d=json.load(sys.stdin); d['run']='floor-$1$2'; print(json.dumps(d))" | tee -a $OUT/results.jsonl
  sleep 2
}
# warm-up, as bench-sitting.sh
$BENCH bench --addr http://127.0.0.1:50061 --duration 15 --json >/dev/null 2>&1
runuser -u postgres -- psql -qAtX "$U" -c checkpoint >/dev/null
floor 1000 ""; floor 100 ""
for r in $(seq $ROUNDS); do for V in A B; do
  BIN=$A; [ $V = B ] && BIN=$B
  U=$U_A; PM=$PM_A
  if [ $V = B ] && [ -n "${SEPARATE:-}" ]; then U=$U_B; PM=$PM_B; fi
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
U=$U_A; floor 1000 -b; floor 100 -b
# The owner brokers stop their embedded clusters as they exit.
kill $A_PID; wait $A_PID 2>/dev/null
if [ -n "${SEPARATE:-}" ]; then kill $A_PID_B; wait $A_PID_B 2>/dev/null; fi
sleep 2
if [ -n "${ANCHORS:-}" ]; then
  RT=${CARGO_TARGET_DIR:-/tmp/leaseq-anchor-rabbitmq}; RB=$RT/release/rabbit-bench
  (cd "$ANCHORS/rabbitmq" && CARGO_TARGET_DIR=$RT cargo build --release -q) || exit 1
  rabbitmq-server -detached; sleep 5; rabbitmqctl -q await_startup --timeout 60
  one() { local name=$1; shift; sleep 3
    line=$("$RB" --duration 15 --payload-bytes 100 --prefetch 100 "$@" 2>/dev/null | tail -1)
    [ -n "$line" ] && echo "$line" | python3 -c "import json,sys; d=json.load(sys.stdin); d['run']='$name'; print(json.dumps(d))" | tee -a $OUT/results.jsonl; }
  one quorum-4x4 --queue-type quorum throughput --producers 4 --consumers 4 --confirm-window 100
  one quorum-lat-1000 --queue-type quorum latency --rate 1000
  one quorum-lat-100 --queue-type quorum latency --rate 100
  rabbitmqctl -q stop
fi
