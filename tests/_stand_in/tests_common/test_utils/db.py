"""The ``clear_db_*`` helpers of upstream's ``tests_common.test_utils.db`` that this suite uses.

Each empties its tables in its own committed session, as upstream's do.
"""

from __future__ import annotations

from testing.database import clear, task_instance_history


def clear_db_runs() -> None:
    """Jobs, triggers, Dag runs, task instances and, where Airflow keeps it apart, their history."""
    from airflow.jobs.job import Job
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import Trigger

    clear([Job, Trigger, DagRun, TaskInstance, *task_instance_history()])


def clear_db_dags() -> None:
    """Dags with their tags and owner links (and the runs that would block deleting them)."""
    from airflow.models.dag import DagModel, DagOwnerAttributes, DagTag
    from airflow.models.dagrun import DagRun

    clear([DagTag, DagOwnerAttributes, DagRun, DagModel])


def clear_db_serialized_dags() -> None:
    from airflow.models.serialized_dag import SerializedDagModel

    clear([SerializedDagModel])


def clear_db_jobs() -> None:
    from airflow.jobs.job import Job

    clear([Job])


def clear_db_callbacks() -> None:
    """The callbacks table, as upstream's helper of the installed release clears it.

    3.2+: the ``callback`` table of executor callbacks; the requests ``DatabaseCallbackSink`` stores live
    in ``callback_request``, which upstream's helper leaves alone there (a module that needs that table
    empty deletes ``DbCallbackRequest`` itself). 3.0/3.1 have no executor callbacks: upstream's helper
    clears ``callback_request``.
    """
    try:
        from airflow.models.callback import Callback
    except ImportError:
        from airflow.models.db_callback_request import DbCallbackRequest as Callback  # type: ignore[assignment]

    clear([Callback])


def clear_db_logs() -> None:
    from airflow.models.log import Log

    clear([Log])


def clear_db_dag_bundles() -> None:
    from airflow.models.dagbundle import DagBundleModel

    clear([DagBundleModel])
