"""
A ``create_session()`` nested in a scheduler loop path's: what it gets, and what its commit means.

:func:`~airflow_heartbeat_fix.nested_sessions.create_session_in_loop` hands such a block to
:func:`nested_block`: the loop's session itself, its work in a SAVEPOINT begun at its first database work,
and a :class:`Mode` decided then from what the loop's transaction holds
(:func:`~airflow_heartbeat_fix.loop_transaction.holds_nothing`):
its **own** transaction (its commit commits for real) or **joined** to the loop's (its commit releases its
savepoint). While blocks are open, or work waits for the loop's commit (:func:`after_loop_commit`), the
session's ``commit``, ``rollback``, ``close`` and ``expunge_all`` and a few of its events go through
here (:func:`_sync_hooks`); outside, the session is Airflow's, untouched.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import os
import sys
import threading
from typing import TYPE_CHECKING, Any
from unittest import mock

from sqlalchemy import event
from sqlalchemy.orm.attributes import instance_state

from airflow_heartbeat_fix._compat import Stats, scoped_session
from airflow_heartbeat_fix.logs import fix_logger
from airflow_heartbeat_fix.loop_transaction import holds_nothing

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterable, Iterator
    from types import FrameType

    from sqlalchemy.orm import InstanceState, ORMExecuteState, Session, SessionTransaction

log = fix_logger(__name__)


class Mode(enum.Enum):
    """What a nested block's ``commit()`` means, decided at its first database work."""

    #: The loop's transaction held nothing: the block's commit commits for real, as in stock.
    OWN = "own"
    #: The loop's transaction held row locks or uncommitted work: the block's commit releases its savepoint.
    JOINED = "joined"


class _LoopThread(threading.local):
    """This thread's loop paths, the nested blocks open in them, and what waits for the loop's commit."""

    def __init__(self) -> None:
        #: Loop paths running in this thread (re-entrant: ``_do_scheduling`` runs inside the loop).
        self.held = 0
        #: How many of them work in the thread's scoped session: the loop path's own ``create_session()``
        #: blocks and the scoped sessions loop paths were handed. A ``create_session()`` is nested iff > 0.
        self.sessions_in_use = 0
        self.blocks: list[NestedBlock] = []
        #: Nested blocks opened in this thread so far (who acted can tell whether one opened meanwhile).
        self.opened = 0
        #: Work to run right after the loop's transaction commits (dropped if it rolls back).
        self.after_commit: list[_AfterCommit] = []
        self.running_after_commit = False
        #: The session patches and events in force while blocks are open or work waits for a commit.
        self.hooks: contextlib.ExitStack | None = None
        #: :func:`create_session_reached`'s probe: set in its own thread, counted by the generator.
        self.probing = False
        self.reached = False


loop_thread = _LoopThread()


def _forget_in_child() -> None:
    """A process forked from a loop path is not the scheduler loop (the patched methods stay, gated off)."""
    loop_thread.__init__()  # type: ignore[misc]


os.register_at_fork(after_in_child=_forget_in_child)


# -- A nested block ---------------------------------------------------------------------------------


class NestedBlock:
    """
    One ``create_session()`` nested in the loop's: its savepoint, its mode and what it loaded or added.

    The savepoint is begun before the block's first database work and again after each of its commits and
    rollbacks (SQLAlchemy emits ``SAVEPOINT`` only when it is used). ``close()`` and ``expunge_all()``
    detach what the block loaded or added, except what it loaded for the loop's objects (a lazy load of
    ``ti.dag_run``: that object is the loop's now); what an inner block leaves attached is its parent's to
    decide.
    """

    def __init__(self, session: Session, parent: NestedBlock | None) -> None:
        self.session = session
        self.parent = parent
        self.mode: Mode | None = parent.mode if parent is not None else None
        self.savepoint: SessionTransaction | None = None
        self.wrote = False
        #: States that entered the session during the block (loaded, added, re-attached).
        self.entered: list[InstanceState[Any]] = []
        #: States whose relationships the block lazily loaded.
        self.lazy_parents: list[InstanceState[Any]] = []

    def before_work(self) -> None:
        """Decide the mode (at the first work) and begin the savepoint, if none is open."""
        if self._savepoint_in_chain() is not None:
            return
        if self.mode is None:
            self.mode = Mode.OWN if holds_nothing(self.session) else Mode.JOINED
        # Flushes first: pending work (the loop's, when it joins) is written before the savepoint.
        self.savepoint = self.session.begin_nested()

    def _savepoint_in_chain(self) -> SessionTransaction | None:
        """
        This block's savepoint if it is still in the session's chain of transactions, active or not (a
        failed flush deactivates it; an inner block's own commit ends it).
        """
        current = self.session.get_nested_transaction()
        while current is not None and current is not self.savepoint:
            current = current.parent
        return current

    def commit(self) -> None:
        if (savepoint := self._savepoint_in_chain()) is not None:
            savepoint.commit()  # after a failed flush it raises, as the session's own commit would
        self.savepoint = None
        for waiting in loop_thread.after_commit:  # what it announced is now the enclosing transaction's
            if waiting.block is self:
                waiting.block = self.parent
        if self.mode is Mode.OWN:
            _commit_transaction(self.session)
            _run_after_commit()
        elif self.mode is Mode.JOINED and self.wrote:
            _joined_write_noted()
            self.wrote = False

    def rollback(self) -> None:
        savepoint, self.savepoint = self._savepoint_in_chain(), None
        if savepoint is not None:
            savepoint.rollback()
        _drop_after_commit(lambda waiting: waiting.block is self)

    def close(self) -> None:
        """What the block did not commit is rolled back; what it loaded or added is detached."""
        self.rollback()
        self.expunge_all()

    def expunge_all(self) -> None:
        """Detach what the block loaded or added; the loop's objects stay."""
        for state in self._own_states():
            if (obj := state.obj()) is not None and obj in self.session:
                self.session.expunge(obj)
        self.entered.clear()
        self.lazy_parents.clear()

    def _own_states(self) -> list[InstanceState[Any]]:
        entered = set(self.entered)
        loops = _reachable({parent for parent in self.lazy_parents if parent not in entered}, within=entered)
        return [state for state in entered if state not in loops]

    def hand_to_parent(self) -> None:
        """At the block's end: what it left attached is its parent's to decide."""
        if self.parent is not None:
            self.parent.entered.extend(self.entered)
            self.parent.lazy_parents.extend(self.lazy_parents)


def _reachable(roots: set[InstanceState[Any]], *, within: set[InstanceState[Any]]) -> set[InstanceState[Any]]:
    """The states of ``within`` reachable from ``roots`` through relationships already loaded."""
    found: set[InstanceState[Any]] = set()
    frontier = list(roots)
    while frontier:
        state = frontier.pop()
        for related in _loaded_related(state):
            if related in within and related not in found:
                found.add(related)
                frontier.append(related)
    return found


def _loaded_related(state: InstanceState[Any]) -> Iterator[InstanceState[Any]]:
    for relationship in state.mapper.relationships:
        value = state.dict.get(relationship.key)
        if value is None:
            continue
        items: Iterable[Any] = value.values() if isinstance(value, dict) else value
        if not isinstance(value, (list, set, dict, tuple)):
            items = (value,)
        for item in items:
            yield instance_state(item)


#: ``session.info`` key: the commit under way is a nested block's own (``prohibit_commit`` lets it through).
OWN_COMMIT = "airflow_heartbeat_fix.own_commit"


def _commit_transaction(session: Session) -> None:
    """Commit the session's outermost transaction (the block's savepoints too), as stock's commit does."""
    session.info[OWN_COMMIT] = True
    try:
        transaction = session.get_transaction()
        if transaction is not None:
            transaction.commit()
    finally:
        session.info.pop(OWN_COMMIT, None)


#: Callers whose joined writes were logged already (each once per process).
_JOINED_WRITERS: set[str] = set()
#: Frames that are not the caller of a nested session: the machinery between it and the plug-in.
_NOT_THE_CALLER = ("sqlalchemy", "contextlib", "pluggy", "airflow_heartbeat_fix")


def _joined_write_noted() -> None:
    Stats.incr("heartbeat_fix.nested_sessions.joined_writes")
    caller = _caller()
    if caller in _JOINED_WRITERS:
        return
    _JOINED_WRITERS.add(caller)
    log.warning(
        "airflow-heartbeat-fix (nested_sessions_join_loop): %s committed writes in a session nested in the "
        "scheduler loop while the loop held row locks or uncommitted work; they are published with the "
        "loop's next commit, in this scheduler pass, not at once (stock Airflow would have committed the "
        "loop's work with them). Logged once per caller.",
        caller,
    )


def _caller() -> str:
    """
    The innermost plug-in frame that holds the ``with`` statement (not Airflow's core, SQLAlchemy, this
    package, nor a context manager's generator such as a tracing wrapper of ``create_session``); else
    the innermost of Airflow's.
    """
    frame: FrameType | None = sys._getframe(1)
    innermost_airflow = None
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        where = f"{module}.{frame.f_code.co_name}"
        core = module.startswith("airflow.") and not module.startswith("airflow.providers.")
        if core and innermost_airflow is None:
            innermost_airflow = where
        elif (
            not core
            and not frame.f_code.co_flags & inspect.CO_GENERATOR
            and module.split(".", 1)[0] not in _NOT_THE_CALLER
        ):
            return where
        frame = frame.f_back
    return innermost_airflow or "a nested session"


# -- Work that waits for the loop's commit ---------------------------------------------------------


def in_loop_path() -> bool:
    """Whether this thread is inside a path of the scheduler loop."""
    return loop_thread.held > 0


class _AfterCommit:
    """A call to make right after the loop's transaction commits, and the nested block it was made in."""

    def __init__(self, call: Callable[[], None], block: NestedBlock | None) -> None:
        self.call, self.block = call, block


def loop_transaction_at_stake() -> bool:
    """
    Whether this thread is in a loop path whose transaction holds something that a commit made now
    would publish or unlock: a joined nested block is open, or (outside nested blocks) the loop's own
    transaction holds row locks or uncommitted work.
    """
    if not (loop_thread.held and loop_thread.sessions_in_use):
        return False
    if loop_thread.blocks:
        block = loop_thread.blocks[-1]
        if block.mode is None:
            return not holds_nothing(block.session)
        return block.mode is Mode.JOINED
    return not holds_nothing(scoped_session())


def after_loop_commit(call: Callable[[], None]) -> None:
    """Run ``call`` right after the loop's transaction next commits; drop it if it rolls back."""
    block = loop_thread.blocks[-1] if loop_thread.blocks else None
    loop_thread.after_commit.append(_AfterCommit(call, block))
    _sync_hooks(block.session if block is not None else scoped_session())


def _run_after_commit() -> None:
    """Run what waits, in order; a commit made by one of them (an own nested block) does not re-enter."""
    if loop_thread.running_after_commit:
        return
    loop_thread.running_after_commit = True
    try:
        while loop_thread.after_commit:
            loop_thread.after_commit.pop(0).call()
    finally:
        loop_thread.running_after_commit = False
        _sync_hooks(None)


def _drop_after_commit(dropped: Callable[[_AfterCommit], bool]) -> None:
    kept = [waiting for waiting in loop_thread.after_commit if not dropped(waiting)]
    if lost := len(loop_thread.after_commit) - len(kept):
        Stats.incr("heartbeat_fix.nested_sessions.dropped_after_rollback", lost)
        log.info(
            "airflow-heartbeat-fix: %d listener call(s) not delivered: the scheduler loop rolled back the "
            "change they announce",
            lost,
        )
    loop_thread.after_commit[:] = kept
    _sync_hooks(None)


# -- The session's methods and events while blocks are open or work waits ----------------------------


def _innermost() -> NestedBlock | None:
    return loop_thread.blocks[-1] if loop_thread.blocks else None


def _commit(original: Callable[[], None]) -> None:
    if block := _innermost():
        block.commit()
        return
    original()
    _run_after_commit()


def _rollback(original: Callable[[], None]) -> None:
    if block := _innermost():
        block.rollback()
        return
    original()
    _drop_after_commit(lambda waiting: True)


def _close(original: Callable[[], None]) -> None:
    if block := _innermost():
        block.close()
        return
    original()
    _drop_after_commit(lambda waiting: True)


def _expunge_all(original: Callable[[], None]) -> None:
    if block := _innermost():
        block.expunge_all()
        return
    original()


_METHODS: dict[str, Callable[[Callable[[], None]], None]] = {
    "commit": _commit,
    "rollback": _rollback,
    "close": _close,
    "expunge_all": _expunge_all,
}


def _on_execute(orm_execute_state: ORMExecuteState) -> None:
    if (block := _innermost()) is None:
        return
    block.before_work()
    if not orm_execute_state.is_select:
        block.wrote = True
    elif (parent := orm_execute_state.lazy_loaded_from) is not None:
        block.lazy_parents.append(parent)


def _on_attach(session: Session, instance: object) -> None:
    if (block := _innermost()) is not None:
        block.before_work()


def _on_enter(session: Session, instance: object) -> None:
    if (block := _innermost()) is not None:
        block.entered.append(instance_state(instance))


def _on_flush(session: Session, flush_context: object) -> None:
    if (block := _innermost()) is not None and block.savepoint is not None:
        block.wrote = True


_EVENTS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("do_orm_execute", _on_execute),
    ("before_attach", _on_attach),
    ("loaded_as_persistent", _on_enter),
    ("transient_to_pending", _on_enter),
    ("detached_to_persistent", _on_enter),
    ("after_flush", _on_flush),
)


def _sync_hooks(session: Session | None) -> None:
    """Put the patches and events on ``session`` while they are needed; take them off once they are not."""
    needed = bool(loop_thread.blocks or loop_thread.after_commit)
    if needed and loop_thread.hooks is None and session is not None:
        hooks = contextlib.ExitStack()
        for name, meaning in _METHODS.items():
            hooks.enter_context(
                mock.patch.object(session, name, functools.partial(meaning, getattr(session, name)))
            )
        for name, listener in _EVENTS:
            event.listen(session, name, listener)
            hooks.callback(event.remove, session, name, listener)
        loop_thread.hooks = hooks
    elif not needed and loop_thread.hooks is not None:
        hooks, loop_thread.hooks = loop_thread.hooks, None
        hooks.close()


def nested_block() -> Generator[Session, None, None]:
    session = scoped_session()
    block = NestedBlock(session, _innermost())
    loop_thread.blocks.append(block)
    loop_thread.opened += 1
    _sync_hooks(session)
    Stats.incr("heartbeat_fix.nested_sessions.opened")
    try:
        yield session
        block.commit()
    except Exception:
        block.rollback()
        raise
    finally:
        try:
            block.close()
        finally:
            block.hand_to_parent()
            loop_thread.blocks.pop()
            _sync_hooks(None)
