"""Activation: a plain ``airflow scheduler`` runs the fixed classes; the off switch leaves Airflow as is."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from airflow_heartbeat_fix import activation
from airflow_heartbeat_fix.detection import FixState

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
STATUS = str(Path(sys.executable).with_name("airflow-heartbeat-fix"))


def _run(argv: list[str], *, enabled: bool, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    """
    Run an Airflow command and wait for *it* to exit, not for every process it forked.

    Output goes to files rather than pipes: a leftover child (an executor worker) holding an inherited
    pipe would keep ``communicate()`` waiting long after the command itself exited. The command runs in
    its own session, killed as a group afterwards. If it hangs, ``PYTHONFAULTHANDLER`` plus SIGABRT sent
    to the whole group dumps every thread's stack, the command's and its children's, into the failure
    message.
    """
    env = {
        **os.environ,
        "AIRFLOW__HEARTBEAT_FIX__ENABLED": str(enabled),
        "PYTHONFAULTHANDLER": "1",
        # One LocalExecutor worker. Stock LocalExecutor.end() (3.2.2 to 3.4.0b2) puts one shutdown message
        # per worker it sees alive, checking each worker while earlier messages are already being taken:
        # a worker that took one and exited before the loop reaches it is skipped, so one message too few
        # is sent and end() joins the last idle worker forever (about once in 15 runs on 2 busy cores).
        # Executor shutdown is not what these tests check; with one worker the race cannot happen.
        "AIRFLOW__CORE__PARALLELISM": "1",
    }
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            hung = False
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(proc.pid, signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if hung:
        pytest.fail(f"{argv} hung for {timeout}s\n--- stdout ---\n{stdout[-3000:]}\n--- stderr ---\n{stderr}")
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def _needed_fixes() -> list[str]:
    decided = activation.decide(activation.facts(), enabled=True)
    return [fix for fix, decision in decided.items() if decision.state is FixState.ACTIVE]


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "off-switch"])
def test_plain_airflow_scheduler_runs_fixed_classes(enabled: bool) -> None:
    needed = _needed_fixes()
    result = _run([AIRFLOW, "scheduler", "--num-runs", "1", "--skip-serve-logs"], enabled=enabled)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    ran_fixed = "airflow-heartbeat-fix: scheduler running with " + ", ".join(needed) in output
    assert ran_fixed is (enabled and bool(needed)), output[-4000:]
    if not enabled:
        assert "HeartbeatFixSchedulerJobRunner" not in output


def test_explicit_scheduler_wrapper_activates_once() -> None:
    needed = _needed_fixes()
    result = _run([STATUS, "scheduler", "--num-runs", "1", "--skip-serve-logs"], enabled=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert output.count(f"airflow-heartbeat-fix on Airflow {activation.facts().version}") == 1, output[-4000:]
    assert ("airflow-heartbeat-fix: scheduler running with " + ", ".join(needed) in output) is bool(needed)


def test_status_reports_each_fix() -> None:
    result = _run([STATUS, "status"], enabled=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for fix, decision in activation.decide(activation.facts(), enabled=True).items():
        assert f"{fix}: {decision.state.value}" in result.stdout
        assert decision.reason in result.stdout


def test_status_with_off_switch_says_disabled() -> None:
    result = _run([STATUS, "status"], enabled=False, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "[heartbeat_fix] enabled = False" in result.stdout
    assert ": active" not in result.stdout


def test_install_is_idempotent_and_uninstall_restores() -> None:
    from airflow.callbacks import database_callback_sink
    from airflow.cli.commands import scheduler_command

    before = (scheduler_command.SchedulerJobRunner, database_callback_sink.DatabaseCallbackSink)
    activation.install()
    assert (scheduler_command.SchedulerJobRunner, database_callback_sink.DatabaseCallbackSink) == before
    activation.uninstall()
    try:
        originals = activation._originals()
        assert scheduler_command.SchedulerJobRunner is originals["runner"]
        assert database_callback_sink.DatabaseCallbackSink is originals["sink"]
    finally:
        if activation.is_enabled():
            activation.install()
    assert (scheduler_command.SchedulerJobRunner, database_callback_sink.DatabaseCallbackSink) == before


def test_airflow_plugins_lists_heartbeat_fix() -> None:
    import json

    result = _run([AIRFLOW, "plugins", "--output", "json"], enabled=True, timeout=120)
    assert result.returncode == 0, result.stderr
    names = [plugin["name"] for plugin in json.loads(result.stdout[result.stdout.index("[") :])]
    assert names.count("heartbeat_fix") == 1
