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
# stopped by its pid (and pg_ctl) at the end. Run as root.
#   usage: scripts/bench-clusters.sh OUTDIR [BIN]
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
#          LEASEQ_PG_BIN (initdb, pg_ctl, postgres), ROOT (default
#          /tmp/leaseq-bench-clusters: wiped first)
set -uo pipefail
OUT=${1:?usage: scripts/bench-clusters.sh OUTDIR [BIN]}
BIN=${2:-$(cd "$(dirname "$0")/.." && pwd)/target/release/leaseq}
DURATION=${DURATION:-15}
REPS=${REPS:-2}
RATE=${RATE:-3000}
ONLY=${ONLY:-}
ROOT=${ROOT:-/tmp/leaseq-bench-clusters}
PGBIN=${LEASEQ_PG_BIN:-$(dirname "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")}
mkdir -p "$OUT"
log() { echo "[$(date +%T) load $(cut -d' ' -f1 /proc/loadavg)] $*" | tee -a "$OUT/log"; }

BROKERS=()
cleanup() {
    local p k
    for p in "${BROKERS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${BROKERS[@]}"; do wait "$p" 2>/dev/null; done
    for k in 0 1 2; do
        [ -f "$ROOT/pg$k/data/postmaster.pid" ] &&
            runuser -u postgres -- "$PGBIN/pg_ctl" -D "$ROOT/pg$k/data" -m fast -w stop >/dev/null 2>&1
    done
}
trap cleanup EXIT

# --- three private clusters: a, b, c
NAMES=(a b c)
DB=(leaseq leaseq leaseq)
[ -n "${SHARED:-}" ] && DB=(leaseq leaseq_b leaseq_c)
URL=()
PM=()
rm -rf "$ROOT"
mkdir -p "$ROOT"
chmod 755 "$ROOT"
for k in 0 1 2; do
    D=$ROOT/pg$k
    port=$((54320 + k))
    if [ -n "${SHARED:-}" ] && [ "$k" -gt 0 ]; then
        URL[k]="postgres://leaseq@localhost:54320/${DB[k]}?host=$ROOT/pg0/run"
        PM[k]=${PM[0]}
        continue
    fi
    mkdir -p "$D/run"
    chown -R postgres "$D"
    runuser -u postgres -- "$PGBIN/initdb" -D "$D/data" -U leaseq --auth=trust -E UTF8 --no-locale --no-sync >"$D/initdb.log" 2>&1 || {
        echo "initdb failed: $D/initdb.log" >&2
        exit 1
    }
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$D/data" -l "$D/log" -w -o "-k $D/run -p $port \
        -c listen_addresses= -c max_connections=300 -c max_wal_size=4GB -c min_wal_size=512MB \
        -c checkpoint_timeout=15min -c wal_compression=on -c wal_buffers=16MB ${PGSS:+-c shared_preload_libraries=pg_stat_statements}" start >/dev/null || {
        echo "pg_ctl start failed: $D/log" >&2
        exit 1
    }
    for db in leaseq single replicas ${SHARED:+leaseq_b leaseq_c}; do
        runuser -u postgres -- psql -qAtX -h "$D/run" -p $port -U leaseq -d postgres -c "create database $db" >/dev/null
        if [ -n "${PGSS:-}" ]; then
            runuser -u postgres -- psql -qAtX -h "$D/run" -p $port -U leaseq -d $db -c "create extension pg_stat_statements" >/dev/null
        fi
    done
    URL[k]="postgres://leaseq@localhost:$port/leaseq?host=$D/run"
    PM[k]=$(head -1 "$D/data/postmaster.pid")
done
url_of() { echo "postgres://leaseq@localhost:$((54320 + $1))/$2?host=$ROOT/pg$1/run"; }
PSQL() { runuser -u postgres -- psql -qAtX "$1" -c "$2"; }
log "clusters up: pids ${PM[*]} ($("$PGBIN/postgres" --version))"
PSQL "${URL[0]}" "show max_wal_size; show checkpoint_timeout; show synchronous_commit; show fsync; show shared_buffers" | tr '\n' ' ' | tee -a "$OUT/log"
echo

# --- brokers
# start_broker PORT ARGS...: a broker on 127.0.0.1:PORT, pid in $LAST.
start_broker() {
    local port=$1
    shift
    RUST_LOG=warn "$BIN" serve --listen "127.0.0.1:$port" "$@" >>"$OUT/broker-$port.log" 2>&1 &
    LAST=$!
    BROKERS+=("$LAST")
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "broker on $port did not start: $OUT/broker-$port.log" >&2
    exit 1
}
stop_broker() {
    kill "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}

# stats K: "commits wal_bytes" of cluster K's leaseq database now.
stats() { PSQL "${URL[$1]}" "select (select xact_commit from pg_stat_database where datname = '${DB[$1]}'), (select wal_bytes from pg_stat_wal)" | tr '|' ' '; }

# bench NAME ARGS...: one run, its summary as one JSON line, appended to
# results.jsonl.
bench() {
    local name=$1
    shift
    log "bench $name: $*"
    "$BIN" bench --json --payload-bytes 100 --duration "$DURATION" "$@" 2>>"$OUT/bench.err" | tail -1 |
        python3 -c "import json,sys; d=json.load(sys.stdin); d['run']='$name'; print(json.dumps(d))" |
        tee -a "$OUT/results.jsonl"
    sleep 2
}

if [ -z "$ONLY" ] || [ "$ONLY" = replicas ]; then
    # --- replicas 1, 2, 3 over one database
    U=$(url_of 0 replicas)
    start_broker 50071 --database-url "$U"
    R1=$LAST
    start_broker 50072 --database-url "$U"
    R2=$LAST
    start_broker 50073 --database-url "$U"
    R3=$LAST
    A=http://127.0.0.1:50071
    B=http://127.0.0.1:50072
    C=http://127.0.0.1:50073
    "$BIN" bench --addr $A --scenario latency --rate 500 --duration 3 --json >/dev/null 2>&1 # warm-up
    for rep in $(seq "$REPS"); do
        bench "baseline-$rep" --scenario baseline --database-url "$U" --batch 100 --postgres-pid "${PM[0]}"
        bench "replicas1-tp-$rep" --addr $A --producers 6 --consumers 6 --broker-pid $R1,$R2,$R3 --postgres-pid "${PM[0]}"
        bench "replicas2-tp-$rep" --addr $A,$B --producers 6 --consumers 6 --broker-pid $R1,$R2,$R3 --postgres-pid "${PM[0]}"
        bench "replicas3-tp-$rep" --addr $A,$B,$C --producers 6 --consumers 6 --broker-pid $R1,$R2,$R3 --postgres-pid "${PM[0]}"
        bench "replicas1-lat-$rep" --addr $A --scenario latency --rate 1000 --consumers 6 --broker-pid $R1,$R2,$R3 --postgres-pid "${PM[0]}"
        bench "replicas2-lat-$rep" --addr $A,$B --scenario latency --rate 1000 --consumers 6 --broker-pid $R1,$R2,$R3 --postgres-pid "${PM[0]}"
        bench "replicas3-lat-$rep" --addr $A,$B,$C --scenario latency --rate 1000 --consumers 6 --broker-pid $R1,$R2,$R3 --postgres-pid "${PM[0]}"
    done
    for p in $R1 $R2 $R3; do stop_broker "$p"; done
fi

if [ -z "$ONLY" ] || [ "$ONLY" = spread ]; then
    # --- one database vs three clusters, same load
    start_broker 50081 --database-url "$(url_of 0 single)"
    ONE=$LAST
    start_broker 50082 --database-url "a=${URL[0]}" --database-url "b=${URL[1]}" --database-url "c=${URL[2]}"
    THREE=$LAST
    "$BIN" bench --addr http://127.0.0.1:50081 --queues 6 --scenario latency --rate 500 --duration 3 --json >/dev/null 2>&1
    "$BIN" bench --addr http://127.0.0.1:50082 --queues 6 --scenario latency --rate 500 --duration 3 --json >/dev/null 2>&1
    ALLPM="${PM[0]},${PM[1]},${PM[2]}"
    # The clusters whose pg_stat_statements are read (once each).
    PGSS_K="0 1 2"
    if [ -n "${SHARED:-}" ]; then
        ALLPM=${PM[0]}
        PGSS_K=0
    fi
    spread() { # name port pid bench-args...
        local name=$1 port=$2 pid=$3 k before after
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
        fi
        "$BIN" bench --json --payload-bytes 100 --duration "$DURATION" --addr "http://127.0.0.1:$port" \
            --queues 6 --consumers 6 --broker-pid "$pid" --postgres-pid "$ALLPM" "$@" \
            2>>"$OUT/bench.err" | tail -1 >"$OUT/last.json"
        [ -n "$perf" ] && wait "$perf"
        if [ -n "${PGSS:-}" ]; then
            # Each statement's calls, rows and execution time over the run,
            # summed over the clusters (the broker's databases: leaseq, and
            # single for the one-database broker).
            for k in $PGSS_K; do
                PSQL "${URL[k]}" "select s.calls, s.rows, round(s.total_exec_time::numeric, 1), regexp_replace(left(s.query, 60), '\s+', ' ', 'g') from pg_stat_statements s join pg_database d on d.oid = s.dbid where d.datname in ('leaseq', 'leaseq_b', 'leaseq_c', 'single') and s.calls > 0"
            done | awk -F'|' '{c[$4]+=$1; r[$4]+=$2; t[$4]+=$3} END {for (q in c) printf "%9d calls %10d rows %9.1f ms  %s\n", c[q], r[q], t[q], q}' |
                sort -rn >"$OUT/pgss-$name.txt"
        fi
        python3 -c "import json,sys; d=json.load(open('$OUT/last.json')); d['run']='$name'; print(json.dumps(d))" >"$OUT/last2.json"
        mv "$OUT/last2.json" "$OUT/last.json"
        single_after=$(PSQL "${URL[0]}" "select xact_commit from pg_stat_database where datname = 'single'")
        local deltas=""
        for k in 0 1 2; do
            after=$(stats $k)
            read -r c0 w0 <<<"${before[k]}"
            read -r c1 w1 <<<"$after"
            deltas="$deltas\"${NAMES[k]}\": {\"commits\": $((c1 - c0)), \"wal_bytes\": $((w1 - w0))}, "
        done
        deltas="$deltas\"single_db_commits\": $((single_after - single_before))"
        python3 - "$OUT/last.json" "{$deltas}" <<'EOF' | tee -a "$OUT/results.jsonl"
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
d["clusters"] = json.loads(sys.argv[2])
print(json.dumps(d))
EOF
        sleep 2
    }
    for rep in $(seq "$REPS"); do
        # The sitting's anchor: the raw-SQL pattern on cluster a (database
        # `replicas`, unused here).
        bench "spread-baseline-$rep" --scenario baseline --database-url "$(url_of 0 replicas)" --batch 100 --postgres-pid "${PM[0]}"
        # The same offered load (open loop, single Enqueue calls), then
        # flat out (EnqueueBatch of 100, one queue per batch).
        spread "one-db-rate-$rep" 50081 $ONE --scenario latency --rate "$RATE"
        spread "three-clusters-rate-$rep" 50082 $THREE --scenario latency --rate "$RATE"
        spread "one-db-tp-$rep" 50081 $ONE --producers 6
        spread "three-clusters-tp-$rep" 50082 $THREE --producers 6
    done
    stop_broker $ONE
    stop_broker $THREE
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
