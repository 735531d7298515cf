# shellcheck shell=bash disable=SC2034 # (variables set for the scripts)
# The benchmark scripts' shared library (sourced, not run; scripts/bench/README.md).
#
# A script that sources it calls `bench_init OUTDIR` first. From then on
# everything it starts through this file is recorded: each process by its
# pid (spawn), each PostgreSQL cluster by its data directory, RabbitMQ by
# its node's pid. At exit, on Ctrl-C (INT) or on TERM, bench_cleanup stops
# exactly those: the processes by pid (TERM, then KILL after 30 s), the
# clusters with `pg_ctl stop -m fast`, RabbitMQ with `rabbitmqctl stop`.
# Nothing is ever stopped by a name or a pattern: a broker, a PostgreSQL or
# a RabbitMQ of someone else on this host is left alone. Every cluster
# lives under a new scratch directory (BENCH_ROOT, under $TMPDIR or /tmp),
# removed at the end unless KEEP=1. Every port is picked free (free_port);
# the embedded clusters listen on no TCP port at all (a Unix socket in
# their own directory).
#
# Environment read here:
#   BIN      the leaseq binary (default: target/release/leaseq of this checkout)
#   ANCHORS  the anchors (default: ../shared/anchors next to the checkout):
#            commit-floor.sh and rabbitmq/ (its setup.sh once, as root)
#   FLOOR    the floor broker (default: target/release/examples/floor_broker)
#   QUICK=1  every run lasts 2 s (secs), with 0.5 s between runs: a smoke
#            test of a script, not a measurement
#   KEEP=1   leave BENCH_ROOT (the clusters' directories) in place
#   LEASEQ_PG_BIN  PostgreSQL's server binaries (initdb, pg_ctl, postgres)
#
# Run as root (PostgreSQL then runs as the postgres user) or as a user who
# can run PostgreSQL; RabbitMQ needs root.

BENCH_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BENCH_DIR=$BENCH_REPO/scripts/bench
BIN=${BIN:-$BENCH_REPO/target/release/leaseq}
ANCHORS=${ANCHORS:-$(cd "$BENCH_REPO/.." && pwd)/shared/anchors}
FLOOR=${FLOOR:-$BENCH_REPO/target/release/examples/floor_broker}
BENCH_PIDS=()     # processes started, oldest first
BENCH_CLUSTERS=() # data directories of the clusters started
BENCH_PORTS=()    # ports handed out by free_port
BENCH_RABBIT=     # 1 once rabbit_start started a RabbitMQ node
RPID=             # that node's pid
BENCH_EPMD=       # 1 when epmd was not running before RabbitMQ started
BENCH_ROOT=
LINE=

# bench_init OUTDIR: makes OUTDIR and the scratch directory BENCH_ROOT
# (mode 755: PostgreSQL, run as postgres, must reach its clusters under
# it), sets OUT and RESULTS (OUTDIR/results.jsonl), installs the cleanup.
bench_init() {
    OUT=${1:?OUTDIR}
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
    RESULTS=$OUT/results.jsonl
    local tmp=${TMPDIR:-/tmp}
    BENCH_ROOT=$(mktemp -d "${tmp%/}/leaseq-bench.XXXXXX") || exit 1
    chmod 755 "$BENCH_ROOT"
    trap bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    [ -x "$BIN" ] || { echo "no leaseq binary at $BIN (cargo build --release, or BIN=...)" >&2; exit 2; }
    BIN=$(realpath "$BIN")
    [ -x "$FLOOR" ] && FLOOR=$(realpath "$FLOOR")
    if [ -n "${QUICK:-}" ]; then GAP=0.5; else GAP=2; fi
}

# log MESSAGE: a line, with the time and the host's load, on stdout and
# in OUT/log.
log() { echo "[$(date +%T) load $(cut -d' ' -f1 /proc/loadavg)] $*" | tee -a "$OUT/log"; }

# secs N: N, or 2 with QUICK=1.
secs() { if [ -n "${QUICK:-}" ]; then echo 2; else echo "$1"; fi; }

# as_pg CMD...: CMD as the postgres user when root, else as is. AS_PG is
# the same as a prefix ("${AS_PG[@]}" CMD...), for run_json and run_wait:
# they must start a program, not a function, so that the pid they record
# is the program's.
AS_PG=()
[ "$(id -u)" = 0 ] && AS_PG=(runuser -u postgres --)
as_pg() { "${AS_PG[@]}" "$@"; }

# psql_at URL ARGS...: psql -qAtX on URL (as_pg).
psql_at() {
    local url=$1
    shift
    as_pg psql -qAtX "$url" "$@"
}

# free_port: sets PORT to a loopback TCP port nothing listens on, picked by
# the kernel, and not handed out before in this run (call it in the
# script's own shell, not in $(...), so that it remembers).
free_port() {
    local p _
    for _ in $(seq 20); do
        p=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        if [[ " ${BENCH_PORTS[*]} " != *" $p "* ]] && ! ss -ltnH "( sport = :$p )" | grep -q .; then
            BENCH_PORTS+=("$p")
            PORT=$p
            return 0
        fi
    done
    echo "free_port: no free port found" >&2
    exit 1
}

# spawn LOG CMD...: CMD in the background, its output to LOG, its pid
# recorded (stopped at the end) and in SPAWNED. Call it from the script's
# own shell, not in $(...) or a pipeline: the pid must be recorded there.
spawn() {
    local log=$1
    shift
    "$@" >"$log" 2>&1 &
    SPAWNED=$!
    BENCH_PIDS+=("$SPAWNED")
}

# track PID: records a process started with `&` by the script itself.
track() { BENCH_PIDS+=("$1"); }

# forget PID: takes PID off the record (it exited and was waited for).
forget() {
    local i
    for i in "${!BENCH_PIDS[@]}"; do
        [ "${BENCH_PIDS[i]}" = "$1" ] && unset 'BENCH_PIDS[i]'
    done
    BENCH_PIDS=("${BENCH_PIDS[@]}")
}

# alive PID: the process runs (a zombie, exited but not yet waited for,
# does not).
alive() {
    local s
    s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
    [ "${s%% *}" != Z ]
}

# stop PID...: stops each (TERM; KILL after 30 s; a broker drains first,
# and one that owns an embedded cluster stops it as it exits), waits for
# it, and forgets it. Only pids recorded by spawn or track are touched.
stop() {
    local p
    for p in "$@"; do
        if [[ " ${BENCH_PIDS[*]} " != *" $p "* ]]; then
            echo "stop: $p was not started here: left alone" >&2
            continue
        fi
        forget "$p"
        kill -TERM "$p" 2>/dev/null
        for _ in $(seq 300); do alive "$p" || break; sleep 0.1; done
        if alive "$p"; then
            echo "stop: $p did not exit in 30 s: KILL" >&2
            kill -KILL "$p" 2>/dev/null
        fi
        wait "$p" 2>/dev/null
    done
}

# wait_listen PORT PID [LOG]: waits (60 s at most) until something listens
# on 127.0.0.1:PORT; stops the script if PID exits first.
wait_listen() {
    local port=$1 pid=$2 log=${3:-}
    for _ in $(seq 600); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        if ! alive "$pid"; then
            echo "process $pid exited before listening on $port${log:+: $log}" >&2
            [ -n "$log" ] && tail -5 "$log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "nothing listens on $port after 60 s${log:+: $log}" >&2
    exit 1
}

# pg_bindir: the directory of initdb, pg_ctl and postgres ($LEASEQ_PG_BIN,
# PATH, or the newest /usr/lib/postgresql/*/bin).
pg_bindir() {
    if [ -n "${LEASEQ_PG_BIN:-}" ]; then
        echo "$LEASEQ_PG_BIN"
    elif command -v pg_ctl >/dev/null; then
        dirname "$(command -v pg_ctl)"
    else
        ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1
    fi
}

# add_cluster DATADIR: records a cluster to stop at the end.
add_cluster() {
    [[ " ${BENCH_CLUSTERS[*]} " == *" $1 "* ]] || BENCH_CLUSTERS+=("$1")
}

# pg_stop DATADIR: `pg_ctl stop -m fast` of a recorded cluster whose
# postmaster still runs (its pid file names a live postgres on DATADIR);
# as the data directory's owner. Returns 1 when it still runs after.
pg_stop() {
    local data=$1 pm bindir owner
    pm=$(head -1 "$data/postmaster.pid" 2>/dev/null) || return 0
    [ -n "$pm" ] && alive "$pm" || return 0
    tr '\0' ' ' <"/proc/$pm/cmdline" 2>/dev/null | grep -qF -- "$data" || return 0
    echo "stopping the cluster $data (pid $pm)" >&2
    bindir=$(dirname "$(readlink "/proc/$pm/exe" 2>/dev/null || echo "$(pg_bindir)/postgres")")
    [ -x "$bindir/pg_ctl" ] || bindir=$(pg_bindir)
    owner=$(stat -c %U "$data")
    if [ "$(id -u)" = 0 ] && [ "$owner" != root ]; then
        (cd / && runuser -u "$owner" -- "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null)
    else
        (cd / && "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null)
    fi
    ! alive "$pm"
}

# embedded_broker NAME [VAR=VALUE ...]: `$BIN serve` on a new durable
# embedded cluster in BENCH_ROOT/NAME (the same NAME again: the same
# cluster, started again), on a free port, with the extra environment
# given; log in OUT/NAME.log. Waits until it listens and sets A_PID (the
# broker), A_ADDR (host:port), A (its URL), U (a URL of its database), PM
# (the postmaster's pid). BROKER_LOG=FILE: the log there instead.
embedded_broker() {
    local name=$1 dir=$BENCH_ROOT/$1 port sock log
    shift
    log=${BROKER_LOG:-$OUT/$name.log}
    free_port; port=$PORT
    add_cluster "$dir/data"
    spawn "$log" env "$@" LEASEQ_DATA_DIR="$dir" LEASEQ_LISTEN="127.0.0.1:$port" \
        RUST_LOG="${RUST_LOG:-warn}" "$BIN" serve
    A_PID=$SPAWNED
    A_ADDR=127.0.0.1:$port
    A=http://$A_ADDR
    wait_listen "$port" "$A_PID" "$log"
    for sock in "$dir"/run/.s.PGSQL.*; do [[ $sock == *.lock ]] || break; done
    U="postgres://leaseq@localhost:${sock##*.}/leaseq?host=$dir/run"
    PM=$(head -1 "$dir/data/postmaster.pid")
}

# serve NAME [VAR=VALUE ...]: another broker (a replica) on the database
# $U, on a free port; log in OUT/NAME.log. Sets S_PID, S_ADDR and S.
serve() {
    local name=$1 port
    shift
    free_port; port=$PORT
    spawn "$OUT/$name.log" env "$@" DATABASE_URL="$U" LEASEQ_LISTEN="127.0.0.1:$port" \
        RUST_LOG="${RUST_LOG:-warn}" "$BIN" serve
    S_PID=$SPAWNED
    S_ADDR=127.0.0.1:$port
    S=http://$S_ADDR
    wait_listen "$port" "$S_PID" "$OUT/$name.log"
}

# warm ADDR [SECONDS=15]: SECONDS flat out on the broker at ADDR (a URL),
# then a CHECKPOINT of $U: PostgreSQL then has WAL segments to recycle and
# the tables their first dead rows, as a cluster in service has (a fresh
# cluster creates each new 16 MB segment while commits wait: a 35-46 ms
# stall every ~23 s at 1,000 jobs/s; docs/BENCHMARKS.md).
warm() {
    run_json warm "$BIN" bench --json --addr "$1" --duration "$(secs "${2:-15}")"
    psql_at "$U" -c checkpoint >/dev/null
}

# warmed_broker NAME [VAR=VALUE ...]: embedded_broker, then 10 s flat out
# (no checkpoint), as scripts/bench/trace-hops.sh and runqueue.sh warm.
warmed_broker() {
    embedded_broker "$@"
    run_json warm "$BIN" bench --json --addr "$A" --duration "$(secs 10)"
}

# private_cluster NAME [-c SETTING ...]: a new durable PostgreSQL cluster
# (initdb; the embedded cluster's settings; Unix socket only) in
# BENCH_ROOT/NAME, started with pg_ctl, with a database `leaseq`. Sets U,
# PM and C_DIR (BENCH_ROOT/NAME).
private_cluster() {
    local name=$1 bindir
    shift
    bindir=$(pg_bindir)
    C_DIR=$BENCH_ROOT/$name
    mkdir -p "$C_DIR/run"
    [ "$(id -u)" = 0 ] && chown -R postgres "$C_DIR"
    as_pg "$bindir/initdb" -D "$C_DIR/data" -U leaseq --auth=trust -E UTF8 --no-locale --no-sync \
        >"$C_DIR/initdb.log" 2>&1 || { echo "initdb failed: $C_DIR/initdb.log" >&2; exit 1; }
    add_cluster "$C_DIR/data"
    as_pg "$bindir/pg_ctl" -D "$C_DIR/data" -l "$C_DIR/postgres.log" -w -o "-k $C_DIR/run -p 5432 \
        -c listen_addresses= -c max_connections=300 -c max_wal_size=4GB -c min_wal_size=512MB \
        -c checkpoint_timeout=15min -c wal_compression=on -c wal_buffers=16MB $*" start >/dev/null ||
        { echo "pg_ctl start failed: $C_DIR/postgres.log" >&2; exit 1; }
    U="postgres://leaseq@localhost:5432/leaseq?host=$C_DIR/run"
    PM=$(head -1 "$C_DIR/data/postmaster.pid")
    psql_at "${U/\/leaseq\?//postgres?}" -c "create database leaseq" >/dev/null
}

# run_wait FILE CMD...: runs CMD (a program) in the background, recorded, its output
# (stderr too) to FILE, and waits for it, so that Ctrl-C or TERM stops it
# at once; returns its status.
run_wait() {
    local file=$1 p rc
    shift
    "$@" >"$file" 2>&1 &
    p=$!
    track "$p"
    wait "$p"
    rc=$?
    forget "$p"
    return "$rc"
}

# run_json NAME CMD...: runs CMD (a program that prints a JSON line last, such as
# `leaseq bench --json`) in the background, recorded, and waits for it, so
# that Ctrl-C or TERM stops it at once; sets LINE to its last line with
# "run": NAME added. Its stderr goes to OUT/bench.err. Returns 1 (LINE
# empty, a line in the log) when it printed no JSON. With RAW=FILE, all of
# CMD's output (stderr too: report lines) is kept in FILE.
run_json() {
    local name=$1 raw=${RAW:-$BENCH_ROOT/run.out} p
    shift
    if [ -n "${RAW:-}" ]; then
        "$@" >"$raw" 2>&1 &
    else
        "$@" >"$raw" 2>>"$OUT/bench.err" &
    fi
    p=$!
    track "$p"
    wait "$p"
    forget "$p"
    LINE=$(tail -1 "$raw" | RUN=$name python3 -c '
import json, os, sys
d = json.loads(sys.stdin.read())
d["run"] = os.environ["RUN"]
print(json.dumps(d))' 2>/dev/null)
    [ -n "$LINE" ] || { log "$name: no result (OUT/bench.err)"; return 1; }
}

# emit [JSON]: appends LINE, with the fields of JSON (an object) added, to
# RESULTS, and prints it.
emit() {
    [ -n "$LINE" ] || return 0
    LINE=$(EXTRA=${1:-"{}"} python3 -c '
import json, os, sys
d = json.loads(sys.stdin.read())
d.update(json.loads(os.environ["EXTRA"]))
print(json.dumps(d))' <<<"$LINE")
    echo "$LINE" | tee -a "$RESULTS"
}

# bench NAME ARGS...: one `leaseq bench --json --payload-bytes 100 ARGS`
# run, its summary in RESULTS, then a pause of GAP seconds.
bench() {
    local name=$1
    shift
    log "bench $name: $*"
    run_json "$name" "$BIN" bench --json --payload-bytes 100 "$@" && emit
    sleep "$GAP"
}

# commit_floor NAME RATE [SECONDS=10]: the commit floor (ANCHORS/commit-
# floor.sh: one durable single-row insert + commit, pgbench open loop) on
# $U at RATE; its line in RESULTS.
commit_floor() {
    log "commit floor $2/s"
    run_json "$1" "${AS_PG[@]}" "$ANCHORS/commit-floor.sh" "$U" "$2" "$(secs "${3:-10}")" && emit
    sleep "$GAP"
}

# floor_brokers: the floor broker (examples/floor_broker.rs,
# docs/BENCHMARKS.md "A floor broker") on the cluster of $U, three of them:
# one alone (F_PID, F), and two across (the job in a NOTIFY: enqueue at
# FX_IN, consume at FX_OUT). They use a database of their own: PostgreSQL
# signals every listener of a database at each NOTIFY in it, so their
# LISTENs would add work to leaseq's path. Sets F_PIDS (all three); does
# nothing, F_PIDS empty, when $FLOOR is not built.
floor_brokers() {
    F_PIDS=
    [ -x "$FLOOR" ] || { log "no floor broker at $FLOOR: its runs are skipped"; return 0; }
    psql_at "$U" -c "create database floor_bench owner leaseq" >/dev/null
    local fu=${U/\/leaseq\?//floor_bench?} i port addrs=()
    for i in 0 1 2; do
        free_port; port=$PORT
        # One at a time: each creates its table if missing.
        if [ "$i" = 0 ]; then
            spawn "$OUT/floor-$i.log" env DATABASE_URL="$fu" FLOOR_LISTEN="127.0.0.1:$port" "$FLOOR"
            F_PID=$SPAWNED
        else
            spawn "$OUT/floor-$i.log" env DATABASE_URL="$fu" FLOOR_LISTEN="127.0.0.1:$port" FLOOR_NOTIFY=1 "$FLOOR"
        fi
        wait_listen "$port" "$SPAWNED" "$OUT/floor-$i.log"
        F_PIDS="$F_PIDS $SPAWNED"
        addrs+=("http://127.0.0.1:$port")
    done
    F=${addrs[0]}
    FX_IN=${addrs[1]}
    FX_OUT=${addrs[2]}
}

# pg_pids: the postmaster $PM and its children, comma-separated (for
# `perf record -p`): this run's cluster only.
pg_pids() {
    echo "$PM$(sed 's/^/ /' "/proc/$PM/task/$PM/children" 2>/dev/null | tr -s ' ' ',' | sed 's/,$//')"
}

# rabbit_build: builds ANCHORS/rabbitmq's load tool (before anything is
# measured: a new machine has none) and sets RB; stops the script if
# RabbitMQ is missing or a node already runs on this host (not ours:
# neither used nor stopped).
rabbit_build() {
    command -v rabbitmq-server >/dev/null ||
        { echo "no rabbitmq-server (ANCHORS/rabbitmq/setup.sh once, or NO_RABBIT=1)" >&2; exit 1; }
    if rabbitmqctl -q status >/dev/null 2>&1; then
        echo "a RabbitMQ node already runs on this host: stop it, or set NO_RABBIT=1" >&2
        exit 1
    fi
    local rt=${CARGO_TARGET_DIR:-/tmp/leaseq-anchor-rabbitmq}
    RB=$rt/release/rabbit-bench
    (cd "$ANCHORS/rabbitmq" && CARGO_TARGET_DIR=$rt cargo build --release -q) ||
        { echo "cannot build $RB (set NO_RABBIT=1 to skip RabbitMQ)" >&2; exit 1; }
}

# rabbit_start: starts the RabbitMQ node (rabbitmq-server -detached),
# waits for it, records its pid (RPID; stopped at the end).
rabbit_start() {
    (exec 3<>/dev/tcp/127.0.0.1/4369) 2>/dev/null || BENCH_EPMD=1
    log "rabbitmq start"
    BENCH_RABBIT=1
    rabbitmq-server -detached
    sleep 5
    rabbitmqctl -q await_startup --timeout 60 || { echo "RabbitMQ did not start" >&2; exit 1; }
    RPID=$(rabbitmqctl -q eval 'list_to_integer(os:getpid()).')
    log "beam pid $RPID"
}

# rabbit_stop: stops the node rabbit_start started (rabbitmqctl stop, which
# no other node can answer: rabbit_build made sure none ran; KILL of its
# pid after 60 s), and epmd if it was not running before.
rabbit_stop() {
    [ -n "$BENCH_RABBIT" ] || return 0
    rabbitmqctl -q stop >/dev/null 2>&1
    if [ -n "$RPID" ]; then
        for _ in $(seq 600); do alive "$RPID" || break; sleep 0.1; done
        alive "$RPID" && kill -KILL "$RPID"
    fi
    [ -n "$BENCH_EPMD" ] && epmd -kill >/dev/null 2>&1
    BENCH_RABBIT=
    RPID=
    log "rabbitmq stopped"
}

# rabbit NAME ARGS...: one rabbit-bench run (15 s, 100-byte payloads,
# prefetch 100) with the node's CPU seconds over it (beam_cpu_s); its line
# in RESULTS.
rabbit() {
    local name=$1 c0 c1
    shift
    sleep "$GAP"
    log "rabbit $name"
    c0=$(awk '{print $14+$15}' "/proc/$RPID/stat")
    # QUICK: no warm-up (rabbit-bench's duration must exceed it).
    run_json "$name" "$RB" --duration "$(secs 15)" ${QUICK:+--warmup 0} --payload-bytes 100 --prefetch 100 "$@" || return 0
    c1=$(awk '{print $14+$15}' "/proc/$RPID/stat")
    emit "{\"beam_cpu_s\": $(python3 -c "print(($c1 - $c0) / $(getconf CLK_TCK))")}"
}

# stop_all: stops every process started so far, newest first (replicas
# before the broker that owns their cluster).
stop_all() {
    local i
    for ((i = ${#BENCH_PIDS[@]} - 1; i >= 0; i--)); do
        [ -n "${BENCH_PIDS[i]:-}" ] && stop "${BENCH_PIDS[i]}"
    done
}

# bench_cleanup: the EXIT trap. Stops what this run started, newest first
# (replicas before the broker that owns their cluster), then RabbitMQ, then
# any recorded cluster still running (a broker killed hard leaves its
# embedded cluster up), and removes BENCH_ROOT unless KEEP=1.
bench_cleanup() {
    local rc=$? d left=
    # Once: a second Ctrl-C does not cut the cleanup short.
    trap - EXIT
    trap '' INT TERM
    # Every step runs, whatever the script's `set -e`: the kill of a pid
    # already gone fails, and once ended the cleanup there, leaving the
    # older processes running (tests/scripts.rs).
    set +e
    stop_all
    rabbit_stop
    for d in "${BENCH_CLUSTERS[@]}"; do pg_stop "$d" || left=1; done
    if [ -n "$BENCH_ROOT" ] && [ -d "$BENCH_ROOT" ]; then
        if [ -n "$left" ]; then
            echo "a cluster under $BENCH_ROOT did not stop: the directory is left" >&2
        elif [ -n "${KEEP:-}" ]; then
            echo "KEEP=1: the clusters' directories are left in $BENCH_ROOT (stopped)" >&2
        else
            rm -rf "$BENCH_ROOT"
        fi
    fi
    exit "$rc"
}
