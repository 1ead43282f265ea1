"""
The heartbeat-timeout purge against concurrent workers and schedulers, on PostgreSQL (issue 9).

Beyond upstream: ``handle_failure`` commits per task instance and so releases the scan's row locks
on the rest of the batch, and the re-check before each task instance's side effects reads without a
lock; upstream names this a known issue (seed 003). ``locked_purge_revalidation`` re-locks each task
instance and re-validates it under that lock through its own commit. Each test races real Airflow
code against another actor with its own database connection, in a fixed interleaving
(``tests/purge_race_harness.py``: the purge stops right before a task instance's side effects, lets
the other actor go, and goes on once that actor has finished or waits for a row lock). Row locks
need PostgreSQL: SQLite has none.

Stock runs must fail where ``parity/expectations.toml`` says the bugs are; fixed runs pass everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from airflow.models.db_callback_request import DbCallbackRequest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.utils.session import create_session
from sqlalchemy import delete
from sqlalchemy.exc import OperationalError
from tests_common.test_utils.db import clear_db_callbacks, clear_db_jobs, clear_db_logs, clear_db_runs

from airflow_heartbeat_fix.scheduler import _typed_task_callbacks
from tests import purge_race_harness as harness

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.orm import Session
    from tests_common.pytest_plugin import DagMaker

pytestmark = pytest.mark.db_test

#: Task instances per purged batch: enough for a first, a second and a last one with others between.
BATCH = 4


def _clean_db() -> None:
    clear_db_runs()
    clear_db_jobs()
    clear_db_callbacks()
    clear_db_logs()
    with create_session() as session:
        session.execute(delete(DbCallbackRequest))


@pytest.mark.backend("postgres")
class TestHeartbeatPurgeRowLocks:
    @pytest.fixture(autouse=True)
    def per_test(self) -> Iterator[None]:
        _clean_db()
        yield
        _clean_db()

    @pytest.fixture
    def runner(self, session: Session) -> Any:
        return harness.new_runner(session)

    @pytest.fixture
    def stale_batch(self, dag_maker: DagMaker, runner: Any, session: Session) -> list[Any]:
        """Ids of ``BATCH`` timed-out task instances of one run, in the order the purge takes them."""
        with dag_maker(dag_id="heartbeat_fix_row_locks", schedule=None, session=session):
            for index in range(BATCH):
                EmptyOperator(task_id=f"hung_{index}")
        dag_run = dag_maker.create_dagrun()
        return harness.make_stale(dag_run.get_task_instances(session=session), runner, session)

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
        results = harness.worker_finishes_kth(runner, stale_batch, k, session)

        assert harness.problems(results) == []

    def test_two_schedulers_send_one_callback_per_try(
        self, runner: Any, stale_batch: list[Any], session: Session
    ) -> None:
        """
        Split brain: a second scheduler scanning the same job's task instances runs a whole pass while
        the first is about to fail its second task instance. Exactly one callback per try.
        """
        other = harness.new_runner(session, job_id=runner.job.id)

        results = harness.two_schedulers(runner, other, stale_batch, session)

        assert harness.problems(results) == []

    def test_failed_commit_keeps_callback_and_state_together(
        self, runner: Any, stale_batch: list[Any], session: Session
    ) -> None:
        """
        The database fails the commit of the second task instance's failure once. No callback may be
        stored without its state change, or the reverse; the next pass converges with one callback
        per try.
        """
        error, half_done, results = harness.commit_fails_for_kth(runner, stale_batch, 1, session)

        assert isinstance(error, OperationalError), "the injected commit failure never happened"
        assert half_done == []
        assert harness.problems(results) == []

    def test_connection_killed_mid_purge_keeps_callback_and_state_together(
        self, runner: Any, stale_batch: list[Any], session: Session
    ) -> None:
        """
        ``pg_terminate_backend`` of the scheduler's connection right after the second task instance's
        callback was handed to the sink. Same guarantees as a failed commit.
        """
        error, half_done, results = harness.connection_killed_after_callback_for_kth(
            runner, stale_batch, 1, session
        )

        assert isinstance(error, OperationalError), "the purge never noticed its connection was gone"
        assert half_done == []
        assert harness.problems(results) == []


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
