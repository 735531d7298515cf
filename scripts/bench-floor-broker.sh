#!/usr/bin/env bash
# leaseq against the floor broker (examples/floor_broker.rs: one durable
# insert per job, a push, acks deleted in batches; nothing else) and the
# commit floor, in one sitting, on one warmed durable embedded cluster:
# ROUNDS rounds of open-loop latency runs at RATE, alternated: leaseq, the
# floor broker, leaseq across two replicas, two floor brokers across (the job
# in a NOTIFY), the commit floor, and the gRPC call alone (`--scenario ping`).
# docs/BENCHMARKS.md, "A floor broker". Run as root; release builds of the
# binary and the example (`cargo build --release --example floor_broker`).
#   usage: scripts/bench-floor-broker.sh OUTDIR [ROUNDS=3]
#   env:   RATE=1000, DUR=10, FLOOR_ACKS=none (acks confirmed with no
#          database work), RABBIT=1 (then RabbitMQ quorum's latency at RATE,
#          ROUNDS times, with PostgreSQL stopped; rabbitmq/setup.sh once)
set -uo pipefail
OUT=${1:?outdir}; ROUNDS=${2:-3}; RATE=${RATE:-1000}; DUR=${DUR:-10}
ROOT=$(cd "$(dirname "$0")/.." && pwd); BIN=${BIN:-$ROOT/target/release/leaseq}
FLOOR=${FLOOR:-$ROOT/target/release/examples/floor_broker}
mkdir -p "$OUT"
# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"
pkill -f 'leaseq[^ ]* serve'; pkill -f floor_broker; sleep 1
warmed_broker /tmp/leaseq-bench-floor-pg 127.0.0.1:50061 "$OUT/broker.log"
DATABASE_URL=$U LEASEQ_LISTEN=127.0.0.1:50062 RUST_LOG=warn "$BIN" serve >"$OUT/brokerB.log" 2>&1 &
B_PID=$!
floor_brokers "$FLOOR" "$OUT"
sleep 3
runuser -u postgres -- psql -qAtX "$U" -c checkpoint >/dev/null
run() { # NAME ARGS...
    local name=$1; shift
    echo "[$(date +%T) load $(cut -d' ' -f1 /proc/loadavg)] $name" >&2
    "$BIN" bench --json --payload-bytes 100 --rate "$RATE" --duration "$DUR" --postgres-pid "$PM" "$@" 2>/dev/null |
        tail -1 | python3 -c 'import json,sys; d=json.load(sys.stdin); d["run"]=sys.argv[1]; print(json.dumps(d))' "$name" >>"$OUT/results.jsonl"
}
floor() {
    echo "[$(date +%T) load $(cut -d' ' -f1 /proc/loadavg)] commit floor" >&2
    runuser -u postgres -- "$ROOT/../shared/anchors/commit-floor.sh" "$U" "$RATE" "$DUR" |
        python3 -c 'import json,sys; d=json.load(sys.stdin); d["run"]="commit-floor"; print(json.dumps(d))' >>"$OUT/results.jsonl"
}
L="--scenario latency --consumers 2"
run floor-warm $L --addr http://127.0.0.1:50063
run floor-warm $L --addr http://127.0.0.1:50064 --consume-addr http://127.0.0.1:50065
: >"$OUT/results.jsonl"
for r in $(seq "$ROUNDS"); do
    run "leaseq-$r" $L --addr http://127.0.0.1:50061 --broker-pid "$A_PID"
    run "floor-broker-$r" $L --addr http://127.0.0.1:50063 --broker-pid $F_PID
    run "leaseq-cross-$r" $L --addr http://127.0.0.1:50061 --consume-addr http://127.0.0.1:50062
    run "floor-cross-$r" $L --addr http://127.0.0.1:50064 --consume-addr http://127.0.0.1:50065
    floor
    run "ping-$r" --scenario ping --addr http://127.0.0.1:50061 --broker-pid "$A_PID"
done
# shellcheck disable=SC2086 # a list of pids
kill $F_PIDS "$A_PID" "$B_PID"; wait 2>/dev/null
if [ -n "${RABBIT:-}" ]; then
    sleep 2; pkill -f "postgres -D /tmp/leaseq-bench-floor-pg/data"; sleep 2
    rabbitmq-server -detached; sleep 5; rabbitmqctl -q await_startup --timeout 60
    RB=${CARGO_TARGET_DIR:-/tmp/leaseq-anchor-rabbitmq}/release/rabbit-bench
    for r in $(seq "$ROUNDS"); do
        sleep 3; echo "[$(date +%T) load $(cut -d' ' -f1 /proc/loadavg)] rabbit quorum" >&2
        "$RB" --duration 15 --payload-bytes 100 --prefetch 100 --queue-type quorum latency --rate "$RATE" 2>/dev/null |
            tail -1 | python3 -c 'import json,sys; d=json.load(sys.stdin); d["run"]="quorum-"+sys.argv[1]; print(json.dumps(d))' "$r" >>"$OUT/results.jsonl"
    done
    rabbitmqctl -q stop
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
