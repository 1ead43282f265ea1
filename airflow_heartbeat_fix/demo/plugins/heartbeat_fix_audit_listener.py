"""
A listener plugin as deployments write them: it records what it sees in the metadata database, through
its own ``create_session()``, and reads its settings from a ``Variable``.

Package data, never imported from the package: ``airflow-heartbeat-fix demo --listener`` and the tests
(``testing.plugins``) copy it into a plugins folder, and Airflow imports it by its file name.
"""

from __future__ import annotations

import sys
from typing import Any

from airflow.listeners import hookimpl
from airflow.models.log import Log
from airflow.models.variable import Variable
from airflow.plugins_manager import AirflowPlugin
from airflow.utils.session import create_session

#: The ``log`` rows this plugin writes.
AUDIT_EVENT = "heartbeat-fix-audit"
#: The Variable the Dag-run hook reads (and writes what it read into its row).
CHANNEL_VARIABLE = "heartbeat_fix_audit_channel"


def _audit(extra: str, **where: Any) -> None:
    with create_session() as session:
        session.add(Log(event=AUDIT_EVENT, extra=extra, **where))


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    _audit(
        f"failed: try {task_instance.try_number}",
        dag_id=task_instance.dag_id,
        task_id=task_instance.task_id,
        run_id=task_instance.run_id,
    )


@hookimpl
def on_dag_run_running(dag_run: Any, msg: str) -> None:
    channel = Variable.get(CHANNEL_VARIABLE, default_var=None)
    _audit(f"running: channel={channel}", dag_id=dag_run.dag_id, run_id=dag_run.run_id)


class HeartbeatFixAuditListenerPlugin(AirflowPlugin):
    name = "heartbeat_fix_audit_listener"
    listeners = [sys.modules[__name__]]  # noqa: RUF012  (the way AirflowPlugin declares them)
