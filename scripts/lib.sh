# shellcheck shell=bash
# Shared helpers for scripts/test.sh and scripts/demo.sh. Source it; don't run it.
#
#   ensure_venv V       -> .venvs/airflow-V with apache-airflow==V + this project (editable, [dev] extra)
#   ensure_postgres     -> a running local PostgreSQL with role airflow/airflow; exports
#                          HEARTBEAT_FIX_PG_URL_BASE (no database part)
#   create_pg_db NAME   -> (re)creates database NAME owned by airflow
#
# Knobs (environment):
#   HEARTBEAT_FIX_PYTHON     interpreter for new venvs (default: python3)
#   HEARTBEAT_FIX_INSTALLER  auto (uv, falling back to pip) | uv | pip
#   HEARTBEAT_FIX_UV_VERSION uv release bootstrapped into .venvs/_tools

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENVS_DIR="$REPO_ROOT/.venvs"
: "${HEARTBEAT_FIX_PYTHON:=python3}"
: "${HEARTBEAT_FIX_INSTALLER:=auto}"
: "${HEARTBEAT_FIX_UV_VERSION:=0.13.9}"
# Never let uv fetch a managed CPython: the venvs must use the machine's interpreter.
export UV_PYTHON_DOWNLOADS=never

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

_sha256() { sha256sum "$1" | cut -d' ' -f1; }

# ---------------------------------------------------------------------------
# uv bootstrap
# ---------------------------------------------------------------------------

# Prints the path of a working uv, installing it into .venvs/_tools on first use.
# Returns non-zero (prints nothing) when uv can't be had, so callers fall back to pip.
_uv_bin() {
    local tools="$VENVS_DIR/_tools" uv
    uv="$tools/bin/uv"
    if [[ -x "$uv" ]] && "$uv" --version 2>/dev/null | grep -qF " $HEARTBEAT_FIX_UV_VERSION"; then
        echo "$uv"; return 0
    fi
    mkdir -p "$VENVS_DIR"
    (
        # A lock, because test.sh and demo.sh may bootstrap at the same time.
        flock 9
        if ! { [[ -x "$uv" ]] && "$uv" --version 2>/dev/null | grep -qF " $HEARTBEAT_FIX_UV_VERSION"; }; then
            log "bootstrapping uv $HEARTBEAT_FIX_UV_VERSION into .venvs/_tools"
            rm -rf "$tools"
            "$HEARTBEAT_FIX_PYTHON" -m venv "$tools" >&2
            # pip's "Location ... is ignored" warnings about the machine's extra local indexes are noise.
            "$tools/bin/pip" install -q "uv==$HEARTBEAT_FIX_UV_VERSION" 2>&1 | grep -v 'is ignored:' >&2 || true
        fi
    ) 9>"$VENVS_DIR/.tools.lock"
    [[ -x "$uv" ]] && "$uv" --version >/dev/null 2>&1 || return 1
    echo "$uv"
}

# ---------------------------------------------------------------------------
# Airflow venvs
# ---------------------------------------------------------------------------

# The stamp ties a venv to the exact constraint file, interpreter and recipe it was built from;
# any change to one of them rebuilds the venv from scratch (no stale packages left behind).
# Bump VENV_RECIPE when the way venvs are built changes (extra packages, installer flags).
VENV_RECIPE=2
_venv_stamp_value() {
    local version="$1"
    printf 'recipe=%s constraints=%s python=%s\n' "$VENV_RECIPE" \
        "$(_sha256 "$REPO_ROOT/constraints/airflow-$version.txt")" \
        "$("$HEARTBEAT_FIX_PYTHON" -c 'import sys; print(sys.version.split()[0], sys.executable)')"
}

# Installs airflow + the project into an existing venv. $1=version $2=venv dir $3=uv|pip
# The project goes in editable with the [dev] extra (pytest, psycopg, ruff, mypy): editable means
# code edits are live, and reinstalling it each run re-registers its entry points (airflow.policy,
# airflow.plugins, the console script) in case pyproject.toml changed.
# asyncpg: Airflow < 3.4 turns a postgresql:// URL into a postgresql+asyncpg:// async engine and
# fails at import without it (a real deployment has it from apache-airflow[postgres]).
_install_into() {
    local version="$1" venv="$2" how="$3" uv
    local cons="$REPO_ROOT/constraints/airflow-$version.txt"
    local -a reqs=("apache-airflow==$version" asyncpg -e "${REPO_ROOT}[dev]")
    if [[ "$how" == uv ]]; then
        uv="$(_uv_bin)" || return 1
        # --compile-bytecode: uv doesn't write .pyc by default (pip does), and this machine sets
        # PYTHONDONTWRITEBYTECODE=1, so without it every process recompiles all of Airflow on
        # import: `import airflow` takes ~10 s instead of ~3 s, in each of the many subprocesses.
        "$uv" pip install --quiet --compile-bytecode --python "$venv/bin/python" -c "$cons" \
            --reinstall-package airflow-heartbeat-fix "${reqs[@]}"
    else
        "$venv/bin/python" -m pip install --quiet -c "$cons" "${reqs[@]}" 2>&1 \
            | { grep -v 'is ignored:' || true; } >&2
        return "${PIPESTATUS[0]}"
    fi
}

# Creates the venv from nothing. $1=version $2=venv dir $3=uv|pip
_build_venv() {
    local version="$1" venv="$2" how="$3" uv
    rm -rf "$venv"
    if [[ "$how" == uv ]]; then
        uv="$(_uv_bin)" || return 1
        # --seed puts pip in the venv too, so developers can use it by hand.
        "$uv" venv --quiet --seed --python "$(command -v "$HEARTBEAT_FIX_PYTHON")" "$venv" || return 1
    else
        "$HEARTBEAT_FIX_PYTHON" -m venv "$venv" || return 1
    fi
    _install_into "$version" "$venv" "$how"
}

# ensure_venv V: make .venvs/airflow-V current; safe to call on every run (a no-op rebuild-wise
# when the stamp matches; then only the project is reinstalled, which takes a second or two).
ensure_venv() {
    local version="$1"
    local venv="$VENVS_DIR/airflow-$version"
    local cons="$REPO_ROOT/constraints/airflow-$version.txt"
    [[ -f "$cons" ]] || die "no constraint file $cons (see constraints/)"
    mkdir -p "$VENVS_DIR"
    (
        flock 9
        local want have="" t0=$SECONDS how
        want="$(_venv_stamp_value "$version")"
        [[ -f "$venv/.heartbeat-fix-stamp" ]] && have="$(cat "$venv/.heartbeat-fix-stamp")"
        if [[ "$want" == "$have" && -x "$venv/bin/python" ]]; then
            # Up to date: only refresh the project itself. Use whichever installer works.
            if [[ "$HEARTBEAT_FIX_INSTALLER" != pip ]] && _install_into "$version" "$venv" uv; then :
            elif [[ "$HEARTBEAT_FIX_INSTALLER" != uv ]] && _install_into "$version" "$venv" pip; then :
            else die "could not reinstall the project into $venv"; fi
            log "venv airflow-$version up to date (project reinstalled in $((SECONDS - t0))s)"
            exit 0
        fi
        log "building venv .venvs/airflow-$version ($([[ -n "$have" ]] && echo "constraints, python or recipe changed" || echo "new"))"
        for how in uv pip; do
            [[ "$HEARTBEAT_FIX_INSTALLER" == auto || "$HEARTBEAT_FIX_INSTALLER" == "$how" ]] || continue
            if _build_venv "$version" "$venv" "$how"; then
                echo "$want" >"$venv/.heartbeat-fix-stamp"
                log "venv airflow-$version built with $how in $((SECONDS - t0))s"
                exit 0
            fi
            log "building venv airflow-$version with $how failed"
        done
        rm -rf "$venv"
        die "could not build venv airflow-$version"
    ) 9>"$VENVS_DIR/.airflow-$version.lock"
}

# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------

: "${HEARTBEAT_FIX_PG_CLUSTER:=main}"
PG_HOST=127.0.0.1

_as_postgres() { runuser -u postgres -- "$@"; }

# Newest server major version installed (Debian layout: /usr/lib/postgresql/<major>/bin/postgres).
_pg_server_version() {
    local bin
    bin="$(printf "%s\n" /usr/lib/postgresql/*/bin/postgres | grep -v "\*" | sort -V | tail -n1)"
    [[ -n "$bin" ]] || return 1
    basename "$(dirname "$(dirname "$bin")")"
}

_pg_install_server() {
    log "installing Debian's postgresql server package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
}

# ensure_postgres: idempotent; leaves the cluster running (CI stops everything at the end anyway).
ensure_postgres() {
    local ver port status
    if ! command -v pg_ctlcluster >/dev/null || ! _pg_server_version >/dev/null; then
        [[ "$(id -u)" == 0 ]] || die "PostgreSQL server missing and not root: apt-get install postgresql"
        _pg_install_server
    fi
    ver="$(_pg_server_version)" || die "no PostgreSQL server binaries after install"

    # Use the Debian cluster <ver>/main (the package normally creates it); create it if absent.
    if ! pg_lsclusters -h 2>/dev/null | awk -v v="$ver" -v c="$HEARTBEAT_FIX_PG_CLUSTER" '$1==v && $2==c {f=1} END {exit !f}'; then
        log "creating PostgreSQL cluster $ver/$HEARTBEAT_FIX_PG_CLUSTER"
        pg_createcluster "$ver" "$HEARTBEAT_FIX_PG_CLUSTER" -- --auth-local=peer --auth-host=scram-sha-256 >&2
    fi
    read -r port status < <(pg_lsclusters -h | awk -v v="$ver" -v c="$HEARTBEAT_FIX_PG_CLUSTER" '$1==v && $2==c {print $3, $4}')

    if [[ "$status" != online* ]]; then
        log "starting PostgreSQL $ver/$HEARTBEAT_FIX_PG_CLUSTER on port $port"
        # pg_ctlcluster run as root drops to the cluster owner itself.
        pg_ctlcluster "$ver" "$HEARTBEAT_FIX_PG_CLUSTER" start >&2 \
            || die "could not start PostgreSQL (see /var/log/postgresql/postgresql-$ver-$HEARTBEAT_FIX_PG_CLUSTER.log)"
    fi
    local i
    for ((i = 0; i < 60; i++)); do
        pg_isready -q -h "$PG_HOST" -p "$port" && break
        sleep 0.5
    done
    pg_isready -q -h "$PG_HOST" -p "$port" || die "PostgreSQL not accepting TCP connections on $PG_HOST:$port"

    # Role airflow/airflow with CREATEDB; ALTER keeps the password right if the role pre-existed.
    _as_postgres psql -p "$port" -qAtX -v ON_ERROR_STOP=1 -d postgres >/dev/null <<'SQL'
SELECT 'CREATE ROLE airflow' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'airflow') \gexec
ALTER ROLE airflow WITH LOGIN CREATEDB PASSWORD 'airflow';
SQL
    export HEARTBEAT_FIX_PG_PORT="$port"
    export HEARTBEAT_FIX_PG_URL_BASE="postgresql+psycopg://airflow:airflow@$PG_HOST:$port"
    log "PostgreSQL $ver ready at $PG_HOST:$port (role airflow)"
}

# create_pg_db NAME: a fresh, empty database owned by airflow. Needs ensure_postgres first.
create_pg_db() {
    local name="$1" port="${HEARTBEAT_FIX_PG_PORT:?call ensure_postgres first}"
    [[ "$name" =~ ^[a-z_][a-z0-9_]*$ ]] || die "bad database name '$name' (use [a-z0-9_])"
    # WITH (FORCE) kicks out connections a crashed earlier run may have left behind.
    # synchronous_commit=off only for this throwaway database: Airflow's migrations commit a lot
    # and waiting for each WAL flush is pure overhead for tests.
    _as_postgres psql -p "$port" -qAtX -v ON_ERROR_STOP=1 -d postgres >/dev/null <<SQL
SET client_min_messages = warning;
DROP DATABASE IF EXISTS "$name" WITH (FORCE);
CREATE DATABASE "$name" OWNER airflow;
ALTER DATABASE "$name" SET synchronous_commit = off;
SQL
}
