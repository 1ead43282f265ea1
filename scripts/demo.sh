#!/usr/bin/env bash
# Runs the demo: bash scripts/demo.sh [--airflow V] [DEMO ARGS...]
#
# --airflow V picks the environment .venvs/airflow-V, built on first use. The default is the newest
# stable release the suite runs (noxfile.py's DEMO_DEFAULT: the newest [matrix] version without a
# letter in parity/expectations.toml), whose bug most deployments have: duplicate heartbeat-timeout
# callbacks. The demo says which release, which bug to expect and about how long before it starts:
# about 2 minutes for the default (a stock run and a fixed run of about a minute each), plus the
# environment's build the first time.
# Every other argument goes to `airflow-heartbeat-fix demo` (this is `nox -s demo -- ARGS`).
# With --database postgresql://..., the local PostgreSQL is started first (scripts/postgres.sh).
# With --executor celery [--schedulers 2] [--scenario S]: the environment .venvs/airflow-V-celery, the
# local Redis as broker (scripts/redis.sh) and, without --database, a fresh local PostgreSQL database.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ " $* " == *" --help "* || " $* " == *" -h "* ]]; then
    sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'
    # The default release, read where the releases are named: the last of the matrix without a letter.
    matrix=$(sed -n '/^\[matrix\]/,/^\[bugs/ s/^versions = \[\(.*\)\]$/\1/p' parity/expectations.toml | tr -d '" ' | tr ',' '\n')
    echo "Default release today: $(grep -v '[a-z]' <<<"$matrix" | tail -1) (newest: $(tail -1 <<<"$matrix"))"
    # The demo's own options, if an environment exists already (help builds nothing).
    for cli in .venvs/airflow-*/bin/airflow-heartbeat-fix; do
        [[ -x "$cli" ]] && { echo; "$cli" demo --help; break; }
    done
    exit 0
fi
exec bash scripts/nox.sh -s demo -- "$@"
