#!/usr/bin/env bash
# Installs what the client suites need, each part only when missing or out of
# date (a stamp of its manifest):
#
#   clients/setup.sh python   clients/python/.venv: the package (editable)
#                             and its test extras (clients/run-tests.sh)
#   clients/setup.sh node     clients/node/node_modules (`npm ci`) and the
#                             package built (TypeScript to dist/)
#   clients/setup.sh traces   clients/python/.venv-traces: the package with
#                             the OpenTelemetry SDK and OTLP/gRPC exporter
#                             (tests/traces.rs), apart from the suite's venv
#                             so the exporter's pins do not narrow what the
#                             suite is tested against
#
# Parts run in the order given, under one lock (flock on
# clients/.setup.lock, where flock exists): test processes started together
# (the client suites and tests/traces.rs) never install into one directory
# at once.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="$here/python"
node="$here/node"

exec 9>"$here/.setup.lock"
# util-linux's flock; where there is none (macOS), suites that start together
# may install at once.
if command -v flock >/dev/null 2>&1; then flock 9; fi

stamp_of() { cat "$@" | cksum | cut -d' ' -f1; }

# A virtualenv at $1 (Debian's python3 ships venv's pip separately).
make_venv() {
    local dir="$1"
    [ -x "$dir/bin/python" ] && return 0
    echo "--- python3 -m venv ${dir#"$here"/}"
    if ! python3 -m venv "$dir"; then
        rm -rf "$dir"
        if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv
            python3 -m venv "$dir"
        else
            echo "python3 -m venv failed: install the venv module (Debian: apt-get install python3-venv)" >&2
            exit 1
        fi
    fi
}

setup_python() {
    make_venv "$py/.venv"
    local stamp
    stamp="$(stamp_of "$py/pyproject.toml")"
    if [ "$(cat "$py/.venv/.leaseq-deps" 2>/dev/null)" != "$stamp" ]; then
        echo "--- pip install -e clients/python[test]"
        "$py/.venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$py[test]"
        echo "$stamp" >"$py/.venv/.leaseq-deps"
    fi
}

# The OTel packages of the traces test; the stamp covers this list too.
TRACE_PACKAGES=(opentelemetry-sdk opentelemetry-exporter-otlp-proto-grpc)

setup_traces() {
    make_venv "$py/.venv-traces"
    local stamp
    stamp="$( (cat "$py/pyproject.toml"; echo "${TRACE_PACKAGES[*]}") | cksum | cut -d' ' -f1)"
    if [ "$(cat "$py/.venv-traces/.leaseq-deps" 2>/dev/null)" != "$stamp" ]; then
        echo "--- pip install -e clients/python[otel] ${TRACE_PACKAGES[*]} (.venv-traces)"
        "$py/.venv-traces/bin/python" -m pip install --quiet --disable-pip-version-check \
            -e "$py[otel]" "${TRACE_PACKAGES[@]}"
        echo "$stamp" >"$py/.venv-traces/.leaseq-deps"
    fi
}

# node_modules from package-lock.json, and the package's build (TypeScript
# to dist/; npm ci runs it as the package's prepare script), so the tests
# always use the current src/. The build starts by removing dist/, so it is
# run only when its inputs changed: another suite may be using dist/.
setup_node() {
    local built
    built="$(cd "$node" && stamp_of src/*.ts scripts/build.js tsconfig.json package.json)"
    if [ ! -f "$node/node_modules/.package-lock.json" ] || [ "$node/package-lock.json" -nt "$node/node_modules/.package-lock.json" ]; then
        echo "--- npm ci (clients/node)"
        (cd "$node" && npm ci --no-audit --no-fund --loglevel=error)
        echo "$built" >"$node/node_modules/.leaseq-built" # its prepare script built dist/
    fi
    if [ "$(cat "$node/node_modules/.leaseq-built" 2>/dev/null)" != "$built" ]; then
        echo "--- npm run build (clients/node)"
        (cd "$node" && npm run --silent build)
        echo "$built" >"$node/node_modules/.leaseq-built"
    fi
}

[ "$#" -gt 0 ] || set -- python node
for part in "$@"; do
    case "$part" in
        python) setup_python ;;
        node) setup_node ;;
        traces) setup_traces ;;
        *) echo "clients/setup.sh: unknown part $part (python, node, traces)" >&2; exit 2 ;;
    esac
done
