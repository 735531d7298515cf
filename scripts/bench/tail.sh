#!/usr/bin/env bash
# Where the latency tail at 1,000 jobs/s comes from (docs/BENCHMARKS.md,
# "The tail at 1,000 jobs/s"): a fresh durable embedded cluster under one
# broker, warmed (15 s flat out, then CHECKPOINT, so that PostgreSQL recycles
# WAL segments as a cluster in service does), then one open-loop latency run
# with --latency-log, and the stalls (100 ms windows with a delivery above
# 8 ms, from latency-tail.py) next to the ends of the broker's vacuums of leaseq.jobs and the
# births of WAL segments, all as seconds from the run's start.
# Run as root (PostgreSQL runs as postgres); a release build.
#   usage: scripts/bench/tail.sh OUTDIR
#   env:   DUR=60 (seconds), RATE=1000, BENV="LEASEQ_X=..." (the broker's
#          environment), PGSQL / PGSQL2 (statements run before the run, e.g.
#          PGSQL="alter table leaseq.jobs set (vacuum_truncate = false)"),
#          PGLOG=1 (PostgreSQL logs statements over 8 ms and every
#          autovacuum into OUTDIR/postgres.log), BIN, QUICK=1, KEEP=1
#          (scripts/bench/lib.sh)
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init "${1:?usage: scripts/bench/tail.sh OUTDIR}"
DUR=$(secs "${DUR:-60}"); RATE=${RATE:-1000}
# shellcheck disable=SC2086 # BENV: a list of VAR=value
RUST_LOG=warn,leaseq_server::maintenance=debug embedded_broker broker LEASEQ_LOG_FORMAT=json ${BENV:-}
D=$BENCH_ROOT/broker
warm "$A" 15; sleep 2
[ -n "${PGSQL:-}" ] && psql_at "$U" -c "$PGSQL"; [ -n "${PGSQL2:-}" ] && psql_at "$U" -c "$PGSQL2"
if [ -n "${PGLOG:-}" ]; then
    psql_at "$U" -c "alter system set log_min_duration_statement = 8" && psql_at "$U" -c "alter system set log_autovacuum_min_duration = 0"
    psql_at "$U" -c "select pg_reload_conf()" >/dev/null
fi
t0=$(date +%s.%N)
run_json tail "$BIN" bench --json --payload-bytes 100 --latency-log "$OUT/lat.csv" --addr "$A" --scenario latency \
    --rate "$RATE" --consumers 2 --duration "$DUR" --broker-pid "$A_PID" --postgres-pid "$PM" || exit 1
echo "$LINE" >"$OUT/result.json"
python3 - "$OUT" "$t0" $D/data/pg_wal <<'PY'
import datetime, json, os, subprocess, sys
out, t0, wal = sys.argv[1], float(sys.argv[2]), sys.argv[3]
d = json.load(open(out + "/result.json"))
print({k: d[k] for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms")}, "cpu µs/job", d["cpu_us_per_job"])
vac = []
for line in open(out + "/broker.log"):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if "vacuum" in j.get("fields", {}).get("message", ""):
        t = datetime.datetime.fromisoformat(j["timestamp"].replace("Z", "+00:00")).timestamp()
        vac.append(round(t - t0, 2))
print("vacuum ends:", [v for v in vac if v > 0])
births = []
for n in sorted(os.listdir(wal)):
    if len(n) == 24:
        w = float(subprocess.run(["stat", "-c", "%.9W", os.path.join(wal, n)], capture_output=True, text=True).stdout)
        if w > t0:
            births.append(round(w - t0, 2))
print("WAL segments born:", births)
PY
python3 "$BENCH_DIR/latency-tail.py" "$OUT/lat.csv" | head -4
[ -n "${PGLOG:-}" ] && cp "$D/postgres.log" "$OUT/"
stop_all
