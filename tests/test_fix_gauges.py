"""The running scheduler's signal: a gauge per fix, read off a real StatsD socket."""

from __future__ import annotations

import json
import socket
from typing import TYPE_CHECKING

import pytest

from airflow_heartbeat_fix import activation
from airflow_heartbeat_fix.detection import DAG_PROCESSOR_FIXES, FIXES, NESTED_FIX, SCHEDULER_FIXES, FixState
from airflow_heartbeat_fix.metrics import gauge_name
from testing.plugins import SESSION_TRACING_PLUGIN, install_plugin_folder
from tests.test_activation import AIRFLOW, STATUS, _run

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

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
    # The scheduler's own fixes only: the Dag processor emits its own.
    expected = {fix: "1" if decided[fix].state is FixState.ACTIVE else "0" for fix in SCHEDULER_FIXES}
    assert {fix: set(values) for fix, values in gauges.items()} == {fix: {v} for fix, v in expected.items()}
    # At the loop's start and again with the heartbeats that followed.
    assert all(len(values) >= 2 for values in gauges.values()), gauges


def test_fixed_dag_processor_emits_a_gauge_per_fix_of_its_own(statsd: socket.socket, tmp_path: Path) -> None:
    decided = activation.decide(activation.facts(), enabled=True)
    env = {**_metrics_env(statsd), "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path)}
    result = _run([AIRFLOW, "dag-processor", "--num-runs", "2"], enabled=True, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    lines = _received(statsd)
    gauges = _gauges(lines)
    expected = {fix: "1" if decided[fix].state is FixState.ACTIVE else "0" for fix in DAG_PROCESSOR_FIXES}
    assert {fix: set(values) for fix, values in gauges.items()} == {fix: {v} for fix, v in expected.items()}


def test_scheduler_switched_off_emits_no_fix_gauge(statsd: socket.socket) -> None:
    """Off by configuration, the wrapper runs Airflow's own runner: the gauges stop, as for a lost package."""
    result = _run(
        [STATUS, "scheduler", "--num-runs", "3", "--skip-serve-logs"], enabled=False, env=_metrics_env(statsd)
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    lines = _received(statsd)
    assert f"{PREFIX}.scheduler_heartbeat:1|c" in lines, lines
    assert _gauges(lines) == {}


@pytest.mark.parametrize(
    ("tracing", "nested_gauge"),
    [
        pytest.param("wrap", "1", id="a wrapper that calls Airflow's"),
        pytest.param("replace", "0", id="a replacement"),
    ],
)
def test_a_plugin_replacing_create_session_after_activation_shows_in_the_gauge_and_the_log(
    statsd: socket.socket, tmp_path: Path, tracing: str, nested_gauge: str
) -> None:
    """
    A plugin loaded at scheduler start replaces create_session: if its replacement calls Airflow's, the
    nested-session fix stays in force; if not, the log says so and the fix's gauge drops to 0 (the other
    fixes carry on), and status, loading the same plugins, reports the fix unsupported.
    """
    assert activation.decide(activation.facts(), enabled=True)[NESTED_FIX].state is FixState.ACTIVE
    plugins = install_plugin_folder(tmp_path / "plugins", SESSION_TRACING_PLUGIN)
    env = {
        **_metrics_env(statsd),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins),
        "HEARTBEAT_FIX_TRACING": tracing,
    }
    result = _run([AIRFLOW, "scheduler", "--num-runs", "3", "--skip-serve-logs"], enabled=True, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    gauges = _gauges(_received(statsd))
    assert set(gauges[NESTED_FIX]) == {nested_gauge}, gauges
    warned = "which does not call Airflow's: sessions nested in the scheduler loop are not recognised"
    assert (warned in result.stdout + result.stderr) is (tracing == "replace")
    status = _run([STATUS, "status", "-o", "json"], enabled=True, env=env, timeout=120)
    nested = next(row for row in json.loads(status.stdout)["fixes"] if row["fix"] == NESTED_FIX)
    expected = FixState.ACTIVE.value if tracing == "wrap" else FixState.UNSUPPORTED.value
    assert nested["state"] == expected, nested
