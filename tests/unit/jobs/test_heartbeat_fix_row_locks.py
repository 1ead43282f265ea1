"""
The heartbeat-timeout purge against concurrent workers and schedulers, on PostgreSQL.

Beyond upstream: ``handle_failure`` commits per task instance and so releases the scan's row locks
on the rest of the batch, and the re-check before each task instance's side effects reads without a
lock; upstream names this a known issue. ``locked_purge_revalidation`` re-locks each task
instance and re-validates it under that lock through its own commit. Each test races real Airflow
code against another actor with its own database connection, in a fixed interleaving
(``testing/purge_race.py``: the purge stops right before a task instance's side effects, lets
the other actor go, and goes on once that actor has finished or waits for a row lock). Row locks
need PostgreSQL: SQLite has none.

:class:`TestSchedulerKilledMidPurge` crashes a real ``airflow scheduler`` process instead (SIGKILL
mid-purge) and restarts one: a callback is stored together with its try's failure or not at all.
:class:`TestPurgeMetrics` (any database) checks the metrics the purge emits when a try is skipped.

Stock runs must fail where ``parity/expectations.toml`` says the bugs are; fixed runs pass everywhere.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest
from airflow.models.dag import DagModel
from airflow.models.taskinstance import TaskInstance
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.utils.session import create_session
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from airflow_heartbeat_fix import activation
from airflow_heartbeat_fix import purge as purge_module
from airflow_heartbeat_fix.activation import is_enabled
from airflow_heartbeat_fix.detection import PURGE_FIX, FixState
from airflow_heartbeat_fix.purge import _typed_task_callbacks, changed_since_scan
from testing import purge_race
from testing.killed_scheduler import kill_scheduler_mid_purge
from testing.scheduler import make_stale, new_runner, purge_pass

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.orm import Session
    from tests_common.pytest_plugin import DagMaker

pytestmark = pytest.mark.db_test

#: Task instances per purged batch: enough for a first, a second and a last one with others between.
BATCH = 4


@pytest.mark.backend("postgres")
@pytest.mark.usefixtures("clean_db")
class TestHeartbeatPurgeRowLocks:
    @pytest.fixture
    def runner(self, session: Session) -> Any:
        return new_runner(session)

    @pytest.fixture
    def stale_batch(self, dag_maker: DagMaker, runner: Any, session: Session) -> list[Any]:
        """Ids of ``BATCH`` timed-out task instances of one run, in the order the purge takes them."""
        with dag_maker(dag_id="heartbeat_fix_row_locks", schedule=None, session=session):
            for index in range(BATCH):
                EmptyOperator(task_id=f"hung_{index}")
        dag_run = dag_maker.create_dagrun()
        return make_stale(dag_run.get_task_instances(session=session), runner, session)

    @pytest.mark.parametrize(
        "k", [pytest.param(0, id="first"), pytest.param(1, id="second"), pytest.param(BATCH - 1, id="last")]
    )
    def test_worker_success_during_purge_is_kept(
        self, runner: Any, stale_batch: list[Any], session: Session, k: int
    ) -> None:
        """
        A worker reports SUCCESS for the k-th task instance right before the purge's side effects for
        it. Told SUCCESS, the try must end SUCCESS with no failure callback; refused, it must end failed
        with exactly one callback. Every other task instance: failed, one callback.
        """
        results = purge_race.worker_finishes_kth(runner, stale_batch, k, session)

        assert purge_race.problems(results) == []

    def test_two_schedulers_send_one_callback_per_try(
        self, runner: Any, stale_batch: list[Any], session: Session
    ) -> None:
        """
        Split brain: a second scheduler scanning the same job's task instances runs a whole pass while
        the first is about to fail its second task instance. Exactly one callback per try.
        """
        other = new_runner(session, job_id=runner.job.id)

        results = purge_race.two_schedulers(runner, other, stale_batch, session)

        assert purge_race.problems(results) == []

    def test_failed_commit_keeps_callback_and_state_together(
        self, runner: Any, stale_batch: list[Any], session: Session
    ) -> None:
        """
        The database fails the commit of the second task instance's failure once. No callback may be
        stored without its state change, or the reverse; the next pass converges with one callback
        per try.
        """
        error, half_done, results = purge_race.commit_fails_for_kth(runner, stale_batch, 1, session)

        assert isinstance(error, OperationalError), "the injected commit failure never happened"
        assert half_done == []
        assert purge_race.problems(results) == []

    def test_connection_killed_mid_purge_keeps_callback_and_state_together(
        self, runner: Any, stale_batch: list[Any], session: Session
    ) -> None:
        """
        ``pg_terminate_backend`` of the scheduler's connection right after the second task instance's
        callback was handed to the sink. Same guarantees as a failed commit.
        """
        error, half_done, results = purge_race.connection_killed_after_callback_for_kth(
            runner, stale_batch, 1, session
        )

        assert isinstance(error, OperationalError), "the purge never noticed its connection was gone"
        assert half_done == []
        assert purge_race.problems(results) == []


#: Task instances a real scheduler is purging when it is killed: enough that its purge takes a while
#: (half a second even on stock 3.3, which commits only the callbacks), so the test sees it mid-way. It
#: is killed halfway, not sooner: each task instance left unpurged costs the restart a reset (~60 ms).
KILLED_BATCH = 200


@pytest.mark.backend("postgres")
@pytest.mark.usefixtures("clean_db")
class TestSchedulerKilledMidPurge:
    # Above the harness's own bounds: it stops the schedulers it started even when a run gets stuck.
    @pytest.mark.timeout(480)
    def test_no_orphan_or_duplicate_callback_after_kill_and_restart(
        self, dag_maker: DagMaker, session: Session, tmp_path: Path
    ) -> None:
        """
        ``kill -9`` of a real ``airflow scheduler`` halfway through its purge of 200 hung tries (every
        other task has a retry left), then a restart. Every stored callback goes with its try's failure,
        once; every try the dead scheduler did not reach is reset by the new one's adoption, without one.
        """
        with dag_maker(dag_id="heartbeat_fix_scheduler_kill", schedule=None, session=session):
            for index in range(KILLED_BATCH):
                EmptyOperator(task_id=f"hung_{index:03d}", retries=index % 2)
        dag_run = dag_maker.create_dagrun()
        # Paused, so the restarted scheduler leaves the task instances it resets alone: no workers needed.
        session.execute(update(DagModel).where(DagModel.dag_id == dag_run.dag_id).values(is_paused=True))
        session.commit()

        result = kill_scheduler_mid_purge(
            dag_run.get_task_instances(session=session),
            session,
            home=tmp_path,
            kill_at=KILLED_BATCH // 2,
            fix_enabled=is_enabled(),
        )

        print(result.summary())
        assert result.problems() == [], result.verdict()


@pytest.mark.mode_independent  # the package's own metrics: stock Airflow emits none of them
@pytest.mark.usefixtures("clean_db")
class TestPurgeMetrics:
    """The ``Stats`` the fixed purge emits, with the names and tags the README documents."""

    DAG_ID = "heartbeat_fix_metrics"

    @pytest.fixture
    def emitted(self, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, str]]]:
        calls: list[tuple[str, dict[str, str]]] = []

        class RecordingStats:
            @staticmethod
            def incr(name: str, *args: Any, tags: dict[str, str] | None = None, **kwargs: Any) -> None:
                calls.append((name, dict(tags or {})))

        monkeypatch.setattr(purge_module, "Stats", RecordingStats)
        return calls

    def test_converged_and_skipped_changed(
        self, dag_maker: DagMaker, session: Session, emitted: list[tuple[str, dict[str, str]]]
    ) -> None:
        """
        Two timed-out tries; a worker heartbeats for one of them between the scan and the purge. The
        lock's re-validation skips that one (``skipped_changed``, every release); the other converges,
        counted as ``converged`` where the backported purge runs (upstream's own purge counts nothing).
        """
        runner = new_runner(session)
        with dag_maker(dag_id=self.DAG_ID, schedule=None, session=session):
            EmptyOperator(task_id="hung")
            EmptyOperator(task_id="revived")
        dag_run = dag_maker.create_dagrun()
        make_stale(dag_run.get_task_instances(session=session), runner, session)
        found = runner._find_task_instances_without_heartbeats(session=session)
        session.commit()  # the scan's transaction ends, so the worker's commit can land
        with create_session(scoped=False) as worker:
            worker.execute(
                update(TaskInstance)
                .where(TaskInstance.dag_id == self.DAG_ID, TaskInstance.task_id == "revived")
                .values(last_heartbeat_at=datetime.now(tz=timezone.utc))
            )

        runner._purge_task_instances_without_heartbeats(found, session=session)
        session.commit()

        decided = activation.decide(activation.facts(), enabled=True)
        expected = [("heartbeat_fix.heartbeat_timeout.skipped_changed", {"dag_id": self.DAG_ID})]
        if decided[PURGE_FIX].state is FixState.ACTIVE:
            converged = {"dag_id": self.DAG_ID, "task_id": "hung"}
            expected.append(("heartbeat_fix.heartbeat_timeout.converged", converged))
        assert sorted(emitted, key=str) == sorted(expected, key=str)

    def test_a_converged_try_is_logged_once_naming_the_fix(
        self, dag_maker: DagMaker, session: Session, cap_structlog: Any
    ) -> None:
        """One line per try the backported purge failed, naming the fix; none where upstream's purge runs."""
        runner = new_runner(session)
        with dag_maker(dag_id=self.DAG_ID, schedule=None, session=session):
            EmptyOperator(task_id="hung", retries=1)
            EmptyOperator(task_id="last_try")
        dag_run = dag_maker.create_dagrun()
        make_stale(dag_run.get_task_instances(session=session), runner, session)

        purge_pass(runner)

        lines = [entry for entry in cap_structlog if "(converged_heartbeat_purge)" in entry["event"]]
        decided = activation.decide(activation.facts(), enabled=True)
        if decided[PURGE_FIX].state is not FixState.ACTIVE:
            assert lines == []
            return
        assert len(lines) == 2, [
            entry["event"] for entry in lines
        ]  # one per try (their callbacks: the purge's tests)


class TestTypedTaskCallbacks:
    """The backport's interception of ``executor.send_callback`` leaves the executor as it found it."""

    class _Executor:
        def __init__(self) -> None:
            self.sent: list[Any] = []

        def send_callback(self, request: Any) -> None:
            self.sent.append(("class", request))

    def test_restores_an_instance_attribute_and_nests(self) -> None:
        from airflow.utils.state import TaskInstanceState

        executor = self._Executor()
        own = lambda request: executor.sent.append(("own", request))  # noqa: E731
        executor.send_callback = own  # type: ignore[method-assign]

        with _typed_task_callbacks(executor, "a", TaskInstanceState.FAILED):
            with _typed_task_callbacks(executor, "b", TaskInstanceState.UP_FOR_RETRY):
                pass
            executor.send_callback("request")
        assert executor.send_callback is own
        assert executor.sent == [("own", "request")]

    def test_leaves_no_instance_attribute_where_there_was_none(self) -> None:
        from airflow.utils.state import TaskInstanceState

        executor = self._Executor()
        with _typed_task_callbacks(executor, "a", TaskInstanceState.FAILED):
            assert "send_callback" in vars(executor)
        assert "send_callback" not in vars(executor)


class TestChangedSinceScan:
    """The re-validation under the lock: the heartbeat-timeout scan's own criteria, row by row."""

    NOW = datetime(2026, 1, 1, 12, tzinfo=timezone.utc)
    STALE = NOW - timedelta(hours=1)

    @pytest.mark.parametrize(
        ("changes", "expected"),
        [
            pytest.param({}, None, id="still timed out"),
            pytest.param({"state": "restarting"}, None, id="restarting is scanned too"),
            pytest.param({"state": "success"}, "no longer running", id="worker finished"),
            pytest.param({"state": "failed"}, "no longer running", id="another scheduler failed it"),
            pytest.param({"last_heartbeat_at": NOW}, "heartbeated", id="fresh heartbeat"),
            pytest.param({"last_heartbeat_at": None}, "heartbeated", id="no heartbeat at all"),
            pytest.param({"queued_by_job_id": 8}, "adopted by scheduler job 8", id="adopted"),
            pytest.param({"working_set": None}, "archived try", id="archived try (3.4)"),
            pytest.param({"working_set": True}, None, id="live try (3.4)"),
        ],
    )
    def test_scan_criteria(self, changes: dict[str, Any], expected: str | None) -> None:
        row = {"state": "running", "last_heartbeat_at": self.STALE, "queued_by_job_id": 7, **changes}
        stale_before = self.NOW - timedelta(minutes=5)

        changed = changed_since_scan(row, job_id=7, stale_before=stale_before)

        assert changed is None if expected is None else (changed is not None and expected in changed)
