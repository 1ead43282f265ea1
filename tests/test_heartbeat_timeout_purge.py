"""
The converged heartbeat-timeout purge (seed 000), named after the upstream tests it mirrors.

On Airflow 3.2/3.3 the stock purge sends a callback and leaves the task instance RUNNING: each test
below fails there (strict xfail in the fix-off run). Airflow 3.4 ships the converged purge, so on 3.4
these run unchanged against stock code and must pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from airflow.models.serialized_dag import SerializedDagModel
from airflow.models.taskinstance import TaskInstance
from airflow.utils.state import TaskInstanceState
from sqlalchemy import delete, text, update

from airflow_heartbeat_fix.detection import PURGE_FIX, SINK_FIX
from tests.airflow_fixtures import (
    TaskSpec,
    archives_tries,
    email_requests,
    make_running,
    report_event,
    task_callbacks,
    tries,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

pytestmark = pytest.mark.fix(PURGE_FIX)
#: A retry on 3.4.0b1/b2 archives the try: with the stock sink that is the UniqueViolation crash.
RETRY_CRASHES_STOCK_34 = pytest.mark.fix(SINK_FIX, when=archives_tries())

LEFT_RUNNING = (TaskInstanceState.RUNNING, TaskInstanceState.RESTARTING)


def _hung(dag_maker: Any, runner: Any, session: Session, *, try_number: int = 1, **task: Any) -> Any:
    dag_run = dag_maker(tasks=[TaskSpec(**task)])
    (ti,) = dag_run.get_task_instances(session=session)
    return make_running(ti, runner, session, try_number=try_number)


def _purge(runner: Any, session: Session) -> list[Any]:
    found = runner._find_task_instances_without_heartbeats(session=session)
    if found:
        runner._purge_task_instances_without_heartbeats(found, session=session)
    session.commit()
    return found


def _state_of_try(session: Session, ti: Any, try_number: int) -> str | None:
    return next(state for number, state, _ in tries(session, ti) if number == try_number)


def _callbacks_for_try(session: Session, ti: Any, try_number: int = 1) -> list[Any]:
    return [request for request in task_callbacks(session, ti) if request.ti.try_number == try_number]


@pytest.mark.parametrize(
    "retries",
    [pytest.param(0, id="no_retries"), pytest.param(1, id="retryable", marks=RETRY_CRASHES_STOCK_34)],
)
def test_heartbeat_timeout_converges_ti_state_before_next_scan(dag_maker, scheduler_runner, session, retries):
    ti = _hung(dag_maker, scheduler_runner, session, retries=retries)

    assert [found.task_id for found in _purge(scheduler_runner, session)] == [ti.task_id]
    assert _purge(scheduler_runner, session) == [], "the next scan found the same try again"

    assert len(_callbacks_for_try(session, ti)) == 1
    assert _state_of_try(session, ti, 1) not in LEFT_RUNNING


@pytest.mark.parametrize(
    ("retries", "expected"),
    [
        pytest.param(0, TaskInstanceState.FAILED, id="max_tries_0"),
        pytest.param(1, TaskInstanceState.UP_FOR_RETRY, id="max_tries_1", marks=RETRY_CRASHES_STOCK_34),
    ],
)
def test_heartbeat_timeout_sets_callback_type_param(dag_maker, scheduler_runner, session, retries, expected):
    ti = _hung(dag_maker, scheduler_runner, session, retries=retries)

    _purge(scheduler_runner, session)

    (request,) = _callbacks_for_try(session, ti)
    assert request.task_callback_type == expected
    final = [state for _, state, _ in tries(session, ti)][-1]
    assert final == expected


@pytest.mark.parametrize(
    ("retries", "try_number", "restarting", "expected"),
    [
        pytest.param(0, 1, False, TaskInstanceState.FAILED, id="no_retries"),
        pytest.param(
            2,
            1,
            False,
            TaskInstanceState.UP_FOR_RETRY,
            id="first_try_with_retries",
            marks=RETRY_CRASHES_STOCK_34,
        ),
        pytest.param(
            2, 2, False, TaskInstanceState.UP_FOR_RETRY, id="middle_try", marks=RETRY_CRASHES_STOCK_34
        ),
        pytest.param(2, 3, False, TaskInstanceState.FAILED, id="retries_exhausted"),
        pytest.param(
            0, 1, True, TaskInstanceState.UP_FOR_RETRY, id="restarting", marks=RETRY_CRASHES_STOCK_34
        ),
    ],
)
def test_heartbeat_timeout_sets_callback_type_by_retry_eligibility(
    dag_maker, scheduler_runner, session, retries, try_number, restarting, expected
):
    ti = _hung(dag_maker, scheduler_runner, session, retries=retries, try_number=try_number)
    if restarting:
        session.execute(update(TaskInstance).where(TaskInstance.id == ti.id).values(state="restarting"))
        session.commit()

    _purge(scheduler_runner, session)

    (request,) = _callbacks_for_try(session, ti, try_number)
    assert request.task_callback_type == expected
    assert _state_of_try(session, ti, try_number) not in LEFT_RUNNING


@pytest.mark.parametrize(
    ("retries", "email_type"),
    [pytest.param(1, "retry", marks=RETRY_CRASHES_STOCK_34), pytest.param(0, "failure")],
)
def test_heartbeat_timeout_sends_email_request(dag_maker, scheduler_runner, session, retries, email_type):
    ti = _hung(dag_maker, scheduler_runner, session, retries=retries, email=["ops@example.com"])

    _purge(scheduler_runner, session)

    assert [request.email_type for request in email_requests(session, ti)] == [email_type]
    assert _state_of_try(session, ti, 1) not in LEFT_RUNNING


@RETRY_CRASHES_STOCK_34
def test_heartbeat_timeout_without_email_sends_no_email_request(dag_maker, scheduler_runner, session):
    ti = _hung(dag_maker, scheduler_runner, session, retries=1)

    _purge(scheduler_runner, session)

    assert email_requests(session, ti) == []
    assert _state_of_try(session, ti, 1) not in LEFT_RUNNING


def test_heartbeat_timeout_honours_fail_fast(dag_maker, scheduler_runner, session):
    dag_run = dag_maker(tasks=[TaskSpec(task_id="stall"), TaskSpec(task_id="downstream")], fail_fast=True)
    by_id = {ti.task_id: ti for ti in dag_run.get_task_instances(session=session)}
    make_running(by_id["stall"], scheduler_runner, session)

    _purge(scheduler_runner, session)

    assert _state_of_try(session, by_id["stall"], 1) == TaskInstanceState.FAILED
    assert tries(session, by_id["downstream"])[-1][1] in (TaskInstanceState.SKIPPED, TaskInstanceState.FAILED)


def test_heartbeat_timeout_without_serialized_dag_still_fails_ti(dag_maker, scheduler_runner, session, capfd):
    """The Dag cannot be loaded: the task instance still fails, without task context, and the log says why."""
    ti = _hung(dag_maker, scheduler_runner, session)
    session.execute(delete(SerializedDagModel).where(SerializedDagModel.dag_id == ti.dag_id))
    session.commit()
    session.expire_all()  # the DagVersion in the identity map still holds the deleted serialized Dag
    scheduler_runner.scheduler_dag_bag.clear_cache()
    capfd.readouterr()

    _purge(scheduler_runner, session)

    assert _state_of_try(session, ti, 1) == TaskInstanceState.FAILED
    logged = capfd.readouterr()
    why = [
        line
        for line in (logged.out + logged.err).splitlines()
        if "heartbeat-timed-out task instance" in line and ti.dag_id in line
    ]
    assert why, "the purge did not log why it failed the task instance without task context"


def test_heartbeat_timeout_skips_ti_completed_after_scan(dag_maker, scheduler_runner, session):
    """A worker commits SUCCESS between the scan and the purge: no failure callback, SUCCESS kept."""
    from airflow.utils.session import create_session

    ti = _hung(dag_maker, scheduler_runner, session, retries=1, callbacks=True)
    found = scheduler_runner._find_task_instances_without_heartbeats(session=session)
    session.commit()  # the scan's transaction ends; the worker's commit can land now
    with create_session(scoped=False) as worker:
        worker.execute(update(TaskInstance).where(TaskInstance.id == ti.id).values(state="success"))

    scheduler_runner._purge_task_instances_without_heartbeats(found, session=session)
    session.commit()

    assert task_callbacks(session, ti) == []
    assert _state_of_try(session, ti, 1) == TaskInstanceState.SUCCESS


def test_heartbeat_timeout_skips_ti_completed_while_batch_is_purged(dag_maker, scheduler_runner, session):
    """
    ``handle_failure`` commits, releasing the scan's row locks for the rest of the batch: a worker that
    finishes a later task instance then must win, with no failure callback for it.
    """
    from airflow.utils.session import create_session
    from sqlalchemy import event

    dag_run = dag_maker(tasks=[TaskSpec(task_id="first"), TaskSpec(task_id="second")])
    tis = [make_running(ti, scheduler_runner, session) for ti in dag_run.get_task_instances(session=session)]

    def worker_finishes_the_rest(_: Any) -> None:
        with create_session(scoped=False) as worker:
            worker.execute(
                update(TaskInstance)
                .where(TaskInstance.id.in_([ti.id for ti in tis]), TaskInstance.state == "running")
                .values(state="success")
            )

    event.listen(session, "after_commit", worker_finishes_the_rest, once=True)
    scheduler_runner._find_and_purge_task_instances_without_heartbeats()

    outcome = {
        ti.task_id: (_state_of_try(session, ti, 1), len(_callbacks_for_try(session, ti))) for ti in tis
    }
    assert sorted(outcome.values()) == [(TaskInstanceState.FAILED, 1), (TaskInstanceState.SUCCESS, 0)], (
        outcome
    )


@RETRY_CRASHES_STOCK_34
@pytest.mark.postgres_only
def test_heartbeat_timeout_scan_skips_rows_locked_by_another_scheduler(dag_maker, scheduler_runner, session):
    from airflow.utils.session import create_session

    ti = _hung(dag_maker, scheduler_runner, session, retries=1)
    with create_session(scoped=False) as other_scheduler:
        other_scheduler.execute(text("SELECT id FROM task_instance WHERE id = :id FOR UPDATE"), {"id": ti.id})
        assert _purge(scheduler_runner, session) == [], "the scan did not skip a row another scheduler holds"
        other_scheduler.rollback()

    assert [found.task_id for found in _purge(scheduler_runner, session)] == [ti.task_id]
    assert len(_callbacks_for_try(session, ti)) == 1


@RETRY_CRASHES_STOCK_34
def test_heartbeat_timeout_then_executor_event_sends_one_callback(dag_maker, scheduler_runner, session):
    """The real loop: purge, then the executor's FAILED event for the killed worker, then purge again."""
    ti = _hung(dag_maker, scheduler_runner, session, retries=1, callbacks=True)

    _purge(scheduler_runner, session)
    report_event(scheduler_runner.executor, ti, TaskInstanceState.FAILED)
    scheduler_runner._process_executor_events(scheduler_runner.executor, session)
    session.commit()
    _purge(scheduler_runner, session)

    assert len(_callbacks_for_try(session, ti)) == 1
