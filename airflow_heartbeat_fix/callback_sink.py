"""The callback sink that adds requests to the caller's transaction instead of ending it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.callbacks.database_callback_sink import DatabaseCallbackSink
from airflow.utils.session import create_session

from airflow_heartbeat_fix._compat import scoped_session, scoped_session_in_transaction

if TYPE_CHECKING:
    from airflow.callbacks.callback_requests import CallbackRequest
    from sqlalchemy.orm import Session


class SessionPreservingCallbackSink(DatabaseCallbackSink):
    """
    Store callback requests in the caller's transaction and leave the commit to the caller.

    Backports the sink half of upstream's fix for the UniqueViolation crash on retry (its PR number is
    not recorded here; the commit dates from apache/airflow#21731, the crash from #74222, fixed on main
    and v3-4-test). Delete once the installed ``DatabaseCallbackSink.send`` takes the caller's session
    (detection then reports ``session_preserving_sink`` "not needed").

    Executors call ``send(request)`` without a session, so the stock ``@provide_session`` sink gets the
    scheduler's own thread-local scoped session from ``create_session()`` and commits *and closes* it:
    every task instance in the scheduler's batch is detached and its row locks are released. The
    contract here:

    * with a session: the request is added to it; the caller commits.
    * without one, while the thread's scoped session is in a transaction: that is the scheduler loop's
      session (every scheduler path that sends callbacks has read through it in the same transaction and
      commits afterwards, ``_do_scheduling`` through
      :class:`~airflow_heartbeat_fix.scheduler.SessionPreservingSinkMixin`), so the request joins it.
    * without one otherwise: the stock contract for callers outside that transaction, e.g. one working
      in a non-scoped session: the request is written and committed in a session of its own.
    """

    def send(self, callback: CallbackRequest, *, session: Session | None = None) -> None:
        if session is None and scoped_session_in_transaction():
            session = scoped_session()
        if session is not None:
            super().send(callback, session=session)
            return
        with create_session(scoped=False) as own_session:
            super().send(callback, session=own_session)
