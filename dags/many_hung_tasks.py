"""Fifty task instances whose supervisors freeze at once: the demo's ``--scenario many``.

Both schedulers of an HA pair then purge fifty heartbeat timeouts in the same few seconds, with their
row locks, callback requests and executor events interleaved. A correct scheduler pair fails every
task instance (``retries=0``) and runs exactly one ``on_failure_callback`` per task instance, without
a deadlock or a crash. Each callback is written down, with its map index, by
``airflow_heartbeat_fix.demo.records``.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime

from airflow.sdk import dag, task

from airflow_heartbeat_fix.demo.records import record_failure
from airflow_heartbeat_fix.demo.result import MANY_TASKS as HUNG_TASKS


@dag(
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["repro"],
    max_active_tasks=HUNG_TASKS,
    default_args={"retries": 0, "on_failure_callback": record_failure},
)
def many_hung_tasks() -> None:
    @task
    def stall(n: int) -> None:
        # Stop the supervisor, not this process: heartbeats stop while the task "runs" forever.
        os.kill(os.getppid(), signal.SIGSTOP)
        time.sleep(600)

    stall.expand(n=list(range(HUNG_TASKS)))


many_hung_tasks()
