"""
Every scheduler path that fails a retryable task instance after sending a callback (seed 003).

On Airflow 3.4.0b1/b2 the stock sink detaches the task instance before ``handle_failure`` archives the
try, and the insert of the next try raises ``IntegrityError`` on ``task_instance_current_key``. Airflow
3.2/3.3 do not archive tries, so there these tests show the same paths still end in the right state;
the Dag-lookup-failure test also checks that the rest of the batch stays attached, which stock 3.2/3.3
break too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from airflow.models.taskinstance import TaskInstance
from airflow.utils.state import DagRunState, TaskInstanceState
from sqlalchemy import delete, select

from airflow_heartbeat_fix.detection import PURGE_FIX, SINK_FIX
from tests.airflow_fixtures import (
    TaskSpec,
    archives_tries,
    callback_requests,
    email_requests,
    failed_run_with_dag_callback,
    make_running,
    report_event,
    schedule_until_finished,
    task_callbacks,
    tries,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

ARCHIVES_TRIES = archives_tries()


def assert_retried_once(session: Session, ti: Any) -> None:
    """Try 1 failed for retry and the next try is waiting; on 3.4 that is an archived row plus a new one."""
    if ARCHIVES_TRIES:
        assert tries(session, ti) == [
            (1, TaskInstanceState.FAILED, "retry"),
            (2, TaskInstanceState.UP_FOR_RETRY, None),
        ]
    else:
        assert tries(session, ti)[-1][:2] == (1, TaskInstanceState.UP_FOR_RETRY)


def _running_ti(dag_maker: Any, runner: Any, session: Session, **task: Any) -> Any:
    dag_run = dag_maker(tasks=[TaskSpec(**task)])
    (ti,) = dag_run.get_task_instances(session=session)
    return make_running(ti, runner, session)


@pytest.mark.fix(SINK_FIX, when=ARCHIVES_TRIES)
@pytest.mark.fix(PURGE_FIX)
def test_heartbeat_timeout_with_retries_does_not_crash_scheduler(dag_maker, scheduler_runner, session):
    """Any retryable task whose worker stops heartbeating: no callback needs to be configured."""
    ti = _running_ti(dag_maker, scheduler_runner, session, retries=1)

    scheduler_runner._find_and_purge_task_instances_without_heartbeats()

    assert_retried_once(session, ti)
    assert len(task_callbacks(session, ti)) == 1


@pytest.mark.fix(SINK_FIX, when=ARCHIVES_TRIES)
def test_executor_event_task_callback_does_not_crash_scheduler(dag_maker, scheduler_runner, session):
    """A RUNNING task reported FAILED (killed externally) that has on_failure/on_retry callbacks."""
    ti = _running_ti(dag_maker, scheduler_runner, session, retries=1, callbacks=True)
    report_event(scheduler_runner.executor, ti, TaskInstanceState.FAILED)

    scheduler_runner._process_executor_events(scheduler_runner.executor, session)
    session.commit()

    assert_retried_once(session, ti)
    (request,) = task_callbacks(session, ti)
    assert request.task_callback_type == TaskInstanceState.UP_FOR_RETRY


@pytest.mark.fix(SINK_FIX, when=ARCHIVES_TRIES)
def test_executor_event_email_request_does_not_crash_scheduler(dag_maker, scheduler_runner, session):
    """The same path for a task with email alerts and no callbacks."""
    ti = _running_ti(dag_maker, scheduler_runner, session, retries=1, email=["ops@example.com"])
    report_event(scheduler_runner.executor, ti, TaskInstanceState.FAILED)

    scheduler_runner._process_executor_events(scheduler_runner.executor, session)
    session.commit()

    assert_retried_once(session, ti)
    (request,) = email_requests(session, ti)
    assert request.email_type == "retry"


@pytest.mark.fix(SINK_FIX)
@pytest.mark.parametrize("orphan_first", [True, False], ids=["orphan_first", "orphan_last"])
def test_executor_event_missing_dag_keeps_batch_attached(dag_maker, scheduler_runner, session, orphan_first):
    """
    The Dag-lookup-failure branch must not end the session the rest of the batch lives in.

    The batch query has no ORDER BY, so both creation orders are run: stock Airflow either breaks the
    task instance handled after the orphan (on 3.4 the retry's insert collides) or detaches the ones
    handled before it.
    """
    from airflow.models.serialized_dag import SerializedDagModel

    def orphan_ti() -> Any:
        return _running_ti(dag_maker, scheduler_runner, session, task_id="orphan", callbacks=True)

    def retryable_ti() -> Any:
        return _running_ti(dag_maker, scheduler_runner, session, retries=1)

    if orphan_first:
        orphan, retryable = orphan_ti(), retryable_ti()
    else:
        retryable, orphan = retryable_ti(), orphan_ti()
    session.execute(delete(SerializedDagModel).where(SerializedDagModel.dag_id == orphan.dag_id))
    session.commit()
    session.expunge_all()  # nothing may still hold the deleted serialized Dag
    # The batch's query hands back this same object (identity map), whichever order it returns the rows in.
    batch_member = session.get(TaskInstance, retryable.id)
    report_event(scheduler_runner.executor, orphan, TaskInstanceState.FAILED)
    report_event(scheduler_runner.executor, retryable, TaskInstanceState.FAILED)

    scheduler_runner._process_executor_events(scheduler_runner.executor, session)
    still_attached = batch_member in session
    session.commit()

    assert tries(session, orphan)[-1][1] == TaskInstanceState.FAILED
    assert task_callbacks(session, orphan) == [], "the Dag was found: the lookup-failure branch did not run"
    assert_retried_once(session, retryable)
    assert still_attached, "the Dag-lookup-failure branch closed the scheduler's session mid-batch"


def test_dag_callbacks_sent_from_do_scheduling_are_stored(dag_maker, scheduler_runner, session):
    """``_do_scheduling`` relied on the stock sink's commit: a Dag-level failure callback must survive."""
    from airflow.callbacks.callback_requests import DagCallbackRequest

    dag_run = failed_run_with_dag_callback(dag_maker, session)

    schedule_until_finished(scheduler_runner, dag_run, session)

    stored = [request for request in callback_requests(session) if isinstance(request, DagCallbackRequest)]
    assert [(request.dag_id, request.is_failure_callback) for request in stored] == [(dag_run.dag_id, True)]
    run_state = select(type(dag_run).state).where(type(dag_run).id == dag_run.id)
    assert session.scalar(run_state) == DagRunState.FAILED
