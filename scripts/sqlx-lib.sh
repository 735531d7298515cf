# Shared by ./test.sh and scripts/sqlx-prepare (sourced, not run): the
# compile-time check of leaseq's SQL (docs/ARCHITECTURE.md, "SQL checked at
# compile time").
#
# The query macros (`sqlx::query!`, `query_file!`, ...) read `.sqlx/` when
# SQLX_OFFLINE=true (the default, .cargo/config.toml). With SQLX_OFFLINE=false
# and DATABASE_URL set they describe every statement on that database instead
# (a renamed column is then a compile error), and write what they found to
# SQLX_OFFLINE_DIR: that is `.sqlx/` as `cargo sqlx prepare` would write it,
# without building sqlx-cli.
#
# Needs: LEASEQ_PG_BIN (initdb, pg_ctl, psql), the current directory at the
# workspace root.

# Starts a throwaway PostgreSQL cluster (Unix socket only, in a new
# directory under $TMPDIR), creates the database `leaseq` and applies
# migrations/*.sql in order, each in one transaction, as the broker's
# migrator would. Sets SQLX_DB_DIR and SQLX_DB_URL.
sqlx_db_start() {
    local bin="$LEASEQ_PG_BIN" tmp="${TMPDIR:-/tmp}" f
    tmp="${tmp%/}"
    SQLX_DB_DIR="$(mktemp -d "$tmp/leaseq-sqlx-pg.XXXXXX")"
    # PostgreSQL refuses to run as root: then it runs as `postgres`, from
    # `/` (the checkout may be a directory it cannot enter).
    sqlx_as=()
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$SQLX_DB_DIR"
        sqlx_as=(runuser -u postgres --)
    fi
    sqlx_pg "$bin/initdb" -D "$SQLX_DB_DIR/data" -U postgres --auth=trust \
        -E UTF8 --no-locale --no-sync >"$SQLX_DB_DIR/initdb.log" 2>&1 ||
        { cat "$SQLX_DB_DIR/initdb.log" >&2; return 1; }
    sqlx_pg "$bin/pg_ctl" -D "$SQLX_DB_DIR/data" -l "$SQLX_DB_DIR/log" -w -s \
        -o "-k $SQLX_DB_DIR -c listen_addresses= -c fsync=off -c full_page_writes=off" start ||
        { cat "$SQLX_DB_DIR/log" >&2; return 1; }
    local psql=("$bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$SQLX_DB_DIR" -U postgres)
    "${psql[@]}" -d postgres -c 'create database leaseq' || return 1
    # The broker's sessions have search_path=leaseq,public (crates/server/src/pgconn.rs).
    "${psql[@]}" -d postgres -c 'alter database leaseq set search_path = leaseq, public' || return 1
    for f in migrations/*.sql; do
        "${psql[@]}" -d leaseq --single-transaction -f "$f" >/dev/null || {
            echo "applying $f failed" >&2
            return 1
        }
    done
    SQLX_DB_URL="postgres://postgres@localhost/leaseq?host=$SQLX_DB_DIR&sslmode=disable"
}

# Runs a PostgreSQL program as the cluster's owner, from `/`.
sqlx_pg() {
    (cd / && "${sqlx_as[@]}" "$@")
}

# Stops and removes the cluster sqlx_db_start made (if any). With
# --no-wait, only tells it to stop (immediate shutdown): a later call
# removes it.
sqlx_db_stop() {
    [ -n "${SQLX_DB_DIR:-}" ] || return 0
    if [ "${1:-}" = --no-wait ]; then
        sqlx_pg "$LEASEQ_PG_BIN/pg_ctl" -D "$SQLX_DB_DIR/data" -m immediate -W -s stop \
            >/dev/null 2>&1 || true
        return 0
    fi
    sqlx_pg "$LEASEQ_PG_BIN/pg_ctl" -D "$SQLX_DB_DIR/data" -m immediate -w -s stop \
        >/dev/null 2>&1 || true
    rm -rf "$SQLX_DB_DIR"
    SQLX_DB_DIR=""
}

# The environment of a build whose query macros check every statement
# against the cluster and write what they found to $1 (emptied first), in
# the array sqlx_env (for `env "${sqlx_env[@]}" cargo ...`: the tests
# themselves must not see this DATABASE_URL). Also makes cargo expand the
# macros again: the crates that use them may be fresh from a build that
# read .sqlx/ (cargo does not track the macros' environment).
sqlx_live_env() {
    local out
    out="$(realpath -m "$1")"
    rm -rf "$out" "$out.ok"
    mkdir -p "$out"
    sqlx_env=(SQLX_OFFLINE=false "DATABASE_URL=$SQLX_DB_URL" "SQLX_OFFLINE_DIR=$out")
    touch crates/server/src/lib.rs src/lib.rs
}

# A digest of everything the check's outcome depends on: the crates with
# query macros, the migrations, .sqlx/, the sqlx version (Cargo.lock), this
# file and the PostgreSQL version. ./test.sh skips the check when it equals
# the digest of the last check that passed.
sqlx_inputs_digest() {
    {
        find crates/server/src src migrations .sqlx -type f -print0 2>/dev/null | sort -z |
            xargs -0 sha256sum
        sha256sum Cargo.lock scripts/sqlx-lib.sh
        "$LEASEQ_PG_BIN/postgres" --version
    } | sha256sum | cut -d' ' -f1
}

# Compares the data a live build wrote ($1) with .sqlx/: same files, same
# contents. Prints what differs and fails when anything does.
sqlx_compare() {
    local out="$1" report line name
    if report="$(diff -rq "$out" .sqlx 2>&1)"; then
        echo "offline query data (.sqlx/): $(ls .sqlx | wc -l) statements, all match"
        return 0
    fi
    while IFS= read -r line; do
        name="${line##*: }"
        case "$line" in
        "Only in $out"*)
            echo ".sqlx/$name is missing (a new or changed statement):"
            grep -m1 '"query"' "$out/$name" | cut -c1-200
            ;;
        "Only in .sqlx"*)
            echo ".sqlx/$name belongs to no statement any more"
            ;;
        "Files "*)
            name="$(basename "${line#Files }")"
            name="${name%% *}"
            echo ".sqlx/$name is out of date (the schema or the statement's types changed):"
            diff -u ".sqlx/$name" "$out/$name" | head -n 40
            ;;
        *) echo "$line" ;;
        esac
    done <<<"$report" >&2
    echo "The offline query data (.sqlx/) does not match the SQL and the migrations: run scripts/sqlx-prepare and commit .sqlx/" >&2
    return 1
}
