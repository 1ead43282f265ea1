"""
The demo's progress on stderr while a run goes: one status line (rewritten in place on a terminal),
what phase the run is in, and the tries, callbacks and emails seen so far.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TYPE_CHECKING

from airflow_heartbeat_fix.demo.result import CALLBACK_DAG_ID, DAG_IDS, DagOutcome, TryRow, total_callbacks
from airflow_heartbeat_fix.demo.verdicts import all_runs_terminal

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping


class Progress:
    """One status line on stderr: rewritten in place on a terminal, every few seconds otherwise."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.started = time.monotonic()
        self._last_text = ""
        self._last_print = 0.0

    def update(self, phase: str, detail: str = "") -> None:
        elapsed = time.monotonic() - self.started
        text = f"[{self.label}] {elapsed:5.0f}s  {phase}" + (f"  | {detail}" if detail else "")
        now = time.monotonic()
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + text[: shutil.get_terminal_size().columns - 1])
            sys.stderr.flush()
        elif text.split("s  ", 1)[-1] != self._last_text or now - self._last_print >= 10:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
            self._last_print = now
        self._last_text = text.split("s  ", 1)[-1]

    def done(self, message: str) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[2K")
        sys.stderr.write(f"[{self.label}] {time.monotonic() - self.started:5.0f}s  {message}\n")
        sys.stderr.flush()


def run_phase(dags: Mapping[str, DagOutcome]) -> str:
    tries = [t for d in dags.values() for t in d.tries]
    if not dags:
        return "waiting for Dag runs"
    if not tries or all(t.state in (None, "scheduled", "queued") for t in tries):
        return "waiting for tasks to start"
    if any(t.state == "running" and t.try_number == 1 for t in tries):
        return "task frozen; waiting for heartbeat timeout"
    if all_runs_terminal(dags):
        return "Dag runs finished; waiting for late callbacks"
    return "waiting for retries"


def describe_tries(tries: Iterable[TryRow]) -> str:
    parts = [f"try {t.try_number} {t.state or 'none'}" for t in tries]
    return ", ".join(parts) if parts else "no task instance yet"


def progress_line(dags: Mapping[str, DagOutcome]) -> str:
    """The tries of the reproduction Dags (of the Dags the run deployed), and the callbacks so far."""
    parts = []
    others = [dag_id for dag_id in dags if dag_id not in DAG_IDS]
    for dag_id in others if others and not set(DAG_IDS) & set(dags) else DAG_IDS:
        outcome = dags.get(dag_id)
        parts.append(f"{dag_id}: {describe_tries(outcome.tries) if outcome else 'no run yet'}")
    callbacks = dags.get(CALLBACK_DAG_ID)
    if callbacks is not None:
        n_cb = sum(total_callbacks(callbacks, t) for t in callbacks.callbacks)
        n_mail = sum(callbacks.emails.values())
        parts.append(f"callbacks {n_cb}, emails {n_mail}")
    return "; ".join(parts)
