#!/usr/bin/env bash
# Each SDK against its language's RabbitMQ client, in one sitting (issue
# 36, item 4): the same broker, the same RabbitMQ node, the runs alternated
# within each of REPS rounds. Three parts per round:
#
# 1. Workers. A queue pre-filled with JOBS jobs of 100 bytes, then one
#    worker process with a no-op handler and credit (prefetch) CREDIT, timed
#    from the first delivery (its first handler call) to the last handler
#    completion, with the worker's CPU over that window from /proc/self/stat
#    and the server's CPU over the worker's whole run from /proc/PID/stat
#    (the broker's, or RabbitMQ's beam). leaseq: the Python async Worker
#    and the Python sync Worker (sdk-profile/py_worker.py), the Node Worker
#    (sdk-profile/node_worker.mjs), the Rust Worker
#    (crates/client/examples/noop_worker.rs); pre-filled with
#    sdk-profile/fill.py (EnqueueBatch calls of 500). RabbitMQ: a durable
#    quorum queue of persistent messages (pre-filled with
#    `sdk-profile/lapin/ fill`: publisher confirms, 256 unconfirmed at
#    most); pika's BlockingConnection with one basic_ack per message
#    (sdk-profile/rabbit_pika.py), amqplib with one ack per message
#    (sdk-profile/rabbit_amqplib.mjs), lapin with one `ack().await` per
#    message (sdk-profile/lapin/).
# 2. Producers. One process, sequential single enqueues (each awaited
#    before the next; no batching) until PRODUCE_N or PRODUCE_SECS, after
#    one outside the window: the Python sync Client and AsyncClient
#    (sdk-profile/py_producer.py), the Node Client
#    (sdk-profile/node_producer.mjs), the Rust Client
#    (sdk-profile/leaseq-rust/ producer); against the same language's
#    client publishing persistent messages to a quorum queue with publisher
#    confirms, one at a time (each confirm awaited: the peer of one
#    acknowledged Enqueue). The leaseq queue is purged after each run, the
#    RabbitMQ queue deleted.
# 3. A real handler. JOBS pre-filled jobs, a handler that sleeps SLEEP_MS
#    (asyncio.sleep; time.sleep in the sync Worker's thread pool;
#    setTimeout; tokio::time::sleep in sdk-profile/leaseq-rust/ worker),
#    concurrency SLEEP_CONCURRENCY and credit (prefetch) SLEEP_CREDIT
#    (`--concurrency` / `--credit`; Rust `Worker::prefetch`), timed as in
#    part 1; the fraction of the ideal,
#    SLEEP_CONCURRENCY / SLEEP_MS (64,000 jobs/s at 64 and 1 ms). leaseq's
#    SDKs only: the issue's target is a fraction of the ideal.
#
# One broker (BIN) over a fresh durable embedded cluster, warmed (10 s flat
# out, then a CHECKPOINT); RabbitMQ started by the script (lib.sh's
# rabbit_start: `rabbitmq-server -detached` with the loopback configuration
# of ANCHORS/rabbitmq/setup.sh; the script refuses to start when a node
# already runs, and stops the node it started at the end with `rabbitmqctl
# stop`, as lib.sh does for every script). Every program runs under
# `timeout LIMIT` (a run that hangs is ended, by its pid, and skipped).
#
# Before anything is measured (each step a no-op when done before):
#   - cargo build --release -p leaseq-client --example noop_worker (nice)
#   - sdk-profile/lapin/ and sdk-profile/leaseq-rust/ built (nice) into
#     target/bench-cache/rust (standalone projects, not workspace members;
#     leaseq-rust gets the repository's Cargo.lock copied in first)
#   A build that fails takes its runs off (the Rust SDK's: rust; lapin's:
#   lapin), with a line in the log; the table lists the runs without a
#   figure.
#   - pika (PIKA_VERSION) from PyPI into a venv, and amqplib
#     (AMQPLIB_VERSION) from npm, in RABBIT_CLIENTS
#     (target/bench-cache/rabbit-clients)
#
# Output: one JSON line per run in OUTDIR/results.jsonl (`run`: what and
# round; `part`: worker, producer or sleep; `lang`; `side`: leaseq or
# rabbitmq; `server_cpu_us_per_job`; sleep runs `ideal` and `of_ideal`),
# then OUTDIR/table.md: markdown tables with each SDK over its language's
# client (the ratio's range is over the rounds, each SDK run over the
# client's run of the same round), for docs/BENCHMARKS.md.
#
#   usage: scripts/bench/sdk-rabbitmq.sh OUTDIR [BIN]
#   needs: root (RabbitMQ), rabbitmq-server (ANCHORS/rabbitmq/setup.sh once;
#          stop the node it leaves running first: rabbitmqctl stop),
#          clients/setup.sh python node, cargo, python3-venv, npm
#   env:   JOBS=30000, CREDIT=256, REPS=2, PRODUCE_N=20000,
#          PRODUCE_SECS=10, SLEEP_MS=1, SLEEP_CONCURRENCY=64, SLEEP_CREDIT=256,
#          LIMIT=600
#          (seconds, each program), WORKERS="python-async python-sync pika
#          node amqplib rust lapin", PRODUCERS="python-sync python-async
#          pika node amqplib rust lapin", SLEEPERS="python-async
#          python-sync node rust" (an empty list skips its part),
#          RUST_WORKER (a noop_worker built elsewhere), LEASEQ_RUST (a
#          leaseq-rust-bench built elsewhere: no build of either then),
#          RABBIT_CLIENTS, PIKA_VERSION=1.4.4, AMQPLIB_VERSION=2.3.1,
#          QUICK=1 (JOBS=2000, PRODUCE_N=500, PRODUCE_SECS=1, REPS=1, no
#          warm-up: a smoke test, its figures mean nothing), KEEP=1
#          (scripts/bench/lib.sh)
#   takes: QUICK=1 about 1.5 minutes, a round about 5 minutes (REPS=2:
#          about 11), plus the builds and installs the first time
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
[ -n "${2:-}" ] && BIN=$2
bench_init "${1:?usage: scripts/bench/sdk-rabbitmq.sh OUTDIR [BIN]}"
if [ -n "${QUICK:-}" ]; then
    JOBS=${JOBS:-2000} PRODUCE_N=${PRODUCE_N:-500} PRODUCE_SECS=${PRODUCE_SECS:-1} REPS=${REPS:-1}
else
    JOBS=${JOBS:-30000} PRODUCE_N=${PRODUCE_N:-20000} PRODUCE_SECS=${PRODUCE_SECS:-10} REPS=${REPS:-2}
fi
CREDIT=${CREDIT:-256}
SLEEP_MS=${SLEEP_MS:-1}
SLEEP_CONCURRENCY=${SLEEP_CONCURRENCY:-64}
# The sleeping workers' credit (prefetch): the issue's "concurrency 64
# (credit 256 ...)"; SLEEP_CREDIT=$SLEEP_CONCURRENCY ties them as before.
SLEEP_CREDIT=${SLEEP_CREDIT:-256}
LIMIT=${LIMIT:-600}
WORKERS=${WORKERS-python-async python-sync pika node amqplib rust lapin}
PRODUCERS=${PRODUCERS-python-sync python-async pika node amqplib rust lapin}
SLEEPERS=${SLEEPERS-python-async python-sync node rust}
# As asked (the table lists those without a figure, dropped ones too).
ASKED=("$WORKERS" "$PRODUCERS" "$SLEEPERS")
PIKA_VERSION=${PIKA_VERSION:-1.4.4}
AMQPLIB_VERSION=${AMQPLIB_VERSION:-2.3.1}
RABBIT_CLIENTS=${RABBIT_CLIENTS:-$BENCH_REPO/target/bench-cache/rabbit-clients}
RUST_TARGET=$BENCH_REPO/target/bench-cache/rust
PROF=$BENCH_DIR/sdk-profile
PY=$BENCH_REPO/clients/python/.venv/bin/python
LAPIN=$RUST_TARGET/release/lapin-bench
PIKA_PY=$RABBIT_CLIENTS/venv/bin/python
AMQPLIB_MODULES=$RABBIT_CLIENTS/node/node_modules
AMQP_URI=amqp://guest:guest@127.0.0.1:5672/%2f

# --- checks and preparation, before anything is measured ---------------
[ -x "$PY" ] || { echo "no $PY: clients/setup.sh python" >&2; exit 2; }
[ -f "$BENCH_REPO/clients/node/dist/esm/index.mjs" ] || { echo "no clients/node/dist: clients/setup.sh node" >&2; exit 2; }
command -v rabbitmq-server >/dev/null ||
    { echo "no rabbitmq-server: $ANCHORS/rabbitmq/setup.sh once (then rabbitmqctl stop)" >&2; exit 2; }
grep -qs '127.0.0.1:5672' /etc/rabbitmq/rabbitmq.conf ||
    { echo "RabbitMQ is not configured for loopback only: $ANCHORS/rabbitmq/setup.sh" >&2; exit 2; }
if rabbitmqctl -q status >/dev/null 2>&1; then
    echo "a RabbitMQ node already runs on this host (not this script's: neither used nor stopped): stop it first (rabbitmqctl stop)" >&2
    exit 2
fi

# nice_build DIR ARGS...: `cargo build --release -q ARGS` in DIR, niced;
# its output in OUT/build.log. Returns cargo's status.
nice_build() {
    local dir=$1
    shift
    log "build: (cd ${dir#"$BENCH_REPO"/} && cargo build --release $*)"
    (cd "$dir" && nice -n 10 cargo build --release -q "$@") >>"$OUT/build.log" 2>&1 && return 0
    log "build failed in $dir: OUT/build.log"
    tail -20 "$OUT/build.log" >&2
    return 1
}

# drop SDK...: takes each SDK off the lists of runs (its build failed).
drop() {
    local s w p z
    for s in "$@"; do
        w=" $WORKERS " p=" $PRODUCERS " z=" $SLEEPERS "
        WORKERS=${w// $s / } PRODUCERS=${p// $s / } SLEEPERS=${z// $s / }
    done
    log "no runs of: $* (WORKERS=$WORKERS; PRODUCERS=$PRODUCERS; SLEEPERS=$SLEEPERS)"
}

# The Rust programs. A Rust SDK that does not build at this commit (the
# SDKs change while this runs elsewhere) drops the Rust runs, not the
# sitting; RUST_WORKER and LEASEQ_RUST name binaries built elsewhere
# instead (no build then).
: >"$OUT/build.log"
# wants SDK: SDK is still on a list of runs.
wants() { [[ " $WORKERS $PRODUCERS $SLEEPERS " == *" $1 "* ]]; }
if [ -z "${RUST_WORKER:-}" ]; then
    RUST_WORKER=$BENCH_REPO/target/release/examples/noop_worker
    if wants rust; then nice_build "$BENCH_REPO" -p leaseq-client --example noop_worker || drop rust; fi
fi
if [ -z "${LEASEQ_RUST:-}" ]; then
    LEASEQ_RUST=$RUST_TARGET/release/leaseq-rust-bench
    if wants rust; then
        cp "$BENCH_REPO/Cargo.lock" "$PROF/leaseq-rust/Cargo.lock"
        CARGO_TARGET_DIR=$RUST_TARGET nice_build "$PROF/leaseq-rust" || drop rust
    fi
fi
for b in "$RUST_WORKER" "$LEASEQ_RUST"; do
    if wants rust && [ ! -x "$b" ]; then log "no $b"; drop rust; fi
done
if wants lapin; then CARGO_TARGET_DIR=$RUST_TARGET nice_build "$PROF/lapin" || drop lapin; fi

# The RabbitMQ clients, each from its registry, in RABBIT_CLIENTS (again
# when a version changes).
stamp="pika==$PIKA_VERSION amqplib@$AMQPLIB_VERSION"
if [ "$(cat "$RABBIT_CLIENTS/stamp" 2>/dev/null)" != "$stamp" ]; then
    log "install: $stamp into $RABBIT_CLIENTS"
    mkdir -p "$RABBIT_CLIENTS/node"
    {
        python3 -m venv "$RABBIT_CLIENTS/venv" &&
            "$RABBIT_CLIENTS/venv/bin/pip" install -q "pika==$PIKA_VERSION" &&
            echo '{"private": true}' >"$RABBIT_CLIENTS/node/package.json" &&
            (cd "$RABBIT_CLIENTS/node" && npm install -q --no-audit --no-fund "amqplib@$AMQPLIB_VERSION")
    } >"$OUT/install.log" 2>&1 || { echo "install failed: $OUT/install.log" >&2; tail -20 "$OUT/install.log" >&2; exit 2; }
    echo "$stamp" >"$RABBIT_CLIENTS/stamp"
fi
: >"$RESULTS"

embedded_broker broker
[ -n "${QUICK:-}" ] || warm "$A" 10
rabbit_start
RABBIT_VERSION=$(rabbitmqctl -q version 2>/dev/null)
log "broker $BIN ($("$BIN" --version 2>/dev/null)); RabbitMQ $RABBIT_VERSION; pika $PIKA_VERSION, amqplib $AMQPLIB_VERSION, lapin $(grep -A1 '^name = "lapin"$' "$PROF/lapin/Cargo.lock" | sed -n 's/version = "\(.*\)"/\1/p')"

# utime + stime of PID in seconds.
cpu_of() { awk -v t="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); print ($12 + $13) / t }' "/proc/$1/stat"; }

# lang_of SDK: python, node or rust.
lang_of() {
    case $1 in
        python-* | pika) echo python ;;
        node | amqplib) echo node ;;
        rust | lapin) echo rust ;;
    esac
}

# side_of SDK: leaseq or rabbitmq.
side_of() { case $1 in pika | amqplib | lapin) echo rabbitmq ;; *) echo leaseq ;; esac; }

# fill SDK QUEUE: JOBS jobs (messages) of 100 bytes in QUEUE, on the side
# SDK runs on.
fill() {
    if [ "$(side_of "$1")" = leaseq ]; then
        run_wait "$OUT/fill.out" timeout -k 10 "$LIMIT" "$PY" "$PROF/fill.py" "$A_ADDR" "$2" "$JOBS" 100
    else
        run_wait "$OUT/fill.out" timeout -k 10 "$LIMIT" "$LAPIN" fill "$AMQP_URI" "$2" "$JOBS" 100
    fi || { log "fill $2 failed: $(tail -3 "$OUT/fill.out")"; return 1; }
}

# measure NAME PART SDK JOBS CMD...: runs CMD (a program that prints a JSON
# line), with the server's CPU (the broker's or RabbitMQ's) over it per
# job; its line in RESULTS with the run's fields.
measure() {
    local name=$1 part=$2 sdk=$3 jobs=$4 spid s0 s1 n
    shift 4
    spid=$A_PID
    [ "$(side_of "$sdk")" = rabbitmq ] && spid=$RPID
    log "$name: $*"
    s0=$(cpu_of "$spid")
    run_json "$name" timeout -k 10 "$LIMIT" "$@" || return 0
    s1=$(cpu_of "$spid")
    # Per job done (a producer stops at its time limit).
    n=$(python3 -c 'import json, sys; d = json.loads(sys.argv[1]); print(d.get("sent", d.get("jobs", 0)) or 1)' "$LINE")
    emit "{\"part\": \"$part\", \"sdk\": \"$sdk\", \"lang\": \"$(lang_of "$sdk")\", \"side\": \"$(side_of "$sdk")\", \"round\": $rep, \"jobs_asked\": $jobs, \"server_cpu_us_per_job\": $(python3 -c "print(round(($s1 - $s0) * 1e6 / $n, 1))")}"
}

# worker SDK: part 1's run of SDK.
worker() {
    local sdk=$1 q=w-$1-$rep
    fill "$sdk" "$q" || return 0
    sleep "$GAP"
    case $sdk in
        python-async | python-sync)
            measure "$sdk-$rep" worker "$sdk" "$JOBS" "$PY" "$PROF/py_worker.py" "${sdk#python-}" "$A_ADDR" "$q" "$JOBS" --credit "$CREDIT" ;;
        node) measure "$sdk-$rep" worker "$sdk" "$JOBS" node "$PROF/node_worker.mjs" "$A_ADDR" "$q" "$JOBS" --credit "$CREDIT" ;;
        rust) measure "$sdk-$rep" worker "$sdk" "$JOBS" "$RUST_WORKER" "$A_ADDR" "$q" "$JOBS" "$CREDIT" ;;
        pika) measure "$sdk-$rep" worker "$sdk" "$JOBS" "$PIKA_PY" "$PROF/rabbit_pika.py" worker "$AMQP_URI" "$q" "$JOBS" "$CREDIT" ;;
        amqplib) measure "$sdk-$rep" worker "$sdk" "$JOBS" node "$PROF/rabbit_amqplib.mjs" "$AMQPLIB_MODULES" worker "$AMQP_URI" "$q" "$JOBS" "$CREDIT" ;;
        lapin) measure "$sdk-$rep" worker "$sdk" "$JOBS" "$LAPIN" worker "$AMQP_URI" "$q" "$JOBS" "$CREDIT" ;;
        *) log "unknown worker $sdk: skipped" ;;
    esac
    sleep "$GAP"
}

# producer SDK: part 2's run of SDK.
producer() {
    local sdk=$1 q=p-$1-$rep
    case $sdk in
        python-sync | python-async)
            measure "producer-$sdk-$rep" producer "$sdk" "$PRODUCE_N" "$PY" "$PROF/py_producer.py" "${sdk#python-}" "$A_ADDR" "$q" "$PRODUCE_N" "$PRODUCE_SECS" ;;
        node) measure "producer-$sdk-$rep" producer "$sdk" "$PRODUCE_N" node "$PROF/node_producer.mjs" "$A_ADDR" "$q" "$PRODUCE_N" "$PRODUCE_SECS" ;;
        rust) measure "producer-$sdk-$rep" producer "$sdk" "$PRODUCE_N" "$LEASEQ_RUST" producer "$A_ADDR" "$q" "$PRODUCE_N" "$PRODUCE_SECS" ;;
        pika) measure "producer-$sdk-$rep" producer "$sdk" "$PRODUCE_N" "$PIKA_PY" "$PROF/rabbit_pika.py" producer "$AMQP_URI" "$q" "$PRODUCE_N" "$PRODUCE_SECS" ;;
        amqplib) measure "producer-$sdk-$rep" producer "$sdk" "$PRODUCE_N" node "$PROF/rabbit_amqplib.mjs" "$AMQPLIB_MODULES" producer "$AMQP_URI" "$q" "$PRODUCE_N" "$PRODUCE_SECS" ;;
        lapin) measure "producer-$sdk-$rep" producer "$sdk" "$PRODUCE_N" "$LAPIN" producer "$AMQP_URI" "$q" "$PRODUCE_N" "$PRODUCE_SECS" ;;
        *) log "unknown producer $sdk: skipped" ;;
    esac
    # The jobs left waiting would weigh on the next runs (RabbitMQ's queue
    # is deleted by its program).
    [ "$(side_of "$sdk")" = leaseq ] &&
        run_wait "$OUT/purge.out" timeout 60 "$BIN" purge --addr "$A_ADDR" --yes "$q"
    sleep "$GAP"
}

# sleeper SDK: part 3's run of SDK.
sleeper() {
    local sdk=$1 q=s-$1-$rep ideal c=$SLEEP_CONCURRENCY
    ideal=$(python3 -c "print(round($c * 1000 / $SLEEP_MS))")
    fill "$sdk" "$q" || return 0
    sleep "$GAP"
    case $sdk in
        python-async | python-sync)
            measure "sleep-$sdk-$rep" sleep "$sdk" "$JOBS" "$PY" "$PROF/py_worker.py" "${sdk#python-}" "$A_ADDR" "$q" "$JOBS" --credit "$SLEEP_CREDIT" --concurrency "$c" --sleep-ms "$SLEEP_MS" ;;
        node) measure "sleep-$sdk-$rep" sleep "$sdk" "$JOBS" node "$PROF/node_worker.mjs" "$A_ADDR" "$q" "$JOBS" --credit "$SLEEP_CREDIT" --concurrency "$c" --sleep-ms "$SLEEP_MS" ;;
        rust) measure "sleep-$sdk-$rep" sleep "$sdk" "$JOBS" "$LEASEQ_RUST" worker "$A_ADDR" "$q" "$JOBS" "$c" "$SLEEP_MS" "$SLEEP_CREDIT" ;;
        *) log "no sleeping worker for $sdk: skipped"; return 0 ;;
    esac
    # The fraction of the ideal, added to the line just written.
    python3 - "$RESULTS" "$ideal" <<'PY'
import json, sys
path, ideal = sys.argv[1], int(sys.argv[2])
lines = open(path).read().splitlines()
d = json.loads(lines[-1])
if d.get("part") == "sleep":
    d["ideal"] = ideal
    d["of_ideal"] = round(d.get("rate", 0) / ideal, 3)
    lines[-1] = json.dumps(d)
    open(path, "w").write("\n".join(lines) + "\n")
PY
    sleep "$GAP"
}

for rep in $(seq "$REPS"); do
    for sdk in $WORKERS; do worker "$sdk"; done
    for sdk in $PRODUCERS; do producer "$sdk"; done
    for sdk in $SLEEPERS; do sleeper "$sdk"; done
done

stop_all
rabbit_stop
ENV_LINE="JOBS=$JOBS CREDIT=$CREDIT REPS=$REPS PRODUCE_N=$PRODUCE_N PRODUCE_SECS=$PRODUCE_SECS SLEEP_MS=$SLEEP_MS SLEEP_CONCURRENCY=$SLEEP_CONCURRENCY SLEEP_CREDIT=$SLEEP_CREDIT${QUICK:+ QUICK=1}" \
    RABBIT_VERSION=$RABBIT_VERSION BROKER="$BIN ($("$BIN" --version 2>/dev/null))" WORKERS=${ASKED[0]} PRODUCERS=${ASKED[1]} SLEEPERS=${ASKED[2]} \
    python3 "$PROF/rabbit_table.py" "$RESULTS" | tee "$OUT/table.md"
