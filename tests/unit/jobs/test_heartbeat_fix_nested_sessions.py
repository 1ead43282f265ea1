"""
Sessions nested in the scheduler loop's: what the loop runs of the deployment's own code and of Airflow's.

Shaped like upstream's scheduler tests (``TestSchedulerJob``, ``dag_maker``, ``session``): a real runner
calls the real loop paths, in the thread's scoped session as the loop does. What runs nested in them is
registered the way deployments register it:

* a listener plugin from a plugins folder (``testing/plugin_files/heartbeat_fix_audit_listener.py``) that
  writes audit rows through its own ``create_session()`` and reads a ``Variable``;
* a cluster policy in a real ``airflow_local_settings.py`` that reads a ``Variable``;
* the Kafka event producer plugin of apache-airflow-providers-apache-kafka (the ``airflow.plugins`` entry
  point), which looks up its ``kafka_default`` Connection when it publishes its first event;
* Airflow's own: a ``VariableInterval`` deadline alert (3.3+), 3.0's scheduler-sent e-mail, which looks up
  the ``smtp_default`` Connection.

Variables and Connections are stored in the metadata database. In stock Airflow the nested session
commits and closes the loop's: the scheduling pass crash-loops with ``DetachedInstanceError`` (turned
into an ``AssertionError`` naming it, so the stock cells' strict xfails see an assertion), a lookup
reads "not found", a retry crashes with UniqueViolation (3.4). Nothing is replaced but the workers (the
executor is never started), the Kafka broker (none runs: the plugin's publishing fails, after its
lookup) and an SMTP server (a loopback one keeps what 3.0's scheduler sends).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from unittest import mock

import pytest
from airflow.models.connection import Connection
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.log import Log
from airflow.models.taskinstance import TaskInstance
from airflow.models.variable import Variable
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState, TaskInstanceState
from sqlalchemy import delete, select, update

from testing import real_scheduler as harness
from testing.plugins import (
    ACKNOWLEDGING_LISTENER,
    LISTENER_PLUGIN,
    LOCAL_SETTINGS,
    PAIR_LISTENER,
    install_plugin_folder,
    local_settings_loaded,
    plugins_loaded,
)
from testing.scheduler import default_executor, make_stale_for_job, new_runner
from testing.smtp import smtp_server
from tests.unit.jobs.test_scheduler_job import (
    EmailRequest,
    _assert_retried_once,
    _callback_requests,
    _clean_db,
    _empty_operator,
    _final_state,
    _make_running,
    _purge_pass,
    _report_event,
    _task_callbacks,
    _tries,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from sqlalchemy.orm import Session
    from tests_common.pytest_plugin import DagMaker

pytestmark = pytest.mark.db_test

#: What the audit listener and the policy read, stored as Variables in the metadata database.
CHANNEL, QUEUE = "ops-alerts", "nested_session_queue"
#: The audit listener plugin's rows and Variable (its module is imported from the plugins folder).
AUDIT_EVENT, CHANNEL_VARIABLE = "heartbeat-fix-audit", "heartbeat_fix_audit_channel"
POLICY_QUEUE_VARIABLE = "heartbeat_fix_policy_queue"
#: The Variable a ``VariableInterval`` deadline alert reads its interval from, in seconds.
DEADLINE_VARIABLE = "heartbeat_fix_deadline_seconds"
#: How long a real scheduler gets to fail the hung try for retry (it scans every second).
CONVERGE_TIMEOUT = 60.0
#: What the acknowledging listener and the pair listener write (their modules: testing/plugin_files).
ALERT_EVENT, PAIR_EVENT = "heartbeat-fix-alert", "heartbeat-fix-pair"
PAIR = ("heartbeat_fix_pair_left", "heartbeat_fix_pair_right")
#: The listener waits for its worker up to 10 s; a scheduler thread that does not wait on its own
#: transaction is acknowledged in milliseconds.
ACK_WAIT_LIMIT = 2.0
#: The Kafka provider's event producer plugin module: it reads its configuration when imported.
KAFKA_PLUGIN_MODULE = "airflow.providers.apache.kafka.plugins.event_producer"


async def _deadline_missed(**kwargs: Any) -> None:
    """Stands in for a deadline alert's callback; the triggerer would run it, not these tests."""


def _failure_of(step: Callable[[], Any], session: Session) -> BaseException | None:
    """Run one loop step and commit as the loop does; its error (rolled back), if any."""
    try:
        step()
        session.commit()
    except Exception as error:
        session.rollback()
        return error
    return None


def _audit_rows() -> list[tuple[str | None, str | None, str | None]]:
    """``(dag_id, run_id, extra)`` of the audit listener's committed rows, read in a session of its own."""
    with create_session(scoped=False) as reader:
        rows = reader.execute(
            select(Log.dag_id, Log.run_id, Log.extra).where(Log.event == AUDIT_EVENT).order_by(Log.id)
        ).all()
    return [tuple(row) for row in rows]


@pytest.fixture
def stored_variables() -> Iterator[Callable[..., None]]:
    """Store Variables in the metadata database, as ``airflow variables set`` does; deleted afterwards."""
    keys: list[str] = []

    def store(**values: str) -> None:
        with create_session(scoped=False) as writer:
            for key, value in values.items():
                writer.add(Variable(key=key, val=value))
                keys.append(key)

    yield store
    with create_session(scoped=False) as cleaner:
        cleaner.execute(delete(Variable).where(Variable.key.in_(keys)))


@pytest.fixture
def stored_connection() -> Iterator[Callable[..., None]]:
    """Store a Connection in the metadata database, as ``airflow connections add`` does."""
    conn_ids: list[str] = []

    def store(conn_id: str, **fields: Any) -> None:
        with create_session(scoped=False) as writer:
            writer.add(Connection(conn_id=conn_id, **fields))
        conn_ids.append(conn_id)

    yield store
    with create_session(scoped=False) as cleaner:
        cleaner.execute(delete(Connection).where(Connection.conn_id.in_(conn_ids)))


def _deployed(tmp_path: Path, plugin_file: Path) -> Any:
    """``plugin_file`` deployed in a plugins folder and loaded by Airflow's plugin manager, for the block."""
    return plugins_loaded(install_plugin_folder(tmp_path / "plugins", plugin_file))


@pytest.fixture
def audit_listener(tmp_path: Path) -> Iterator[Any]:
    """The audit listener plugin (audit rows through its own create_session(), a Variable read)."""
    with _deployed(tmp_path, LISTENER_PLUGIN) as listener_manager:
        yield listener_manager


@pytest.fixture
def acknowledging_listener(tmp_path: Path) -> Iterator[Any]:
    """The send-and-acknowledge alerting listener."""
    with _deployed(tmp_path, ACKNOWLEDGING_LISTENER) as listener_manager:
        yield listener_manager


@pytest.fixture
def pair_listener(tmp_path: Path) -> Iterator[Any]:
    """The listener that writes its own Dag's row, then the paired Dag's."""
    with _deployed(tmp_path, PAIR_LISTENER) as listener_manager:
        yield listener_manager
    with create_session(scoped=False) as cleaner:
        cleaner.execute(delete(Variable).where(Variable.key.in_([f"{dag_id}_row" for dag_id in PAIR])))


def _logged(event: str) -> list[tuple[str | None, list[str]]]:
    """``(dag_id, extra split at "|")`` of ``event``'s committed ``log`` rows, in a session of its own."""
    with create_session(scoped=False) as reader:
        rows = reader.execute(select(Log.dag_id, Log.extra).where(Log.event == event).order_by(Log.id)).all()
    return [(dag_id, (extra or "").split("|")) for dag_id, extra in rows]


@pytest.fixture
def queue_policy(tmp_path: Path) -> Iterator[Any]:
    """The deployment's ``airflow_local_settings.py`` with its ``task_instance_mutation_hook``."""
    config = install_plugin_folder(tmp_path / "config", LOCAL_SETTINGS)
    with local_settings_loaded(config) as local_settings:
        yield local_settings


@pytest.fixture
def scheduler_process() -> Iterator[None]:
    """
    What ``SchedulerJobRunner._execute`` marks its process as (3.1+): a server, whose Task SDK lookups
    (``airflow.sdk`` Connections and Variables) include the metastore. The loop paths run without it here.
    """
    with mock.patch.dict(os.environ, {"_AIRFLOW_PROCESS_CONTEXT": "server"}):
        yield


@pytest.fixture
def kafka_event_producer(tmp_path: Path, scheduler_process: None) -> Iterator[Any]:
    """
    apache-airflow-providers-apache-kafka's event producer plugin, Dag-run and task events on, loaded from
    its ``airflow.plugins`` entry point as a scheduler process loads it (its state is per process).
    """
    settings = {
        "AIRFLOW__KAFKA_EVENT_PRODUCER__DAG_RUN_EVENTS_ENABLED": "True",
        "AIRFLOW__KAFKA_EVENT_PRODUCER__TASK_INSTANCE_EVENTS_ENABLED": "True",
        # No broker runs: the topic check after the lookup fails at once and is retried a minute later.
        "AIRFLOW__KAFKA_EVENT_PRODUCER__TOPIC_CHECK_TIMEOUT": "1",
    }
    empty_plugins_folder = install_plugin_folder(tmp_path / "plugins")
    with (
        mock.patch.dict(os.environ, settings),
        plugins_loaded(empty_plugins_folder, entry_point_modules=[KAFKA_PLUGIN_MODULE]),
    ):
        import importlib

        yield importlib.import_module(KAFKA_PLUGIN_MODULE)


@pytest.mark.need_serialized_dag
class TestSchedulerJob:
    runner: Any

    @pytest.fixture(autouse=True)
    def per_test(self) -> Iterator[None]:
        _clean_db()
        yield
        _clean_db()

    def _hung_ti(self, dag_maker: DagMaker, session: Session, dag_id: str, **operator: Any) -> Any:
        """A one-task Dag whose only task instance has stopped heartbeating."""
        with dag_maker(dag_id=dag_id, schedule=None, session=session):
            _empty_operator("stall", **operator)
        dag_run = dag_maker.create_dagrun(run_id=f"run_{dag_id}", state=DagRunState.RUNNING)
        return _make_running(dag_run.get_task_instance("stall", session=session), self.runner, session)

    def _queued_runs(self, dag_maker: DagMaker, session: Session, *dag_ids: str) -> None:
        """An unpaused Dag per id with one QUEUED run: the next scheduling pass starts them."""
        for dag_id in dag_ids:
            with dag_maker(dag_id=dag_id, schedule=None, session=session):
                _empty_operator("work")
            dag_maker.create_dagrun(run_id=f"run_{dag_id}", state=DagRunState.QUEUED)
            session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=False))
        session.commit()

    def _due_for_a_run(self, session: Session, dag_id: str, since: datetime) -> None:
        """Unpause ``dag_id`` with a run due since ``since``: the next scheduling pass creates it."""
        session.execute(
            update(DagModel)
            .where(DagModel.dag_id == dag_id)
            .values(is_paused=False, next_dagrun_create_after=since)
        )
        session.commit()

    def _started(self, session: Session) -> dict[str, bool]:
        """Whether each Dag's run has left QUEUED without failing (its EmptyOperator may finish it)."""
        rows = session.execute(select(DagRun.dag_id, DagRun.state)).all()
        return {dag_id: state in (DagRunState.RUNNING, DagRunState.SUCCESS) for dag_id, state in rows}

    # -- Listener plugins ----------------------------------------------------------------------------

    @pytest.mark.parametrize("retries", [pytest.param(0, id="no_retries"), pytest.param(1, id="retryable")])
    def test_heartbeat_timeout_with_failure_listener_converges(
        self, dag_maker, session, audit_listener, retries
    ):
        """The listener's ``on_task_instance_failed`` writes through ``create_session()`` mid-purge."""
        self.runner = new_runner(session)
        ti = self._hung_ti(dag_maker, session, "nested_hb_listener", retries=retries)

        error = _failure_of(lambda: _purge_pass(self.runner, session), session)

        assert error is None, f"the heartbeat-timeout purge failed: {error!r}"
        assert _purge_pass(self.runner, session) == [], "the next scan found the same try again"
        assert len(_task_callbacks(session, ti, try_number=1)) == 1
        if retries:
            _assert_retried_once(session, ti)
        else:
            assert _final_state(session, ti) == TaskInstanceState.FAILED
        assert _audit_rows() == [("nested_hb_listener", "run_nested_hb_listener", "failed: try 1")]

    def test_executor_event_with_failure_listener_retries_the_try(self, dag_maker, session, audit_listener):
        """A worker its executor reports FAILED, with a retry left: the listener writes mid-batch."""
        self.runner = new_runner(session)
        executor = default_executor(self.runner)
        ti = self._hung_ti(dag_maker, session, "nested_event_listener", retries=1)
        _report_event(executor, ti, TaskInstanceState.FAILED)

        error = _failure_of(lambda: self.runner._process_executor_events(executor, session), session)

        assert error is None, f"executor-event processing failed: {error!r}"
        _assert_retried_once(session, ti)
        assert _audit_rows() == [("nested_event_listener", "run_nested_event_listener", "failed: try 1")]

    def test_dag_run_listener_reading_variable_starts_queued_runs(
        self, dag_maker, session, audit_listener, stored_variables
    ):
        """
        ``on_dag_run_running`` reads a Variable and writes an audit row, inside ``_do_scheduling``'s
        ``prohibit_commit`` (apache/airflow#39646, #73291).
        """
        stored_variables(**{CHANNEL_VARIABLE: CHANNEL})
        self.runner = new_runner(session)
        self._queued_runs(dag_maker, session, "nested_dr_first", "nested_dr_second")

        errors = [_failure_of(lambda: self.runner._do_scheduling(session), session) for _ in range(2)]

        assert errors == [None, None], f"the scheduling passes failed: {errors!r}"
        assert self._started(session) == {"nested_dr_first": True, "nested_dr_second": True}
        assert _audit_rows() == [
            ("nested_dr_first", "run_nested_dr_first", f"running: channel={CHANNEL}"),
            ("nested_dr_second", "run_nested_dr_second", f"running: channel={CHANNEL}"),
        ]

    # -- Listeners that count on their commits (no failure mode stock lacks) ---------------------------

    @pytest.mark.parametrize("retries", [pytest.param(0, id="no_retries"), pytest.param(1, id="retryable")])
    def test_acknowledging_listener_is_acknowledged_without_the_scheduler_waiting(
        self, dag_maker, session, acknowledging_listener, retries
    ):
        """
        A listener that marks its alert pending and waits for a worker thread of its own to read the mark
        and acknowledge it (both through ``Variable.set``): the worker sees the mark and writes the same
        row at once, so the scheduler's thread never waits on its own transaction; the listener sees the
        try as Airflow announced it.
        """
        self.runner = new_runner(session)
        executor = default_executor(self.runner)
        ti = self._hung_ti(dag_maker, session, "nested_ack", retries=retries)
        _report_event(executor, ti, TaskInstanceState.FAILED)

        error = _failure_of(lambda: self.runner._process_executor_events(executor, session), session)

        assert error is None, f"executor-event processing failed: {error!r}"
        [(_, (outcome, waited, state, seen))] = _logged(ALERT_EVENT)
        assert (outcome, seen) == ("acknowledged", "worker read pending"), f"waited {waited} s"
        assert float(waited) < ACK_WAIT_LIMIT, f"the scheduler's thread waited {waited} s on itself"
        assert state == (TaskInstanceState.UP_FOR_RETRY if retries else TaskInstanceState.FAILED)

    @pytest.mark.backend("postgres")
    def test_listeners_of_two_schedulers_write_shared_rows_in_opposite_orders(
        self, dag_maker, session, pair_listener
    ):
        """
        Two schedulers (two threads, two runners, a session each) fail a try of each paired Dag at once;
        each one's listener writes its own Dag's row, waits to see the other's, then writes the other's:
        neither waits for the other's transaction, no deadlock, no listener write lost.
        """
        import threading

        from airflow import settings

        pairs = []
        for dag_id in PAIR:
            self.runner = new_runner(session)
            ti = self._hung_ti(dag_maker, session, dag_id)
            executor = default_executor(self.runner)
            _report_event(executor, ti, TaskInstanceState.FAILED)
            pairs.append((self.runner, executor))
        session.commit()
        errors: list[BaseException | None] = []

        def scheduler(runner: Any, executor: Any) -> None:
            own = settings.Session()  # each scheduler has its own
            try:
                errors.append(_failure_of(lambda: runner._process_executor_events(executor, own), own))
            finally:
                settings.Session.remove()

        threads = [threading.Thread(target=scheduler, args=pair) for pair in pairs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

        assert errors == [None, None], f"executor-event processing failed: {errors!r}"
        written = sorted((dag_id, extra[0].split(" after ")[0]) for dag_id, extra in _logged(PAIR_EVENT))
        assert written == [(dag_id, "wrote both; saw the other's row") for dag_id in PAIR], (
            "a listener write was lost (deadlock) or the other's row stayed invisible"
        )

    # -- Cluster policies -----------------------------------------------------------------------------

    def test_task_instance_mutation_hook_reading_variable_creates_scheduled_runs(
        self, dag_maker, session, queue_policy, stored_variables
    ):
        """The deployment's policy reads a Variable for every task instance the scheduler creates."""
        stored_variables(**{POLICY_QUEUE_VARIABLE: QUEUE})
        self.runner = new_runner(session)
        start = datetime.now(tz=timezone.utc) - timedelta(days=2)
        with dag_maker(dag_id="nested_policy", schedule=timedelta(days=1), start_date=start, session=session):
            _empty_operator("work")
        self._due_for_a_run(session, "nested_policy", since=start)

        errors = [_failure_of(lambda: self.runner._do_scheduling(session), session) for _ in range(2)]

        assert errors == [None, None], f"the scheduling passes failed: {errors!r}"
        queues = session.scalars(select(TaskInstance.queue).where(TaskInstance.dag_id == "nested_policy"))
        assert set(queues) == {QUEUE}, "no run was created, or the policy did not see the Variable"

    # -- Airflow's own nested sessions ----------------------------------------------------------------

    @pytest.mark.usefixtures("scheduler_process")  # 3.3.0/3.3.1 resolve the interval through the Task SDK
    def test_variable_interval_deadline_creates_scheduled_runs(self, dag_maker, session, stored_variables):
        """A deadline alert whose interval is a Variable, read at Dag-run creation (apache/airflow#71968)."""
        from airflow.models.deadline import Deadline
        from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference
        from airflow.sdk.definitions.deadline import VariableInterval

        stored_variables(**{DEADLINE_VARIABLE: "3600"})
        self.runner = new_runner(session)
        start = datetime.now(tz=timezone.utc) - timedelta(days=2)
        alert = DeadlineAlert(
            reference=DeadlineReference.DAGRUN_LOGICAL_DATE,
            interval=VariableInterval(DEADLINE_VARIABLE),
            callback=AsyncCallback(_deadline_missed),
        )
        with dag_maker(
            dag_id="nested_deadline",
            schedule=timedelta(days=1),
            start_date=start,
            deadline=alert,
            session=session,
        ):
            _empty_operator("work")
        self._due_for_a_run(session, "nested_deadline", since=start)

        # One pass: the next one finishes the run (its EmptyOperator needs no worker) and prunes its deadline.
        error = _failure_of(lambda: self.runner._do_scheduling(session), session)

        assert error is None, f"the scheduling pass failed: {error!r}"
        runs = session.scalars(select(DagRun.id).where(DagRun.dag_id == "nested_deadline")).all()
        deadlines = session.scalars(select(Deadline.dagrun_id).where(Deadline.dagrun_id.in_(runs))).all()
        session.execute(delete(Deadline).where(Deadline.dagrun_id.in_(runs)))
        session.commit()
        assert runs and sorted(deadlines) == sorted(runs), "no run was created, or it has no deadline"

    # -- A provider's listener plugin -----------------------------------------------------------------

    def test_kafka_event_producer_plugin_starts_queued_runs(
        self, dag_maker, session, kafka_event_producer, stored_connection
    ):
        """
        The Kafka event producer builds its producer from the ``kafka_default`` Connection at its first
        Dag-run event, inside ``_do_scheduling`` (apache/airflow#72138, open).
        """
        stored_connection(
            "kafka_default", conn_type="kafka", extra='{"bootstrap.servers": "127.0.0.1:9", "log_level": 0}'
        )
        self.runner = new_runner(session)
        self._queued_runs(dag_maker, session, "nested_kafka_first", "nested_kafka_second")

        errors = [_failure_of(lambda: self.runner._do_scheduling(session), session) for _ in range(2)]

        assert errors == [None, None], f"the scheduling passes failed: {errors!r}"
        assert self._started(session) == {"nested_kafka_first": True, "nested_kafka_second": True}
        assert kafka_event_producer._producer is not None, "the plugin did not find its Connection"

    def test_heartbeat_timeout_with_email_alerts_sends_one_typed_callback(
        self, dag_maker, session, stored_connection
    ):
        """
        A try with a retry left, ``email_on_retry`` and ``on_retry_callback``: one callback of its retry
        state, one retry e-mail. 3.0's scheduler sends the e-mail itself and looks up ``smtp_default``
        for it; from 3.1 the scheduler asks the Dag processor to send it.
        """
        with smtp_server() as smtp:
            stored_connection("smtp_default", conn_type="smtp", host="127.0.0.1", login="airflow")
            smtp_settings = {
                "AIRFLOW__SMTP__SMTP_HOST": "127.0.0.1",
                "AIRFLOW__SMTP__SMTP_PORT": str(smtp.server_address[1]),
                "AIRFLOW__SMTP__SMTP_MAIL_FROM": "airflow@example.com",
                "AIRFLOW__SMTP__SMTP_STARTTLS": "False",
            }
            self.runner = new_runner(session)
            ti = self._hung_ti(
                dag_maker, session, "nested_email", retries=1, email=["ops@example.com"], callbacks=True
            )

            with mock.patch.dict(os.environ, smtp_settings):
                error = _failure_of(lambda: _purge_pass(self.runner, session), session)

        assert error is None, f"the heartbeat-timeout purge failed: {error!r}"
        callbacks = _task_callbacks(session, ti, try_number=1)
        assert [request.task_callback_type for request in callbacks] == [TaskInstanceState.UP_FOR_RETRY]
        _assert_retried_once(session, ti)
        if EmailRequest is None:
            assert [message["To"] for message in smtp.received] == ["ops@example.com"]
        else:
            requested = [r for r in _callback_requests(session) if isinstance(r, EmailRequest)]
            assert [request.email_type for request in requested] == ["retry"]


@pytest.mark.usefixtures("scheduler_rows_cleared")
class TestRealScheduler:
    """A real ``airflow scheduler`` with the audit listener plugin in its plugins folder."""

    @pytest.fixture(autouse=True)
    def per_test(self) -> Iterator[None]:
        _clean_db()
        yield
        _clean_db()

    def test_failure_listener_does_not_crash_a_retry(self, dag_maker, session, tmp_path):
        """
        A hung try with a retry left: the scheduler's purge fails it for retry, the listener writes its
        audit row through ``create_session()``; the scheduler stays up and sends one callback for the try.
        """

        with dag_maker(dag_id="nested_real_scheduler", schedule=None, session=session):
            _empty_operator("stall", retries=1)
        dag_run = dag_maker.create_dagrun(run_id="run_nested_real_scheduler", state=DagRunState.RUNNING)
        ti = dag_run.get_task_instance("stall", session=session)
        outcome, scheduler_log = _hung_on_a_real_scheduler([ti], session, tmp_path / "home", LISTENER_PLUGIN)

        assert harness.loop_crash(scheduler_log) is None, (
            f"the scheduler crashed: {harness.loop_crash(scheduler_log)}"
        )
        assert outcome == "converged", f"the hung try was not failed for retry: {outcome}"
        with create_session(scoped=False) as reader:
            _assert_retried_once(reader, ti)
            assert len(_task_callbacks(reader, ti, try_number=1)) == 1
        assert _audit_rows() == [("nested_real_scheduler", "run_nested_real_scheduler", "failed: try 1")]

    @pytest.mark.backend("postgres")
    def test_acknowledging_listener_on_a_real_scheduler(self, dag_maker, session, tmp_path):
        """
        A real scheduler with the acknowledging listener fails four hung tries: each alert is acknowledged
        by the listener's own worker thread with no wait of the scheduler's thread, and each try converges
        with one callback.
        """

        with dag_maker(dag_id="nested_real_ack", schedule=None, session=session):
            for number in range(4):
                _empty_operator(f"stall_{number}")
        dag_run = dag_maker.create_dagrun(run_id="run_nested_real_ack", state=DagRunState.RUNNING)
        tis = dag_run.get_task_instances(session=session)
        outcome, scheduler_log = _hung_on_a_real_scheduler(
            tis, session, tmp_path / "home", ACKNOWLEDGING_LISTENER
        )

        assert harness.loop_crash(scheduler_log) is None, harness.loop_crash(scheduler_log)
        assert outcome == "converged", f"the hung tries did not converge: {outcome}"
        alerts = [extra for _, extra in _logged(ALERT_EVENT)]
        assert [(outcome, seen) for outcome, _, _, seen in alerts] == [
            ("acknowledged", "worker read pending")
        ] * len(tis), alerts
        assert max(float(waited) for _, waited, _, _ in alerts) < ACK_WAIT_LIMIT, alerts

    @pytest.mark.backend("postgres")
    def test_listeners_of_two_real_schedulers_write_shared_rows(self, dag_maker, session, tmp_path):
        """
        Two real schedulers, each owning a hung try of one of the paired Dags, fail them at once; their
        listeners write the same two rows in opposite orders: no deadlock, no listener write lost.
        """
        from airflow_heartbeat_fix.activation import is_enabled

        home = tmp_path / "home"
        install_plugin_folder(home / "plugins", PAIR_LISTENER)
        tis = []
        for dag_id in PAIR:
            with dag_maker(dag_id=dag_id, schedule=None, session=session):
                _empty_operator("stall")
            dag_run = dag_maker.create_dagrun(run_id=f"run_{dag_id}", state=DagRunState.RUNNING)
            tis.append(dag_run.get_task_instance("stall", session=session))
        schedulers, jobs = [], set()
        try:
            for dag_id in PAIR:
                scheduler = harness.start_scheduler(
                    f"pair-{dag_id}",
                    home,
                    fix_enabled=is_enabled(),
                    AIRFLOW__CORE__PLUGINS_FOLDER=str(home / "plugins"),
                )
                schedulers.append(scheduler)
                jobs.add(harness.scheduler_job(scheduler, known=jobs))
            for scheduler in schedulers:
                harness.check_activation(scheduler, is_enabled())
            for ti, job_id in zip(tis, sorted(jobs), strict=True):
                make_stale_for_job([ti], job_id, session)
            outcomes = [
                _until_all_converged(scheduler, [ti]) for scheduler, ti in zip(schedulers, tis, strict=True)
            ]
            logs = [scheduler.read_log() for scheduler in schedulers]
        finally:
            for scheduler in schedulers:
                scheduler.stop()

        assert [harness.loop_crash(log) for log in logs] == [None, None]
        assert outcomes == ["converged", "converged"], outcomes
        written = sorted((dag_id, extra[0].split(" after ")[0]) for dag_id, extra in _logged(PAIR_EVENT))
        assert written == [(dag_id, "wrote both; saw the other's row") for dag_id in PAIR], (
            "a listener write was lost (deadlock) or the other's row stayed invisible"
        )
        with create_session(scoped=False) as cleaner:
            cleaner.execute(delete(Variable).where(Variable.key.in_([f"{dag_id}_row" for dag_id in PAIR])))


def _hung_on_a_real_scheduler(
    tis: list[Any], session: Session, home: Path, plugin_file: Path
) -> tuple[str, str]:
    """
    A real ``airflow scheduler`` with ``plugin_file`` in its plugins folder handed ``tis`` as its hung
    tries, until they converge (:func:`_until_all_converged`): what happened, and its log.
    """
    from airflow_heartbeat_fix.activation import is_enabled

    plugins = install_plugin_folder(home / "plugins", plugin_file)
    scheduler = harness.start_scheduler(
        f"{plugin_file.stem}-scheduler",
        home,
        fix_enabled=is_enabled(),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(plugins),
    )
    try:
        job_id = harness.scheduler_job(scheduler, known=set())
        harness.check_activation(scheduler, is_enabled())
        make_stale_for_job(tis, job_id, session)
        return _until_all_converged(scheduler, tis), scheduler.read_log()
    finally:
        scheduler.stop()


def _until_all_converged(scheduler: Any, tis: list[Any]) -> str:
    """
    Wait until every try 1 of ``tis`` has left RUNNING (two more scans then pass); or say what happened
    instead: the scheduler exited, or a try was purged a second time (a purge that never converges).
    """
    import time

    deadline = time.monotonic() + CONVERGE_TIMEOUT
    while time.monotonic() < deadline:
        if scheduler.popen.poll() is not None or harness.loop_crash(scheduler.read_log()):
            return "the scheduler exited"
        with create_session(scoped=False) as reader:
            if any(len(_task_callbacks(reader, ti, try_number=1)) > 1 for ti in tis):
                return "a try was purged again (the purge left it running)"
            states = [state for ti in tis for number, state, _ in _tries(reader, ti) if number == 1]
        if len(states) >= len(tis) and all(
            state in (TaskInstanceState.FAILED, TaskInstanceState.UP_FOR_RETRY) for state in states
        ):
            time.sleep(2 * harness.PURGE_EVERY)
            return "converged"
        time.sleep(0.2)
    return f"still {states} after {CONVERGE_TIMEOUT:.0f} s"
