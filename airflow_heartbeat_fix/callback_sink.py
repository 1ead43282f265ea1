"""The callback sink that adds requests to the caller's transaction instead of ending it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.callbacks.database_callback_sink import DatabaseCallbackSink

from airflow_heartbeat_fix._compat import scoped_session

if TYPE_CHECKING:
    from airflow.callbacks.callback_requests import CallbackRequest
    from sqlalchemy.orm import Session


class SessionPreservingCallbackSink(DatabaseCallbackSink):
    """
    Store callback requests in the caller's session and leave the commit to the caller.

    Executors call ``send(request)`` without a session, so the stock ``@provide_session`` sink gets the
    scheduler's own thread-local scoped session from ``create_session()`` and commits *and closes* it:
    every task instance in the scheduler's batch is detached and its row locks are released. Passing
    that same scoped session explicitly keeps the request in the scheduler's transaction; every
    scheduler path that sends callbacks commits afterwards (``_do_scheduling`` through
    :class:`~airflow_heartbeat_fix.scheduler.CommitDagCallbacksMixin`).
    """

    def send(self, callback: CallbackRequest, *, session: Session | None = None) -> None:
        super().send(callback, session=session if session is not None else scoped_session())
