#!/usr/bin/env bash
# What one light-load insert costs PostgreSQL, by the shape of the row and the
# statement (docs/BENCHMARKS.md, "The job row's cost at 100/s"). On a fresh
# durable cluster (the embedded cluster's settings, pg_stat_statements) with
# leaseq's schema (made by `leaseq migrate`), pgbench sends
# one insert at a time at RATE per second (open loop, prepared, one client),
# so each lands on cold caches as the broker's do at light load; for each
# variant, in ROUNDS rounds, it prints pg_stat_statements' mean execution
# time (the commit's WAL flush is not in it). Variants:
#   enqueue    enqueue_one.sql's statement (lateral join on the queue, ON
#              CONFLICT, RETURNING), a job handed off as leased
#   row        a plain insert of the same leased row into leaseq.jobs
#   no-checks  the same into a copy of leaseq.jobs without its two CHECKs
#   pkey-only  the same into a copy with its CHECKs but only the primary key
#   floor      the floor broker's row: (id identity, queue, payload)
# and, with ALL=1, enqueue's statement without one part each:
#   enqueue-no-conflict   without its ON CONFLICT clause
#   enqueue-no-returning  without its RETURNING list
#   enqueue-no-join       without the lateral join on leaseq.queues (the
#                         lease set as the join would have set it)
# Run as root (PostgreSQL runs as postgres); PERF=1 also records every
# PostgreSQL process with perf for 10 s of each run (OUTDIR/VARIANT-N.data).
#   usage: scripts/bench/insert-shape.sh OUTDIR [BIN] [ROUNDS=3]
#   env:   RATE=100, SECS=14, QUICK=1 (SECS=2), KEEP=1 (scripts/bench/lib.sh)
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
[ -n "${2:-}" ] && BIN=$2
ROUNDS=${3:-3}; RATE=${RATE:-100}
bench_init "${1:?usage: scripts/bench/insert-shape.sh OUTDIR [BIN] [ROUNDS]}"
SECS=$(secs "${SECS:-14}")
mkdir -p "$OUT/sql"
chmod 755 "$OUT" "$OUT/sql"
private_cluster pg -c shared_preload_libraries=pg_stat_statements
DATABASE_URL=$U "$BIN" migrate >"$OUT/migrate.log" 2>&1 || { echo "migrate failed: $OUT/migrate.log" >&2; exit 1; }
P() { psql_at "$U" "$@"; }
P -c "create extension pg_stat_statements" \
  -c "insert into leaseq.queues (name) values ('bench')" \
  -c "create table floor_jobs (id bigint generated always as identity primary key, queue text not null, payload bytea not null)" \
  -c "create schema shape" \
  -c "create table shape.no_checks (like leaseq.jobs including defaults including indexes)" \
  -c "create table shape.pkey_only (like leaseq.jobs including defaults including constraints)" \
  -c "alter table shape.pkey_only add primary key (id)"
# A time-ordered id, as the broker's UUIDv7 ids are (each insert goes to the
# right-hand end of the primary key).
ID="lpad(to_hex((extract(epoch from clock_timestamp()) * 1000000)::int8), 32, '0')::uuid"
ROW="($ID, 'bench', now(), '\\x0102', 'leased', 1, '00000000-0000-0000-0000-000000000001', now() + interval '30s', '00000000-0000-0000-0000-000000000002', 'c')"
COLS="(id, queue, run_at, payload, state, attempt, lease_token, lease_expires_at, lease_broker, leased_by)"
echo "insert into leaseq.jobs $COLS values $ROW;" >"$OUT/sql/row.sql"
echo "insert into shape.no_checks $COLS values $ROW;" >"$OUT/sql/no-checks.sql"
echo "insert into shape.pkey_only $COLS values $ROW;" >"$OUT/sql/pkey-only.sql"
echo "insert into floor_jobs (queue, payload) values ('bench', '\\x0102') returning id;" >"$OUT/sql/floor.sql"
# enqueue_one.sql with the parameters of a job handed off to a stream.
sed -e 's/^--.*//' \
    -e "s/\$1::uuid/$ID/; s/\$2::text/'bench'::text/; s/\$3::int4/0::int4/; s/\$4::timestamptz/null::timestamptz/" \
    -e "s/\$5::int8/0::int8/; s/\$6::bytea/'\\\\x0102'::bytea/; s/\$7::text/'{}'::text/; s/\$8::int4/null::int4/" \
    -e "s/\$9::text/null::text/; s/\$10::int8/null::int8/; s/\$11::bool/true/; s/\$12::int8/null::int8/" \
    -e "s/\$13::text/'c'::text/; s/\$14::uuid/'00000000-0000-0000-0000-000000000002'::uuid/" \
    -e "s/\$15::uuid/'00000000-0000-0000-0000-000000000001'::uuid/" \
    "$BENCH_REPO/crates/server/src/store/sql/enqueue_one.sql" | grep -v '^$' >"$OUT/sql/enqueue.sql"
echo ";" >>"$OUT/sql/enqueue.sql"
grep -v '^on conflict' "$OUT/sql/enqueue.sql" >"$OUT/sql/enqueue-no-conflict.sql"
sed '/^returning/,$d' "$OUT/sql/enqueue.sql" >"$OUT/sql/enqueue-no-returning.sql"
echo ";" >>"$OUT/sql/enqueue-no-returning.sql"
sed -e '/^left join lateral/,/^) h on true/c\
cross join (select 30000::int8 as lease_ms) h' "$OUT/sql/enqueue.sql" >"$OUT/sql/enqueue-no-join.sql"
VARIANTS="enqueue row no-checks pkey-only floor"
[ -n "${ALL:-}" ] && VARIANTS="$VARIANTS enqueue-no-conflict enqueue-no-returning enqueue-no-join"
: >"$OUT/results.txt"
for r in $(seq "$ROUNDS"); do
    for v in $VARIANTS; do
        P -c "truncate leaseq.jobs, floor_jobs, shape.no_checks, shape.pkey_only" -c checkpoint \
          -c "select pg_stat_statements_reset()" >/dev/null
        pp=
        if [ -n "${PERF:-}" ]; then
            (sleep 3; exec perf record -q -F 15000 -p "$(pg_pids)" \
                -o "$OUT/$v-$r.data" -- sleep 10 >/dev/null 2>&1) &
            pp=$!; track "$pp"
        fi
        run_wait "$OUT/pgbench-$v-$r.log" "${AS_PG[@]}" pgbench -n -M prepared -R "$RATE" -T "$SECS" -c 1 \
            -f "$OUT/sql/$v.sql" "$U"
        [ -n "$pp" ] && wait "$pp" && forget "$pp"
        P -c "select '$v', $r, calls, round(mean_exec_time::numeric * 1000, 1)
              from pg_stat_statements where query ~* '^\s*insert' order by calls desc limit 1" |
            awk -F'|' '{printf "%-20s round %s: %s inserts, %s us each\n", $1, $2, $3, $4}' | tee -a "$OUT/results.txt"
    done
done
