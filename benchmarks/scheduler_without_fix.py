"""
``airflow scheduler ARGS`` with the package's fixes minus one: the baseline of ``benchmarks.kill_to_retry``
where stock Airflow cannot be one (3.4.0b1/b2 crash on the retry it measures).

    python -m benchmarks.scheduler_without_fix heartbeat_judged_executor_events scheduler --skip-serve-logs
"""

from __future__ import annotations

import sys


def main() -> None:
    from airflow.cli.commands import scheduler_command  # activation runs here, as in `airflow scheduler`
    from airflow.jobs import scheduler_job_runner

    from airflow_heartbeat_fix.activation import installed_runner
    from airflow_heartbeat_fix.scheduler import build_runner_class

    left_out, argv = sys.argv[1], sys.argv[2:]
    runner = installed_runner()
    if runner is not None:
        fixes = tuple(fix for fix in runner.heartbeat_fixes if fix != left_out)  # type: ignore[attr-defined]
        base = scheduler_job_runner.SchedulerJobRunner
        scheduler_command.SchedulerJobRunner = build_runner_class(fixes, base=base)  # type: ignore[misc]
    from airflow.__main__ import main as airflow_main

    sys.argv = ["airflow", *argv]
    airflow_main()


if __name__ == "__main__":
    main()
