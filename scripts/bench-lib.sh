# Sourced by the bench scripts: start a broker on a fresh durable embedded
# cluster and learn its database.
#
#   embedded_broker DIR ADDR LOG [ENV=VALUE ...]
#
# Removes DIR, starts `$BIN serve` with LEASEQ_DATA_DIR=DIR on ADDR (extra
# environment from the arguments), waits for the cluster's socket, and sets
# A_PID (the broker), U (a URL for the database), PM (the postmaster's pid).

embedded_broker() {
    local dir=$1 addr=$2 log=$3
    shift 3
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
