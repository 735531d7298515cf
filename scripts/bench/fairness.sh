#!/usr/bin/env bash
# Fair shares across keys (issue 33; docs/BENCHMARKS.md, "Fair shares
# across keys"): one durable embedded cluster, warmed; then ROUNDS rounds
# of `leaseq bench --scenario fairness` (tenant A's BACKLOG jobs, default
# 100,000, then tenant B's 10 once A's flow: how many of A's are delivered
# before B's last), on a queue fair by key and, as the control, the same
# queue without fairness (its run is cut at 20 s). The raw-SQL baseline
# before and after, as the sitting's anchor. One JSON line per run in
# OUTDIR/results.jsonl. Run as root.
#   usage: scripts/bench/fairness.sh OUTDIR [ROUNDS=2]
#   env:   BIN (default target/release/leaseq), BACKLOG (100000),
#          CONSUMERS (4), CREDIT (64), CONTROL=0 (no control runs),
#          QUICK=1, KEEP=1 (scripts/bench/lib.sh)
# Stops only what it started, by pid; ports are picked free.
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${2:-2}
BACKLOG=${BACKLOG:-100000}
bench_init "${1:?usage: scripts/bench/fairness.sh OUTDIR [ROUNDS]}"
embedded_broker owner
warm "$A" 15
anchor() { # suffix
  bench "baseline$1" --scenario baseline --database-url "$U" --batch 100 --duration "$(secs 15)" --postgres-pid "$PM"
}
anchor ""
for r in $(seq "$ROUNDS"); do
  for mode in fair control; do
    flag=""
    [ "$mode" = fair ] && flag="--fair-by-key"
    [ "$mode" = control ] && [ "${CONTROL:-1}" = 0 ] && continue
    # shellcheck disable=SC2086
    bench "fairness-$mode" --addr "$A" --scenario fairness $flag --backlog "$BACKLOG" \
      --consumers "${CONSUMERS:-4}" --max-in-flight "${CREDIT:-64}" --duration 20
  done
done
anchor "-after"
log "done: $RESULTS"
