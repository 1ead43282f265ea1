"""
Every callback request the scheduler stores runs, once: a real ``airflow dag-processor`` killed after it
fetched its requests (its manager, its process group, or the file processor running them) leaves them to
the next one; one bad request, a blocked Dag version inflation check, or a timed-out batch drops none.

Nothing is mocked: the requests are stored by the scheduler's own heartbeat-timeout purge, the Dag
processors are real processes (``testing/killed_dag_processor.py``), and each callback writes down that it
started and that it finished. Stock runs must fail where ``parity/expectations.toml`` says the bugs are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from airflow.providers.standard.operators.empty import EmptyOperator

from airflow_heartbeat_fix.activation import is_enabled
from testing.killed_dag_processor import (
    BUNDLE,
    DAG_FILE,
    DAG_ID,
    TASKS,
    Kill,
    KillAt,
    kill_dag_processor,
    logged,
    run_batch,
    write_dag_file,
)

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.orm import Session
    from tests_common.pytest_plugin import DagMaker

pytestmark = pytest.mark.db_test


def _inflation_fix_needed() -> bool:
    """Whether this Airflow needs ``callbacks_past_inflation_check`` (3.2.0 to 3.3.1)."""
    from airflow_heartbeat_fix.activation import decide, facts
    from airflow_heartbeat_fix.detection import INFLATION_FIX, FixState

    return decide(facts(), enabled=True)[INFLATION_FIX].state is FixState.ACTIVE


@pytest.fixture
def dags(tmp_path: Path) -> Path:
    """The Dags folder of the Dag processors the tests start (their ``AIRFLOW_HOME`` is ``tmp_path``)."""
    return tmp_path / "dags"


def _hung_tries(dag_maker: DagMaker, session: Session, dags: Path, tasks: tuple[str, ...] = TASKS) -> list:
    """The Dag of the recording file, stored as the file's bundle has it, and one running try per task."""
    with dag_maker(
        dag_id=DAG_ID,
        schedule=None,
        fileloc=str(dags / DAG_FILE),
        relative_fileloc=DAG_FILE,
        bundle_name=BUNDLE,
        session=session,
    ):
        for task_id in tasks:
            EmptyOperator(task_id=task_id)
    return dag_maker.create_dagrun().get_task_instances(session=session)


@pytest.mark.backend("postgres")
@pytest.mark.usefixtures("clean_db")
class TestDagProcessorKilled:
    # Above the harness's own bounds: it stops the Dag processors it started even when a run gets stuck.
    @pytest.mark.timeout(300)
    @pytest.mark.parametrize(
        ("kill", "at"),
        [
            (Kill.MANAGER, KillAt.FETCH),
            (Kill.GROUP, KillAt.FETCH),
            (Kill.FILE_PROCESSOR, KillAt.FIRST_CALLBACK),
            (Kill.MANAGER, KillAt.FIRST_CALLBACK),
        ],
        ids=["manager-at-fetch", "group-at-fetch", "file-processor-mid-batch", "manager-mid-batch"],
    )
    def test_every_request_runs_after_kill(
        self, dag_maker: DagMaker, session: Session, tmp_path: Path, dags: Path, kill: Kill, at: KillAt
    ) -> None:
        """
        Three requests; the Dag processor is killed the moment it fetched them, or the moment the first
        callback started (mid-batch), and restarted if its manager was killed. Each callback runs to its
        end once; the one running at a file processor's kill may start a second time, never more. A killed
        manager's orphaned file processor finishes the callback it runs and starts no other: the restarted
        Dag processor, alive at the same time, never starts that one.
        """
        write_dag_file(dags)
        tis = _hung_tries(dag_maker, session, dags)

        result = kill_dag_processor(tis, session, home=tmp_path, kill=kill, at=at, fix_enabled=is_enabled())

        print(result.summary())
        assert result.stored == len(TASKS), result.summary()
        assert result.ran.done == dict.fromkeys(TASKS, 1), result.summary()
        may_repeat = 1 if kill is Kill.FILE_PROCESSOR else 0
        assert sum(result.ran.started.values()) <= len(TASKS) + may_repeat, result.summary()
        assert result.stored_at_end == 0, result.summary()
        # A second start is named: the fix's WARNING per rerun, and only then.
        reruns = sum(result.ran.started.values()) - len(TASKS)
        assert logged(tmp_path, "(attempt 2: the file processor running it before died)") == reruns


@pytest.mark.usefixtures("clean_db")
class TestBatchIsolation:
    """One ``airflow dag-processor``, no kill: the cases where stock drops callbacks by itself."""

    @pytest.mark.timeout(300)
    def test_bad_request_first_drops_none(
        self, dag_maker: DagMaker, session: Session, tmp_path: Path, dags: Path
    ) -> None:
        """
        A request for a task the Dag file no longer has, fetched first, then two valid ones for the same
        file: both valid callbacks run (apache/airflow#70990; 3.0.0 to 3.3.1 crash the file processor at the
        bad one and lose the rest of its batch).
        """
        write_dag_file(dags, tasks=TASKS[:2])
        tis = _hung_tries(dag_maker, session, dags, tasks=("removed", *TASKS[:2]))

        ran = run_batch(tis, session, home=tmp_path, fix_enabled=is_enabled(), first="removed")

        print(f"started {dict(ran.started)}, done {dict(ran.done)}")
        assert ran.done == dict.fromkeys(TASKS[:2], 1)
        if is_enabled() and not logged(tmp_path, "Failed to execute callback request"):  # up to 3.3.1
            assert logged(tmp_path, "failed; the rest of the batch runs all the same") == 1

    @pytest.mark.timeout(300)
    def test_blocked_version_inflation_check_drops_none(
        self, dag_maker: DagMaker, session: Session, tmp_path: Path, dags: Path
    ) -> None:
        """
        ``dag_version_inflation_check_level = error`` and a Dag file the check refuses: its callbacks run
        all the same (apache/airflow#70987; 3.2.0 to 3.3.1 return before running them, and log nothing).
        """
        write_dag_file(dags, inflating=True)
        tis = _hung_tries(dag_maker, session, dags)

        ran = run_batch(
            tis,
            session,
            home=tmp_path,
            fix_enabled=is_enabled(),
            AIRFLOW__DAG_PROCESSOR__DAG_VERSION_INFLATION_CHECK_LEVEL="error",
        )

        print(f"started {dict(ran.started)}, done {dict(ran.done)}")
        assert ran.done == dict.fromkeys(TASKS, 1)
        bypassed = logged(tmp_path, "the Dag version inflation check refuses")
        assert bypassed == (1 if is_enabled() and _inflation_fix_needed() else 0)

    @pytest.mark.timeout(300)
    def test_timed_out_batch_drops_none(
        self, dag_maker: DagMaker, session: Session, tmp_path: Path, dags: Path
    ) -> None:
        """
        Three 3 s callbacks in one batch, ``dag_file_processor_timeout`` 5 s: the file processor is killed
        ("Killing it!") during the second. Every callback finishes once; the one running at each kill may
        start again, first in its next batch (stock: the rest of the batch is lost).
        """
        write_dag_file(dags)
        tis = _hung_tries(dag_maker, session, dags)

        ran = run_batch(
            tis,
            session,
            home=tmp_path,
            fix_enabled=is_enabled(),
            AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT="5",
            HEARTBEAT_FIX_CALLBACK_SECONDS="3",
        )

        print(f"started {dict(ran.started)}, done {dict(ran.done)}")
        assert ran.done == dict.fromkeys(TASKS, 1)
        assert sum(ran.started.values()) <= 2 * len(TASKS)
