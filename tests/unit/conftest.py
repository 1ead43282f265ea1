"""What the package's own tests under ``unit/`` share beside the mirrored ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator


def _clean_db() -> None:
    """Runs, jobs, callbacks, logs and the stored callback requests (which ``clear_db_callbacks`` keeps)."""
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session
    from sqlalchemy import delete
    from tests_common.test_utils.db import clear_db_callbacks, clear_db_jobs, clear_db_logs, clear_db_runs

    clear_db_runs()
    clear_db_jobs()
    clear_db_callbacks()
    clear_db_logs()
    with create_session() as session:
        session.execute(delete(DbCallbackRequest))


@pytest.fixture
def clean_db() -> Iterator[None]:
    """The tables a heartbeat-timeout or callback-delivery test writes, empty before and after it."""
    _clean_db()
    yield
    _clean_db()
