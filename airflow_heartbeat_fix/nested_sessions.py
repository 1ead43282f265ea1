"""
A ``create_session()`` nested in the scheduler loop's own joins the loop's transaction instead of ending it.

In the scheduler's thread, ``create_session()`` (and so ``@provide_session`` called without a session)
returns the thread's scoped session, which is the session the loop is working in. Leaving the nested
block commits (or rolls back) and closes it: the loop's row locks are released, its task instances and
Dag runs are detached, and inside ``_do_scheduling``'s ``prohibit_commit`` the commit raises instead.
Listener plugins, cluster policies, ``Variable``/``Connection`` lookups (whose metastore backend even
``expunge_all()``-s the session up to 3.1), deadline alerts, 3.0's scheduler-sent e-mail, an executor's
adoption and the stock callback sink all do it.

The mechanism, while :func:`held_loop_session` is active in a thread:

* the outermost ``create_session()`` of the thread (or the session a loop path was handed) *owns* the
  transaction, as in stock Airflow: its commits, rollbacks and close are its own;
* a ``create_session()`` entered while the owner's is open gets a :class:`NestedSession`: the owner's
  session, whose ``commit`` releases a SAVEPOINT, ``rollback`` rolls back to it, and ``close`` and
  ``expunge_all`` detach only what the nested block loaded. Its writes commit or roll back with the
  loop's transaction, its errors (PostgreSQL's aborted transaction included) undo only its own work;
* ``prohibit_commit`` lets a SAVEPOINT release through (3.4's guard already does; older ones get the
  check as a subclass).

Code that calls ``settings.Session()`` directly (not through ``create_session``) shares the session
and never ends it, in stock Airflow as here: it gets the session itself.

A savepoint needs a database that has them (SQLite, PostgreSQL and MySQL do). On SQLite, pysqlite begins
a transaction at the first write only, so a nested block that writes before the loop has written
anything commits its own writes when its savepoint is released; the loop's transaction is unaffected.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING, Any
from unittest import mock

from airflow import settings
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from airflow.utils import sqlalchemy as airflow_sqlalchemy
from sqlalchemy.orm import Session as SASession

from airflow_heartbeat_fix._compat import create_session_code
from airflow_heartbeat_fix.detection import NESTED_FIX_HOOKS, guard_tolerates_savepoints

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sqlalchemy.orm import Session, SessionTransaction

#: Session attributes a nested block may read without starting its savepoint (no database work).
_READ_WITHOUT_SAVEPOINT = frozenset(
    {
        "bind",
        "get_bind",
        "info",
        "is_active",
        "in_transaction",
        "in_nested_transaction",
        "identity_map",
        "new",
        "dirty",
        "deleted",
        "no_autoflush",
        "autoflush",
        "hash_key",
    }
)


class NestedSession:
    """
    What a ``create_session()`` nested in the loop's gets: the loop's session, inside a SAVEPOINT of its own.

    The savepoint begins at the block's first database work (a block that only opens the session costs
    nothing) and ends at its ``commit`` (released) or ``rollback`` (rolled back); work after a commit
    begins another. ``close`` and ``expunge_all`` detach the objects the block loaded or added, never the
    loop's. Everything else is the loop's session's own.
    """

    def __init__(self, session: Session) -> None:
        self._session = session
        self._savepoint: SessionTransaction | None = None
        #: Identity keys in the session when the block first touched it: the loop's objects.
        self._loops_objects: frozenset[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        if name not in _READ_WITHOUT_SAVEPOINT:
            self._begin()
        return getattr(self._session, name)

    def __contains__(self, instance: object) -> bool:
        return instance in self._session

    def __iter__(self) -> Iterator[Any]:
        return iter(self._session)

    def __enter__(self) -> NestedSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<NestedSession of {self._session!r}>"

    def _open(self) -> SessionTransaction | None:
        """This block's savepoint if it is still in the session's chain of transactions (active or not)."""
        current = self._session.get_nested_transaction()
        while current is not None and current is not self._savepoint:
            current = current.parent
        return current

    def _begin(self) -> None:
        if self._savepoint is not None and self._savepoint.is_active:
            return
        # begin_nested() flushes first: what the loop left pending is written before the savepoint.
        self._savepoint = self._session.begin_nested()
        if self._loops_objects is None:
            self._loops_objects = frozenset(self._session.identity_map.keys())

    def commit(self) -> None:
        """Release the savepoint (flushing the block's work into the loop's transaction)."""
        if (savepoint := self._open()) is not None:
            savepoint.commit()  # after a failed flush it raises, as the session's own commit would
        self._savepoint = None

    def rollback(self) -> None:
        """Roll back to the savepoint (also after a failed flush deactivated it): the block's work only."""
        savepoint, self._savepoint = self._open(), None
        if savepoint is not None:
            savepoint.rollback()

    def expunge_all(self) -> None:
        """Detach what the block loaded or added; the loop's objects stay."""
        loops = self._loops_objects
        if loops is None:  # the block has not touched the session: nothing in it is the block's
            return
        own = [obj for key, obj in list(self._session.identity_map.items()) if key not in loops]  # type: ignore[attr-defined]
        for obj in [*own, *self._session.new]:
            self._session.expunge(obj)

    def close(self) -> None:
        """End the block: what it did not commit is rolled back, what it loaded is detached."""
        self.rollback()
        self.expunge_all()
        self._loops_objects = None


class SavepointTolerantGuard(airflow_sqlalchemy.CommitProhibitorGuard):
    """
    ``prohibit_commit``'s guard, letting a SAVEPOINT release through.

    SQLAlchemy fires ``before_commit`` for a savepoint's release too; a release ends neither the
    transaction nor its row locks. Backports 3.4's check to the guards that raise on it (up to 3.3).
    Installed only while a loop holds its session, where detection found the guard without it.
    """

    def _validate_commit(self, session: Any, *args: Any) -> None:
        if session.in_nested_transaction():
            return
        super()._validate_commit(session, *args)


class _Holder(threading.local):
    """This thread's state: how many held loop paths are running, and whose transaction it is."""

    depth = 0
    owner: Session | None = None
    #: the patch that ends an owner's claim when ``create_session`` closes its session
    owner_close: Any = None

    def hand_out(self, session: Session) -> Any:
        """What a ``create_session()`` gets while a loop path runs in this thread."""
        if self.owner is None:
            self.own_until_closed(session)
            return session
        if session is self.owner:
            return NestedSession(session)
        return session

    def own_until_closed(self, session: Session) -> None:
        close = session.close

        def owner_closes() -> None:
            self.release()
            close()

        self.owner = session
        self.owner_close = mock.patch.object(session, "close", owner_closes)
        self.owner_close.start()

    def release(self) -> None:
        if self.owner_close is not None:
            self.owner_close.stop()
        self.owner, self.owner_close = None, None


_holder = _Holder()


class _LoopScopedSession:
    """``settings.Session`` while a loop path runs: hands ``create_session()`` the owner or a nested one."""

    def __init__(self, scoped: Any, create_session_code: Any) -> None:
        self.scoped = scoped
        self._create_session_code = create_session_code

    def __call__(self, **kwargs: Any) -> Any:
        session = self.scoped(**kwargs)
        if _holder.depth and not kwargs and sys._getframe(1).f_code is self._create_session_code:
            return _holder.hand_out(session)
        return session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scoped, name)


class _InProcess:
    """The process-wide swaps, made while any thread holds a loop path and undone with the last one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads = 0
        self._swapped: list[tuple[Any, str, Any, Any]] = []

    def enter(self) -> None:
        with self._lock:
            self._threads += 1
            if self._threads == 1:
                self._swap(settings, "Session", _LoopScopedSession(settings.Session, create_session_code()))
                if not guard_tolerates_savepoints(airflow_sqlalchemy.CommitProhibitorGuard):
                    self._swap(airflow_sqlalchemy, "CommitProhibitorGuard", SavepointTolerantGuard)

    def leave(self) -> None:
        with self._lock:
            self._threads -= 1
            if self._threads == 0:
                self._restore()

    def _swap(self, module: Any, name: str, ours: Any) -> None:
        self._swapped.append((module, name, getattr(module, name), ours))
        setattr(module, name, ours)

    def forget_in_child(self) -> None:
        """In a forked process: undo the swaps at once (no other thread of the parent runs here)."""
        self._lock = threading.Lock()
        self._threads = 0
        self._restore()

    def _restore(self) -> None:
        for module, name, original, ours in reversed(self._swapped):
            # Airflow may have replaced it meanwhile (configure_orm): leave its own in place.
            if getattr(module, name) is ours:
                setattr(module, name, original)
        self._swapped.clear()


_in_process = _InProcess()


def _forget_in_child() -> None:
    """
    A process forked while a loop path runs (the LocalExecutor spawns workers from its heartbeat) is not
    the scheduler loop: it starts with Airflow's own ``settings.Session`` and no hold.
    """
    _holder.depth, _holder.owner, _holder.owner_close = 0, None, None
    _in_process.forget_in_child()


os.register_at_fork(after_in_child=_forget_in_child)


def _is_thread_scoped(session: Session) -> bool:
    registry = getattr(settings.Session, "registry", None)
    return registry is not None and registry.has() and registry() is session


@contextlib.contextmanager
def held_loop_session(session: Session | None = None) -> Iterator[None]:
    """
    While the block runs in this thread, a nested ``create_session()`` joins the owner's transaction.

    ``session``: the session a loop path was handed; if it is the thread's scoped session and nothing
    owns the thread's transaction yet, it owns it for the block. Re-entrant: a path inside another
    (``_do_scheduling`` inside ``_run_scheduler_loop``) changes nothing.
    """
    if _holder.depth == 0:
        _in_process.enter()
    _holder.depth += 1
    claimed = session is not None and _holder.owner is None and _is_thread_scoped(session)
    if claimed:
        _holder.owner = session
    try:
        yield
    finally:
        if claimed and _holder.owner is session:
            _holder.owner = None
        _holder.depth -= 1
        if _holder.depth == 0:
            _holder.release()
            _in_process.leave()


def _session_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Session | None:
    session = kwargs.get("session")
    if session is None:
        session = next((arg for arg in args if isinstance(arg, SASession)), None)
    return session


def _held(name: str) -> Callable[..., Any]:
    def held_path(self: Any, *args: Any, **kwargs: Any) -> Any:
        with held_loop_session(_session_in(args, kwargs)):
            return getattr(super(NestedSessionsJoinLoopMixin, self), name)(*args, **kwargs)

    held_path.__name__ = held_path.__qualname__ = name
    return held_path


class NestedSessionsJoinLoopMixin(SchedulerJobRunner):
    """
    Hold the loop's session against nested ``create_session()`` calls on every path of the loop.

    Beyond every release: no Airflow 3 release makes ``create_session`` join an enclosing one. Upstream
    fixes call sites one at a time (apache/airflow#71968 lets ``Variable.get`` take a session, for 3.4;
    #73291, open, for Dag-run listeners; #72138, open, moves the Kafka event producer's lookup to a
    thread) and #39646 (Dag-run listeners cannot read Connections or Variables) is open since 2024.
    Delete once ``create_session`` itself joins the transaction of an enclosing one in the same thread
    (detection then reports ``nested_sessions_join_loop`` "not needed").

    Each path of :data:`~airflow_heartbeat_fix.detection.NESTED_FIX_HOOKS` runs inside
    :func:`held_loop_session` with the session it was handed, if any: ``_run_scheduler_loop`` holds
    everything the loop runs (the deadlines and the timers too), the others hold a path called on its
    own. Each override is ``super()`` inside the hold.
    """


for _name in NESTED_FIX_HOOKS:
    setattr(NestedSessionsJoinLoopMixin, _name, _held(_name))
