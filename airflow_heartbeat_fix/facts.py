"""
What the installed Airflow's code says about each bug, read off its (unpatched) classes and functions
rather than its version string: :func:`read_facts` gathers them into :class:`AirflowFacts`, which
:func:`~airflow_heartbeat_fix.detection.decide` maps to one decision per fix.

Each reader takes the code it reads as an argument, so the readers are table-tested on small stand-ins
(``tests/test_detection.py``) and checked on every installed release against ``parity/expectations.toml``.
Only the standard library is imported at module level.
"""

from __future__ import annotations

import dis
import inspect
import types
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DagProcessorFacts:
    """What the Dag processor's code says about its callback requests; ``None`` means "not recognised"."""

    #: The manager's fetch deletes each request it fetches (every release up to 3.4.0b2).
    fetch_deletes_requests: bool | None
    #: The column of a stored request that holds its JSON: ``callback_data`` (a string, 3.0/3.1), ``data``
    #: (a dict, 3.2+).
    callback_payload: str | None
    #: File processors are forked from the manager (the batch's row ids reach them through the fork).
    file_processors_forked: bool = True
    #: ``_execute_callbacks`` runs each request in its own try (3.3.2+, apache/airflow#70990).
    requests_isolated: bool | None = True
    #: The Dag version inflation check returns before a file's callbacks run (3.2.0 to 3.3.1, #70987).
    inflation_check_blocks_callbacks: bool | None = False
    #: The keyword argument and value that make ``_add_files_to_queue`` put files first (:func:`queue_front`).
    queue_front: tuple[str, Any] | None = ("mode", "front")
    missing_hooks: tuple[str, ...] = ()


@dataclass(frozen=True)
class AirflowFacts:
    """What the installed Airflow's code says about the bugs; ``None`` means "not recognised"."""

    version: str
    sink_commits_caller_session: bool | None
    purge_converges: bool | None
    missing_hooks: tuple[str, ...] = ()
    purge_locks_each_ti: bool | None = False
    has_callback_sink: bool = True
    executor_events_type_callbacks: bool | None = True
    #: False where the Dag processor cannot run a task callback request at all: nothing here fixes that.
    processor_runs_task_callbacks: bool = True
    adoption_keeps_orphans_attached: bool | None = True
    #: What a nested create_session() does to the loop's transaction here (None: not recognised).
    nested_session_ends_transaction: bool | None = True
    #: A create_session() called as provide_session calls it reaches the fix (False: something replaced
    #: airflow.utils.session.create_session without calling Airflow's, so nested sessions go unrecognised).
    create_session_recognised: bool = True
    #: The metastore secrets backend expunge_all()-s the session it is given (up to 3.1).
    metastore_expunges: bool = False
    #: handle_failure notifies listeners before it archives the try (3.4): a listener's session crashes it.
    listeners_before_next_try: bool = False
    #: The Dag processor's facts; ``None`` where they were not read (a scheduler reads only its own).
    dag_processor: DagProcessorFacts | None = None
    #: Executor-event processing reads a running try's heartbeat before failing it (None: not recognised).
    executor_events_read_heartbeat: bool | None = True


def _nested_codes(code: types.CodeType) -> list[types.CodeType]:
    """
    ``code`` and every code object defined in it. Before Python 3.12 (PEP 709) a comprehension is its own
    code object, so a name used only inside one is in its ``co_names``, not in the function's.
    """
    nested = (const for const in code.co_consts if isinstance(const, types.CodeType))
    return [code, *(inner for const in nested for inner in _nested_codes(const))]


def code_names(code: types.CodeType) -> frozenset[str]:
    """The global and attribute names ``code`` uses, comprehensions and nested functions included."""
    return frozenset(name for each in _nested_codes(code) for name in each.co_names)


def names_in_order(code: types.CodeType) -> list[str]:
    """Every name and string ``code`` loads in order, a comprehension's where the comprehension stands."""
    names: list[str] = []
    for ins in dis.get_instructions(code):
        if isinstance(ins.argval, types.CodeType):
            names.extend(names_in_order(ins.argval))
        elif isinstance(ins.argval, str):
            names.append(ins.argval)
    return names


def names_used(func: Any) -> frozenset[str] | None:
    """:func:`code_names` of a function; ``None`` for anything without code."""
    code = getattr(func, "__code__", None)
    return code_names(code) if code is not None else None


def _is_provide_session_wrapper(func: Any) -> bool:
    """True if ``func`` is ``provide_session``'s wrapper: it commits and closes the session it creates."""
    from airflow.utils.session import provide_session

    def _probe(session: Any = None) -> None: ...

    probe_code = provide_session(_probe).__code__
    return getattr(func, "__code__", None) is probe_code and hasattr(func, "__wrapped__")


def sink_commits_caller_session(sink_cls: type) -> bool | None:
    """
    Whether ``DatabaseCallbackSink.send``, called without a session, commits the thread's scoped session.

    The stock sink is ``@provide_session``; executors call it without a session, so ``create_session()``
    hands it the scheduler's own scoped session and commits and closes it. A sink whose ``send`` takes
    the caller's session and is not wrapped does not. Anything else is not recognised.
    """
    send = sink_cls.__dict__.get("send")
    if send is None:
        return None
    if _is_provide_session_wrapper(send):
        inner = send.__wrapped__
        return True if "session" in inner.__code__.co_varnames else None
    code = getattr(send, "__code__", None)
    if code is not None and "session" in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        return False
    return None


def purge_converges(runner_cls: type) -> bool | None:
    """
    Whether the heartbeat-timeout purge moves the task instance out of RUNNING in the same pass.

    Upstream's converged purge calls ``handle_failure`` and its scan uses ``with_row_locks``; the
    unconverged one only sends a ``TaskCallbackRequest`` (``send_callback``).
    """
    purge = names_used(getattr(runner_cls, "_purge_task_instances_without_heartbeats", None))
    find = names_used(getattr(runner_cls, "_find_task_instances_without_heartbeats", None))
    if purge is None or find is None or "send_callback" not in purge:
        return None
    if "handle_failure" in purge:
        return "with_row_locks" in find or None
    return False


def _keyword_names(code: Any) -> frozenset[str]:
    """Keyword-argument names passed in ``code`` (CPython keeps them as tuples of strings in co_consts)."""
    consts = (const for each in _nested_codes(code) for const in each.co_consts)
    tuples = (const for const in consts if isinstance(const, tuple))
    return frozenset(name for names in tuples for name in names if isinstance(name, str))


def purge_locks_each_ti(runner_cls: type) -> bool | None:
    """
    Whether the purge re-reads each task instance under a row lock right before failing it.

    ``handle_failure`` commits per task instance, which releases the scan's locks on the rest of the
    batch; only a purge that locks again (``with_row_locks``/``with_for_update``, or
    ``refresh_from_db(lock_for_update=...)``) keeps a worker's SUCCESS from being overwritten.
    """
    purge = getattr(runner_cls, "_purge_task_instances_without_heartbeats", None)
    code = getattr(purge, "__code__", None)
    if code is None or "send_callback" not in code_names(code):
        return None
    names = code_names(code) | _keyword_names(code)
    return bool(names & {"with_row_locks", "with_for_update", "lock_for_update"})


def executor_events_type_callbacks(runner_cls: type) -> bool | None:
    """
    Whether ``process_executor_events`` types the ``TaskCallbackRequest`` it sends for a killed worker.

    From 3.1.1 (apache/airflow#56607) it passes ``task_callback_type=`` by retry eligibility; before,
    the request is untyped and the Dag processor runs it as ``on_failure_callback``.
    """
    code = getattr(getattr(runner_cls, "process_executor_events", None), "__code__", None)
    if code is None or "TaskCallbackRequest" not in code_names(code):
        return None
    return "task_callback_type" in _keyword_names(code)


def executor_events_read_heartbeat(runner_cls: type) -> bool | None:
    """
    Whether ``process_executor_events`` reads a try's ``last_heartbeat_at`` before it fails a RUNNING try
    on a FAILED or SUCCESS event for its key.

    No release up to 3.4.0b2 does: every one fails a RUNNING try queued by this scheduler on any terminal
    event of the same try (``handle_failure``), whatever its heartbeat. apache/airflow#69336 (open) proposes
    reading it. A body without ``handle_failure`` is a shape not recognised.
    """
    code = getattr(getattr(runner_cls, "process_executor_events", None), "__code__", None)
    if code is None or "handle_failure" not in code_names(code):
        return None
    return "last_heartbeat_at" in code_names(code)


#: Session reads that, after the executors' adoption, would load the orphans again (upstream's proposal).
_REREADS = frozenset({"scalars", "scalar", "execute", "merge", "get", "refresh", "refresh_from_db"})


def adoption_keeps_orphans_attached(runner_cls: type) -> bool | None:
    """
    Whether ``adopt_or_reset_orphaned_tasks`` re-reads the orphans through its session after the
    executors' ``try_adopt_task_instances``, so what an executor does with the session cannot detach them.

    Every release up to 3.4.0b2 selects the orphans (``load_only``) and then only writes to the
    instances it handed the executors (apache/airflow#71272); #71348 proposes re-selecting them by id.
    """
    adopt = getattr(runner_cls, "adopt_or_reset_orphaned_tasks", None)
    code = getattr(getattr(adopt, "__wrapped__", adopt), "__code__", None)
    if code is None or "try_adopt_task_instances" not in code_names(code):
        return None
    names = names_in_order(code)
    after = names[names.index("try_adopt_task_instances") + 1 :]
    return bool(_REREADS.intersection(after))


def nested_session_ends_transaction(generator: Any) -> bool | None:
    """
    Whether ``create_session()`` entered inside another one in the same thread ends that one's transaction.

    ``generator``: Airflow's ``create_session`` generator (``None`` where it was not found). Every release's
    takes ``settings.Session()`` (the thread's scoped session) and commits, rolls back and closes it
    unconditionally. One that begins a SAVEPOINT joins an enclosing transaction instead; any other shape
    is not recognised.
    """
    import inspect

    if not inspect.isgeneratorfunction(generator):
        return None
    names = code_names(generator.__code__)
    if "begin_nested" in names:
        return False
    return True if {"commit", "rollback", "close"} <= names else None


def metastore_expunges(backend_cls: type | None) -> bool:
    """Whether the metastore secrets backend's lookups ``expunge_all()`` their session (3.0, 3.1)."""
    lookups = (getattr(backend_cls, name, None) for name in ("get_connection", "get_variable"))
    codes = (names_used(getattr(lookup, "__wrapped__", lookup)) for lookup in lookups)
    return any(names is not None and "expunge_all" in names for names in codes)


def listeners_before_next_try(task_instance_cls: type | None) -> bool:
    """
    Whether a failing try's listeners run before ``prepare_db_for_next_try`` archives it (3.4), so that a
    listener's session, closing the scheduler's, leaves nothing for the archive to write.
    """
    code = getattr(getattr(task_instance_cls, "fetch_handle_failure_context", None), "__code__", None)
    if code is None:
        return False
    names = names_in_order(code)
    notified = [at for at, name in enumerate(names) if name in ("notify_failure", "get_listener_manager")]
    archived = [at for at, name in enumerate(names) if name == "prepare_db_for_next_try"]
    return bool(notified and archived and notified[0] < archived[0])


def processor_runs_task_callbacks(execute_callbacks: Any) -> bool:
    """
    Whether the Dag processor's ``_execute_callbacks`` runs task callbacks (3.0.0 to 3.0.3 raise instead).

    Only a clear "no" counts: a shape without ``NotImplementedError`` is taken to run them.
    """
    names = names_used(execute_callbacks)
    return names is None or "NotImplementedError" not in names or "_execute_task_callbacks" in names


def _unwrapped(func: Any) -> Any:
    """``func`` under its decorators' ``__wrapped__`` (``provide_session``, ``retry_db_transaction``)."""
    for _ in range(4):
        inner = getattr(func, "__wrapped__", None)
        if inner is None:
            break
        func = inner
    return func


def stock_callback_fetch(manager_cls: type) -> Any:
    """
    The manager's own fetch: ``_fetch_callbacks_from_db`` (3.3+, behind the public ``fetch_callbacks``) or
    ``_fetch_callbacks`` (3.0 to 3.2), undecorated; ``None`` if neither.
    """
    fetch = getattr(manager_cls, "_fetch_callbacks_from_db", None) or getattr(
        manager_cls, "_fetch_callbacks", None
    )
    return None if fetch is None else _unwrapped(fetch)


def fetch_deletes_requests(fetch: Any) -> bool | None:
    """Whether the manager's fetch deletes the requests it reads (``session.delete`` of each row)."""
    names = names_used(fetch)
    if names is None or "get_callback_request" not in names:
        return None
    return "delete" in names


def callback_payload(columns: Any) -> str | None:
    """Which column of the stored request holds its JSON (``columns``: the table's column names)."""
    return next((name for name in ("callback_data", "data") if name in columns), None)


def file_processors_forked(start: Any, should_use_exec: Any) -> bool:
    """
    Whether ``DagFileProcessorProcess.start`` forks the file processor (every release on Linux). 3.4 asks
    the Task SDK's ``_should_use_exec()`` (true on macOS) and then spawns a fresh interpreter instead.
    """
    names = names_used(_unwrapped(start)) or frozenset()
    return "_should_use_exec" not in names or not should_use_exec()


def requests_isolated(execute_callbacks: Any) -> bool | None:
    """Whether ``_execute_callbacks`` catches each request's exception and goes on (``log.exception``)."""
    names = names_used(execute_callbacks)
    if names is None or not any(name.startswith("_execute_") for name in names):
        return None
    return "exception" in names


def queue_front(manager_cls: type) -> tuple[str, Any] | None:
    """
    How the manager's ``_add_files_to_queue`` is told to put files at the front of the queue:
    ``mode="front"`` from 3.1.8, ``add_at_front=True`` before; ``None`` if it takes neither.
    """
    add = getattr(manager_cls, "_add_files_to_queue", None)
    try:
        parameters = inspect.signature(add).parameters if add is not None else {}
    except (TypeError, ValueError):
        return None
    if "mode" in parameters:
        return ("mode", "front")
    if "add_at_front" in parameters:
        return ("add_at_front", True)
    return None


def inflation_check_blocks_callbacks(parse_file: Any) -> bool | None:
    """
    Whether ``_parse_file`` returns the Dag version inflation check's error before it looks at the
    message's callback requests (3.2.0 to 3.3.1). No check at all (3.0, 3.1): False.
    """
    code = getattr(parse_file, "__code__", None)
    if code is None or "callback_requests" not in code_names(code):
        return None
    if "check_dag_file_stability" not in code_names(code):
        return False
    names = names_in_order(code)
    if "get_error_format_dict" not in names:
        return None
    return names.index("get_error_format_dict") < names.index("callback_requests")


@dataclass(frozen=True)
class DagProcessorCode:
    """The Dag processor's code as detection reads it."""

    manager_cls: type
    callback_columns: tuple[str, ...]
    file_processor_start: Any
    should_use_exec: Any
    execute_callbacks: Any
    parse_file: Any
    #: The manager's methods the Dag processor's fixes wrap (:func:`~.detection.hooks_of`).
    hooks: tuple[str, ...] = ()


def read_dag_processor_facts(code: DagProcessorCode) -> DagProcessorFacts:
    fetch = stock_callback_fetch(code.manager_cls)
    missing = tuple(hook for hook in code.hooks if not hasattr(code.manager_cls, hook))
    return DagProcessorFacts(
        fetch_deletes_requests=fetch_deletes_requests(fetch),
        callback_payload=callback_payload(code.callback_columns),
        file_processors_forked=file_processors_forked(code.file_processor_start, code.should_use_exec),
        requests_isolated=requests_isolated(code.execute_callbacks),
        inflation_check_blocks_callbacks=inflation_check_blocks_callbacks(code.parse_file),
        queue_front=queue_front(code.manager_cls),
        missing_hooks=missing,
    )


@dataclass(frozen=True)
class SessionCode:
    """Airflow's session handling and what runs nested in the loop's session, as detection reads them."""

    #: Airflow's ``create_session`` generator (``None``: not found behind ``airflow.utils.session``'s).
    create_session: Any
    metastore_cls: type | None = None
    task_instance_cls: type | None = None
    #: Whether ``create_session()`` as ``provide_session`` calls it reaches the fix (a probe's answer).
    create_session_recognised: bool = True


def read_facts(
    *,
    version: str,
    sink_cls: type | None,
    runner_cls: type,
    session_code: SessionCode,
    hooks: tuple[str, ...],
    execute_callbacks: Any = None,
    dag_processor: DagProcessorCode | None = None,
) -> AirflowFacts:
    """
    Inspect Airflow's own (unpatched) sink and scheduler classes; ``sink_cls`` None: no such sink.
    ``hooks``: the scheduler's methods its fixes wrap (:func:`~.detection.hooks_of`), each looked for.

    ``execute_callbacks``: the Dag processor's ``_execute_callbacks``, where it has one. ``dag_processor``:
    the Dag processor's code, where its fixes are decided.
    """
    processor_facts = None if dag_processor is None else read_dag_processor_facts(dag_processor)
    if sink_cls is None:
        return AirflowFacts(version, None, None, has_callback_sink=False, dag_processor=processor_facts)
    missing = tuple(hook for hook in hooks if not hasattr(runner_cls, hook))
    return AirflowFacts(
        version=version,
        sink_commits_caller_session=sink_commits_caller_session(sink_cls),
        purge_converges=purge_converges(runner_cls),
        missing_hooks=missing,
        purge_locks_each_ti=purge_locks_each_ti(runner_cls),
        executor_events_type_callbacks=executor_events_type_callbacks(runner_cls),
        processor_runs_task_callbacks=processor_runs_task_callbacks(execute_callbacks),
        adoption_keeps_orphans_attached=adoption_keeps_orphans_attached(runner_cls),
        nested_session_ends_transaction=nested_session_ends_transaction(session_code.create_session),
        create_session_recognised=session_code.create_session_recognised,
        metastore_expunges=metastore_expunges(session_code.metastore_cls),
        listeners_before_next_try=listeners_before_next_try(session_code.task_instance_cls),
        dag_processor=processor_facts,
        executor_events_read_heartbeat=executor_events_read_heartbeat(runner_cls),
    )
