"""The progress line on stderr."""

from __future__ import annotations

from airflow_heartbeat_fix.demo import progress
from airflow_heartbeat_fix.demo.result import DagOutcome, TryRow
from tests.demo._results import CB, RETRY


def test_progress_line_and_phase() -> None:
    dags = {CB: DagOutcome(CB, "running", [TryRow("stall", 1, "running", "current")])}
    assert progress.run_phase(dags) == "task frozen; waiting for heartbeat timeout"
    assert progress.progress_line(dags) == (
        f"{RETRY}: no run yet; {CB}: try 1 running; callbacks 0, emails 0"
    )
    assert progress.run_phase({}) == "waiting for Dag runs"
