"""A task that outlives Redis's visibility timeout: the demo's ``--scenario redelivery`` (CeleryExecutor).

Redis redelivers a Celery message that no worker has acknowledged within the broker's visibility timeout
(the demo shortens it to 20 s), while the first copy still runs. The copy it redelivers carries the same
workload token, which has expired (the demo shortens ``[scheduler] task_queued_timeout``, the token's
lifetime, to 10 s): the Execution API refuses its ``/run`` (403), the Celery task fails, and the
CeleryExecutor reports FAILED for the try whose first copy is running and heartbeating. Stock Airflow
fails that live try (``on_retry_callback``; its worker is SIGKILLed at its next heartbeat); on 3.4.0b1/b2
the scheduler crashes on the retry instead, and again after every restart. A correct scheduler lets the
try finish: it succeeds in its first try, with no callback.

kombu's Redis transport looks for such messages every 100 s, so the duplicate comes 20 to 120 s into the
task; the task sleeps ``REDELIVERY_TASK_SECONDS`` (150). Callbacks are written down by
``airflow_heartbeat_fix.demo.records``.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from airflow.sdk import dag, task

from airflow_heartbeat_fix.demo.records import record_failure, record_retry
from airflow_heartbeat_fix.demo.result import REDELIVERY_TASK_SECONDS


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
    },
)
def redelivered_task() -> None:
    @task
    def work() -> None:
        time.sleep(REDELIVERY_TASK_SECONDS)

    work()


redelivered_task()
