"""
A deployment's ``airflow_local_settings.py``: its cluster policies, one of which reads a ``Variable``
stored in the metadata database. Copied into ``$AIRFLOW_HOME/config`` by the tests (``testing.plugins``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["dag_policy", "task_instance_mutation_hook", "task_policy"]

#: The Variable naming the queue every new task instance goes to.
QUEUE_VARIABLE = "heartbeat_fix_policy_queue"
#: What the parse-time policies leave on every Dag and task.
DAG_TAG, TASK_OWNER = "deployment-dag-policy", "deployment-task-policy"


def dag_policy(dag: Any) -> None:
    dag.tags.add(DAG_TAG)


def task_policy(task: Any) -> None:
    task.owner = TASK_OWNER


def task_instance_mutation_hook(task_instance: Any) -> None:
    from airflow.models.variable import Variable

    queue = Variable.get(QUEUE_VARIABLE, default_var=None)
    if queue is not None:
        task_instance.queue = queue
