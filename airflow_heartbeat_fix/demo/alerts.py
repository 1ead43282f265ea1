"""
``--scenario kill-dag-processor``: what the Dag runs' failure alerts wrote down (started, done), per run,
and when the run has seen every alert it can expect. Pure: lines and states in, counts out.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from airflow_heartbeat_fix.demo.records import DAG_CALLBACK_DONE, DAG_CALLBACK_STARTED
from airflow_heartbeat_fix.demo.result import KILLED_DAG_ID

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping


def alerts(lines: Iterable[Mapping[str, Any]], event: str) -> dict[str, int]:
    """Run id -> how many of its failure alerts wrote ``event`` (started or done)."""
    return dict(
        Counter(
            str(line.get("run_id"))
            for line in lines
            if line.get("dag_id") == KILLED_DAG_ID and line.get("event") == event
        )
    )


def started(lines: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    return alerts(lines, DAG_CALLBACK_STARTED)


def done(lines: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    return alerts(lines, DAG_CALLBACK_DONE)


def alerts_complete(runs: Mapping[str, str | None], finished: Mapping[str, int]) -> bool:
    """Whether every failed run has its alert done (a stock run that lost some never completes)."""
    return all(finished.get(run_id, 0) >= 1 for run_id, state in runs.items() if state == "failed")


def lost_runs(runs: Mapping[str, str | None], finished: Mapping[str, int]) -> list[str]:
    """Failed runs whose failure alert never finished."""
    return sorted(run_id for run_id, state in runs.items() if state == "failed" and not finished.get(run_id))
