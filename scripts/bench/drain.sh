#!/usr/bin/env bash
# One stream draining a backlog (issue 36: what bounds a worker's rate):
# for each broker binary of BINS, in turn within each of REPS rounds, a
# fresh durable embedded cluster and broker, warmed (10 s flat out), then
# for each credit of CREDITS a queue pre-filled with JOBS jobs of 100 bytes
# (sdk-profile/fill.py) drained by the Rust SDK's Worker with a no-op
# handler (crates/client/examples/noop_worker.rs) at that credit. One log
# line per drain: the worker's JSON (rate from first delivery to last
# handler completion, its CPU per job) with the broker's and PostgreSQL's
# CPU over the drain (/proc/PID/stat of the broker, and of the postmaster
# and its children). Each round's broker also runs the raw-SQL baseline
# (`leaseq bench --scenario baseline`, 10 s) first: the sitting's anchor.
#
# With WITH_BENCH=1, each round first runs `leaseq bench --duration 10`
# (4 Consume streams of credit 256 and producers: the stream figure the
# Rust SDK's worker is compared with, issue 36) on the same broker.
#
# With ROUNDS_LOG=1 the brokers run with `leaseq_server::dispatch=debug`:
# their log has a line per lease round (`lease round finished`: jobs
# asked, jobs leased, microseconds from the statement's start to its
# result), and OUTDIR/rounds-NAME-REP.txt the rounds of the drains by size
# (count, median time, median time per job).
#
#   usage: scripts/bench/drain.sh OUTDIR
#   env:   BINS (default: target/release/leaseq), CREDITS="256 1024",
#          REPS=2, JOBS=60000, WITH_BENCH, ROUNDS_LOG, RUST_WORKER (a noop_worker
#          built elsewhere; otherwise built here, nice)
#   needs: clients/setup.sh python (fill.py runs in its venv)
set -euo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init "${1:?usage: scripts/bench/drain.sh OUTDIR}"
BINS=${BINS:-$BIN}
CREDITS=${CREDITS:-256 1024}
REPS=${REPS:-2}
JOBS=${JOBS:-60000}
PY=$BENCH_REPO/clients/python/.venv/bin/python
PROF=$BENCH_DIR/sdk-profile
[ -x "$PY" ] || { echo "no $PY: clients/setup.sh python" >&2; exit 2; }
if [ -z "${RUST_WORKER:-}" ]; then
    RUST_WORKER=$BENCH_REPO/target/release/examples/noop_worker
    (cd "$BENCH_REPO" && nice cargo build --release -q -p leaseq-client --example noop_worker)
fi

# cpu_of PID: its utime + stime in seconds.
cpu_of() { awk -v t="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); print ($12 + $13) / t }' "/proc/$1/stat" 2>/dev/null || echo 0; }
# PostgreSQL's CPU in seconds: the postmaster and its children.
pg_cpu() {
    local t=0 p
    for p in $(pg_pids | tr ',' ' '); do t=$(awk -v a="$t" -v b="$(cpu_of "$p")" 'BEGIN { print a + b }'); done
    echo "$t"
}

for rep in $(seq "$REPS"); do
    for bin in $BINS; do
        name=$(basename "$bin")
        if [ -n "${ROUNDS_LOG:-}" ]; then
            BIN=$bin RUST_LOG=warn,leaseq_server::dispatch=debug BROKER_LOG=$OUT/broker-$name-$rep.log \
                embedded_broker "b-$name-$rep"
        else
            BIN=$bin embedded_broker "b-$name-$rep"
        fi
        BIN=$bin warm "$A" 10
        # The sitting's anchor: raw SQL (one statement a batch of 100 to
        # enqueue, lease and delete) on this cluster, as every sitting has.
        run_json baseline "$bin" bench --json --scenario baseline --database-url "$U" \
            --batch 100 --duration "$(secs 10)" --postgres-pid "$PM" &&
            log "$name round $rep raw SQL baseline: $(python3 -c 'import json, sys; print(round(json.loads(sys.argv[1])["jobs_per_s"]))' "$LINE") jobs/s"
        if [ -n "${WITH_BENCH:-}" ]; then
            run_json bench "$bin" bench --json --addr "$A" --duration 10 &&
                log "$name round $rep bench: $(python3 -c 'import json, sys; print(round(json.loads(sys.argv[1])["jobs_per_s"]))' "$LINE") jobs/s"
        fi
        since=$(date -u +%H:%M:%S.%3N)
        for credit in $CREDITS; do
            q=drain-$rep-$credit
            "$PY" "$PROF/fill.py" "$A_ADDR" "$q" "$JOBS" 100 >/dev/null
            b0=$(cpu_of "$A_PID"); p0=$(pg_cpu)
            out=$(timeout -k 10 300 "$RUST_WORKER" "$A_ADDR" "$q" "$JOBS" "$credit") || out='{"failed": true}'
            b1=$(cpu_of "$A_PID"); p1=$(pg_cpu)
            log "$name round $rep credit $credit: $out broker_cpu_s=$(awk -v a="$b0" -v b="$b1" 'BEGIN { printf "%.2f", b - a }') pg_cpu_s=$(awk -v a="$p0" -v b="$p1" 'BEGIN { printf "%.2f", b - a }')"
        done
        if [ -n "${ROUNDS_LOG:-}" ]; then
            python3 - "$OUT/broker-$name-$rep.log" "$since" >"$OUT/rounds-$name-$rep.txt" <<'EOF'
import re, statistics, sys
rows = []
for line in open(sys.argv[1], errors="replace"):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    if "lease round finished" not in line:
        continue
    kv = dict(x.split("=", 1) for x in line.split() if "=" in x)
    if line[11:23] >= sys.argv[2] and int(kv["leased"]) > 0:
        rows.append((int(kv["leased"]), int(kv["us"])))
print(f"{len(rows)} rounds, {sum(r[0] for r in rows)} jobs")
for lo, hi in [(1, 16), (17, 64), (65, 128), (129, 256), (257, 2000)]:
    s = [r for r in rows if lo <= r[0] <= hi]
    if s:
        print(f"leased {lo}-{hi}: {len(s)} rounds, median {statistics.median(r[1] for r in s):.0f} us, "
              f"{statistics.median(r[1] / r[0] for r in s):.1f} us a job")
EOF
        fi
        stop "$A_PID"
        pg_stop "$BENCH_ROOT/b-$name-$rep/data"
    done
done
