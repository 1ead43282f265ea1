#!/usr/bin/env bash
# The local PostgreSQL the tests use (CI runs as root on a bare Debian machine without Docker):
#   bash scripts/postgres.sh start            install Debian's postgresql if missing, start its cluster,
#                                             ensure role airflow/airflow (CREATEDB); prints the server URL
#   bash scripts/postgres.sh create-db NAME   start, then drop and create the empty database NAME owned
#                                             by airflow; prints its SQLAlchemy URL
set -euo pipefail

log() { echo "postgres.sh: $*" >&2; }
as_postgres() { runuser -u postgres -- psql -p "$PORT" -qAtX -v ON_ERROR_STOP=1 -d postgres >/dev/null; }
# Newest installed server major version (Debian layout: /usr/lib/postgresql/<major>/bin/postgres).
server_version() { compgen -G '/usr/lib/postgresql/*/bin/postgres' | sort -V | tail -n1 | cut -d/ -f5; }

start() {
    if ! command -v pg_ctlcluster >/dev/null || [[ -z "$(server_version)" ]]; then
        [[ "$(id -u)" == 0 ]] || { log "no PostgreSQL server and not root: apt-get install postgresql"; exit 1; }
        log "installing Debian's postgresql"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2 9>&- && apt-get install -y -qq postgresql >&2 9>&-
    fi
    local ver status
    ver="$(server_version)"
    if ! pg_lsclusters -h | awk -v v="$ver" '$1 == v && $2 == "main" {f = 1} END {exit !f}'; then
        pg_createcluster "$ver" main -- --auth-local=peer --auth-host=scram-sha-256 >&2 9>&-
    fi
    read -r PORT status < <(pg_lsclusters -h | awk -v v="$ver" '$1 == v && $2 == "main" {print $3, $4}')
    # 9>&-: a server started here must not inherit (and hold forever) the provisioning lock.
    [[ "$status" == online* ]] || pg_ctlcluster "$ver" main start >&2 9>&-
    for _ in $(seq 60); do pg_isready -q -h 127.0.0.1 -p "$PORT" && break; sleep 0.5; done
    pg_isready -q -h 127.0.0.1 -p "$PORT" || { log "PostgreSQL $ver not accepting connections on $PORT"; exit 1; }
    as_postgres <<'SQL'
SELECT 'CREATE ROLE airflow' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'airflow') \gexec
ALTER ROLE airflow WITH LOGIN CREATEDB PASSWORD 'airflow';
SQL
    URL="postgresql+psycopg://airflow:airflow@127.0.0.1:$PORT"
}

# One provisioning at a time: test cells run in parallel and share the machine's server.
exec 9>/tmp/hbfix-postgres.lock
flock -w 300 9 || { log "waited 300 s for /tmp/hbfix-postgres.lock; another provisioning is stuck"; exit 1; }
case "${1:-}" in
    start) start; echo "$URL" ;;
    create-db)
        name="${2:?create-db needs a database name}"
        [[ "$name" =~ ^[a-z_][a-z0-9_]*$ ]] || { log "bad database name '$name'"; exit 2; }
        start
        # FORCE drops connections a crashed run left; synchronous_commit=off: a throwaway database.
        as_postgres <<SQL
SET client_min_messages = warning;
DROP DATABASE IF EXISTS "$name" WITH (FORCE);
CREATE DATABASE "$name" OWNER airflow;
ALTER DATABASE "$name" SET synchronous_commit = off;
SQL
        echo "$URL/$name" ;;
    *) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
