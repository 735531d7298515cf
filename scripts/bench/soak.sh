#!/usr/bin/env bash
# The 10-minute soak with its anchor (docs/BENCHMARKS.md, "The soak and its
# anchor"): on one fresh durable embedded cluster, warmed as a sitting warms
# it, ROUNDS rounds of the raw-SQL loop's soak and leaseq's, alternated, each
# with a report line a minute (rate, CPU per job, host probe). On a noisy
# host a soak's minutes spread; the raw loop in the same sitting shows how
# far the host alone spreads them. Run as root (PostgreSQL runs as postgres).
#   usage: scripts/bench/soak.sh OUTDIR [BIN] [ROUNDS]
#   env:   DUR=600 (seconds per soak), EVERY=60 (seconds per report line),
#          QUICK=1, KEEP=1 (scripts/bench/lib.sh)
#   out:   OUTDIR/{raw,leaseq}-N.txt, and OUTDIR/minutes.txt (per soak: each
#          minute's rate as a share of minute one, and the lowest)
set -uo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
[ -n "${2:-}" ] && BIN=$2
ROUNDS=${3:-1}
bench_init "${1:?usage: scripts/bench/soak.sh OUTDIR [BIN] [ROUNDS]}"
DUR=$(secs "${DUR:-600}"); EVERY=${EVERY:-60}
[ -n "${QUICK:-}" ] && EVERY=1
warmed_broker broker
psql_at "$U" -c checkpoint >/dev/null
for r in $(seq "$ROUNDS"); do
  log "raw-SQL soak $r"
  RAW=$OUT/raw-$r.txt run_json "raw-$r" "$BIN" bench --scenario baseline --database-url "$U" --batch 100 --duration "$DUR" \
    --report-every "$EVERY" --payload-bytes 100 --json --postgres-pid "$PM"
  log "leaseq soak $r"
  RAW=$OUT/leaseq-$r.txt run_json "leaseq-$r" "$BIN" bench --addr "$A" --duration "$DUR" --report-every "$EVERY" \
    --database-url "$U" --payload-bytes 100 --json --broker-pid "$A_PID" --postgres-pid "$PM"
done
log "done"
psql_at "$U" -c "select checkpoints_timed, checkpoints_req from pg_stat_bgwriter" >>"$OUT/log"
stop_all
# Each soak's minutes: the report lines, and the last interval from the
# run's total (its report line can fall just past the deadline).
python3 - "$OUT" "$DUR" >"$OUT/minutes.txt" <<'EOF'
import glob, json, re, sys
out, dur = sys.argv[1], float(sys.argv[2])
for path in sorted(glob.glob(out + "/*-*.txt")):
    text = open(path).read()
    lines = re.findall(r"report t=(\d+)s jobs_per_s=(\d+)", text)
    total = None
    for l in text.splitlines():
        if l.startswith("{"):
            d = json.loads(l)
            total = (d["jobs"], d["seconds"])
    if not lines or total is None:
        print(path.rsplit("/", 1)[1], "no result")
        continue
    rates, t0, done = [], 0, 0
    for t, rate in lines:
        t, rate = int(t), int(rate)
        rates.append(rate)
        done += rate * (t - t0)
        t0 = t
    if total[1] - t0 >= 5:
        rates.append(round((total[0] - done) / (total[1] - t0)))
    first = rates[0]
    shares = [round(100 * x / first, 1) for x in rates]
    print(f"{path.rsplit('/', 1)[1]} jobs_per_s={total[0] / total[1]:.0f} "
          f"minutes={rates} share_of_first={shares} lowest={min(shares)}")
EOF
cat "$OUT/minutes.txt"
