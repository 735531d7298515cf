#!/usr/bin/env bash
# Where each SDK worker's time goes (issue 36, item 1): one worker process
# with a no-op handler and credit CREDIT drains a pre-filled queue, in each
# SDK of the repository: the Python async Worker (an `async def` handler),
# the Python sync Worker (a plain function, run in its thread pool), the
# Node Worker and the Rust Worker (crates/client's examples/noop_worker.rs).
# One broker over a fresh durable embedded cluster, warmed (10 s flat out,
# then a CHECKPOINT). Each run: a new queue pre-filled with JOBS jobs of 100
# bytes (sdk-profile/fill.py: EnqueueBatch calls of 500), GAP s of rest, then
# the worker, timed from the first delivery (its first handler call) to the
# last handler completion, with its CPU over that window from
# /proc/self/stat (sdk-profile/: py_worker.py, node_worker.mjs) and the
# broker's CPU over the worker's whole run from /proc/PID/stat. The SDKs
# alternate within each of REPS rounds. One JSON line per run in
# OUTDIR/results.jsonl (`run`: SDK and round), then a table.
#
# Then, with PROFILE=1 (the default), one profiled run per SDK (their rates
# are not figures: a profiler slows the worker):
#   python-*  cProfile (OUTDIR/python-MODE.pstats, .pstats.top.txt),
#             py-spy (`record --gil --threads`: the thread that holds the
#             GIL; when PYSPY is set or `py-spy` is on PATH:
#             OUTDIR/python-MODE.pyspy.txt, .top.txt), and a counting
#             run (py_worker.py --count: stream writes, acks per write,
#             replies, tasks, futures, loop turns, callbacks per job)
#   node      `node --cpu-prof` (OUTDIR/node.cpuprofile, .top.txt) and a
#             counting run (node_worker.mjs --count: stream writes, acks per
#             write, messages read, promises, timers per job)
#   rust      the worker again at each credit of RUST_CREDITS ("64 1024")
# Counting runs' lines are in OUTDIR/counts.jsonl.
#
# RabbitMQ clients (pika, amqplib, lapin) are not run here:
# scripts/bench/sdk-rabbitmq.sh runs the same workers against them (issue
# 36's item 4), with producers and a handler that sleeps.
#
#   usage: scripts/bench/sdk-workers.sh OUTDIR [BIN]
#   needs: clients/setup.sh python node (the SDKs' venv and dist/; that
#          venv is the suites', with the test extras: opentelemetry-api is
#          installed, so the Python worker starts a non-recording span per
#          job, as a user with OpenTelemetry but no tracer provider would);
#          cargo build --release -p leaseq-client --example noop_worker
#   env:   JOBS=30000, CREDIT=256, REPS=2, SDKS="python-async python-sync
#          node rust", PROFILE=1, RUST_CREDITS, PYSPY (py-spy's path;
#          `pip install py-spy`), RUST_WORKER (default target/release/examples/
#          noop_worker), QUICK=1 (JOBS=2000, no warm-up), KEEP=1
#          (scripts/bench/lib.sh)
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
[ -n "${2:-}" ] && BIN=$2
bench_init "${1:?usage: scripts/bench/sdk-workers.sh OUTDIR [BIN]}"
if [ -n "${QUICK:-}" ]; then JOBS=${JOBS:-2000}; else JOBS=${JOBS:-30000}; fi
CREDIT=${CREDIT:-256}
SDKS=${SDKS:-python-async python-sync node rust}
PROF=$BENCH_DIR/sdk-profile
PY=$BENCH_REPO/clients/python/.venv/bin/python
RUST_WORKER=${RUST_WORKER:-$BENCH_REPO/target/release/examples/noop_worker}
PYSPY=${PYSPY:-$(command -v py-spy || true)}
[ -x "$PY" ] || { echo "no $PY: clients/setup.sh python" >&2; exit 2; }
[[ " $SDKS " != *" node "* ]] || [ -f "$BENCH_REPO/clients/node/dist/esm/index.mjs" ] ||
    { echo "no clients/node/dist: clients/setup.sh node" >&2; exit 2; }
[[ " $SDKS " != *" rust "* ]] || [ -x "$RUST_WORKER" ] ||
    { echo "no $RUST_WORKER: cargo build --release -p leaseq-client --example noop_worker" >&2; exit 2; }
: >"$RESULTS"
: >"$OUT/counts.jsonl"

embedded_broker broker
[ -n "${QUICK:-}" ] || warm "$A" 10

# utime + stime of PID in seconds.
cpu_of() { awk -v t="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); print ($12 + $13) / t }' "/proc/$1/stat"; }

# fill QUEUE: JOBS jobs of 100 bytes in QUEUE.
fill() {
    run_wait "$OUT/fill.out" "$PY" "$PROF/fill.py" "$A_ADDR" "$1" "$JOBS" 100 ||
        { log "fill $1 failed: $(tail -3 "$OUT/fill.out")"; return 1; }
}

# worker SDK QUEUE [EXTRA...]: the command that runs SDK's worker on QUEUE
# (in CMD). EXTRA: the worker script's own flags (--count).
worker_cmd() {
    local sdk=$1 q=$2
    shift 2
    case $sdk in
        python-async | python-sync) CMD=("$PY" "$PROF/py_worker.py" "${sdk#python-}" "$A_ADDR" "$q" "$JOBS" --credit "$CREDIT" "$@") ;;
        node) CMD=(node "${NODE_FLAGS[@]}" "$PROF/node_worker.mjs" "$A_ADDR" "$q" "$JOBS" --credit "$CREDIT" "$@") ;;
        rust) CMD=("$RUST_WORKER" "$A_ADDR" "$q" "$JOBS" "$CREDIT") ;;
    esac
}

# run NAME SDK [EXTRA...]: a new queue, filled, then the worker; its line
# (with the broker's CPU per job) in RESULTS, or in OUTDIR/counts.jsonl
# with --count.
NODE_FLAGS=()
run() {
    local name=$1 sdk=$2 q b0 b1 into=$RESULTS
    shift 2
    q=$(echo "$name" | tr -c 'a-zA-Z0-9\n' '-')
    fill "$q" || return 0
    sleep "$GAP"
    worker_cmd "$sdk" "$q" "$@"
    log "$name: ${CMD[*]}"
    b0=$(cpu_of "$A_PID")
    run_json "$name" "${CMD[@]}" || return 0
    b1=$(cpu_of "$A_PID")
    [[ " $* " == *" --count "* ]] && into=$OUT/counts.jsonl
    RESULTS=$into emit "{\"broker_cpu_us_per_job\": $(python3 -c "print(round(($b1 - $b0) * 1e6 / $JOBS, 1))"), \"jobs_filled\": $JOBS}"
    sleep "$GAP"
}

for rep in $(seq "${REPS:-2}"); do
    for sdk in $SDKS; do run "$sdk-$rep" "$sdk"; done
done

if [ "${PROFILE:-1}" = 1 ]; then
    for sdk in $SDKS; do
        case $sdk in
            python-*)
                run "$sdk-count" "$sdk" --count
                run "$sdk-cprofile" "$sdk" --cprofile "$OUT/$sdk.pstats"
                "$PY" "$PROF/summarize.py" "$OUT/$sdk.pstats" >"$OUT/$sdk.pstats.top.txt"
                if [ -n "$PYSPY" ]; then
                    q=$sdk-pyspy
                    fill "$q" && {
                        worker_cmd "$sdk" "$q"
                        log "$q: py-spy record ${CMD[*]}"
                        run_wait "$OUT/$q.log" "$PYSPY" record --gil --threads --rate 250 --format raw \
                            -o "$OUT/$sdk.pyspy.txt" -- "${CMD[@]}"
                        "$PY" "$PROF/summarize.py" "$OUT/$sdk.pyspy.txt" >"$OUT/$sdk.pyspy.top.txt"
                    }
                else
                    log "no py-spy (pip install py-spy, or PYSPY=...): its profile is skipped"
                fi
                ;;
            rust)
                # Whether the rate follows the credit (issue 36: no process
                # saturated).
                for c in ${RUST_CREDITS:-64 1024}; do CREDIT=$c run "rust-credit-$c" rust; done
                ;;
            node)
                run node-count node --count
                mkdir -p "$OUT/node-prof"
                NODE_FLAGS=(--cpu-prof --cpu-prof-dir "$OUT/node-prof" --cpu-prof-name node.cpuprofile)
                run node-cpuprof node
                NODE_FLAGS=()
                mv "$OUT/node-prof/node.cpuprofile" "$OUT/node.cpuprofile" && rmdir "$OUT/node-prof"
                "$PY" "$PROF/summarize.py" "$OUT/node.cpuprofile" >"$OUT/node.cpuprofile.top.txt"
                ;;
        esac
    done
fi

stop_all
python3 - "$RESULTS" "$OUT/counts.jsonl" <<'PY' | tee "$OUT/table.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'run':<22} {'jobs/s':>8} {'worker µs/job':>14} {'cores':>6} {'broker µs/job':>14}")
for r in rows:
    print(f"{r['run']:<22} {r.get('rate', 0):>8} {r.get('cpu_us_per_job', 0):>14} {r.get('cores', 0):>6} {r.get('broker_cpu_us_per_job', 0):>14}")
for l in open(sys.argv[2]):
    if l.strip():
        r = json.loads(l)
        print(r["run"], json.dumps(r.get("per_job", {})))
PY
