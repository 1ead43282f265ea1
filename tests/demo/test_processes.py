"""Starting, running and stopping the components' process groups."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
import uuid
from typing import TYPE_CHECKING

import psutil

from airflow_heartbeat_fix.demo import processes

if TYPE_CHECKING:
    from pathlib import Path

FREEZER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    # Like a task: a child in its own session that stops its parent (the "supervisor").
    task = "import os, signal, time; os.kill(os.getppid(), signal.SIGSTOP); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", task], start_new_session=True)
    time.sleep(600)
    """
)


def test_stop_all_ends_frozen_supervisors_and_their_children(tmp_path: Path) -> None:
    procs = processes.Processes(marker=f"test-{os.getpid()}-{time.time()}")
    component = procs.start(
        "freezer", [sys.executable, "-c", FREEZER], dict(os.environ), tmp_path / "freezer.log", tmp_path
    )
    parent = psutil.Process(component.popen.pid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and parent.status() != psutil.STATUS_STOPPED:
        time.sleep(0.1)
    assert parent.status() == psutil.STATUS_STOPPED
    procs.track()
    (child,) = parent.children()
    assert child.environ()[processes.MARKER_ENV] == procs.marker

    procs.stop_all(grace=1.0)

    assert procs.leftovers() == []
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert component.exit_code() is not None


def test_run_returns_exit_codes_and_logs(tmp_path: Path) -> None:
    procs = processes.Processes(marker=f"test-run-{uuid.uuid4()}")
    log = tmp_path / "run.log"
    argvs = [[sys.executable, "-c", "print('hi')"], [sys.executable, "-c", "raise SystemExit(3)"]]
    assert procs.run(argvs, dict(os.environ), log, tmp_path, timeout=60) == [0, 3]
    assert "hi" in log.read_text()


def test_run_kills_a_command_that_times_out(tmp_path: Path) -> None:
    procs = processes.Processes(marker=f"test-timeout-{uuid.uuid4()}")
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    started = time.monotonic()
    codes = procs.run([argv], dict(os.environ), tmp_path / "t.log", tmp_path, timeout=0.5)
    assert codes == [-signal.SIGKILL]
    assert time.monotonic() - started < 10
    assert procs.leftovers() == []
