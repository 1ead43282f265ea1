"""
The nested-session contract, case by case, on the real metadata database.

The scheduler paths it fixes are tested in ``tests/unit/jobs/test_heartbeat_fix_nested_sessions.py``; these
hold a session the way a loop path holds it (``held_loop_session`` around the path's own
``create_session()``) and run in it what nested code does: a ``create_session()`` that writes, fails,
expunges, lazy-loads or closes, while the loop's transaction holds something or nothing, under
``prohibit_commit`` or not, in this thread or in another, through a wrapper of ``create_session``. Each
would fail without the fix (the nested ``create_session()`` commits, rolls back and closes the loop's
session), so they run where activation installed it: the fixed cells.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import TYPE_CHECKING, Any
from unittest import mock

import pytest
from airflow import settings
from airflow.models.log import Log
from airflow.models.variable import Variable
from airflow.utils import session as session_module
from airflow.utils.session import create_session
from airflow.utils.sqlalchemy import prohibit_commit
from sqlalchemy import delete, inspect, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, object_session

from airflow_heartbeat_fix import nested_blocks
from airflow_heartbeat_fix.nested_sessions import create_session_reached
from tests.unit.jobs.test_scheduler_job import _clean_db, _empty_operator

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.db_test, pytest.mark.mode_independent]

EVENT = "heartbeat-fix-nested-contract"


def _stored() -> list[str | None]:
    """The ``extra`` of this module's committed rows, read in a session of its own."""
    with create_session(scoped=False) as reader:
        return list(reader.scalars(select(Log.extra).where(Log.event == EVENT).order_by(Log.id)))


@pytest.fixture(autouse=True)
def no_rows_before_or_after() -> Iterator[None]:
    def clear() -> None:
        with create_session(scoped=False) as cleaner:
            cleaner.execute(delete(Log).where(Log.event == EVENT))
            stored = delete(Variable).where(Variable.key.like(f"{EVENT}%"))
            cleaner.execute(stored.execution_options(synchronize_session=False))

    clear()
    yield
    clear()


def _writes_and_flushes(session: Session, extra: str) -> Log:
    row = Log(event=EVENT, extra=extra)
    session.add(row)
    session.flush()
    return row


# -- Joined: the loop's transaction holds something --------------------------------------------------


def test_nested_commit_joins_a_transaction_that_holds_writes(loop: Session) -> None:
    _writes_and_flushes(loop, "loop")
    with create_session() as nested:
        nested.add(Log(event=EVENT, extra="nested"))

    assert loop.in_transaction(), "the nested block ended the loop's transaction"
    assert _stored() == [], "the nested commit committed the loop's transaction"
    loop.commit()
    assert _stored() == ["loop", "nested"]


def test_nested_rollback_undoes_only_its_own_work(loop: Session) -> None:
    """A database error in the nested block (PostgreSQL aborts the transaction): undone to its savepoint."""
    _writes_and_flushes(loop, "before")
    with pytest.raises(IntegrityError), create_session() as nested:
        nested.add(Log(event=EVENT, extra="nested"))
        nested.add(Variable(key=f"{EVENT}-twice", val="1"))
        nested.flush()
        nested.add(Variable(key=f"{EVENT}-twice", val="2"))
        nested.flush()

    loop.add(Log(event=EVENT, extra="after"))
    loop.commit()
    assert _stored() == ["before", "after"]


def test_a_joined_write_is_logged_once_per_caller_and_counted(loop: Session, cap_structlog) -> None:
    """The one case where a nested commit cannot publish at once: named in the log, once, and counted."""
    nested_blocks._JOINED_WRITERS.clear()
    _writes_and_flushes(loop, "loop")
    with mock.patch.object(nested_blocks.Stats, "incr") as incr:
        for extra in ("first", "second"):
            with create_session() as nested:
                nested.add(Log(event=EVENT, extra=extra))

    warnings = [message for message in cap_structlog.messages if "nested_sessions_join_loop" in message]
    assert len(warnings) == 1, warnings
    assert {
        f"{__name__}.test_a_joined_write_is_logged_once_per_caller_and_counted"
    } == nested_blocks._JOINED_WRITERS
    counted = [c for c in incr.call_args_list if c.args[0] == "heartbeat_fix.nested_sessions.joined_writes"]
    assert len(counted) == 2


# -- Own: the loop's transaction holds nothing -------------------------------------------------------


def test_nested_commit_publishes_when_the_loop_holds_nothing(loop: Session) -> None:
    """A block that begins while the loop has only read commits for real: published at once."""
    loop.scalar(select(Log.id).limit(1))
    with create_session() as nested:
        nested.add(Log(event=EVENT, extra="nested"))
        assert _stored() == [], "published before its commit"

    assert _stored() == ["nested"], "the nested commit did not publish"
    _writes_and_flushes(loop, "loop")
    loop.commit()
    assert _stored() == ["nested", "loop"]


@pytest.mark.backend("postgres")
def test_nested_commit_unlocks_what_it_locked_when_the_loop_holds_nothing(loop: Session) -> None:
    """Another connection may write the row the nested block wrote, at once (on a join it would wait)."""
    key = f"{EVENT}-ack"
    with create_session(scoped=False) as writer:
        writer.add(Variable(key=key, val="pending"))
    with create_session() as nested:
        nested.execute(update(Variable).where(Variable.key == key).values(val="sent"))

    with create_session(scoped=False) as other:
        other.execute(text("SET LOCAL lock_timeout = '2s'"))
        other.execute(update(Variable).where(Variable.key == key).values(val="acknowledged"))
    with create_session(scoped=False) as reader:
        assert reader.scalar(select(Variable.val).where(Variable.key == key)) == "acknowledged"


def test_prohibit_commit_lets_an_own_commit_through_and_still_guards_the_loop(loop: Session) -> None:
    with prohibit_commit(loop) as guard:
        with create_session() as nested:
            nested.add(Log(event=EVENT, extra="nested"))
        assert _stored() == ["nested"]
        _writes_and_flushes(loop, "loop")
        with pytest.raises(RuntimeError, match="UNEXPECTED COMMIT"):
            loop.commit()
        with create_session() as joined:
            joined.add(Log(event=EVENT, extra="joined"))
        guard.commit()
    assert _stored() == ["nested", "loop", "joined"]


# -- Either way --------------------------------------------------------------------------------------


def test_nested_session_is_the_loops_session(loop: Session) -> None:
    """As in stock: a ``Session``, the one the loop's objects belong to."""
    row = _writes_and_flushes(loop, "loop")
    with create_session() as nested:
        assert isinstance(nested, Session)
        assert nested is loop
        assert object_session(row) is nested


def test_nested_close_and_expunge_all_leave_the_loops_objects_attached(loop: Session) -> None:
    """What 3.0/3.1's metastore lookups do (``expunge_all``), and every ``create_session`` (``close``)."""
    with create_session(scoped=False) as writer:
        writer.add(Variable(key=f"{EVENT}-stored", val="1"))
    mine = _writes_and_flushes(loop, "loop")
    pending = Log(event=EVENT, extra="pending")
    loop.add(pending)
    with create_session() as nested:
        theirs = nested.scalar(select(Variable).where(Variable.key == f"{EVENT}-stored"))
        assert theirs in loop
        nested.expunge_all()
        assert mine in loop and pending in loop, "the nested expunge_all() detached the loop's objects"
        assert theirs not in loop
        theirs = nested.scalar(select(Variable).where(Variable.key == f"{EVENT}-stored"))

    assert mine in loop and pending in loop, "the nested close detached the loop's objects"
    assert inspect(theirs).detached, "what the nested block loaded stayed in the loop's session"
    loop.commit()
    assert _stored() == ["loop", "pending"]


def test_what_a_nested_block_lazily_loads_for_the_loops_objects_stays_the_loops(
    loop: Session, dag_maker: Any
) -> None:
    """
    A lazy load of a loop object's relationship inside the block (``ti.dag_model``) is the loop's object:
    close() leaves it attached, and the loop's later change to it is written.
    """
    from airflow.models.dag import DagModel
    from airflow.models.taskinstance import TaskInstance

    with dag_maker(dag_id=EVENT, schedule=None, session=loop):
        _empty_operator("work")
    dag_maker.create_dagrun(run_id="lazy")
    loop.commit()
    loop.expunge_all()
    ti = loop.scalar(select(TaskInstance).where(TaskInstance.dag_id == EVENT))
    assert "dag_model" not in inspect(ti).dict

    with create_session() as nested:
        dag_model = ti.dag_model  # the block's lazy load of the loop's task instance's relationship
        nested.scalar(select(Log.id).limit(1))

    assert dag_model in loop, "close() detached what the block loaded for the loop's task instance"
    dag_model.description = "changed by the loop"
    loop.commit()
    with create_session(scoped=False) as reader:
        description = reader.scalar(select(DagModel.description).where(DagModel.dag_id == EVENT))
    _clean_db()
    assert description == "changed by the loop", "the loop's change to the lazily loaded Dag was lost"


def test_code_calling_the_scoped_session_directly_gets_the_loops_session(loop: Session) -> None:
    """``settings.Session()`` outside ``create_session`` shares the session and never ends it, as in stock."""
    assert settings.Session() is loop


def test_another_threads_sessions_are_their_own(loop: Session) -> None:
    """Another thread's ``create_session()`` commits on its own (the loop writes after it: SQLite locks)."""
    loop.scalar(select(Log.id).limit(1))
    seen: list[bool] = []

    def elsewhere() -> None:
        with create_session() as other:
            seen.append(other is loop)
            other.add(Log(event=EVENT, extra="other thread"))
        settings.Session.remove()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()

    assert seen == [False]
    assert _stored() == ["other thread"], "the other thread's session did not commit on its own"
    _writes_and_flushes(loop, "loop")
    loop.commit()
    assert sorted(_stored()) == ["loop", "other thread"]


def test_without_the_hold_a_nested_commit_commits_the_outer_transaction() -> None:
    """Outside every loop path, Airflow's own semantics."""
    with create_session() as outer:
        _writes_and_flushes(outer, "outer")
        with create_session() as nested:
            assert nested is outer
        assert _stored() == ["outer"]


def test_a_process_forked_by_a_loop_path_is_not_in_it(loop: Session) -> None:
    """The LocalExecutor forks its workers from the loop: a fork starts outside every loop path."""
    _writes_and_flushes(loop, "loop")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether it is in a loop path, then leave at once
        os.close(read)
        os.write(write, str(nested_blocks.in_loop_path()).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = pipe.read()
    os.waitpid(pid, 0)

    assert seen == "False", "the forked process was still in the loop path"
    loop.commit()
    assert _stored() == ["loop"]


# -- Recognising create_session ------------------------------------------------------------------------


def _tracing(create_session_now: Any) -> Any:
    """What a tracing library installs: a wrapper that calls the create_session it wraps."""

    @functools.wraps(create_session_now)
    @contextlib.contextmanager
    def traced(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with create_session_now(*args, **kwargs) as session:
            yield session

    return traced


@contextlib.contextmanager
def _replacing(*args: Any, **kwargs: Any) -> Iterator[Any]:
    """A replacement that never calls Airflow's create_session."""
    session = settings.Session()
    try:
        yield session
        session.commit()
    finally:
        session.close()


def test_a_wrapper_installed_after_activation_still_reaches_the_fix(loop: Session) -> None:
    _writes_and_flushes(loop, "loop")
    with mock.patch.object(session_module, "create_session", _tracing(session_module.create_session)):
        assert create_session_reached()
        with session_module.create_session() as nested:
            nested.add(Log(event=EVENT, extra="nested"))
        assert loop.in_transaction() and _stored() == [], "the wrapped nested commit ended the loop's"
    loop.commit()
    assert _stored() == ["loop", "nested"]


def test_a_replacement_of_create_session_is_reported_not_reached() -> None:
    assert create_session_reached()
    with mock.patch.object(session_module, "create_session", _replacing):
        assert not create_session_reached()
