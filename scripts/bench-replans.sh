#!/usr/bin/env bash
# Does a VACUUM (or ANALYZE) of leaseq.jobs make the hot statements re-plan?
# pg_stat_statements' plans counters of the enqueue, ack and lease statements,
# 5 s apart, around a manual VACUUM and an ANALYZE, under a light latency run
# (200 jobs/s; the broker's own vacuum off). docs/BENCHMARKS.md, "The tail at
# 1,000 jobs/s". Run as root; a release build.
#   usage: scripts/bench-replans.sh
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd); BIN=${BIN:-$ROOT/target/release/leaseq}; D=/tmp/leaseq-bench-replans-pg
PGB=${LEASEQ_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}
pkill -f 'leaseq[^ ]* serve'; sleep 1; runuser -u postgres -- $PGB/pg_ctl -D $D/data stop -m fast >/dev/null 2>&1; rm -rf $D
LEASEQ_DATA_DIR=$D LEASEQ_LISTEN=127.0.0.1:50061 RUST_LOG=warn timeout 8 $BIN serve > "$D.broker.log" 2>&1; sleep 1
runuser -u postgres -- $PGB/pg_ctl -D $D/data -l $D/pg2.log -o "-k $D/run -c listen_addresses= -c max_connections=300 -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_planning=on" start -w >/dev/null
U="postgres://leaseq@localhost:5432/leaseq?host=$D/run"
P() { runuser -u postgres -- psql -qAtX "$U" -c "$1"; }
P "create extension if not exists pg_stat_statements" >/dev/null
LEASEQ_VACUUM_INTERVAL=0 DATABASE_URL="$U" LEASEQ_LISTEN=127.0.0.1:50061 RUST_LOG=warn $BIN serve > "$D.broker.log" 2>&1 & A=$!; sleep 3
snap() { echo "-- $1"; P "select plans, calls, left(regexp_replace(query,'\s+',' ','g'),40) from pg_stat_statements where query like '%Inserts new jobs%' or query like '%Completes jobs%' or query like '%Leases jobs for many%' order by 3"; }
$BIN bench --addr http://127.0.0.1:50061 --scenario latency --rate 200 --consumers 2 --duration 40 > "$D.bench.log" 2>&1 & BENCH=$!
sleep 10; snap "t=10"; sleep 5; snap "t=15 (no vacuum)"; P "vacuum leaseq.jobs"; echo "-- vacuum done"; sleep 3; snap "t=18 (after vacuum)"; sleep 7; snap "t=25 (no vacuum)"; P "analyze leaseq.jobs"; echo "-- analyze done"; sleep 3; snap "t=28 (after analyze)"
wait "$BENCH"; kill $A; sleep 1; runuser -u postgres -- $PGB/pg_ctl -D $D/data stop -m fast >/dev/null
