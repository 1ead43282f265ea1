"""
A ``create_session()`` nested in the scheduler loop's never ends the loop's transaction, and never makes the
scheduler wait on it.

In the scheduler's thread, ``create_session()`` (and so ``@provide_session`` called without a session)
returns the thread's scoped session: the session the loop is working in. In stock Airflow, leaving the
nested block commits (or rolls back) and closes it mid-batch: the loop's row locks are released, its task
instances and Dag runs are detached, and inside ``prohibit_commit`` the commit raises instead. Listener
plugins, cluster policies, ``Variable``/``Connection`` lookups, deadline alerts, 3.0's scheduler-sent
e-mail, an executor's adoption and the stock callback sink all do it.

**How a nested session is recognised.** Every ``create_session()`` is one function object (the
``contextlib.contextmanager`` helper of ``airflow.utils.session``: modules import it by name,
``provide_session`` calls it by name, a tracing wrapper calls it), which keeps Airflow's generator in a
closure cell. Activation puts :func:`create_session_in_loop` in that cell: Airflow's generator runs
unchanged, except in a thread inside a loop path (:func:`held_loop_session`) whose scoped session is
already in use by that path; such a ``create_session()`` is nested. :func:`create_session_reached` checks,
by calling it, that ``airflow.utils.session.create_session`` still gets there (something that replaces it
without calling Airflow's cannot be seen: status, the start line and the gauge then say so).

**What a nested block gets**: the loop's session itself (``isinstance(s, Session)`` and
``object_session(obj) is s`` hold, as in stock). Its work runs in a SAVEPOINT, begun at its first
database work (a block that only opens the session costs nothing), so a rollback or an error undoes only
its own work and expires none of the loop's objects; ``close()`` and ``expunge_all()`` detach only what
the block loaded or added (:class:`NestedBlock`). What its ``commit()`` means is decided at that first
database work, from what the loop's transaction holds
(:func:`~airflow_heartbeat_fix.loop_transaction.holds_nothing`):

* nothing (no pending change, no row written or locked): the block is its **own** transaction, as in
  stock: its commit commits for real, publishing its writes and releasing its locks; nothing of the
  loop's is at stake (``prohibit_commit`` lets that commit through: it breaks no lock);
* something: the block **joins** the loop's transaction: its commit releases the savepoint and its writes
  are published with the loop's next commit, under the loop's locks. A joined block that writes is
  logged once per caller and counted (``heartbeat_fix.nested_sessions.joined_writes``).

Listener hooks are the plug-ins that write; those the loop calls while its transaction holds something
run right after its next commit (:mod:`~airflow_heartbeat_fix.listener_delivery`, through
:func:`after_loop_commit`), when their sessions are their own again.

Other threads (an executor's, a plugin's pool) and code calling ``settings.Session()`` directly share
nothing of this: they get what they get in stock Airflow. A process forked from a loop path (the
LocalExecutor's workers) starts outside every loop path.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

from airflow import settings
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from sqlalchemy.orm import Session as SASession

from airflow_heartbeat_fix._compat import create_session_cell, sqlalchemy_utils_module
from airflow_heartbeat_fix.detection import NESTED_FIX_HOOKS
from airflow_heartbeat_fix.logs import fix_logger
from airflow_heartbeat_fix.nested_blocks import OWN_COMMIT, loop_thread, nested_block

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterator

    from sqlalchemy.orm import Session

log = fix_logger(__name__)


# -- create_session, recognised ---------------------------------------------------------------------

#: Airflow's own ``create_session`` generator, read from its cell when activation patches it.
_airflows_create_session: Callable[..., Generator[Any, None, None]] | None = None


def create_session_in_loop(*args: Any, **kwargs: Any) -> Generator[Any, None, None]:
    """
    What ``create_session``'s cell holds while the fix is active: Airflow's generator, except for a
    ``create_session()`` nested in a loop path's, which gets
    :func:`~airflow_heartbeat_fix.nested_blocks.nested_block`.
    """
    original = _airflows_create_session
    assert original is not None, "create_session_in_loop runs only while it is installed"
    if loop_thread.probing:
        loop_thread.reached = True
    scoped = kwargs.get("scoped", args[0] if args else True)
    if not loop_thread.held or not scoped:
        return (yield from original(*args, **kwargs))
    if loop_thread.sessions_in_use:
        return (yield from nested_block())
    # The loop path's own create_session(): it owns the transaction, with stock's semantics.
    loop_thread.sessions_in_use += 1
    try:
        return (yield from original(*args, **kwargs))
    finally:
        loop_thread.sessions_in_use -= 1


def create_session_reached() -> bool:
    """
    Whether ``airflow.utils.session.create_session`` as it is now (what ``provide_session`` calls) runs
    :func:`create_session_in_loop`: a wrapper that calls Airflow's ``create_session`` does, one that
    replaces it does not. Called in a thread of its own, whose scoped session is new and stays unused.
    """
    from airflow.utils import session as session_module

    cell = create_session_cell(installed=create_session_in_loop)
    if cell is None:
        return False
    reached: list[bool] = []

    def probe() -> None:
        loop_thread.probing = True
        try:
            with session_module.create_session():
                pass
            reached.append(loop_thread.reached)
        except Exception:
            log.debug("the create_session probe failed", exc_info=True)
        finally:
            if settings.Session is not None:
                settings.Session.remove()

    installed = cell.cell_contents is create_session_in_loop
    with contextlib.nullcontext() if installed else _installed_in(cell):
        thread = threading.Thread(target=probe, name="airflow-heartbeat-fix-probe", daemon=True)
        thread.start()
        thread.join(timeout=30)
    return reached == [True]


#: What :func:`in_force` found last time (``None``: not asked yet in this process).
_reached_last: bool | None = None


def in_force() -> bool:
    """
    Whether ``create_session`` still reaches the fix (:func:`create_session_reached`), asked when the
    scheduler loop starts and at every scheduler heartbeat; the log says so when the answer changes, and
    the fix's gauge follows it. A plugin or a tracing library may replace ``create_session`` after the
    start line was logged.
    """
    global _reached_last
    from airflow.utils import session as session_module

    reached = create_session_reached()
    if reached is not _reached_last:
        if not reached:
            replacement = session_module.create_session
            log.warning(
                "airflow-heartbeat-fix (nested_sessions_join_loop): airflow.utils.session.create_session is "
                "%s.%s, which does not call Airflow's: sessions nested in the scheduler loop are not "
                "recognised and the fix is not in force (its gauge "
                "heartbeat_fix.fix.nested_sessions_join_loop is 0)",
                getattr(replacement, "__module__", "?"),
                getattr(replacement, "__qualname__", repr(replacement)),
            )
        elif _reached_last is not None:
            log.info(
                "airflow-heartbeat-fix (nested_sessions_join_loop): create_session reaches the fix again"
            )
    _reached_last = reached
    return reached


@contextlib.contextmanager
def _installed_in(cell: Any) -> Iterator[None]:
    """:func:`create_session_in_loop` in ``cell`` for the block (activation installs it for good)."""
    global _airflows_create_session
    original, previous = cell.cell_contents, _airflows_create_session
    _airflows_create_session, cell.cell_contents = original, create_session_in_loop
    try:
        yield
    finally:
        cell.cell_contents, _airflows_create_session = original, previous


def airflows_create_session() -> Any:
    """Airflow's own ``create_session`` generator (in its cell, or saved from it while ours is there)."""
    cell = create_session_cell(installed=create_session_in_loop)
    if cell is None:
        return None
    return _airflows_create_session if cell.cell_contents is create_session_in_loop else cell.cell_contents


def patches() -> list[tuple[Any, str, Any]]:
    """
    What activation installs for this fix, as ``(target, attribute, value)``: ``create_session``'s cell
    and ``prohibit_commit``'s guard. Each gated per call: outside loop paths Airflow's own runs.
    """
    global _airflows_create_session
    cell = create_session_cell(installed=create_session_in_loop)
    if cell is None:
        raise RuntimeError(
            "airflow.utils.session.create_session is not a context manager over Airflow's generator"
        )
    if cell.cell_contents is not create_session_in_loop:
        _airflows_create_session = cell.cell_contents
    return [
        (cell, "cell_contents", create_session_in_loop),
        (sqlalchemy_utils_module(), "CommitProhibitorGuard", LoopCommitGuard),
    ]


class LoopCommitGuard(sqlalchemy_utils_module().CommitProhibitorGuard):  # type: ignore[misc]
    """
    ``prohibit_commit``'s guard, letting through what breaks no lock: a SAVEPOINT's release (SQLAlchemy
    fires ``before_commit`` for it too; 3.4's guard already lets it through) and a nested block's own commit
    (it began when the loop's transaction held nothing).
    """

    def _validate_commit(self, session: Any, *args: Any) -> None:
        if session.in_nested_transaction() or session.info.get(OWN_COMMIT):
            return
        super()._validate_commit(session, *args)


# -- The loop paths ---------------------------------------------------------------------------------


def _is_thread_scoped(session: Session) -> bool:
    registry = getattr(settings.Session, "registry", None)
    return registry is not None and registry.has() and registry() is session


@contextlib.contextmanager
def held_loop_session(session: Session | None = None) -> Iterator[None]:
    """
    While the block runs, this thread is in a loop path: a ``create_session()`` nested in one the path
    works in is a nested block. ``session``: the session the path was handed; if it is the thread's
    scoped session, the path works in it. Re-entrant.
    """
    in_use = session is not None and _is_thread_scoped(session)
    loop_thread.held += 1
    loop_thread.sessions_in_use += in_use
    try:
        yield
    finally:
        loop_thread.held -= 1
        loop_thread.sessions_in_use -= in_use


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
    Mark every path of the scheduler loop, so that ``create_session()`` calls nested in it are recognised.

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
