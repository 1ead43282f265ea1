"""
The running process's own signal: which fixes are in force, as one gauge per fix through Airflow's Stats.

A log line is read once; a gauge is on the dashboard for as long as the process runs, so a scheduler or
Dag processor that lost its fixes (an image rebuilt without the package, ``[heartbeat_fix] enabled =
False``) shows as a gauge that stops arriving. Each process emits its own target's fixes only (the
scheduler's six, the Dag processor's three): when its loop starts (after it has set up its metrics backend)
and on each of its heartbeats, next to Airflow's own ``scheduler_heartbeat`` / ``dag_processor_heartbeat``.
This module imports no scheduler code at run time, so the Dag processor can use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_heartbeat_fix._compat import Stats
from airflow_heartbeat_fix.detection import NESTED_FIX, SCHEDULER_FIXES

if TYPE_CHECKING:
    from collections.abc import Collection

    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner as _SchedulerBase
else:
    _SchedulerBase = object

#: ``heartbeat_fix.fix.<fix>``: 1 while the scheduler runs with that fix in force, 0 when it runs without it
#: (or when ``create_session`` no longer reaches ``nested_sessions_join_loop``).
GAUGE_PREFIX = "heartbeat_fix.fix."


def gauge_name(fix: str) -> str:
    return f"{GAUGE_PREFIX}{fix}"


def emit_fix_gauges(fixes: tuple[str, ...], in_force: Collection[str]) -> None:
    """One gauge per fix of ``fixes``: 1 if it is in force in this process, else 0."""
    for fix in fixes:
        Stats.gauge(gauge_name(fix), 1 if fix in in_force else 0)


class FixGaugesMixin(_SchedulerBase):
    """Announces, at start and per heartbeat, which fixes this runner carries; outermost in the MRO."""

    heartbeat_fixes: tuple[str, ...] = ()

    def emit_fix_gauges(self) -> None:
        from airflow_heartbeat_fix import nested_sessions

        in_force = set(self.heartbeat_fixes)
        if NESTED_FIX in in_force and not nested_sessions.in_force():
            in_force.discard(NESTED_FIX)
        emit_fix_gauges(SCHEDULER_FIXES, in_force)

    def _run_scheduler_loop(self) -> None:
        self.emit_fix_gauges()
        super()._run_scheduler_loop()

    def heartbeat_callback(self, *args: Any, **kwargs: Any) -> None:
        super().heartbeat_callback(*args, **kwargs)
        self.emit_fix_gauges()
