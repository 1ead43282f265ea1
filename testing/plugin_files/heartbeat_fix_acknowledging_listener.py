"""
An alerting listener as deployments write them (send and acknowledge): on a failed try it marks the alert
pending in a ``Variable``, hands the delivery to a worker thread of its own, and waits, bounded, until
the worker has read the pending mark and acknowledged it by writing the same ``Variable``. What it saw
goes into a ``log`` row: whether the acknowledgement came and how long the scheduler's thread waited,
the try's state as the listener was called, and what the worker read.

Copied into a plugins folder by the tests (``testing.plugins``); Airflow imports it by its file name.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from airflow.listeners import hookimpl
from airflow.models.log import Log
from airflow.models.variable import Variable
from airflow.plugins_manager import AirflowPlugin
from airflow.utils.session import create_session

#: The ``log`` rows this plugin writes.
ALERT_EVENT = "heartbeat-fix-alert"
#: How long the listener waits for its worker: bounded, as a careful plug-in author bounds it.
WAIT_BOUND = 10.0

_delivery = ThreadPoolExecutor(max_workers=1, thread_name_prefix="alert-delivery")


def alert_key(dag_id: str, task_id: str, try_number: int) -> str:
    return f"heartbeat_fix_alert_{dag_id}_{task_id}_{try_number}"


def _deliver(key: str) -> str:
    """The worker thread (sessions of its own): read the pending mark, then acknowledge it."""
    seen = Variable.get(key, default_var=None)
    Variable.set(key, "acknowledged")
    return str(seen)


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    state_when_called = str(task_instance.state)
    key = alert_key(task_instance.dag_id, task_instance.task_id, task_instance.try_number)
    Variable.set(key, "pending")
    started = time.monotonic()
    try:
        seen = _delivery.submit(_deliver, key).result(timeout=WAIT_BOUND)
        outcome = "acknowledged"
    except FutureTimeout:
        seen, outcome = "-", "not acknowledged"
    waited = time.monotonic() - started
    with create_session() as session:
        session.add(
            Log(
                event=ALERT_EVENT,
                dag_id=task_instance.dag_id,
                task_id=task_instance.task_id,
                run_id=task_instance.run_id,
                extra=f"{outcome}|{waited:.3f}|{state_when_called}|worker read {seen}",
            )
        )


class HeartbeatFixAcknowledgingListenerPlugin(AirflowPlugin):
    name = "heartbeat_fix_acknowledging_listener"
    listeners = [sys.modules[__name__]]  # noqa: RUF012  (the way AirflowPlugin declares them)
