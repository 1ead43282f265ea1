"""
Which fixes the installed Airflow needs: the fixes' names, and the pure :func:`decide` over the facts
:mod:`~airflow_heartbeat_fix.facts` reads off Airflow's code (never its version string).

Each fix is one :class:`Rule`: the process it acts in (its :attr:`Rule.target`: the scheduler or the Dag
processor), the fact that says whether Airflow still has the bug, the reasons ``status`` gives, and the
fixes it builds on. :func:`decide` applies the same steps to every rule, so the decision table is testable
without any particular Airflow installed. Only the standard library is imported here (``parity`` reads the
fix names without Airflow).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow_heartbeat_fix.facts import AirflowFacts, DagProcessorFacts

SINK_FIX = "session_preserving_sink"
PURGE_FIX = "converged_heartbeat_purge"
LOCK_FIX = "locked_purge_revalidation"
EVENT_TYPE_FIX = "typed_executor_event_callbacks"
ADOPTION_FIX = "held_orphan_adoption"
NESTED_FIX = "nested_sessions_join_loop"
HEARTBEAT_EVENTS_FIX = "heartbeat_judged_executor_events"
CLAIMED_FIX = "claimed_callback_delivery"
ISOLATED_FIX = "isolated_callback_requests"
INFLATION_FIX = "callbacks_past_inflation_check"

#: The processes the fixes act in: what the ``airflow.policy`` hook activates, per command.
SCHEDULER, DAG_PROCESSOR = "scheduler", "dag_processor"
TARGETS = (SCHEDULER, DAG_PROCESSOR)
#: How the start line and ``status`` name a target.
TARGET_LABELS = {SCHEDULER: "scheduler", DAG_PROCESSOR: "Dag processor"}
#: The Airflow class whose methods a target's rules wrap (named when one of them is missing).
TARGET_CLASSES = {SCHEDULER: "SchedulerJobRunner", DAG_PROCESSOR: "DagFileProcessorManager"}
SCHEDULER_FIXES = (
    NESTED_FIX,
    SINK_FIX,
    PURGE_FIX,
    LOCK_FIX,
    EVENT_TYPE_FIX,
    ADOPTION_FIX,
    HEARTBEAT_EVENTS_FIX,
)
DAG_PROCESSOR_FIXES = (CLAIMED_FIX, ISOLATED_FIX, INFLATION_FIX)
TARGET_FIXES = {SCHEDULER: SCHEDULER_FIXES, DAG_PROCESSOR: DAG_PROCESSOR_FIXES}
FIXES = SCHEDULER_FIXES + DAG_PROCESSOR_FIXES

FIX_TITLES = {
    NESTED_FIX: "a create_session() nested in the scheduler loop (listeners, cluster policies, Variable and "
    "Connection lookups, deadline alerts) never ends the loop's transaction: it commits on its own when the "
    "loop holds nothing, else joins it, and listeners run after the loop's commit (crash loops, "
    "UniqueViolation on retry, lost callbacks)",
    SINK_FIX: "callback sink keeps the scheduler's session (UniqueViolation crash, detached batches)",
    PURGE_FIX: "heartbeat-timeout purge converges the task instance (duplicate callbacks)",
    LOCK_FIX: "heartbeat-timeout purge holds each task instance's row lock through its failure "
    "(a worker's SUCCESS overwritten, failure callback for a task that succeeded)",
    EVENT_TYPE_FIX: "a worker reported failed by its executor gets the callback of its retry state "
    "(on_failure_callback while retries remain)",
    ADOPTION_FIX: "orphan adoption keeps the scheduler's session and row locks through the executor's "
    "try_adopt_task_instances (DetachedInstanceError crash loop, lost resets, double adoption)",
    HEARTBEAT_EVENTS_FIX: "a terminal executor event for a running try whose worker still heartbeats is set "
    "aside until the heartbeat stops (a duplicate's or a redelivery's FAILED no longer fails the live try)",
    CLAIMED_FIX: "a callback request leaves the database only after its callback ran; a Dag processor or "
    "file processor that dies leaves its requests to the next (lost failure and retry callbacks)",
    ISOLATED_FIX: "one failing or invalid callback request never stops the rest of its batch (callbacks lost "
    "behind a removed task or Dag)",
    INFLATION_FIX: "the Dag version inflation check at 'error' no longer drops a file's callbacks (callbacks "
    "lost without a log line)",
}

#: Scheduler methods the fixes wrap; a version without any of them is a shape we do not understand.
SINK_FIX_HOOKS = ("_run_scheduler_loop", "_send_dag_callbacks_to_processor", "_process_executor_events")
PURGE_FIX_HOOKS = ("_find_task_instances_without_heartbeats", "_purge_task_instances_without_heartbeats")
EVENT_TYPE_FIX_HOOKS = ("_process_executor_events", "process_executor_events")
ADOPTION_FIX_HOOKS = ("adopt_or_reset_orphaned_tasks",)
HEARTBEAT_EVENTS_FIX_HOOKS = ("_process_executor_events", "process_executor_events")
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
#: DagFileProcessorManager methods the Dag processor fixes wrap (the fetch is a fact of its own: its name
#: changed in 3.3).
CLAIMED_FIX_HOOKS = ("_add_callback_to_queue", "_create_process", "_collect_results", "run")
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
class FixDecision:
    fix: str
    state: FixState
    reason: str


#: A fix another builds on is usable when it is applied here or Airflow already has it.
USABLE = (FixState.ACTIVE, FixState.NOT_NEEDED)


@dataclass(frozen=True)
class Rule:
    """How one fix is decided."""

    fix: str
    #: The methods it wraps (of :data:`TARGET_CLASSES`'s class): a release without one of them is a shape
    #: not understood.
    hooks: tuple[str, ...]
    #: What :attr:`needed` reads, named when its shape is not recognised.
    what: str
    #: Whether Airflow still has the bug (``None``: its code has a shape not recognised).
    needed: Callable[[AirflowFacts], bool | None]
    not_needed: str
    #: Why it is applied, as ``status`` says it.
    active: Callable[[AirflowFacts], str]
    #: Fixes it is only correct on top of: each must be active or present upstream.
    requires: tuple[str, ...] = ()
    #: Why it cannot act on this installation even where it is needed (``None``: it can).
    blocked: Callable[[AirflowFacts], str | None] = lambda facts: None
    #: The process it acts in.
    target: str = SCHEDULER


def _negated(fact: bool | None) -> bool | None:
    return None if fact is None else not fact


def _no_task_callbacks_note(facts: AirflowFacts) -> str:
    """What no fix here changes: a Dag processor that cannot run task callbacks (one clause, or "")."""
    if facts.processor_runs_task_callbacks:
        return ""
    return (
        f"; this Airflow's Dag processor runs no task callback (NotImplementedError), so "
        f"on_failure/on_retry callbacks never run: upgrade to {FIRST_RELEASE_RUNNING_TASK_CALLBACKS}+"
    )


def _nested_session_effects(facts: AirflowFacts) -> list[str]:
    """What else a nested session does on this release, each as a clause of the status reason."""
    effects = ["; inside prohibit_commit its commit raises (the scheduling loop rolls back and crash-loops)"]
    if facts.metastore_expunges:
        effects.append("; Variable and Connection lookups expunge_all() it (pending callbacks are lost)")
    if facts.listeners_before_next_try:
        effects.append("; a failure listener's session crashes a retry (UniqueViolation)")
    return effects


#: Why the nested-session fix cannot act where create_session was replaced (status and the start line).
UNRECOGNISED_CREATE_SESSION = (
    "airflow.utils.session.create_session was replaced by code that does not call Airflow's, so a "
    "session nested in the scheduler loop cannot be recognised; left unpatched"
)


SCHEDULER_RULES = (
    Rule(
        NESTED_FIX,
        NESTED_FIX_HOOKS,
        what="create_session",
        needed=lambda facts: facts.nested_session_ends_transaction,
        not_needed="create_session() joins the transaction of an enclosing one",
        active=lambda facts: (
            "a create_session() nested in the loop commits or rolls back and closes the loop's session"
            + "".join(_nested_session_effects(facts))
        ),
        blocked=lambda facts: None if facts.create_session_recognised else UNRECOGNISED_CREATE_SESSION,
    ),
    Rule(
        SINK_FIX,
        SINK_FIX_HOOKS,
        what="DatabaseCallbackSink.send",
        needed=lambda facts: facts.sink_commits_caller_session,
        not_needed="DatabaseCallbackSink.send already uses the caller's session",
        active=lambda facts: (
            "DatabaseCallbackSink.send is @provide_session and commits/closes the scheduler's session"
        ),
    ),
    Rule(
        PURGE_FIX,
        PURGE_FIX_HOOKS,
        what="the heartbeat-timeout purge",
        needed=lambda facts: _negated(facts.purge_converges),
        not_needed="the purge already locks its rows and calls handle_failure() in the same pass",
        active=lambda facts: (
            "the purge sends a callback but leaves the task instance RUNNING for the next scan"
            + _no_task_callbacks_note(facts)
        ),
        # Without a sink that leaves the session alone, the row locks and the batch's task instances
        # would not survive the first callback.
        requires=(SINK_FIX,),
    ),
    Rule(
        LOCK_FIX,
        PURGE_FIX_HOOKS,
        what="the heartbeat-timeout purge",
        needed=lambda facts: _negated(facts.purge_locks_each_ti),
        not_needed="the purge already re-reads each task instance under its row lock",
        active=lambda facts: (
            "handle_failure() commits per task instance, releasing the batch's row locks, and the re-check "
            "before each task instance's side effects reads without a lock"
        ),
        # The stock 3.2/3.3 purge never changes the state: there is nothing to hold a lock through; and a
        # sink that commits the scheduler's session releases the lock before handle_failure().
        requires=(PURGE_FIX, SINK_FIX),
    ),
    Rule(
        EVENT_TYPE_FIX,
        EVENT_TYPE_FIX_HOOKS,
        what="process_executor_events",
        needed=lambda facts: _negated(facts.executor_events_type_callbacks),
        not_needed="executor-event callbacks already carry their retry state",
        active=lambda facts: (
            "process_executor_events sends an untyped TaskCallbackRequest, which the Dag processor runs "
            "as on_failure_callback even when the try will be retried"
        ),
    ),
    Rule(
        ADOPTION_FIX,
        ADOPTION_FIX_HOOKS,
        what="adopt_or_reset_orphaned_tasks",
        needed=lambda facts: _negated(facts.adoption_keeps_orphans_attached),
        not_needed="adopt_or_reset_orphaned_tasks re-reads the orphans through its session after executors "
        "adopt",
        active=lambda facts: (
            "adopt_or_reset_orphaned_tasks hands its locked, half-loaded orphans to try_adopt_task_instances "
            "in its own session; a scoped create_session() there commits and closes it"
        ),
        # The executor's own sessions are nested in the adoption's: that fix (or upstream) holds them.
        requires=(NESTED_FIX,),
    ),
    Rule(
        HEARTBEAT_EVENTS_FIX,
        HEARTBEAT_EVENTS_FIX_HOOKS,
        what="process_executor_events",
        needed=lambda facts: _negated(facts.executor_events_read_heartbeat),
        not_needed="process_executor_events already reads the heartbeat of a running try before failing it",
        active=lambda facts: (
            "process_executor_events fails a running try on any FAILED or SUCCESS event for its key without "
            "reading its heartbeat: a duplicate delivery's or a Celery redelivery's FAILED fails the live try"
        ),
    ),
)


def _dag_processor(facts: AirflowFacts) -> DagProcessorFacts:
    """The Dag processor's facts: read wherever a Dag processor rule is decided (:func:`decide`)."""
    assert facts.dag_processor is not None
    return facts.dag_processor


def _claim_blocked(facts: AirflowFacts) -> str | None:
    found = _dag_processor(facts)
    if not found.file_processors_forked:
        return (
            "this Airflow starts file processors as fresh interpreters on this platform (not os.fork), so "
            "the rows of a batch cannot reach them; left unpatched"
        )
    if found.queue_front is None:
        return (
            "DagFileProcessorManager._add_files_to_queue takes neither mode nor add_at_front, so a file "
            "whose requests wait cannot be queued again; left unpatched"
        )
    return None


def _claimed_needed(facts: AirflowFacts) -> bool | None:
    found = _dag_processor(facts)
    return None if found.callback_payload is None else found.fetch_deletes_requests


DAG_PROCESSOR_RULES = (
    Rule(
        CLAIMED_FIX,
        CLAIMED_FIX_HOOKS,
        what="the Dag processor's callback fetch and its stored requests",
        needed=_claimed_needed,
        not_needed="the Dag processor already leaves a callback request stored until its callback has run",
        active=lambda facts: (
            "the Dag processor deletes each callback request when it fetches it: a Dag processor or file "
            "processor that dies (OOM kill, eviction, deploy, dag_file_processor_timeout) before the "
            "callback ran loses it" + _no_task_callbacks_note(facts)
        ),
        blocked=_claim_blocked,
        target=DAG_PROCESSOR,
    ),
    Rule(
        ISOLATED_FIX,
        CLAIMED_FIX_HOOKS,
        what="the Dag processor's _execute_callbacks",
        needed=lambda facts: _negated(_dag_processor(facts).requests_isolated),
        not_needed="_execute_callbacks already runs each request in its own try (apache/airflow#70990)",
        active=lambda facts: (
            "one callback request that raises (its Dag or task removed, a context that cannot be built) ends "
            "the file processor and the rest of its batch (apache/airflow#70990)"
        ),
        target=DAG_PROCESSOR,
    ),
    Rule(
        INFLATION_FIX,
        CLAIMED_FIX_HOOKS,
        what="the file processor's _parse_file",
        needed=lambda facts: _dag_processor(facts).inflation_check_blocks_callbacks,
        not_needed="the Dag version inflation check never stops a file's callbacks here (absent before "
        "3.2.0; skipped for callbacks from apache/airflow#70987)",
        active=lambda facts: (
            "with [dag_processor] dag_version_inflation_check_level = error, a file the check refuses has "
            "its callback requests dropped without a log line (apache/airflow#70987)"
        ),
        target=DAG_PROCESSOR,
    ),
)
RULES = SCHEDULER_RULES + DAG_PROCESSOR_RULES


def hooks_of(target: str) -> tuple[str, ...]:
    """Every method of :data:`TARGET_CLASSES`'s class that ``target``'s fixes wrap, once each."""
    return tuple(dict.fromkeys(hook for rule in RULES if rule.target == target for hook in rule.hooks))


def decide_rule(
    rule: Rule, facts: AirflowFacts, *, enabled: bool, decided: dict[str, FixDecision]
) -> FixDecision:
    """
    One fix: not recognised, present upstream, switched off, missing a fix it builds on, blocked here, or
    applied. ``decided``: the fixes decided before it (each of :attr:`Rule.requires` is among them).
    """
    needed = rule.needed(facts)
    hooks = facts.missing_hooks if rule.target == SCHEDULER else _dag_processor(facts).missing_hooks
    missing = [hook for hook in hooks if hook in rule.hooks]
    if missing or needed is None:
        shape = (
            f"{TARGET_CLASSES[rule.target]} has no {', '.join(missing)}"
            if missing
            else (f"{rule.what} has a shape this package does not recognise")
        )
        return FixDecision(
            rule.fix, FixState.UNSUPPORTED, f"Airflow {facts.version}: {shape}; left unpatched"
        )
    if not needed:
        return FixDecision(rule.fix, FixState.NOT_NEEDED, rule.not_needed)
    if not enabled:
        return FixDecision(rule.fix, FixState.DISABLED, "[heartbeat_fix] enabled = False")
    for required in rule.requires:
        if decided[required].state not in USABLE:
            return FixDecision(rule.fix, FixState.UNSUPPORTED, f"needs {required}, which is not active")
    if blocked := rule.blocked(facts):
        return FixDecision(rule.fix, FixState.UNSUPPORTED, blocked)
    return FixDecision(rule.fix, FixState.ACTIVE, rule.active(facts))


def decide(facts: AirflowFacts, *, enabled: bool) -> dict[str, FixDecision]:
    """
    Map the facts about an installation to one decision per fix, in :data:`FIXES` order: the scheduler's
    fixes always, the Dag processor's where its facts were read (:attr:`AirflowFacts.dag_processor`).
    """
    decided: dict[str, FixDecision] = {}
    if not facts.has_callback_sink:
        why = f"Airflow {facts.version} has no DatabaseCallbackSink: the code these fixes patch is gone"
        decided = {fix: FixDecision(fix, FixState.NOT_APPLICABLE, why) for fix in SCHEDULER_FIXES}
    for rule in RULES:
        if rule.fix in decided or (rule.target == DAG_PROCESSOR and facts.dag_processor is None):
            continue
        decided[rule.fix] = decide_rule(rule, facts, enabled=enabled, decided=decided)
    return {fix: decided[fix] for fix in FIXES if fix in decided}
