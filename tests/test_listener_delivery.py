"""
Listener hooks a loop path calls: at once when the loop's transaction holds nothing, else right after its
next commit (in order, with their arguments as called), never when it rolls back.

A listener is registered on Airflow's listener manager as a plugin's would be, and called the way Airflow's
call sites call it (``get_listener_manager().hook.on_dag_run_running(...)``), inside a loop path held as the
scheduler holds it. Each case fails without the fix (the hook runs at once, inside the loop's transaction).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from airflow.listeners import hookimpl
from airflow.listeners.listener import get_listener_manager
from airflow.models.log import Log
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState
from sqlalchemy import delete, select

from tests.unit.jobs.test_scheduler_job import _clean_db, _empty_operator

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.orm import Session

pytestmark = [pytest.mark.db_test, pytest.mark.mode_independent]

EVENT = "heartbeat-fix-delivery"


class _Recorder:
    """A listener that records what it saw and writes a row of its own, through its own session."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []
        self.fail = False

    @hookimpl
    def on_dag_run_running(self, dag_run: Any, msg: str) -> None:
        self.seen.append((msg, dag_run.state))
        if self.fail:
            raise RuntimeError("the listener's own error")
        with create_session() as session:
            session.add(Log(event=EVENT, extra=msg))


def _stored() -> list[str | None]:
    with create_session(scoped=False) as reader:
        return list(reader.scalars(select(Log.extra).where(Log.event == EVENT).order_by(Log.id)))


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    listener = _Recorder()
    manager = get_listener_manager()
    manager.add_listener(listener)
    try:
        yield listener
    finally:
        manager.pm.unregister(listener)
        with create_session(scoped=False) as cleaner:
            cleaner.execute(delete(Log).where(Log.event == EVENT))


@pytest.fixture
def dag_run(dag_maker: Any) -> Iterator[Any]:
    _clean_db()
    with dag_maker(dag_id="heartbeat_fix_delivery", schedule=None):
        _empty_operator("work")
    yield dag_maker.create_dagrun(run_id="delivery", state=DagRunState.RUNNING)
    _clean_db()


def _announce(dag_run: Any, msg: str) -> Any:
    return get_listener_manager().hook.on_dag_run_running(dag_run=dag_run, msg=msg)


def _hold_a_write(loop: Session) -> None:
    loop.add(Log(event=EVENT, extra="loop"))
    loop.flush()


def test_a_hook_called_while_the_loop_holds_nothing_runs_at_once(loop: Session, recorder, dag_run) -> None:
    loop.merge(dag_run)
    _announce(dag_run, "at once")
    assert recorder.seen == [("at once", DagRunState.RUNNING)]
    assert _stored() == ["at once"], "the listener's own commit did not publish"


def test_a_hook_called_while_the_loop_holds_a_write_runs_after_its_commit_in_order(
    loop: Session, recorder, dag_run
) -> None:
    dag_run = loop.merge(dag_run)
    _hold_a_write(loop)
    _announce(dag_run, "first")
    _announce(dag_run, "second")
    assert recorder.seen == [], "the listener ran inside the loop's transaction"

    loop.commit()

    assert [msg for msg, _ in recorder.seen] == ["first", "second"]
    assert _stored() == ["loop", "first", "second"], "the listener's commits did not publish"


def test_a_delivered_listener_sees_its_arguments_as_they_were_when_called(
    loop: Session, recorder, dag_run
) -> None:
    """The loop moves on before it commits (3.4 archives a failed try after notifying listeners)."""
    dag_run = loop.merge(dag_run)
    _hold_a_write(loop)
    _announce(dag_run, "while running")
    dag_run.state = DagRunState.SUCCESS

    loop.commit()

    assert recorder.seen == [("while running", DagRunState.RUNNING)]
    assert dag_run.state == DagRunState.SUCCESS, "the loop's object did not get its own value back"


def test_a_hook_whose_change_the_loop_rolls_back_is_not_delivered(
    loop: Session, recorder, dag_run, cap_structlog
) -> None:
    dag_run = loop.merge(dag_run)
    _hold_a_write(loop)
    _announce(dag_run, "rolled back")

    loop.rollback()
    loop.commit()

    assert recorder.seen == [], "a change the loop rolled back was announced"
    assert "not delivered" in cap_structlog.text


def test_a_joined_blocks_rollback_drops_only_the_hooks_it_called(loop: Session, recorder, dag_run) -> None:
    dag_run = loop.merge(dag_run)
    _hold_a_write(loop)
    _announce(dag_run, "before the block")
    with pytest.raises(RuntimeError), create_session() as nested:
        nested.scalar(select(Log.id).limit(1))
        _announce(dag_run, "inside the failed block")
        raise RuntimeError("the block fails")

    loop.commit()

    assert [msg for msg, _ in recorder.seen] == ["before the block"]


def test_a_listener_error_at_delivery_is_logged_not_raised(
    loop: Session, recorder, dag_run, cap_structlog
) -> None:
    """As Airflow's own call sites do: the loop never sees a listener's error."""
    dag_run = loop.merge(dag_run)
    recorder.fail = True
    _hold_a_write(loop)
    _announce(dag_run, "failing")

    loop.commit()

    assert recorder.seen == [("failing", DagRunState.RUNNING)]
    assert "error calling listener" in cap_structlog.text
    assert _stored() == ["loop"]


def test_outside_the_loop_a_hook_runs_at_once(recorder, dag_run) -> None:
    with create_session() as session:
        session.add(Log(event=EVENT, extra="outside"))
        session.flush()
        _announce(dag_run, "at once")
        assert [msg for msg, _ in recorder.seen] == ["at once"]
