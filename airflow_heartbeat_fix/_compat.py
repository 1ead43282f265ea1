"""
Every Airflow import that is private, or that moved between the releases this package supports.

The fix modules import these names from here and nowhere else, so a release that moves one of them
is handled in this file alone. An import that fails here makes activation report the fixes
``unsupported`` (with the error) and leave Airflow unpatched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow import settings
from airflow.utils.sqlalchemy import with_row_locks

try:  # 3.2+: the public re-export of the shared metrics module.
    from airflow.observability.stats import Stats
except ImportError:  # 3.0/3.1.
    from airflow.stats import Stats  # type: ignore[assignment,no-redef,unused-ignore]

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["Stats", "scoped_session", "with_row_locks"]


def scoped_session() -> Session:
    """The thread's scoped session: the one ``create_session()`` hands the scheduler loop."""
    if settings.Session is None:
        raise RuntimeError("Airflow's ORM is not configured (settings.Session is None)")
    return settings.Session()
