#!/usr/bin/env bash
# One benchmark sitting (docs/BENCHMARKS.md): leaseq (release build) on a fresh
# durable embedded cluster, two replicas, the commit floor, the raw-SQL
# baseline and RabbitMQ, one after another on this machine, one JSON line per
# run in OUTDIR/results.jsonl. Run as root (PostgreSQL runs as postgres).
#   usage: scripts/bench-sitting.sh OUTDIR [BIN]
#   env:   ANCHORS=../shared/anchors (commit-floor.sh, rabbitmq/; setup.sh once)
#          FLOOR=target/release/examples/floor_broker (the floor broker, an
#          anchor: `cargo build --release --example floor_broker`; its runs
#          are skipped, with a line in the log, when it is not built)
#          NO_RABBIT=1 skips RabbitMQ; SOAK=N adds the 10-minute soak with
#          --batch-concurrency N.
set -uo pipefail
OUT=${1:?outdir}; BIN=${2:-$(cd "$(dirname "$0")/.." && pwd)/target/release/leaseq}
ANCHORS=${ANCHORS:-$(cd "$(dirname "$0")/.." && pwd)/../shared/anchors}
mkdir -p "$OUT"; log() { echo "[$(date +%T) load $(cut -d' ' -f1 /proc/loadavg)] $*" | tee -a "$OUT/log"; }
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
D=/tmp/sit-pg
RT=${CARGO_TARGET_DIR:-/tmp/leaseq-anchor-rabbitmq}; RB=$RT/release/rabbit-bench
# RabbitMQ's load tool, built before anything is measured (a new machine has
# none; run.sh builds it the same way).
if [ -z "${NO_RABBIT:-}" ]; then
  (cd "$ANCHORS/rabbitmq" && CARGO_TARGET_DIR=$RT cargo build --release -q) \
    || { echo "cannot build $RB (set NO_RABBIT=1 to skip RabbitMQ)"; exit 1; }
fi
pkill -f 'leaseq[^ ]* serve' ; sleep 1
embedded_broker $D 127.0.0.1:50061 "$OUT/brokerA.log"
port_free 127.0.0.1:50062
DATABASE_URL="$U" LEASEQ_LISTEN=127.0.0.1:50062 RUST_LOG=warn $BIN serve > "$OUT/brokerB.log" 2>&1 &
B_PID=$!
C_PID=
# The floor broker, an anchor (bench-lib.sh), when it is built.
FLOOR=${FLOOR:-$(cd "$(dirname "$0")/.." && pwd)/target/release/examples/floor_broker}
F_PIDS=
[ -x "$FLOOR" ] && floor_brokers "$FLOOR" "$OUT"
sleep 3
A=http://127.0.0.1:50061; B=http://127.0.0.1:50062
CPU="--broker-pid $A_PID --postgres-pid $PM"
PSQL() { runuser -u postgres -- psql -qAtX "$U" -c "$1"; }
log "url $U brokers $A_PID $B_PID pm $PM"
PSQL "show max_wal_size; show checkpoint_timeout; show wal_compression; show synchronous_commit; show fsync" | tr '\n' ' ' | tee -a "$OUT/log"; echo
b() { # name args...
  local name=$1; shift; log "bench $name: $*"
  $BIN bench --json --payload-bytes 100 "$@" 2>>"$OUT/bench.err" | tail -1 | python3 -c "import json,sys; d=json.load(sys.stdin); d['run']='$name'; print(json.dumps(d))" | tee -a "$OUT/results.jsonl"
  sleep 2
}
# The floor broker's runs: alone and across, at 1,000/s and 100/s.
fb() { # suffix
  if [ -z "$F_PIDS" ]; then log "no floor broker ($FLOOR): its runs skipped"; return; fi
  local F=http://127.0.0.1:50063
  b "fb-lat-1000$1" --addr $F --scenario latency --rate 1000 --consumers 2 --duration 10 --broker-pid "$F_PID" --postgres-pid $PM
  b "fb-lat-100$1" --addr $F --scenario latency --rate 100 --consumers 2 --duration 10 --broker-pid "$F_PID" --postgres-pid $PM
  b "fb-lat-1000-cross$1" --addr http://127.0.0.1:50064 --consume-addr http://127.0.0.1:50065 --scenario latency --rate 1000 --consumers 2 --duration 10
}
floor() { log "floor $1"; runuser -u postgres -- $ANCHORS/commit-floor.sh "$U" "$1" 10 | python3 -c "import json,sys; d=json.load(sys.stdin); d['run']='floor-$1'; print(json.dumps(d))" | tee -a "$OUT/results.jsonl"; sleep 2; }
# warm up: 15 s flat out, then a checkpoint, so that PostgreSQL has WAL
# segments to recycle, as a cluster in service does (a fresh cluster creates
# each new 16 MB segment while commits wait: a 35-46 ms stall every ~23 s at
# 1,000 jobs/s; docs/BENCHMARKS.md, "The tail at 1,000 jobs/s")
$BIN bench --addr $A --scenario latency --rate 500 --duration 3 --json >/dev/null 2>&1
$BIN bench --addr $A --duration 15 --json >/dev/null 2>&1
[ -n "$F_PIDS" ] && $BIN bench --addr http://127.0.0.1:50063 --scenario latency --rate 1000 --duration 3 --json >/dev/null 2>&1
PSQL checkpoint >/dev/null
floor 1000; floor 100
b lat-1000 --addr $A --scenario latency --rate 1000 --consumers 2 --duration 10 $CPU
b lat-100 --addr $A --scenario latency --rate 100 --consumers 2 --duration 10 $CPU
b lat-1000-cross --addr $A --consume-addr $B --scenario latency --rate 1000 --consumers 2 --duration 10
fb ""
floor 1000
b tp-stream --addr $A --duration 15 $CPU
b tp-unary --addr $A --duration 15 --ack unary $CPU
# Unary Acks with at most 500 jobs outstanding. RabbitMQ's quorum run keeps
# about as many messages in flight: its producers stop at 100 unconfirmed
# each. With the default backlog the unary consumers fall behind, and every
# job is leased from the table ("Unary Acks and the backlog").
b tp-unary-keepup --addr $A --duration 15 --ack unary --max-backlog 500 $CPU
b tp-batch --addr $A --duration 15 --ack batch $CPU
b enqueue-64 --addr $A --scenario enqueue --producers 64 --duration 10 $CPU
# The gRPC call alone (a health check answered from memory) at about the
# rate of the unary runs: its CPU per call, broker and load generator, is
# what any unary call costs this host (docs/BENCHMARKS.md).
b ping-10000 --addr $A --scenario ping --rate 10000 --duration 10 $CPU
b baseline --scenario baseline --database-url "$U" --batch 100 --duration 15 --postgres-pid $PM
# Flat out, the cost of each unit of work on this host swings by up to a
# half between runs seconds apart (docs/BENCHMARKS.md, "The slow flat-out
# mode is the host"): two more stream and raw-SQL pairs, alternated, so
# that the ratio of the two is read from three pairs, not one. Beside each,
# the stream run with consumers that keep up: at most 500 jobs outstanding,
# under the streams' 1,024 credits, as the raw loop never holds more than
# its 8 workers' 800 rows ("A backlog the streams' credit covers"). And
# beside the raw loop, the raw loop leasing from a backlog of 9,000 rows,
# about what waits in the table in the default stream run ("A raw loop
# with a backlog").
b tp-stream-keepup-1 --addr $A --duration 10 --max-backlog 500 $CPU
b baseline-backlog-1 --scenario baseline --database-url "$U" --batch 100 --duration 10 --raw-backlog 9000 --postgres-pid $PM
for k in 2 3; do
  b tp-stream-$k --addr $A --duration 10 $CPU
  b tp-stream-keepup-$k --addr $A --duration 10 --max-backlog 500 $CPU
  b baseline-$k --scenario baseline --database-url "$U" --batch 100 --duration 10 --postgres-pid $PM
  b baseline-backlog-$k --scenario baseline --database-url "$U" --batch 100 --duration 10 --raw-backlog 9000 --postgres-pid $PM
done
b lat-100-b --addr $A --scenario latency --rate 100 --consumers 2 --duration 10 $CPU
b lat-1000-cross-b --addr $A --consume-addr $B --scenario latency --rate 1000 --consumers 2 --duration 10
b lat-1000-b --addr $A --scenario latency --rate 1000 --consumers 2 --duration 10 $CPU
fb -b
# shellcheck disable=SC2086 # a list of pids
[ -n "$F_PIDS" ] && kill $F_PIDS
if [ -z "${NO_RABBIT:-}" ]; then
  kill $A_PID $B_PID $C_PID; sleep 3; pkill -f "postgres -D $D/data"; sleep 2
  log "rabbitmq start"; rabbitmq-server -detached; sleep 5; rabbitmqctl -q await_startup --timeout 60
  RPID=$(ps -C beam.smp -o pid=,rss= --sort=-rss | head -1 | awk '{print $1}'); log "beam pid $RPID"
  cput() { awk '{print $14+$15}' /proc/$RPID/stat; }
  one() { local name=$1; shift; sleep 3; log "rabbit $name"; local c0 line c1
    c0=$(cput); line=$("$RB" --duration 15 --payload-bytes 100 --prefetch 100 "$@" 2>/dev/null | tail -1); c1=$(cput)
    [ -n "$line" ] || { log "rabbit $name: no result"; return; }
    echo "$line" | python3 -c "import json,sys; d=json.load(sys.stdin); d['run']='$name'; d['beam_cpu_s']=($c1-$c0)/100; print(json.dumps(d))" | tee -a "$OUT/results.jsonl"; }
  one quorum-4x4      --queue-type quorum  throughput --producers 4 --consumers 4 --confirm-window 100
  one classic-4x4     --queue-type classic throughput --producers 4 --consumers 4 --confirm-window 100
  one quorum-lat-1000  --queue-type quorum  latency --rate 1000
  one classic-lat-1000 --queue-type classic latency --rate 1000
  one quorum-lat-100   --queue-type quorum  latency --rate 100
  rabbitmqctl -q stop; log "rabbitmq stopped"
else
  kill $A_PID $B_PID $C_PID; sleep 3; pkill -f "postgres -D $D/data"; sleep 2
fi
if [ -n "${SOAK:-}" ]; then
  LEASEQ_DATA_DIR=$D LEASEQ_LISTEN=127.0.0.1:50061 LEASEQ_BATCH_CONCURRENCY=$SOAK RUST_LOG=warn $BIN serve > "$OUT/brokerA-soak.log" 2>&1 &
  A_PID=$!; sleep 6; PM=$(head -1 $D/data/postmaster.pid)
  log "soak (batch concurrency $SOAK)"
  $BIN bench --addr $A --duration 600 --report-every 60 --database-url "$U" --payload-bytes 100 --json --broker-pid $A_PID --postgres-pid $PM > "$OUT/soak.txt" 2>&1
  tail -1 "$OUT/soak.txt" | python3 -c "import json,sys; d=json.load(sys.stdin); d['run']='soak'; print(json.dumps(d))" | tee -a "$OUT/results.jsonl"
  PSQL "select checkpoints_timed, checkpoints_req, buffers_checkpoint from pg_stat_bgwriter" | tee -a "$OUT/log"
  PSQL "select pg_size_pretty(pg_total_relation_size('leaseq.jobs'))" | tee -a "$OUT/log"
  kill $A_PID
fi
sleep 2; pkill -f "postgres -D $D/data"
# The stream-vs-raw and stream-vs-quorum ratios, on the medians of the
# alternated runs (docs/BENCHMARKS.md, "The slow flat-out mode is the host").
python3 - "$OUT/results.jsonl" <<'PY' | tee -a "$OUT/log"
import json, re, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
def median(pattern):
    v = [r["jobs_per_s"] for r in runs if re.fullmatch(pattern, r["run"])]
    return statistics.median(v) if v else None
raw, quorum = median(r"baseline(-\d)?"), median(r"quorum-4x4")
raw_backlog = median(r"baseline-backlog-\d")
for name, pattern in [("deep backlog", r"tp-stream(-\d)?"), ("keep-up", r"tp-stream-keepup-\d")]:
    m = median(pattern)
    if m is None or raw is None:
        continue
    q = f", {m / quorum:.2f} x quorum" if quorum else ""
    print(f"stream acks, {name}: median {m:,.0f} jobs/s = {m / raw:.2f} x raw SQL (median {raw:,.0f}){q}")
    if name == "deep backlog" and raw_backlog:
        print(f"stream acks, deep backlog: {m / raw_backlog:.2f} x raw SQL with a backlog of 9,000 (median {raw_backlog:,.0f})")
for name, pattern in [("default backlog", r"tp-unary"), ("keep-up", r"tp-unary-keepup")]:
    m = median(pattern)
    if m is not None and quorum:
        print(f"unary acks, {name}: {m:,.0f} jobs/s = {m / quorum:.2f} x quorum ({quorum:,.0f})")
PY
log done
