#!/usr/bin/env bash
# A throwaway PostgreSQL server for the store tests.
#
#   url=$(bash scripts/start_postgres.sh DIR)   # start a cluster in DIR (created if missing)
#   bash scripts/start_postgres.sh --stop DIR   # stop it
#
# On success the only line on stdout is the server's URL
# (postgresql://svtagg@127.0.0.1:<port>/svtagg_test), for SVTAGG_TEST_POSTGRES.
# It never fails: when PostgreSQL cannot be installed or started it prints
# nothing on stdout, explains why on stderr and exits 0, and the PostgreSQL
# tests skip.  Missing binaries are installed with apt-get (Debian's
# `postgresql` package) when running as root.  The cluster listens on
# 127.0.0.1 only, on a free port, with trust authentication (tests only; never
# a deployment's setup).  PostgreSQL refuses to run as root, so as root the
# cluster belongs to the `postgres` system user.
set -u
case "${1:-}" in /* | --stop | "") ;; *) set -- "$PWD/$1" ;; esac
case "${2:-}" in /* | "") ;; *) set -- "$1" "$PWD/$2" ;; esac

log() { echo "start_postgres: $*" >&2; }

pg_bindir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$d" ] && [ -x "$d/initdb" ]; then
        echo "$d"
    elif command -v initdb >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
    fi
}

as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# the server runs as another user, who may not be able to enter this directory
cd / || true

if [ "${1:-}" = "--stop" ]; then
    dir=${2:?usage: start_postgres.sh --stop DIR}
    bin=$(pg_bindir)
    if [ -n "$bin" ] && [ -f "$dir/data/postmaster.pid" ]; then
        as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    fi
    exit 0
fi

dir=${1:-$(mktemp -d /tmp/svtagg-pg.XXXXXX)}
mkdir -p "$dir" || { log "cannot create $dir"; exit 0; }

bin=$(pg_bindir)
if [ -z "$bin" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing Debian's postgresql package"
        export DEBIAN_FRONTEND=noninteractive
        timeout 150 apt-get install -y -q postgresql >&2 \
            || { timeout 90 apt-get update -q >&2 && timeout 150 apt-get install -y -q postgresql >&2; } \
            || log "apt-get install postgresql failed"
        bin=$(pg_bindir)
    fi
    if [ -z "$bin" ]; then
        log "no PostgreSQL server binaries; the PostgreSQL tests will skip"
        exit 0
    fi
fi

if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres >&2 || true
    id postgres >/dev/null 2>&1 || { log "no postgres user to run the server"; exit 0; }
    chown postgres "$dir" || { log "cannot hand $dir to the postgres user"; exit 0; }
fi

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])') \
    || { log "no free port"; exit 0; }

if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_owner "$bin/initdb" -D "$dir/data" -U svtagg -A trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 \
        || { log "initdb failed (see $dir/initdb.log)"; cat "$dir/initdb.log" >&2; exit 0; }
fi
as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=on -c synchronous_commit=on" \
    start >&2 || { log "the server did not start (see $dir/server.log)"; cat "$dir/server.log" >&2; exit 0; }
as_owner "$bin/createdb" -h 127.0.0.1 -p "$port" -U svtagg svtagg_test >&2 \
    || { log "createdb failed"; exit 0; }
log "$("$bin/postgres" --version) on 127.0.0.1:$port (data in $dir/data)"
echo "postgresql://svtagg@127.0.0.1:$port/svtagg_test"
