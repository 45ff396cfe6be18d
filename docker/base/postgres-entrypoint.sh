#!/bin/bash
# The part of the official postgres image's entrypoint that docker-compose.yml uses. On an empty $PGDATA:
# initdb with superuser $POSTGRES_USER (password $POSTGRES_PASSWORD), create $POSTGRES_DB, run
# /docker-entrypoint-initdb.d/*.sql (psql, ON_ERROR_STOP) and *.sh against a server that listens on the
# unix socket only, then stop it. Then run the command (`postgres [-c ...]`), listening on every address
# unless the command says otherwise, with password (scram-sha-256) authentication over TCP.
set -Eeuo pipefail

: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${PGDATA:=/var/lib/postgresql/data}"

init_cluster() {
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "docker-entrypoint: POSTGRES_PASSWORD is not set" >&2
        exit 1
    fi
    local pwfile
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 -D "$PGDATA"
    rm -f "$pwfile"
    printf '\nhost all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"

    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -k /var/run/postgresql" -w start
    local psql=(psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc -h /var/run/postgresql)
    if [ "$POSTGRES_DB" != postgres ]; then
        "${psql[@]}" --dbname postgres --set db="$POSTGRES_DB" <<<'CREATE DATABASE :"db";'
    fi
    local f
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
            *.sql) echo "docker-entrypoint: running $f"; "${psql[@]}" --dbname "$POSTGRES_DB" -f "$f" ;;
            *.sh) echo "docker-entrypoint: sourcing $f"; . "$f" ;;
            *) [ -e "$f" ] && echo "docker-entrypoint: ignoring $f" ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop
    echo "docker-entrypoint: init done"
}

if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    init_cluster
fi
if [ "${1:-}" = postgres ]; then
    shift
    exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
