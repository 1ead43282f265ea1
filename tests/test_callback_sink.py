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
