"""When a run stops watching, what a run is given, and what it reads off its schedulers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from airflow_heartbeat_fix.demo import run

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"crashed_for": 5.0}, "scheduler crashed"),
        ({"crashed_for": 1.0}, None),
        ({"exited": True}, "scheduler exited"),
        ({"terminal_for": 8.0, "quiet_for": 4.0}, "Dag runs finished, callbacks settled"),
        ({"terminal_for": 8.0, "quiet_for": 1.0}, None),
        ({"terminal_for": 2.0, "quiet_for": 2.0}, None),
        ({"terminal_for": 8.0, "quiet_for": 4.0, "callbacks_complete": False}, None),
        (
            {"terminal_for": 32.0, "quiet_for": 4.0, "callbacks_complete": False},
            "Dag runs finished, callbacks missing",
        ),
        ({"since_trigger": 120.0}, "timed out after 120 s"),
        ({}, None),
    ],
)
def test_should_stop(kwargs: dict[str, object], reason: str | None) -> None:
    args: dict[str, object] = {
        "since_trigger": 30.0,
        "crashed_for": None,
        "exited": False,
        "terminal_for": None,
        "quiet_for": 0.0,
        "callbacks_complete": True,
        "timeout": 120.0,
        "settle": 8.0,
        **kwargs,
    }
    assert run.should_stop(**args) == reason  # type: ignore[arg-type]


class _Scheduler:
    """What DemoRun watches of a scheduler component: its name, its log, whether it exited."""

    def __init__(self, name: str, log: str = "", code: int | None = None) -> None:
        self.name, self.log, self.code = name, log, code

    def read_log(self) -> str:
        return self.log

    def exit_code(self) -> int | None:
        return self.code


def _demo_run(tmp_path: Path, label: str) -> run.DemoRun:
    from airflow_heartbeat_fix.demo import cli

    config = cli.build_config(cli.parse_args(["--home", str(tmp_path)]))
    return run.DemoRun(config, label, {"needed_fixes": {"session_preserving_sink": "active"}})


@pytest.mark.parametrize("label", ["stock", "fixed"])
def test_a_run_gets_its_own_home_database_and_switch(tmp_path: Path, label: str) -> None:
    demo_run = _demo_run(tmp_path, label)

    assert demo_run.home == (tmp_path / label).resolve()
    assert demo_run.database_url == f"sqlite:///{demo_run.home}/airflow.db"
    assert demo_run.env["AIRFLOW__HEARTBEAT_FIX__ENABLED"] == str(label == "fixed")
    assert demo_run.env["AIRFLOW_HOME"] == str(demo_run.home)
    assert demo_run.result.needed_fixes == {"session_preserving_sink": "active"}
    assert not demo_run.home.exists(), "nothing is written before prepare()"


def test_watching_reads_a_crash_and_an_exit_off_the_schedulers(tmp_path: Path) -> None:
    from airflow_heartbeat_fix.detection import SCHEDULER_LOOP_CRASH

    demo_run = _demo_run(tmp_path, "stock")
    crashed = f"{SCHEDULER_LOOP_CRASH}\nsqlalchemy.exc.IntegrityError: UNIQUE constraint failed\n"
    watching = run._Watch(schedulers=[_Scheduler("scheduler", crashed)], kill_pending=False)  # type: ignore[list-item]

    demo_run._watch_schedulers(watching, now=demo_run._triggered[0] + 3.0)
    assert demo_run.result.scheduler.crashed and not demo_run.result.scheduler.alive
    assert demo_run.result.scheduler.error == "IntegrityError: UNIQUE constraint failed"
    assert watching.exit_code is None

    watching.schedulers[0].code = 1  # type: ignore[attr-defined]
    demo_run._watch_schedulers(watching, now=demo_run._triggered[0] + 4.0)
    assert demo_run.result.scheduler.exit_code == 1 == watching.exit_code
