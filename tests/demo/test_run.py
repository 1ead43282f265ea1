"""When a run stops watching."""

from __future__ import annotations

import pytest

from airflow_heartbeat_fix.demo import run


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
