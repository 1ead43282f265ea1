"""
A stale executor event for a try whose worker is alive: the scheduler must not fail the live try.

Shaped like upstream's scheduler tests (``TestSchedulerJob``, ``dag_maker``, ``session``): a real runner
on a real metadata database processes a real executor's event buffer, in the thread's scoped session as
the loop does. The try is RUNNING, queued by this scheduler, and its worker heartbeats (``last_heartbeat_at``
is fresh); the executor reports FAILED (a duplicate delivery that lost the race and died: a Celery
redelivery refused by the Execution API, apache/airflow#58441, #57041) or SUCCESS (the old worker's exit
after the try resumed elsewhere, #71580) for the same key. Stock Airflow fails the live try
(``handle_failure``; a retry or failure callback; on 3.4.0b1/b2 with a retry left, UniqueViolation),
and the worker is SIGKILLed at its next heartbeat.

Phase 1 of the fix (research): these tests assert what the fix must do; nothing here is declared in
``parity/expectations.toml`` yet, so in a stock cell they simply fail, and what stock did is in the
assertion message. The counterpart of each, a try whose worker really died (its heartbeat stopped), must
still be failed once, as it is today.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest
from airflow.models.log import Log
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState, TaskInstanceState
from sqlalchemy import func, select, update

from testing.scheduler import default_executor, new_runner
from tests.unit.jobs.test_scheduler_job import (
    EmailRequest,
    _callback_requests,
    _clean_db,
    _empty_operator,
    _report_event,
    _task_callbacks,
    _tries,
)

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy.orm import Session
    from tests_common.pytest_plugin import DagMaker

pytestmark = pytest.mark.db_test

#: A live worker heartbeats every ``[workers] min_heartbeat_interval`` (5 s by default, every release).
LIVE_HEARTBEAT_AGE = timedelta(seconds=1)
#: A worker SIGKILLed long ago: far past any threshold a fix may use, and past the heartbeat timeout.
DEAD_HEARTBEAT_AGE = timedelta(hours=1)


def _make_running(ti: Any, runner: Any, session: Session, *, heartbeat_age: timedelta) -> Any:
    """
    ``ti`` as its worker leaves it: RUNNING try 1, queued by ``runner``, last heartbeat ``heartbeat_age`` ago.
    """
    now = datetime.now(timezone.utc)
    ti.state = TaskInstanceState.RUNNING
    ti.try_number = 1
    ti.queued_by_job_id = runner.job.id
    ti.start_date = now - heartbeat_age - timedelta(seconds=30)
    ti.last_heartbeat_at = now - heartbeat_age
    ti.hostname = "live-worker"
    ti.pid = 4242
    session.merge(ti)
    session.commit()
    return ti


def _state_mismatch_rows(session: Session, ti: Any) -> int:
    """The audit ``Log`` rows executor-event processing writes when it fails a try ("state mismatch")."""
    return session.scalar(
        select(func.count()).select_from(Log).where(Log.event == "state mismatch", Log.dag_id == ti.dag_id)
    )


def _outcome(session: Session, ti: Any, error: BaseException | None) -> dict[str, Any]:
    """What executor-event processing did, in one comparable value (the stock outcome shows in a diff)."""
    session.rollback()  # a crashed pass leaves the session's transaction failed
    return {
        "error": None if error is None else f"{type(error).__name__}: {str(error).splitlines()[0][:160]}",
        "tries": [(number, str(state) if state else None) for number, state, _ in _tries(session, ti)],
        "task_callbacks": [str(request.task_callback_type) for request in _task_callbacks(session, ti)],
        "emails": sorted(
            request.email_type
            for request in _callback_requests(session)
            if EmailRequest is not None and isinstance(request, EmailRequest)
        ),
        "state_mismatch_log_rows": _state_mismatch_rows(session, ti),
    }


def _process_events(runner: Any, executor: Any, session: Session) -> BaseException | None:
    """
    One pass of executor-event processing, committed as the loop commits it; its error, if any. The loop
    runs each pass in a fresh ``create_session()``: nothing loaded before (the sessions never expire on
    commit) may stand in for the rows.
    """
    session.expunge_all()
    try:
        runner._process_executor_events(executor, session)
        session.commit()
    except Exception as error:
        session.rollback()
        return error
    return None


@pytest.mark.need_serialized_dag
class TestSchedulerJob:
    runner: Any

    @pytest.fixture(autouse=True)
    def per_test(self):
        _clean_db()
        self.runner = None
        yield
        _clean_db()

    def _running_ti(
        self, dag_maker: DagMaker, session: Session, dag_id: str, *, heartbeat_age: timedelta, **operator: Any
    ) -> TaskInstance:
        with dag_maker(dag_id=dag_id, schedule=None, session=session):
            _empty_operator("work", **operator)
        dag_run = dag_maker.create_dagrun(run_id=f"run_{dag_id}", state=DagRunState.RUNNING)
        ti = dag_run.get_task_instance("work", session=session)
        return _make_running(ti, self.runner, session, heartbeat_age=heartbeat_age)

    @pytest.mark.parametrize(
        ("event_state", "operator"),
        [
            pytest.param(
                TaskInstanceState.FAILED, {"retries": 1, "callbacks": True}, id="failed_retryable_callbacks"
            ),
            pytest.param(
                TaskInstanceState.FAILED, {"retries": 0, "callbacks": True}, id="failed_no_retries_callbacks"
            ),
            pytest.param(TaskInstanceState.FAILED, {"retries": 1}, id="failed_retryable_no_callbacks"),
            pytest.param(
                TaskInstanceState.FAILED,
                {"retries": 1, "email": ["ops@example.com"]},
                id="failed_retryable_email",
            ),
            pytest.param(
                TaskInstanceState.SUCCESS, {"retries": 1, "callbacks": True}, id="success_retryable_callbacks"
            ),
        ],
    )
    def test_process_executor_events_keeps_running_ti_with_live_heartbeat(
        self, dag_maker, session, event_state, operator
    ):
        """A duplicate's terminal event for a try whose worker still heartbeats: the try keeps running."""
        self.runner = new_runner(session)
        executor = default_executor(self.runner)
        ti = self._running_ti(
            dag_maker, session, "stale_event_live", heartbeat_age=LIVE_HEARTBEAT_AGE, **operator
        )
        _report_event(executor, ti, event_state)

        error = _process_events(self.runner, executor, session)

        outcome = _outcome(session, ti, error)
        assert outcome == {
            "error": None,
            "tries": [(1, "running")],
            "task_callbacks": [],
            "emails": [],
            "state_mismatch_log_rows": 0,
        }, f"OUTCOME {outcome}"

    @pytest.mark.parametrize(
        ("operator", "callback_type"),
        [
            pytest.param({"retries": 1, "callbacks": True}, "up_for_retry", id="retryable"),
            pytest.param({"retries": 0, "callbacks": True}, "failed", id="no_retries"),
        ],
    )
    def test_process_executor_events_fails_running_ti_without_heartbeat(
        self, dag_maker, session, operator, callback_type
    ):
        """The real death next to it: the worker is gone (no heartbeat for an hour); fail the try once."""
        self.runner = new_runner(session)
        executor = default_executor(self.runner)
        ti = self._running_ti(
            dag_maker, session, "stale_event_dead", heartbeat_age=DEAD_HEARTBEAT_AGE, **operator
        )
        _report_event(executor, ti, TaskInstanceState.FAILED)

        error = _process_events(self.runner, executor, session)

        outcome = _outcome(session, ti, error)
        assert outcome["error"] is None, f"OUTCOME {outcome}"
        assert outcome["task_callbacks"] == [callback_type], f"OUTCOME {outcome}"
        assert outcome["tries"][-1][1] == callback_type
        assert outcome["state_mismatch_log_rows"] == 1

    def test_process_executor_events_set_aside_event_fails_try_once_heartbeat_stops(self, dag_maker, session):
        """
        A worker killed with SIGKILL (a Celery pool child: WorkerLostError -> FAILURE) reports FAILED while
        its last heartbeat is still fresh. Set aside at first, the event must fail the try once the
        heartbeat has stopped for longer than a live worker ever goes without one: one callback, no wait
        for the heartbeat timeout.
        """
        self.runner = new_runner(session)
        executor = default_executor(self.runner)
        ti = self._running_ti(
            dag_maker,
            session,
            "stale_event_dies",
            heartbeat_age=LIVE_HEARTBEAT_AGE,
            retries=1,
            callbacks=True,
        )
        _report_event(executor, ti, TaskInstanceState.FAILED)
        first = _process_events(self.runner, executor, session)
        after_first = _outcome(session, ti, first)

        # The worker is dead: no heartbeat since. Age it past a few heartbeat intervals, not past the timeout.
        with create_session(scoped=False) as other:
            other.execute(
                update(type(ti))
                .where(type(ti).id == ti.id)
                .values(last_heartbeat_at=datetime.now(timezone.utc) - timedelta(seconds=60))
            )
        second = _process_events(self.runner, executor, session)

        assert after_first["tries"] == [(1, "running")], (
            f"OUTCOME failed before its heartbeat stopped: {after_first}"
        )
        outcome = _outcome(session, ti, second)
        assert outcome["error"] is None, f"OUTCOME {outcome}"
        assert outcome["tries"][-1][1] == "up_for_retry", f"OUTCOME {outcome}"
        assert outcome["task_callbacks"] == ["up_for_retry"], f"OUTCOME {outcome}"
        assert outcome["state_mismatch_log_rows"] == 1, f"OUTCOME {outcome}"

    def test_process_executor_events_set_aside_event_dropped_when_try_succeeds(self, dag_maker, session):
        """The live worker finishes the try itself: its SUCCESS stands; the set-aside event is dropped."""
        self.runner = new_runner(session)
        executor = default_executor(self.runner)
        ti = self._running_ti(
            dag_maker,
            session,
            "stale_event_succeeds",
            heartbeat_age=LIVE_HEARTBEAT_AGE,
            retries=1,
            callbacks=True,
        )
        _report_event(executor, ti, TaskInstanceState.FAILED)
        first = _process_events(self.runner, executor, session)
        after_first = _outcome(session, ti, first)

        with create_session(scoped=False) as worker:
            worker.execute(
                update(type(ti)).where(type(ti).id == ti.id).values(state=TaskInstanceState.SUCCESS)
            )
        second = _process_events(self.runner, executor, session)

        assert after_first["tries"] == [(1, "running")], (
            f"OUTCOME failed while its worker heartbeats: {after_first}"
        )
        outcome = _outcome(session, ti, second)
        assert outcome == {
            "error": None,
            "tries": [(1, "success")],
            "task_callbacks": [],
            "emails": [],
            "state_mismatch_log_rows": 0,
        }, f"OUTCOME {outcome}"


@pytest.fixture(autouse=True)
def _prototype(monkeypatch):
    """``HEARTBEAT_FIX_STALE_EVENTS_PROTOTYPE=1``: runners get the phase-1 prototype mixin on top."""
    import os

    if os.environ.get("HEARTBEAT_FIX_STALE_EVENTS_PROTOTYPE") != "1":
        yield
        return
    from airflow.cli.commands import scheduler_command

    from airflow_heartbeat_fix.stale_events import StaleExecutorEventsPrototypeMixin

    base = scheduler_command.SchedulerJobRunner
    prototype = type(
        "PrototypeRunner", (StaleExecutorEventsPrototypeMixin, base), {"_logger_name": base._logger_name}
    )
    monkeypatch.setattr(scheduler_command, "SchedulerJobRunner", prototype)
    yield
