#!/usr/bin/env bash
# A/B of two broker binaries (docs/BENCHMARKS.md, "What each change bought"),
# alternating, on one durable embedded cluster owned by an idle broker (run by
# BIN_A), warmed first; flat-out stream run and 64 single-Enqueue clients,
# one JSON line per run in OUTDIR/results.jsonl. Run as root.
#   usage: scripts/bench/ab-bin.sh OUTDIR ROUNDS BIN_A BIN_B
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
#          QUICK=1 (2 s runs: a smoke test), KEEP=1 (scripts/bench/lib.sh)
# Stops only what it started, by pid; ports are picked free.
set -uo pipefail
WITH_ANCHORS=${ANCHORS:-}
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${2:?ROUNDS}; BIN_A=${3:?BIN_A}; BIN_B=${4:?BIN_B}
BIN=$BIN_A
bench_init "${1:?usage: scripts/bench/ab-bin.sh OUTDIR ROUNDS BIN_A BIN_B}"
BIN_A=$(realpath "$BIN_A"); BIN_B=$(realpath "$BIN_B")
[ -n "$WITH_ANCHORS" ] && rabbit_build
if [ -n "${SEPARATE:-}" ]; then
  BIN=$BIN_B embedded_broker owner-b
  U_B=$U; PM_B=$PM
  BIN=$BIN_B warm "$A" 15
fi
BIN=$BIN_A embedded_broker owner
U_A=$U; PM_A=$PM
floor() { # suffix
  [ -n "$WITH_ANCHORS" ] || return 0
  commit_floor "floor-1000$1" 1000; commit_floor "floor-100$1" 100
}
# warm-up, as sitting.sh
warm "$A" 15
floor ""
for r in $(seq "$ROUNDS"); do for V in A B; do
  BIN=$BIN_A; [ "$V" = B ] && BIN=$BIN_B
  U=$U_A; PM=$PM_A
  if [ "$V" = B ] && [ -n "${SEPARATE:-}" ]; then U=$U_B; PM=$PM_B; fi
  serve "b-$V"
  for s in ${RUNS:-stream enq64}; do
    case $s in
      stream) args="--duration $(secs 15)" ;;
      unary) args="--duration $(secs 15) --ack unary" ;;
      keepup*) n=${s#keepup}; args="--duration $(secs 15) --max-backlog ${n:-500}" ;;
      ukeepup*) n=${s#ukeepup}; args="--duration $(secs 15) --ack unary --max-backlog ${n:-500}" ;;
      enq64) args="--scenario enqueue --producers 64 --duration $(secs 10)" ;;
      lat*) args="--scenario latency --rate ${s#lat} --consumers 2 --duration $(secs 20)" ;;
      one*) args="--scenario latency --rate ${s#one} --consumers 2 --max-in-flight 1 --duration $(secs 20)" ;;
      *) echo "unknown run $s"; exit 2 ;;
    esac
    # The same load generator (BIN_A's) for both.
    # shellcheck disable=SC2086
    if run_json "$V-$s-$r" "$BIN_A" bench --json --payload-bytes 100 --addr "$S" $args --broker-pid "$S_PID" --postgres-pid "$PM"; then
      LINE=$(python3 -c "import json,sys; d=json.load(sys.stdin); c=d['cpu_us_per_job']; print(json.dumps({'run':d['run'],'jobs_per_s':round(d['jobs_per_s']),'p50_ms':d['p50_ms'],'p99_ms':d['p99_ms'],'broker':c['broker'],'client':c['client'],'postgres':c['postgres']}))" <<<"$LINE")
      emit
    fi
    sleep "$GAP"
  done
  stop "$S_PID"; sleep 1
done; done
U=$U_A; PM=$PM_A; floor -b
# Every broker stops (the owners stop their embedded clusters as they
# exit) before RabbitMQ starts.
stop_all
sleep "$GAP"
if [ -n "$WITH_ANCHORS" ]; then
  rabbit_start
  rabbit quorum-4x4 --queue-type quorum throughput --producers 4 --consumers 4 --confirm-window 100
  rabbit quorum-lat-1000 --queue-type quorum latency --rate 1000
  rabbit quorum-lat-100 --queue-type quorum latency --rate 100
  rabbit_stop
fi
