"""
Race a heartbeat-timeout purge against workers and other schedulers, on a real PostgreSQL database.

Shared by the reliability tests (``tests/unit/jobs/test_heartbeat_fix_row_locks.py``) and the
stress benchmark (``python -m benchmarks.purge_race``); no pytest in here. Nothing is mocked but the
workers: a worker is a thread with its own database connection doing what the Execution API's
``ti_update_state`` does when a task succeeds (lock the try's row, and only if it is still RUNNING and
the live try, set SUCCESS and commit). Interleavings are made deterministic with
:class:`Interleaving`: the scheduler thread stops at a chosen moment, lets another actor go, and waits
until that actor has finished or is waiting on a row lock, which the database reports (``pg_locks``);
every wait is bounded.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import event, select, text

from testing.database import own_connection
from testing.scheduler import (
    default_executor,
    on_callback_for,
    on_task_callbacks,
    purge_pass,
    task_callback_requests,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sqlalchemy.orm import Session

#: How long any actor may take before the harness gives up (a hang is a failure, never a stall).
SETTLE_TIMEOUT = 20.0


def archives_tries() -> bool:
    """Airflow 3.4 keeps each try as its own row (``working_set``); older releases overwrite the row."""
    from airflow.models.taskinstance import TaskInstance

    return hasattr(TaskInstance, "working_set")


# ---------------------------------------------------------------------------------------------------
# Outcome


@dataclass(frozen=True)
class TryOutcome:
    ti_id: Any
    state: str | None
    callbacks: int
    worker_told_success: bool

    def problem(self) -> str | None:
        """What is inconsistent about this try, or ``None``."""
        from airflow.utils.state import TaskInstanceState

        if self.worker_told_success:
            if self.state != TaskInstanceState.SUCCESS:
                return f"worker was told SUCCESS but the try ended {self.state}"
            if self.callbacks:
                return f"worker was told SUCCESS but {self.callbacks} failure callback(s) were sent"
            return None
        if self.state in (TaskInstanceState.RUNNING, TaskInstanceState.RESTARTING):
            return f"still {self.state} after the purge"
        if self.callbacks != 1:
            return f"{self.callbacks} callbacks for one timed-out try"
        return None


def callbacks_per_try(session: Session) -> dict[Any, int]:
    """
    Stored task callback requests, counted per task instance id. The scenarios here have one try per
    task instance (no retries), and a 3.4 try has an id of its own anyway.
    """
    counts: dict[Any, int] = {}
    for request in task_callback_requests(session):
        # Keyed as text: up to 3.1 the model's id is a string column, the request's a UUID.
        counts[str(request.ti.id)] = counts.get(str(request.ti.id), 0) + 1
    return counts


def outcomes(session: Session, ti_ids: list[Any], told_success: set[Any]) -> list[TryOutcome]:
    from airflow.models.taskinstance import TaskInstance

    query = select(TaskInstance.id, TaskInstance.state).where(TaskInstance.id.in_(ti_ids))
    states = dict(session.execute(query.execution_options(include_all_attempts=True)).all())
    callbacks = callbacks_per_try(session)
    session.commit()
    return [
        TryOutcome(ti_id, states.get(ti_id), callbacks.get(str(ti_id), 0), ti_id in told_success)
        for ti_id in ti_ids
    ]


def problems(results: list[TryOutcome]) -> list[str]:
    return [f"try {index} ({r.ti_id}): {p}" for index, r in enumerate(results) if (p := r.problem())]


# ---------------------------------------------------------------------------------------------------
# Actors


class Worker:
    """A task's worker reporting SUCCESS through its own connection, as ``ti_update_state`` does."""

    def __init__(self) -> None:
        self.told_success: set[Any] = set()
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()

    def finish(self, ti_id: Any) -> bool:
        """Try to mark ``ti_id`` SUCCESS; True if the worker was told it succeeded."""
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from airflow.utils.state import TaskInstanceState
        from sqlalchemy import update

        columns: list[Any] = [TaskInstance.state]
        if archives_tries():
            columns.append(TaskInstance.working_set)
        try:
            with create_session(scoped=False) as worker:
                # Bounded: a lock never released would fail the run instead of hanging it.
                worker.execute(text(f"SET LOCAL lock_timeout = '{int(SETTLE_TIMEOUT)}s'"))
                # The Execution API locks the try's row, then only a RUNNING live try may succeed.
                row = worker.execute(
                    select(*columns)
                    .where(TaskInstance.id == ti_id)
                    .with_for_update(of=TaskInstance)
                    .execution_options(include_all_attempts=True)
                ).one_or_none()
                live = row is not None and (len(row) == 1 or row[1] is not None)
                if row is None or not live or row[0] != TaskInstanceState.RUNNING:
                    return False
                worker.execute(
                    update(TaskInstance)
                    .where(TaskInstance.id == ti_id)
                    .values(state=TaskInstanceState.SUCCESS, end_date=datetime.now(tz=timezone.utc))
                    .execution_options(synchronize_session=False, include_all_attempts=True)
                )
        except Exception as error:
            with self._lock:
                self.errors.append(error)
            return False
        with self._lock:
            self.told_success.add(ti_id)
        return True


class Actor(threading.Thread):
    """Runs ``target`` in its own thread (own scoped session and connection); keeps its error."""

    def __init__(self, name: str, target: Callable[[], Any]) -> None:
        super().__init__(name=name, daemon=True)
        self._target_call = target
        self.error: BaseException | None = None
        self.result: Any = None

    def run(self) -> None:
        from airflow import settings

        try:
            self.result = self._target_call()
        except BaseException as error:
            self.error = error
        finally:
            if settings.Session is not None:
                settings.Session.remove()


@contextlib.contextmanager
def lock_monitor() -> Iterator[Callable[[], int]]:
    """A callable counting backends of this database that wait for a lock, on a connection of its own."""
    with own_connection() as connection:

        def waiting() -> int:
            query = text(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.datname = current_database()"
            )
            return int(connection.execute(query).scalar_one())

        yield waiting


@dataclass
class Interleaving:
    """
    Makes the scheduler thread give way to other actors at chosen moments, deterministically.

    :meth:`give_way` starts an actor and returns once it has finished or waits for a row lock. From
    then on, before each statement the scheduler thread sends, the harness waits the same way for every
    actor still alive, so an actor unblocked by the scheduler's commit always finishes before the
    scheduler goes on: the schedule that gives the other actors every chance to win.
    """

    waiting_for_locks: Callable[[], int]
    scheduler_thread: int = field(default_factory=threading.get_ident)
    actors: list[Actor] = field(default_factory=list)

    def give_way(self, actor: Actor) -> None:
        self.actors.append(actor)
        actor.start()
        self.settle()

    def settle(self) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while any(actor.is_alive() for actor in self.actors):
            if self.waiting_for_locks():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"an actor neither finished nor waited for a lock in {SETTLE_TIMEOUT}s")
            time.sleep(0.005)

    def _before_statement(self, *_: Any) -> None:
        if threading.get_ident() == self.scheduler_thread and self.actors:
            self.settle()

    def join(self) -> None:
        for actor in self.actors:
            actor.join(SETTLE_TIMEOUT)
            if actor.is_alive():
                raise TimeoutError(f"{actor.name} still running {SETTLE_TIMEOUT}s after the purge")

    @contextlib.contextmanager
    def active(self) -> Iterator[Interleaving]:
        from airflow import settings

        event.listen(settings.engine, "before_cursor_execute", self._before_statement)
        try:
            yield self
            self.join()
        finally:
            event.remove(settings.engine, "before_cursor_execute", self._before_statement)


# ---------------------------------------------------------------------------------------------------
# Scenarios


def worker_finishes_kth(runner: Any, ti_ids: list[Any], k: int, session: Session) -> list[TryOutcome]:
    """A worker reports SUCCESS for the k-th task instance of the batch while the purge handles it."""
    worker = Worker()
    target = ti_ids[k]
    with lock_monitor() as waiting, Interleaving(waiting).active() as interleaving:
        give_way = lambda: interleaving.give_way(Actor("worker", lambda: worker.finish(target)))  # noqa: E731
        with on_callback_for(default_executor(runner), target, give_way):
            error = purge_pass(runner)
    if error is not None:
        raise error
    if worker.errors:
        raise worker.errors[0]
    return outcomes(session, ti_ids, worker.told_success)


def two_schedulers(runner: Any, other: Any, ti_ids: list[Any], session: Session) -> list[TryOutcome]:
    """Scheduler ``other`` runs a whole pass while ``runner`` is about to fail the 2nd task instance."""
    target = ti_ids[1]
    with lock_monitor() as waiting, Interleaving(waiting).active() as interleaving:
        actor = Actor("other-scheduler", lambda: purge_pass(other))
        with on_callback_for(default_executor(runner), target, lambda: interleaving.give_way(actor)):
            error = purge_pass(runner)
    for failure in (error, actor.error, actor.result):
        if failure is not None:
            raise failure
    return outcomes(session, ti_ids, set())


@contextlib.contextmanager
def failing_commit_of(ti_id: Any) -> Iterator[list[bool]]:
    """
    Raise ``OperationalError`` once, at the commit that would store ``ti_id``'s failed state (the flush
    before it carried the task instance's state change). Yields ``[raised]``.
    """
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session as SASession

    armed: list[bool] = []
    raised: list[bool] = []

    def after_flush(session: Session, _: Any) -> None:
        if any(isinstance(obj, TaskInstance) and obj.id == ti_id for obj in session.dirty):
            armed.append(True)

    def before_commit(session: Session) -> None:
        if armed and not raised:
            raised.append(True)
            raise OperationalError("COMMIT", {}, Exception("injected: connection lost at commit"))

    event.listen(SASession, "after_flush", after_flush)
    event.listen(SASession, "before_commit", before_commit)
    try:
        yield raised
    finally:
        event.remove(SASession, "after_flush", after_flush)
        event.remove(SASession, "before_commit", before_commit)


def commit_fails_for_kth(
    runner: Any, ti_ids: list[Any], k: int, session: Session
) -> tuple[BaseException | None, list[str], list[TryOutcome]]:
    """
    The database fails the commit of the k-th task instance's state change once. Returns the error the
    pass raised, what was inconsistent right after it (a callback stored without its state change, or
    the reverse), and the outcome after one more pass.
    """
    with failing_commit_of(ti_ids[k]):
        error = purge_pass(runner)
    return error, *_half_done_then_next_pass(runner, ti_ids, session)


def _half_done_then_next_pass(
    runner: Any, ti_ids: list[Any], session: Session
) -> tuple[list[str], list[TryOutcome]]:
    """Tries left with a callback but no state change (or the reverse); then the outcome of one more pass."""
    from airflow.utils.state import TaskInstanceState

    half_done = [
        f"try {index} ({r.ti_id}): state {r.state} with {r.callbacks} callback(s)"
        for index, r in enumerate(outcomes(session, ti_ids, set()))
        if (r.state in (TaskInstanceState.RUNNING, TaskInstanceState.RESTARTING)) != (r.callbacks == 0)
    ]
    second = purge_pass(runner)
    if second is not None:
        raise second
    return half_done, outcomes(session, ti_ids, set())


def connection_killed_after_callback_for_kth(
    runner: Any, ti_ids: list[Any], k: int, session: Session
) -> tuple[BaseException | None, list[str], list[TryOutcome]]:
    """
    ``pg_terminate_backend`` of the scheduler's connection right after the k-th task instance's callback
    was handed to the sink, as a failover or an administrator would. Returns what
    :func:`commit_fails_for_kth` returns.
    """
    from airflow import settings

    def terminate_scheduler_connection() -> None:
        scheduler: Any = settings.Session  # the scheduler thread's scoped session
        pid = scheduler().connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with own_connection() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    with on_callback_for(
        default_executor(runner), ti_ids[k], terminate_scheduler_connection, after_sending=True
    ):
        error = purge_pass(runner)
    return error, *_half_done_then_next_pass(runner, ti_ids, session)


# ---------------------------------------------------------------------------------------------------
# Random finishes (the stress benchmark's scenario)


@dataclass
class RandomFinishResult:
    tis: int
    worker_successes: int
    lost_successes: int
    spurious_callbacks: int
    #: tries no worker was told succeeded that did not end failed with exactly one callback
    other_problems: int
    deadlocks: int


def random_finishes(
    runner: Any, ti_ids: list[Any], session: Session, *, workers: int = 4, share: float = 0.3, seed: int = 0
) -> RandomFinishResult:
    """
    Purge ``ti_ids`` while ``workers`` threads report SUCCESS for about ``share`` of them, uncoordinated.

    A worker only ever finishes a task that is still running, so each picks at random among the task
    instances still RUNNING in the database. Its finishes are spread over the whole pass: it waits for
    the purge to send a random number of further callbacks (about ``workers / share`` on average)
    before each one; nothing else ties it to the purge.
    """
    import random

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState

    ids = ti_ids
    worker = Worker()
    progress = threading.Condition()
    sent = [0]
    done = threading.Event()
    stride = max(1, round(workers / share))

    def count_callback(_: Any) -> None:
        with progress:
            sent[0] += 1
            progress.notify_all()

    def work(rng: random.Random) -> None:
        mark = 0
        while not done.is_set():
            mark += rng.randint(1, 2 * stride - 1)
            with progress:
                reached = functools.partial(lambda at: sent[0] >= at or done.is_set(), mark)
                if not progress.wait_for(reached, SETTLE_TIMEOUT):
                    return
            if done.is_set():
                return
            with create_session(scoped=False) as reader:
                running = reader.scalars(
                    select(TaskInstance.id).where(
                        TaskInstance.id.in_(ids), TaskInstance.state == TaskInstanceState.RUNNING
                    )
                ).all()
            if running:
                worker.finish(rng.choice(running))

    actors = [
        Actor(f"worker-{i}", functools.partial(work, random.Random(seed * 100 + i))) for i in range(workers)
    ]
    try:
        for actor in actors:
            actor.start()
        with on_task_callbacks(default_executor(runner), count_callback):
            error = purge_pass(runner)
    finally:
        done.set()
        with progress:
            progress.notify_all()
        for actor in actors:
            actor.join(SETTLE_TIMEOUT)
    results = outcomes(session, ti_ids, worker.told_success)
    deadlocks = sum("deadlock" in str(e).lower() for e in [error, *worker.errors] if e is not None)
    if error is not None and not deadlocks:
        raise error
    return RandomFinishResult(
        tis=len(ti_ids),
        worker_successes=len(worker.told_success),
        lost_successes=sum(1 for r in results if r.worker_told_success and r.state != "success"),
        spurious_callbacks=sum(r.callbacks for r in results if r.worker_told_success),
        other_problems=len(problems([r for r in results if not r.worker_told_success])),
        deadlocks=deadlocks,
    )
