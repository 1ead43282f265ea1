#!/usr/bin/env bash
# Runs the demo: bash scripts/demo.sh [--airflow V] [demo args...]
#
# --airflow V (default 3.4.0b2) picks the venv .venvs/airflow-V and is consumed here; every other
# argument goes unchanged to `airflow-heartbeat-fix demo`. PostgreSQL is set up (and
# HEARTBEAT_FIX_PG_URL_BASE exported) only when the demo is asked for `--database postgres...`.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

main() {
    local version=3.4.0b2 want_pg=0
    local -a args=()
    while (($#)); do
        case "$1" in
            --airflow) version="${2:?--airflow needs a version}"; shift 2; continue ;;
            --airflow=*) version="${1#*=}"; shift; continue ;;
            --database) [[ "${2:-}" == postgres* ]] && want_pg=1 ;;
            --database=postgres*) want_pg=1 ;;
        esac
        args+=("$1"); shift
    done

    ensure_venv "$version"
    ((want_pg)) && ensure_postgres
    exec "$VENVS_DIR/airflow-$version/bin/airflow-heartbeat-fix" demo "${args[@]}"
}

main "$@"
