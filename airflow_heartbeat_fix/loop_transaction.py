"""
Whether committing a transaction now would publish or unlock anything: what decides if a session nested
in the scheduler loop's may commit on its own (:mod:`~airflow_heartbeat_fix.nested_blocks`) and whether a
listener hook must wait for the loop's commit (:mod:`~airflow_heartbeat_fix.listener_delivery`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_heartbeat_fix._compat import dbapi_connection, transaction_connection

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)


def holds_nothing(session: Session) -> bool:
    """
    Whether committing ``session``'s transaction now would publish or unlock nothing of the loop's.

    No pending ORM change, and in the database no row written or locked: SQLite's driver opens its
    transaction at the first write (reads take no lasting lock); PostgreSQL assigns a transaction id at the
    first write or row lock (``txid_current_if_assigned()``, one statement). Other databases: the cautious
    answer, "something".
    """
    if not session.in_transaction():
        return True
    if session.new or session.dirty or session.deleted:
        return False
    connection = transaction_connection(session)
    return connection is None or _database_transaction_holds_nothing(connection)


def _database_transaction_holds_nothing(connection: Connection) -> bool:
    dialect = connection.dialect.name
    try:
        if dialect == "sqlite":
            return not dbapi_connection(connection).in_transaction
        if dialect == "postgresql":
            return connection.exec_driver_sql("SELECT txid_current_if_assigned()").scalar() is None
    except Exception:  # an aborted transaction, a driver without the attribute: "something"
        log.debug("could not tell what the scheduler loop's transaction holds", exc_info=True)
    return False
