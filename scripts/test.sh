#!/usr/bin/env bash
# The project's test command: bash scripts/test.sh
#
# Runs tests/ over the matrix  Airflow version x database x mode,  each cell with its own venv,
# empty database and AIRFLOW_HOME, two cells at a time, plus one "lint" cell (ruff + mypy).
# Results: test-results/<cell>.xml (junit), test-results/<cell>.log, test-results/SUMMARY.md.
# The last line printed is "N passed, M failed"; the exit status is non-zero if any cell failed.
#
# Narrowing (flags win over environment; lists are comma- or space-separated):
#   --versions 3.4.0b2      HEARTBEAT_FIX_VERSIONS   (default: 3.2.2 3.3.2 3.4.0b1 3.4.0b2)
#   --dbs sqlite            HEARTBEAT_FIX_DBS        (default: sqlite postgres)
#   --modes fixed           HEARTBEAT_FIX_MODES      (default: fixed stock)
#   --jobs N                HEARTBEAT_FIX_JOBS       (default: 2, the machine has 2 cores)
#   --no-lint               HEARTBEAT_FIX_LINT=0
#   --e2e "V:DB ..."        HEARTBEAT_FIX_E2E        (default: 3.4.0b2:sqlite 3.3.2:sqlite 3.4.0b2:postgres)
#                           the full demo (pytest tests/e2e), after the matrix, one at a time
#   --no-e2e                HEARTBEAT_FIX_E2E=""
#   --cell-timeout SECONDS  HEARTBEAT_FIX_CELL_TIMEOUT (default: 600; a cell takes 1-2 min)
#   --deadline SECONDS      HEARTBEAT_FIX_DEADLINE   (default: 4500; no cell starts later than this
#                           after the start, so hung cells can't run past CI's 90 min limit)
#   -- ARGS...              extra pytest arguments, e.g. -- -k retry -x
#
# Contract with tests/conftest.py, per cell:
#   HEARTBEAT_FIX_TEST_DB_URL          SQLAlchemy URL of an empty database (conftest migrates it)
#   AIRFLOW_HOME                       fresh directory
#   AIRFLOW__HEARTBEAT_FIX__ENABLED    True (mode fixed) / False (mode stock; needed fixes are strict xfail)
# Also set, informational: HEARTBEAT_FIX_CELL, HEARTBEAT_FIX_AIRFLOW_VERSION, HEARTBEAT_FIX_DB, HEARTBEAT_FIX_MODE.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

ALL_VERSIONS="3.2.2 3.3.2 3.4.0b1 3.4.0b2"
LINT_VERSION=3.4.0b2
RESULTS="$REPO_ROOT/test-results"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

_words() { echo "${*//,/ }"; }   # "a,b c" -> "a b c"

parse_args() {
    VERSIONS="$(_words "${HEARTBEAT_FIX_VERSIONS:-$ALL_VERSIONS}")"
    DBS="$(_words "${HEARTBEAT_FIX_DBS:-sqlite postgres}")"
    MODES="$(_words "${HEARTBEAT_FIX_MODES:-fixed stock}")"
    JOBS="${HEARTBEAT_FIX_JOBS:-2}"
    LINT="${HEARTBEAT_FIX_LINT:-1}"
    E2E="$(_words "${HEARTBEAT_FIX_E2E-3.4.0b2:sqlite 3.3.2:sqlite 3.4.0b2:postgres}")"
    CELL_TIMEOUT="${HEARTBEAT_FIX_CELL_TIMEOUT:-600}"
    DEADLINE="${HEARTBEAT_FIX_DEADLINE:-4500}"
    PYTEST_EXTRA=()
    while (($#)); do
        case "$1" in
            --versions) VERSIONS="$(_words "$2")"; shift 2 ;;
            --versions=*) VERSIONS="$(_words "${1#*=}")"; shift ;;
            --dbs) DBS="$(_words "$2")"; shift 2 ;;
            --dbs=*) DBS="$(_words "${1#*=}")"; shift ;;
            --modes) MODES="$(_words "$2")"; shift 2 ;;
            --modes=*) MODES="$(_words "${1#*=}")"; shift ;;
            --jobs) JOBS="$2"; shift 2 ;;
            --jobs=*) JOBS="${1#*=}"; shift ;;
            --cell-timeout) CELL_TIMEOUT="$2"; shift 2 ;;
            --deadline) DEADLINE="$2"; shift 2 ;;
            --no-lint) LINT=0; shift ;;
            --e2e) E2E="$(_words "$2")"; shift 2 ;;
            --e2e=*) E2E="$(_words "${1#*=}")"; shift ;;
            --no-e2e) E2E=""; shift ;;
            -h | --help) usage; exit 0 ;;
            --) shift; PYTEST_EXTRA=("$@"); break ;;
            *) die "unknown argument '$1' (see --help)" ;;
        esac
    done
    local d m
    for d in $DBS; do [[ "$d" == sqlite || "$d" == postgres ]] || die "unknown db '$d'"; done
    for m in $MODES; do [[ "$m" == fixed || "$m" == stock ]] || die "unknown mode '$m'"; done
    [[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "--jobs wants a positive number"
}

# ---------------------------------------------------------------------------
# cells
# ---------------------------------------------------------------------------

# Each cell records its outcome in test-results/cells/<cell>/{rc,seconds,note} so the parent
# doesn't need to track background PIDs.
_finish_cell() {
    local dir="$1" rc="$2" t0="$3" note="${4:-}"
    echo "$((SECONDS - t0))" >"$dir/seconds"
    echo "$note" >"$dir/note"
    echo "$rc" >"$dir/rc"
}

# A pytest cell's outcome, with a note saying why it failed.
_finish_pytest_cell() {
    local dir="$1" rc="$2" t0="$3" note=""
    case "$rc" in
        0) ;;
        5) note="no tests collected" ;;
        124 | 137) note="timed out after ${CELL_TIMEOUT}s" ;;
        *) note="pytest exit $rc" ;;
    esac
    _finish_cell "$dir" "$rc" "$t0" "$note"
}

run_test_cell() {
    local version="$1" db="$2" mode="$3"
    local cell="$version-$db-$mode" t0=$SECONDS
    local dir="$RESULTS/cells/$cell" url rc
    mkdir -p "$dir/home"
    case "$db" in
        sqlite) url="sqlite:///$dir/airflow.db" ;;   # $dir is absolute, so this is sqlite:////abs/...
        postgres)
            # One database per cell, tagged with the checkout so two clones can test at once:
            # hbfix_<6 hex of repo path>_3_4_0b2_fixed
            local dbname="hbfix_${CHECKOUT_TAG}_${version//./_}_${mode}"
            if ! create_pg_db "$dbname" 2>"$dir/createdb.err"; then
                cp "$dir/createdb.err" "$RESULTS/$cell.log"
                _finish_cell "$dir" 1 "$t0" "could not create database"; return
            fi
            url="$HEARTBEAT_FIX_PG_URL_BASE/$dbname" ;;
    esac
    local enabled=True; [[ "$mode" == stock ]] && enabled=False

    set +e
    env -u AIRFLOW__DATABASE__SQL_ALCHEMY_CONN -u AIRFLOW_CONFIG \
        AIRFLOW_HOME="$dir/home" \
        HEARTBEAT_FIX_TEST_DB_URL="$url" \
        AIRFLOW__HEARTBEAT_FIX__ENABLED="$enabled" \
        HEARTBEAT_FIX_CELL="$cell" HEARTBEAT_FIX_AIRFLOW_VERSION="$version" \
        HEARTBEAT_FIX_DB="$db" HEARTBEAT_FIX_MODE="$mode" \
        timeout --kill-after=30 "$CELL_TIMEOUT" \
        "$VENVS_DIR/airflow-$version/bin/python" -m pytest tests -q -p no:randomly \
        --junitxml="$RESULTS/$cell.xml" "${PYTEST_EXTRA[@]}" \
        </dev/null >"$RESULTS/$cell.log" 2>&1 8>&-
    rc=$?
    set -e
    _finish_pytest_cell "$dir" "$rc" "$t0"
}

# The full demo (stock then fixed, real scheduler, Dag processor and API server) as a pytest run.
# Alone after the matrix: its heartbeat timing must not compete with two test cells for 2 cores.
run_e2e_cell() {
    local version="$1" db="$2"
    local cell="e2e-$version-$db" t0=$SECONDS
    local dir="$RESULTS/cells/$cell" database="" rc
    mkdir -p "$dir/home"
    [[ "$db" == postgres ]] && database="$HEARTBEAT_FIX_PG_URL_BASE/hbfix_${CHECKOUT_TAG}_demo_${version//./_}"
    set +e
    env -u AIRFLOW__DATABASE__SQL_ALCHEMY_CONN -u AIRFLOW_CONFIG \
        AIRFLOW_HOME="$dir/home" HEARTBEAT_FIX_TEST_DB_URL="sqlite:///$dir/airflow.db" \
        HEARTBEAT_FIX_DEMO_DATABASE="$database" HEARTBEAT_FIX_CELL="$cell" \
        timeout --kill-after=30 "$CELL_TIMEOUT" \
        "$VENVS_DIR/airflow-$version/bin/python" -m pytest tests/e2e -q -p no:randomly \
        --junitxml="$RESULTS/$cell.xml" </dev/null >"$RESULTS/$cell.log" 2>&1 8>&-
    rc=$?
    set -e
    _finish_pytest_cell "$dir" "$rc" "$t0"
}

run_lint_cell() {
    local dir="$RESULTS/cells/lint" t0=$SECONDS rc=0 note="" bin="$VENVS_DIR/airflow-$LINT_VERSION/bin"
    mkdir -p "$dir"
    {
        echo "\$ ruff check ."
        "$bin/ruff" check . || { rc=1; note="ruff"; }
        echo "\$ mypy"
        "$bin/mypy" || { rc=1; note="${note:+$note, }mypy"; }
    } </dev/null >"$RESULTS/lint.log" 2>&1 8>&-
    _finish_cell "$dir" "$rc" "$t0" "${note:+$note failed}"
}

# The Breeze checksum override's regression tests: plain pytest, no Airflow database.
run_breeze_overrides_cell() {
    local cell="breeze-overrides" t0=$SECONDS rc
    mkdir -p "$RESULTS/cells/$cell"
    set +e
    "$VENVS_DIR/airflow-$LINT_VERSION/bin/python" -m pytest breeze_overrides/tests -q -p no:randomly \
        --junitxml="$RESULTS/$cell.xml" </dev/null >"$RESULTS/$cell.log" 2>&1 8>&-
    rc=$?
    set -e
    _finish_pytest_cell "$RESULTS/cells/$cell" "$rc" "$t0"
}

# Runs the cells in SPECS ("function arg...", cell name in CELLS at the same index), at most
# $JOBS at a time. Cells that would start after the deadline are failed without running.
run_queue() {
    local running=0 i spec
    for i in "${!SPECS[@]}"; do
        spec="${SPECS[i]}"
        while ((running >= JOBS)); do wait -n || true; ((running--)); done
        if ((SECONDS >= DEADLINE)); then
            mkdir -p "$RESULTS/cells/${CELLS[i]}"
            _finish_cell "$RESULTS/cells/${CELLS[i]}" 125 "$SECONDS" "not started: run deadline ${DEADLINE}s passed"
            continue
        fi
        # shellcheck disable=SC2086  # spec is "function arg arg", split on purpose
        ( set +e; $spec ) &
        ((++running))
    done
    wait || true
}

# ---------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------

# Prints the table, writes SUMMARY.md, prints "N passed, M failed" last; returns 1 if any cell failed.
summarize() {
    python3 - "$RESULTS" "$@" <<'PY'
import os, sys, xml.etree.ElementTree as ET

results, cells = sys.argv[1], sys.argv[2:]

def read(cell, name, default=""):
    try:
        with open(os.path.join(results, "cells", cell, name)) as f:
            return f.read().strip()
    except OSError:
        return default

rows, tot_pass, tot_fail, any_bad = [], 0, 0, False
for cell in cells:
    c = dict(passed=0, failed=0, xfailed=0, skipped=0, errors=0)
    xml = os.path.join(results, cell + ".xml")
    if cell != "lint" and os.path.exists(xml):
        try:
            for tc in ET.parse(xml).getroot().iter("testcase"):
                kinds = {child.tag: child for child in tc}
                if "error" in kinds:
                    c["errors"] += 1
                elif "failure" in kinds:
                    c["failed"] += 1
                elif "skipped" in kinds:
                    c["xfailed" if kinds["skipped"].get("type") == "pytest.xfail" else "skipped"] += 1
                else:
                    c["passed"] += 1
        except ET.ParseError as e:
            c["note_xml"] = f"bad junit xml: {e}"
    rc = read(cell, "rc", "?")
    note = read(cell, "note") or c.pop("note_xml", "")
    ok = rc == "0" and c["failed"] == 0 and c["errors"] == 0
    if cell != "lint" and ok and sum(c[k] for k in ("passed", "failed", "xfailed", "skipped", "errors")) == 0:
        ok, note = False, note or "no tests ran"
    if rc == "?":
        ok, note = False, "cell did not finish"
    bad = c["failed"] + c["errors"]
    # A cell that failed without a failing test in its XML (crash, exit 5, timeout, lint) still
    # counts as one failure, so "M failed" is never 0 when the run fails.
    if not ok and bad == 0:
        bad = 1
    tot_pass += c["passed"]
    tot_fail += bad
    any_bad |= not ok
    rows.append((cell, "ok" if ok else "FAIL", c["passed"], c["failed"], c["xfailed"], c["skipped"],
                 c["errors"], read(cell, "seconds", "?"), note))

head = ("cell", "result", "passed", "failed", "xfailed", "skipped", "errors", "seconds", "note")
widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
fmt = lambda r: "  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip()
print(fmt(head))
print(fmt(["-" * w for w in widths]))
for r in rows:
    print(fmt(r))

with open(os.path.join(results, "SUMMARY.md"), "w") as f:
    f.write("# Test matrix summary\n\n")
    f.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
    for r in rows:
        f.write("| " + " | ".join(str(v) for v in r) + " |\n")
    f.write(f"\n**{tot_pass} passed, {tot_fail} failed**\n")

print()
print(f"{tot_pass} passed, {tot_fail} failed")
sys.exit(1 if any_bad else 0)
PY
}

# Shows the end of each failed cell's log, so CI output explains the failure without artifacts.
show_failures() {
    local cell rc
    for cell in "$@"; do
        rc="$(cat "$RESULTS/cells/$cell/rc" 2>/dev/null || echo '?')"
        [[ "$rc" == 0 ]] && continue
        echo "===== $cell (exit $rc): last lines of test-results/$cell.log ====="
        tail -n 40 "$RESULTS/$cell.log" 2>/dev/null || echo "(no log)"
    done
}

main() {
    parse_args "$@"
    local t0=$SECONDS v d m
    CHECKOUT_TAG="$(printf '%s' "$REPO_ROOT" | sha256sum | cut -c1-6)"
    # One run per checkout at a time: runs share test-results/ and the cell databases.
    mkdir -p "$VENVS_DIR"
    # (cells close fd 8, so a stray leftover process from a cell cannot hold the lock)
    exec 8>"$VENVS_DIR/.test-run.lock"
    flock -n 8 || { log "another scripts/test.sh is running in this checkout; waiting for it"; flock 8; }
    rm -rf "$RESULTS"
    mkdir -p "$RESULTS/cells"

    # Venvs first, one at a time: they share the uv cache and the project's build directory.
    local needed="$VERSIONS" e
    ((LINT)) && [[ " $needed " != *" $LINT_VERSION "* ]] && needed="$needed $LINT_VERSION"
    for e in $E2E; do [[ " $needed " != *" ${e%%:*} "* ]] && needed="$needed ${e%%:*}"; done
    for v in $needed; do ensure_venv "$v"; done
    [[ " $DBS $E2E " == *postgres* ]] && ensure_postgres
    log "setup done in $((SECONDS - t0))s"

    # Lint first: it's short and fills a slot while the first test cells start.
    SPECS=() CELLS=()
    if ((LINT)); then
        SPECS+=("run_lint_cell" "run_breeze_overrides_cell")
        CELLS+=("lint" "breeze-overrides")
    fi
    for v in $VERSIONS; do
        for d in $DBS; do
            for m in $MODES; do
                SPECS+=("run_test_cell $v $d $m")
                CELLS+=("$v-$d-$m")
            done
        done
    done
    log "running ${#CELLS[@]} cells, $JOBS at a time: ${CELLS[*]}"
    run_queue
    log "matrix done in $((SECONDS - t0))s total"

    local all=("${CELLS[@]}")
    if [[ -n "$E2E" ]]; then
        log "running the demo end to end, one at a time: $E2E"
        for e in $E2E; do
            all+=("e2e-${e%%:*}-${e##*:}")
            if ((SECONDS >= DEADLINE)); then
                mkdir -p "$RESULTS/cells/e2e-${e%%:*}-${e##*:}"
                _finish_cell "$RESULTS/cells/e2e-${e%%:*}-${e##*:}" 125 "$SECONDS" \
                    "not started: run deadline ${DEADLINE}s passed"
                continue
            fi
            (set +e; run_e2e_cell "${e%%:*}" "${e##*:}")
        done
        log "e2e done in $((SECONDS - t0))s total"
    fi

    show_failures "${all[@]}"
    summarize "${all[@]}"
}

# One line on purpose: bash reads a script as it runs, so an edit made during a run must not be executed.
main "$@"; exit $?
