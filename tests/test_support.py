"""
The supported range is the package's own requirement; an Airflow outside it, a broken ``airflow.cfg``:
one line each, nothing patched, and ``status``, the wrapper and the demo agree.
"""

from __future__ import annotations

import configparser
import itertools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (pytest's own dependency there)
    import tomli as tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from airflow_heartbeat_fix import activation, cli, support
from airflow_heartbeat_fix.demo.cli import main as demo_main
from airflow_heartbeat_fix.detection import FIXES, SCHEDULER_FIXES, FixState
from tests.test_activation import STATUS, _run

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parent.parent
RANGE = ">=3.0.0,<3.5"


def _pyproject_range() -> SpecifierSet:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (requirement,) = (
        Requirement(line)
        for line in pyproject["project"]["dependencies"]
        if Requirement(line).name == support.AIRFLOW_CORE
    )
    return requirement.specifier


def test_the_range_is_read_from_the_installed_metadata() -> None:
    """One fact: what pip resolves against is what the package checks at run time, lower bound first."""
    found = support.supported_range()
    assert found is not None
    assert SpecifierSet(found) == _pyproject_range()
    assert found.startswith(">")


@pytest.mark.parametrize(
    ("version", "in_range"),
    [
        ("3.0.0", True),
        ("3.4.0b2", True),  # an installed pre-release of a supported line
        ("3.4.9", True),
        ("2.11.0", False),
        ("3.5.0b1", False),  # "<3.5" keeps the next line's pre-releases out too
        ("3.5.0", False),
        ("not-a-version", False),
    ],
)
def test_in_range(version: str, in_range: bool) -> None:
    assert support.Support(version, RANGE).in_range is in_range
    refusal = support.Support(version, RANGE).refusal
    assert (refusal is None) is in_range
    if refusal:
        assert refusal == (
            f"Airflow {version} is outside the range this package supports "
            f"(apache-airflow-core{RANGE}): nothing patched"
        )


def test_unknown_is_not_a_refusal() -> None:
    assert support.Support(None, RANGE).refusal is None
    assert support.Support("3.3.2", None).refusal is None


@pytest.fixture
def airflow_2(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This process's Airflow reported as 2.11.0 by metadata; activation undone, then redone as the cell's."""
    activation.uninstall()
    monkeypatch.setattr(support, "installed_airflow_version", lambda: "2.11.0")
    monkeypatch.setenv("AIRFLOW__HEARTBEAT_FIX__ENABLED", "True")  # switched off, nothing refuses
    try:
        yield support.check().refusal or ""
    finally:
        activation.uninstall()
        monkeypatch.undo()
        activation.install()


def test_outside_the_range_nothing_is_patched(airflow_2: str) -> None:
    from airflow.cli.commands import scheduler_command

    stock = activation._originals()["runner"]
    decided = activation.install(raise_errors=True)
    assert scheduler_command.SchedulerJobRunner is stock
    assert {fix: (d.state, d.reason) for fix, d in decided.items()} == {
        fix: (FixState.UNSUPPORTED, airflow_2) for fix in SCHEDULER_FIXES
    }
    assert activation.summary(decided, "2.11.0") == (
        f"airflow-heartbeat-fix on Airflow 2.11.0: {airflow_2}; the scheduler runs Airflow's own classes"
    )


def test_outside_the_range_status_rows_and_exit_code_agree(
    airflow_2: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["status", "-o", "json"]) == cli.EXIT_NOT_APPLIED
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert document["airflow_version"] == "2.11.0"
    assert document["ok"] is False
    assert document["not_applied"] == list(FIXES)
    assert {row["state"] for row in document["fixes"]} == {FixState.UNSUPPORTED.value}
    assert document["activation"] == f"{airflow_2}; a plain `airflow scheduler` runs Airflow's own classes"
    assert document["refusal"] == airflow_2
    assert err.splitlines() == [f"airflow-heartbeat-fix: {airflow_2}"]


def test_outside_the_range_the_wrapper_refuses_in_one_line(
    airflow_2: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["scheduler", "--num-runs", "1"]) == cli.EXIT_NOT_APPLIED
    assert capsys.readouterr().err.splitlines() == [
        "airflow-heartbeat-fix: refusing to start the scheduler without "
        f"{', '.join(SCHEDULER_FIXES)}: {airflow_2}"
    ]


def test_outside_the_range_with_an_unreadable_switch_the_wrapper_still_refuses_in_one_line(
    airflow_2: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> bool:
        raise configparser.DuplicateOptionError("core", "load_examples", "airflow.cfg", 3)

    monkeypatch.setattr(activation, "is_enabled", broken)
    assert cli.main(["scheduler", "--num-runs", "1"]) == cli.EXIT_NOT_APPLIED
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_outside_the_range_with_the_switch_off_the_wrapper_starts_airflow(
    airflow_2: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The off switch never stops a scheduler, whatever else was found."""
    import airflow.__main__

    started: list[list[str]] = []
    monkeypatch.setattr(sys, "argv", sys.argv[:])  # the wrapper sets sys.argv for Airflow's CLI
    monkeypatch.setenv("AIRFLOW__HEARTBEAT_FIX__ENABLED", "False")
    monkeypatch.setattr(airflow.__main__, "main", lambda: started.append(list(sys.argv)))
    assert cli.main(["scheduler", "--num-runs", "1"]) == cli.EXIT_OK
    assert started == [["airflow", "scheduler", "--num-runs", "1"]]


def test_outside_the_range_the_demo_refuses_before_starting(
    airflow_2: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(support, "installed_airflow_version", lambda: "2.11.0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert demo_main([]) == 2
    assert capsys.readouterr().err.splitlines() == [f"demo: {airflow_2}; the demo would show nothing"]
    assert list(tmp_path.iterdir()) == []  # no home made, nothing started


BROKEN_CONFIGS = {
    "no-section-header": "enabled = False\n[core]\nload_examples = False\n",
    "duplicate-option": "[core]\nload_examples = False\nload_examples = True\n",
}


@pytest.mark.mode_independent
@pytest.mark.parametrize("text", BROKEN_CONFIGS.values(), ids=BROKEN_CONFIGS.keys())
def test_a_broken_airflow_cfg_is_one_line_and_json_stays_json(text: str, tmp_path: Path) -> None:
    config = tmp_path / "airflow.cfg"
    config.write_text(text)
    env = {"AIRFLOW_CONFIG": str(config)}
    status = _run([STATUS, "status", "-o", "json"], enabled=True, timeout=120, env=env)
    assert status.returncode == 1
    document = json.loads(status.stdout)
    assert document["ok"] is False
    assert document["error"].startswith("cannot read Airflow's configuration: ")
    assert str(config) in document["error"]
    assert status.stderr.splitlines() == [f"airflow-heartbeat-fix: {document['error']}"]
    wrapper = _run([STATUS, "scheduler", "--num-runs", "1"], enabled=True, timeout=120, env=env)
    assert wrapper.returncode == 1
    assert wrapper.stderr.splitlines() == [f"airflow-heartbeat-fix: {document['error']}"]
    assert "Traceback" not in status.stderr + wrapper.stderr


def test_demo_homes_default_to_the_per_user_cache() -> None:
    """Not the working directory: a 45-50 MB home there outlives ``pip uninstall`` unnoticed."""
    from airflow_heartbeat_fix.demo import config

    assert config.cache_dir({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path("/c/airflow-heartbeat-fix")
    assert config.cache_dir({"HOME": "/h"}) == Path("/h/.cache/airflow-heartbeat-fix")
    assert config.default_home(Path("/c/x"), "3.3.2", None) == Path("/c/x/demo/3.3.2-sqlite")


def test_wheel_messages_name_only_what_the_wheel_has() -> None:
    """The wheel has no scripts/: a message naming one says it is in a checkout."""
    from airflow_heartbeat_fix.demo import topology

    message = topology.topology_refusal(topology.Topology(executor=topology.CELERY), "postgresql://h/db")
    assert message is not None
    assert "scripts/redis.sh" not in message or "from a checkout" in message


def test_the_demo_reads_each_fix_state_off_every_start_line() -> None:
    """The demo shows what the scheduler logged per fix, switched off too (the off line keeps the states)."""
    from airflow_heartbeat_fix.demo import logs
    from airflow_heartbeat_fix.detection import FixDecision

    states = itertools.cycle([FixState.DISABLED, FixState.NOT_NEEDED, FixState.UNSUPPORTED])
    reason = "a reason; with a semicolon"
    decided = {
        fix: FixDecision(fix, state, reason) for fix, state in zip(SCHEDULER_FIXES, states, strict=False)
    }
    line = activation.summary(decided, "3.4.0b2", switched_off=True)
    assert line.startswith("airflow-heartbeat-fix on Airflow 3.4.0b2: off by configuration")
    assert logs.find_fix_summary(f"2026-12-02T00:00:00Z [info     ] {line} [airflow_heartbeat_fix]\n") == {
        fix: d.state.value for fix, d in decided.items()
    }
