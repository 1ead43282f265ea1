"""Process glue for the demo: start Airflow components, and stop every process they left behind.

Stopping the components is not enough: LocalExecutor workers, the task supervisors the demo Dags freeze
with SIGSTOP, and their task processes (which Airflow 3.4 puts in process groups of their own) outlive a
killed parent. So :class:`Processes` records every descendant of what it started while the run goes on
(:meth:`Processes.track`), and :meth:`Processes.stop_all` resumes and ends all of them, plus anything
still carrying the run's marker in its environment (``HEARTBEAT_FIX_DEMO_MARKER``; processes that
rewrite their title can hide it, hence the tracking).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from pathlib import Path

MARKER_ENV = "HEARTBEAT_FIX_DEMO_MARKER"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= int(response.status) < 300
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _has_marker(proc: psutil.Process, needle: str) -> bool:
    try:
        return proc.environ().get(MARKER_ENV) == needle
    except (psutil.Error, OSError):
        return False


def marked_processes(marker: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``marker`` (never this process)."""
    me = os.getpid()
    return [p for p in psutil.process_iter() if p.pid != me and _has_marker(p, marker)]


def _popen_in_group(
    argv: list[str], env: dict[str, str], log_file: IO[bytes], cwd: Path | None
) -> subprocess.Popen[bytes]:
    """``argv`` in a session of its own (Ctrl-C reaches the caller only), its output into ``log_file``."""
    return subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@dataclass
class Component:
    """
    One long-running command in a process group of its own, its stdout and stderr in ``log_path``; the
    demo's components and the tests' real schedulers.
    """

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    @classmethod
    def start(
        cls, name: str, argv: list[str], env: dict[str, str], log_path: Path, *, cwd: Path | None = None
    ) -> Component:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = log_path.open("ab")
        return cls(name, _popen_in_group(argv, env, log_file, cwd), log_path, log_file)

    def exit_code(self) -> int | None:
        return self.popen.poll()

    def read_log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.read_log().splitlines()[-lines:])

    def kill_group(self) -> None:
        """SIGKILL the command's whole process group at once, as a host or container crash would."""
        signal_group(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM the group, SIGKILL it after ``grace`` seconds; any number of times."""
        signal_group(self.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.popen.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        self.kill_group()
        self.log_file.close()


@dataclass
class Processes:
    """Starts marked subprocesses and stops all of them, including what they started."""

    marker: str
    components: dict[str, Component] = field(default_factory=dict)
    tracked: dict[int, psutil.Process] = field(default_factory=dict)

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, MARKER_ENV: self.marker}

    def start(self, name: str, argv: list[str], env: dict[str, str], log_path: Path, cwd: Path) -> Component:
        component = Component.start(name, argv, self.env(env), log_path, cwd=cwd)
        self.components[name] = component
        return component

    def run(
        self, argvs: list[list[str]], env: dict[str, str], log_path: Path, cwd: Path, timeout: float
    ) -> list[int]:
        """Run short commands concurrently (output appended to ``log_path``); their exit codes.

        A command still running after ``timeout`` seconds is killed and reports ``-SIGKILL``.
        """
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log_file:
            popens = [_popen_in_group(argv, self.env(env), log_file, cwd) for argv in argvs]
            deadline = time.monotonic() + timeout
            try:
                for popen in popens:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            finally:
                for popen in popens:
                    if popen.poll() is None:  # timed out (or interrupted): -SIGKILL
                        signal_group(popen.pid, signal.SIGKILL)
                        popen.wait()
            return [int(popen.returncode) for popen in popens]

    def kill(self, name: str) -> None:
        """SIGKILL the component ``name`` and its process group at once (what it started stays tracked)."""
        self.track()
        self.components[name].kill_group()

    def track(self) -> None:
        """Remember every live descendant of the started processes (call it every second or so)."""
        for component in self.components.values():
            try:
                root = psutil.Process(component.popen.pid)
                found = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in found:
                self.tracked.setdefault(proc.pid, proc)

    def _alive(self) -> list[psutil.Process]:
        self.track()
        procs = {p.pid: p for p in self.tracked.values() if _is_running(p)}
        for proc in marked_processes(self.marker):
            procs.setdefault(proc.pid, proc)
        return list(procs.values())

    def stop_all(self, grace: float = 3.0) -> None:
        """SIGCONT + SIGTERM everything started or tracked, SIGKILL what is left after ``grace`` seconds."""
        for proc in self._alive():
            _send(proc, signal.SIGCONT)
            _send(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self._alive():
            time.sleep(0.2)
        for _ in range(20):
            left = self._alive()
            if not left:
                break
            for proc in left:
                _send(proc, signal.SIGCONT)
                _send(proc, signal.SIGKILL)
            psutil.wait_procs(left, timeout=1.0)
        for component in self.components.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                component.popen.wait(timeout=2.0)
            component.log_file.close()

    def leftovers(self) -> list[int]:
        return sorted(p.pid for p in self._alive())


def _is_running(proc: psutil.Process) -> bool:
    """Still running, and still the process that was recorded (``is_running`` checks the start time)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _send(proc: psutil.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(psutil.Error, OSError):
        proc.send_signal(sig)


def signal_group(pid: int, sig: signal.Signals) -> None:
    """``sig`` to the process group ``pid`` leads, if it is still there."""
    with contextlib.suppress(OSError):
        os.killpg(pid, sig)
