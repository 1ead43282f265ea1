"""
Orphan adoption when a scheduler has died: ``SchedulerJobRunner.adopt_or_reset_orphaned_tasks``.

Shaped like upstream's ``test_adopt_or_reset_orphaned_tasks*`` (``TestSchedulerJob``): task instances
queued by a scheduler job that stopped heartbeating, in a running Dag run, and a real runner calling
the real method, as the scheduler loop does (without a session: ``@provide_session`` hands it the
thread's scoped session and commits it). What varies is the executor's ``try_adopt_task_instances``:

* ``LocalExecutor``: adopts nothing, opens no session (stock Airflow resets every orphan correctly);
* :class:`ScopedSessionExecutor`: adopts the tasks whose id starts with ``adopt`` and, like
  cncf-kubernetes up to 10.17.x (``_alive_other_scheduler_job_ids``), reads the live scheduler jobs in
  a scoped ``create_session()``, which commits and closes the scheduler's session in stock Airflow;
* the real ``KubernetesExecutor`` of cncf-kubernetes 10.17.x with only the Kubernetes API replaced
  (:class:`~testing.kubernetes.FakeCluster`); run where the provider is installed
  (``nox -s tests_kubernetes``).

End to end, a real ``airflow scheduler`` with that executor is started over the orphans, its Kubernetes
API server replaced by :class:`~testing.kubernetes.FakeKubernetesApi` (HTTP on loopback, reached through a
kubeconfig).

Stock Airflow crashes with ``DetachedInstanceError`` (turned into an ``AssertionError`` naming it, so
the stock cells' strict xfails see an assertion), releases the orphans' row locks before it has written
anything (PostgreSQL), and lets a second scheduler adopt or reset the same task instances.
"""

from __future__ import annotations

import contextlib
import threading
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest
from airflow import settings
from airflow.executors.local_executor import LocalExecutor
from airflow.jobs.job import Job, JobState
from airflow.models.dag import DagModel
from airflow.models.taskinstance import TaskInstance
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState, TaskInstanceState
from sqlalchemy import select, text, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm.exc import DetachedInstanceError
from tests_common.test_utils.db import clear_db_dags, clear_db_jobs, clear_db_logs, clear_db_runs

from testing import real_scheduler
from testing.kubernetes import FakeCluster, FakeKubernetesApi, kubernetes_executor_on
from tests.unit.jobs.test_scheduler_job import _archives_tries, _scheduler_runner

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from sqlalchemy.orm import Session
    from tests_common.pytest_plugin import DagMaker

    from airflow_heartbeat_fix.demo.processes import Component

pytestmark = pytest.mark.db_test

try:
    from airflow.providers.cncf.kubernetes.executors import kubernetes_executor
except ImportError:
    kubernetes_executor = None

#: Orphans per test: two the executor adopts (their workers are alive), three it hands back to reset.
ADOPTED, RESET = ("adopt_0", "adopt_1"), ("reset_0", "reset_1", "reset_2")


def _clean_db() -> None:
    clear_db_runs()
    clear_db_jobs()
    clear_db_dags()
    clear_db_logs()


class ScopedSessionExecutor(LocalExecutor):
    """
    Adopts the task instances whose task id starts with ``adopt``, after looking up the live scheduler
    jobs in a scoped ``create_session()``: what cncf-kubernetes <= 10.17 does during adoption.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handed: list[tuple[str, str]] = []
        self.after_session: Any = None

    def try_adopt_task_instances(self, tis: Sequence[TaskInstance]) -> Sequence[TaskInstance]:
        # Read what it needs first (loaded columns), as the KubernetesExecutor reads ti.key first.
        keys = [(ti.run_id, ti.task_id) for ti in tis]
        self.handed.extend(keys)
        with create_session() as session:
            session.scalars(select(Job.id).where(Job.state == JobState.RUNNING)).all()
        if self.after_session is not None:
            self.after_session(tis)
        return [ti for ti, (_, task_id) in zip(tis, keys, strict=True) if not task_id.startswith("adopt")]


def _adopt(runner: Any) -> int:
    """
    The scheduler loop's call, in a thread whose session holds nothing yet (as in a restarted
    scheduler: the scan loads only its ``load_only`` columns); a crash of the loop becomes an assertion.
    """
    settings.Session.remove()
    try:
        return runner.adopt_or_reset_orphaned_tasks()
    except DetachedInstanceError as error:
        raise AssertionError(f"the scheduler loop raised DetachedInstanceError: {error}") from error
    except (RuntimeError, SQLAlchemyError) as error:
        raise AssertionError(f"the scheduler loop raised {error!r}") from error
    finally:
        settings.Session.remove()


def _reset_records_history() -> bool:
    """Whether this release's reset records the abandoned try first (3.1.6+: ``prepare_db_for_next_try``)."""
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner  # Airflow's own, never patched

    from airflow_heartbeat_fix.facts import names_used

    adopt = SchedulerJobRunner.adopt_or_reset_orphaned_tasks
    return "prepare_db_for_next_try" in (names_used(getattr(adopt, "__wrapped__", adopt)) or ())


def _live_job(session: Session) -> Job:
    job = Job()
    job.job_type = "SchedulerJob"
    job.state = JobState.RUNNING
    session.add(job)
    session.flush()
    return job


def _runner(session: Session, executor: Any) -> Any:
    job = _live_job(session)
    runner = _scheduler_runner(job, executor)
    executor.job_id = job.id
    session.commit()
    return runner


def _outcome(session: Session, run_id: str, task_id: str) -> tuple[Any, Any, int]:
    """``(state, queued_by_job_id)`` of the live try of the task, and how many earlier tries are recorded."""
    table = TaskInstance.__table__
    same = (table.c.run_id == run_id, table.c.task_id == task_id)
    if _archives_tries():
        live = session.execute(
            select(table.c.state, table.c.queued_by_job_id).where(*same, table.c.working_set.is_(True))
        ).one()
        recorded = len(session.execute(select(table.c.id).where(*same, table.c.working_set.is_(None))).all())
    else:
        from airflow.models.taskinstancehistory import TaskInstanceHistory

        live = session.execute(select(table.c.state, table.c.queued_by_job_id).where(*same)).one()
        history = TaskInstanceHistory.__table__
        recorded = len(
            session.execute(
                select(history.c.try_number).where(history.c.run_id == run_id, history.c.task_id == task_id)
            ).all()
        )
    return live.state, live.queued_by_job_id, recorded


@pytest.mark.need_serialized_dag
class TestSchedulerJob:
    @pytest.fixture(autouse=True)
    def per_test(self) -> Iterator[None]:
        _clean_db()
        yield
        _clean_db()

    @pytest.fixture
    def dead_job(self, session: Session) -> Job:
        """A scheduler job that stopped heartbeating an hour ago and was marked failed."""
        job = _live_job(session)
        job.state = JobState.FAILED
        job.latest_heartbeat = datetime.now(timezone.utc) - timedelta(hours=1)
        session.commit()
        return job

    @pytest.fixture
    def orphans(self, dag_maker: DagMaker, session: Session, dead_job: Job) -> list[TaskInstance]:
        """The dead job's running task instances, in a running Dag run."""
        with dag_maker(dag_id="orphans", schedule=None, session=session):
            for task_id in (*ADOPTED, *RESET):
                EmptyOperator(task_id=task_id)
        dag_run = dag_maker.create_dagrun(run_id="orphaned_run", state=DagRunState.RUNNING)
        now = datetime.now(timezone.utc)
        tis = dag_run.get_task_instances(session=session)
        for ti in tis:
            ti.state = TaskInstanceState.RUNNING
            ti.try_number = 1
            ti.queued_by_job_id = dead_job.id
            ti.start_date = ti.last_heartbeat_at = now - timedelta(seconds=30)
            ti.hostname = "worker-of-the-dead-scheduler"
        session.commit()
        return sorted(tis, key=lambda ti: ti.task_id)

    def _assert_adopted_or_reset_once(
        self, session: Session, adopted_by: int, adopted: Sequence[str]
    ) -> None:
        outcomes = {task_id: _outcome(session, "orphaned_run", task_id) for task_id in (*ADOPTED, *RESET)}
        expected = {
            task_id: (TaskInstanceState.RUNNING, adopted_by, 0)
            if task_id in adopted
            else (None, None, int(_reset_records_history()))  # reset (with its running try recorded)
            for task_id in (*ADOPTED, *RESET)
        }
        assert outcomes == expected

    def test_adopt_or_reset_orphaned_tasks_nothing(self, session: Session, dead_job: Job) -> None:
        runner = _runner(session, ScopedSessionExecutor())
        assert _adopt(runner) == 0

    # The real KubernetesExecutor's case needs the ``kubernetes`` extra: parity/expectations.toml declares
    # it not applicable without it, so only ``nox -s tests_kubernetes`` runs it.
    @pytest.mark.parametrize("executor", ["local_executor", "scoped_session_executor", "kubernetes_executor"])
    def test_adopt_or_reset_orphaned_tasks(
        self, session: Session, orphans: list[TaskInstance], dead_job: Job, executor: str
    ) -> None:
        with contextlib.ExitStack() as stack:
            if executor == "local_executor":
                runner, adopted = _runner(session, LocalExecutor()), ()
            elif executor == "scoped_session_executor":
                runner, adopted = _runner(session, ScopedSessionExecutor()), ADOPTED
            else:
                cluster = FakeCluster()
                for ti in orphans:
                    if ti.task_id in ADOPTED:
                        cluster.add_worker_pod(ti, dead_job.id)
                job = _live_job(session)
                k8s = stack.enter_context(kubernetes_executor_on(cluster, job.id))
                runner, adopted = _scheduler_runner(job, k8s), ADOPTED
                session.commit()
            assert _adopt(runner) == len(RESET) + len(ADOPTED) - len(adopted)
        self._assert_adopted_or_reset_once(session, runner.job.id, adopted)

    def test_adopt_or_reset_orphaned_tasks_logs_each_orphan_it_held(
        self, session: Session, orphans: list[TaskInstance], cap_structlog: Any
    ) -> None:
        """Where the executor's session was held, one line per orphan names the fix and what became of it."""
        runner = _runner(session, ScopedSessionExecutor())

        _adopt(runner)

        lines = [entry["event"] for entry in cap_structlog if "(held_orphan_adoption)" in entry["event"]]
        assert len(lines) == len(ADOPTED) + len(RESET), lines

    def test_restarted_scheduler_adopts_or_resets_orphaned_tasks(
        self, session: Session, orphans: list[TaskInstance], dead_job: Job, tmp_path: Path
    ) -> None:
        """
        A real ``airflow scheduler`` with the real KubernetesExecutor, started over the orphans of a
        scheduler that was killed (its job still RUNNING, an hour stale), stays up: it adopts the two
        orphans with a worker pod (relabelled to its job through the API) and resets the other three,
        one of them QUEUED. Only the Kubernetes API server is fake (:class:`FakeKubernetesApi`). A
        scheduler that crashes is started again, once, as Kubernetes restarts a crashed container:
        stock crashes both times, the orphans untouched (a crash loop).
        """
        from airflow_heartbeat_fix.activation import is_enabled

        dead_job.state = JobState.RUNNING  # killed before it could mark itself failed
        by_id = {ti.task_id: ti for ti in orphans}
        by_id["reset_2"].state = TaskInstanceState.QUEUED  # queued, its pod never created
        # Paused, so the scheduler schedules nothing it resets again: no worker pod is ever created.
        session.execute(update(DagModel).where(DagModel.dag_id == "orphans").values(is_paused=True))
        session.commit()
        cluster = FakeCluster()
        cluster.add_worker_pod(by_id["adopt_0"], dead_job.id)
        cluster.add_worker_pod(by_id["adopt_1"], dead_job.id, phase="Pending")
        started: list[Component] = []
        with FakeKubernetesApi(cluster) as api:
            kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
            config = {
                **real_scheduler.RESTART_CONFIG,
                "AIRFLOW__CORE__EXECUTOR": "KubernetesExecutor",
                "AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER": "False",
                "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": str(kubeconfig),
                "AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE": "default",
            }
            try:
                starts = real_scheduler.start_over_orphans(
                    started, tmp_path, dead_job.id, config, fix_enabled=is_enabled()
                )
            finally:
                for scheduler in started:
                    scheduler.stop()
        owners = {pod.metadata.name: pod.metadata.labels["airflow-worker"] for pod in cluster.pods}
        summary = "; ".join(
            [
                *(f"start {number}: {start.describe()}" for number, start in enumerate(starts, 1)),
                f"orphans left {real_scheduler.orphans_left(dead_job.id)}",
                f"pods owned by {owners}",
                f"API calls {dict(api.calls)}",
            ]
        )
        print(summary)
        assert [start.ended for start in starts] == [None], summary
        assert not starts[0].traceback, summary
        assert api.unanswered == [] and api.created == [], summary
        assert owners == dict.fromkeys(("pod-adopt_0", "pod-adopt_1"), str(starts[0].job_id)), summary
        with create_session(scoped=False) as reader:
            self._assert_adopted_or_reset_once(reader, starts[0].job_id, ADOPTED)

    @pytest.mark.parametrize("error", ["cluster_api_error", "database_error"])
    def test_adopt_or_reset_orphaned_tasks_executor_raises(
        self, session: Session, orphans: list[TaskInstance], error: str
    ) -> None:
        """An executor that fails inside its own session never ends the loop: what it was handed is reset."""
        executor = ScopedSessionExecutor()

        def fail_in_own_session(tis: Sequence[TaskInstance]) -> None:
            with create_session() as own:
                if error == "database_error":
                    own.execute(text("SELECT no_such_column FROM job"))
                raise RuntimeError("the cluster API is unreachable")

        executor.after_session = fail_in_own_session
        runner = _runner(session, executor)
        assert _adopt(runner) == len(ADOPTED) + len(RESET)
        self._assert_adopted_or_reset_once(session, runner.job.id, adopted=())

    @pytest.mark.backend("postgres")
    def test_adopt_or_reset_orphaned_tasks_keeps_row_locks(
        self, session: Session, orphans: list[TaskInstance]
    ) -> None:
        """Until the adoption commits, no other scheduler can lock the orphans it is adopting or resetting."""
        lockable: list[int] = []

        def another_scheduler_scans(tis: Sequence[TaskInstance]) -> None:
            assert settings.engine is not None
            with settings.engine.connect() as other:
                rows = other.execute(
                    text("SELECT id FROM task_instance WHERE run_id = 'orphaned_run' FOR UPDATE SKIP LOCKED")
                ).all()
                other.rollback()
            lockable.append(len(rows))

        executor = ScopedSessionExecutor()
        executor.after_session = another_scheduler_scans
        runner = _runner(session, executor)
        with contextlib.suppress(AssertionError):  # stock then crashes; the locks are what is asserted here
            _adopt(runner)
        assert lockable == [0], "the executor's session committed the adoption's row locks away"
        self._assert_adopted_or_reset_once(session, runner.job.id, ADOPTED)

    @pytest.mark.backend("postgres")
    def test_adopt_or_reset_orphaned_tasks_two_schedulers_at_once(
        self, session: Session, orphans: list[TaskInstance]
    ) -> None:
        """Two schedulers adopting the dead job's orphans together hand each one to one executor, once."""
        first_inside, second_done = threading.Event(), threading.Event()
        first, second = ScopedSessionExecutor(), ScopedSessionExecutor()

        def let_the_second_go(tis: Sequence[TaskInstance]) -> None:
            first_inside.set()
            second_done.wait(timeout=30)

        first.after_session = let_the_second_go
        runners = [_runner(session, first), _runner(session, second)]
        errors: list[BaseException] = []

        def run(runner: Any, wait_for: threading.Event | None, done: threading.Event | None) -> None:
            try:
                if wait_for is not None:
                    wait_for.wait(timeout=30)
                _adopt(runner)
            except BaseException as error:
                errors.append(error)
            finally:
                if done is not None:
                    done.set()

        threads = [
            threading.Thread(target=run, args=(runners[0], None, None)),
            threading.Thread(target=run, args=(runners[1], first_inside, second_done)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        handed = sorted(first.handed + second.handed)
        assert handed == sorted(("orphaned_run", task_id) for task_id in (*ADOPTED, *RESET)), (
            f"the orphans were handed to the executors {handed} (errors: {errors})"
        )
        assert errors == []
        adopted_by = runners[0].job.id if first.handed else runners[1].job.id
        self._assert_adopted_or_reset_once(session, adopted_by, ADOPTED)
