#!/usr/bin/env bash
# Past one PostgreSQL, measured on one machine (docs/BENCHMARKS.md, "Queues
# over three clusters"): starts three private durable PostgreSQL clusters
# (the embedded cluster's settings, as the postgres user, Unix sockets only),
# then runs, one after another, REPS times each:
#
#   replicas  1, 2 and 3 broker replicas over one database (cluster a), the
#             load spread over them (`leaseq bench --addr A,B,C`), with the
#             raw-SQL baseline on the same cluster as the sitting's anchor;
#   spread    one broker over ONE database and one broker over the THREE
#             clusters, same load (6 queues, 2 per cluster), alternating,
#             after the raw-SQL baseline on cluster a (the anchor):
#             each cluster's commits (pg_stat_database.xact_commit of the
#             leaseq database) and WAL bytes (pg_stat_wal.wal_bytes) during
#             the run, and broker CPU per job.
#
# One JSON line per run in OUTDIR/results.jsonl (the bench's summary plus
# the per-cluster deltas); a table of the spread runs at the end. Loopback
# only; every run is bounded by DURATION; everything this script started is
# stopped by its pid (and pg_ctl) at the end (scripts/bench/lib.sh). Run as
# root.
#   usage: scripts/bench/clusters.sh OUTDIR [BIN]
#   env:   DURATION (s, default 15), REPS (default 2), ONLY=replicas|spread,
#          RATE (jobs/s of the spread's fixed-rate runs, default 3000),
#          PERF=1 (perf record of the broker during each spread run:
#          OUTDIR/perf-RUN.data), PGSS=1 (pg_stat_statements on every
#          cluster: calls, rows and time per statement of each spread run,
#          summed over the clusters, in OUTDIR/pgss-RUN.txt),
#          SHARED=1 (the three "clusters" are three databases of ONE
#          PostgreSQL cluster, a: the broker's routing and its per-cluster
#          batchers as over three clusters, without three postmasters on
#          the same cores; WAL shares are then not per cluster),
#          LEASEQ_PG_BIN (initdb, pg_ctl, postgres), QUICK=1 (2 s runs),
#          KEEP=1 (the clusters' directories are kept)
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
[ -n "${2:-}" ] && BIN=$2
bench_init "${1:?usage: scripts/bench/clusters.sh OUTDIR [BIN]}"
DURATION=$(secs "${DURATION:-15}")
REPS=${REPS:-2}
RATE=${RATE:-3000}
ONLY=${ONLY:-}

# --- three private clusters: a, b, c
NAMES=(a b c)
DB=(leaseq leaseq leaseq)
[ -n "${SHARED:-}" ] && DB=(leaseq leaseq_b leaseq_c)
URL=()
PMS=()
CDIR=()
for k in 0 1 2; do
    if [ -n "${SHARED:-}" ] && [ "$k" -gt 0 ]; then
        CDIR[k]=${CDIR[0]}
        URL[k]="postgres://leaseq@localhost:5432/${DB[k]}?host=${CDIR[0]}/run"
        PMS[k]=${PMS[0]}
        continue
    fi
    private_cluster "pg$k" ${PGSS:+-c shared_preload_libraries=pg_stat_statements}
    CDIR[k]=$C_DIR
    for db in single replicas ${SHARED:+leaseq_b leaseq_c}; do
        psql_at "${U/\/leaseq\?//postgres?}" -c "create database $db" >/dev/null
    done
    if [ -n "${PGSS:-}" ]; then
        for db in leaseq single replicas ${SHARED:+leaseq_b leaseq_c}; do
            psql_at "${U/\/leaseq\?//$db?}" -c "create extension pg_stat_statements" >/dev/null
        done
    fi
    URL[k]=$U
    PMS[k]=$PM
done
url_of() { echo "postgres://leaseq@localhost:5432/$2?host=${CDIR[$1]}/run"; }
PSQL() { psql_at "$1" -c "$2"; }
log "clusters up: pids ${PMS[*]} ($("$(pg_bindir)/postgres" --version))"
PSQL "${URL[0]}" "show max_wal_size; show checkpoint_timeout; show synchronous_commit; show fsync; show shared_buffers" | tr '\n' ' ' | tee -a "$OUT/log"
echo

# --- brokers
# start_broker NAME ARGS...: a broker on a free port (`serve ARGS`), its
# pid in LAST, its URL in LAST_URL.
start_broker() {
    local name=$1 port
    shift
    free_port; port=$PORT
    spawn "$OUT/broker-$name.log" env RUST_LOG=warn "$BIN" serve --listen "127.0.0.1:$port" "$@"
    LAST=$SPAWNED
    LAST_URL=http://127.0.0.1:$port
    wait_listen "$port" "$LAST" "$OUT/broker-$name.log"
}

# stats K: "commits wal_bytes" of cluster K's leaseq database now.
stats() { PSQL "${URL[$1]}" "select (select xact_commit from pg_stat_database where datname = '${DB[$1]}'), (select wal_bytes from pg_stat_wal)" | tr '|' ' '; }

# run NAME ARGS...: one run of DURATION (lib.sh's bench), its summary in
# results.jsonl.
run() {
    local name=$1
    shift
    bench "$name" --duration "$DURATION" "$@"
}

if [ -z "$ONLY" ] || [ "$ONLY" = replicas ]; then
    # --- replicas 1, 2, 3 over one database
    U=$(url_of 0 replicas)
    start_broker r1 --database-url "$U"
    R1=$LAST; A=$LAST_URL
    start_broker r2 --database-url "$U"
    R2=$LAST; B=$LAST_URL
    start_broker r3 --database-url "$U"
    R3=$LAST; C=$LAST_URL
    run_json warm "$BIN" bench --addr "$A" --scenario latency --rate 500 --duration "$(secs 3)" --json
    for rep in $(seq "$REPS"); do
        run "baseline-$rep" --scenario baseline --database-url "$U" --batch 100 --postgres-pid "${PMS[0]}"
        run "replicas1-tp-$rep" --addr $A --producers 6 --consumers 6 --broker-pid $R1,$R2,$R3 --postgres-pid "${PMS[0]}"
        run "replicas2-tp-$rep" --addr $A,$B --producers 6 --consumers 6 --broker-pid $R1,$R2,$R3 --postgres-pid "${PMS[0]}"
        run "replicas3-tp-$rep" --addr $A,$B,$C --producers 6 --consumers 6 --broker-pid $R1,$R2,$R3 --postgres-pid "${PMS[0]}"
        run "replicas1-lat-$rep" --addr $A --scenario latency --rate 1000 --consumers 6 --broker-pid $R1,$R2,$R3 --postgres-pid "${PMS[0]}"
        run "replicas2-lat-$rep" --addr $A,$B --scenario latency --rate 1000 --consumers 6 --broker-pid $R1,$R2,$R3 --postgres-pid "${PMS[0]}"
        run "replicas3-lat-$rep" --addr $A,$B,$C --scenario latency --rate 1000 --consumers 6 --broker-pid $R1,$R2,$R3 --postgres-pid "${PMS[0]}"
    done
    stop "$R1" "$R2" "$R3"
fi

if [ -z "$ONLY" ] || [ "$ONLY" = spread ]; then
    # --- one database vs three clusters, same load
    start_broker one --database-url "$(url_of 0 single)"
    ONE=$LAST; ONE_URL=$LAST_URL
    start_broker three --database-url "a=${URL[0]}" --database-url "b=${URL[1]}" --database-url "c=${URL[2]}"
    THREE=$LAST; THREE_URL=$LAST_URL
    run_json warm "$BIN" bench --addr "$ONE_URL" --queues 6 --scenario latency --rate 500 --duration "$(secs 3)" --json
    run_json warm "$BIN" bench --addr "$THREE_URL" --queues 6 --scenario latency --rate 500 --duration "$(secs 3)" --json
    ALLPM="${PMS[0]},${PMS[1]},${PMS[2]}"
    # The clusters whose pg_stat_statements are read (once each).
    PGSS_K="0 1 2"
    if [ -n "${SHARED:-}" ]; then
        ALLPM=${PMS[0]}
        PGSS_K=0
    fi
    spread() { # name url pid bench-args...
        local name=$1 url=$2 pid=$3 k before after
        shift 3
        before=()
        for k in 0 1 2; do before[k]=$(stats $k); done
        # The one-database broker's own database is not `leaseq`: its
        # commits are read from `single` on cluster a.
        local single_before single_after
        single_before=$(PSQL "${URL[0]}" "select xact_commit from pg_stat_database where datname = 'single'")
        if [ -n "${PGSS:-}" ]; then
            for k in $PGSS_K; do PSQL "${URL[k]}" "select pg_stat_statements_reset()" >/dev/null; done
        fi
        log "bench $name"
        local perf=
        if [ -n "${PERF:-}" ] && command -v perf >/dev/null; then
            # The broker's profile over the measured window (after the
            # bench's own setup of about a second).
            (sleep 2 && exec perf record -q -F 499 -g -p "$pid" -o "$OUT/perf-$name.data" -- sleep $((DURATION - 4))) >/dev/null 2>&1 &
            perf=$!
            track "$perf"
        fi
        run_json "$name" "$BIN" bench --json --payload-bytes 100 --duration "$DURATION" --addr "$url" \
            --queues 6 --consumers 6 --broker-pid "$pid" --postgres-pid "$ALLPM" "$@"
        [ -n "$perf" ] && wait "$perf" && forget "$perf"
        if [ -n "${PGSS:-}" ]; then
            # Each statement's calls, rows and execution time over the run,
            # summed over the clusters (the broker's databases: leaseq, and
            # single for the one-database broker).
            for k in $PGSS_K; do
                PSQL "${URL[k]}" "select s.calls, s.rows, round(s.total_exec_time::numeric, 1), regexp_replace(left(s.query, 60), '\s+', ' ', 'g') from pg_stat_statements s join pg_database d on d.oid = s.dbid where d.datname in ('leaseq', 'leaseq_b', 'leaseq_c', 'single') and s.calls > 0"
            done | awk -F'|' '{c[$4]+=$1; r[$4]+=$2; t[$4]+=$3} END {for (q in c) printf "%9d calls %10d rows %9.1f ms  %s\n", c[q], r[q], t[q], q}' |
                sort -rn >"$OUT/pgss-$name.txt"
        fi
        single_after=$(PSQL "${URL[0]}" "select xact_commit from pg_stat_database where datname = 'single'")
        local deltas=""
        for k in 0 1 2; do
            after=$(stats $k)
            read -r c0 w0 <<<"${before[k]}"
            read -r c1 w1 <<<"$after"
            deltas="$deltas\"${NAMES[k]}\": {\"commits\": $((c1 - c0)), \"wal_bytes\": $((w1 - w0))}, "
        done
        deltas="$deltas\"single_db_commits\": $((single_after - single_before))"
        emit "{\"clusters\": {$deltas}}"
        sleep "$GAP"
    }
    for rep in $(seq "$REPS"); do
        # The sitting's anchor: the raw-SQL pattern on cluster a (database
        # `replicas`, unused here).
        run "spread-baseline-$rep" --scenario baseline --database-url "$(url_of 0 replicas)" --batch 100 --postgres-pid "${PMS[0]}"
        # The same offered load (open loop, single Enqueue calls), then
        # flat out (EnqueueBatch of 100, one queue per batch).
        spread "one-db-rate-$rep" "$ONE_URL" "$ONE" --scenario latency --rate "$RATE"
        spread "three-clusters-rate-$rep" "$THREE_URL" "$THREE" --scenario latency --rate "$RATE"
        spread "one-db-tp-$rep" "$ONE_URL" "$ONE" --producers 6
        spread "three-clusters-tp-$rep" "$THREE_URL" "$THREE" --producers 6
    done
    stop "$ONE" "$THREE"
    python3 - "$OUT/results.jsonl" <<'EOF' | tee -a "$OUT/log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"clusters"' in l]
print(f"{'run':<24} {'jobs/s':>8} {'broker µs/job':>14} {'pg µs/job':>10}   per cluster: commits (share), WAL MB (share)")
for d in rows:
    cl = {k: v for k, v in d["clusters"].items() if isinstance(v, dict)}
    cpu = d.get("cpu_us_per_job") or {}
    line = f"{d['run']:<24} {d.get('jobs_per_s', 0):>8.0f} {cpu.get('broker') or 0:>14.1f} {cpu.get('postgres') or 0:>10.1f}  "
    if d["run"].startswith("three"):
        tc = sum(v["commits"] for v in cl.values()) or 1
        tw = sum(v["wal_bytes"] for v in cl.values()) or 1
        for k, v in cl.items():
            line += f" {k}: {v['commits']} ({3 * v['commits'] / tc:.2f}), {v['wal_bytes'] / 1e6:.1f} ({3 * v['wal_bytes'] / tw:.2f})"
        line += f"  commits/job {tc / max(d.get('jobs', 1), 1):.4f}"
    else:
        n = d['clusters']['single_db_commits']
        line += f" single db: {n} commits, cluster a WAL {cl['a']['wal_bytes'] / 1e6:.1f} MB  commits/job {n / max(d.get('jobs', 1), 1):.4f}"
    print(line)
EOF
fi
log "done"
