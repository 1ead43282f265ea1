"""
``airflow scheduler ARGS`` with the package's fixes minus one: the baseline of ``benchmarks.kill_to_retry``
where stock Airflow cannot be one (3.4.0b1/b2 crash on the retry it measures).

    python -m benchmarks.scheduler_without_fix heartbeat_judged_executor_events scheduler --skip-serve-logs

The start line still lists the left-out fix as activation decided it; the runner the command starts
does not carry it (its ``heartbeat_fix.fix.<fix>`` gauge is 0).
"""

from __future__ import annotations

import sys


def main() -> None:
    from airflow.jobs import scheduler_job_runner

    from airflow_heartbeat_fix._compat import airflow_cli_main, scheduler_command_module
    from airflow_heartbeat_fix.scheduler import build_runner_class

    left_out, argv = sys.argv[1], sys.argv[2:]
    scheduler_command = scheduler_command_module()  # activation runs here, as in `airflow scheduler`
    fixes = getattr(scheduler_command.SchedulerJobRunner, "heartbeat_fixes", ())
    if fixes:
        kept = tuple(fix for fix in fixes if fix != left_out)
        base = scheduler_job_runner.SchedulerJobRunner
        scheduler_command.SchedulerJobRunner = build_runner_class(kept, base=base)
    sys.argv = ["airflow", *argv]
    airflow_cli_main()()


if __name__ == "__main__":
    main()
