"""Reproduce the scheduler crash when a heartbeat-timed-out task still has retries left.

Airflow 3.4.0b1/b2 (upstream thread "scheduler dies with UniqueViolation on task_instance_current_key"):
when the scheduler's heartbeat-timeout purge sends its task callback request, ``DatabaseCallbackSink.send``
commits and closes the scheduler loop's own scoped session. The task instance that is about to be
retried is detached, so ``prepare_db_for_next_try`` cannot archive try 1 and the insert of try 2
collides with the still-current row: ``UniqueViolation`` (PostgreSQL) or ``UNIQUE constraint failed``
(SQLite) on ``task_instance_current_key``. The scheduler loop exits, and restarts crash again.

The task freezes its own supervisor (the process that heartbeats to the API server) with SIGSTOP, the
way a hung worker would, so the scheduler sees no heartbeat after
``[scheduler] task_instance_heartbeat_timeout`` seconds. No callback needs to be configured: the purge
always sends a task callback request.

Expected with the fix (or on Airflow 3.3.x): try 1 is FAILED and archived for retry, try 2 is created
(UP_FOR_RETRY, then running), and the scheduler keeps running.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timedelta

from airflow.sdk import dag, task


@dag(
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["repro"],
    default_args={"retry_delay": timedelta(seconds=1)},
)
def retry_after_heartbeat_timeout() -> None:
    @task(retries=1)
    def stall() -> None:
        # Stop the supervisor, not this process: heartbeats stop while the task "runs" forever.
        os.kill(os.getppid(), signal.SIGSTOP)
        time.sleep(600)

    stall()


retry_after_heartbeat_timeout()
