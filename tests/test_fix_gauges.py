"""The running scheduler's signal: a gauge per fix, read off a real StatsD socket."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import pytest

from airflow_heartbeat_fix import activation
from airflow_heartbeat_fix.detection import FIXES, FixState
from airflow_heartbeat_fix.metrics import gauge_name
from tests.test_activation import AIRFLOW, STATUS, _run

if TYPE_CHECKING:
    from collections.abc import Iterator

#: The gauges are the scheduler's, whatever its metadata database: each release's SQLite cell runs them.
pytestmark = [
    pytest.mark.mode_independent,
    pytest.mark.backend("sqlite"),
    pytest.mark.usefixtures("scheduler_rows_cleared"),
]

PREFIX = "airflow"


@pytest.fixture
def statsd() -> Iterator[socket.socket]:
    """A StatsD listener: a UDP socket on 127.0.0.1 that the scheduler's StatsD client sends to."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock


def _metrics_env(sock: socket.socket) -> dict[str, str]:
    return {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(sock.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_PREFIX": PREFIX,
        # A heartbeat every second, so three scheduler loops carry more than the start's gauges.
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
    }


def _received(sock: socket.socket) -> list[str]:
    """Every StatsD line sent so far (the scheduler has exited: nothing more is on its way)."""
    sock.settimeout(0.5)
    lines: list[str] = []
    try:
        while True:
            lines += sock.recv(65535).decode().splitlines()
    except TimeoutError:
        return lines


def _gauges(lines: list[str]) -> dict[str, list[str]]:
    """``{fix: [value, ...]}`` of the ``heartbeat_fix.fix.*`` gauges, in the order they came."""
    found: dict[str, list[str]] = {}
    for fix in FIXES:
        metric = f"{PREFIX}.{gauge_name(fix)}:"
        found[fix] = [line[len(metric) :].removesuffix("|g") for line in lines if line.startswith(metric)]
    return {fix: values for fix, values in found.items() if values}


def test_fixed_scheduler_emits_a_gauge_per_fix_at_start_and_every_heartbeat(statsd: socket.socket) -> None:
    decided = activation.decide(activation.facts(), enabled=True)
    result = _run(
        [AIRFLOW, "scheduler", "--num-runs", "3", "--skip-serve-logs"], enabled=True, env=_metrics_env(statsd)
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    lines = _received(statsd)
    assert f"{PREFIX}.scheduler_heartbeat:1|c" in lines, lines  # the listener hears Airflow's own metrics
    gauges = _gauges(lines)
    if not any(d.state is FixState.ACTIVE for d in decided.values()):
        assert gauges == {}  # nothing to carry: Airflow's own runner, no gauge
        return
    expected = {fix: "1" if d.state is FixState.ACTIVE else "0" for fix, d in decided.items()}
    assert {fix: set(values) for fix, values in gauges.items()} == {fix: {v} for fix, v in expected.items()}
    # At the loop's start and again with the heartbeats that followed.
    assert all(len(values) >= 2 for values in gauges.values()), gauges


def test_scheduler_switched_off_emits_no_fix_gauge(statsd: socket.socket) -> None:
    """Off by configuration, the wrapper runs Airflow's own runner: the gauges stop, as for a lost package."""
    result = _run(
        [STATUS, "scheduler", "--num-runs", "3", "--skip-serve-logs"], enabled=False, env=_metrics_env(statsd)
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    lines = _received(statsd)
    assert f"{PREFIX}.scheduler_heartbeat:1|c" in lines, lines
    assert _gauges(lines) == {}
