"""
Every Airflow import that is private, or that moved between the releases this package supports.

The fix modules import these names from here and nowhere else, so a release that moves one of them
is handled in this file alone. An import that fails here makes activation report the fixes
``unsupported`` (with the error) and leave Airflow unpatched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow import settings
from airflow.utils.sqlalchemy import with_row_locks

try:  # 3.2+: the public re-export of the shared metrics module.
    from airflow.observability.stats import Stats
except ImportError:  # 3.0/3.1.
    from airflow.stats import Stats  # type: ignore[assignment,no-redef,unused-ignore]

#: The request that has the Dag processor send a task's failure or retry email; ``None`` where the
#: scheduler's ``TaskInstance.handle_failure`` still sends that email itself (3.0).
EmailRequest: type[EmailRequestType] | None
try:  # 3.1.1+
    from airflow.callbacks.callback_requests import EmailRequest
except ImportError:
    try:  # 3.1.0 named it EmailNotificationRequest (3.1.1 kept that name as an alias).
        from airflow.callbacks.callback_requests import (  # type: ignore[attr-defined,no-redef,unused-ignore]
            EmailNotificationRequest as EmailRequest,
        )
    except ImportError:
        EmailRequest = None

if TYPE_CHECKING:
    from airflow.callbacks.callback_requests import EmailRequest as EmailRequestType
    from airflow.executors.base_executor import BaseExecutor
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.dagrun import DagRun
    from sqlalchemy.orm import Session

__all__ = [
    "EmailRequest",
    "Stats",
    "create_session_code",
    "dag_for_run",
    "dag_processor_execute_callbacks",
    "default_executor",
    "scheduler_executors",
    "scoped_session",
    "scoped_session_in_transaction",
    "with_row_locks",
]


def scoped_session() -> Session:
    """The thread's scoped session: the one ``create_session()`` hands the scheduler loop."""
    if settings.Session is None:
        raise RuntimeError("Airflow's ORM is not configured (settings.Session is None)")
    return settings.Session()


def scoped_session_in_transaction() -> bool:
    """Whether the thread's scoped session has begun a transaction, without beginning one."""
    registry = settings.Session
    return registry is not None and registry.registry.has() and registry().in_transaction()


def create_session_code() -> Any:
    """
    The code of ``create_session``'s generator: the frame that calls ``settings.Session()`` for it.

    ``None`` if ``create_session`` is no longer a ``contextlib.contextmanager`` over a generator.
    """
    import inspect

    from airflow.utils.session import create_session

    generator = getattr(create_session, "__wrapped__", None)
    return generator.__code__ if inspect.isgeneratorfunction(generator) else None


def scheduler_executors(runner: SchedulerJobRunner) -> list[BaseExecutor]:
    """
    The scheduler's executors, the default one first.

    3.2+ keeps them on the runner (``runner.executors``); 3.0/3.1 on its job (``runner.job.executors``,
    a cached property there).
    """
    return vars(runner).get("executors") or runner.job.executors


def default_executor(runner: SchedulerJobRunner) -> BaseExecutor:
    """The executor the scheduler sends callbacks through."""
    return scheduler_executors(runner)[0]


def dag_for_run(dag_bag: Any, *, dag_run: DagRun, session: Session) -> Any:
    """The serialized Dag of ``dag_run``'s version: ``get_dag_for_run`` from 3.1, ``get_dag`` on 3.0."""
    lookup = getattr(dag_bag, "get_dag_for_run", None) or dag_bag.get_dag
    return lookup(dag_run=dag_run, session=session)


def dag_processor_execute_callbacks() -> Any:
    """The Dag processor's private ``_execute_callbacks``, read by detection; ``None`` if it moved."""
    from airflow.dag_processing import processor

    return getattr(processor, "_execute_callbacks", None)
