"""
``--scenario kill-dag-processor``: the Dag processor is killed in the middle of an incident.

Three runs of this Dag fail at once (an upstream outage). The scheduler sends each run's
``on_failure_callback`` to the Dag processor as a callback request; the callback is an alert that takes a
few seconds (a pager's API). The demo SIGKILLs the Dag processor's process group once the first alert has
started, as the OOM killer or an evicted pod would, and starts it again. Stock Airflow deleted the
requests when the Dag processor fetched them: the alerts are lost, nothing says so. With the package each
request stays stored until its alert has run, and every alert runs once (the one interrupted runs again).

The alert writes down when it starts and when it is done (``airflow_heartbeat_fix.demo.records``).
"""

from __future__ import annotations

import time
from datetime import datetime

from airflow.sdk import dag, task

from airflow_heartbeat_fix.demo.records import DAG_CALLBACK_DONE, DAG_CALLBACK_STARTED, record_dag_failure

#: How long each alert takes: the window in which the demo kills the Dag processor.
ALERT_SECONDS = 6


def page_on_call(context):
    record_dag_failure(context, DAG_CALLBACK_STARTED)
    time.sleep(ALERT_SECONDS)
    record_dag_failure(context, DAG_CALLBACK_DONE)


@dag(
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["repro"],
    max_active_runs=3,
    on_failure_callback=page_on_call,
    default_args={"retries": 0},
)
def dag_processor_killed() -> None:
    @task
    def incident() -> None:
        raise RuntimeError("an upstream outage: every run fails at once")

    incident()


dag_processor_killed()
