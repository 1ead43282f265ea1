"""The session-preserving sink itself: whose session it writes to, and that it never ends it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select

from airflow_heartbeat_fix.detection import SINK_FIX
from tests.airflow_fixtures import callback_requests

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def _dag_request(dag_id: str = "sink_dag") -> Any:
    from airflow.callbacks.callback_requests import DagCallbackRequest

    return DagCallbackRequest(
        filepath="sink_dag.py", bundle_name="dags-folder", bundle_version=None, dag_id=dag_id, run_id="r1"
    )


def _sink() -> Any:
    """The sink ``SchedulerJobRunner._execute`` would build on this installation."""
    from airflow.callbacks import database_callback_sink

    return database_callback_sink.DatabaseCallbackSink()


@pytest.mark.fix(SINK_FIX)
def test_sink_send_without_session_keeps_scoped_session_open(session: Session) -> None:
    """Executors call ``send(request)``: the scheduler's scoped session must stay open and uncommitted."""
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.models.log import Log

    marker = Log(event="heartbeat-fix-sink-probe")
    session.add(marker)
    session.flush()

    _sink().send(_dag_request())

    assert marker in session, "the sink closed the caller's session and detached its objects"
    assert any(isinstance(obj, DbCallbackRequest) for obj in session.new), "request not in caller's session"
    session.rollback()
    assert callback_requests(session) == [], "the sink committed the caller's transaction"


def test_sink_send_with_session_uses_that_session(session: Session) -> None:
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session

    with create_session(scoped=False) as other:
        _sink().send(_dag_request("given_session"), session=other)
        assert [type(obj) for obj in other.new] == [DbCallbackRequest]
        assert not any(isinstance(obj, DbCallbackRequest) for obj in session.new)
        other.rollback()
    assert callback_requests(session) == []


def test_sink_request_is_stored_when_caller_commits(session: Session) -> None:
    from airflow.models.db_callback_request import DbCallbackRequest

    _sink().send(_dag_request("committed_by_caller"))
    session.commit()
    stored = session.scalars(select(DbCallbackRequest)).all()
    assert [row.get_callback_request().dag_id for row in stored] == ["committed_by_caller"]
    assert stored[0].priority_weight == 1


class TestSinkContract:
    """
    ``send`` stores the request in the caller's unit of work, whichever it is (issue 9, item 4).

    With a session: that session. Without one: the thread's scoped session only while it is in a
    transaction (the scheduler loop's); otherwise the request is committed in a session of its own, as
    the stock sink does for callers outside the scheduler's transaction.
    """

    def test_with_session_adds_to_it_and_leaves_the_commit(self, session: Session) -> None:
        from airflow.models.db_callback_request import DbCallbackRequest
        from airflow.utils.session import create_session

        with create_session(scoped=False) as caller:
            _sink().send(_dag_request("with_session"), session=caller)
            assert [type(obj) for obj in caller.new] == [DbCallbackRequest]
            assert not session.in_transaction() or not session.new, "the scoped session got it too"
            caller.rollback()
        assert callback_requests(session) == []

    @pytest.mark.fix(SINK_FIX)
    def test_without_session_joins_the_scheduler_loops_transaction(self, session: Session) -> None:
        from airflow.models.db_callback_request import DbCallbackRequest
        from airflow.models.log import Log

        session.add(Log(event="heartbeat-fix-sink-contract"))
        session.flush()
        assert session.in_transaction()

        _sink().send(_dag_request("scheduler_loop"))

        assert [type(obj) for obj in session.new] == [DbCallbackRequest]
        session.rollback()
        assert callback_requests(session) == [], "the sink committed the scheduler loop's transaction"

    def test_without_session_outside_a_transaction_commits_in_its_own(self, session: Session) -> None:
        """A caller working in a non-scoped session and committing it must not lose the request."""
        from airflow.models.log import Log
        from airflow.utils.session import create_session

        session.commit()
        assert not session.in_transaction()
        with create_session(scoped=False) as caller:
            caller.add(Log(event="heartbeat-fix-sink-contract"))
            _sink().send(_dag_request("own_session"))

        assert not session.in_transaction(), "the sink began a transaction in the scoped session"
        assert [request.dag_id for request in callback_requests(session)] == ["own_session"]
