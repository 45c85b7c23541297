#!/bin/sh
# As the official PostgreSQL image does, in the parts the compose file uses: on an empty data
# directory, initdb with POSTGRES_USER (default postgres) and POSTGRES_PASSWORD (required),
# password logins (scram-sha-256) from other containers, the database POSTGRES_DB, and the
# /docker-entrypoint-initdb.d/*.sql and *.sh files run once, in name order, by POSTGRES_USER in it.
set -eu
if [ "${1:-}" = "postgres" ]; then
  user="${POSTGRES_USER:-postgres}"
  db="${POSTGRES_DB:-$user}"
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [ "$db" != "postgres" ]; then
      psql -v ON_ERROR_STOP=1 -U "$user" -d postgres -q -c "CREATE DATABASE \"$db\""
    fi
    export POSTGRES_USER="$user" POSTGRES_DB="$db"
    for f in /docker-entrypoint-initdb.d/*; do
      case "$f" in
        *.sh) echo "running $f"; sh "$f" ;;
        *.sql) echo "running $f"; psql -v ON_ERROR_STOP=1 -U "$user" -d "$db" -q -f "$f" ;;
      esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
  shift
  exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
