"""
Real Airflow, real metadata database, and stock runs that must fail where the bugs are.

The database comes from ``HEARTBEAT_FIX_TEST_DB_URL`` (the runner passes a fresh SQLite file or
PostgreSQL database per cell) and is migrated here. Upstream's ``tests_common`` fixtures (``dag_maker``,
``session``, ``cap_structlog``, the ``clear_db_*`` helpers) come from the real package when it is
importable (inside Breeze) and from the stand-in in ``tests/_stand_in`` otherwise.

``AIRFLOW__HEARTBEAT_FIX__ENABLED=False`` runs the suite against stock Airflow. Which tests must then
fail is read from ``parity/expectations.toml`` (the one place that says which release has which bug),
and each becomes a strict xfail. Before that, the file is checked against what feature detection says
about the installed Airflow: a disagreement stops the run.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testing.environment import airflow_home, configure_airflow

_home = airflow_home("hbfix-home-")
configure_airflow(os.environ.setdefault("HEARTBEAT_FIX_TEST_DB_URL", f"sqlite:///{_home}/airflow.db"))

if importlib.util.find_spec("tests_common") is None:
    sys.path.insert(0, str(Path(__file__).with_name("_stand_in")))

import pytest  # noqa: E402
from sqlalchemy.exc import IntegrityError  # noqa: E402

from parity.expectations import Expectations, ExpectationsError, disagreements_with_detection, load  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterator

pytest_plugins = ["tests_common.pytest_plugin"]


def pytest_configure(config: pytest.Config) -> None:
    from airflow.utils.db import resetdb

    resetdb()
    # Become a scheduler process: importing the scheduler command is what triggers activation
    # (through the airflow.policy entry point) in `airflow scheduler`.
    import airflow.cli.commands.scheduler_command  # noqa: F401

    if (
        os.environ.get("HEARTBEAT_FIX_TEST_CREATE_SESSION") == "wrapped"
    ):  # nox -s tests_wrapped_create_session
        from airflow_heartbeat_fix.nested_sessions import create_session_reached
        from testing.plugins import wrap_create_session

        wrap_create_session()
        if not create_session_reached():
            raise pytest.UsageError("create_session, wrapped after activation, does not reach the fix")


def _stock_xfail(expectations: Expectations, item: pytest.Item, version: str) -> pytest.MarkDecorator | None:
    bugs = expectations.bugs_caught(item.nodeid, version)
    if not bugs:
        return None
    names = ", ".join(f"{bug.name} ({bug.title})" for bug in bugs)
    return pytest.mark.xfail(
        strict=True,
        raises=(AssertionError, IntegrityError),
        reason=f"stock Airflow {version} has {names}: this test must catch it",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from airflow import __version__ as version

    from airflow_heartbeat_fix.activation import facts, is_enabled
    from airflow_heartbeat_fix.detection import FixState, decide

    try:
        expectations = load()
    except ExpectationsError as error:
        raise pytest.UsageError(f"parity/expectations.toml: {error}") from error
    decided = decide(facts(), enabled=is_enabled())
    not_needed = {fix for fix, decision in decided.items() if decision.state is FixState.NOT_NEEDED}
    if problems := disagreements_with_detection(expectations, version, not_needed):
        raise pytest.UsageError(
            "parity/expectations.toml contradicts feature detection: " + "; ".join(problems)
        )
    undeclared = [
        item.nodeid
        for item in items
        if item.nodeid.startswith(expectations.mirrored_modules)
        and expectations.for_node(item.nodeid) is None
    ]
    if undeclared:
        raise pytest.UsageError(f"parity/expectations.toml declares no [[test]] for {', '.join(undeclared)}")
    _deselect_not_applicable(config, items, expectations, version, "fixed" if is_enabled() else "stock")
    if is_enabled():
        return
    for item in items:
        if xfail := _stock_xfail(expectations, item, version):
            item.add_marker(xfail)


def _deselect_not_applicable(
    config: pytest.Config, items: list[pytest.Item], expectations: Expectations, version: str, mode: str
) -> None:
    """
    Deselect (not skip) what the expectations say does not run in this cell, as the report says: tests
    declared not applicable here (or without an extra they need) and, on a sweep release, every test but
    those that catch a bug.
    """
    from tests_common.pytest_plugin import current_backend

    db = current_backend()
    # HEARTBEAT_FIX_SWEEP=full (nox -s sweep_full): a sweep release runs everything, as the newest does.
    sweep_rule = os.environ.get("HEARTBEAT_FIX_SWEEP") != "full"
    extras = installed_extras()
    elsewhere = [
        item
        for item in items
        if expectations.not_applicable(item.nodeid, version, db, mode, extras, sweep=sweep_rule)
    ]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if item not in elsewhere]


def installed_extras() -> frozenset[str]:
    """
    The package's extras whose requirements are all installed here, at versions they allow (``dev``;
    ``kubernetes`` in ``nox -s tests_kubernetes``). None where the package is not installed (Breeze).
    """
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    try:
        metadata = distribution("airflow-heartbeat-fix").metadata
    except PackageNotFoundError:
        return frozenset()

    def satisfied(requirement: Requirement) -> bool:
        try:
            return requirement.specifier.contains(distribution(requirement.name).version, prereleases=True)
        except PackageNotFoundError:
            return False

    requirements = [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]
    extras = set()
    for extra in metadata.get_all("Provides-Extra") or []:
        needed = [
            r
            for r in requirements
            if r.marker is not None
            and r.marker.evaluate({"extra": extra})
            and not r.marker.evaluate({"extra": ""})
        ]
        if all(map(satisfied, needed)):
            extras.add(extra)
    return frozenset(extras)


@pytest.fixture
def scheduler_rows_cleared() -> Iterator[None]:
    """A real ``airflow scheduler`` writes its ``job`` row and a ``log`` row: none is left behind."""
    from tests_common.test_utils.db import clear_db_jobs, clear_db_logs

    clear_db_jobs()
    clear_db_logs()
    yield
    clear_db_jobs()
    clear_db_logs()


@pytest.fixture
def loop() -> Iterator[Any]:
    """
    The scheduler loop's session, as a loop path holds it (the path's own ``create_session()``): what a
    ``create_session()`` entered in the block is nested in. Rolled back at the end.
    """
    from airflow.utils.session import create_session

    from airflow_heartbeat_fix.nested_sessions import held_loop_session

    with held_loop_session(), create_session() as session:
        yield session
        session.rollback()
