#!/usr/bin/env bash
# Runs the Python and Node client test suites against a real broker.
#
#   clients/run-tests.sh [python] [packaging] [node]   (all when none is named)
#
#   python     pytest, all but tests/test_packaging.py
#   packaging  pytest tests/test_packaging.py: the wheel built and installed
#              into a fresh venv, mypy --strict (about 50 s, apart so that
#              tests/clients.rs runs it beside the rest)
#   node       node --test
#
# - The broker: $LEASEQ_BIN if set, else `cargo build` at the repository root
#   and target/debug/leaseq. It runs as a process on 127.0.0.1 and a free
#   port, on $DATABASE_URL if set, else on its embedded PostgreSQL cluster in
#   a fresh temporary directory (the server binaries are installed with
#   apt-get when missing, as .ci/run does).
# - Dependencies, installed when missing or out of date (clients/setup.sh):
#   a virtualenv in clients/python/.venv with the package's wheel (built
#   with `python -m build`) and its test extras; clients/node/node_modules
#   from package-lock.json (`npm ci`), and clients/node/.installed, a fresh
#   project with the `npm pack` tarball installed, where the Node suite
#   runs.
# - Runs pytest, then `node --test`, whatever the first one gave; stops the
#   broker with SIGTERM and removes the temporary directory on any exit.
#   Exits non-zero if any test failed or was skipped (a skip means a
#   prerequisite went missing), after a `clients SUITES: N passed, N failed`
#   line.
set -euo pipefail
suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=(python packaging node)
for s in "${suites[@]}"; do
    case "$s" in python | packaging | node) ;; *) echo "unknown suite '$s' (python, packaging, node)" >&2; exit 2 ;; esac
done
wants() { [[ " ${suites[*]} " == *" $1 "* ]]; }
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
py="$here/python"
node="$here/node"

# --- the broker binary
if [ -z "${LEASEQ_BIN:-}" ]; then
    echo "--- cargo build (the broker)"
    (cd "$repo" && cargo build --quiet --bin leaseq)
    LEASEQ_BIN="${CARGO_TARGET_DIR:-$repo/target}/debug/leaseq"
fi
[ -x "$LEASEQ_BIN" ] || { echo "no broker binary at $LEASEQ_BIN" >&2; exit 1; }
export LEASEQ_BIN

have_pg_bins() {
    command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1 && return 0
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
if [ -z "${DATABASE_URL:-}" ] && ! have_pg_bins; then
    echo "--- installing PostgreSQL server binaries"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends postgresql
fi

# --- dependencies (clients/setup.sh: the venv and node_modules, each only
# when missing or out of date, under a lock shared with tests/traces.rs).
# The Python venv is always needed: it waits for the broker below.
if wants node; then bash "$here/setup.sh" python node-installed; else bash "$here/setup.sh" python; fi

# --- the broker process
work="$(mktemp -d "${TMPDIR:-/tmp}/leaseq-clients.XXXXXX")"
# As root the embedded cluster runs as `postgres`, which must be able to enter
# every directory above it (mktemp makes this one 0700).
chmod 755 "$work"
broker_pid=""
cleanup() {
    local rc=$?
    if [ -n "$broker_pid" ] && kill -0 "$broker_pid" 2>/dev/null; then
        kill -TERM "$broker_pid"
        # Drain grace is 5 s; then the embedded cluster shuts down.
        for _ in $(seq 1 300); do kill -0 "$broker_pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$broker_pid" 2>/dev/null; then
            echo "broker did not exit after SIGTERM; killing it" >&2
            kill -KILL "$broker_pid"
        fi
        wait "$broker_pid" 2>/dev/null || true
    fi
    if [ "$rc" -ne 0 ] && [ -s "$work/broker.log" ]; then
        echo "--- last lines of the broker's log" >&2
        tail -n 30 "$work/broker.log" >&2
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -z "${DATABASE_URL:-}" ]; then
    export LEASEQ_DATA_DIR="$work/pg"
fi
if [ -n "${DATABASE_URL:-}" ]; then
    echo "--- starting the broker on \$DATABASE_URL"  # not printed: it may hold a password
else
    echo "--- starting the broker on embedded PostgreSQL in $work/pg"
fi
# Port 0: the broker reports the port it bound in its "leaseq serving" log
# line (JSON, so it can be read reliably); nothing can take it in between.
# The tests' timings need prompt reaping and short drains: the same flags as
# the brokers the test suites start themselves.
RUST_LOG="warn,leaseq_server::server=info" "$LEASEQ_BIN" serve --listen 127.0.0.1:0 --log-format json \
    --heartbeat-interval 1s --reap-interval 200ms --health-interval 200ms --drain-grace 5s \
    </dev/null >"$work/broker.log" 2>&1 &
broker_pid=$!

# Then SERVING on leaseq.v1.QueueService: migrations applied, PostgreSQL answers.
LEASEQ_ADDR="$("$py/.venv/bin/python" - "$work/broker.log" "$broker_pid" <<'EOF_PY'
import json, os, sys, time
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

log, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 120  # a first start runs initdb


def alive_or_exit():
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("the broker exited before serving")
    if time.monotonic() > deadline:
        sys.exit("the broker was not SERVING within 120 s")


addr = None
while addr is None:
    with open(log) as f:
        for line in f:
            try:
                fields = json.loads(line).get("fields", {})
            except ValueError:
                continue
            if fields.get("message") == "leaseq serving":
                addr = fields["addr"]
    if addr is None:
        alive_or_exit()
        time.sleep(0.2)  # a log file has no event to await

with grpc.insecure_channel(addr) as ch:
    stub = health_pb2_grpc.HealthStub(ch)
    req = health_pb2.HealthCheckRequest(service="leaseq.v1.QueueService")
    while True:
        try:
            if stub.Check(req, timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                break
        except grpc.RpcError:
            pass
        alive_or_exit()
        time.sleep(0.2)
print(addr)
EOF_PY
)"
export LEASEQ_ADDR
echo "broker SERVING on $LEASEQ_ADDR"

# --- the suites; each one asked for runs, whatever the first gave
set +e
py_rc=0 node_rc=0
: >"$work/pytest.log"; : >"$work/node.log"
pytest_args=()
if wants python && ! wants packaging; then pytest_args=(--ignore=tests/test_packaging.py); fi
if ! wants python && wants packaging; then pytest_args=(tests/test_packaging.py); fi
if wants python || wants packaging; then
    echo "--- pytest (clients/python) ${pytest_args[*]}"
    # PYTHONSAFEPATH (3.11+): the sources in this directory are not put on sys.path, so
    # `import leaseq` is the wheel installed in .venv (clients/setup.sh).
    (cd "$py" && PYTHONSAFEPATH=1 .venv/bin/python -m pytest -q -rs -p no:cacheprovider "${pytest_args[@]}" 2>&1) | tee "$work/pytest.log"
    py_rc=${PIPESTATUS[0]}
fi
if wants node; then
    echo "--- node --test (clients/node/.installed: the packed tarball, installed; clients/node: test/package.test.js)"
    # Test files run three at a time: they mostly wait on brokers and timers.
    # --test-force-exit: a test that fails half-way may leave a worker running,
    # which must not keep its file's process (and so this script) alive.
    # Every test file but package.test.js runs in the project where
    # `npm pack`'s tarball is installed (clients/setup.sh node-installed);
    # package.test.js packs and installs the package itself, from the
    # sources, beside them.
    export LEASEQ_REPO="$repo"
    installed=()
    for f in "$node"/.installed/test/*.test.js; do
        [ "$(basename "$f")" = package.test.js ] || installed+=("test/$(basename "$f")")
    done
    (cd "$node/.installed" && node --test --test-concurrency=3 --test-force-exit "${installed[@]}" >"$work/node-installed.log" 2>&1) &
    installed_pid=$!
    (cd "$node" && node --test --test-force-exit test/package.test.js >"$work/node-package.log" 2>&1)
    package_rc=$?
    wait "$installed_pid"
    node_rc=$?
    [ "$package_rc" -ne 0 ] && node_rc=$package_rc
    cat "$work/node-installed.log" "$work/node-package.log" | tee "$work/node.log"
fi
set -e

count() { { grep -Eo "$1" "$2" || true; } | { grep -Eo '[0-9]+' || true; } | awk '{s+=$1} END {print s+0}'; }
passed=$(( $(count '[0-9]+ passed' "$work/pytest.log") + $(count '^# pass [0-9]+' "$work/node.log") ))
failed=$(( $(count '[0-9]+ (failed|error)' "$work/pytest.log") + $(count '^# fail [0-9]+' "$work/node.log") ))
# A skipped test is a failed one here: every prerequisite (cryptography,
# the OpenTelemetry SDKs) is installed by setup.sh, so a skip means one went
# missing and its tests silently stopped running.
skipped=$(( $(count '[0-9]+ skipped' "$work/pytest.log") + $(count '^# skip [0-9]+' "$work/node.log") ))
echo "--- summary: pytest exit $py_rc, node --test exit $node_rc, $skipped skipped"
echo "clients ${suites[*]}: $passed passed, $((failed + skipped)) failed"
[ "$py_rc" -eq 0 ] && [ "$node_rc" -eq 0 ] && [ "$skipped" -eq 0 ]
