#!/usr/bin/env bash
# Keys inside a queue (issue 33; docs/BENCHMARKS.md, "Queues ordered by
# key"): one durable embedded cluster, warmed; then ROUNDS rounds of, in
# turn, a queue whose jobs carry KEYS keys (default 10,000) unordered and
# the same ordered by key (key_concurrency 1): flat-out stream throughput
# (acks on the stream) and latency at 1,000 jobs/s. Anchors in the same
# sitting: the raw-SQL baseline and the commit floor at 1,000/s, before
# and after. One JSON line per run in OUTDIR/results.jsonl. Run as root.
#   usage: scripts/bench/keys.sh OUTDIR [ROUNDS=2]
#   env:   BIN (default target/release/leaseq), KEYS (10000), MODES
#          ("unordered ordered"; also "nokeys": the queue ordered by key but
#          its jobs without keys, which isolates the ordered queues' locked
#          lease path from the key rule's probes), LAT=0 (no latency runs),
#          ANCHORS (../shared/anchors), QUICK=1, KEEP=1 (scripts/bench/lib.sh)
# Stops only what it started, by pid; ports are picked free.
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${2:-2}
KEYS=${KEYS:-10000}
bench_init "${1:?usage: scripts/bench/keys.sh OUTDIR [ROUNDS]}"
embedded_broker owner
warm "$A" 15
D15=$(secs 15); D20=$(secs 20)
anchors() { # suffix
  bench "baseline$1" --scenario baseline --database-url "$U" --batch 100 --duration "$D15" --postgres-pid "$PM"
  commit_floor "floor-1000$1" 1000
}
anchors ""
for r in $(seq "$ROUNDS"); do
  for mode in ${MODES:-unordered ordered}; do
    flag=""; keys=$KEYS
    case $mode in
      ordered) flag="--ordered-by-key" ;;
      nokeys) flag="--ordered-by-key"; keys=0 ;;
    esac
    # shellcheck disable=SC2086
    bench "stream-$mode" --addr "$A" --keys "$keys" $flag --duration "$D15" \
      --broker-pid "$A_PID" --postgres-pid "$PM"
    [ "${LAT:-1}" = 0 ] && continue
    # shellcheck disable=SC2086
    bench "lat1000-$mode" --addr "$A" --keys "$keys" $flag --scenario latency --rate 1000 \
      --consumers 2 --duration "$D20"
  done
done
anchors "-after"
log "done: $RESULTS"
