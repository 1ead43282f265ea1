#!/usr/bin/env bash
# The project's test command: bash scripts/test.sh [NOX ARGS...] [-- PYTEST ARGS...]
#
# Runs the default sessions of noxfile.py with nox (bootstrapped by scripts/nox.sh), two at a time
# (nox --parallel 2; the machine has 2 cores): lint, breeze_overrides, package, install_check per
# release, the cells tests(airflow, db, mode) = the releases of parity/expectations.toml's [matrix]
# (versions: sqlite and postgres; sweep: sqlite) x fixed stock, then, one at a time, the demo end to
# end e2e(airflow, db), its Celery topology e2e_celery(airflow, scenario) (PostgreSQL, Redis) and parity.
# Stock mode runs with AIRFLOW__HEARTBEAT_FIX__ENABLED=False: each needed fix's tests are strict xfails.
# Results: test-results/<cell>.xml and <cell>.log (wiped at the start), nox-report.json. The last
# line printed is "N passed, M failed"; the exit status is non-zero if any session failed.
#
# Narrowing: arguments go to nox, arguments after -- to pytest, e.g.
#   bash scripts/test.sh -s "tests(airflow='3.4.0b2', db='sqlite', mode='fixed')" -- -k retry -x
#   bash scripts/test.sh -k "sqlite and fixed"        (nox keywords over the session names)
#   bash scripts/test.sh -s lint breeze_overrides
#   bash scripts/test.sh -l                           (lists the sessions, runs nothing)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

case "${1:-}" in
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -l | --list) exec bash scripts/nox.sh --list ;;
esac
rm -rf test-results
mkdir test-results
rc=0
bash scripts/nox.sh --parallel 2 --report test-results/nox-report.json "$@" || rc=$?
# Each cell's counts; "N passed, M failed" last.
.venvs/_tools/bin/python noxfile.py || rc=$?
exit "$rc"
