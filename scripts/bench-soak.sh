#!/usr/bin/env bash
# The 10-minute soak with its anchor (docs/BENCHMARKS.md, "The soak and its
# anchor"): on one fresh durable embedded cluster, warmed as a sitting warms
# it, ROUNDS rounds of the raw-SQL loop's soak and leaseq's, alternated, each
# with a report line a minute (rate, CPU per job, host probe). On a noisy
# host a soak's minutes spread; the raw loop in the same sitting shows how
# far the host alone spreads them. Run as root (PostgreSQL runs as postgres).
#   usage: scripts/bench-soak.sh OUTDIR [BIN] [ROUNDS]
#   env:   DUR=600 (seconds per soak), EVERY=60 (seconds per report line)
#   out:   OUTDIR/{raw,leaseq}-N.txt, and OUTDIR/minutes.txt (per soak: each
#          minute's rate as a share of minute one, and the lowest)
set -uo pipefail
OUT=${1:?outdir}; BIN=${2:-$(cd "$(dirname "$0")/.." && pwd)/target/release/leaseq}; ROUNDS=${3:-1}
DUR=${DUR:-600}; EVERY=${EVERY:-60}
mkdir -p "$OUT"; log() { echo "[$(date +%T) load $(cut -d' ' -f1 /proc/loadavg)] $*" | tee -a "$OUT/log"; }
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
D=/tmp/soak-pg
A=127.0.0.1:50061
warmed_broker $D $A "$OUT/broker.log"
runuser -u postgres -- psql -qAtX "$U" -c checkpoint >/dev/null
for r in $(seq "$ROUNDS"); do
  log "raw-SQL soak $r"
  $BIN bench --scenario baseline --database-url "$U" --batch 100 --duration "$DUR" --report-every "$EVERY" \
    --payload-bytes 100 --json --postgres-pid "$PM" >"$OUT/raw-$r.txt" 2>&1
  log "leaseq soak $r"
  $BIN bench --addr "http://$A" --duration "$DUR" --report-every "$EVERY" --database-url "$U" \
    --payload-bytes 100 --json --broker-pid "$A_PID" --postgres-pid "$PM" >"$OUT/leaseq-$r.txt" 2>&1
done
log "done"
runuser -u postgres -- psql -qAtX "$U" -c "select checkpoints_timed, checkpoints_req from pg_stat_bgwriter" >>"$OUT/log"
kill "$A_PID"; sleep 3; pkill -f "postgres -D $D"; sleep 2; rm -rf $D
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
