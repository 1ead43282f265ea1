"""
What the benchmarks share: a configured Airflow on a given database, a scheduler runner wired as
``airflow scheduler`` wires it, and Dags whose task instances look the way a hung worker leaves them.

Nothing here is timed or asserted; the benchmark modules measure. Import this module before anything
from ``airflow``: :func:`configure` has to set the environment first.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

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
    home = os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="hbfix-bench-"))
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = db_url
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", os.path.join(home, "dags"))
    os.makedirs(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], exist_ok=True)
    if db_url.startswith("postgresql"):
        _create_pg_database(db_url)


def _create_pg_database(db_url: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": url.database}) is None:
            conn.execute(text(f'CREATE DATABASE "{url.database}"'))
    admin.dispose()


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
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    for model in _models_to_clear():
        with create_session() as session:
            session.execute(delete(model))


def _models_to_clear() -> list[Any]:
    from airflow.jobs.job import Job
    from airflow.models.dag import DagModel, DagOwnerAttributes, DagTag
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.dagrun import DagRun
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.models.log import Log
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import TaskInstance

    models: list[Any] = [DbCallbackRequest, Log, Job, TaskInstance]
    try:  # Airflow 3.4 keeps every try in task_instance itself
        from airflow.models.taskinstancehistory import TaskInstanceHistory

        models.append(TaskInstanceHistory)
    except ImportError:
        pass
    return [*models, DagRun, DagTag, DagOwnerAttributes, SerializedDagModel, DagModel, DagBundleModel]


def scheduler_runner(session: Session) -> Any:
    """The runner ``airflow scheduler`` would build (the reliability tests' harness builds it)."""
    return harness().new_runner(session)


def harness() -> Any:
    """``tests/purge_race_harness.py``: the one definition of a wired runner and of a hung worker's row."""
    from tests import purge_race_harness

    return purge_race_harness


def _noop_callback(context: Any) -> None:
    """Stands in for a user callback; the Dag processor would run it, not the benchmark."""


@dataclass(frozen=True)
class DagShape:
    """A Dag of ``tasks`` empty tasks, with user callbacks on every task and on the Dag."""

    dag_id: str
    tasks: int
    retries: int = 0


def store_dag(shape: DagShape, session: Session) -> Any:
    """Store the Dag as the Dag processor does (Dag, version, serialized); return the scheduler's view."""
    try:  # 3.2+
        from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    except ImportError:  # 3.1
        from airflow.models.dagbag import DagBag, sync_bag_to_db  # type: ignore[no-redef,attr-defined]
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    if session.get(DagBundleModel, BUNDLE_NAME) is None:
        session.add(DagBundleModel(name=BUNDLE_NAME))
        session.commit()
    with DAG(
        shape.dag_id,
        schedule=None,
        start_date=START,
        max_active_runs=10_000,
        max_active_tasks=100_000,
        on_failure_callback=_noop_callback,
    ) as dag:
        for number in range(shape.tasks):
            EmptyOperator(
                task_id=f"t{number:04d}",
                retries=shape.retries,
                retry_delay=timedelta(0),
                on_failure_callback=_noop_callback,
                on_retry_callback=_noop_callback,
            )
    dag.fileloc = DAG_FILE
    dag.relative_fileloc = os.path.basename(DAG_FILE)
    bag = DagBag(collect_dags=False)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, BUNDLE_NAME, None, session=session)
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
    return len(harness().make_stale(task_instances(dag_id, session), runner, session))
