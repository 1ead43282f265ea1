"""
The session-preserving sink's contract, case by case.

The mirrored sink tests live in ``tests/unit/jobs/test_scheduler_job.py`` (``send`` with a session uses
that session there); these are the package's own: which unit of work ``send`` joins without a session,
when the scheduler loop's transaction is open and when no such transaction is open.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from airflow.callbacks import database_callback_sink
from airflow.callbacks.callback_requests import DagCallbackRequest
from airflow.models.db_callback_request import DbCallbackRequest
from airflow.models.log import Log
from airflow.utils.session import create_session
from sqlalchemy import delete, select

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.orm import Session

pytestmark = pytest.mark.db_test

PROBE_EVENT = "heartbeat-fix-sink-contract"


def _dag_request(dag_id: str) -> DagCallbackRequest:
    return DagCallbackRequest(
        filepath="sink_dag.py", bundle_name="dags-folder", bundle_version=None, dag_id=dag_id, run_id="r1"
    )


def _sink() -> Any:
    """The sink ``SchedulerJobRunner._execute`` builds on this installation (patched when active)."""
    return database_callback_sink.DatabaseCallbackSink()


def _stored_dag_ids(session: Session) -> list[str]:
    rows = session.scalars(select(DbCallbackRequest).order_by(DbCallbackRequest.id)).all()
    return [row.get_callback_request().dag_id for row in rows]


class TestSinkContract:
    """
    With a session: that session. Without one: the thread's scoped session only while it is in a
    transaction (the scheduler loop's); otherwise the request is committed in a session of its own, as
    the stock sink does for callers outside the scheduler's transaction.
    """

    @pytest.fixture(autouse=True)
    def no_requests_before_or_after(self) -> Iterator[None]:
        def clear() -> None:
            with create_session(scoped=False) as cleaner:
                cleaner.execute(delete(DbCallbackRequest))
                cleaner.execute(delete(Log).where(Log.event == PROBE_EVENT))

        clear()
        yield
        clear()

    def test_without_session_joins_the_scheduler_loops_transaction(self, session: Session) -> None:
        session.add(Log(event=PROBE_EVENT))
        session.flush()
        assert session.in_transaction()

        _sink().send(_dag_request("scheduler_loop"))

        assert [type(obj) for obj in session.new] == [DbCallbackRequest], "not in the loop's transaction"
        session.rollback()
        assert _stored_dag_ids(session) == [], "the sink committed the scheduler loop's transaction"

    def test_without_session_outside_a_transaction_commits_in_its_own(self, session: Session) -> None:
        """A caller working in a non-scoped session and committing it must not lose the request."""
        session.commit()
        assert not session.in_transaction()
        with create_session(scoped=False) as caller:
            caller.add(Log(event=PROBE_EVENT))
            _sink().send(_dag_request("own_session"))

        assert not session.in_transaction(), "the sink began a transaction in the scoped session"
        assert _stored_dag_ids(session) == ["own_session"]
