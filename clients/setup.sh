#!/usr/bin/env bash
# Installs what the client suites need, each part only when missing or out of
# date (a stamp of its manifest):
#
#   clients/setup.sh python   clients/python/.venv: the package's wheel
#                             (`python -m build`: sdist, then the wheel from
#                             it) and its test extras (clients/run-tests.sh)
#   clients/setup.sh node     clients/node/node_modules (`npm ci`) and the
#                             package built (TypeScript to dist/)
#   clients/setup.sh node-installed
#                             clients/node/.installed: a fresh project with
#                             the `npm pack` tarball installed, where the
#                             Node suite runs (clients/run-tests.sh)
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

# The package as users get it: `python -m build` makes the sdist and, from
# the sdist alone, the wheel (in clients/python/dist/); the venv gets the
# wheel with its test extras, not the sources (no editable install), so the
# suite tests what a user installs (tests/conftest.py checks that `leaseq`
# is the installed one). Built from a copy: setuptools writes build/ and
# *.egg-info beside its sources. Redone when the package's files change.
setup_python() {
    make_venv "$py/.venv"
    local stamp
    stamp="$( (cd "$py" && find pyproject.toml README.md LICENSE leaseq -type f ! -path '*/__pycache__/*' | sort | xargs cat) | cksum | cut -d' ' -f1)"
    if [ "$(cat "$py/.venv/.leaseq-deps" 2>/dev/null)" != "$stamp" ]; then
        echo "--- python -m build (clients/python: sdist, then the wheel from it); pip install the wheel[test]"
        "$py/.venv/bin/python" -m pip install --quiet --disable-pip-version-check build
        local stage
        stage="$(mktemp -d "${TMPDIR:-/tmp}/leaseq-pybuild.XXXXXX")"
        # -L: LICENSE is a link to the repository's.
        (cd "$py" && cp -RL pyproject.toml README.md LICENSE leaseq "$stage/")
        find "$stage" -name __pycache__ -prune -exec rm -rf {} +
        rm -rf "$py/dist"
        if ! "$py/.venv/bin/python" -m build --outdir "$py/dist" "$stage" >"$stage.log" 2>&1; then
            cat "$stage.log" >&2
            rm -rf "$stage" "$stage.log"
            echo "python -m build failed (clients/python)" >&2
            exit 1
        fi
        rm -rf "$stage" "$stage.log"
        local wheel
        wheel="$(ls "$py"/dist/leaseq-*.whl)"
        ls "$py"/dist/leaseq-*.tar.gz >/dev/null
        # The dependencies and test extras, then the wheel itself over any
        # earlier install of the same version.
        "$py/.venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel[test]"
        "$py/.venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
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

# The package as users get it: `npm pack` (in a copy laid out as in the
# repository, so the build of its prepack cannot disturb dist/ while tests
# use it), then a fresh project in clients/node/.installed/ that installs
# the tarball (`npm install`, the devDependencies the tests use beside it,
# from npm's cache when they are there) and holds copies of test/,
# harness/, examples/ and README.md: clients/run-tests.sh runs the Node
# suite there, where `@leaseq/client` is the installed tarball. Redone
# when the package's files change.
setup_node_installed() {
    setup_node
    local stamp project="$node/.installed"
    stamp="$( (cd "$node" && cat src/*.ts scripts/build.js tsconfig.json package.json package-lock.json README.md; cat "$here"/../proto/leaseq/v1/*.proto) | cksum | cut -d' ' -f1)"
    if [ "$(cat "$project/.leaseq-packed" 2>/dev/null)" != "$stamp" ]; then
        echo "--- npm pack (clients/node), npm install of the tarball into clients/node/.installed"
        local stage
        stage="$(mktemp -d "${TMPDIR:-/tmp}/leaseq-npmpack.XXXXXX")"
        mkdir -p "$stage/clients/node"
        cp -R "$here/../proto" "$stage/proto"
        cp -L "$here/../LICENSE" "$stage/LICENSE"
        (cd "$node" && cp -R package.json package-lock.json tsconfig.json README.md scripts src "$stage/clients/node/")
        ln -s "$node/node_modules" "$stage/clients/node/node_modules"
        (cd "$stage/clients/node" && npm pack --pack-destination "$stage" --no-audit --no-fund --loglevel=error >/dev/null)
        local tarball
        tarball="$(cd "$stage" && ls leaseq-client-*.tgz)"
        rm -rf "$project"
        mkdir -p "$project"
        mv "$stage/$tarball" "$project/"
        rm -rf "$stage"
        node -e '
            const fs = require("fs");
            const pkg = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
            fs.writeFileSync(process.argv[2], JSON.stringify({
              name: "leaseq-node-suite", version: "1.0.0", private: true,
              dependencies: { "@leaseq/client": "file:" + process.argv[3] },
              devDependencies: pkg.devDependencies,
            }, null, 2));' "$node/package.json" "$project/package.json" "$tarball"
        (cd "$project" && npm install --prefer-offline --no-audit --no-fund --loglevel=error)
        echo "$stamp" >"$project/.leaseq-packed"
    fi
    # The tests themselves, always current (a copy: in clients/node they
    # would import the package's own dist/ by its name).
    rm -rf "$project/test" "$project/harness" "$project/examples"
    (cd "$node" && cp -R test harness examples README.md "$project/")
}

[ "$#" -gt 0 ] || set -- python node
for part in "$@"; do
    case "$part" in
        python) setup_python ;;
        node) setup_node ;;
        node-installed) setup_node_installed ;;
        traces) setup_traces ;;
        *) echo "clients/setup.sh: unknown part $part (python, node, node-installed, traces)" >&2; exit 2 ;;
    esac
done
