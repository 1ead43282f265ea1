"""Reproduce duplicate failure/retry callbacks (and email alerts) after a task heartbeat timeout.

Airflow <= 3.3.x (upstream thread "Fix duplicate heartbeat-timeout task callbacks"): the scheduler's
heartbeat-timeout purge sends a ``TaskCallbackRequest`` but leaves the task instance RUNNING. Until the
executor event finally fails it, the scheduler treats the same try as still running: the executor-event
path ("killed externally") and any later heartbeat scan send another ``on_retry_callback`` /
``on_failure_callback`` (and email request) for the same try.

The task freezes its own supervisor with SIGSTOP so heartbeats stop like a hung worker. With
``retries=1`` a correct scheduler runs exactly one ``on_retry_callback`` (try 1) and one
``on_failure_callback`` (try 2), and sends one email request per try.

Every callback invocation appends one JSON line (dag_id, task_id, run_id, try_number, kind, time) to
``$AIRFLOW_HOME/callback_log.jsonl`` (callbacks run in the Dag processor). Email requests are counted
without a mail server by pointing ``[email] email_backend`` at
``airflow_heartbeat_fix.demo.email_backend.send_email``, which appends to ``$AIRFLOW_HOME/email_log.jsonl``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import dag, task

CALLBACK_LOG_NAME = "callback_log.jsonl"


def _callback_log_path() -> Path:
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return Path(home) / CALLBACK_LOG_NAME


def _record(kind: str, context: Any) -> None:
    ti = context["ti"]
    line = {
        "dag_id": ti.dag_id,
        "task_id": ti.task_id,
        "run_id": ti.run_id,
        "try_number": ti.try_number,
        "kind": kind,
        "time": time.time(),
        "pid": os.getpid(),
    }
    with _callback_log_path().open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def record_failure(context: Any) -> None:
    _record("on_failure_callback", context)


def record_retry(context: Any) -> None:
    _record("on_retry_callback", context)


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
