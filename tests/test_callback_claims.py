"""
The per-request claim of ``airflow_heartbeat_fix.callback_claims`` on the real ``callback_request`` /
``callback`` table (PostgreSQL row locks, SQLite byte-range locks), against a claimer in another process
that is SIGKILLed while it holds a request: its lock must die with it, and the next claim must count a
second attempt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest
from airflow import settings
from airflow.callbacks.callback_requests import DagCallbackRequest
from airflow.callbacks.database_callback_sink import DatabaseCallbackSink
from airflow.models.db_callback_request import DbCallbackRequest
from airflow.utils.session import create_session
from sqlalchemy import create_engine, delete, select, text
from sqlalchemy.pool import NullPool

from airflow_heartbeat_fix.callback_claims import (
    ATTEMPTS_KEY,
    Claimed,
    ClaimLost,
    Claims,
    Payload,
    held_elsewhere,
    lock_file_of,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.db_test, pytest.mark.mode_independent]


def _url() -> str:
    assert settings.engine is not None
    return settings.engine.url.render_as_string(hide_password=False)


@pytest.fixture
def stored() -> Iterator[list[Any]]:
    """Two Dag callback requests, stored by Airflow's own sink; their row ids."""
    with create_session() as session:
        session.execute(delete(DbCallbackRequest))
    for run_id in ("a", "b"):
        request = DagCallbackRequest(
            filepath="f.py", bundle_name="dags-folder", bundle_version=None, dag_id="d", run_id=run_id
        )
        DatabaseCallbackSink().send(request)
    with create_session() as session:
        ids = list(session.scalars(select(DbCallbackRequest.id)))
    yield ids
    with create_session() as session:
        session.execute(delete(DbCallbackRequest))


@pytest.fixture
def claims() -> Iterator[Claims]:
    """A claimer on an engine of its own (``Claims.open`` gives its engine a fresh pool, as after a fork)."""
    own = Claims(create_engine(_url(), poolclass=NullPool), DbCallbackRequest.__table__)
    own.open()
    yield own
    own.close()


@contextmanager
def holding(claims: Claims, row_id: Any) -> Iterator[Claimed | None]:
    """Claim; ``done`` if the block ends normally, ``release`` if it raises (a file processor's pattern)."""
    claimed = claims.claim(row_id)
    if claimed is None:
        yield None
        return
    try:
        yield claimed
    except BaseException:
        claims.release(claimed)
        raise
    claims.done(claimed)


def _remaining() -> list[Any]:
    with create_session() as session:
        rows = session.scalars(select(DbCallbackRequest)).all()
        return [(row.id, row.get_callback_request().run_id) for row in rows]


def _holder(row_id: Any) -> subprocess.Popen[str]:
    """Another process that claims ``row_id`` and holds it (as a file processor running its callback)."""
    code = textwrap.dedent(
        f"""
        import sys, time, uuid
        from airflow import settings
        from airflow.models.db_callback_request import DbCallbackRequest
        from airflow_heartbeat_fix.callback_claims import Claims
        raw = {str(row_id)!r}
        row_id = uuid.UUID(raw) if "-" in raw else int(raw)
        claims = Claims(settings.engine, DbCallbackRequest.__table__)
        claims.open()
        held = claims.claim(row_id)
        print("claimed:", held.attempt if held else "none", flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    assert proc.stdout is not None
    # Airflow may log to stdout first (alembic's plugin setup on some dependency sets).
    said = next((line for line in iter(proc.stdout.readline, "") if line.startswith("claimed:")), "")
    assert said.split() == ["claimed:", "1"]
    return proc


def test_done_deletes_only_its_request(stored: list[Any], claims: Claims) -> None:
    first, second = stored
    with holding(claims, first) as held:
        assert held is not None and held.attempt == 1
    assert [row_id for row_id, _ in _remaining()] == [second]
    assert claims.claim(first) is None  # gone


def test_a_live_holder_is_skipped_and_a_dead_ones_request_runs_again(
    stored: list[Any], claims: Claims
) -> None:
    first, second = stored
    holder = _holder(first)
    try:
        assert claims.claim(first) is None  # another live process runs it
        if lock_file := lock_file_of(settings.engine):  # SQLite: what the manager's fetch skips
            assert held_elsewhere(lock_file, [first, second]) == {first}
        with holding(claims, second) as held:  # the rest is not blocked
            assert held is not None and held.attempt == 1
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        with holding(claims, first) as held:  # dead: its request is back, and says it ran before
            assert held is not None and held.attempt == 2
    finally:
        holder.kill()
        holder.wait()
    assert _remaining() == []


def test_attempts_are_invisible_to_airflow(stored: list[Any], claims: Claims) -> None:
    """The stock Dag processor still parses a request whose payload carries the attempt count."""
    first, _ = stored
    held = claims.claim(first)
    assert held is not None
    claims.release(held)
    with create_session() as session:
        row = session.get(DbCallbackRequest, first)
        payload = Payload.of(DbCallbackRequest.__table__)
        value = row.callback_data if payload.holds_string else row.data
        assert payload.attempts(value) == 1 and ATTEMPTS_KEY in str(value)
        assert row.get_callback_request().run_id in ("a", "b")


def test_abandon_deletes_unrun_unless_held(stored: list[Any], claims: Claims) -> None:
    first, second = stored
    holder = _holder(first)
    try:
        assert claims.abandon(first) is False  # a live process runs it: never deleted under it
    finally:
        holder.kill()
        holder.wait()
    assert claims.abandon(first) is True
    assert claims.abandon(first) is False  # gone
    assert [row_id for row_id, _ in _remaining()] == [second]


@pytest.mark.backend("postgres")
def test_a_broken_connection_is_a_lost_claim(stored: list[Any], claims: Claims) -> None:
    """The server ends the holding connection while the callback runs: the request stays, said so."""
    first, _ = stored
    held = claims.claim(first)
    assert held is not None
    backend = claims.connection.execute(text("SELECT pg_backend_pid()")).scalar()
    with create_session() as session:
        session.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
    with pytest.raises(ClaimLost):
        claims.done(held)
    assert first in [row_id for row_id, _ in _remaining()]
