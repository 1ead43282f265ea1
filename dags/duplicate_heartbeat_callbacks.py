"""Reproduce duplicate failure/retry callbacks (and email alerts) after a task heartbeat timeout.

Airflow <= 3.3.x (upstream thread "Fix duplicate heartbeat-timeout task callbacks"): the scheduler's
heartbeat-timeout purge sends a ``TaskCallbackRequest`` but leaves the task instance RUNNING. Until the
executor event finally fails it, the scheduler treats the same try as still running: the executor-event
path ("killed externally") and any later heartbeat scan send another ``on_retry_callback`` /
``on_failure_callback`` (and email request) for the same try.

The task freezes its own supervisor with SIGSTOP so heartbeats stop like a hung worker. With
``retries=1`` a correct scheduler runs exactly one ``on_retry_callback`` (try 1) and one
``on_failure_callback`` (try 2), and sends one email request per try.

Every callback invocation and every email is written down as one JSON line in ``$AIRFLOW_HOME`` by
``airflow_heartbeat_fix.demo.records`` (the demo points ``[email] email_backend`` there).
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timedelta

from airflow.sdk import dag, task

from airflow_heartbeat_fix.demo.records import record_failure, record_retry


@dag(
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["repro"],
    default_args={
        "retries": 1,
        "retry_delay": timedelta(seconds=1),
        "on_failure_callback": record_failure,
        "on_retry_callback": record_retry,
        "email": ["alerts@example.com"],
        "email_on_failure": True,
        "email_on_retry": True,
    },
)
def duplicate_heartbeat_callbacks() -> None:
    @task
    def stall() -> None:
        # Stop the supervisor, not this process: heartbeats stop while the task "runs" forever.
        os.kill(os.getppid(), signal.SIGSTOP)
        time.sleep(600)

    stall()


duplicate_heartbeat_callbacks()
