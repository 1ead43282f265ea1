"""
The running scheduler's own signal: which fixes are in force, as one gauge per fix through Airflow's Stats.

A log line is read once; a gauge is on the dashboard for as long as the scheduler runs, so a scheduler
that lost its fixes (an image rebuilt without the package, ``[heartbeat_fix] enabled = False``) shows
as a gauge that stops arriving. Emitted when the scheduler loop starts (after the scheduler has set
up its metrics backend) and on every scheduler heartbeat, next to Airflow's own
``scheduler_heartbeat`` counter.
"""

from __future__ import annotations

from typing import Any

from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

from airflow_heartbeat_fix import nested_sessions
from airflow_heartbeat_fix._compat import Stats
from airflow_heartbeat_fix.detection import FIXES, NESTED_FIX

#: ``heartbeat_fix.fix.<fix>``: 1 while the scheduler runs with that fix in force, 0 when it runs without it
#: (or when ``create_session`` no longer reaches ``nested_sessions_join_loop``).
GAUGE_PREFIX = "heartbeat_fix.fix."


def gauge_name(fix: str) -> str:
    return f"{GAUGE_PREFIX}{fix}"


class FixGaugesMixin(SchedulerJobRunner):
    """Announces, at start and per heartbeat, which fixes this runner carries; outermost in the MRO."""

    heartbeat_fixes: tuple[str, ...] = ()

    def emit_fix_gauges(self) -> None:
        in_force = set(self.heartbeat_fixes)
        if NESTED_FIX in in_force and not nested_sessions.in_force():
            in_force.discard(NESTED_FIX)
        for fix in FIXES:
            Stats.gauge(gauge_name(fix), 1 if fix in in_force else 0)

    def _run_scheduler_loop(self) -> None:
        self.emit_fix_gauges()
        super()._run_scheduler_loop()

    def heartbeat_callback(self, *args: Any, **kwargs: Any) -> None:
        super().heartbeat_callback(*args, **kwargs)
        self.emit_fix_gauges()
