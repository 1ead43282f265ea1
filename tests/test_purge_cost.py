"""
What the purge's cost cuts may and may not do: a Dag looked up once per version per pass (never kept
across passes), and no re-read of a task instance whose row the purge holds locked.

These test the fixed classes directly, so they run the same with the fixes switched on or off.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

from airflow_heartbeat_fix.detection import PURGE_FIX
from airflow_heartbeat_fix.purge import _refresh_served_by_row_lock
from airflow_heartbeat_fix.scheduler import build_runner_class


class _CountingDagBag:
    def __init__(self) -> None:
        self.lookups: list[Any] = []

    def get_dag_for_run(self, dag_run: Any, session: Any) -> Any:
        self.lookups.append(dag_run.run_id)
        return SimpleNamespace(dag_id=dag_run.dag_id, looked_up=len(self.lookups))


class _PassOverRuns(SchedulerJobRunner):
    """Stands in for the stock pass: looks up the Dag of each given run, as the backport's purge does."""

    def __init__(self) -> None:  # no job, no executors: nothing but the lookups is exercised
        self.scheduler_dag_bag = _CountingDagBag()  # type: ignore[assignment]
        self.runs: list[Any] = []
        self.fail_after: int | None = None
        self.looked_up: list[Any] = []

    def _find_and_purge_task_instances_without_heartbeats(self) -> None:
        for number, run in enumerate(self.runs):
            if number == self.fail_after:
                raise RuntimeError("the database went away mid-pass")
            self.looked_up.append(self._dag_for_run(run, session=None))  # type: ignore[attr-defined]


def _run(run_id: str, dag_id: str = "d", bundle_version: str | None = None, version_id: str = "v1") -> Any:
    return SimpleNamespace(
        run_id=run_id, dag_id=dag_id, bundle_version=bundle_version, created_dag_version_id=version_id
    )


@pytest.fixture
def runner() -> Any:
    return build_runner_class((PURGE_FIX,), base=_PassOverRuns)()  # type: ignore[call-arg]


def test_dag_is_looked_up_once_per_version_in_a_pass(runner: Any) -> None:
    runner.runs = [_run("r1"), _run("r2"), _run("r3", dag_id="other"), _run("r4", bundle_version="b2")]

    runner._find_and_purge_task_instances_without_heartbeats()

    assert runner.scheduler_dag_bag.lookups == ["r1", "r3", "r4"]
    assert runner.looked_up[0] is runner.looked_up[1]


@pytest.mark.parametrize("fail_after", [None, 1], ids=["pass_ends", "pass_raises"])
def test_dag_lookups_do_not_outlive_their_pass(runner: Any, fail_after: int | None) -> None:
    """A new Dag version stored between two passes must be seen by the second one."""
    runner.runs, runner.fail_after = [_run("r1"), _run("r2")], fail_after
    for _ in range(2):
        with contextlib.suppress(RuntimeError):
            runner._find_and_purge_task_instances_without_heartbeats()

    assert runner.scheduler_dag_bag.lookups == ["r1", "r1"]
    assert runner._dags_this_pass is None
    runner._dag_for_run(_run("r1"), session=None)  # outside a pass: straight to the Dag bag
    assert runner.scheduler_dag_bag.lookups == ["r1", "r1", "r1"]


def test_refresh_is_skipped_only_while_the_row_lock_is_held() -> None:
    class TaskInstanceLike:
        refreshes = 0

        def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
            self.refreshes += 1

    ti = TaskInstanceLike()
    with _refresh_served_by_row_lock(ti):  # type: ignore[arg-type]
        ti.refresh_from_db(session=None)
    ti.refresh_from_db(session=None)

    assert ti.refreshes == 1
    assert "refresh_from_db" not in vars(ti)
