# Sourced by the bench scripts: start a broker on a fresh durable embedded
# cluster and learn its database.

# Stops the script if something already listens on ADDR (host:port): a
# broker left from an earlier run would answer in place of the one started,
# on another database.
#
#   port_free ADDR
port_free() {
    if ss -ltnH "( sport = :${1##*:} )" | grep -q .; then
        echo "port_free: ${1} is in use:" >&2
        ss -ltnpH "( sport = :${1##*:} )" >&2
        exit 1
    fi
}

#   embedded_broker DIR ADDR LOG [ENV=VALUE ...]
#
# Removes DIR, starts `$BIN serve` with LEASEQ_DATA_DIR=DIR on ADDR (extra
# environment from the arguments), waits for the cluster's socket, and sets
# A_PID (the broker), U (a URL for the database), PM (the postmaster's pid).
# Stops the script if ADDR is in use (port_free).

embedded_broker() {
    local dir=$1 addr=$2 log=$3
    shift 3
    port_free "$addr"
    rm -rf "$dir"
    env "$@" LEASEQ_DATA_DIR="$dir" LEASEQ_LISTEN="$addr" RUST_LOG="${RUST_LOG:-warn}" "$BIN" serve >"$log" 2>&1 &
    A_PID=$!
    local _ sock
    for _ in $(seq 60); do [ -n "$(ls "$dir"/run/.s.PGSQL.* 2>/dev/null)" ] && break; sleep 1; done
    sleep 3
    sock=$(ls "$dir"/run/.s.PGSQL.* | grep -v lock | head -1)
    U="postgres://leaseq@localhost:${sock##*.}/leaseq?host=$dir/run"
    PM=$(head -1 "$dir/data/postmaster.pid")
}

# embedded_broker, then 10 s flat out on it, so that the cluster has WAL
# segments to recycle and the tables their first dead rows, as one in
# service does (scripts/trace-hops.sh, scripts/runqueue.sh).
#
#   warmed_broker DIR ADDR LOG [ENV=VALUE ...]
warmed_broker() {
    embedded_broker "$@"
    "$BIN" bench --addr "http://$2" --duration 10 >/dev/null 2>&1
}

# The floor broker (examples/floor_broker.rs, docs/BENCHMARKS.md "A floor
# broker") on the cluster of embedded_broker ($U): one alone on :50063, two
# across (the job in a NOTIFY) on :50064 and :50065. They use a database of
# their own: PostgreSQL signals every listener of a database at each NOTIFY
# in it, so their LISTENs would add work to leaseq's path. Sets F_PID (the
# one alone) and F_PIDS (all three).
#
#   floor_brokers FLOOR_BINARY OUTDIR
floor_brokers() {
    local floor=$1 out=$2 p
    runuser -u postgres -- psql -qAtX "$U" -c "create database floor_bench owner leaseq" >/dev/null
    local fu=${U/\/leaseq\?//floor_bench?}
    F_PIDS=
    for p in 50063 50064 50065; do
        # shellcheck disable=SC2046 # no variable or one VAR=value
        env DATABASE_URL="$fu" FLOOR_LISTEN=127.0.0.1:$p $([ $p != 50063 ] && echo FLOOR_NOTIFY=1) \
            "$floor" >"$out/floor-$p.log" 2>&1 &
        F_PIDS="$F_PIDS $!"
        [ $p = 50063 ] && F_PID=$!
        sleep 1 # one at a time: each creates its table if missing
    done
}
