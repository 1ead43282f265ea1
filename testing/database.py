"""The metadata database: its backend, emptying tables, a connection outside every pool."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from sqlalchemy.engine import Connection


def backend(url: str) -> str:
    """``sqlite``, ``postgres`` or ``mysql``: the backend a SQLAlchemy URL names, as upstream spells it."""
    from airflow_heartbeat_fix.demo.topology import db_label

    scheme = db_label(url)
    return {"postgresql": "postgres"}.get(scheme, scheme)


def clear(models: Iterable[Any]) -> None:
    """Delete every row of ``models``, in that order (children before parents), in one committed session."""
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        for model in models:
            session.execute(delete(model))


def task_instance_history() -> list[Any]:
    """The history table of earlier tries where Airflow keeps one (up to 3.3); 3.4 keeps them in place."""
    try:
        from airflow.models.taskinstancehistory import TaskInstanceHistory
    except ImportError:
        return []
    return [TaskInstanceHistory]


@contextlib.contextmanager
def own_connection() -> Iterator[Connection]:
    """
    A connection to Airflow's database of its own, outside every pool, in autocommit: each statement sees
    the server's state now (PostgreSQL's activity views are a snapshot per transaction), on SQLAlchemy
    1.4 and 2.x alike.
    """
    from airflow import settings
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    if settings.engine is None:
        raise RuntimeError("Airflow's metadata database is not configured in this process")
    engine = create_engine(settings.engine.url, poolclass=NullPool)
    connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        yield connection
    finally:
        connection.close()
        engine.dispose()
