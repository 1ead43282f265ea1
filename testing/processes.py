"""
Commands in a process group of their own, so that what they fork ends with them: a command run to its
end within a timeout, or one kept running until it is killed or stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def run_in_group(
    argv: list[str], env: dict[str, str], timeout: float
) -> tuple[subprocess.CompletedProcess[str], bool]:
    """
    Run ``argv`` and wait for *it* to exit, not for every process it forked; ``(result, hung)``.

    Output goes to files rather than pipes: a leftover child (an executor worker) holding an inherited
    pipe would keep ``communicate()`` waiting long after the command itself exited. The command runs in
    its own session, killed as a group afterwards. If it hangs, SIGABRT goes to the whole group first, so
    that with ``PYTHONFAULTHANDLER`` set every thread's stack, the command's and its children's, is in
    its output.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, start_new_session=True)
        hung = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            hung = True
            _signal_group(proc.pid, signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        finally:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read()), hung


@dataclass
class GroupedProcess:
    """A long-running command in a process group of its own, its stdout and stderr in ``log_path``."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    @classmethod
    def start(
        cls, name: str, argv: list[str], env: dict[str, str], log_path: Path, *, cwd: Path | None = None
    ) -> GroupedProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = log_path.open("ab")
        popen = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return cls(name, popen, log_path, log_file)

    def read_log(self) -> str:
        """Everything it wrote so far (the file exists from the start)."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.read_log().splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the whole process group at once, as a host or container crash would."""
        _signal_group(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM the group, SIGKILL it after ``grace`` seconds; any number of times."""
        _signal_group(self.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.popen.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        self.kill()
        self.log_file.close()
