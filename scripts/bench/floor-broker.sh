#!/usr/bin/env bash
# leaseq against the floor broker (examples/floor_broker.rs: one durable
# insert per job, a push, acks deleted in batches; nothing else) and the
# commit floor, in one sitting, on one warmed durable embedded cluster:
# ROUNDS rounds of open-loop latency runs at RATE, alternated: leaseq, the
# floor broker, leaseq across two replicas, two floor brokers across (the job
# in a NOTIFY), the commit floor, and the gRPC call alone (`--scenario ping`).
# docs/BENCHMARKS.md, "A floor broker". Run as root; release builds of the
# binary and the example (`cargo build --release --example floor_broker`).
#   usage: scripts/bench/floor-broker.sh OUTDIR [ROUNDS=3]
#   env:   RATE=1000, DUR=10, FLOOR_ACKS=none (acks confirmed with no
#          database work), RABBIT=1 (then RabbitMQ quorum's latency at RATE,
#          ROUNDS times, with PostgreSQL stopped; rabbitmq/setup.sh once),
#          BIN, FLOOR, ANCHORS, QUICK=1, KEEP=1 (scripts/bench/lib.sh)
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${2:-3}; RATE=${RATE:-1000}
bench_init "${1:?usage: scripts/bench/floor-broker.sh OUTDIR [ROUNDS]}"
[ -x "$FLOOR" ] || { echo "no floor broker at $FLOOR: cargo build --release --example floor_broker" >&2; exit 2; }
DUR=$(secs "${DUR:-10}")
[ -n "${RABBIT:-}" ] && rabbit_build
warmed_broker broker
serve brokerB
floor_brokers
psql_at "$U" -c checkpoint >/dev/null
run() { # NAME ARGS...
    local name=$1; shift
    log "$name"
    run_json "$name" "$BIN" bench --json --payload-bytes 100 --rate "$RATE" --duration "$DUR" --postgres-pid "$PM" "$@" && emit >/dev/null
}
L="--scenario latency --consumers 2"
# shellcheck disable=SC2086 # L: a list of flags
{
RESULTS=/dev/null
run floor-warm $L --addr "$F"
run floor-warm $L --addr "$FX_IN" --consume-addr "$FX_OUT"
RESULTS=$OUT/results.jsonl
: >"$RESULTS"
for r in $(seq "$ROUNDS"); do
    run "leaseq-$r" $L --addr "$A" --broker-pid "$A_PID"
    run "floor-broker-$r" $L --addr "$F" --broker-pid "$F_PID"
    run "leaseq-cross-$r" $L --addr "$A" --consume-addr "$S"
    run "floor-cross-$r" $L --addr "$FX_IN" --consume-addr "$FX_OUT"
    commit_floor commit-floor "$RATE" "${DUR}" >/dev/null
    run "ping-$r" --scenario ping --addr "$A" --broker-pid "$A_PID"
done
}
# Every broker stops, and the cluster with broker A, before RabbitMQ starts.
stop_all
if [ -n "${RABBIT:-}" ]; then
    sleep 2
    rabbit_start
    for r in $(seq "$ROUNDS"); do
        rabbit "quorum-$r" --queue-type quorum latency --rate "$RATE" >/dev/null
    done
    rabbit_stop
fi
python3 - "$OUT/results.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    cpu = d.get("cpu_us_per_job") or {}
    print(f'{d["run"]:18} p50 {d["p50_ms"]:.2f}  p99 {d["p99_ms"]:.2f}  p99.9 {d.get("p999_ms") or 0:.2f}  '
          f'call p50/p99 {d.get("enqueue_p50_ms") or 0:.2f}/{d.get("enqueue_p99_ms") or 0:.2f}  '
          f'cpu µs/job b/c/pg {cpu.get("broker")}/{cpu.get("client")}/{cpu.get("postgres")}')
PY
