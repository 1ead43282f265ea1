"""
A listener that keeps one row per Dag and, on a failed try, writes its own Dag's row and then the row of
the paired Dag (a hand-off record), each through its own ``Variable.set``: two schedulers failing a try
of each Dag at once write the same two rows in opposite orders. Between the writes it waits, bounded,
until the other's first write is visible, so the two overlap. What it did goes into a ``log`` row.

Copied into a plugins folder by the tests (``testing.plugins``); Airflow imports it by its file name.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from airflow.listeners import hookimpl
from airflow.models.log import Log
from airflow.models.variable import Variable
from airflow.plugins_manager import AirflowPlugin
from airflow.utils.session import create_session

#: The two Dags whose listeners write each other's rows, and the ``log`` rows this plugin writes.
PAIR = ("heartbeat_fix_pair_left", "heartbeat_fix_pair_right")
PAIR_EVENT = "heartbeat-fix-pair"
#: How long one side waits to see the other's first write.
WAIT_BOUND = 10.0


def row_key(dag_id: str) -> str:
    return f"{dag_id}_row"


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    mine = task_instance.dag_id
    if mine not in PAIR:
        return
    other = PAIR[1 - PAIR.index(mine)]
    Variable.set(row_key(mine), f"written by {mine}")
    started = time.monotonic()
    while Variable.get(row_key(other), default_var=None) is None and time.monotonic() - started < WAIT_BOUND:
        time.sleep(0.05)
    saw = "saw" if Variable.get(row_key(other), default_var=None) is not None else "never saw"
    Variable.set(row_key(other), f"handed off by {mine}")
    with create_session() as session:
        session.add(
            Log(
                event=PAIR_EVENT,
                dag_id=mine,
                extra=f"wrote both; {saw} the other's row after {time.monotonic() - started:.2f}s",
            )
        )


class HeartbeatFixPairListenerPlugin(AirflowPlugin):
    name = "heartbeat_fix_pair_listener"
    listeners = [sys.modules[__name__]]  # noqa: RUF012  (the way AirflowPlugin declares them)
