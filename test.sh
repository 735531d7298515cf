#!/usr/bin/env bash
# The test command: checks every prerequisite, installs the missing ones
# (as root, with apt-get) or names them and stops, then lints, builds and runs
# the whole suite: the Rust tests, and through them the Python and Node client
# suites. Ends with one line, `summary: N passed, M failed`, and the wall time
# of each step. `.ci/run` is this script.
#
#   ./test.sh                  everything (what CI runs)
#   ./test.sh -E 'test(/^lb::/)'   arguments go to `cargo nextest run`
#                              (a filter, --no-capture, ...); deploy/check
#                              and `cargo fmt --check` are then left out
#
# Environment:
#   LEASEQ_NO_INSTALL=1   never install anything, even as root: name what is
#                         missing and stop.
#   DATABASE_URL          the suite uses it if set (otherwise a throwaway
#                         cluster under $TMPDIR, stopped at the end if this
#                         script started it).
#   TMPDIR                the suite's scratch space; unset, it is
#                         /dev/shm/leaseq-test-$UID where /dev/shm is a
#                         tmpfs with 2 GiB free, else /tmp.
#   CARGO_TARGET_DIR      as for cargo.
set -euo pipefail
cd "$(dirname "$0")"
run_start=$(date +%s.%N)

# --- the wall time of each step
steps=()
step_start=""
step_name=""
begin() {
    finish_step
    step_name="$1"
    step_start=$(date +%s.%N)
    echo "--- $step_name"
}
finish_step() {
    if [ -n "$step_name" ]; then
        local secs
        secs=$(awk -v a="$step_start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
        steps+=("$(printf '%-36s %7s s' "$step_name" "$secs")")
        echo "--- $step_name: ${secs} s"
        step_name=""
    fi
}
print_times() {
    finish_step
    echo "--- wall time of each step"
    local s
    for s in "${steps[@]}"; do echo "    $s"; done
    printf '    %-36s %7s s\n' "total" \
        "$(awk -v a="$run_start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')"
}

# --- prerequisites
#
# Each is a check, then the package that provides it on Debian/Ubuntu,
# Fedora/RHEL and macOS (Homebrew).
pg_bin_dir() {
    local d
    for d in ${LEASEQ_PG_BIN:-} $(echo "${PATH:-}" | tr ':' ' ') \
        $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -rn) \
        /usr/local/pgsql/bin $(ls -d /opt/homebrew/opt/postgresql@*/bin /usr/local/opt/postgresql@*/bin 2>/dev/null); do
        if [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/psql" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}
have_pg() { pg_bin_dir >/dev/null; }
have_haproxy() { command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || [ -x /usr/local/sbin/haproxy ]; }
have_faketime() {
    # Where the clock-skew test (tests/faults.rs) looks for it.
    [ -n "${LEASEQ_LIBFAKETIME:-}" ] && [ -f "$LEASEQ_LIBFAKETIME" ] && return 0
    compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null ||
        [ -f /usr/lib/faketime/libfaketime.so.1 ] || [ -f /usr/lib64/faketime/libfaketime.so.1 ]
}
have_python() {
    # venv with pip: Debian ships ensurepip (what `python3 -m venv` needs for
    # pip) in python3-venv, not in python3.
    command -v python3 >/dev/null 2>&1 && python3 -c 'import venv, ensurepip' >/dev/null 2>&1
}
have_node() { command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; }
have_chromium() {
    { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
        command -v google-chrome >/dev/null 2>&1; } && command -v chromedriver >/dev/null 2>&1
}
have_promtool() { command -v promtool >/dev/null 2>&1; }
have_go() {
    # The Go example builds in GOPATH mode against Debian's Go packages (no
    # module proxy is assumed): tests/go_example.rs.
    command -v go >/dev/null 2>&1 && command -v protoc >/dev/null 2>&1 &&
        command -v protoc-gen-go >/dev/null 2>&1 && command -v protoc-gen-go-grpc >/dev/null 2>&1 &&
        [ -d /usr/share/gocode/src/google.golang.org/grpc ] && [ -d /usr/share/gocode/src/google.golang.org/protobuf ] &&
        [ -f /usr/include/google/protobuf/duration.proto ] &&
        # grpc-go's codec through github.com/golang/protobuf 1.4+ (the 1.3
        # package, which apt picks by default, cannot marshal APIv2 messages).
        [ -f /usr/share/gocode/src/github.com/golang/protobuf/proto/registry.go ]
}
have_yaml() { command -v python3 >/dev/null 2>&1 && python3 -c 'import yaml' >/dev/null 2>&1; }
have_rust() { command -v cargo >/dev/null 2>&1 && command -v rustc >/dev/null 2>&1; }
have_clippy() { command -v cargo-clippy >/dev/null 2>&1 && clippy_driver >/dev/null; }
have_rustfmt() { command -v rustfmt >/dev/null 2>&1; }
have_nextest() { cargo nextest --version >/dev/null 2>&1; }
clippy_driver() {
    local d
    d="$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver 2>/dev/null || true)"
    [ -n "$d" ] && [ -x "$d" ] && echo "$d"
}

# name | check | Debian package(s) | Fedora package(s) | Homebrew formula(e) | what needs it
prereqs=(
    "PostgreSQL server binaries (initdb, postgres, pg_ctl, psql)|have_pg|postgresql|postgresql-server|postgresql@15|the embedded test cluster; the fault suite's pg_ctl; the SQL check"
    "HAProxy|have_haproxy|haproxy|haproxy|haproxy|tests/lb.rs, deploy/check"
    "libfaketime (libfaketime.so.1)|have_faketime|faketime|libfaketime|libfaketime|faults::skewed_broker_clocks"
    "python3 with venv and pip|have_python|python3 python3-venv python3-pip|python3 python3-pip|python|the Python client suite (tests/clients.rs)"
    "node and npm|have_node|nodejs npm|nodejs npm|node|the Node client suite (tests/clients.rs)"
    "PyYAML (python3 -c 'import yaml')|have_yaml|python3-yaml|python3-pyyaml|pyyaml|deploy/check"
    "Chromium and ChromeDriver|have_chromium|chromium chromium-driver|chromium chromedriver|chromium chromedriver|the console's browser tests (tests/console.rs)"
    "promtool|have_promtool|prometheus|golang-github-prometheus|prometheus|the alerting rules (tests/alerts.rs, deploy/check)"
    "Go, protoc and Go gRPC packages|have_go|golang-go protobuf-compiler libprotobuf-dev protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev|golang protobuf-compiler protobuf-devel golang-google-protobuf-devel golang-google-grpc-devel|go protobuf protoc-gen-go protoc-gen-go-grpc|the Go example (tests/go_example.rs)"
)
# Not packages of the system: named, never installed by this script.
rust_prereqs=(
    "cargo and rustc|have_rust|https://rustup.rs"
    "clippy|have_clippy|rustup component add clippy"
    "rustfmt|have_rustfmt|rustup component add rustfmt"
    "cargo-nextest|have_nextest|cargo install --locked cargo-nextest"
)

missing=()
missing_report() {
    local entry name check deb fed brew why
    echo "Missing prerequisites of the test suite:" >&2
    for entry in "${missing[@]}"; do
        IFS='|' read -r name check deb fed brew why <<<"$entry"
        echo "  - $name (for $why)" >&2
    done
    local debs="" feds="" brews=""
    for entry in "${missing[@]}"; do
        IFS='|' read -r name check deb fed brew why <<<"$entry"
        debs="$debs $deb"
        feds="$feds $fed"
        brews="$brews $brew"
    done
    echo "Install them with one of:" >&2
    echo "  Debian/Ubuntu:  sudo apt-get install --no-install-recommends$debs" >&2
    echo "  Fedora/RHEL:    sudo dnf install$feds" >&2
    echo "  macOS:          brew install$brews" >&2
    echo "(run as root on a Debian-like system, ./test.sh installs them itself)" >&2
}

check_prereqs() {
    missing=()
    local entry name check rest
    for entry in "${prereqs[@]}"; do
        IFS='|' read -r name check rest <<<"$entry"
        if ! "$check"; then missing+=("$entry"); fi
    done
}

begin "prerequisites"
rust_missing=0
for entry in "${rust_prereqs[@]}"; do
    IFS='|' read -r name check how <<<"$entry"
    if ! "$check"; then
        echo "missing: $name ($how)" >&2
        rust_missing=1
    fi
done
if [ "$rust_missing" = 1 ]; then
    echo "The Rust toolchain pieces above are not system packages: install them, then run ./test.sh again." >&2
    exit 2
fi
check_prereqs
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ -z "${LEASEQ_NO_INSTALL:-}" ]; then
        pkgs=""
        for entry in "${missing[@]}"; do
            IFS='|' read -r name check deb rest <<<"$entry"
            echo "missing: $name; installing Debian package(s): $deb"
            pkgs="$pkgs $deb"
        done
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q
        # shellcheck disable=SC2086 # a list of package names
        apt-get install -y -q --no-install-recommends $pkgs
        # Debian's python3-yaml serves Debian's python3; a python3 of its own
        # (pyenv, a virtualenv) earlier on PATH gets PyYAML from PyPI instead.
        if ! have_yaml && command -v python3 >/dev/null 2>&1; then
            echo "python3 ($(command -v python3)) is not Debian's: pip install pyyaml"
            python3 -m pip install --quiet --disable-pip-version-check pyyaml
        fi
        check_prereqs
        if [ "${#missing[@]}" -gt 0 ]; then
            echo "Still missing after apt-get install:" >&2
            missing_report
            exit 2
        fi
    else
        missing_report
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "(LEASEQ_NO_INSTALL is set: nothing was installed)" >&2
        fi
        exit 2
    fi
fi
# The suite (leaseq::embedded, the fault suite's pg_ctl) uses the same ones.
LEASEQ_PG_BIN="${LEASEQ_PG_BIN:-$(pg_bin_dir)}"
export LEASEQ_PG_BIN
echo "PostgreSQL server binaries: $LEASEQ_PG_BIN"
echo "cargo-nextest: $(cargo nextest --version 2>/dev/null | head -n1)"

# The suite's scratch space on a RAM-backed tmpfs when there is room: its
# throwaway PostgreSQL clusters (the shared one, about 200 databases made
# from a template, and 22 private ones) are file creation and copying. On
# ext4 that was a third of the suite's CPU (205 s of CPU and 105 s on 2 cores
# against 156 s and 81 s on /dev/shm). Only when TMPDIR is not set: a TMPDIR
# of your own is used as it is.
tmpfs_scratch() {
    local shm=/dev/shm dir avail
    [ -d "$shm" ] && [ -w "$shm" ] || return 1
    [ "$(stat -f -c %T "$shm" 2>/dev/null)" = tmpfs ] || return 1
    # 2 GiB free: what a run leaves (about 300 MB, reused by the next run)
    # with a wide margin; a container's 64 MB /dev/shm falls back to /tmp.
    avail="$(df -Pk "$shm" | awk 'NR == 2 {print $4}')"
    [ "${avail:-0}" -ge 2097152 ] || return 1
    dir="$shm/leaseq-test-$(id -u)"
    # Ours, and not a link someone else planted; 0755: as root, PostgreSQL
    # runs as `postgres`, who must enter it.
    mkdir -p -m 0755 "$dir" 2>/dev/null || return 1
    [ -d "$dir" ] && [ ! -L "$dir" ] && [ -O "$dir" ] || return 1
    chmod 0755 "$dir"
    echo "$dir"
}
if [ -z "${TMPDIR:-}" ] && scratch="$(tmpfs_scratch)"; then
    export TMPDIR="$scratch"
fi
echo "scratch space (TMPDIR): ${TMPDIR:-/tmp}"

# The shared throwaway cluster the suite starts (tests/common): stopped at the
# end if this run started it, left alone if it was already running.
tmp_root="${TMPDIR:-/tmp}"
tmp_root="${tmp_root%/}"
test_pg="$tmp_root/leaseq-test-pg"
postmaster_pid() { head -n1 "$test_pg/data/postmaster.pid" 2>/dev/null || true; }
pg_was_running=""
p="$(postmaster_pid)"
if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then pg_was_running=1; fi
# Sessions of clients still connected (another suite run sharing it).
pg_clients() {
    local c n=0
    for c in $(pgrep -P "$1" 2>/dev/null); do
        tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null | grep -q '\[local\]' && n=$((n + 1))
    done
    echo "$n"
}
stop_test_pg() {
    local p
    p="$(postmaster_pid)"
    if [ -z "${DATABASE_URL:-}" ] && [ -z "$pg_was_running" ] && [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
        if [ -d /proc ] && [ "$(pg_clients "$p")" -gt 0 ]; then
            echo "--- leaving the suite's PostgreSQL cluster running: another run is using it"
            return
        fi
        echo "--- stopping the suite's PostgreSQL cluster ($test_pg, pid $p)"
        kill -INT "$p" 2>/dev/null || true # fast shutdown
        for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    fi
}
# The SQL checked at compile time (docs/ARCHITECTURE.md): the build's query
# macros describe every statement on a throwaway cluster of their own,
# migrated from migrations/ (a renamed column fails the build), and write
# what they found, which must be the committed .sqlx/.
# shellcheck source=scripts/sqlx-lib.sh
. scripts/sqlx-lib.sh
# The client installs started below in the background are waited for, so
# that no install is left running (and half done) after the script.
setup_pid=""
on_exit() {
    if [ -n "$setup_pid" ] && kill -0 "$setup_pid" 2>/dev/null; then
        echo "--- waiting for the client installs in the background"
        wait "$setup_pid" 2>/dev/null || true
    fi
    sqlx_db_stop
    stop_test_pg
    if [ -n "${setup_log:-}" ]; then rm -f "$setup_log"; fi
}
trap on_exit EXIT

# --- lint, build, test
nextest_args=("$@")
full=1
[ "${#nextest_args[@]}" -gt 0 ] && full=0

# The client suites' installs (the Python venvs, `npm ci`, the Node build)
# run in the background while cargo builds: on a fresh machine they were
# about two minutes of the test step's critical path. The tests that need
# them run clients/setup.sh themselves, which waits for this one (a lock)
# and finds the work done, or redoes it and reports what failed.
if [ "$full" = 1 ]; then
    setup_log="$(mktemp "${tmp_root}/leaseq-clients-setup.XXXXXX")"
    bash clients/setup.sh python node-installed traces >"$setup_log" 2>&1 &
    setup_pid=$!
fi

if [ "$full" = 1 ]; then
    begin "deploy/check"
    deploy/check
    begin "cargo fmt --check"
    cargo fmt --check
fi

# One build that lints and compiles for the tests at once: clippy-driver
# stands in for rustc on this package's crates (what `cargo clippy` does), so
# every target cargo builds for the tests is also linted, with warnings as
# errors (CLIPPY_ARGS is clippy's own separator-joined argument list).
# Dependencies are compiled by plain rustc, as under `cargo clippy`.
RUSTC_WORKSPACE_WRAPPER="$(clippy_driver)"
export RUSTC_WORKSPACE_WRAPPER
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

log="$(mktemp "${tmp_root}/leaseq-test-log.XXXXXX")"
status=0
begin "schema for the SQL check"
sqlx_out="${CARGO_TARGET_DIR:-target}/sqlx-live"
sqlx_digest="$(sqlx_inputs_digest)"
sqlx_env=()
if [ "$(cat "$sqlx_out.ok" 2>/dev/null)" = "$sqlx_digest" ]; then
    # Saves recompiling the crates with query macros on a rerun.
    echo "the SQL, migrations/ and .sqlx/ are as at the last check that passed: not checked again"
else
    sqlx_db_start
    sqlx_live_env "$sqlx_out"
fi
begin "build and lint (clippy -D warnings)"
if ! env "${sqlx_env[@]}" cargo nextest run --no-run "${nextest_args[@]}"; then
    status=1
    echo "the build or a lint failed: no test ran" >&2
    echo "(an error in a sqlx::query! or query_file! macro: the statement does not fit the schema migrations/ make)" >&2
fi
if [ "$status" = 0 ] && [ "${#sqlx_env[@]}" -gt 0 ]; then
    begin "offline data (.sqlx) check"
    sqlx_db_stop --no-wait
    if sqlx_compare "$sqlx_out"; then
        echo "$sqlx_digest" >"$sqlx_out.ok"
    else
        status=1
        echo "no test ran" >&2
    fi
fi
if [ "$status" = 0 ]; then
    if [ -n "$setup_pid" ] && ! kill -0 "$setup_pid" 2>/dev/null && ! wait "$setup_pid"; then
        echo "--- the client installs in the background failed (the client tests retry them):"
        tail -n 20 "$setup_log"
    fi
    begin "tests (cargo nextest run)"
    set +e
    cargo nextest run --no-fail-fast "${nextest_args[@]}" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    set -e
    if [ "$full" = 1 ]; then
        # nextest does not run doc tests: cargo test does, here.
        begin "doc tests (cargo test --doc)"
        set +e
        cargo test --doc 2>&1 | tee "$log.doc"
        doc_status=${PIPESTATUS[0]}
        set -e
        [ "$doc_status" -ne 0 ] && status=$doc_status
    fi
fi
finish_step

# --- one summary line
# nextest's "Summary [...] N tests run: P passed, F failed, ..." (timed-out
# tests count as failed), the "clients python|node: P passed, F failed"
# lines of the Python and Node suites that tests/clients.rs runs, and the
# doc tests' "test result:" line.
sum_of() { { grep -Eo "$1" || true; } | { grep -Eo '^[0-9]+' || true; } | awk '{s+=$1} END {print s+0}'; }
rust_line="$(grep -E 'Summary \[' "$log" | tail -n1 | sed 's/.* run: //' || true)"
# One line per client suite (python, node); nextest may print a failing
# test's output twice, hence sort -u.
clients_line="$(grep -E '^[[:space:]]*clients [a-z ]+: [0-9]+ passed' "$log" | sed 's/^[[:space:]]*//' | sort -u || true)"
passed=$(($(sum_of '[0-9]+ passed' <<<"$rust_line") + $(sum_of '[0-9]+ passed' <<<"$clients_line")))
failed=$(($(sum_of '[0-9]+ (failed|timed out)' <<<"$rust_line") + $(sum_of '[0-9]+ failed' <<<"$clients_line")))
skipped=$(sum_of '[0-9]+ skipped' <<<"$rust_line")
if [ -f "$log.doc" ]; then
    doc_line="$(grep -E '^test result:' "$log.doc" || true)"
    passed=$((passed + $(sum_of '[0-9]+ passed' <<<"$doc_line")))
    failed=$((failed + $(sum_of '[0-9]+ failed' <<<"$doc_line")))
    skipped=$((skipped + $(sum_of '[0-9]+ ignored' <<<"$doc_line")))
fi
rm -f "$log" "$log.doc"
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    # The build, a lint, or the runner itself failed.
    failed=1
fi
if [ "$full" = 1 ] && [ "${skipped:-0}" -gt 0 ]; then
    echo "error: $skipped test(s) skipped in a full run: nothing may be skipped" >&2
    [ "$status" -eq 0 ] && status=1
fi
print_times
echo "summary: ${passed} passed, ${failed} failed"
[ "$failed" -gt 0 ] && [ "$status" -eq 0 ] && status=1
exit "$status"
