"""
Scheduler tests of ``airflow-heartbeat-fix``, written as a part of Airflow's own ``test_scheduler_job.py``.

Class, test names and parameter ids are upstream's where upstream has the test
(``parity/expectations.toml`` records each test's upstream counterpart, or why there is none). The
module uses only upstream's test fixtures (``dag_maker``, ``session``, ``cap_structlog``, the
``tests_common.test_utils.db`` helpers), so it runs unchanged in two places:

* here, on the in-repo stand-in for ``tests_common`` (``tests/_stand_in``), against each supported
  Airflow release and backend;
* inside Breeze, copied into an Airflow checkout (``breeze_overrides/README.md`` says how).

The scheduler under test is ``airflow.cli.commands.scheduler_command.SchedulerJobRunner`` looked up when
each runner is built: the fixed subclass once the package has activated (importing that module is what
activates it, as in ``airflow scheduler``), Airflow's own class otherwise. ``DatabaseCallbackSink`` is
looked up on its module the same way. Nothing is mocked but the workers: the executor is a real
``LocalExecutor`` that is never started, callback requests are read back from the database.

Without the fixes (``AIRFLOW__HEARTBEAT_FIX__ENABLED=False``, or a checkout without the package), the
tests that catch a bug fail: ``parity/expectations.toml`` lists which, per release, and this
repository's stock runs turn exactly those into strict xfails. On an Airflow that has both upstream
fixes, everything passes with or without the package.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from unittest import mock

import pytest
from airflow.callbacks import callback_requests, database_callback_sink
from airflow.callbacks.callback_requests import DagCallbackRequest
from airflow.cli.commands import scheduler_command
from airflow.executors.local_executor import LocalExecutor
from airflow.jobs.job import Job
from airflow.models.dag import DagModel
from airflow.models.dag_version import DagVersion
from airflow.models.dagrun import DagRun
from airflow.models.db_callback_request import DbCallbackRequest
from airflow.models.log import Log
from airflow.models.serialized_dag import SerializedDagModel
from airflow.models.taskinstance import TaskInstance
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState, TaskInstanceState
from sqlalchemy import delete, event, select, text, update
from tests_common.test_utils.db import (
    clear_db_callbacks,
    clear_db_dag_bundles,
    clear_db_dags,
    clear_db_jobs,
    clear_db_logs,
    clear_db_runs,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.orm import Session
    from tests_common.pytest_plugin import DagMaker

pytestmark = pytest.mark.db_test

#: The Dag processor's email request: EmailNotificationRequest in 3.1.0; none in 3.0, whose scheduler
#: sends the email itself in handle_failure().
EmailRequest = getattr(callback_requests, "EmailRequest", None) or getattr(
    callback_requests, "EmailNotificationRequest", None
)
#: States a heartbeat-timeout purge must move a task instance out of in the same pass.
LEFT_RUNNING = (TaskInstanceState.RUNNING, TaskInstanceState.RESTARTING)
#: How long ago the hung worker last heartbeated: far past the default 300 s timeout.
STALE_FOR = timedelta(hours=1)


def _noop_callback(context: Any) -> None:
    """Stands in for a user callback; the Dag processor would run it, not these tests."""


def _empty_operator(
    task_id: str, *, retries: int = 0, email: list[str] | None = None, callbacks: bool = False
) -> EmptyOperator:
    """An ``EmptyOperator`` inside the current ``dag_maker`` block, with the settings the tests vary."""
    kwargs: dict[str, Any] = {"task_id": task_id, "retries": retries, "retry_delay": timedelta(0)}
    if callbacks:
        kwargs.update(on_failure_callback=_noop_callback, on_retry_callback=_noop_callback)
    if not email:
        return EmptyOperator(**kwargs)
    # Task-level email settings are deprecated in favour of notifiers, but the scheduler paths under
    # test still read them; the deprecation warning is not what is being tested here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return EmptyOperator(**kwargs, email=email, email_on_failure=True, email_on_retry=True)


def _make_running(
    ti: TaskInstance,
    job_runner: Any,
    session: Session,
    *,
    stale_for: timedelta | None = STALE_FOR,
    try_number: int = 1,
) -> TaskInstance:
    """
    Leave ``ti`` the way a hung worker does: RUNNING, queued by ``job_runner``, heartbeat long gone
    (``stale_for=None``: no heartbeat recorded, as upstream's executor-event tests leave it).
    """
    now = datetime.now(timezone.utc)
    ti.state = TaskInstanceState.RUNNING
    ti.try_number = try_number
    ti.queued_by_job_id = job_runner.job.id
    ti.start_date = now - (stale_for or timedelta(0)) - timedelta(seconds=10)
    ti.last_heartbeat_at = None if stale_for is None else now - stale_for
    ti.hostname = "hung-worker"
    session.merge(ti)
    session.commit()
    return ti


def _scheduler_runner(job: Job, executor: Any) -> Any:
    """A one-loop scheduler runner on ``executor``: 3.2+ takes the executors, 3.0/3.1 read the job's."""
    runner_cls = scheduler_command.SchedulerJobRunner
    if "executors" in inspect.signature(runner_cls.__init__).parameters:
        return runner_cls(job=job, num_runs=1, executors=[executor])
    job.executors = [executor]
    return runner_cls(job=job, num_runs=1)


def _executors(job_runner: Any) -> list[Any]:
    """The runner's executors (on the runner from 3.2 on, on its job before)."""
    return vars(job_runner).get("executors") or job_runner.job.executors


def _default_executor(job_runner: Any) -> Any:
    return _executors(job_runner)[0]


def _task_key(executor: Any, ti: TaskInstance) -> Any:
    """The key ``executor`` tracks ``ti`` by (a UUID on executors that support it, else ``ti.key``)."""
    get_task_key = getattr(executor, "get_task_key", None)
    return get_task_key(ti) if get_task_key else ti.key


def _report_event(executor: Any, ti: TaskInstance, state: TaskInstanceState) -> None:
    """What the end of a worker looks like to the scheduler: an executor event for the task instance."""
    executor.change_state(_task_key(executor, ti), state, remove_running=False)


def _event_states(executor: Any) -> dict[Any, Any]:
    return {key: state for key, (state, _) in executor.event_buffer.items()}


def _archives_tries() -> bool:
    """Whether this Airflow keeps every try as its own ``task_instance`` row (archived on retry)."""
    return hasattr(TaskInstance, "working_set")


def _tries(session: Session, ti: TaskInstance) -> list[tuple[int, str | None, str | None]]:
    """``(try_number, state, archived_reason)`` of every try of ``ti``'s task in its run, oldest first."""
    table = TaskInstance.__table__
    same_task = (table.c.dag_id == ti.dag_id, table.c.run_id == ti.run_id, table.c.task_id == ti.task_id)
    if _archives_tries():
        rows = session.execute(
            select(table.c.try_number, table.c.state, table.c.archived_reason).where(*same_task)
        ).all()
        return sorted((row.try_number, row.state, row.archived_reason) for row in rows)
    from airflow.models.taskinstancehistory import TaskInstanceHistory

    history = TaskInstanceHistory.__table__
    old = session.execute(
        select(history.c.try_number, history.c.state).where(
            history.c.dag_id == ti.dag_id, history.c.run_id == ti.run_id, history.c.task_id == ti.task_id
        )
    ).all()
    current = session.execute(select(table.c.try_number, table.c.state).where(*same_task)).all()
    return sorted((row.try_number, row.state, None) for row in [*old, *current])


def _state_of_try(session: Session, ti: TaskInstance, try_number: int) -> str | None:
    return next(state for number, state, _ in _tries(session, ti) if number == try_number)


def _final_state(session: Session, ti: TaskInstance) -> str | None:
    return _tries(session, ti)[-1][1]


def _assert_retried_once(session: Session, ti: TaskInstance) -> None:
    """Try 1 failed for retry and try 2 waits; where tries are archived, that is two rows."""
    if _archives_tries():
        assert _tries(session, ti) == [
            (1, TaskInstanceState.FAILED, "retry"),
            (2, TaskInstanceState.UP_FOR_RETRY, None),
        ]
    else:
        assert _tries(session, ti)[-1][:2] == (1, TaskInstanceState.UP_FOR_RETRY)


def _callback_requests(session: Session) -> list[Any]:
    """Every stored callback request, deserialized, in insertion order."""
    rows = session.scalars(select(DbCallbackRequest).order_by(DbCallbackRequest.id)).all()
    return [row.get_callback_request() for row in rows]


def _task_callbacks(session: Session, ti: TaskInstance, try_number: int | None = None) -> list[Any]:
    """The stored ``TaskCallbackRequest``s for ``ti``'s task (of one try, if given)."""
    return [
        request
        for request in _callback_requests(session)
        if type(request).__name__ == "TaskCallbackRequest"
        and (request.ti.dag_id, request.ti.task_id) == (ti.dag_id, ti.task_id)
        and try_number in (None, request.ti.try_number)
    ]


@contextlib.contextmanager
def _emails_sent(session: Session, ti: TaskInstance) -> Iterator[list[str]]:
    """
    The failure or retry emails (``"failure"``/``"retry"``) sent for ``ti``'s Dag while the block runs.

    From 3.1 the scheduler sends an email request to the Dag processor (read from the stored requests
    when the block ends); 3.0 has none, and ``handle_failure`` sends the email from the scheduler.
    """
    sent: list[str] = []
    if EmailRequest is None:

        def record(self: TaskInstance, *args: Any, **kwargs: Any) -> None:
            if self.dag_id == ti.dag_id:
                sent.append("retry" if self.state == TaskInstanceState.UP_FOR_RETRY else "failure")

        with mock.patch.object(TaskInstance, "email_alert", record):
            yield sent
        return
    yield sent
    sent.extend(
        request.email_type
        for request in _callback_requests(session)
        if isinstance(request, EmailRequest) and request.ti.dag_id == ti.dag_id
    )


def _clean_db() -> None:
    """Empty every table these tests write to, as upstream's ``_clean_db()`` does around each test."""
    clear_db_dags()
    clear_db_runs()
    clear_db_jobs()
    clear_db_callbacks()
    clear_db_logs()
    clear_db_dag_bundles()
    # The sink stores requests as ``DbCallbackRequest`` rows; on newer branches ``clear_db_callbacks``
    # only clears the ``callback`` table of executor callbacks.
    with create_session() as session:
        session.execute(delete(DbCallbackRequest))


def _purge_pass(runner: Any, session: Session) -> list[TaskInstance]:
    """One heartbeat-timeout scan and purge in ``session``, committed as the scheduler loop does."""
    found = runner._find_task_instances_without_heartbeats(session=session)
    if found:
        runner._purge_task_instances_without_heartbeats(found, session=session)
    session.commit()
    return found


@pytest.mark.need_serialized_dag
class TestSchedulerJob:
    job_runner: Any

    @pytest.fixture(autouse=True)
    def per_test(self):
        _clean_db()
        self.job_runner = None
        yield
        _clean_db()

    def _create_job_runner(self, session: Session) -> Any:
        """The runner ``airflow scheduler`` would build, wired the way its ``_execute`` wires executors."""
        scheduler_job = Job()
        session.add(scheduler_job)
        session.flush()
        self.job_runner = _scheduler_runner(scheduler_job, LocalExecutor())
        sink = database_callback_sink.DatabaseCallbackSink()
        for executor in _executors(self.job_runner):
            executor.job_id = scheduler_job.id
            executor.callback_sink = sink
        session.commit()
        return self.job_runner

    def _hung_ti(
        self,
        dag_maker: DagMaker,
        session: Session,
        dag_id: str,
        *,
        task_id: str = "stall",
        try_number: int = 1,
        **operator: Any,
    ) -> TaskInstance:
        """A one-task Dag whose only task instance has stopped heartbeating."""
        with dag_maker(dag_id=dag_id, schedule=None, session=session):
            _empty_operator(task_id, **operator)
        dag_run = dag_maker.create_dagrun(run_id=f"run_{dag_id}", state=DagRunState.RUNNING)
        ti = dag_run.get_task_instance(task_id, session=session)
        return _make_running(ti, self.job_runner, session, try_number=try_number)

    def _purge(self, session: Session) -> list[TaskInstance]:
        return _purge_pass(self.job_runner, session)

    def _schedule(self, session: Session) -> None:
        """One scheduling loop pass, committed as the loop commits it."""
        self.job_runner._do_scheduling(session)
        session.commit()

    def _running_dag_with_failed_task(self, dag_maker: DagMaker, session: Session, dag_id: str) -> DagRun:
        """An unpaused Dag whose run is RUNNING and whose only task has FAILED: the run fails next loop."""
        with dag_maker(dag_id=dag_id, schedule=None, on_failure_callback=_noop_callback, session=session):
            _empty_operator("stall")
        dag_run = dag_maker.create_dagrun(run_id=f"run_{dag_id}", state=DagRunState.RUNNING)
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=False))
        ti = dag_run.get_task_instance("stall", session=session)
        ti.state = TaskInstanceState.FAILED
        session.merge(ti)
        session.commit()
        return dag_run

    # -- The converged heartbeat-timeout purge (closes apache/airflow#42553; duplicates on 3.2/3.3) ----

    @pytest.mark.parametrize("retries", [pytest.param(0, id="no_retries"), pytest.param(1, id="retryable")])
    def test_heartbeat_timeout_converges_ti_state_before_next_scan(self, dag_maker, session, retries):
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "hb_converges", retries=retries)

        assert [found.task_id for found in self._purge(session)] == [ti.task_id]
        assert self._purge(session) == [], "the next scan found the same try again"

        assert len(_task_callbacks(session, ti, try_number=1)) == 1
        assert _state_of_try(session, ti, 1) not in LEFT_RUNNING

    @pytest.mark.parametrize(
        ("retries", "expected"),
        [
            pytest.param(0, TaskInstanceState.FAILED, id="max_tries_0"),
            pytest.param(1, TaskInstanceState.UP_FOR_RETRY, id="max_tries_1"),
        ],
    )
    def test_heartbeat_timeout_sets_callback_type_param(self, dag_maker, session, retries, expected):
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "hb_callback_type", retries=retries)

        self._purge(session)

        (request,) = _task_callbacks(session, ti, try_number=1)
        assert request.task_callback_type == expected
        assert _final_state(session, ti) == expected

    @pytest.mark.parametrize(
        ("retries", "try_number", "restarting", "expected"),
        [
            pytest.param(0, 1, False, TaskInstanceState.FAILED, id="no_retries"),
            pytest.param(2, 1, False, TaskInstanceState.UP_FOR_RETRY, id="retries_available_first_attempt"),
            pytest.param(2, 2, False, TaskInstanceState.UP_FOR_RETRY, id="retries_available_mid_chain"),
            pytest.param(2, 3, False, TaskInstanceState.FAILED, id="retries_exhausted"),
            pytest.param(
                1, 5, True, TaskInstanceState.UP_FOR_RETRY, id="restarting_stays_eligible_past_max_tries"
            ),
        ],
    )
    def test_heartbeat_timeout_sets_callback_type_by_retry_eligibility(
        self, dag_maker, session, retries, try_number, restarting, expected
    ):
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "hb_eligibility", retries=retries, try_number=try_number)
        if restarting:
            session.execute(
                update(TaskInstance)
                .where(TaskInstance.id == ti.id)
                .values(state=TaskInstanceState.RESTARTING)
            )
            session.commit()

        self._purge(session)

        (request,) = _task_callbacks(session, ti, try_number=try_number)
        assert request.task_callback_type == expected
        assert _state_of_try(session, ti, try_number) not in LEFT_RUNNING

    @pytest.mark.parametrize(("retries", "email_type"), [(1, "retry"), (0, "failure")])
    def test_heartbeat_timeout_sends_email_request(self, dag_maker, session, retries, email_type):
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "hb_email", retries=retries, email=["ops@example.com"])

        with _emails_sent(session, ti) as emails:
            self._purge(session)

        assert emails == [email_type]
        assert _state_of_try(session, ti, 1) not in LEFT_RUNNING

    def test_heartbeat_timeout_without_email_sends_no_email_request(self, dag_maker, session):
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "hb_no_email", retries=1)

        with _emails_sent(session, ti) as emails:
            self._purge(session)

        assert emails == []
        assert _state_of_try(session, ti, 1) not in LEFT_RUNNING

    def test_heartbeat_timeout_honours_fail_fast(self, dag_maker, session):
        self._create_job_runner(session)
        with dag_maker(dag_id="hb_fail_fast", schedule=None, fail_fast=True, session=session):
            _empty_operator("stall")
            _empty_operator("downstream")
        dag_run = dag_maker.create_dagrun(run_id="run_hb_fail_fast", state=DagRunState.RUNNING)
        stall = _make_running(dag_run.get_task_instance("stall", session=session), self.job_runner, session)
        downstream = dag_run.get_task_instance("downstream", session=session)

        self._purge(session)

        assert _state_of_try(session, stall, 1) == TaskInstanceState.FAILED
        assert _final_state(session, downstream) in (TaskInstanceState.SKIPPED, TaskInstanceState.FAILED)

    def test_heartbeat_timeout_without_serialized_dag_still_fails_ti(self, dag_maker, session, cap_structlog):
        """The Dag cannot be loaded: the task instance still fails, without task context; the log says why."""
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "hb_no_serialized_dag")
        session.execute(delete(SerializedDagModel).where(SerializedDagModel.dag_id == ti.dag_id))
        session.commit()
        session.expire_all()  # the DagVersion in the identity map still holds the deleted serialized Dag
        if hasattr(self.job_runner.scheduler_dag_bag, "clear_cache"):  # 3.0/3.1: none; nothing cached yet
            self.job_runner.scheduler_dag_bag.clear_cache()

        self._purge(session)

        assert _state_of_try(session, ti, 1) == TaskInstanceState.FAILED
        assert "heartbeat-timed-out task instance" in cap_structlog.text

    def test_heartbeat_timeout_skips_ti_completed_after_scan(self, dag_maker, session):
        """A worker commits SUCCESS between the scan and the purge: no failure callback, SUCCESS kept."""
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "hb_completed", retries=1, callbacks=True)
        found = self.job_runner._find_task_instances_without_heartbeats(session=session)
        session.commit()  # the scan's transaction ends, so the worker's commit can land
        with create_session(scoped=False) as worker:
            worker.execute(
                update(TaskInstance).where(TaskInstance.id == ti.id).values(state=TaskInstanceState.SUCCESS)
            )

        self.job_runner._purge_task_instances_without_heartbeats(found, session=session)
        session.commit()

        assert _task_callbacks(session, ti) == []
        assert _state_of_try(session, ti, 1) == TaskInstanceState.SUCCESS

    def test_heartbeat_timeout_skips_ti_completed_while_batch_is_purged(self, dag_maker, session):
        """
        ``handle_failure`` commits, which releases the scan's row locks for the rest of the batch: a
        worker that then finishes a later task instance of the batch must win, with no failure callback.
        """
        self._create_job_runner(session)
        with dag_maker(dag_id="hb_batch_race", schedule=None, session=session):
            _empty_operator("first")
            _empty_operator("second")
        dag_run = dag_maker.create_dagrun(run_id="run_hb_batch_race", state=DagRunState.RUNNING)
        tis = [
            _make_running(ti, self.job_runner, session) for ti in dag_run.get_task_instances(session=session)
        ]

        def worker_finishes_the_rest(_: Session) -> None:
            with create_session(scoped=False) as worker:
                worker.execute(
                    update(TaskInstance)
                    .where(
                        TaskInstance.id.in_([ti.id for ti in tis]),
                        TaskInstance.state == TaskInstanceState.RUNNING,
                    )
                    .values(state=TaskInstanceState.SUCCESS)
                )

        # The purge runs in the thread's scoped session, which is this ``session``: its first commit is
        # the one inside handle_failure() for whichever task instance the purge fails first.
        event.listen(session, "after_commit", worker_finishes_the_rest, once=True)
        try:
            self.job_runner._find_and_purge_task_instances_without_heartbeats()
        finally:
            if event.contains(session, "after_commit", worker_finishes_the_rest):
                event.remove(session, "after_commit", worker_finishes_the_rest)

        outcome = sorted(
            (_state_of_try(session, ti, 1), len(_task_callbacks(session, ti, try_number=1))) for ti in tis
        )
        assert outcome == [(TaskInstanceState.FAILED, 1), (TaskInstanceState.SUCCESS, 0)]

    @pytest.mark.backend("postgres")
    def test_heartbeat_timeout_scan_skips_rows_locked_by_another_scheduler(self, dag_maker, session):
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "hb_row_lock", retries=1)
        # An unscoped session has its own connection: a lock held by it blocks the scheduler's session.
        with create_session(scoped=False) as other_scheduler:
            other_scheduler.execute(
                text("SELECT id FROM task_instance WHERE id = :id FOR UPDATE"), {"id": ti.id}
            )
            assert self._purge(session) == [], "the scan did not skip a row another scheduler holds"
            other_scheduler.rollback()

        assert [found.task_id for found in self._purge(session)] == [ti.task_id]
        assert len(_task_callbacks(session, ti, try_number=1)) == 1

    def test_heartbeat_timeout_then_executor_event_sends_one_callback(self, dag_maker, session):
        """The real loop: purge, then the executor's FAILED event for the killed worker, then purge again."""
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "hb_then_event", retries=1, callbacks=True)

        self._purge(session)
        _report_event(_default_executor(self.job_runner), ti, TaskInstanceState.FAILED)
        self.job_runner._process_executor_events(_default_executor(self.job_runner), session)
        session.commit()
        self._purge(session)

        assert len(_task_callbacks(session, ti, try_number=1)) == 1

    # -- Paths that crashed with UniqueViolation (the sink fix; Airflow 3.4 betas) ---------------------

    def test_heartbeat_timeout_with_retries_does_not_crash_scheduler(self, dag_maker, session):
        """Any retryable task whose worker stops heartbeating: no callback needs to be configured."""
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "crash_heartbeat_timeout", retries=1)

        self.job_runner._find_and_purge_task_instances_without_heartbeats()

        _assert_retried_once(session, ti)
        assert len(_task_callbacks(session, ti)) == 1

    def test_executor_event_task_callback_does_not_crash_scheduler(self, dag_maker, session):
        """A RUNNING task reported FAILED (killed externally) that has on_failure/on_retry callbacks."""
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "crash_task_callback", retries=1, callbacks=True)
        _report_event(_default_executor(self.job_runner), ti, TaskInstanceState.FAILED)

        self.job_runner._process_executor_events(_default_executor(self.job_runner), session)
        session.commit()

        _assert_retried_once(session, ti)
        (request,) = _task_callbacks(session, ti)
        assert request.task_callback_type == TaskInstanceState.UP_FOR_RETRY

    def test_executor_event_email_request_does_not_crash_scheduler(self, dag_maker, session):
        """The same path for a task with email alerts and no callbacks."""
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "crash_email", retries=1, email=["ops@example.com"])
        _report_event(_default_executor(self.job_runner), ti, TaskInstanceState.FAILED)

        with _emails_sent(session, ti) as emails:
            self.job_runner._process_executor_events(_default_executor(self.job_runner), session)
            session.commit()

        _assert_retried_once(session, ti)
        assert emails == ["retry"]

    @pytest.mark.parametrize("orphan_first", [True, False], ids=["orphan_first", "orphan_last"])
    def test_executor_event_missing_dag_keeps_batch_attached(self, dag_maker, session, orphan_first):
        """
        The Dag-lookup-failure branch must not end the session the rest of the batch lives in.

        The batch query has no ORDER BY, so both creation orders are run.
        """
        self._create_job_runner(session)

        # Dag ids sort in creation order too: some versions' batch query returns rows by dag_id.
        def orphan_ti(dag_id: str) -> TaskInstance:
            return self._hung_ti(dag_maker, session, dag_id, task_id="orphan", callbacks=True)

        def retryable_ti(dag_id: str) -> TaskInstance:
            return self._hung_ti(dag_maker, session, dag_id, retries=1)

        if orphan_first:
            orphan, retryable = orphan_ti("batch_1_orphan"), retryable_ti("batch_2_retryable")
        else:
            retryable, orphan = retryable_ti("batch_1_retryable"), orphan_ti("batch_2_orphan")
        session.execute(delete(SerializedDagModel).where(SerializedDagModel.dag_id == orphan.dag_id))
        session.commit()
        session.expunge_all()  # nothing may still hold the deleted serialized Dag
        # The batch's query hands back this same object (identity map), whatever order it returns rows in.
        batch_member = session.get(TaskInstance, retryable.id)
        _report_event(_default_executor(self.job_runner), orphan, TaskInstanceState.FAILED)
        _report_event(_default_executor(self.job_runner), retryable, TaskInstanceState.FAILED)

        self.job_runner._process_executor_events(_default_executor(self.job_runner), session)
        still_attached = batch_member in session
        session.commit()

        assert _final_state(session, orphan) == TaskInstanceState.FAILED
        assert _task_callbacks(session, orphan) == [], (
            "the Dag was found: the lookup-failure branch did not run"
        )
        _assert_retried_once(session, retryable)
        assert still_attached, "the Dag-lookup-failure branch closed the scheduler's session mid-batch"

    def test_dag_callbacks_sent_from_do_scheduling_are_stored(self, dag_maker, session):
        """``_do_scheduling`` relied on the stock sink's commit: a Dag-level failure callback must survive."""
        self._create_job_runner(session)
        dag_run = self._running_dag_with_failed_task(dag_maker, session, "do_scheduling_callbacks")

        self._schedule(session)

        stored = [r for r in _callback_requests(session) if isinstance(r, DagCallbackRequest)]
        assert [(r.dag_id, r.is_failure_callback) for r in stored] == [(dag_run.dag_id, True)]
        assert session.scalar(select(DagRun.state).where(DagRun.id == dag_run.id)) == DagRunState.FAILED

    # -- The callback sink itself (the sink fix) -------------------------------------------------------

    @staticmethod
    def _dag_request(dag_id: str = "sink_dag") -> DagCallbackRequest:
        return DagCallbackRequest(
            filepath="sink_dag.py", bundle_name="dags-folder", bundle_version=None, dag_id=dag_id, run_id="r1"
        )

    def test_sink_send_without_session_keeps_scoped_session_open(self, session):
        """Executors call ``send(request)``: the scheduler's scoped session must stay open and uncommitted."""
        marker = Log(event="heartbeat-fix-sink-probe")
        session.add(marker)
        session.flush()

        database_callback_sink.DatabaseCallbackSink().send(self._dag_request())

        assert marker in session, "the sink closed the caller's session and detached its objects"
        assert any(isinstance(obj, DbCallbackRequest) for obj in session.new), (
            "request not in caller's session"
        )
        session.rollback()
        assert _callback_requests(session) == [], "the sink committed the caller's transaction"

    def test_sink_send_with_session_uses_that_session(self, session):
        with create_session(scoped=False) as other:
            database_callback_sink.DatabaseCallbackSink().send(
                self._dag_request("given_session"), session=other
            )
            assert [type(obj) for obj in other.new] == [DbCallbackRequest]
            assert not any(isinstance(obj, DbCallbackRequest) for obj in session.new)
            other.rollback()
        assert _callback_requests(session) == []

    def test_sink_request_is_stored_when_caller_commits(self, session):
        database_callback_sink.DatabaseCallbackSink().send(self._dag_request("committed_by_caller"))
        session.commit()

        stored = session.scalars(select(DbCallbackRequest)).all()
        assert [row.get_callback_request().dag_id for row in stored] == ["committed_by_caller"]

    # -- Upstream scheduler tests around the patched paths, on the real sink and database ----------

    def test_find_and_purge_task_instances_without_heartbeats(self, dag_maker, session):
        self._create_job_runner(session)
        with dag_maker(dag_id="purge_one_of_two", schedule=None, session=session):
            _empty_operator("hung")
            _empty_operator("alive")
        dag_run = dag_maker.create_dagrun(run_id="run_purge_one_of_two", state=DagRunState.RUNNING)
        hung = _make_running(dag_run.get_task_instance("hung", session=session), self.job_runner, session)
        alive = _make_running(
            dag_run.get_task_instance("alive", session=session),
            self.job_runner,
            session,
            stale_for=timedelta(0),
        )

        self.job_runner._find_and_purge_task_instances_without_heartbeats()

        (request,) = _callback_requests(session)
        assert (request.ti.task_id, request.ti.try_number) == ("hung", 1)
        assert "'Task Id': 'hung'" in request.msg
        assert "'Hostname': 'hung-worker'" in request.msg
        executor = _default_executor(self.job_runner)
        assert _event_states(executor) == {_task_key(executor, hung): TaskInstanceState.FAILED}
        audit = session.scalars(
            select(Log).where(Log.dag_id == hung.dag_id, Log.event == "heartbeat timeout")
        )
        assert [row.task_id for row in audit] == ["hung"]
        assert _final_state(session, alive) == TaskInstanceState.RUNNING

    def test_find_and_purge_task_instances_without_heartbeats_nothing(self, dag_maker, session):
        self._create_job_runner(session)
        with dag_maker(dag_id="purge_nothing", schedule=None, session=session):
            _empty_operator("alive")
            _empty_operator("other_scheduler")
        dag_run = dag_maker.create_dagrun(run_id="run_purge_nothing", state=DagRunState.RUNNING)
        _make_running(
            dag_run.get_task_instance("alive", session=session),
            self.job_runner,
            session,
            stale_for=timedelta(0),
        )
        other = _make_running(
            dag_run.get_task_instance("other_scheduler", session=session), self.job_runner, session
        )
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.id == other.id)
            .values(queued_by_job_id=self.job_runner.job.id + 1000)
        )
        session.commit()

        self.job_runner._find_and_purge_task_instances_without_heartbeats()

        assert _callback_requests(session) == []
        assert _event_states(_default_executor(self.job_runner)) == {}

    def test_process_executor_event_missing_dag(self, dag_maker, session):
        self._create_job_runner(session)
        with dag_maker(dag_id="event_missing_dag", schedule=None, session=session):
            _empty_operator("stall", callbacks=True)
        dag_run = dag_maker.create_dagrun(run_id="run_event_missing_dag", state=DagRunState.RUNNING)
        ti = dag_run.get_task_instance("stall", session=session)
        ti.state = TaskInstanceState.QUEUED
        ti.try_number = 1
        ti.queued_by_job_id = self.job_runner.job.id
        session.merge(ti)
        session.execute(delete(SerializedDagModel).where(SerializedDagModel.dag_id == ti.dag_id))
        session.commit()
        session.expunge_all()  # nothing may still hold the deleted serialized Dag
        _report_event(_default_executor(self.job_runner), ti, TaskInstanceState.FAILED)

        self.job_runner._process_executor_events(_default_executor(self.job_runner), session)
        session.commit()

        assert _final_state(session, ti) == TaskInstanceState.FAILED
        assert _callback_requests(session) == []

    @pytest.mark.parametrize(
        ("retries", "callback_type"),
        [
            pytest.param(0, TaskInstanceState.FAILED, id="no_retries"),
            pytest.param(1, TaskInstanceState.UP_FOR_RETRY, id="retries"),
        ],
    )
    def test_external_kill_sets_callback_type_param(self, dag_maker, session, retries, callback_type):
        self._create_job_runner(session)
        with dag_maker(dag_id="external_kill", schedule=None, session=session):
            _empty_operator("stall", retries=retries, callbacks=True)
        dag_run = dag_maker.create_dagrun(run_id="run_external_kill", state=DagRunState.RUNNING)
        ti = _make_running(
            dag_run.get_task_instance("stall", session=session), self.job_runner, session, stale_for=None
        )
        _report_event(_default_executor(self.job_runner), ti, TaskInstanceState.FAILED)

        self.job_runner._process_executor_events(_default_executor(self.job_runner), session)
        session.commit()

        (request,) = _task_callbacks(session, ti)
        assert request.task_callback_type == callback_type
        assert _final_state(session, ti) == callback_type

    def test_dagrun_callbacks_commited_before_sent(self, dag_maker, session):
        """When a Dag callback is sent, another connection already sees the run's final state."""
        self._create_job_runner(session)
        dag_run = self._running_dag_with_failed_task(dag_maker, session, "callbacks_committed")
        seen_by_others: list[str | None] = []
        send = self.job_runner._send_dag_callbacks_to_processor

        def record_committed_state(dag: Any, callback: Any = None) -> None:
            if callback is not None and callback.run_id == dag_run.run_id:
                with create_session(scoped=False) as other:
                    seen_by_others.append(other.scalar(select(DagRun.state).where(DagRun.id == dag_run.id)))
            send(dag, callback)

        with mock.patch.object(
            self.job_runner, "_send_dag_callbacks_to_processor", side_effect=record_committed_state
        ):
            self._schedule(session)

        assert seen_by_others == [DagRunState.FAILED]

    def test_dagrun_timeout_callbacks_are_stored_in_database(self, dag_maker, session):
        self._create_job_runner(session)
        with dag_maker(
            dag_id="dagrun_timeout",
            schedule=None,
            dagrun_timeout=timedelta(minutes=1),
            on_failure_callback=_noop_callback,
            session=session,
        ):
            _empty_operator("stall")
        dag_run = dag_maker.create_dagrun(run_id="run_dagrun_timeout", state=DagRunState.RUNNING)
        session.execute(update(DagModel).where(DagModel.dag_id == dag_run.dag_id).values(is_paused=False))
        session.execute(
            update(DagRun)
            .where(DagRun.id == dag_run.id)
            .values(start_date=datetime.now(timezone.utc) - timedelta(hours=1))
        )
        session.commit()

        self._schedule(session)

        stored = [r for r in _callback_requests(session) if isinstance(r, DagCallbackRequest)]
        assert [(r.dag_id, r.run_id, r.is_failure_callback, r.msg) for r in stored] == [
            (dag_run.dag_id, dag_run.run_id, True, "timed_out")
        ]

    def test_scheduler_passes_context_from_server_on_heartbeat_timeout(self, dag_maker, session):
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "context_from_server", retries=0)

        self.job_runner._find_and_purge_task_instances_without_heartbeats()

        (request,) = _task_callbacks(session, ti)
        context = request.context_from_server
        assert context is not None
        assert (context.dag_run.dag_id, context.dag_run.run_id) == (ti.dag_id, ti.run_id)
        assert context.max_tries == ti.max_tries == 0

    def test_purge_without_heartbeat_skips_when_missing_dag_version(self, dag_maker, session):
        """A task instance migrated from Airflow 2 with no Dag version: no callback, and no crash."""
        self._create_job_runner(session)
        ti = self._hung_ti(dag_maker, session, "missing_dag_version", callbacks=True)
        session.execute(update(TaskInstance).where(TaskInstance.id == ti.id).values(dag_version_id=None))
        session.execute(
            update(DagRun)
            .where(DagRun.dag_id == ti.dag_id, DagRun.run_id == ti.run_id)
            .values(created_dag_version_id=None)
        )
        session.execute(delete(DagVersion).where(DagVersion.dag_id == ti.dag_id))
        session.commit()

        self.job_runner._find_and_purge_task_instances_without_heartbeats()

        assert _callback_requests(session) == []

    def test_task_instance_heartbeat_timeout_message(self, dag_maker, session):
        self._create_job_runner(session)
        with dag_maker(dag_id="timeout_message", schedule=None, session=session):
            _empty_operator("stall")
        dag_run = dag_maker.create_dagrun(run_id="run_timeout_message", state=DagRunState.RUNNING)
        ti = dag_run.get_task_instance("stall", session=session)
        ti.hostname = "worker-7"
        ti.external_executor_id = "abcdefg"

        details = self.job_runner._generate_task_instance_heartbeat_timeout_message_details(ti)

        assert details == {
            "DAG Id": ti.dag_id,
            "Task Id": ti.task_id,
            "Run Id": ti.run_id,
            "Hostname": "worker-7",
            "External Executor Id": "abcdefg",
        }
