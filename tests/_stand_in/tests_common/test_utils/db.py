"""The ``clear_db_*`` helpers of upstream's ``tests_common.test_utils.db`` that this suite uses.

Each empties its tables in its own committed session, as upstream's do.
"""

from __future__ import annotations

from sqlalchemy import delete


def clear_db_runs() -> None:
    """Jobs, triggers, Dag runs, task instances and, where Airflow keeps it apart, their history."""
    from airflow.jobs.job import Job
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session

    with create_session() as session:
        for model in (Job, Trigger, DagRun, TaskInstance):
            session.execute(delete(model))
        try:  # Airflow 3.4 keeps every try in task_instance itself
            from airflow.models.taskinstancehistory import TaskInstanceHistory
        except ImportError:
            return
        session.execute(delete(TaskInstanceHistory))


def clear_db_dags() -> None:
    """Dags with their tags and owner links (and the runs that would block deleting them)."""
    from airflow.models.dag import DagModel, DagOwnerAttributes, DagTag
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        for model in (DagTag, DagOwnerAttributes, DagRun, DagModel):
            session.execute(delete(model))


def clear_db_serialized_dags() -> None:
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        session.execute(delete(SerializedDagModel))


def clear_db_jobs() -> None:
    from airflow.jobs.job import Job
    from airflow.utils.session import create_session

    with create_session() as session:
        session.execute(delete(Job))


def clear_db_callbacks() -> None:
    """The ``callback`` table of executor callbacks (Airflow 3.2+), as upstream clears it.

    The requests ``DatabaseCallbackSink`` stores live in ``callback_request``, which upstream's helper
    leaves alone on 3.2+: a module that needs that table empty deletes ``DbCallbackRequest`` itself.
    """
    from airflow.models.callback import Callback
    from airflow.utils.session import create_session

    with create_session() as session:
        session.execute(delete(Callback))


def clear_db_logs() -> None:
    from airflow.models.log import Log
    from airflow.utils.session import create_session

    with create_session() as session:
        session.execute(delete(Log))


def clear_db_dag_bundles() -> None:
    from airflow.models.dagbundle import DagBundleModel
    from airflow.utils.session import create_session

    with create_session() as session:
        session.execute(delete(DagBundleModel))
