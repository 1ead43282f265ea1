"""
Decide which fixes the installed Airflow needs, from Airflow's own code rather than its version string.

The facts are read off the installed classes (:func:`read_facts`); everything else is the pure
function :func:`decide`, so the decision table is testable without any particular Airflow installed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

SINK_FIX = "session_preserving_sink"
PURGE_FIX = "converged_heartbeat_purge"
LOCK_FIX = "locked_purge_revalidation"
EVENT_TYPE_FIX = "typed_executor_event_callbacks"
ADOPTION_FIX = "held_orphan_adoption"
NESTED_FIX = "nested_sessions_join_loop"
FIXES = (NESTED_FIX, SINK_FIX, PURGE_FIX, LOCK_FIX, EVENT_TYPE_FIX, ADOPTION_FIX)

FIX_TITLES = {
    NESTED_FIX: "a create_session() nested in the scheduler loop (listeners, cluster policies, Variable and "
    "Connection lookups, deadline alerts) joins the loop's transaction instead of ending it (crash loops, "
    "UniqueViolation on retry, lost callbacks)",
    SINK_FIX: "callback sink keeps the scheduler's session (UniqueViolation crash, detached batches)",
    PURGE_FIX: "heartbeat-timeout purge converges the task instance (duplicate callbacks)",
    LOCK_FIX: "heartbeat-timeout purge holds each task instance's row lock through its failure "
    "(a worker's SUCCESS overwritten, failure callback for a task that succeeded)",
    EVENT_TYPE_FIX: "a worker reported failed by its executor gets the callback of its retry state "
    "(on_failure_callback while retries remain)",
    ADOPTION_FIX: "orphan adoption keeps the scheduler's session and row locks through the executor's "
    "try_adopt_task_instances (DetachedInstanceError crash loop, lost resets, double adoption)",
}

#: Scheduler methods the fixes wrap; a version without any of them is a shape we do not understand.
SINK_FIX_HOOKS = ("_run_scheduler_loop", "_send_dag_callbacks_to_processor", "_process_executor_events")
PURGE_FIX_HOOKS = ("_find_task_instances_without_heartbeats", "_purge_task_instances_without_heartbeats")
EVENT_TYPE_FIX_HOOKS = ("_process_executor_events", "process_executor_events")
ADOPTION_FIX_HOOKS = ("adopt_or_reset_orphaned_tasks",)
#: The loop's paths the nested-session fix holds: the loop itself, and each path a driver may also call
#: on its own (the tests, a custom loop), with or without the session it works in.
NESTED_FIX_HOOKS = (
    "_run_scheduler_loop",
    "_do_scheduling",
    "_process_executor_events",
    "_find_and_purge_task_instances_without_heartbeats",
    "_purge_task_instances_without_heartbeats",
    "_handle_tasks_stuck_in_queued",
    "_update_dag_run_state_for_paused_dags",
    "adopt_or_reset_orphaned_tasks",
)
#: What ``SchedulerJobRunner._execute`` logs when an exception ends ``_run_scheduler_loop`` (the error's own
#: line follows): how the demo and the tests read a scheduler's crash out of its log.
SCHEDULER_LOOP_CRASH = "Exception when executing SchedulerJob._run_scheduler_loop"
#: The release whose Dag processor first runs task callbacks (3.0.0 to 3.0.3 raise NotImplementedError).
FIRST_RELEASE_RUNNING_TASK_CALLBACKS = "3.0.4"


class FixState(str, enum.Enum):
    """What this package does about one fix on this installation."""

    ACTIVE = "active"
    NOT_NEEDED = "not needed (present upstream)"
    DISABLED = "disabled"
    UNSUPPORTED = "unsupported"
    #: The patched classes are gone (upstream plans to move task callbacks off DatabaseCallbackSink).
    NOT_APPLICABLE = "not applicable"


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


@dataclass(frozen=True)
class FixDecision:
    fix: str
    state: FixState
    reason: str


def _unrecognised(
    facts: AirflowFacts, fix: str, hooks: tuple[str, ...], fact: bool | None, what: str
) -> FixDecision | None:
    """An ``unsupported`` decision naming the version and what was not recognised, if anything wasn't."""
    missing = [hook for hook in facts.missing_hooks if hook in hooks]
    if missing:
        reason = f"SchedulerJobRunner has no {', '.join(missing)}"
    elif fact is None:
        reason = f"{what} has a shape this package does not recognise"
    else:
        return None
    return FixDecision(fix, FixState.UNSUPPORTED, f"Airflow {facts.version}: {reason}; left unpatched")


def _decide_standalone(
    facts: AirflowFacts,
    enabled: bool,
    fix: str,
    needed: bool | None,
    *,
    hooks: tuple[str, ...],
    what: str,
    not_needed: str,
    active: str,
) -> FixDecision:
    """A fix that depends on no other: unrecognised, present upstream, switched off, or applied."""
    if unsupported := _unrecognised(facts, fix, hooks, needed, what):
        return unsupported
    if not needed:
        return FixDecision(fix, FixState.NOT_NEEDED, not_needed)
    if not enabled:
        return FixDecision(fix, FixState.DISABLED, "[heartbeat_fix] enabled = False")
    return FixDecision(fix, FixState.ACTIVE, active)


def _decide_sink(facts: AirflowFacts, enabled: bool) -> FixDecision:
    return _decide_standalone(
        facts,
        enabled,
        SINK_FIX,
        facts.sink_commits_caller_session,
        hooks=SINK_FIX_HOOKS,
        what="DatabaseCallbackSink.send",
        not_needed="DatabaseCallbackSink.send already uses the caller's session",
        active="DatabaseCallbackSink.send is @provide_session and commits/closes the scheduler's session",
    )


def _decide_purge(facts: AirflowFacts, enabled: bool, sink: FixDecision) -> FixDecision:
    fact = facts.purge_converges
    if unsupported := _unrecognised(facts, PURGE_FIX, PURGE_FIX_HOOKS, fact, "the heartbeat-timeout purge"):
        return unsupported
    if fact:
        return FixDecision(
            PURGE_FIX,
            FixState.NOT_NEEDED,
            "the purge already locks its rows and calls handle_failure() in the same pass",
        )
    if not enabled:
        return FixDecision(PURGE_FIX, FixState.DISABLED, "[heartbeat_fix] enabled = False")
    if sink.state not in (FixState.ACTIVE, FixState.NOT_NEEDED):
        # Without a sink that leaves the session alone, the row locks and the batch's task instances
        # would not survive the first callback: the backport is only correct on top of it.
        return FixDecision(
            PURGE_FIX, FixState.UNSUPPORTED, "needs the session-preserving callback sink, which is not active"
        )
    return FixDecision(
        PURGE_FIX,
        FixState.ACTIVE,
        "the purge sends a callback but leaves the task instance RUNNING for the next scan"
        + _no_task_callbacks_note(facts),
    )


def _no_task_callbacks_note(facts: AirflowFacts) -> str:
    """What no fix here changes: a Dag processor that cannot run task callbacks (one clause, or "")."""
    if facts.processor_runs_task_callbacks:
        return ""
    return (
        f"; this Airflow's Dag processor runs no task callback (NotImplementedError), so "
        f"on_failure/on_retry callbacks never run: upgrade to {FIRST_RELEASE_RUNNING_TASK_CALLBACKS}+"
    )


def _decide_lock(facts: AirflowFacts, enabled: bool, sink: FixDecision, purge: FixDecision) -> FixDecision:
    fact = facts.purge_locks_each_ti
    if unsupported := _unrecognised(facts, LOCK_FIX, PURGE_FIX_HOOKS, fact, "the heartbeat-timeout purge"):
        return unsupported
    if fact:
        return FixDecision(
            LOCK_FIX, FixState.NOT_NEEDED, "the purge already re-reads each task instance under its row lock"
        )
    if not enabled:
        return FixDecision(LOCK_FIX, FixState.DISABLED, "[heartbeat_fix] enabled = False")
    usable = (FixState.ACTIVE, FixState.NOT_NEEDED)
    if purge.state not in usable:
        # The stock 3.2/3.3 purge never changes the state: there is nothing to hold a lock through.
        return FixDecision(
            LOCK_FIX,
            FixState.UNSUPPORTED,
            "needs a converged purge (upstream's or the backport), which is not active",
        )
    if sink.state not in usable:
        # A sink that commits the scheduler's session releases the lock before handle_failure().
        return FixDecision(
            LOCK_FIX, FixState.UNSUPPORTED, "needs the session-preserving callback sink, which is not active"
        )
    return FixDecision(
        LOCK_FIX,
        FixState.ACTIVE,
        "handle_failure() commits per task instance, releasing the batch's row locks, and the re-check "
        "before each task instance's side effects reads without a lock",
    )


def _decide_event_type(facts: AirflowFacts, enabled: bool) -> FixDecision:
    typed = facts.executor_events_type_callbacks
    return _decide_standalone(
        facts,
        enabled,
        EVENT_TYPE_FIX,
        None if typed is None else not typed,
        hooks=EVENT_TYPE_FIX_HOOKS,
        what="process_executor_events",
        not_needed="executor-event callbacks already carry their retry state",
        active="process_executor_events sends an untyped TaskCallbackRequest, which the Dag processor runs "
        "as on_failure_callback even when the try will be retried",
    )


def _decide_nested(facts: AirflowFacts, enabled: bool) -> FixDecision:
    decision = _decide_standalone(
        facts,
        enabled,
        NESTED_FIX,
        facts.nested_session_ends_transaction,
        hooks=NESTED_FIX_HOOKS,
        what="create_session",
        not_needed="create_session() joins the transaction of an enclosing one",
        active="a create_session() nested in the loop commits or rolls back and closes the loop's session"
        + "".join(_nested_session_effects(facts)),
    )
    if decision.state is FixState.ACTIVE and not facts.create_session_recognised:
        return FixDecision(NESTED_FIX, FixState.UNSUPPORTED, UNRECOGNISED_CREATE_SESSION)
    return decision


#: Why the nested-session fix cannot act where create_session was replaced (status and the start line).
UNRECOGNISED_CREATE_SESSION = (
    "airflow.utils.session.create_session was replaced by code that does not call Airflow's, so a "
    "session nested in the scheduler loop cannot be recognised; left unpatched"
)


def _nested_session_effects(facts: AirflowFacts) -> list[str]:
    """What else a nested session does on this release, each as a clause of the status reason."""
    effects = ["; inside prohibit_commit its commit raises (the scheduling loop rolls back and crash-loops)"]
    if facts.metastore_expunges:
        effects.append("; Variable and Connection lookups expunge_all() it (pending callbacks are lost)")
    if facts.listeners_before_next_try:
        effects.append("; a failure listener's session crashes a retry (UniqueViolation)")
    return effects


def _decide_adoption(facts: AirflowFacts, enabled: bool, nested: FixDecision) -> FixDecision:
    attached = facts.adoption_keeps_orphans_attached
    decision = _decide_standalone(
        facts,
        enabled,
        ADOPTION_FIX,
        None if attached is None else not attached,
        hooks=ADOPTION_FIX_HOOKS,
        what="adopt_or_reset_orphaned_tasks",
        not_needed="adopt_or_reset_orphaned_tasks re-reads the orphans through its session after executors "
        "adopt",
        active="adopt_or_reset_orphaned_tasks hands its locked, half-loaded orphans to "
        "try_adopt_task_instances in its own session; a scoped create_session() there commits and closes it",
    )
    if decision.state is FixState.ACTIVE and nested.state not in (FixState.ACTIVE, FixState.NOT_NEEDED):
        # The executor's own sessions are nested in the adoption's: that fix (or upstream) holds them.
        return FixDecision(ADOPTION_FIX, FixState.UNSUPPORTED, f"needs {NESTED_FIX}, which is not active")
    return decision


def decide(facts: AirflowFacts, *, enabled: bool) -> dict[str, FixDecision]:
    """Map the facts about an installation to one decision per fix."""
    if not facts.has_callback_sink:
        why = f"Airflow {facts.version} has no DatabaseCallbackSink: the code these fixes patch is gone"
        return {fix: FixDecision(fix, FixState.NOT_APPLICABLE, why) for fix in FIXES}
    sink = _decide_sink(facts, enabled)
    purge = _decide_purge(facts, enabled, sink)
    nested = _decide_nested(facts, enabled)
    return {
        NESTED_FIX: nested,
        SINK_FIX: sink,
        PURGE_FIX: purge,
        LOCK_FIX: _decide_lock(facts, enabled, sink, purge),
        EVENT_TYPE_FIX: _decide_event_type(facts, enabled),
        ADOPTION_FIX: _decide_adoption(facts, enabled, nested),
    }


def _names_used(func: Any) -> frozenset[str] | None:
    code = getattr(func, "__code__", None)
    return frozenset(code.co_names) if code is not None else None


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
    purge = _names_used(getattr(runner_cls, "_purge_task_instances_without_heartbeats", None))
    find = _names_used(getattr(runner_cls, "_find_task_instances_without_heartbeats", None))
    if purge is None or find is None or "send_callback" not in purge:
        return None
    if "handle_failure" in purge:
        return "with_row_locks" in find or None
    return False


def _keyword_names(code: Any) -> frozenset[str]:
    """Keyword-argument names passed in ``code`` (CPython keeps them as tuples of strings in co_consts)."""
    tuples = (const for const in code.co_consts if isinstance(const, tuple))
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
    if code is None or "send_callback" not in code.co_names:
        return None
    names = set(code.co_names) | _keyword_names(code)
    return bool(names & {"with_row_locks", "with_for_update", "lock_for_update"})


def executor_events_type_callbacks(runner_cls: type) -> bool | None:
    """
    Whether ``process_executor_events`` types the ``TaskCallbackRequest`` it sends for a killed worker.

    From 3.1.1 (apache/airflow#56607) it passes ``task_callback_type=`` by retry eligibility; before,
    the request is untyped and the Dag processor runs it as ``on_failure_callback``.
    """
    code = getattr(getattr(runner_cls, "process_executor_events", None), "__code__", None)
    if code is None or "TaskCallbackRequest" not in code.co_names:
        return None
    return "task_callback_type" in _keyword_names(code)


#: Session reads that, after the executors' adoption, would load the orphans again (upstream's proposal).
_REREADS = frozenset({"scalars", "scalar", "execute", "merge", "get", "refresh", "refresh_from_db"})


def adoption_keeps_orphans_attached(runner_cls: type) -> bool | None:
    """
    Whether ``adopt_or_reset_orphaned_tasks`` re-reads the orphans through its session after the
    executors' ``try_adopt_task_instances``, so what an executor does with the session cannot detach them.

    Every release up to 3.4.0b2 selects the orphans (``load_only``) and then only writes to the
    instances it handed the executors (apache/airflow#71272); #71348 proposes re-selecting them by id.
    """
    import dis

    adopt = getattr(runner_cls, "adopt_or_reset_orphaned_tasks", None)
    code = getattr(getattr(adopt, "__wrapped__", adopt), "__code__", None)
    if code is None or "try_adopt_task_instances" not in code.co_names:
        return None
    names = [ins.argval for ins in dis.get_instructions(code) if isinstance(ins.argval, str)]
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
    names = frozenset(generator.__code__.co_names)
    if "begin_nested" in names:
        return False
    return True if {"commit", "rollback", "close"} <= names else None


def metastore_expunges(backend_cls: type | None) -> bool:
    """Whether the metastore secrets backend's lookups ``expunge_all()`` their session (3.0, 3.1)."""
    lookups = (getattr(backend_cls, name, None) for name in ("get_connection", "get_variable"))
    codes = (_names_used(getattr(lookup, "__wrapped__", lookup)) for lookup in lookups)
    return any(names is not None and "expunge_all" in names for names in codes)


def listeners_before_next_try(task_instance_cls: type | None) -> bool:
    """
    Whether a failing try's listeners run before ``prepare_db_for_next_try`` archives it (3.4), so that a
    listener's session, closing the scheduler's, leaves nothing for the archive to write.
    """
    import dis

    code = getattr(getattr(task_instance_cls, "fetch_handle_failure_context", None), "__code__", None)
    if code is None:
        return False
    names = [ins.argval for ins in dis.get_instructions(code) if isinstance(ins.argval, str)]
    notified = [at for at, name in enumerate(names) if name in ("notify_failure", "get_listener_manager")]
    archived = [at for at, name in enumerate(names) if name == "prepare_db_for_next_try"]
    return bool(notified and archived and notified[0] < archived[0])


def processor_runs_task_callbacks(execute_callbacks: Any) -> bool:
    """
    Whether the Dag processor's ``_execute_callbacks`` runs task callbacks (3.0.0 to 3.0.3 raise instead).

    Only a clear "no" counts: a shape without ``NotImplementedError`` is taken to run them.
    """
    names = _names_used(execute_callbacks)
    return names is None or "NotImplementedError" not in names or "_execute_task_callbacks" in names


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
    execute_callbacks: Any = None,
) -> AirflowFacts:
    """
    Inspect Airflow's own (unpatched) sink and scheduler classes; ``sink_cls`` None: no such sink.

    ``execute_callbacks``: the Dag processor's ``_execute_callbacks``, where it has one.
    """
    if sink_cls is None:
        return AirflowFacts(version, None, None, has_callback_sink=False)
    hooks = (*SINK_FIX_HOOKS, *PURGE_FIX_HOOKS, *EVENT_TYPE_FIX_HOOKS, *ADOPTION_FIX_HOOKS, *NESTED_FIX_HOOKS)
    missing = tuple(dict.fromkeys(hook for hook in hooks if not hasattr(runner_cls, hook)))
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
    )
