"""
PHASE-1 PROTOTYPE launcher (issue 32): ``airflow scheduler ARGS`` with the stale-executor-event prototype
mixin on top of whatever activation installed.

    python -m benchmarks.prototype_scheduler scheduler --skip-serve-logs
"""

from __future__ import annotations

import sys


def main() -> None:
    from airflow.cli.commands import scheduler_command  # activation runs here, as in `airflow scheduler`

    from airflow_heartbeat_fix.stale_events import StaleExecutorEventsPrototypeMixin

    base = scheduler_command.SchedulerJobRunner
    scheduler_command.SchedulerJobRunner = type(  # type: ignore[misc]
        "PrototypeSchedulerJobRunner",
        (StaleExecutorEventsPrototypeMixin, base),
        {"__module__": __name__, "_logger_name": base._logger_name or f"{base.__module__}.{base.__name__}"},
    )
    from airflow.__main__ import main as airflow_main

    sys.argv = ["airflow", *sys.argv[1:]]
    airflow_main()


if __name__ == "__main__":
    main()
