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
    from collections.abc import Callable
    from types import CellType, ModuleType

    from airflow.callbacks.callback_requests import EmailRequest as EmailRequestType
    from airflow.executors.base_executor import BaseExecutor
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.dagrun import DagRun
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

__all__ = [
    "EmailRequest",
    "Stats",
    "airflow_cli_main",
    "airflow_console",
    "callback_request_model",
    "create_session_cell",
    "dag_for_run",
    "dag_processor_command",
    "dag_processor_execute_callbacks",
    "dag_processor_manager_class",
    "database_callback_sink_module",
    "dbapi_connection",
    "default_executor",
    "ensure_plugins_loaded",
    "file_processor_module",
    "file_processors_use_exec",
    "listener_manager_class",
    "metadata_engine",
    "metastore_backend_class",
    "scheduler_command_module",
    "scheduler_executors",
    "scoped_session",
    "scoped_session_in_transaction",
    "sqlalchemy_utils_module",
    "task_instance_uuid_class",
    "transaction_connection",
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


#: How far :func:`create_session_cell` looks through wrappers of ``create_session`` (``__wrapped__`` and
#: closures): a tracing wrapper of a tracing wrapper is two.
_WRAPPER_DEPTH = 4


def create_session_cell(installed: object = None) -> CellType | None:
    """
    The closure cell in which ``contextlib.contextmanager`` keeps Airflow's ``create_session`` generator
    (or ``installed``, what this package put there).

    Every module that imports ``create_session``, ``provide_session`` (which calls it by name) and every
    wrapper that calls it share that one helper and so that one cell. Found from
    ``airflow.utils.session.create_session`` as it is now, through wrappers (``__wrapped__`` or a closure
    of theirs); ``None`` if it is no longer a context manager over a generator of ``airflow.utils.session``.
    """
    import inspect

    from airflow.utils import session as session_module

    def is_airflows_generator(value: object) -> bool:
        code = getattr(value, "__code__", None)
        return (
            inspect.isgeneratorfunction(value)
            and code is not None
            and code.co_name == "create_session"
            and code.co_filename == session_module.__file__
        )

    seen: set[int] = set()
    candidates: list[tuple[object, int]] = [(session_module.create_session, 0)]
    while candidates:
        candidate, depth = candidates.pop()
        if id(candidate) in seen or depth > _WRAPPER_DEPTH:
            continue
        seen.add(id(candidate))
        for cell in getattr(candidate, "__closure__", None) or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if contents is installed or is_airflows_generator(contents):
                return cell
            candidates.append((contents, depth + 1))
        if (wrapped := getattr(candidate, "__wrapped__", None)) is not None:
            candidates.append((wrapped, depth + 1))
    return None


def transaction_connection(session: Session) -> Connection | None:
    """
    The connection the session's (outermost) transaction works on, or ``None`` if it has none yet.

    SQLAlchemy 1.4 to 2.1 keep it in the private ``SessionTransaction._connections`` (bind -> a tuple whose
    first item is the connection); asking the session for it (``session.connection()``) would check one
    out. Where that changes, every transaction is taken to have a connection (the cautious answer).
    """
    transaction = session.get_transaction()
    if transaction is None:
        return None
    connections = getattr(transaction, "_connections", None)
    if connections is None:
        return session.connection()
    return next((entry[0] for entry in connections.values()), None)


def listener_manager_class() -> type:
    """Airflow's ``ListenerManager`` (3.3+ define it in ``airflow._shared`` and re-export it here)."""
    from airflow.listeners.listener import ListenerManager

    return ListenerManager


def dbapi_connection(connection: Connection) -> Any:
    """The driver's own connection under a SQLAlchemy one (``dbapi_connection`` since SQLAlchemy 1.4.24)."""
    return connection.connection.dbapi_connection


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


def scheduler_command_module() -> ModuleType:
    """The ``airflow scheduler`` command's module: its ``SchedulerJobRunner`` is the runner it starts."""
    from airflow.cli.commands import scheduler_command

    return scheduler_command


def database_callback_sink_module() -> ModuleType | None:
    """Where ``DatabaseCallbackSink`` lives (every release to 3.4); ``None`` for an Airflow without it."""
    import importlib

    try:
        return importlib.import_module("airflow.callbacks.database_callback_sink")
    except ImportError:
        return None


def metastore_backend_class() -> type | None:
    """The metastore secrets backend, whose Variable and Connection lookups run nested in the loop."""
    try:
        from airflow.secrets.metastore import MetastoreBackend
    except ImportError:
        return None
    return MetastoreBackend


def sqlalchemy_utils_module() -> ModuleType:
    """``airflow.utils.sqlalchemy``, where ``prohibit_commit`` looks up its guard class by name."""
    from airflow.utils import sqlalchemy as airflow_sqlalchemy

    return airflow_sqlalchemy


def ensure_plugins_loaded() -> None:
    """Load Airflow's plugins as a starting scheduler does (every release has this function)."""
    from airflow import plugins_manager

    plugins_manager.ensure_plugins_loaded()


def airflow_console() -> Any:
    """Airflow's own CLI console (``-o table/json/yaml/plain``), as its commands print."""
    from airflow.cli.simple_table import AirflowConsole

    return AirflowConsole()


def airflow_cli_main() -> Callable[[], Any]:
    """The ``airflow`` command's entry point."""
    from airflow.__main__ import main

    return main


def dag_processor_command() -> Any:
    """The ``airflow dag-processor`` command's module: it names ``DagFileProcessorManager`` (all releases)."""
    from airflow.cli.commands import dag_processor_command as command

    return command


def dag_processor_manager_class() -> type:
    """Airflow's own ``DagFileProcessorManager`` (the class the command module imported)."""
    from airflow.dag_processing.manager import DagFileProcessorManager

    return DagFileProcessorManager


def file_processor_module() -> Any:
    """
    ``airflow.dag_processing.processor``: the file processor's ``_parse_file`` and ``_execute_callbacks``
    (module functions, looked up by name when the forked child calls them) and ``DagFileProcessorProcess``.
    """
    from airflow.dag_processing import processor

    return processor


def file_processors_use_exec() -> bool:
    """
    Whether a file processor is a fresh interpreter rather than a fork (3.4 on macOS: the Task SDK's
    private ``_should_use_exec``); False where the Task SDK has no such choice (every fork-only release).
    """
    from airflow.sdk.execution_time import supervisor

    should_use_exec = getattr(supervisor, "_should_use_exec", None)
    return bool(should_use_exec()) if should_use_exec is not None else False


def callback_request_model() -> Any:
    """
    The ORM class of a stored Dag processor callback request: ``DbCallbackRequest`` (table
    ``callback_request`` up to 3.1; from 3.2 the ``dag_processor`` rows of ``callback``).
    """
    from airflow.models.db_callback_request import DbCallbackRequest

    return DbCallbackRequest


def metadata_engine() -> Any:
    """The process's engine on the metadata database (the manager's, inherited by its forked children)."""
    if settings.engine is None:
        raise RuntimeError("Airflow's ORM is not configured (settings.engine is None)")
    return settings.engine


def task_instance_uuid_class() -> type | None:
    """
    ``TaskInstanceUuid``, the key of one try's row in the executors' events from 3.4 on; ``None`` before
    (3.0 to 3.3 key every event by ``TaskInstanceKey``).
    """
    try:
        from airflow.executors.workloads.types import TaskInstanceUuid
    except ImportError:
        return None
    return TaskInstanceUuid
