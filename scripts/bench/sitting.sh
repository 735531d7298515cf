#!/usr/bin/env bash
# One benchmark sitting (docs/BENCHMARKS.md): leaseq (release build) on a fresh
# durable embedded cluster, two replicas, and the anchors of the same sitting
# (../shared/anchors): the commit floor, the raw-SQL baseline, the floor
# broker, and RabbitMQ's quorum (and classic) queue, one after another on
# this machine; one JSON line per run in OUTDIR/results.jsonl, the log and
# the ratios in OUTDIR/log. Run as root (PostgreSQL runs as postgres).
# Stops only what it started (scripts/bench/lib.sh).
#   usage: scripts/bench/sitting.sh OUTDIR [BIN]
#   env:   ANCHORS=../shared/anchors (commit-floor.sh, rabbitmq/; setup.sh once)
#          FLOOR=target/release/examples/floor_broker (the floor broker, an
#          anchor: `cargo build --release --example floor_broker`; its runs
#          are skipped, with a line in the log, when it is not built)
#          NO_RABBIT=1 skips RabbitMQ; SOAK=N adds the 10-minute soak with
#          --batch-concurrency N; QUICK=1 runs everything for 2 s (a smoke
#          test of the script: its figures mean nothing); KEEP=1
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
[ -n "${2:-}" ] && BIN=$2
bench_init "${1:?usage: scripts/bench/sitting.sh OUTDIR [BIN]}"
# RabbitMQ's load tool, built before anything is measured (a new machine has
# none; run.sh builds it the same way).
[ -z "${NO_RABBIT:-}" ] && rabbit_build
embedded_broker brokerA
serve brokerB
B=$S; B_PID=$S_PID
floor_brokers
CPU="--broker-pid $A_PID --postgres-pid $PM"
log "url $U brokers $A_PID $B_PID pm $PM"
psql_at "$U" -c "show max_wal_size; show checkpoint_timeout; show wal_compression; show synchronous_commit; show fsync" | tr '\n' ' ' | tee -a "$OUT/log"; echo
# The floor broker's runs: alone and across, at 1,000/s and 100/s.
fb() { # suffix
  [ -n "$F_PIDS" ] || return 0
  bench "fb-lat-1000$1" --addr "$F" --scenario latency --rate 1000 --consumers 2 --duration "$(secs 10)" --broker-pid "$F_PID" --postgres-pid "$PM"
  bench "fb-lat-100$1" --addr "$F" --scenario latency --rate 100 --consumers 2 --duration "$(secs 10)" --broker-pid "$F_PID" --postgres-pid "$PM"
  bench "fb-lat-1000-cross$1" --addr "$FX_IN" --consume-addr "$FX_OUT" --scenario latency --rate 1000 --consumers 2 --duration "$(secs 10)"
}
# warm up: 15 s flat out, then a checkpoint (lib.sh's warm)
run_json warm "$BIN" bench --addr "$A" --scenario latency --rate 500 --duration "$(secs 3)" --json
[ -n "$F_PIDS" ] && run_json warm "$BIN" bench --addr "$F" --scenario latency --rate 1000 --duration "$(secs 3)" --json
warm "$A" 15
D10=$(secs 10); D15=$(secs 15)
commit_floor floor-1000 1000; commit_floor floor-100 100
# shellcheck disable=SC2086 # CPU: a list of flags
{
bench lat-1000 --addr "$A" --scenario latency --rate 1000 --consumers 2 --duration "$D10" $CPU
bench lat-100 --addr "$A" --scenario latency --rate 100 --consumers 2 --duration "$D10" $CPU
bench lat-1000-cross --addr "$A" --consume-addr "$B" --scenario latency --rate 1000 --consumers 2 --duration "$D10"
fb ""
commit_floor floor-1000 1000
bench tp-stream --addr "$A" --duration "$D15" $CPU
bench tp-unary --addr "$A" --duration "$D15" --ack unary $CPU
# Unary Acks with at most 500 jobs outstanding. RabbitMQ's quorum run keeps
# about as many messages in flight: its producers stop at 100 unconfirmed
# each. With the default backlog the unary consumers fall behind, and every
# job is leased from the table ("Unary Acks and the backlog").
bench tp-unary-keepup --addr "$A" --duration "$D15" --ack unary --max-backlog 500 $CPU
bench tp-batch --addr "$A" --duration "$D15" --ack batch $CPU
bench enqueue-64 --addr "$A" --scenario enqueue --producers 64 --duration "$D10" $CPU
# The gRPC call alone (a health check answered from memory) at about the
# rate of the unary runs: its CPU per call, broker and load generator, is
# what any unary call costs this host (docs/BENCHMARKS.md).
bench ping-10000 --addr "$A" --scenario ping --rate 10000 --duration "$D10" $CPU
bench baseline --scenario baseline --database-url "$U" --batch 100 --duration "$D15" --postgres-pid "$PM"
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
bench tp-stream-keepup-1 --addr "$A" --duration "$D10" --max-backlog 500 $CPU
bench baseline-backlog-1 --scenario baseline --database-url "$U" --batch 100 --duration "$D10" --raw-backlog 9000 --postgres-pid "$PM"
for k in 2 3; do
  bench tp-stream-$k --addr "$A" --duration "$D10" $CPU
  bench tp-stream-keepup-$k --addr "$A" --duration "$D10" --max-backlog 500 $CPU
  bench baseline-$k --scenario baseline --database-url "$U" --batch 100 --duration "$D10" --postgres-pid "$PM"
  bench baseline-backlog-$k --scenario baseline --database-url "$U" --batch 100 --duration "$D10" --raw-backlog 9000 --postgres-pid "$PM"
done
bench lat-100-b --addr "$A" --scenario latency --rate 100 --consumers 2 --duration "$D10" $CPU
bench lat-1000-cross-b --addr "$A" --consume-addr "$B" --scenario latency --rate 1000 --consumers 2 --duration "$D10"
bench lat-1000-b --addr "$A" --scenario latency --rate 1000 --consumers 2 --duration "$D10" $CPU
fb -b
}
# The brokers stop; broker A stops its embedded cluster as it exits, so that
# RabbitMQ runs on a quiet host.
# shellcheck disable=SC2086 # a list of pids
[ -n "$F_PIDS" ] && stop $F_PIDS
stop "$B_PID" "$A_PID"
sleep "$GAP"
if [ -z "${NO_RABBIT:-}" ]; then
  rabbit_start
  rabbit quorum-4x4      --queue-type quorum  throughput --producers 4 --consumers 4 --confirm-window 100
  rabbit classic-4x4     --queue-type classic throughput --producers 4 --consumers 4 --confirm-window 100
  rabbit quorum-lat-1000  --queue-type quorum  latency --rate 1000
  rabbit classic-lat-1000 --queue-type classic latency --rate 1000
  rabbit quorum-lat-100   --queue-type quorum  latency --rate 100
  rabbit_stop
fi
if [ -n "${SOAK:-}" ]; then
  # The same cluster, started again by a broker with --batch-concurrency SOAK.
  BROKER_LOG=$OUT/brokerA-soak.log embedded_broker brokerA LEASEQ_BATCH_CONCURRENCY="$SOAK"
  log "soak (batch concurrency $SOAK)"
  RAW=$OUT/soak.txt run_json soak "$BIN" bench --addr "$A" --duration "$(secs 600)" --report-every 60 --database-url "$U" \
    --payload-bytes 100 --json --broker-pid "$A_PID" --postgres-pid "$PM" && emit
  psql_at "$U" -c "select checkpoints_timed, checkpoints_req, buffers_checkpoint from pg_stat_bgwriter" | tee -a "$OUT/log"
  psql_at "$U" -c "select pg_size_pretty(pg_total_relation_size('leaseq.jobs'))" | tee -a "$OUT/log"
  stop "$A_PID"
fi
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
log "done"
