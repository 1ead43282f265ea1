"""Pure decisions for the demo: database rows and log lines in, results, verdicts and tables out.

Nothing here starts a process or touches a database, so all of it is unit-tested directly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_heartbeat_fix.detection import FIXES, PURGE_FIX, SINK_FIX, FixState

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

RETRY_DAG_ID = "retry_after_heartbeat_timeout"
CALLBACK_DAG_ID = "duplicate_heartbeat_callbacks"
DAG_IDS = (RETRY_DAG_ID, CALLBACK_DAG_ID)
#: ``--scenario many``: fifty mapped task instances that freeze at once, each to fail with one callback.
MANY_DAG_ID = "many_hung_tasks"
MANY_SCENARIO = "many"
#: ``HUNG_TASKS`` of ``dags/many_hung_tasks.py`` (tests/test_dags.py holds them equal).
MANY_TASKS = 50


def scenario_dag_ids(scenario: str) -> tuple[str, ...]:
    """The Dags a run of ``scenario`` deploys and triggers."""
    return (*DAG_IDS, MANY_DAG_ID) if scenario == MANY_SCENARIO else DAG_IDS


RETRY_CALLBACK = "on_retry_callback"
FAILURE_CALLBACK = "on_failure_callback"
EMAIL = "email"
#: What a correct scheduler does for each finished try: one callback, one email.
EXPECTED_PER_TRY = "expected 1 per try"

TERMINAL_RUN_STATES = frozenset({"success", "failed"})

CRASH_MARKER = "Exception when executing SchedulerJob._run_scheduler_loop"
_FIX_SUMMARY = re.compile(
    r"airflow-heartbeat-fix on Airflow \S+: (.*?)(?: \[airflow_heartbeat_fix\]|$)", re.MULTILINE
)
#: ``fix: state`` pairs of that line (an unsupported fix's reason follows in parentheses).
_STATES = sorted((re.escape(state.value) for state in FixState), key=len, reverse=True)  # longest first
_FIX_STATE = re.compile(rf"\b({'|'.join(FIXES)}): ({'|'.join(_STATES)})")
#: The colours structlog's console renderer writes into a log file on some releases (3.1.0).
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_DB_ERROR = re.compile(r"(UniqueViolation|UNIQUE constraint failed|IntegrityError)[^\n]*")
_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Violation))(?::[^\n]*)?$", re.MULTILINE)

CRASH = "crash"
DUPLICATES = "duplicates"


@dataclass(frozen=True)
class TryRow:
    """One try of a task instance: ``where`` is current, archived (3.4) or history (<= 3.3)."""

    task_id: str
    try_number: int
    state: str | None
    where: str
    archived_reason: str | None = None


@dataclass(frozen=True)
class StateChange:
    """A try's task instance state as first seen ``seconds`` after the trigger (polled every second)."""

    seconds: float
    dag_id: str
    try_number: int
    state: str | None


@dataclass(frozen=True)
class Mark:
    """One callback or email (``kind``) about one try, ``seconds`` after the trigger."""

    seconds: float
    dag_id: str
    try_number: int
    kind: str


@dataclass
class DagOutcome:
    dag_id: str
    run_state: str | None = None
    tries: list[TryRow] = field(default_factory=list)
    callbacks: dict[int, dict[str, int]] = field(default_factory=dict)
    emails: dict[int, int] = field(default_factory=dict)
    #: mapped Dags only: map index -> callbacks recorded for it
    per_map_index: dict[int, int] = field(default_factory=dict)


@dataclass
class SchedulerOutcome:
    alive: bool = True
    crashed: bool = False
    exit_code: int | None = None
    error: str | None = None
    fixes: dict[str, str] = field(default_factory=dict)  # fix -> state, as the scheduler logged them


@dataclass
class RunResult:
    label: str
    fix_enabled: bool
    airflow_version: str
    database: str
    home: str
    #: executor, schedulers, workers (:attr:`~airflow_heartbeat_fix.demo.run.Topology.label`)
    topology: str = "LocalExecutor, 1 scheduler"
    scheduler: SchedulerOutcome = field(default_factory=SchedulerOutcome)
    dags: dict[str, DagOutcome] = field(default_factory=dict)
    converged: bool = False
    converge_seconds: float | None = None
    elapsed_seconds: float = 0.0
    stop_reason: str = ""
    problems: list[str] = field(default_factory=list)
    reproduced: bool | None = None
    leftover_pids: list[int] = field(default_factory=list)
    #: fix -> state with the fixes enabled, as the package's detection decides on this Airflow
    needed_fixes: dict[str, str] = field(default_factory=dict)
    #: whether this Airflow sends the Dag processor's email requests through ``[email] email_backend``
    emails_via_backend: bool = True
    #: for the timeline: state changes, callbacks and emails, the crash, all in seconds after the trigger
    timeline: list[StateChange] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    crashed_after: float | None = None
    watched_seconds: float = 0.0
    #: ``--scenario``, and what it did to the components (``SIGKILL scheduler-1 at 23 s``)
    scenario: str = "hung"
    injected: list[str] = field(default_factory=list)
    #: ``--scenario many``: how many mapped task instances the Dag has
    many_expected: int = 0


def result_from_json(data: Mapping[str, Any]) -> RunResult:
    """A run back from its ``--json`` form, e.g. to render the HTML report of a recorded run again."""
    fields = dict(data)
    fields["scheduler"] = SchedulerOutcome(**data["scheduler"])
    fields["dags"] = {
        dag_id: DagOutcome(
            dag_id=dag["dag_id"],
            run_state=dag["run_state"],
            tries=[TryRow(**t) for t in dag["tries"]],
            callbacks={int(n): dict(kinds) for n, kinds in dag["callbacks"].items()},
            emails={int(n): count for n, count in dag["emails"].items()},
            per_map_index={int(n): count for n, count in dag.get("per_map_index", {}).items()},
        )
        for dag_id, dag in data["dags"].items()
    }
    fields["timeline"] = [StateChange(**change) for change in data.get("timeline", [])]
    fields["marks"] = [Mark(**mark) for mark in data.get("marks", [])]
    return RunResult(**fields)


# --- what this Airflow needs ----------------------------------------------------------------------


def expected_stock_bug(needed_fixes: Mapping[str, str]) -> str | None:
    """
    Which bug stock Airflow shows in this demo, from what the package's detection says it needs.

    ``needed_fixes`` maps each fix to its state with the fixes enabled. Where the heartbeat purge does
    not converge, the same try is called back again (duplicates); where it does converge but the callback
    sink still commits the scheduler's session, the retry of the detached task instance crashes the loop.
    """
    if needed_fixes.get(PURGE_FIX) == FixState.ACTIVE.value:
        return DUPLICATES
    if needed_fixes.get(SINK_FIX) == FixState.ACTIVE.value:
        return CRASH
    return None


# --- rows and logs --------------------------------------------------------------------------------


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines text; partial or broken lines are skipped."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def tries_from_rows(
    ti_rows: Iterable[Mapping[str, Any]], history_rows: Iterable[Mapping[str, Any]], dag_id: str
) -> list[TryRow]:
    """
    Every try of ``dag_id``'s task instances, ordered by task and try number.

    Airflow 3.4 keeps each try in ``task_instance``: the current one has ``working_set`` true, earlier
    ones are archived with an ``archived_reason``. Airflow <= 3.3 keeps the current try in
    ``task_instance`` and earlier ones in ``task_instance_history``; there, a task instance waiting for
    its retry still carries the old try number, so a current row in ``up_for_retry`` whose try is already
    in the history is shown as the next try.
    """
    tries: dict[tuple[str, int], TryRow] = {}
    for row in history_rows:
        if row.get("dag_id") != dag_id:
            continue
        key = (str(row["task_id"]), int(row["try_number"]))
        tries[key] = TryRow(key[0], key[1], state_name(row.get("state")), "history")
    for row in ti_rows:
        if row.get("dag_id") != dag_id:
            continue
        task_id, try_number, state = str(row["task_id"]), int(row["try_number"]), state_name(row.get("state"))
        if try_number == 0:  # created, never scheduled: no try yet
            continue
        working_set = row.get("working_set", True)
        if working_set is not None and not working_set:
            continue
        if working_set is None:
            reason = row.get("archived_reason")
            tries[(task_id, try_number)] = TryRow(task_id, try_number, state, "archived", reason)
            continue
        archived = tries.get((task_id, try_number))
        if archived is not None and archived.where == "history" and state == "up_for_retry":
            try_number += 1
        tries[(task_id, try_number)] = TryRow(task_id, try_number, state, "current")
    return [tries[key] for key in sorted(tries)]


def state_name(value: Any) -> str | None:
    if value is None:
        return None
    return str(getattr(value, "value", value))


def count_callbacks(lines: Iterable[Mapping[str, Any]], dag_id: str) -> dict[int, dict[str, int]]:
    """Callback invocations of ``dag_id`` per try number and kind."""
    counts: dict[int, dict[str, int]] = {}
    for line in lines:
        if line.get("dag_id") != dag_id or line.get("try_number") is None:
            continue
        per_try = counts.setdefault(int(line["try_number"]), {})
        kind = str(line.get("kind"))
        per_try[kind] = per_try.get(kind, 0) + 1
    return dict(sorted(counts.items()))


def count_per_map_index(lines: Iterable[Mapping[str, Any]], dag_id: str) -> dict[int, int]:
    """Callback invocations of the mapped Dag ``dag_id`` per map index (every try, every kind)."""
    counts: dict[int, int] = {}
    for line in lines:
        if line.get("dag_id") == dag_id and line.get("map_index") is not None:
            counts[int(line["map_index"])] = counts.get(int(line["map_index"]), 0) + 1
    return dict(sorted(counts.items()))


def many_summary(outcome: DagOutcome, expected: int) -> str:
    """``50/50 failed; callbacks: 50 x1, 0 x2+, 0 none``: the mapped Dag's task instances in one line."""
    failed = sum(1 for t in outcome.tries if t.state == "failed")
    counts = [outcome.per_map_index.get(i, 0) for i in range(expected)]
    once, more, none = counts.count(1), sum(1 for n in counts if n > 1), counts.count(0)
    return f"{failed}/{expected} failed; callbacks: {once} x1, {more} x2+, {none} none ({EXPECTED_PER_TRY})"


def many_problems(outcome: DagOutcome | None, expected: int) -> list[str]:
    """What a correct scheduler pair must do with the fifty hung task instances of ``--scenario many``."""
    if outcome is None:
        return [f"{MANY_DAG_ID}: no Dag run"]
    problems = []
    failed = sum(1 for t in outcome.tries if t.state == "failed")
    if failed != expected:
        problems.append(f"{MANY_DAG_ID}: {failed} of {expected} task instances failed")
    wrong = [i for i in range(expected) if outcome.per_map_index.get(i, 0) != 1]
    if wrong:
        problems.append(f"{MANY_DAG_ID}: {len(wrong)} task instances without exactly one callback")
    return problems


def count_emails(lines: Iterable[Mapping[str, Any]], dag_id: str) -> dict[int, int]:
    """Emails (from the demo's fake email backend) about ``dag_id`` per try number."""
    counts: dict[int, int] = {}
    for line in lines:
        fields = line.get("fields") or {}
        if fields.get("dag_id") != dag_id or fields.get("try_number") is None:
            continue
        try_number = int(fields["try_number"])
        counts[try_number] = counts.get(try_number, 0) + 1
    return dict(sorted(counts.items()))


def find_scheduler_crash(log_text: str) -> str | None:
    """The error that ended the scheduler loop, or None when the loop did not crash."""
    at = log_text.find(CRASH_MARKER)
    if at < 0:
        return None
    tail = log_text[at:]
    if match := _DB_ERROR.search(tail):
        return match.group(0).strip()
    if match := _EXCEPTION_LINE.search(tail):
        return match.group(0).strip()
    return CRASH_MARKER


def find_crash_time(log_text: str) -> float | None:
    """When the scheduler logged its loop's crash (epoch seconds), from the line's ISO timestamp."""
    at = log_text.find(CRASH_MARKER)
    if at < 0:
        return None
    line = log_text[log_text.rfind("\n", 0, at) + 1 : at]
    stamp = line.split(" ", 1)[0].replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def celery_worker_ready(log_text: str) -> bool:
    """Whether a Celery worker's log says it consumes its queue (Celery logs ``<name>@<host> ready.``)."""
    return re.search(r"@\S+ ready\.", log_text) is not None


def scheduler_owning(logs: Mapping[str, str], celery_task_id: str) -> str | None:
    """
    The scheduler whose executor sent the Celery task ``celery_task_id``: it logged setting that id as
    the try's external executor id (matched on the id, since the task instance's repr differs by release).
    """
    if not celery_task_id:
        return None
    pattern = re.compile(rf"Setting external_executor_id for [^\n]* to {re.escape(celery_task_id)}(?!\S)")
    return next(
        (name for name, text in logs.items() if name.startswith("scheduler") and pattern.search(text)), None
    )


def worker_owning(logs: Mapping[str, str], celery_task_id: str) -> str | None:
    """The Celery worker that received the Celery task ``celery_task_id``."""
    if not celery_task_id:
        return None
    pattern = re.compile(rf"\[{re.escape(celery_task_id)}\] received")
    return next(
        (name for name, text in logs.items() if name.startswith("celery-worker") and pattern.search(text)),
        None,
    )


def find_fix_summary(log_text: str) -> dict[str, str]:
    """What the scheduler logged at start about each fix (``fix: state; ...``); empty when not loaded."""
    match = _FIX_SUMMARY.search(_ANSI_ESCAPE.sub("", log_text))
    if match is None:
        return {}
    return dict(_FIX_STATE.findall(match.group(1)))


def all_runs_terminal(dags: Mapping[str, DagOutcome]) -> bool:
    return bool(dags) and all(d.run_state in TERMINAL_RUN_STATES for d in dags.values())


def try_states(dags: Mapping[str, DagOutcome]) -> dict[tuple[str, int], str | None]:
    """``(dag_id, try_number) -> state`` of every try seen now."""
    return {(dag_id, t.try_number): t.state for dag_id, o in dags.items() for t in o.tries}


def state_changes(
    before: Mapping[tuple[str, int], str | None], now: Mapping[tuple[str, int], str | None], seconds: float
) -> list[StateChange]:
    """The tries that are new or changed state between two polls."""
    return [
        StateChange(seconds, dag_id, try_number, state)
        for (dag_id, try_number), state in sorted(now.items())
        if (dag_id, try_number) not in before or before[(dag_id, try_number)] != state
    ]


def marks_from_logs(
    callback_lines: Iterable[Mapping[str, Any]], email_lines: Iterable[Mapping[str, Any]], triggered_at: float
) -> list[Mark]:
    """Callbacks and emails of the demo Dags as marks, timed from ``triggered_at`` (epoch seconds)."""
    marks = []
    for line in callback_lines:
        if line.get("dag_id") in DAG_IDS and line.get("try_number") is not None and line.get("time"):
            seconds = float(line["time"]) - triggered_at
            marks.append(Mark(seconds, str(line["dag_id"]), int(line["try_number"]), str(line.get("kind"))))
    for line in email_lines:
        fields = line.get("fields") or {}
        if fields.get("dag_id") in DAG_IDS and fields.get("try_number") is not None and line.get("time"):
            seconds = float(line["time"]) - triggered_at
            marks.append(Mark(seconds, str(fields["dag_id"]), int(fields["try_number"]), EMAIL))
    return sorted(marks, key=lambda m: (m.seconds, m.dag_id, m.try_number, m.kind))


# --- verdicts -------------------------------------------------------------------------------------


def _total(per_try: Mapping[int, Mapping[str, int]], try_number: int) -> int:
    return sum(per_try.get(try_number, {}).values())


def duplicate_tries(outcome: DagOutcome) -> list[int]:
    """Tries that got more than one callback, or more than one email."""
    dup = {t for t in outcome.callbacks if _total(outcome.callbacks, t) > 1}
    dup |= {t for t, n in outcome.emails.items() if n > 1}
    return sorted(dup)


def _try(outcome: DagOutcome, try_number: int) -> TryRow | None:
    return next((t for t in outcome.tries if t.try_number == try_number), None)


def fixed_problems(result: RunResult) -> list[str]:
    """What the fixed run got wrong; empty when it converged as expected."""
    problems: list[str] = []
    if result.scheduler.crashed or not result.scheduler.alive:
        problems.append(f"scheduler did not survive: {result.scheduler.error or 'exited'}")
    for dag_id in DAG_IDS:
        outcome = result.dags.get(dag_id)
        if outcome is None:
            problems.append(f"{dag_id}: no Dag run")
            continue
        first = _try(outcome, 1)
        if first is None or first.state != "failed":
            problems.append(f"{dag_id}: try 1 is {first.state if first else 'missing'}, expected failed")
        if _try(outcome, 2) is None:
            problems.append(f"{dag_id}: try 2 was not created")
    outcome = result.dags.get(CALLBACK_DAG_ID)
    if outcome is not None:
        for try_number in duplicate_tries(outcome):
            problems.append(f"{CALLBACK_DAG_ID}: duplicate callbacks/emails for try {try_number}")
        if outcome.callbacks.get(1, {}).get(RETRY_CALLBACK, 0) != 1:
            problems.append(f"{CALLBACK_DAG_ID}: try 1 did not get exactly one {RETRY_CALLBACK}")
        second = _try(outcome, 2)
        if second is not None and second.state == "failed" and _total(outcome.callbacks, 2) != 1:
            problems.append(f"{CALLBACK_DAG_ID}: failed try 2 did not get exactly one callback")
        if result.emails_via_backend and outcome.emails.get(1, 0) != 1:
            problems.append(f"{CALLBACK_DAG_ID}: try 1 did not get exactly one email")
    if result.scenario == MANY_SCENARIO:
        problems += many_problems(result.dags.get(MANY_DAG_ID), result.many_expected)
    if not result.converged:
        problems.append(f"did not converge: {result.stop_reason}")
    if result.leftover_pids:
        problems.append(f"processes left running: {result.leftover_pids}")
    return problems


def callbacks_complete(dags: Mapping[str, DagOutcome], emails_via_backend: bool) -> bool:
    """Whether every finished try of the callback Dag has its callback (and email, where counted)."""
    outcome = dags.get(CALLBACK_DAG_ID)
    if outcome is None:
        return True
    for row in outcome.tries:
        if row.state != "failed":
            continue
        if _total(outcome.callbacks, row.try_number) < 1:
            return False
        if emails_via_backend and outcome.emails.get(row.try_number, 0) < 1:
            return False
    return True


def stock_reproduced(result: RunResult) -> bool | None:
    """Whether the stock run shows the bug this Airflow has (None: detection says it needs no fix)."""
    bug = expected_stock_bug(result.needed_fixes)
    if bug == CRASH:
        return result.scheduler.crashed
    if bug == DUPLICATES:
        outcome = result.dags.get(CALLBACK_DAG_ID)
        return bool(outcome and duplicate_tries(outcome))
    return None


# --- progress and tables --------------------------------------------------------------------------


def describe_tries(tries: Iterable[TryRow]) -> str:
    parts = [f"try {t.try_number} {t.state or 'none'}" for t in tries]
    return ", ".join(parts) if parts else "no task instance yet"


def progress_line(dags: Mapping[str, DagOutcome]) -> str:
    parts = []
    for dag_id in DAG_IDS:
        outcome = dags.get(dag_id)
        parts.append(f"{dag_id}: {describe_tries(outcome.tries) if outcome else 'no run yet'}")
    callbacks = dags.get(CALLBACK_DAG_ID)
    if callbacks is not None:
        n_cb = sum(_total(callbacks.callbacks, t) for t in callbacks.callbacks)
        n_mail = sum(callbacks.emails.values())
        parts.append(f"callbacks {n_cb}, emails {n_mail}")
    return "; ".join(parts)


def _try_cell(row: TryRow | None) -> str:
    if row is None:
        return "-"
    if row.where == "archived":
        return f"{row.state} (archived: {row.archived_reason})"
    if row.where == "history":
        return f"{row.state} (task_instance_history)"
    return f"{row.state} (current)"


def callbacks_cell(per_kind: Mapping[str, int]) -> str:
    """``retry x1 (expected 1 per try)``: each kind's count, short names, and what is expected."""
    counts = ", ".join(f"{_short(kind)} x{n}" for kind, n in sorted(per_kind.items())) or "0"
    return f"{counts} ({EXPECTED_PER_TRY})"


def _short(kind: str) -> str:
    return kind.removeprefix("on_").removesuffix("_callback")


def emails_cell(count: int, via_backend: bool) -> str:
    if not via_backend:
        return f"{count} (not counted on this Airflow)"
    return f"{count} ({EXPECTED_PER_TRY})"


def _scheduler_cell(scheduler: SchedulerOutcome) -> str:
    if scheduler.crashed:
        return f"CRASHED: {scheduler.error}"
    if not scheduler.alive:
        return f"EXITED (code {scheduler.exit_code})"
    return "alive"


def verdict_cell(result: RunResult) -> str:
    if not result.fix_enabled:
        bug = expected_stock_bug(result.needed_fixes)
        if result.reproduced is None:
            return "no known bug in this version"
        return f"bug reproduced ({bug})" if result.reproduced else f"bug NOT reproduced ({bug} expected)"
    return (
        "OK: converged as expected" if not result.problems else f"FAILED: {len(result.problems)} problem(s)"
    )


def result_rows(
    result: RunResult, try_numbers: Mapping[str, list[int]], fix_names: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """``(label, value)`` rows of one run, for the fixes and the tries listed per Dag."""
    rows: list[tuple[str, str]] = [("scheduler", _scheduler_cell(result.scheduler))]
    for fix in fix_names:
        rows.append((f"  {fix}", result.scheduler.fixes.get(fix, "-")))
    for dag_id in DAG_IDS:
        outcome = result.dags.get(dag_id) or DagOutcome(dag_id)
        rows.append((dag_id, f"Dag run {outcome.run_state or '-'}"))
        for try_number in try_numbers.get(dag_id, []):
            rows.append((f"  try {try_number}", _try_cell(_try(outcome, try_number))))
            if dag_id == CALLBACK_DAG_ID:
                rows.append(("    callbacks", callbacks_cell(outcome.callbacks.get(try_number, {}))))
                emails = outcome.emails.get(try_number, 0)
                rows.append(("    emails", emails_cell(emails, result.emails_via_backend)))
    converge = (
        f"{result.converge_seconds:.0f} s after trigger" if result.converge_seconds is not None else "no"
    )
    if result.scenario == MANY_SCENARIO:
        outcome = result.dags.get(MANY_DAG_ID) or DagOutcome(MANY_DAG_ID)
        rows.append((MANY_DAG_ID, f"Dag run {outcome.run_state or '-'}"))
        rows.append(("  task instances", many_summary(outcome, result.many_expected)))
    elif result.scenario != "hung":
        rows.append(("injected", "; ".join(result.injected) or "nothing (the run ended first)"))
    rows.append(("converged", converge))
    rows.append(("run time", f"{result.elapsed_seconds:.0f} s ({result.stop_reason})"))
    rows.append(("verdict", verdict_cell(result)))
    return rows


def all_try_numbers(results: Iterable[RunResult]) -> dict[str, list[int]]:
    """Per Dag, every try number any run saw (at least 1 and 2), so the runs line up side by side."""
    numbers: dict[str, set[int]] = {dag_id: {1, 2} for dag_id in DAG_IDS}
    for result in results:
        for dag_id, outcome in result.dags.items():
            numbers.setdefault(dag_id, set()).update(t.try_number for t in outcome.tries)
            numbers[dag_id].update(outcome.callbacks)
            numbers[dag_id].update(outcome.emails)
    return {dag_id: sorted(n) for dag_id, n in numbers.items()}


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def render_table(results: list[RunResult], cell_width: int = 48) -> str:
    """The side-by-side table (one column per run), followed by full error lines and problems."""
    if not results:
        return ""
    try_numbers = all_try_numbers(results)
    fix_names = list(dict.fromkeys(fix for r in results for fix in r.scheduler.fixes))
    columns = [result_rows(r, try_numbers, fix_names) for r in results]
    labels = [label for label, _ in columns[0]]
    label_width = max(len(label) for label in labels)
    head = [f"{r.label} ([heartbeat_fix] enabled={r.fix_enabled})" for r in results]
    first = results[0]
    lines = [f"Airflow {first.airflow_version}, {first.database}, {first.topology}", ""]
    lines.append(
        "  ".join([" " * label_width, *(_clip(h, cell_width).ljust(cell_width) for h in head)]).rstrip()
    )
    lines.append("  ".join(["-" * label_width, *("-" * cell_width for _ in results)]))
    for i, label in enumerate(labels):
        cells = [_clip(col[i][1], cell_width).ljust(cell_width) for col in columns]
        lines.append("  ".join([label.ljust(label_width), *cells]).rstrip())
    for r in results:
        if r.scheduler.error:
            lines.append(f"\n{r.label} scheduler error: {r.scheduler.error}")
        for problem in r.problems:
            lines.append(f"{r.label} problem: {problem}")
        lines.append(f"{r.label} home: {r.home}")
    return "\n".join(lines) + "\n"
