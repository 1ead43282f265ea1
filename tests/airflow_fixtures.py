"""
Fixtures built from Airflow's public pieces, the way a running deployment builds its state.

* ``dag_maker``: a Dag bagged and synced with ``sync_bag_to_db`` (what the Dag processor does), then a
  manual run created from the serialized Dag in the scheduler's dag bag.
* ``scheduler_runner``: a real ``Job`` row and the ``SchedulerJobRunner`` the ``airflow scheduler``
  command would use (the fixed subclass when activation is on), its executors wired to the callback
  sink exactly as ``SchedulerJobRunner._execute`` wires them. Executors are never started: workers are
  the only thing outside the bugs.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import delete, select, update

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sqlalchemy.orm import Session

_run_ids = itertools.count()


def _noop_callback(context: Any) -> None:
    """Stands in for a user callback; the Dag processor, not these tests, would run it."""


@dataclass
class TaskSpec:
    task_id: str = "stall"
    retries: int = 0
    email: list[str] | None = None
    callbacks: bool = False


@dataclass
class DagSpec:
    dag_id: str
    tasks: list[TaskSpec] = field(default_factory=lambda: [TaskSpec()])
    fail_fast: bool = False
    dag_callbacks: bool = False
    dagrun_timeout: timedelta | None = None


def _build_dag(spec: DagSpec) -> Any:
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    with DAG(
        spec.dag_id,
        schedule=None,
        fail_fast=spec.fail_fast,
        catchup=False,
        on_failure_callback=_noop_callback if spec.dag_callbacks else None,
        dagrun_timeout=spec.dagrun_timeout,
    ) as dag:
        for task in spec.tasks:
            EmptyOperator(
                task_id=task.task_id,
                retries=task.retries,
                retry_delay=timedelta(seconds=0),
                email=task.email,
                email_on_failure=bool(task.email),
                email_on_retry=bool(task.email),
                on_failure_callback=_noop_callback if task.callbacks else None,
                on_retry_callback=_noop_callback if task.callbacks else None,
            )
    # Where the Dag processor would have found it: callback requests carry the bundle-relative path.
    dag.relative_fileloc = f"{spec.dag_id}.py"
    dag.fileloc = os.path.join(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], dag.relative_fileloc)
    with open(dag.fileloc, "w") as stub:
        stub.write(f"# {spec!r}: built in-process by tests/airflow_fixtures.py\n")
    return dag


def sync_dag(spec: DagSpec, session: Session) -> None:
    """Serialize ``spec`` into the metadata database as the Dag processor does."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.dag import DagModel

    DagBundlesManager().sync_bundles_to_db(session=session)
    session.flush()
    dagbag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"], collect_dags=False)
    dagbag.bag_dag(_build_dag(spec))
    sync_bag_to_db(dagbag, "dags-folder", None, session=session)
    session.execute(update(DagModel).where(DagModel.dag_id == spec.dag_id).values(is_paused=False))
    session.flush()


@pytest.fixture
def session() -> Iterator[Session]:
    """The thread's scoped session, as the scheduler loop gets it from ``create_session()``."""
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session

    with create_session() as session:
        session.execute(delete(DbCallbackRequest))
        session.commit()
        yield session


@pytest.fixture
def scheduler_runner(session: Session) -> Any:
    from airflow.callbacks import database_callback_sink
    from airflow.cli.commands import scheduler_command
    from airflow.jobs.job import Job

    job = Job()
    runner = scheduler_command.SchedulerJobRunner(job=job, num_runs=1)
    session.add(job)
    session.flush()
    sink = database_callback_sink.DatabaseCallbackSink()
    for executor in runner.executors:
        executor.job_id = job.id
        executor.callback_sink = sink
    session.commit()
    return runner


@pytest.fixture
def dag_maker(request: pytest.FixtureRequest, session: Session) -> Callable[..., Any]:
    """``dag_maker(tasks=[...], fail_fast=...)`` -> the running ``DagRun`` of a freshly synced Dag."""

    def make(**kwargs: Any) -> Any:
        from airflow.models.dagbag import DBDagBag
        from airflow.utils.state import DagRunState
        from airflow.utils.types import DagRunTriggeredByType, DagRunType

        dag_id = f"{request.node.name}_{next(_run_ids)}".replace("[", "_").replace("]", "").replace("-", "_")
        sync_dag(DagSpec(dag_id=dag_id, **kwargs), session)
        serialized = DBDagBag().get_latest_version_of_dag(dag_id, session=session)
        now = datetime.now(tz=timezone.utc) - timedelta(minutes=1)
        dag_run = serialized.create_dagrun(
            run_id=f"manual__{dag_id}",
            logical_date=now,
            data_interval=(now, now),
            run_after=now,
            run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.TEST,
            state=DagRunState.RUNNING,
            session=session,
        )
        session.commit()
        return dag_run

    return make


def make_running(
    ti: Any, runner: Any, session: Session, *, stale_for: int = 3600, try_number: int = 1
) -> Any:
    """Put ``ti`` where a hung worker leaves it: RUNNING, queued by ``runner``, heartbeat long gone."""
    from airflow.utils.state import TaskInstanceState

    now = datetime.now(tz=timezone.utc)
    ti.state = TaskInstanceState.RUNNING
    ti.try_number = try_number
    ti.queued_by_job_id = runner.job.id
    ti.start_date = now - timedelta(seconds=stale_for + 10)
    ti.last_heartbeat_at = now - timedelta(seconds=stale_for)
    ti.hostname = "hung-worker"
    session.merge(ti)
    session.commit()
    return ti


def callback_requests(session: Session) -> list[Any]:
    """Every stored callback request, deserialized, in insertion order."""
    from airflow.models.db_callback_request import DbCallbackRequest

    rows = session.scalars(select(DbCallbackRequest).order_by(DbCallbackRequest.id)).all()
    return [row.get_callback_request() for row in rows]


def task_key(executor: Any, ti: Any) -> Any:
    """The key ``executor`` tracks ``ti`` by: its UUID on 3.4 executors that support it, else ``ti.key``."""
    key_for = getattr(executor, "get_task_key", None)
    return key_for(ti) if key_for else ti.key


def report_event(executor: Any, ti: Any, state: str) -> None:
    """What a worker's exit looks like to the scheduler: an executor event for the task instance."""
    executor.change_state(task_key(executor, ti), state, remove_running=False)


def archives_tries() -> bool:
    """Airflow 3.4 keeps each try as its own row and archives it on retry (the crash needs this)."""
    from airflow.models.taskinstance import TaskInstance

    return hasattr(TaskInstance, "working_set")


def tries(session: Session, ti: Any) -> list[tuple[int, str | None, str | None]]:
    """``(try_number, state, archived_reason)`` of every try of ``ti``'s task in its run, oldest first."""
    from airflow.models.taskinstance import TaskInstance

    table = TaskInstance.__table__
    where = (table.c.dag_id == ti.dag_id, table.c.run_id == ti.run_id, table.c.task_id == ti.task_id)
    if archives_tries():
        rows = session.execute(
            select(table.c.try_number, table.c.state, table.c.archived_reason).where(*where)
        ).all()
        return sorted((row.try_number, row.state, row.archived_reason) for row in rows)
    from airflow.models.taskinstancehistory import TaskInstanceHistory

    history = TaskInstanceHistory.__table__
    old = session.execute(
        select(history.c.try_number, history.c.state).where(
            history.c.dag_id == ti.dag_id, history.c.run_id == ti.run_id, history.c.task_id == ti.task_id
        )
    ).all()
    current = session.execute(select(table.c.try_number, table.c.state).where(*where)).all()
    return sorted((row.try_number, row.state, None) for row in [*old, *current])


def task_callbacks(session: Session, ti: Any) -> list[Any]:
    """The stored ``TaskCallbackRequest``s for ``ti``'s task."""
    return [
        request
        for request in callback_requests(session)
        if type(request).__name__ == "TaskCallbackRequest"
        and request.ti.task_id == ti.task_id
        and request.ti.dag_id == ti.dag_id
    ]


def email_requests(session: Session, ti: Any) -> list[Any]:
    return [
        request
        for request in callback_requests(session)
        if type(request).__name__ == "EmailRequest" and request.ti.dag_id == ti.dag_id
    ]


def schedule_until_finished(runner: Any, dag_run: Any, session: Session) -> None:
    """Run ``_do_scheduling`` until ``dag_run`` leaves RUNNING (bounded).

    Runs left RUNNING by earlier tests share the per-loop quota, so one loop may not reach this run.
    """
    from airflow.models.dagrun import DagRun
    from airflow.utils.state import DagRunState

    for _ in range(10):
        runner._do_scheduling(session)
        session.commit()
        if session.scalar(select(DagRun.state).where(DagRun.id == dag_run.id)) != DagRunState.RUNNING:
            return


def failed_run_with_dag_callback(dag_maker: Callable[..., Any], session: Session) -> Any:
    """A running Dag run with a Dag-level failure callback whose only task has failed."""
    from airflow.utils.state import TaskInstanceState

    dag_run = dag_maker(dag_callbacks=True)
    (ti,) = dag_run.get_task_instances(session=session)
    ti.state = TaskInstanceState.FAILED
    session.merge(ti)
    session.commit()
    return dag_run
