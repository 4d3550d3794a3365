#!/usr/bin/env bash
# Runs a command next to a throwaway PostgreSQL server.
#
#   scripts/with-postgres.sh cargo nextest run --features full
#
# Installs PostgreSQL from the distribution's packages when it is missing (as
# root), creates a fresh cluster in a temporary directory, starts it on a free
# loopback port (wal_level = logical, for the CDC tests), exports IGGY_CONNECT_TEST_POSTGRES_URL for the command, and on
# exit stops the server it started (by its PID) and removes the cluster.
# initdb refuses to run as root, so as root the server runs as the `postgres`
# user (or `nobody` when that user does not exist).
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi

log() { echo "with-postgres: $*" >&2; }

find_pg_bin() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then
        echo "$dir"
    elif command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
    fi
}

PG_BIN=$(find_pg_bin)
if [ -z "$PG_BIN" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        log "PostgreSQL is not installed; run this script as root once, or install the 'postgresql' package"
        exit 1
    fi
    log "installing PostgreSQL from the distribution's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends postgresql >&2
    PG_BIN=$(find_pg_bin)
    if [ -z "$PG_BIN" ]; then
        log "the postgresql package installed no initdb"
        exit 1
    fi
fi

# The server's unprivileged user, and how to run a command as it.
if [ "$(id -u)" -eq 0 ]; then
    if id postgres >/dev/null 2>&1; then PG_USER=postgres; else PG_USER=nobody; fi
    as_pg() { runuser -u "$PG_USER" -- "$@"; }
else
    PG_USER=$(id -un)
    as_pg() { "$@"; }
fi

WORK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/with-postgres.XXXXXX")
chmod 0755 "$WORK_DIR"
DATA_DIR="$WORK_DIR/data"
SOCKET_DIR="$WORK_DIR/socket"
mkdir -p "$DATA_DIR" "$SOCKET_DIR"
if [ "$(id -u)" -eq 0 ]; then chown -R "$PG_USER" "$WORK_DIR"; fi
SERVER_PID=""

cleanup() {
    local status=$?
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        # SIGINT is PostgreSQL's "fast" shutdown: roll back clients, stop.
        kill -INT "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 300); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$SERVER_PID" 2>/dev/null; then
            log "server $SERVER_PID did not stop in 30 s; killing it"
            kill -KILL "$SERVER_PID" 2>/dev/null || true
        fi
    fi
    rm -rf "$WORK_DIR"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

as_pg "$PG_BIN/initdb" --pgdata="$DATA_DIR" --username=postgres --auth=trust \
    --encoding=UTF8 --locale=C.UTF-8 --no-instructions >"$WORK_DIR/initdb.log" 2>&1 || {
    cat "$WORK_DIR/initdb.log" >&2
    log "initdb failed"
    exit 1
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

started=""
for _ in $(seq 1 20); do
    PORT=$((20000 + RANDOM % 40000))
    port_in_use "$PORT" && continue
    if as_pg "$PG_BIN/pg_ctl" --pgdata="$DATA_DIR" --log="$WORK_DIR/server.log" --wait \
        --timeout=60 --silent \
        -o "-c listen_addresses=127.0.0.1 -c port=$PORT -c unix_socket_directories=$SOCKET_DIR -c max_connections=300 -c wal_level=logical -c max_replication_slots=200 -c max_wal_senders=20" \
        start >/dev/null 2>&1; then
        started=yes
        break
    fi
done
if [ -z "$started" ]; then
    tail -n 40 "$WORK_DIR/server.log" >&2 || true
    log "could not start PostgreSQL"
    exit 1
fi
SERVER_PID=$(head -n 1 "$DATA_DIR/postmaster.pid")

export IGGY_CONNECT_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PORT/postgres"
log "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') running as $PG_USER on 127.0.0.1:$PORT (pid $SERVER_PID)"

# Not exec: the trap must stop the server when the command ends.
set +e
"$@"
status=$?
set -e
exit "$status"
