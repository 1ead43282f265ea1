"""
A stale executor event for a try whose worker is alive: the scheduler must not fail the live try.

Shaped like upstream's scheduler tests (``TestSchedulerJob``, ``dag_maker``, ``session``): a real runner on
a real metadata database processes a real executor's event buffer, in the thread's scoped session as the
loop does. The try is RUNNING, queued by this scheduler, and its worker heartbeats (``last_heartbeat_at``
is fresh); the executor reports FAILED (a duplicate delivery that lost the race and died: a Celery
redelivery refused by the Execution API, apache/airflow#58441, #57041) or SUCCESS (the old worker's exit
after the try resumed elsewhere, #71580) for the same key. Stock Airflow fails the live try
(``handle_failure``; a retry or failure callback; on 3.4.0b1/b2 with a retry left and a callback or an
email, UniqueViolation), and the worker is SIGKILLed at its next heartbeat. The counterpart of each, a try
whose worker really died (its heartbeat stopped), is still failed once.

``parity/expectations.toml`` declares which releases' stock Airflow each test catches
(``stale_executor_event_fails_live_try``).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from unittest import mock

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
#: A worker SIGKILLed a minute ago: past the fix's threshold (2 intervals), not the heartbeat timeout.
STOPPED_HEARTBEAT_AGE = timedelta(seconds=60)
#: A worker SIGKILLed long ago: past any threshold, and past the heartbeat timeout.
DEAD_HEARTBEAT_AGE = timedelta(hours=1)
#: How the fix's lines start.
FIX_LINE = "airflow-heartbeat-fix (heartbeat_judged_executor_events): "
#: The audit row the fix writes for an event it sets aside (the stock path writes "state mismatch").
SET_ASIDE_LOG_EVENT = "stale executor event"


def _make_running(ti: Any, runner: Any, session: Session, *, heartbeat_age: timedelta | None) -> Any:
    """
    ``ti`` as its worker leaves it: RUNNING try 1, queued by ``runner``, last heartbeat ``heartbeat_age``
    ago (``None``: never heartbeated).
    """
    now = datetime.now(timezone.utc)
    ti.state = TaskInstanceState.RUNNING
    ti.try_number = 1
    ti.queued_by_job_id = runner.job.id
    ti.start_date = now - timedelta(minutes=2)
    ti.last_heartbeat_at = None if heartbeat_age is None else now - heartbeat_age
    ti.hostname = "live-worker"
    ti.pid = 4242
    session.merge(ti)
    session.commit()
    return ti


def _update_try(ti: Any, **values: Any) -> None:
    """Change ``ti``'s row as its worker or another scheduler would: in their own transaction."""
    with create_session(scoped=False) as other:
        other.execute(update(type(ti)).where(type(ti).id == ti.id).values(**values))


def _log_rows(session: Session, ti: Any, event: str) -> int:
    """The audit ``Log`` rows of ``event`` for ``ti``'s Dag."""
    return session.scalar(
        select(func.count()).select_from(Log).where(Log.event == event, Log.dag_id == ti.dag_id)
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
        "state_mismatch_log_rows": _log_rows(session, ti, "state mismatch"),
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


#: Where a try whose live worker was left alone ends: still running, nothing sent, nothing recorded.
UNTOUCHED = {
    "error": None,
    "tries": [(1, "running")],
    "task_callbacks": [],
    "emails": [],
    "state_mismatch_log_rows": 0,
}


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
        self,
        dag_maker: DagMaker,
        session: Session,
        dag_id: str,
        *,
        heartbeat_age: timedelta | None,
        task_id: str = "work",
        **operator: Any,
    ) -> TaskInstance:
        with dag_maker(dag_id=dag_id, schedule=None, session=session):
            _empty_operator(task_id, **operator)
        dag_run = dag_maker.create_dagrun(run_id=f"run_{dag_id}", state=DagRunState.RUNNING)
        ti = dag_run.get_task_instance(task_id, session=session)
        return _make_running(ti, self.runner, session, heartbeat_age=heartbeat_age)

    def _runner_and_executor(self, session: Session) -> Any:
        self.runner = new_runner(session)
        return default_executor(self.runner)

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
    def test_process_executor_events_does_not_fail_running_ti_with_recent_heartbeat(
        self, dag_maker, session, event_state, operator
    ):
        """A duplicate's terminal event for a try whose worker still heartbeats: the try keeps running."""
        executor = self._runner_and_executor(session)
        ti = self._running_ti(
            dag_maker, session, "stale_event_live", heartbeat_age=LIVE_HEARTBEAT_AGE, **operator
        )
        _report_event(executor, ti, event_state)

        error = _process_events(self.runner, executor, session)

        outcome = _outcome(session, ti, error)
        assert outcome == UNTOUCHED, f"OUTCOME {outcome}"

    @pytest.mark.parametrize(
        ("heartbeat_age", "retries", "callback_type"),
        [
            pytest.param(DEAD_HEARTBEAT_AGE, 1, "up_for_retry", id="retryable"),
            pytest.param(DEAD_HEARTBEAT_AGE, 0, "failed", id="no_retries"),
            pytest.param(None, 1, "up_for_retry", id="no_heartbeat_recorded"),
        ],
    )
    def test_process_executor_events_fails_running_ti_without_recent_heartbeat(
        self, dag_maker, session, heartbeat_age, retries, callback_type
    ):
        """The real death next to it: no heartbeat for an hour (or none known); the try fails at once."""
        executor = self._runner_and_executor(session)
        ti = self._running_ti(
            dag_maker,
            session,
            "stale_event_dead",
            heartbeat_age=heartbeat_age,
            retries=retries,
            callbacks=True,
        )
        _report_event(executor, ti, TaskInstanceState.FAILED)

        error = _process_events(self.runner, executor, session)

        outcome = _outcome(session, ti, error)
        assert outcome["error"] is None, f"OUTCOME {outcome}"
        assert outcome["task_callbacks"] == [callback_type], f"OUTCOME {outcome}"
        assert outcome["tries"][-1][1] == callback_type
        assert outcome["state_mismatch_log_rows"] == 1

    def test_process_executor_events_fails_set_aside_ti_once_heartbeat_stops(self, dag_maker, session):
        """
        A worker killed with SIGKILL (a Celery pool child: WorkerLostError -> FAILURE) reports FAILED while
        its last heartbeat is still fresh. Set aside at first, the event fails the try once the heartbeat
        has stopped for longer than a live worker ever goes without one: one callback, no wait for the
        heartbeat timeout.
        """
        executor = self._runner_and_executor(session)
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

        # The worker is dead: no heartbeat since. Aged past a few heartbeat intervals, not past the timeout.
        _update_try(ti, last_heartbeat_at=datetime.now(timezone.utc) - STOPPED_HEARTBEAT_AGE)
        second = _process_events(self.runner, executor, session)
        third = _process_events(self.runner, executor, session)

        assert after_first == UNTOUCHED, f"OUTCOME failed before its heartbeat stopped: {after_first}"
        outcome = _outcome(session, ti, second or third)
        assert outcome["error"] is None, f"OUTCOME {outcome}"
        assert outcome["tries"][-1][1] == "up_for_retry", f"OUTCOME {outcome}"
        assert outcome["task_callbacks"] == ["up_for_retry"], f"OUTCOME {outcome}"
        assert outcome["state_mismatch_log_rows"] == 1, f"OUTCOME {outcome}"

    @pytest.mark.parametrize(
        ("change", "expected_tries"),
        [
            pytest.param({"state": TaskInstanceState.SUCCESS}, [(1, "success")], id="finished_by_its_worker"),
            pytest.param({"queued_by_job_id": -1}, [(1, "running")], id="adopted_by_another_scheduler"),
        ],
    )
    def test_process_executor_events_hands_back_set_aside_event(
        self, dag_maker, session, change, expected_tries
    ):
        """
        The live worker finishes the try itself (its SUCCESS stands), or another scheduler took the try
        over (it is that scheduler's): the set-aside event goes back to the stock path, which ignores it.
        """
        executor = self._runner_and_executor(session)
        ti = self._running_ti(dag_maker, session, "stale_event_hand_back", heartbeat_age=LIVE_HEARTBEAT_AGE)
        _report_event(executor, ti, TaskInstanceState.FAILED)
        first = _process_events(self.runner, executor, session)
        after_first = _outcome(session, ti, first)

        _update_try(ti, **change)
        second = _process_events(self.runner, executor, session)

        assert after_first == UNTOUCHED, f"OUTCOME failed while its worker heartbeats: {after_first}"
        assert executor.event_buffer == {}, "the event was not handed back to the stock pass"
        outcome = _outcome(session, ti, second)
        assert outcome == {**UNTOUCHED, "tries": expected_tries}, f"OUTCOME {outcome}"

    def test_process_executor_events_judges_each_event_of_a_batch(self, dag_maker, session):
        """One pass with a live worker's stale event and a dead worker's event: only the dead try fails."""
        executor = self._runner_and_executor(session)
        live = self._running_ti(
            dag_maker, session, "stale_event_batch_live", heartbeat_age=LIVE_HEARTBEAT_AGE
        )
        dead = self._running_ti(
            dag_maker, session, "stale_event_batch_dead", heartbeat_age=DEAD_HEARTBEAT_AGE
        )
        _report_event(executor, live, TaskInstanceState.FAILED)
        _report_event(executor, dead, TaskInstanceState.FAILED)

        error = _process_events(self.runner, executor, session)

        assert _outcome(session, live, error) == UNTOUCHED
        dead_outcome = _outcome(session, dead, error)
        assert dead_outcome["tries"] == [(1, "failed")], f"OUTCOME {dead_outcome}"
        assert dead_outcome["state_mismatch_log_rows"] == 1

    def test_process_executor_events_set_aside_is_logged_and_counted(self, dag_maker, session, cap_structlog):
        """
        Setting an event aside writes a WARNING line, a ``stale executor event`` audit row and the
        ``set_aside`` metric; handing it back (here: the heartbeat stopped) an INFO line and ``handed_back``.
        """
        executor = self._runner_and_executor(session)
        ti = self._running_ti(dag_maker, session, "stale_event_logged", heartbeat_age=LIVE_HEARTBEAT_AGE)
        _report_event(executor, ti, TaskInstanceState.FAILED)

        with mock.patch("airflow_heartbeat_fix.executor_events.Stats") as stats:
            first = _process_events(self.runner, executor, session)
            set_aside_rows = _log_rows(session, ti, SET_ASIDE_LOG_EVENT)
            _update_try(ti, last_heartbeat_at=datetime.now(timezone.utc) - STOPPED_HEARTBEAT_AGE)
            second = _process_events(self.runner, executor, session)

        assert (first, second) == (None, None)
        assert set_aside_rows == 1
        (extra,) = session.scalars(select(Log.extra).where(Log.event == SET_ASIDE_LOG_EVENT))
        assert "running on live-worker (pid 4242)" in extra
        assert "try 1" in extra and "set aside" in extra
        warnings = [
            e for e in cap_structlog.entries if e["log_level"] == "warning" and "set aside" in e["event"]
        ]
        assert len(warnings) == 1 and warnings[0]["event"].startswith(FIX_LINE)
        infos = [e for e in cap_structlog.entries if e["log_level"] == "info" and "set aside" in e["event"]]
        assert len(infos) == 1 and infos[0]["event"].startswith(FIX_LINE)
        assert [call.args[0] for call in stats.incr.call_args_list] == [
            "heartbeat_fix.executor_event.set_aside",
            "heartbeat_fix.executor_event.handed_back",
        ]
        assert stats.incr.call_args_list[1].kwargs["tags"]["reason"] == "heartbeat_stopped"
