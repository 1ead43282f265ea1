"""
A deployment's ``airflow_local_settings.py``: a cluster policy that reads a ``Variable`` stored in the
metadata database. Copied into ``$AIRFLOW_HOME/config`` by the tests (``testing.plugins``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["task_instance_mutation_hook"]

#: The Variable naming the queue every new task instance goes to.
QUEUE_VARIABLE = "heartbeat_fix_policy_queue"


def task_instance_mutation_hook(task_instance: Any) -> None:
    from airflow.models.variable import Variable

    queue = Variable.get(QUEUE_VARIABLE, default_var=None)
    if queue is not None:
        task_instance.queue = queue
