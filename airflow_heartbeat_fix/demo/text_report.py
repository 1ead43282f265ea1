"""
The demo's side-by-side table on stdout: one column per run (stock, fixed), one row per fact, then the
full error lines and problems that a cell clips. :mod:`.html_report` draws the same runs as a timeline.
Pure: results in, text out.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING
from unittest import mock

import tabulate as tabulate_module
from tabulate import tabulate

from airflow_heartbeat_fix.demo.result import (
    CALLBACK_DAG_ID,
    CALLBACK_DAG_IDS,
    KILL_DAG_PROCESSOR_SCENARIO,
    KILLED_DAG_ID,
    KILLED_RUNS,
    MANY_DAG_ID,
    MANY_SCENARIO,
    REDELIVERY_SCENARIO,
    DagOutcome,
    RunResult,
    SchedulerOutcome,
    TryRow,
    all_try_numbers,
    find_try,
    report_dag_ids,
)
from airflow_heartbeat_fix.demo.verdicts import callbacks_cell, emails_cell, many_summary, verdict_cell

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

#: A cell longer than this is clipped with "..."; the full error line follows the table.
CELL_WIDTH = 48


def _try_cell(row: TryRow | None) -> str:
    if row is None:
        return "-"
    if row.where == "archived":
        return f"{row.state} (archived: {row.archived_reason})"
    if row.where == "history":
        return f"{row.state} (task_instance_history)"
    return f"{row.state} (current)"


def _scheduler_cell(scheduler: SchedulerOutcome) -> str:
    if scheduler.crashed:
        return f"CRASHED: {scheduler.error}"
    if not scheduler.alive:
        return f"EXITED (code {scheduler.exit_code})"
    return "alive"


def _dag_rows(result: RunResult, dag_id: str, try_numbers: list[int]) -> list[tuple[str, str]]:
    """The Dag run's state, then each listed try (with its callbacks and emails for the callback Dag)."""
    outcome = result.dags.get(dag_id) or DagOutcome(dag_id)
    rows = [(dag_id, f"Dag run {outcome.run_state or '-'}")]
    for try_number in try_numbers:
        rows.append((f"  try {try_number}", _try_cell(find_try(outcome, try_number))))
        if dag_id in CALLBACK_DAG_IDS:
            rows.append(("    callbacks", callbacks_cell(outcome.callbacks.get(try_number, {}))))
        if dag_id == CALLBACK_DAG_ID:
            emails = outcome.emails.get(try_number, 0)
            rows.append(("    emails", emails_cell(emails, result.emails_via_backend)))
    return rows


def _scenario_rows(result: RunResult) -> list[tuple[str, str]]:
    """
    ``--scenario many``: the mapped Dag in one line; a kill scenario: what was killed when; a redelivery:
    what the schedulers did with the refused copy's event.
    """
    if result.scenario == REDELIVERY_SCENARIO:
        return [
            ("events set aside", f"{result.events_set_aside} (the fix: the live try keeps running)"),
            ("running try failed by an event", f"{result.running_tries_failed_by_event} (stock's log lines)"),
        ]
    if result.scenario == MANY_SCENARIO:
        outcome = result.dags.get(MANY_DAG_ID) or DagOutcome(MANY_DAG_ID)
        return [
            (MANY_DAG_ID, f"Dag run {outcome.run_state or '-'}"),
            ("  task instances", many_summary(outcome, result.many_expected)),
        ]
    rows = []
    if result.scenario == KILL_DAG_PROCESSOR_SCENARIO:
        rows = [
            (f"{KILLED_DAG_ID} {run_id}", _alert_cell(result, run_id))
            for run_id in sorted(result.killed_runs or dict.fromkeys(KILLED_RUNS))
        ]
    if result.scenario != "hung":
        rows.append(("injected", "; ".join(result.injected) or "nothing (the run ended first)"))
    return rows


def _alert_cell(result: RunResult, run_id: str) -> str:
    """A Dag run of ``kill-dag-processor``: its state, and its failure alert's starts and finishes."""
    started, done = result.dag_callbacks_started.get(run_id, 0), result.dag_callbacks_done.get(run_id, 0)
    state = result.killed_runs.get(run_id) or "-"
    return f"{state}; failure alert started {started}x, finished {done}x (expected: finished once)"


def result_rows(
    result: RunResult, try_numbers: Mapping[str, list[int]], fix_names: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """``(label, value)`` rows of one run, for the fixes and the tries listed per Dag."""
    rows: list[tuple[str, str]] = [("scheduler", _scheduler_cell(result.scheduler))]
    rows += [(f"  {fix}", result.scheduler.fixes.get(fix, "-")) for fix in fix_names]
    actions = result.scheduler.actions
    rows.append(
        ("fixes acting (log lines)", ", ".join(f"{fix} x{n}" for fix, n in actions.items()) or "none")
    )
    for dag_id in report_dag_ids(result.scenario):
        rows += _dag_rows(result, dag_id, try_numbers.get(dag_id, []))
    rows += _scenario_rows(result)
    converge = (
        f"{result.converge_seconds:.0f} s after trigger" if result.converge_seconds is not None else "no"
    )
    rows.append(("converged", converge))
    rows.append(("run time", f"{result.elapsed_seconds:.0f} s ({result.stop_reason})"))
    rows.append(("verdict", verdict_cell(result)))
    return rows


def _clip(text: str, width: int = CELL_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


@contextlib.contextmanager
def _whitespace_preserved() -> Iterator[dict[str, bool]]:
    """
    tabulate's options that keep leading whitespace: the ``preserve_whitespace`` argument from 0.10, the
    module's ``PRESERVE_WHITESPACE`` before (0.9, the lowest Airflow and this package allow), set for the
    call only.
    """
    if "preserve_whitespace" in inspect.signature(tabulate).parameters:
        yield {"preserve_whitespace": True}
        return
    with mock.patch.object(tabulate_module, "PRESERVE_WHITESPACE", True):
        yield {}


def render_table(results: list[RunResult]) -> str:
    """The side-by-side table (one column per run), followed by full error lines and problems."""
    if not results:
        return ""
    try_numbers = all_try_numbers(results)
    fix_names = list(dict.fromkeys(fix for r in results for fix in r.scheduler.fixes))
    columns = [result_rows(r, try_numbers, fix_names) for r in results]
    labels = [label for label, _ in columns[0]]
    rows = [[label, *(_clip(column[i][1]) for column in columns)] for i, label in enumerate(labels)]
    head = ["", *(_clip(f"{r.label} ([heartbeat_fix] enabled={r.fix_enabled})") for r in results)]
    # No number parsing ("0" stays text); whitespace kept for the indented sub-rows ("  try 1").
    with _whitespace_preserved() as options:
        table = tabulate(rows, headers=head, tablefmt="simple", disable_numparse=True, **options)
    first = results[0]
    lines = [f"Airflow {first.airflow_version}, {first.database}, {first.topology}", ""]
    lines += [line.rstrip() for line in table.splitlines()]
    for r in results:
        if r.scheduler.error:
            lines.append(f"\n{r.label} scheduler error: {r.scheduler.error}")
        lines += [f"{r.label} problem: {problem}" for problem in r.problems]
        lines.append(f"{r.label} home: {r.home}")
    return "\n".join(lines) + "\n"
