"""
Real Airflow, real metadata database: the fixtures the upstream tests get from ``tests_common``.

The database comes from ``HEARTBEAT_FIX_TEST_DB_URL`` (``scripts/test.sh`` passes a fresh SQLite file or
PostgreSQL database per cell) and is migrated here. ``AIRFLOW__HEARTBEAT_FIX__ENABLED=False`` runs the
suite against stock Airflow: every test marked ``fix(NAME)`` whose fix this Airflow needs must then fail
(strict xfail), which is the recorded proof that the test catches the bug.
"""

from __future__ import annotations

import os
import tempfile

_home = os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="hbfix-home-"))
os.environ.setdefault("HEARTBEAT_FIX_TEST_DB_URL", f"sqlite:///{_home}/airflow.db")
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = os.environ["HEARTBEAT_FIX_TEST_DB_URL"]
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", os.path.join(_home, "dags"))
os.makedirs(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], exist_ok=True)

import pytest  # noqa: E402
from sqlalchemy.exc import IntegrityError  # noqa: E402

pytest_plugins = ["tests.airflow_fixtures"]


def pytest_configure(config: pytest.Config) -> None:
    from airflow.utils.db import resetdb

    resetdb()
    # Become a scheduler process: importing the scheduler command is what triggers activation
    # (through the airflow.policy entry point) in `airflow scheduler`.
    import airflow.cli.commands.scheduler_command  # noqa: F401


def _on_postgres() -> bool:
    return os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql")


def pytest_report_header(config: pytest.Config) -> str:
    db = "PostgreSQL" if _on_postgres() else "SQLite (postgres_only tests deselected: no row locks)"
    return f"heartbeat-fix metadata database: {db}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from airflow_heartbeat_fix.activation import decisions
    from airflow_heartbeat_fix.detection import FixState

    decided = decisions()
    if not _on_postgres():
        # Not skipped, not collected: SQLite has no row locks, and every CI run has PostgreSQL cells.
        needs_postgres = [item for item in items if item.get_closest_marker("postgres_only")]
        if needs_postgres:
            config.hook.pytest_deselected(items=needs_postgres)
            items[:] = [item for item in items if item not in needs_postgres]
    for item in items:
        for marker in item.iter_markers("fix"):
            (fix,) = marker.args
            # ``when=False``: this Airflow has the fix's bug, but not the failure this test observes.
            if decided[fix].state is FixState.DISABLED and marker.kwargs.get("when", True):
                item.add_marker(
                    pytest.mark.xfail(
                        strict=True,
                        raises=(AssertionError, IntegrityError),
                        reason=f"stock Airflow needs {fix}: this test must catch the bug",
                    )
                )
