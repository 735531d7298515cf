#!/usr/bin/env bash
# leaseq's own enqueue statement as the commit floor runs its insert: pgbench,
# open loop at RATE, 4 clients, prepared with the settings of the broker's
# hot-path connections (a generic plan, no sequential scans), each
# transaction one job inserted already leased (the hand-off path of a light
# load): crates/server/src/store/sql/enqueue_one.sql, what the broker runs
# for one job, or with SQL=FILE another statement with the same parameters
# (enqueue.sql takes them as one-element arrays). Next to
# ../shared/anchors/commit-floor.sh (a one-row insert) and `leaseq bench
# --scenario ping` (the gRPC hop), it splits an Enqueue call's time at light
# load into PostgreSQL's part and the rest (docs/BENCHMARKS.md, "The hops
# measured apart").
#   usage: scripts/bench/statement-floor.sh DATABASE_URL [RATE=1000] [SECONDS=10]
#   env:   SQL=FILE (default: enqueue_one.sql)
# Prints one JSON line like commit-floor.sh's: rate, p50_ms, p90_ms, p99_ms.
# Its jobs go to a queue of their own, `statement-floor`, leased to a broker
# id that no broker has; that queue and its jobs are deleted at the end, so
# run it against a benchmark database only. Run it as a user that
# can connect with that URL (e.g. under `runuser -u postgres --`).
set -euo pipefail
URL=${1:?DATABASE_URL}; RATE=${2:-1000}; SECS=${3:-10}
SQL=${SQL:-$(dirname "$0")/../../crates/server/src/store/sql/enqueue_one.sql}
d=$(mktemp -d); chmod 755 "$d"
cleanup() {
  rm -rf "$d"
  psql -qX "$URL" -c "delete from leaseq.jobs where queue = 'statement-floor'; delete from leaseq.queues where name = 'statement-floor'" >/dev/null 2>&1 || true
}
trap cleanup EXIT
psql -qX "$URL" -c "insert into leaseq.queues (name) values ('statement-floor') on conflict do nothing" >/dev/null
# The statement with its parameters as literals (a 100-byte payload, a 30 s
# lease, hand-off on): one-element arrays for enqueue.sql's, plain values for
# enqueue_one.sql's.
sed -e 's/--.*$//' \
    -e "s/\$14::uuid/'00000000-0000-0000-0000-00000000f100'::uuid/" \
    -e "s/\$15::uuid\[\]/array['00000000-0000-0000-0000-00000000f200'::uuid]/" \
    -e "s/\$15::uuid/'00000000-0000-0000-0000-00000000f200'::uuid/" \
    -e 's/\$1::uuid\[\]/array[gen_random_uuid()]/' \
    -e "s/\$2::text\[\]/array['statement-floor']/" \
    -e 's/\$3::int4\[\]/array[0]/' \
    -e 's/\$4::timestamptz\[\]/array[null::timestamptz]/' \
    -e 's/\$5::int8\[\]/array[0::int8]/' \
    -e "s/\$6::bytea\[\]/array[convert_to(repeat('x', 100), 'UTF8')]/" \
    -e "s/\$7::text\[\]/array['{}']/" \
    -e 's/\$8::int4\[\]/array[5]/' \
    -e 's/\$9::text\[\]/array[null::text]/' \
    -e 's/\$10::int8\[\]/array[null::int8]/' \
    -e 's/\$11::bool\[\]/array[true]/' \
    -e 's/\$12::int8\[\]/array[30000::int8]/' \
    -e "s/\$13::text\[\]/array['statement-floor']/" \
    -e 's/\$1::uuid/gen_random_uuid()/' \
    -e "s/\$2::text/'statement-floor'::text/" \
    -e 's/\$3::int4/0::int4/' \
    -e 's/\$4::timestamptz/null::timestamptz/' \
    -e 's/\$5::int8/0::int8/' \
    -e "s/\$6::bytea/convert_to(repeat('x', 100), 'UTF8')/" \
    -e "s/\$7::text/'{}'::text/" \
    -e 's/\$8::int4/5::int4/' \
    -e 's/\$9::text/null::text/' \
    -e 's/\$10::int8/null::int8/' \
    -e 's/\$11::bool/true/' \
    -e 's/\$12::int8/30000::int8/' \
    -e "s/\$13::text/'statement-floor'::text/" \
    "$SQL" | tr '\n' ' ' | sed -e 's/ *$/;\n/' > "$d/enqueue.sql"
if grep -q '\$[0-9]' "$d/enqueue.sql"; then echo '{"error":"a parameter of the statement was not substituted"}'; exit 1; fi
(cd "$d" && PGOPTIONS="-c plan_cache_mode=force_generic_plan -c enable_seqscan=off" \
  pgbench -n -M prepared -c 4 -j 2 -T "$SECS" -R "$RATE" -l -f enqueue.sql "$URL" >"$d/out" 2>&1) \
  || { echo "{\"error\":\"pgbench failed: $(tail -1 "$d/out" | tr '"' "'")\"}"; exit 1; }
cat "$d"/pgbench_log.* | awk 'NF>=7 {print ($3-$7)/1000.0}' | sort -n | awk -v rate="$RATE" '
  {v[NR]=$1} END {if (NR==0) {print "{\"error\":\"no transactions logged\"}"; exit 1}
  printf "{\"rate\":%s,\"transactions\":%d,\"p50_ms\":%.3f,\"p90_ms\":%.3f,\"p99_ms\":%.3f}\n", rate, NR, v[int(NR*0.5)+1], v[int(NR*0.9)+1], v[int(NR*0.99)+1]}'
