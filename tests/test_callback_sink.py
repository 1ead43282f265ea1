"""
The sink's contract with its callers: whose unit of work a request joins (issue 9, item 4).

The sink tests that mirror seed 003 live in tests/unit/jobs/test_scheduler_job.py; these cover the
callers outside the scheduler loop. Stock xfails come from parity/expectations.toml.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def _dag_request(dag_id: str) -> Any:
    from airflow.callbacks.callback_requests import DagCallbackRequest

    return DagCallbackRequest(
        filepath="sink_dag.py", bundle_name="dags-folder", bundle_version=None, dag_id=dag_id, run_id="r1"
    )


def _sink() -> Any:
    """The sink ``SchedulerJobRunner._execute`` would build on this installation."""
    from airflow.callbacks import database_callback_sink

    return database_callback_sink.DatabaseCallbackSink()


def _callback_requests(session: Session) -> list[Any]:
    from airflow.models.db_callback_request import DbCallbackRequest

    return [row.get_callback_request() for row in session.scalars(select(DbCallbackRequest)).all()]


def _remove_callback_requests(session: Session) -> None:
    from airflow.models.db_callback_request import DbCallbackRequest
    from sqlalchemy import delete

    session.execute(delete(DbCallbackRequest))
    session.commit()


class TestSinkContract:
    """
    ``send`` stores the request in the caller's unit of work, whichever it is.

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
        assert _callback_requests(session) == []

    def test_without_session_joins_the_scheduler_loops_transaction(self, session: Session) -> None:
        from airflow.models.db_callback_request import DbCallbackRequest
        from airflow.models.log import Log

        session.add(Log(event="heartbeat-fix-sink-contract"))
        session.flush()
        assert session.in_transaction()

        _sink().send(_dag_request("scheduler_loop"))

        try:
            assert [type(obj) for obj in session.new] == [DbCallbackRequest]
            session.rollback()
            assert _callback_requests(session) == [], "the sink committed the scheduler loop's transaction"
        finally:
            _remove_callback_requests(session)

    def test_without_session_outside_a_transaction_commits_in_its_own(self, session: Session) -> None:
        """A caller working in a non-scoped session and committing it must not lose the request."""
        from airflow.models.log import Log
        from airflow.utils.session import create_session

        session.commit()
        assert not session.in_transaction()
        try:
            with create_session(scoped=False) as caller:
                caller.add(Log(event="heartbeat-fix-sink-contract"))
                _sink().send(_dag_request("own_session"))

            assert not session.in_transaction(), "the sink began a transaction in the scoped session"
            assert [request.dag_id for request in _callback_requests(session)] == ["own_session"]
        finally:
            _remove_callback_requests(session)
