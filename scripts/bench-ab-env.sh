#!/usr/bin/env bash
# A/B of one broker setting given by an environment variable, alternating
# brokers on one durable embedded cluster (warmed: 15 s flat out, then a
# CHECKPOINT), owned by an idle broker; the same load generator for all.
#   usage: scripts/bench-ab-env.sh OUTDIR ROUNDS VAR "VALUE_A VALUE_B ..."
#   env:   RATES="1000 100" (latency runs, --consumers 2), DUR=20,
#          THROUGHPUT=1 (also a flat-out stream run of TP_DUR=15 s per round),
#          ENQ64=1 (also 64 single-Enqueue clients for 10 s, run `enq64`),
#          UNARY=1 (also a flat-out run with unary Acks, run `unary`)
#   e.g.   scripts/bench-ab-env.sh /tmp/ab 2 LEASEQ_ACK_LINGER "0s 1ms"
# Appends one JSON line per run to OUTDIR/results.jsonl, `run` naming the
# value, the rate (or `full`) and the round, `commits_per_job` the
# database's commits over the run per job.
set -uo pipefail
OUT=${1:?OUTDIR}; ROUNDS=${2:?ROUNDS}; VAR=${3:?VAR}; VALUES=${4:?VALUES}
BIN=${BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release/leaseq}
mkdir -p "$OUT"
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
pkill -f 'leaseq[^ ]* serve'; sleep 1
embedded_broker /tmp/ab-env-pg 127.0.0.1:50061 "$OUT/owner.log"
$BIN bench --addr http://127.0.0.1:50061 --duration 15 --json >/dev/null 2>&1
psql -qX "$U" -c checkpoint
commits() { psql -qXtA "$U" -c "select xact_commit from pg_stat_database where datname = current_database()"; }
# Names the run, and adds the database's commits per job over it (every
# transaction of the database: the broker's maintenance ones too).
# (The count is read once the run's JSON line has arrived, i.e. after it.)
tag() { U="$U" RUN="$1" C0="$C0" python3 -c "
import json, os, subprocess, sys
d = json.load(sys.stdin)
c1 = int(subprocess.check_output(['psql', '-qXtA', os.environ['U'], '-c',
    'select xact_commit from pg_stat_database where datname = current_database()']))
d['run'] = os.environ['RUN']
d['commits_per_job'] = round((c1 - int(os.environ['C0'])) / max(d['jobs'], 1), 3)
print(json.dumps(d))"; }
for r in $(seq "$ROUNDS"); do for v in $VALUES; do
  env "$VAR=$v" DATABASE_URL="$U" LEASEQ_LISTEN=127.0.0.1:50062 RUST_LOG=warn $BIN serve > "$OUT/b.log" 2>&1 &
  BP=$!; sleep 3
  for rate in ${RATES-1000 100}; do
    C0=$(commits)
    $BIN bench --json --payload-bytes 100 --addr http://127.0.0.1:50062 --scenario latency --rate "$rate" \
      --consumers 2 --duration "${DUR:-20}" --broker-pid $BP --postgres-pid "$PM" 2>/dev/null | tail -1 \
      | tag "$v-r$rate-$r" | tee -a "$OUT/results.jsonl"
  done
  if [ -n "${THROUGHPUT:-}" ]; then
    C0=$(commits)
    $BIN bench --json --payload-bytes 100 --addr http://127.0.0.1:50062 --duration "${TP_DUR:-15}" \
      --broker-pid $BP --postgres-pid "$PM" 2>/dev/null | tail -1 | tag "$v-full-$r" | tee -a "$OUT/results.jsonl"
  fi
  if [ -n "${ENQ64:-}" ]; then
    C0=$(commits)
    $BIN bench --json --payload-bytes 100 --addr http://127.0.0.1:50062 --scenario enqueue --producers 64 \
      --duration 10 --broker-pid $BP --postgres-pid "$PM" 2>/dev/null | tail -1 | tag "$v-enq64-$r" | tee -a "$OUT/results.jsonl"
  fi
  if [ -n "${UNARY:-}" ]; then
    C0=$(commits)
    $BIN bench --json --payload-bytes 100 --addr http://127.0.0.1:50062 --duration "${TP_DUR:-15}" --ack unary \
      --broker-pid $BP --postgres-pid "$PM" 2>/dev/null | tail -1 | tag "$v-unary-$r" | tee -a "$OUT/results.jsonl"
  fi
  kill $BP; wait $BP 2>/dev/null; sleep 1
done; done
kill "$A_PID"; wait "$A_PID" 2>/dev/null; sleep 2
