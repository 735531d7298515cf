#!/usr/bin/env bash
# A million keys (issue 33's third target; docs/BENCHMARKS.md, "A million
# keys"): the table size per job and the lease round's cost of a queue of
# JOBS (default 1,000,000) jobs each with its own key, against the same
# queue with jobs without keys.
#
# One durable cluster with pg_stat_statements and a broker on it, warmed.
# Then, for each mode of MODES in turn, ROUNDS times:
#   1. leaseq.jobs is emptied (truncate) and JOBS jobs are inserted by one
#      SQL statement into a new queue, as the broker inserts them (uuid_v7
#      ids, run_at = enqueued_at = now(), 100-byte payload, no headers):
#      with key 'k<i>' (a distinct key each, as `leaseq bench --keys`
#      names them) or none; the queue ordered by key (key_concurrency 1)
#      or not;
#   2. VACUUM ANALYZE and CHECKPOINT; the table's size: the heap, each
#      index, and pg_total_relation_size (heap, indexes, TOAST), per job;
#      with keys, also the size of a copy of the key index built in one go
#      (what a REINDEX would leave), built and dropped;
#   3. the statements' counters reset, then a drain: `leaseq bench
#      --producers 0` (4 Consume streams x 256 credit, acks on the stream)
#      for DRAIN seconds, which leases from the million-job backlog and
#      does not empty it; the lease statement's calls, rows and mean
#      execution time (pg_stat_statements): µs per round and per job; the
#      drain's jobs/s and PostgreSQL CPU per job.
# Modes: plain (no keys, unordered), keys (a key each, unordered), ordered
# (no keys, ordered by key: the locked lease path), okeys (a key each,
# ordered by key). One JSON line per mode and round in OUTDIR/results.jsonl.
# Run as root.
#   usage: scripts/bench/million-keys.sh OUTDIR [ROUNDS=1]
#   env:   BIN, JOBS (1000000), DRAIN (15), MODES ("plain keys ordered okeys"),
#          QUICK=1 (JOBS 20000, 2 s drains), KEEP=1 (scripts/bench/lib.sh)
# Stops only what it started, by pid; ports are picked free.
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${2:-1}
bench_init "${1:?usage: scripts/bench/million-keys.sh OUTDIR [ROUNDS]}"
if [ -n "${QUICK:-}" ]; then JOBS=${JOBS:-20000}; else JOBS=${JOBS:-1000000}; fi
DRAIN=$(secs "${DRAIN:-15}")
private_cluster pg -c shared_preload_libraries=pg_stat_statements \
    -c pg_stat_statements.track=top -c pg_stat_statements.max=1000
psql_at "$U" -c "create extension if not exists pg_stat_statements" >/dev/null
serve broker
A=$S
A_PID=$S_PID
run_json warm "$BIN" bench --json --addr "$A" --duration "$(secs 10)"
psql_at "$U" -c checkpoint >/dev/null

# fill QUEUE KEYED ORDERED: empties leaseq.jobs, then JOBS jobs into QUEUE.
fill() {
  local q=$1 keyed=$2 ordered=$3 key=null
  [ "$keyed" = 1 ] && key="'k' || (i - 1)"
  psql_at "$U" -v ON_ERROR_STOP=1 -c "truncate leaseq.jobs" -c "
    insert into leaseq.queues (name, ordered_by_key) values ('$q', $([ "$ordered" = 1 ] && echo true || echo false))
    on conflict (name) do update set ordered_by_key = excluded.ordered_by_key" -c "
    insert into leaseq.jobs (id, queue, priority, run_at, payload, headers, key)
    select leaseq.uuid_v7(), '$q', 0, now(), convert_to(rpad(i::text, 100, '.'), 'UTF8'), '{}', $key
    from generate_series(1, $JOBS) as i" -c "vacuum analyze leaseq.jobs" -c checkpoint >/dev/null ||
    { log "fill of $q failed"; exit 1; }
}

# sizes: the table's sizes as a JSON object (bytes, and bytes per job).
sizes() {
  psql_at "$U" -c "
    select json_build_object(
      'rows', (select count(*) from leaseq.jobs),
      'heap_bytes', pg_relation_size('leaseq.jobs'),
      'total_bytes', pg_total_relation_size('leaseq.jobs'),
      'heap_per_job', round(pg_relation_size('leaseq.jobs')::numeric / $JOBS, 1),
      'total_per_job', round(pg_total_relation_size('leaseq.jobs')::numeric / $JOBS, 1),
      'indexes_per_job', (select json_object_agg(c.relname, round(pg_relation_size(c.oid)::numeric / $JOBS, 1))
          from pg_index i join pg_class c on c.oid = i.indexrelid
          where i.indrelid = 'leaseq.jobs'::regclass))"
}

# compact KEYED: what the key index would take built in one go (sorted,
# its pages filled to the fillfactor) rather than row by row as the
# inserts came: a copy built and dropped, bytes per job as JSON.
compact() {
  [ "$1" = 1 ] || { echo '{}'; return; }
  psql_at "$U" -v ON_ERROR_STOP=1 <<SQL | grep '^{'
select replace(pg_get_indexdef('leaseq.jobs_key'::regclass), 'INDEX jobs_key ON', 'INDEX mk_key_compact ON') \gexec
select json_build_object('key_index_compact_per_job',
    round(pg_relation_size('leaseq.mk_key_compact')::numeric / $JOBS, 1));
drop index leaseq.mk_key_compact;
SQL
}

# lease_cost: the lease statement's counters since the last reset, as JSON.
lease_cost() {
  psql_at "$U" -c "
    select json_build_object(
      'lease_rounds', sum(calls),
      'lease_jobs', sum(rows),
      'jobs_per_round', round(sum(rows)::numeric / nullif(sum(calls), 0), 1),
      'lease_us_per_round', round((sum(total_exec_time) * 1000 / nullif(sum(calls), 0))::numeric, 1),
      'lease_us_per_job', round((sum(total_exec_time) * 1000 / nullif(sum(rows), 0))::numeric, 2),
      'lease_blks_per_job', round(sum(shared_blks_hit + shared_blks_read)::numeric / nullif(sum(rows), 0), 2),
      'lease_wal_per_job', round(sum(wal_bytes) / nullif(sum(rows), 0), 1))
    from pg_stat_statements where query like '-- Leases jobs for many streams%'"
}

for r in $(seq "$ROUNDS"); do
  for mode in ${MODES:-plain keys ordered okeys}; do
    case $mode in
      plain) keyed=0; ordered=0 ;;
      keys) keyed=1; ordered=0 ;;
      ordered) keyed=0; ordered=1 ;;
      okeys) keyed=1; ordered=1 ;;
      *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    q=mk-$mode-$r
    log "fill $q: $JOBS jobs, keyed=$keyed ordered=$ordered"
    fill "$q" "$keyed" "$ordered"
    size=$(sizes)
    log "sizes $q: $size"
    size=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(json.loads(sys.argv[2])); print(json.dumps(d))' "$size" "$(compact "$keyed")")
    psql_at "$U" -c "select pg_stat_statements_reset()" >/dev/null
    bench "drain-$mode" --addr "$A" --queue "$q" --producers 0 --duration "$DRAIN" \
      --broker-pid "$A_PID" --postgres-pid "$PM" || true
    cost=$(lease_cost)
    log "lease $q: $cost"
    LINE=$(printf '{"run": "million-%s", "mode": "%s", "round": %s, "jobs_in_table": %s}' \
      "$mode" "$mode" "$r" "$JOBS")
    emit "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(json.loads(sys.argv[2])); print(json.dumps(d))' "$size" "$cost")"
  done
done
log "done: $RESULTS"
