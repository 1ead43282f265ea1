"""
The off switch without traps: a setting Airflow would ignore is named by ``status`` and at scheduler start,
and ``status`` piped into a reader that stops early (``| head``) exits cleanly.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from airflow_heartbeat_fix import activation
from airflow_heartbeat_fix.config_check import known_options, near_misses
from airflow_heartbeat_fix.provider_info import get_provider_info
from tests.test_activation import STATUS, _run

#: The checks are the package's own, on whatever database: each release's SQLite cell runs them.
pytestmark = [pytest.mark.mode_independent, pytest.mark.backend("sqlite")]

KNOWN = frozenset({"enabled"})


@pytest.mark.parametrize(
    ("variables", "sections", "options", "warned"),
    [
        pytest.param(
            ["AIRFLOW__HEARTBEAT_FIX__ENABLED"], ["heartbeat_fix"], ["enabled"], [], id="as documented"
        ),
        pytest.param(["AIRFLOW__HEARTBEAT_FIX__ENABLED_CMD"], [], [], [], id="Airflow's _CMD variant"),
        pytest.param(["AIRFLOW__CORE__EXECUTOR", "PATH"], ["core"], [], [], id="other settings"),
        pytest.param(
            ["AIRFLOW__HEARTBEAT_FIX_ENABLED"],
            [],
            [],
            ["AIRFLOW__HEARTBEAT_FIX_ENABLED is not AIRFLOW__HEARTBEAT_FIX__ENABLED"],
            id="one underscore too few",
        ),
        pytest.param(
            ["AIRFLOW__HEARTBEATFIX__ENABLED"],
            [],
            [],
            ["AIRFLOW__HEARTBEATFIX__ENABLED is not AIRFLOW__HEARTBEAT_FIX__ENABLED"],
            id="section run together",
        ),
        pytest.param(
            ["AIRFLOW__HEARTBEAT_FIX__ENABLE"],
            [],
            [],
            ["AIRFLOW__HEARTBEAT_FIX__ENABLE: [heartbeat_fix] has no option 'enable'"],
            id="unknown option by variable",
        ),
        pytest.param(
            [], ["heartbeat-fix"], [], ["section [heartbeat-fix] is not [heartbeat_fix]"], id="section"
        ),
        pytest.param(
            [], ["heartbeat_fix"], ["enable"], ["[heartbeat_fix] has no option 'enable'"], id="option"
        ),
    ],
)
def test_near_misses(
    variables: list[str], sections: list[str], options: list[str], warned: list[str]
) -> None:
    found = near_misses(variables, sections, options, KNOWN)
    assert len(found) == len(warned), found
    assert all(part in line for part, line in zip(warned, found, strict=True)), found


def test_the_known_options_are_the_declared_ones() -> None:
    declared = get_provider_info()["config"]["heartbeat_fix"]["options"]
    assert known_options() == frozenset(declared)
    assert "enabled" in known_options()


def test_status_and_the_start_line_name_a_misspelt_switch(
    monkeypatch: pytest.MonkeyPatch, cap_structlog: Any
) -> None:
    """Meant to switch the fixes off, the variable is misspelt: the fixes stay on, and both say why."""
    done = _run(
        [STATUS, "status", "-o", "json"], enabled=True, env={"AIRFLOW__HEARTBEAT_FIX_ENABLED": "False"}
    )
    document = json.loads(done.stdout)
    assert document["enabled"] is True
    assert [w.split(" is not ")[0] for w in document["config_warnings"]] == ["AIRFLOW__HEARTBEAT_FIX_ENABLED"]
    assert "AIRFLOW__HEARTBEAT_FIX_ENABLED is not AIRFLOW__HEARTBEAT_FIX__ENABLED" in done.stderr

    monkeypatch.setenv("AIRFLOW__HEARTBEAT_FIX_ENABLED", "False")
    activation.uninstall()
    try:
        activation.install()
    finally:
        monkeypatch.delenv("AIRFLOW__HEARTBEAT_FIX_ENABLED")
        activation.uninstall()
        activation.install()
    assert any("AIRFLOW__HEARTBEAT_FIX_ENABLED is not" in line for line in cap_structlog.messages)


def test_status_piped_into_a_reader_that_stops_exits_cleanly() -> None:
    """``status | head -1``: the reader closes the pipe; status answers with its exit code, no traceback."""
    process = subprocess.Popen([STATUS, "status"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before a line is read: every write of status meets a broken pipe
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 0, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr
