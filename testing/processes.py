"""
A command run to its end within a timeout, in a process group of its own so that what it forks ends
with it. A long-running one is the demo's :class:`~airflow_heartbeat_fix.demo.processes.Component`.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import tempfile

from airflow_heartbeat_fix.demo.processes import signal_group


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
            signal_group(proc.pid, signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        finally:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read()), hung
