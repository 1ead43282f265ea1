"""
Race a heartbeat-timeout purge against workers and other schedulers, on a real PostgreSQL database.

Shared by the reliability tests (``tests/unit/jobs/test_heartbeat_fix_row_locks.py``) and the
stress benchmark (``python -m benchmarks.purge_race``); no pytest in here. Nothing is mocked but the
workers: a worker is a thread with its own database connection doing what the Execution API's
``ti_update_state`` does when a task succeeds (lock the try's row, and only if it is still RUNNING and
the live try, set SUCCESS and commit). Interleavings are made deterministic with
:class:`Interleaving`: the scheduler thread stops at a chosen moment, lets another actor go, and waits
until that actor has finished or is waiting on a row lock, which the database reports (``pg_locks``);
every wait is bounded. :func:`kill_scheduler_mid_purge` runs real ``airflow scheduler`` processes
instead, and SIGKILLs one in the middle of its purge.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, event, select, text
from sqlalchemy.pool import NullPool

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.orm import Session

    from airflow_heartbeat_fix.demo.processes import Component, Processes

#: How long any actor may take before the harness gives up (a hang is a failure, never a stall).
SETTLE_TIMEOUT = 20.0
STALE_FOR = timedelta(hours=1)


def on_postgres() -> bool:
    from airflow import settings

    return settings.engine is not None and settings.engine.dialect.name == "postgresql"


def archives_tries() -> bool:
    """Airflow 3.4 keeps each try as its own row (``working_set``); older releases overwrite the row."""
    from airflow.models.taskinstance import TaskInstance

    return hasattr(TaskInstance, "working_set")


# ---------------------------------------------------------------------------------------------------
# State


def new_runner(session: Session, *, job_id: int | None = None) -> Any:
    """
    The runner ``airflow scheduler`` would build (the fixed subclass when activation is on), wired as
    ``SchedulerJobRunner._execute`` wires it; executors are never started. ``job_id``: scan another
    runner's job, as a split-brain second scheduler would (its job then lives in no session, so
    another thread can read it).
    """
    from airflow.callbacks import database_callback_sink
    from airflow.cli.commands import scheduler_command
    from airflow.jobs.job import Job

    from airflow_heartbeat_fix._compat import scheduler_executors

    job = Job()
    if job_id is None:
        session.add(job)
        session.flush()
    else:
        job.id = job_id
    runner = scheduler_command.SchedulerJobRunner(job=job, num_runs=1)
    sink = database_callback_sink.DatabaseCallbackSink()
    for executor in scheduler_executors(runner):
        executor.job_id = job.id
        executor.callback_sink = sink
    session.commit()
    if job_id is None:
        # Loaded and detached: a failed pass rolls back and closes the scheduler's scoped session, and
        # the scan still needs ``job.id`` (the real scheduler keeps its job elsewhere too).
        session.refresh(job)
        session.expunge(job)
    return runner


def _default_executor(runner: Any) -> Any:
    """The executor the runner sends callbacks through (on the runner from 3.2 on, on its job before)."""
    from airflow_heartbeat_fix._compat import default_executor

    return default_executor(runner)


def make_stale(tis: list[Any], runner: Any, session: Session) -> list[Any]:
    """
    Leave ``tis`` as hung workers do: RUNNING try 1, queued by ``runner``, heartbeat long gone. Returns
    their ids in the order the purge handles them (the scenarios below work on ids: a failed pass
    detaches every ORM object of the scheduler's session).
    """
    return make_stale_for_job(tis, runner.job.id, session)


def make_stale_for_job(tis: list[Any], job_id: int, session: Session) -> list[Any]:
    """:func:`make_stale` for the scheduler job ``job_id`` (a scheduler in another process)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import update

    now = datetime.now(tz=timezone.utc)
    session.execute(
        update(TaskInstance)
        .where(TaskInstance.id.in_([ti.id for ti in tis]))
        .values(
            state=TaskInstanceState.RUNNING,
            try_number=1,
            queued_by_job_id=job_id,
            start_date=now - STALE_FOR - timedelta(seconds=10),
            last_heartbeat_at=now - STALE_FOR,
            hostname="hung-worker",
        )
        .execution_options(synchronize_session=False)
    )
    ids = [ti.id for ti in tis]
    session.commit()
    return sorted(ids)


def purge_pass(runner: Any) -> BaseException | None:
    """One heartbeat-timeout pass as the scheduler loop runs it (own scoped session); its error, if any."""
    try:
        runner._find_and_purge_task_instances_without_heartbeats()
    except Exception as error:
        return error
    return None


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


def task_callback_requests(session: Session) -> list[Any]:
    """Every stored ``TaskCallbackRequest`` (the sink stores Dag callbacks and email requests too)."""
    from airflow.models.db_callback_request import DbCallbackRequest

    requests = (row.get_callback_request() for row in session.scalars(select(DbCallbackRequest)))
    return [request for request in requests if type(request).__name__ == "TaskCallbackRequest"]


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

        columns = [TaskInstance.state]
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
                if not live or row[0] != TaskInstanceState.RUNNING:
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
def own_connection() -> Iterator[Connection]:
    """
    A connection to this database of its own, outside every pool, in autocommit: each statement sees
    the server's state now (PostgreSQL's activity views are a snapshot per transaction), on SQLAlchemy
    1.4 and 2.x alike.
    """
    from airflow import settings

    engine: Engine = create_engine(settings.engine.url, poolclass=NullPool)
    connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        yield connection
    finally:
        connection.close()
        engine.dispose()


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


@contextlib.contextmanager
def on_task_callbacks(
    executor: Any, action: Callable[[Any], None], *, after_sending: bool = False
) -> Iterator[None]:
    """
    Run ``action(request)`` whenever the purge is about to send a task callback: past its re-checks,
    right before that task instance's side effects. The stock 3.2/3.3 purge re-checks nothing, so this
    is the one moment every version has; nothing re-validates between upstream's re-read and it.
    ``after_sending``: right after the callback was handed to the sink instead.
    """
    own = vars(executor).get("send_callback")
    send_callback = executor.send_callback

    def hooked(request: Any) -> None:
        is_task_callback = type(request).__name__ == "TaskCallbackRequest"
        if is_task_callback and not after_sending:
            action(request)
        send_callback(request)
        if is_task_callback and after_sending:
            action(request)

    executor.send_callback = hooked
    try:
        yield
    finally:
        if own is None:
            vars(executor).pop("send_callback", None)
        else:
            executor.send_callback = own


def on_callback_for(
    executor: Any, ti_id: Any, action: Callable[[], None], *, after_sending: bool = False
) -> Any:
    """:func:`on_task_callbacks` for one task instance."""
    return on_task_callbacks(
        executor,
        lambda request: action() if str(request.ti.id) == str(ti_id) else None,
        after_sending=after_sending,
    )


# ---------------------------------------------------------------------------------------------------
# Scenarios


def worker_finishes_kth(runner: Any, ti_ids: list[Any], k: int, session: Session) -> list[TryOutcome]:
    """A worker reports SUCCESS for the k-th task instance of the batch while the purge handles it."""
    worker = Worker()
    target = ti_ids[k]
    with lock_monitor() as waiting, Interleaving(waiting).active() as interleaving:
        give_way = lambda: interleaving.give_way(Actor("worker", lambda: worker.finish(target)))  # noqa: E731
        with on_callback_for(_default_executor(runner), target, give_way):
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
        with on_callback_for(_default_executor(runner), target, lambda: interleaving.give_way(actor)):
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
        scheduler = settings.Session()
        pid = scheduler.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with own_connection() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    with on_callback_for(
        _default_executor(runner), ti_ids[k], terminate_scheduler_connection, after_sending=True
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
    statements: int


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
    counter = StatementCounter(thread=threading.get_ident())

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
        with on_task_callbacks(_default_executor(runner), count_callback), counter.counting():
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
        statements=counter.statements,
    )


def measured_pass(runner: Any) -> StatementCounter:
    """One pass with nothing racing it, counting the statements and commits the scheduler thread sends."""
    with StatementCounter(thread=threading.get_ident()).counting() as counter:
        error = purge_pass(runner)
    if error is not None:
        raise error
    return counter


# ---------------------------------------------------------------------------------------------------
# Cost: the one way the tests and the benchmarks count what a pass sends to the database

_VERB = re.compile(r"^\s*(SELECT|INSERT INTO|UPDATE|DELETE FROM|WITH)\b\s*(\S*)", re.IGNORECASE)
_ROW_LOCK = re.compile(r"\bFOR (NO KEY )?(UPDATE|SHARE)\b", re.IGNORECASE)
_FROM = re.compile(r"\bFROM\s+([\w.\"]+)", re.IGNORECASE)


def statement_kind(sql: str) -> str:
    """A short label for a statement: its verb and main table, and whether it locks rows."""
    match = _VERB.match(sql)
    if not match:
        return sql.split(None, 1)[0].upper() if sql.strip() else "?"
    verb = match.group(1).upper()
    if verb in {"SELECT", "WITH"}:
        tables = _FROM.search(sql)
        table = tables.group(1) if tables else "-"
        lock = " FOR UPDATE" if _ROW_LOCK.search(sql) else ""
        return f"SELECT {table.strip(chr(34))}{lock}"
    return f"{verb.split()[0]} {match.group(2).strip(chr(34)).split('(')[0]}"


@dataclass
class StatementCounter:
    """
    Statements (by :func:`statement_kind`) and commits sent through Airflow's engine while
    :meth:`counting`; with ``thread``, only that thread's, so racing actors are not counted.
    """

    thread: int | None = None
    statements: int = 0
    commits: int = 0
    kinds: Counter[str] = field(default_factory=Counter)

    @contextlib.contextmanager
    def counting(self) -> Iterator[StatementCounter]:
        from airflow import settings

        def on_statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if self.thread is None or threading.get_ident() == self.thread:
                self.statements += 1
                self.kinds[statement_kind(statement)] += 1

        def on_commit(conn: Any) -> None:
            if self.thread is None or threading.get_ident() == self.thread:
                self.commits += 1

        listeners: list[tuple[str, Callable[..., None]]] = [
            ("before_cursor_execute", on_statement),
            ("commit", on_commit),
        ]
        for name, listener in listeners:
            event.listen(settings.engine, name, listener)
        try:
            yield self
        finally:
            for name, listener in listeners:
                event.remove(settings.engine, name, listener)


# ---------------------------------------------------------------------------------------------------
# A real scheduler killed mid-purge (kill -9), then restarted

#: The try :func:`make_stale` leaves running: the one the killed scheduler was purging.
KILLED_TRY = 1
#: Every scheduler here scans for timed-out tries every second (the hung tries are an hour stale).
PURGE_EVERY = 1
#: The restarted scheduler looks for the killed one's orphans every second and declares it dead 20 s
#: after its last heartbeat: longer than the restarted one's own silence while it resets ~100 orphans in
#: one transaction (3-6 s; 16 s seen at a load average of 15 on 2 cores). Past that it marks its own
#: job failed once, which changes nothing here: it holds no task instances.
RESTART_CONFIG = {
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "20",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "1",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
}
#: Bounds for real processes on a busy machine: reaching one ends the run, it never hangs. Together
#: (with SETTLE_TIMEOUT) under 400 s: a test running this gives pytest-timeout more than that, so the
#: harness, not pytest, ends a stuck run and stops the schedulers.
START_TIMEOUT = 90.0
PURGE_TIMEOUT = 60.0
RESTART_TIMEOUT = 120.0
POLL = 0.01


@dataclass(frozen=True)
class KilledTry:
    """One task instance whose try was running when its scheduler was killed, as the database says."""

    task_id: str
    #: the state of the task instance's live try (on 3.4 a reset or a retry makes a new try)
    state: str | None
    #: callbacks stored for the killed try
    callbacks: int
    #: callbacks stored for any other try of the task instance (none ever ran)
    stray_callbacks: int

    def problem(self, *, settled: bool) -> str | None:
        """
        What is inconsistent: a callback must go with its try's failure (FAILED, or UP_FOR_RETRY with
        the next try allocated), once; a try reset by adoption has none. ``settled``: the dead
        scheduler's tries must all have been dealt with (after the restart), not only be consistent.
        """
        from airflow.utils.state import TaskInstanceState

        if self.stray_callbacks:
            return f"{self.stray_callbacks} callback(s) for a try that never ran"
        if self.state in (TaskInstanceState.RUNNING, TaskInstanceState.RESTARTING):
            if self.callbacks:
                return f"{self.callbacks} callback(s) stored while its try is still {self.state} (orphan)"
            return f"still {self.state}: neither converged nor reset by adoption" if settled else None
        if self.state in (TaskInstanceState.FAILED, TaskInstanceState.UP_FOR_RETRY):
            if self.callbacks != 1:
                return f"{self.state} with {self.callbacks} callbacks for its try (one expected)"
            return None
        if self.state is None:
            if self.callbacks:
                return f"reset by adoption, yet {self.callbacks} callback(s) for the reset try (orphan)"
            return None
        return f"unexpected state {self.state}"


@dataclass
class SchedulerKill:
    """What :func:`kill_scheduler_mid_purge` saw."""

    batch: int
    callbacks_at_kill: int
    at_kill: list[KilledTry]
    #: why the scheduler died before it could be killed (it crashed), if it did
    died_by_itself: str | None
    #: what kept the restarted scheduler from dealing with the dead one's tries, if anything
    restart_failed: str | None
    after_restart: list[KilledTry]
    #: seconds from the start to each step: the scheduler up, killed, the restarted one up, all dealt with
    timeline: dict[str, float]

    def problems(self) -> list[str]:
        found = [f"the scheduler {self.died_by_itself}"] if self.died_by_itself else []
        found += [f"at the kill, {t.task_id}: {p}" for t in self.at_kill if (p := t.problem(settled=False))]
        found += [f"the restarted scheduler {self.restart_failed}"] if self.restart_failed else []
        found += [f"{t.task_id}: {p}" for t in self.after_restart if (p := t.problem(settled=True))]
        return found

    def verdict(self, shown: int = 8) -> str:
        """The summary, then the first ``shown`` problems."""
        problems = self.problems()
        more = [f"(+{len(problems) - shown} more)"] if len(problems) > shown else []
        return "\n".join([self.summary(), *problems[:shown], *more])

    def summary(self) -> str:
        from collections import Counter

        ends = Counter(str(t.state) for t in self.after_restart)
        died = self.died_by_itself or f"killed with {self.callbacks_at_kill} of {self.batch} callbacks stored"
        steps = ", ".join(f"{step} {at:.1f}" for step, at in self.timeline.items())
        return (
            f"scheduler {died}; after the restart: {sum(t.callbacks for t in self.after_restart)} "
            f"callbacks, live states {dict(sorted(ends.items()))}; seconds: {steps}"
        )


def kill_scheduler_mid_purge(
    tis: list[Any], session: Session, *, home: Path, kill_at: int, fix_enabled: bool
) -> SchedulerKill:
    """
    ``airflow scheduler`` (LocalExecutor, the package activated through its entry point when
    ``fix_enabled``) is handed ``tis`` (one Dag run) as its hung tries; once ``kill_at`` of their
    callbacks are stored, and not all, its whole process group gets SIGKILL, as in a host crash. A
    second scheduler then starts and, once the dead one's heartbeat is stale, adopts or resets its
    RUNNING task instances. LocalExecutor adopts none, so each is reset: up to 3.3 its try goes to the
    history table and its state is cleared; 3.4 archives the try and adds the next one, with no state.
    Tries the dead scheduler failed are left alone. Nothing is mocked; the schedulers' output is in
    ``home/*.log``.
    """
    import uuid

    from airflow_heartbeat_fix.demo.processes import Processes

    dag_id, run_id, batch = tis[0].dag_id, tis[0].run_id, len(tis)
    procs = Processes(marker=f"hbfix-kill-{uuid.uuid4()}")
    started, timeline = time.monotonic(), dict[str, float]()
    try:
        first = start_scheduler(procs, "killed-scheduler", home, fix_enabled=fix_enabled)
        job_id = scheduler_job(procs, first, known=set())
        timeline["up"] = time.monotonic() - started
        check_activation(first, fix_enabled)
        make_stale_for_job(tis, job_id, session)
        died_by_itself = _kill_mid_purge(procs, first, kill_at, batch)
        _wait_for_other_backends()
        timeline["died"] = time.monotonic() - started
        at_kill = _killed_tries(dag_id, run_id)
        second = start_scheduler(
            procs, "restarted-scheduler", home, fix_enabled=fix_enabled, **RESTART_CONFIG
        )
        scheduler_job(procs, second, known={job_id})
        timeline["restarted"] = time.monotonic() - started
        restart_failed = _wait_until_dealt_with(procs, second, dag_id, run_id)
        procs.stop_all()
        timeline["done"] = time.monotonic() - started
        after_restart = _killed_tries(dag_id, run_id)
    finally:
        procs.stop_all()
    return SchedulerKill(
        batch=batch,
        callbacks_at_kill=sum(t.callbacks for t in at_kill),
        at_kill=at_kill,
        died_by_itself=died_by_itself,
        restart_failed=restart_failed,
        after_restart=after_restart,
        timeline=timeline,
    )


def start_scheduler(
    procs: Processes, name: str, home: Path, *, fix_enabled: bool, **config: str
) -> Component:
    """``airflow scheduler`` in ``home``, in a process group of its own, without this process's config."""
    import secrets

    from airflow import settings

    from airflow_heartbeat_fix.demo.processes import free_port
    from airflow_heartbeat_fix.demo.run import (
        airflow_env,
        airflow_executable,
        airflow_is_compiled,
        bytecode_env,
    )

    if settings.engine is None:
        raise RuntimeError("Airflow's metadata database is not configured in this process")
    for sub in ("dags", "tmp"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    env = airflow_env(
        dict(os.environ),
        home=home,
        database_url=settings.engine.url.render_as_string(hide_password=False),
        api_port=free_port(),
        fix_enabled=fix_enabled,
        heartbeat_timeout=int(STALE_FOR.total_seconds() / 2),
        detection_interval=PURGE_EVERY,
        jwt_secret=secrets.token_urlsafe(32),
    )
    env = bytecode_env(env, airflow_compiled=airflow_is_compiled(), cache_dir=home / "pycache")
    argv = [str(airflow_executable()), "scheduler", "--skip-serve-logs"]
    return procs.start(name, argv, {**env, **config}, home / f"{name}.log", home)


def scheduler_job(procs: Processes, scheduler: Component, *, known: set[int]) -> int:
    """The id of the job ``scheduler`` registers (the first SchedulerJob not in ``known``)."""
    from airflow.jobs.job import Job
    from airflow.utils.session import create_session

    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        with create_session(scoped=False) as reader:
            found = reader.scalars(
                select(Job.id).where(Job.job_type == "SchedulerJob", Job.id.not_in(known or {-1}))
            ).first()
        if found is not None:
            return int(found)
        if scheduler.exit_code() is not None:
            raise RuntimeError(f"{scheduler.name} exited before registering its job:\n{tail(scheduler)}")
        procs.track()
        time.sleep(0.2)
    raise TimeoutError(f"{scheduler.name} registered no job in {START_TIMEOUT:.0f}s:\n{tail(scheduler)}")


def check_activation(scheduler: Component, fix_enabled: bool) -> None:
    """The scheduler runs the fixes (or none of them) as asked; the log says so before the job exists."""
    from airflow_heartbeat_fix.demo.report import find_fix_summary

    fixes = find_fix_summary(scheduler.read_log())
    if any(state == "active" for state in fixes.values()) != fix_enabled:
        raise RuntimeError(f"{scheduler.name} with the fix {'on' if fix_enabled else 'off'} reports {fixes}")


def _kill_mid_purge(procs: Processes, scheduler: Component, kill_at: int, batch: int) -> str | None:
    """
    SIGKILL ``scheduler``'s process group once ``kill_at`` callbacks (fewer than ``batch``) are stored.
    Returns ``None`` once killed, or how it died if it died by itself first.
    """
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session
    from sqlalchemy import func

    from airflow_heartbeat_fix.demo.report import find_scheduler_crash

    deadline = time.monotonic() + PURGE_TIMEOUT
    for look in itertools.count():
        if time.monotonic() >= deadline:
            break
        with create_session(scoped=False) as reader:
            stored = int(reader.scalar(select(func.count()).select_from(DbCallbackRequest)) or 0)
        if kill_at <= stored < batch:
            scheduler.kill_group()
            return None
        if stored >= batch:
            raise RuntimeError(
                f"the purge stored all {batch} callbacks between two looks: too fast to kill mid-way"
            )
        if (code := scheduler.exit_code()) is not None:
            crash = find_scheduler_crash(scheduler.read_log()) or "no crash logged"
            return f"exited by itself (code {code}) with {stored} of {batch} callbacks stored: {crash}"
        # A crashed scheduler can take longer than the purge timeout to exit (its LocalExecutor waits
        # for running tasks), so its log is read too, twice a second.
        if look % 50 == 49 and (crash := find_scheduler_crash(scheduler.read_log())):
            return f"crashed (still shutting down) with {stored} of {batch} callbacks stored: {crash}"
        procs.track()
        time.sleep(POLL)
    raise TimeoutError(
        f"{scheduler.name} stored no {kill_at} callbacks in {PURGE_TIMEOUT:.0f}s:\n{tail(scheduler)}"
    )


def _wait_for_other_backends() -> None:
    """
    Until no other connection to this database is inside a statement or transaction: a killed client's
    backend finishes what it was running (a commit already sent still commits), then exits.
    """
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND state <> 'idle'"
    )
    with own_connection() as connection:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while connection.execute(query).scalar_one():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the killed scheduler's connections still busy after {SETTLE_TIMEOUT}s")
            time.sleep(POLL)


def _killed_tries(dag_id: str, run_id: str) -> list[KilledTry]:
    """Each task instance of the run: its live try's state, and the callbacks stored per try."""
    from collections import Counter

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session(scoped=False) as reader:
        live = reader.execute(
            select(TaskInstance.task_id, TaskInstance.state).where(
                TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id
            )
        ).all()
        requests = task_callback_requests(reader)
    states = dict(live)
    if len(states) != len(live):
        raise RuntimeError(f"more than one live try per task instance in {dag_id}/{run_id}")
    callbacks = Counter(
        (request.ti.task_id, request.ti.try_number)
        for request in requests
        if (request.ti.dag_id, request.ti.run_id) == (dag_id, run_id)
    )
    return [
        KilledTry(
            task_id=task_id,
            state=state,
            callbacks=callbacks[(task_id, KILLED_TRY)],
            stray_callbacks=sum(
                n for (task, tn), n in callbacks.items() if task == task_id and tn != KILLED_TRY
            ),
        )
        for task_id, state in sorted(states.items())
    ]


def _wait_until_dealt_with(procs: Processes, scheduler: Component, dag_id: str, run_id: str) -> str | None:
    """
    Until no try of the run is RUNNING any more, then two scan intervals more (for anything the
    restarted scheduler would still do to them). What went wrong instead, or ``None``.
    """
    from airflow.utils.state import TaskInstanceState

    deadline = time.monotonic() + RESTART_TIMEOUT
    running = (TaskInstanceState.RUNNING, TaskInstanceState.RESTARTING)
    while any(t.state in running for t in _killed_tries(dag_id, run_id)):
        if (code := scheduler.exit_code()) is not None:
            return f"exited (code {code}) before it dealt with the killed one's tries:\n{tail(scheduler)}"
        if time.monotonic() > deadline:
            return f"left tries running for {RESTART_TIMEOUT:.0f}s"
        procs.track()
        time.sleep(0.2)
    time.sleep(2 * PURGE_EVERY)
    if (code := scheduler.exit_code()) is not None:
        return f"exited (code {code}):\n{tail(scheduler)}"
    return None


def tail(component: Component, lines: int = 30) -> str:
    return "\n".join(component.read_log().splitlines()[-lines:])
