#!/usr/bin/env bash
# Upstream parity run: bash scripts/parity.sh [--reuse] [TEST.SH FLAGS...] [-- PYTEST ARGS...]
#
# Runs the full test matrix with scripts/test.sh (Airflow 3.2.2, 3.3.2, 3.4.0b1, 3.4.0b2 x SQLite,
# PostgreSQL x fixed, stock; it builds or reuses the venvs under .venvs/ and the local PostgreSQL), then
# scripts/parity_report.py, which checks every mirrored test in every cell against
# parity/expectations.toml and writes parity/REPORT.md and parity/report.json.
#
#   --reuse          don't run the matrix: report on the existing test-results/*.xml (e.g. in CI, after
#                    the test run it already did)
#   TEST.SH FLAGS    passed to scripts/test.sh (e.g. --jobs 2); narrowing the matrix (--versions, ...)
#                    leaves cells missing, which the report counts as differences
#   -- PYTEST ARGS   passed through scripts/test.sh to pytest
#
# Without --reuse the report reads a private copy of this run's junit XML (parity/snapshot_plugin.py),
# not test-results/, which the next queued scripts/test.sh run in this checkout wipes as it starts.
#
# Exit status: non-zero if any cell differs from the declaration (the report says which and why), if
# the expectations file is invalid, or if the matrix run itself failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

REUSE=0
TEST_FLAGS=()
PYTEST_ARGS=()
while (($#)); do
    case "$1" in
        --reuse) REUSE=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; PYTEST_ARGS=("$@"); break ;;
        *) TEST_FLAGS+=("$1"); shift ;;
    esac
done
if ((REUSE)) && ((${#TEST_FLAGS[@]} + ${#PYTEST_ARGS[@]})); then
    echo "parity.sh: --reuse runs no tests; it takes no other arguments" >&2
    exit 2
fi

# The report needs Python 3.11+ (tomllib): the machine's python3, else one of the test venvs'.
pick_python() {
    local py
    for py in "${HEARTBEAT_FIX_PYTHON:-python3}" .venvs/airflow-*/bin/python; do
        if [[ -x "$(command -v "$py" 2>/dev/null)" ]] && "$py" -c 'import tomllib' 2>/dev/null; then
            echo "$py"; return 0
        fi
    done
    echo "parity.sh: no Python 3.11+ (with tomllib) found for scripts/parity_report.py" >&2
    return 1
}
PYTHON="$(pick_python)"

matrix_rc=0
REPORT_ARGS=()
if ((REUSE)); then
    echo "parity.sh: --reuse: reporting on the existing test-results/"
    RESULTS=test-results
else
    # The commit under test, before the run (the report would otherwise read it afterwards).
    tested="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
        tested+=" (with uncommitted changes)"
    fi
    REPORT_ARGS+=(--tested "$tested")
    RESULTS="$(mktemp -d "${TMPDIR:-/tmp}/hbfix-parity-results.XXXXXX")"
    trap 'rm -rf "$RESULTS"' EXIT
    t0=$SECONDS
    HEARTBEAT_FIX_PARITY_SNAPSHOT="$RESULTS" bash scripts/test.sh ${TEST_FLAGS[@]+"${TEST_FLAGS[@]}"} \
        -- -p parity.snapshot_plugin ${PYTEST_ARGS[@]+"${PYTEST_ARGS[@]}"} || matrix_rc=$?
    echo "parity.sh: test matrix took $((SECONDS - t0))s (scripts/test.sh exit $matrix_rc)"
fi

report_rc=0
"$PYTHON" scripts/parity_report.py --results "$RESULTS" ${REPORT_ARGS[@]+"${REPORT_ARGS[@]}"} || report_rc=$?

if ((report_rc != 0)); then
    exit "$report_rc"
fi
if ((matrix_rc != 0)); then
    echo "parity.sh: every mirrored cell is as declared, but scripts/test.sh failed (exit $matrix_rc):" \
        "see test-results/SUMMARY.md" >&2
    exit "$matrix_rc"
fi
