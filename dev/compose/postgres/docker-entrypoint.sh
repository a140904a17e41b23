#!/bin/bash
# The upstream postgres image's entrypoint conventions, as far as docker-compose.yml uses them:
# on an empty $PGDATA, initdb with POSTGRES_USER (superuser, default postgres) and
# POSTGRES_PASSWORD (required), password (scram-sha-256) auth for every TCP client, then
# POSTGRES_DB (default: the user) created by a setup server that listens on the Unix socket
# only, as upstream's does; then the real server on every address, as the postgres user.
set -euo pipefail

if [[ ${1:-} != postgres ]]; then
    exec "$@"
fi
shift

# setpriv execs (as upstream's gosu does); runuser stays as the parent and does not hand the
# stop signal on, so postgres was SIGKILLed at `docker compose stop` (make compose-test).
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }

mkdir -p "$PGDATA"
chown postgres:postgres "$PGDATA"
chmod 700 "$PGDATA"

if [[ ! -s $PGDATA/PG_VERSION ]]; then
    user=${POSTGRES_USER:-postgres}
    database=${POSTGRES_DB:-$user}
    if [[ -z ${POSTGRES_PASSWORD:-} ]]; then
        echo "Error: Database is uninitialized and superuser password is not specified." >&2
        echo "       You must specify POSTGRES_PASSWORD to a non-empty value." >&2
        exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    chown postgres "$pwfile"
    as_postgres initdb -D "$PGDATA" --username="$user" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [[ $database != postgres ]]; then
        as_postgres psql -v ON_ERROR_STOP=1 -X -q --username="$user" --dbname=postgres \
            --set=db="$database" <<<'CREATE DATABASE :"db";'
    fi
    as_postgres pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "PostgreSQL init process complete; ready for start up."
fi

exec setpriv --reuid=postgres --regid=postgres --init-groups -- postgres -D "$PGDATA" "$@"
