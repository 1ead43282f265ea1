"""
Upstream scheduler tests around the patched paths, on a real database: the fixes must not break them.

Each mirrors the upstream test of the same name in
``airflow-core/tests/unit/jobs/test_scheduler_job.py`` (``TestSchedulerJob``), which asserts the same
behaviour with a mocked executor and callback sink; here the real sink and database are used.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest
from airflow.models.dagrun import DagRun
from airflow.models.log import Log
from airflow.models.taskinstance import TaskInstance
from airflow.utils.state import DagRunState, TaskInstanceState
from sqlalchemy import delete, select, update

from airflow_heartbeat_fix.detection import SINK_FIX
from tests.airflow_fixtures import (
    TaskSpec,
    archives_tries,
    callback_requests,
    failed_run_with_dag_callback,
    make_running,
    report_event,
    schedule_until_finished,
    task_callbacks,
    task_key,
    tries,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

#: A retry on 3.4.0b1/b2 archives the try: with the stock sink that is the UniqueViolation crash.
RETRY_CRASHES_STOCK_34 = pytest.mark.fix(SINK_FIX, when=archives_tries())


def _tis(dag_run: Any, session: Session) -> dict[str, Any]:
    return {ti.task_id: ti for ti in dag_run.get_task_instances(session=session)}


def _event_states(executor: Any) -> dict[Any, Any]:
    return {key: state for key, (state, _) in executor.event_buffer.items()}


def test_find_and_purge_task_instances_without_heartbeats(dag_maker, scheduler_runner, session):
    dag_run = dag_maker(tasks=[TaskSpec(task_id="hung"), TaskSpec(task_id="alive")])
    tis = _tis(dag_run, session)
    hung = make_running(tis["hung"], scheduler_runner, session)
    make_running(tis["alive"], scheduler_runner, session, stale_for=0)

    scheduler_runner._find_and_purge_task_instances_without_heartbeats()

    (request,) = callback_requests(session)
    assert (request.ti.task_id, request.ti.try_number) == ("hung", 1)
    assert "'Task Id': 'hung'" in request.msg
    assert "'Hostname': 'hung-worker'" in request.msg
    executor = scheduler_runner.executor
    assert _event_states(executor) == {task_key(executor, hung): TaskInstanceState.FAILED}
    audit = session.scalars(select(Log).where(Log.dag_id == hung.dag_id, Log.event == "heartbeat timeout"))
    assert [row.task_id for row in audit] == ["hung"]
    assert tries(session, tis["alive"])[-1][1] == TaskInstanceState.RUNNING


def test_find_and_purge_task_instances_without_heartbeats_nothing(dag_maker, scheduler_runner, session):
    dag_run = dag_maker(tasks=[TaskSpec(task_id="alive"), TaskSpec(task_id="other_scheduler")])
    tis = _tis(dag_run, session)
    make_running(tis["alive"], scheduler_runner, session, stale_for=0)
    make_running(tis["other_scheduler"], scheduler_runner, session)
    session.execute(
        update(TaskInstance)
        .where(TaskInstance.id == tis["other_scheduler"].id)
        .values(queued_by_job_id=scheduler_runner.job.id + 1000)
    )
    session.commit()

    scheduler_runner._find_and_purge_task_instances_without_heartbeats()

    assert callback_requests(session) == []
    assert _event_states(scheduler_runner.executor) == {}


def test_process_executor_event_missing_dag(dag_maker, scheduler_runner, session):
    from airflow.models.serialized_dag import SerializedDagModel

    dag_run = dag_maker(tasks=[TaskSpec(callbacks=True)])
    (ti,) = dag_run.get_task_instances(session=session)
    ti.state = TaskInstanceState.QUEUED
    ti.try_number = 1
    ti.queued_by_job_id = scheduler_runner.job.id
    session.merge(ti)
    session.execute(delete(SerializedDagModel).where(SerializedDagModel.dag_id == ti.dag_id))
    session.commit()
    session.expunge_all()  # nothing may still hold the deleted serialized Dag
    report_event(scheduler_runner.executor, ti, TaskInstanceState.FAILED)

    scheduler_runner._process_executor_events(scheduler_runner.executor, session)
    session.commit()

    assert tries(session, ti)[-1][1] == TaskInstanceState.FAILED
    assert callback_requests(session) == []


@pytest.mark.parametrize(
    ("retries", "callback_type"),
    [
        pytest.param(0, TaskInstanceState.FAILED, id="no_retries"),
        pytest.param(1, TaskInstanceState.UP_FOR_RETRY, id="retries", marks=RETRY_CRASHES_STOCK_34),
    ],
)
def test_external_kill_sets_callback_type_param(dag_maker, scheduler_runner, session, retries, callback_type):
    dag_run = dag_maker(tasks=[TaskSpec(retries=retries, callbacks=True)])
    (ti,) = dag_run.get_task_instances(session=session)
    make_running(ti, scheduler_runner, session, stale_for=0)
    report_event(scheduler_runner.executor, ti, TaskInstanceState.FAILED)

    scheduler_runner._process_executor_events(scheduler_runner.executor, session)
    session.commit()

    (request,) = task_callbacks(session, ti)
    assert request.task_callback_type == callback_type
    assert [state for _, state, _ in tries(session, ti)][-1] == callback_type


def test_dagrun_callbacks_commited_before_sent(dag_maker, scheduler_runner, session):
    """When a Dag callback is sent, another connection already sees the run's final state."""
    from airflow.utils.session import create_session

    dag_run = failed_run_with_dag_callback(dag_maker, session)
    seen_by_others: list[str | None] = []
    send = scheduler_runner._send_dag_callbacks_to_processor

    def record_committed_state(dag: Any, callback: Any = None) -> None:
        if callback is not None and callback.run_id == dag_run.run_id:
            with create_session(scoped=False) as other:
                seen_by_others.append(other.scalar(select(DagRun.state).where(DagRun.id == dag_run.id)))
        send(dag, callback)

    scheduler_runner._send_dag_callbacks_to_processor = record_committed_state
    schedule_until_finished(scheduler_runner, dag_run, session)

    assert seen_by_others == [DagRunState.FAILED]


def test_dagrun_timeout_callbacks_are_stored_in_database(dag_maker, scheduler_runner, session):
    from airflow.callbacks.callback_requests import DagCallbackRequest

    dag_run = dag_maker(dagrun_timeout=timedelta(minutes=1), dag_callbacks=True)
    session.execute(
        update(DagRun)
        .where(DagRun.id == dag_run.id)
        .values(start_date=datetime.now(tz=timezone.utc) - timedelta(hours=1))
    )
    session.commit()

    schedule_until_finished(scheduler_runner, dag_run, session)

    stored = [r for r in callback_requests(session) if isinstance(r, DagCallbackRequest)]
    assert [(r.dag_id, r.run_id, r.is_failure_callback, r.msg) for r in stored] == [
        (dag_run.dag_id, dag_run.run_id, True, "timed_out")
    ]


def test_scheduler_passes_context_from_server_on_heartbeat_timeout(dag_maker, scheduler_runner, session):
    dag_run = dag_maker(tasks=[TaskSpec(retries=0)])
    (ti,) = dag_run.get_task_instances(session=session)
    make_running(ti, scheduler_runner, session)

    scheduler_runner._find_and_purge_task_instances_without_heartbeats()

    (request,) = task_callbacks(session, ti)
    context = request.context_from_server
    assert context is not None
    assert (context.dag_run.dag_id, context.dag_run.run_id) == (dag_run.dag_id, dag_run.run_id)
    assert context.max_tries == ti.max_tries == 0


def test_purge_without_heartbeat_skips_when_missing_dag_version(dag_maker, scheduler_runner, session):
    """A task instance migrated from Airflow 2 with no Dag version: no callback, and no crash."""
    from airflow.models.dag_version import DagVersion

    dag_run = dag_maker(tasks=[TaskSpec(callbacks=True)])
    (ti,) = dag_run.get_task_instances(session=session)
    make_running(ti, scheduler_runner, session)
    session.execute(update(TaskInstance).where(TaskInstance.id == ti.id).values(dag_version_id=None))
    session.execute(update(DagRun).where(DagRun.id == dag_run.id).values(created_dag_version_id=None))
    session.execute(delete(DagVersion).where(DagVersion.dag_id == ti.dag_id))
    session.commit()

    scheduler_runner._find_and_purge_task_instances_without_heartbeats()

    assert callback_requests(session) == []


def test_task_instance_heartbeat_timeout_message(dag_maker, scheduler_runner, session):
    dag_run = dag_maker()
    (ti,) = dag_run.get_task_instances(session=session)
    ti.hostname = "worker-7"
    ti.external_executor_id = "abcdefg"

    details = scheduler_runner._generate_task_instance_heartbeat_timeout_message_details(ti)

    assert details == {
        "DAG Id": ti.dag_id,
        "Task Id": ti.task_id,
        "Run Id": ti.run_id,
        "Hostname": "worker-7",
        "External Executor Id": "abcdefg",
    }
