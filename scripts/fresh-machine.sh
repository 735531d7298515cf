#!/usr/bin/env bash
# Times the README's test command as on a fresh machine (the "How long it
# takes" table): removes the suite's Debian packages (./test.sh installs them
# again) and the clusters a suite run leaves for the next (/dev/shm, /tmp), then clones this
# repository's HEAD into a new 0700 directory under /root and runs
# ./test.sh there with empty cargo, pip, npm and Go caches. Run as root, with
# no PostgreSQL of the suite's running. Prints the exit code, the wall time
# and the script's own step times; the clone is left for inspection.
#
#   scripts/fresh-machine.sh
set -u
[ "$(id -u)" = 0 ] || { echo "run as root (it removes and reinstalls packages)" >&2; exit 2; }
repo="$(cd "$(dirname "$0")/.." && pwd)"
apt-get remove -y -q haproxy faketime libfaketime chromium chromium-driver prometheus \
    golang-go protobuf-compiler >/dev/null 2>&1
# The suite's caches a later run reuses: its shared cluster and the
# private clusters' template (under /dev/shm, or /tmp without a tmpfs).
rm -rf /dev/shm/leaseq-test-* /tmp/leaseq-test-pg /tmp/leaseq-pg-template-*
root="$(mktemp -d /root/fresh.XXXXXX)"
chmod 700 "$root"
export CARGO_HOME="$root/cargo-home" PIP_CACHE_DIR="$root/pip-cache" \
    npm_config_cache="$root/npm-cache" GOCACHE="$root/go-cache" GOPATH="$root/gopath"
mkdir -p "$CARGO_HOME" "$PIP_CACHE_DIR" "$npm_config_cache" "$GOCACHE"
# The toolchain is the machine's (rustup's); the registry and its crates are not.
ln -s "$HOME/.cargo/bin" "$CARGO_HOME/bin"
git clone -q "$repo" "$root/leaseq"
cd "$root/leaseq" || exit 2
start=$(date +%s)
./test.sh >"$root/test.log" 2>&1
rc=$?
echo "rc=$rc wall $(($(date +%s) - start)) s (log: $root/test.log)"
sed -n '/^--- wall time of each step/,$p' "$root/test.log"
exit "$rc"
