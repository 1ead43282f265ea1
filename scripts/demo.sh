#!/usr/bin/env bash
# Runs the demo: bash scripts/demo.sh [--airflow V] [DEMO ARGS...]
#
# --airflow V (default: the newest Airflow, 3.4.0b2) picks the environment .venvs/airflow-V, built on
# first use; every other argument goes to `airflow-heartbeat-fix demo` (this is `nox -s demo -- ARGS`).
# With --database postgresql://..., the local PostgreSQL is started first (scripts/postgres.sh).
# With --executor celery [--schedulers 2] [--scenario S]: the environment .venvs/airflow-V-celery, the
# local Redis as broker (scripts/redis.sh) and, without --database, a fresh local PostgreSQL database.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ " $* " == *" --help "* || " $* " == *" -h "* ]]; then
    sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'
    # The demo's own options, if an environment exists already (help builds nothing).
    for cli in .venvs/airflow-*/bin/airflow-heartbeat-fix; do
        [[ -x "$cli" ]] && { echo; "$cli" demo --help; break; }
    done
    exit 0
fi
exec bash scripts/nox.sh -s demo -- "$@"
