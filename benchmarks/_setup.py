"""
What the benchmarks share on top of :mod:`testing`: a configured Airflow on a given database, and Dags
of a given shape whose task instances look the way a hung worker leaves them.

Nothing here is timed or asserted; the benchmark modules measure. Import this module before anything
from ``airflow``: :func:`configure` has to set the environment first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow_heartbeat_fix.demo.database import ensure_database_exists
from testing.dags import ensure_bundle, sync_dag_to_db
from testing.database import backend, clear, task_instance_history
from testing.environment import configure_airflow
from testing.scheduler import make_stale

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

#: Where the benchmarks' Dags claim to live (the callback requests carry it as their file path).
DAG_FILE = __file__
BUNDLE_NAME = "heartbeat_fix_bench"
START = datetime(2026, 1, 1, tzinfo=timezone.utc)
#: Task instances per Dag run when N are asked for (N // this runs, each with this many tasks).
TASKS_PER_RUN = 50


def configure(db_url: str) -> None:
    """Point Airflow at ``db_url`` (creating a PostgreSQL database if missing); call before importing it."""
    configure_airflow(db_url, home_prefix="hbfix-bench-")
    if backend(db_url) == "postgres":
        ensure_database_exists(db_url)


def migrate_database() -> None:
    """Create or upgrade Airflow's tables (once per benchmark run; each measurement empties them)."""
    from airflow.utils.db import initdb

    initdb()


def become_scheduler() -> type:
    """Import what ``airflow scheduler`` imports, which activates the fixes unless switched off."""
    from airflow.cli.commands import scheduler_command

    return scheduler_command.SchedulerJobRunner


def clear_tables() -> None:
    """Empty every table the benchmarks write to, children before parents."""
    from airflow.jobs.job import Job
    from airflow.models.dag import DagModel, DagOwnerAttributes, DagTag
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.dagrun import DagRun
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.models.log import Log
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import TaskInstance

    clear([DbCallbackRequest, Log, Job, TaskInstance, *task_instance_history(), DagRun])
    clear([DagTag, DagOwnerAttributes, SerializedDagModel, DagModel, DagBundleModel])


def _noop_callback(context: Any) -> None:
    """Stands in for a user callback; the Dag processor would run it, not the benchmark."""


@dataclass(frozen=True)
class DagShape:
    """A Dag of ``tasks`` empty tasks; with ``callbacks``, user callbacks on every task and on the Dag."""

    dag_id: str
    tasks: int
    retries: int = 0
    callbacks: bool = True


def store_dag(shape: DagShape, session: Session) -> Any:
    """Store the Dag as the Dag processor does (Dag, version, serialized); return the scheduler's view."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    ensure_bundle(BUNDLE_NAME, session)
    callback = _noop_callback if shape.callbacks else None
    with DAG(
        shape.dag_id,
        schedule=None,
        start_date=START,
        max_active_runs=10_000,
        max_active_tasks=100_000,
        on_failure_callback=callback,
    ) as dag:
        for number in range(shape.tasks):
            EmptyOperator(
                task_id=f"t{number:04d}",
                retries=shape.retries,
                retry_delay=timedelta(0),
                on_failure_callback=callback,
                on_retry_callback=callback,
            )
    dag.fileloc = DAG_FILE
    dag.relative_fileloc = os.path.basename(DAG_FILE)
    sync_dag_to_db(dag, BUNDLE_NAME, None, session)
    session.commit()
    stored = SerializedDagModel.get(shape.dag_id, session=session)
    if stored is None:
        raise RuntimeError(f"Dag {shape.dag_id} was not serialized")
    return stored.dag


def create_runs(serialized_dag: Any, runs: int, session: Session) -> list[str]:
    """``runs`` manual RUNNING Dag runs of ``serialized_dag``, committed; their run ids."""
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    run_ids = []
    for number in range(runs):
        logical_date = START + timedelta(days=number)
        run = serialized_dag.create_dagrun(
            run_id=f"bench_{number:05d}",
            logical_date=logical_date,
            data_interval=serialized_dag.timetable.infer_manual_data_interval(run_after=logical_date),
            run_after=logical_date,
            run_type=DagRunType.MANUAL,
            state=DagRunState.RUNNING,
            start_date=START,
            triggered_by=DagRunTriggeredByType.TEST,
            session=session,
        )
        run_ids.append(run.run_id)
    session.commit()
    return run_ids


def task_instances(dag_id: str, session: Session) -> list[Any]:
    from airflow.models.taskinstance import TaskInstance as TI
    from sqlalchemy import select

    return list(session.scalars(select(TI).where(TI.dag_id == dag_id)))


def stale_task_instances(
    runner: Any, n: int, session: Session, *, retries: int = 0, dag_id: str = "bench_purge"
) -> int:
    """
    ``n`` task instances as hung workers leave them, queued by ``runner``'s job: what the next
    heartbeat-timeout scan finds. ``n`` is rounded up to whole runs of :data:`TASKS_PER_RUN` tasks.
    """
    tasks = min(n, TASKS_PER_RUN)
    dag = store_dag(DagShape(dag_id, tasks, retries), session)
    create_runs(dag, -(-n // tasks), session)
    return len(make_stale(task_instances(dag_id, session), runner, session))
