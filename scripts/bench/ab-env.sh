#!/usr/bin/env bash
# A/B of one broker setting given by an environment variable, alternating
# brokers on one durable embedded cluster (warmed: 15 s flat out, then a
# CHECKPOINT), owned by an idle broker; the same load generator for all.
#   usage: scripts/bench/ab-env.sh OUTDIR ROUNDS VAR "VALUE_A VALUE_B ..."
#   env:   RATES="1000 100" (latency runs, --consumers 2), DUR=20,
#          THROUGHPUT=1 (also a flat-out stream run of TP_DUR=15 s per round),
#          ENQ64=1 (also 64 single-Enqueue clients for 10 s, run `enq64`),
#          UNARY=1 (also a flat-out run with unary Acks, run `unary`),
#          BIN, QUICK=1, KEEP=1 (scripts/bench/lib.sh)
#   e.g.   scripts/bench/ab-env.sh /tmp/ab 2 LEASEQ_ACK_LINGER "0s 1ms"
# Appends one JSON line per run to OUTDIR/results.jsonl, `run` naming the
# value, the rate (or `full`) and the round, `commits_per_job` the
# database's commits over the run per job.
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${2:?ROUNDS}; VAR=${3:?VAR}; VALUES=${4:?VALUES}
bench_init "${1:?usage: scripts/bench/ab-env.sh OUTDIR ROUNDS VAR VALUES}"
embedded_broker owner
warm "$A" 15
commits() { psql_at "$U" -c "select xact_commit from pg_stat_database where datname = current_database()"; }
# One run on the broker under test: its line with the database's commits
# per job over it (every transaction of the database: the broker's
# maintenance ones too; the count is read once the run's JSON line has
# arrived, i.e. after it).
run() { # NAME ARGS...
  local name=$1 c0 c1
  shift
  c0=$(commits)
  run_json "$name" "$BIN" bench --json --payload-bytes 100 --addr "$S" "$@" --broker-pid "$S_PID" --postgres-pid "$PM" || return 0
  c1=$(commits)
  emit "{\"commits_per_job\": $(python3 -c "import json,sys; print(round(($c1 - $c0) / max(json.loads(sys.argv[1])['jobs'], 1), 3))" "$LINE")}"
}
for r in $(seq "$ROUNDS"); do for v in $VALUES; do
  serve b "$VAR=$v"
  for rate in ${RATES-1000 100}; do
    run "$v-r$rate-$r" --scenario latency --rate "$rate" --consumers 2 --duration "$(secs "${DUR:-20}")"
  done
  [ -n "${THROUGHPUT:-}" ] && run "$v-full-$r" --duration "$(secs "${TP_DUR:-15}")"
  [ -n "${ENQ64:-}" ] && run "$v-enq64-$r" --scenario enqueue --producers 64 --duration "$(secs 10)"
  [ -n "${UNARY:-}" ] && run "$v-unary-$r" --duration "$(secs "${TP_DUR:-15}")" --ack unary
  stop "$S_PID"; sleep 1
done; done
