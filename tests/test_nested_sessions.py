"""
The nested-session hold's contract, case by case, on the real metadata database.

The scheduler paths it fixes are tested in ``tests/unit/jobs/test_heartbeat_fix_nested_sessions.py``; these
hold a session the way a loop path holds it (``held_loop_session``) and run in it what nested code does:
a ``create_session()`` that writes, fails, expunges or closes, under ``prohibit_commit`` or not, in this
thread or in another. Each would fail without the hold (the nested ``create_session()`` commits, rolls
back and closes the loop's session there), so they are independent of ``[heartbeat_fix] enabled``.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

import pytest
from airflow import settings
from airflow.models.log import Log
from airflow.models.variable import Variable
from airflow.utils.session import create_session
from airflow.utils.sqlalchemy import prohibit_commit
from sqlalchemy import delete, inspect, select
from sqlalchemy.exc import IntegrityError

from airflow_heartbeat_fix.nested_sessions import NestedSession, held_loop_session

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.orm import Session

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


@pytest.fixture
def loop() -> Iterator[Session]:
    """The loop's session, held as a loop path holds it: the outermost ``create_session()`` of the thread."""
    with held_loop_session(), create_session() as session:
        yield session
        session.rollback()


def test_nested_commit_joins_the_loops_transaction(loop: Session) -> None:
    loop.add(Log(event=EVENT, extra="loop"))
    loop.flush()
    with create_session() as nested:
        assert isinstance(nested, NestedSession)
        nested.add(Log(event=EVENT, extra="nested"))

    assert loop.in_transaction(), "the nested block ended the loop's transaction"
    assert _stored() == [], "the nested commit committed the loop's transaction"
    loop.commit()
    assert _stored() == ["loop", "nested"]


def test_nested_rollback_undoes_only_its_own_work(loop: Session) -> None:
    """A database error in the nested block (PostgreSQL aborts the transaction): undone to its savepoint."""
    loop.add(Log(event=EVENT, extra="before"))
    loop.flush()
    with pytest.raises(IntegrityError), create_session() as nested:
        nested.add(Log(event=EVENT, extra="nested"))
        nested.add(Variable(key=f"{EVENT}-twice", val="1"))
        nested.flush()
        nested.add(Variable(key=f"{EVENT}-twice", val="2"))
        nested.flush()

    loop.add(Log(event=EVENT, extra="after"))
    loop.commit()
    assert _stored() == ["before", "after"]


def test_nested_close_and_expunge_all_leave_the_loops_objects_attached(loop: Session) -> None:
    """What 3.0/3.1's metastore lookups do (``expunge_all``), and every ``create_session`` (``close``)."""
    with create_session(scoped=False) as writer:
        writer.add(Variable(key=f"{EVENT}-stored", val="1"))
    mine, pending = Log(event=EVENT, extra="loop"), Log(event=EVENT, extra="pending")
    loop.add(mine)
    loop.flush()
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


def test_prohibit_commit_lets_a_nested_commit_through_and_still_guards_the_loop(loop: Session) -> None:
    with prohibit_commit(loop) as guard:
        with create_session() as nested:
            nested.add(Log(event=EVENT, extra="nested"))
        with pytest.raises(RuntimeError, match="UNEXPECTED COMMIT"):
            loop.commit()
        guard.commit()
    assert _stored() == ["nested"]


def test_code_calling_the_scoped_session_directly_gets_the_loops_session(loop: Session) -> None:
    """``settings.Session()`` outside ``create_session`` shares the session and never ends it, as in stock."""
    assert settings.Session() is loop


def test_another_threads_sessions_are_their_own(loop: Session) -> None:
    """Another thread's ``create_session()`` commits on its own (the loop writes after it: SQLite locks)."""
    loop.scalar(select(Log.id).limit(1))
    seen: list[object] = []

    def elsewhere() -> None:
        with create_session() as other:
            seen.append(type(other))
            other.add(Log(event=EVENT, extra="other thread"))
        settings.Session.remove()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()

    assert seen and seen[0] is not NestedSession
    assert _stored() == ["other thread"], "the other thread's session did not commit on its own"
    loop.add(Log(event=EVENT, extra="loop"))
    loop.commit()
    assert sorted(_stored()) == ["loop", "other thread"]


def test_without_the_hold_a_nested_commit_commits_the_outer_transaction() -> None:
    """Outside every loop path, Airflow's own semantics."""
    with create_session() as outer:
        outer.add(Log(event=EVENT, extra="outer"))
        outer.flush()
        with create_session() as nested:
            assert nested is outer
        assert _stored() == ["outer"]


def test_a_process_forked_by_a_loop_path_is_not_held(loop: Session) -> None:
    """The LocalExecutor forks its workers from the loop: a fork starts with Airflow's own sessions."""
    loop.add(Log(event=EVENT, extra="loop"))
    loop.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what create_session() hands out there, then leave at once
        os.close(read)
        settings.Session.registry.clear()  # the parent's session (and connection) are not the child's
        with create_session() as child:
            kind = type(child).__name__
        os.write(write, f"{kind} {settings.Session.__class__.__name__}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = pipe.read()
    os.waitpid(pid, 0)

    assert seen == "Session scoped_session", f"the forked process was still held: {seen}"
    loop.commit()
    assert _stored() == ["loop"]
