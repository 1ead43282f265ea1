"""
A scheduler runner wired as ``airflow scheduler`` wires it, task instances as hung workers leave them,
one heartbeat-timeout pass, the purge's callbacks intercepted, and the statements a pass sends counted.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from unittest import mock

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sqlalchemy.orm import Session

#: How long ago a hung worker last heartbeated: far past any heartbeat timeout the tests configure.
STALE_FOR = timedelta(hours=1)


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


def default_executor(runner: Any) -> Any:
    """The executor the runner sends callbacks through (on the runner from 3.2 on, on its job before)."""
    from airflow_heartbeat_fix._compat import default_executor

    return default_executor(runner)


def make_stale(tis: list[Any], runner: Any, session: Session) -> list[Any]:
    """
    Leave ``tis`` as hung workers do: RUNNING try 1, queued by ``runner``, heartbeat long gone. Returns
    their ids in the order the purge handles them (callers work on ids: a failed pass detaches every
    ORM object of the scheduler's session).
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


def task_callback_requests(session: Session) -> list[Any]:
    """Every stored ``TaskCallbackRequest`` (the sink stores Dag callbacks and email requests too)."""
    from airflow.models.db_callback_request import DbCallbackRequest
    from sqlalchemy import select

    requests = (row.get_callback_request() for row in session.scalars(select(DbCallbackRequest)))
    return [request for request in requests if type(request).__name__ == "TaskCallbackRequest"]


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
    send_callback = executor.send_callback

    def hooked(request: Any) -> None:
        is_task_callback = type(request).__name__ == "TaskCallbackRequest"
        if is_task_callback and not after_sending:
            action(request)
        send_callback(request)
        if is_task_callback and after_sending:
            action(request)

    # An instance attribute, restored (or removed) afterwards: the package's own interception of
    # send_callback works the same way, and the two nest.
    with mock.patch.object(executor, "send_callback", hooked):
        yield


def on_callback_for(
    executor: Any, ti_id: Any, action: Callable[[], None], *, after_sending: bool = False
) -> Any:
    """:func:`on_task_callbacks` for one task instance."""
    return on_task_callbacks(
        executor,
        lambda request: action() if str(request.ti.id) == str(ti_id) else None,
        after_sending=after_sending,
    )


# -- What a pass sends to the database: the one way the tests and the benchmarks count it -------------

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
        from sqlalchemy import event

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


def measured_pass(runner: Any) -> StatementCounter:
    """One pass with nothing racing it, counting the statements and commits the scheduler thread sends."""
    with StatementCounter(thread=threading.get_ident()).counting() as counter:
        error = purge_pass(runner)
    if error is not None:
        raise error
    return counter
