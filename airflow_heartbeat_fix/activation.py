"""
Turn the fixes on in this process, and off again.

``install(target=SCHEDULER)`` swaps the scheduler command's ``SchedulerJobRunner`` for a subclass with the
active fixes and, when the sink fix is active, Airflow's ``DatabaseCallbackSink`` for the
session-preserving subclass. ``install(target=DAG_PROCESSOR)`` swaps the Dag processor command's
``DagFileProcessorManager`` for a subclass and the file processor's ``_execute_callbacks`` (and, where the
inflation check drops callbacks, ``_parse_file``) for the package's. :func:`uninstall` puts the originals
back, of every target. What is active comes from :func:`~airflow_heartbeat_fix.detection.decide` on the
unpatched code and ``[heartbeat_fix] enabled``.

Like sentry's and ddtrace's integrations: the automatic path (the ``airflow.policy`` import hook) logs a
failure and leaves Airflow as it is; the explicit path (``airflow-heartbeat-fix scheduler``) raises.
An Airflow outside the supported range (:mod:`~airflow_heartbeat_fix.support`) is recognised first,
from metadata, and nothing of its internals is imported.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any

from airflow_heartbeat_fix import support
from airflow_heartbeat_fix.config_check import SECTION as CONFIG_SECTION
from airflow_heartbeat_fix.config_check import config_warnings
from airflow_heartbeat_fix.detection import (
    DAG_PROCESSOR,
    FIX_TITLES,
    FIXES,
    NESTED_FIX,
    SCHEDULER,
    SINK_FIX,
    TARGET_FIXES,
    TARGET_LABELS,
    TARGETS,
    FixDecision,
    FixState,
    decide,
    hooks_of,
)
from airflow_heartbeat_fix.facts import (
    AirflowFacts,
    DagProcessorCode,
    SessionCode,
    processor_runs_task_callbacks,
    read_dag_processor_facts,
    read_facts,
)
from airflow_heartbeat_fix.logs import fix_logger

#: What Airflow's ``conf.getboolean`` accepts, for the one-line error.
ACCEPTED_BOOLEANS = "True/False, t/f, 1/0"


class ActivationError(RuntimeError):
    """The explicit activation could not apply a fix this Airflow needs."""


@dataclass(frozen=True)
class Switch:
    """``[heartbeat_fix] enabled`` as read, and why it was overridden if it was."""

    enabled: bool
    raw: str
    problem: str | None = None


def read_switch() -> Switch:
    """
    ``[heartbeat_fix] enabled`` (``AIRFLOW__HEARTBEAT_FIX__ENABLED``), default True.

    An invalid value fails safe: the fixes stay on, and :attr:`Switch.problem` says why, in one line.
    """
    from airflow.configuration import conf
    from airflow.exceptions import AirflowConfigException

    raw = str(conf.get(CONFIG_SECTION, "enabled", fallback="True"))
    try:
        return Switch(conf.getboolean(CONFIG_SECTION, "enabled", fallback=True), raw)
    except AirflowConfigException:
        problem = (
            f"[{CONFIG_SECTION}] enabled = {raw!r} is not a boolean (accepted: {ACCEPTED_BOOLEANS}); "
            "the fixes stay on"
        )
        return Switch(True, raw, problem)


def is_enabled() -> bool:
    return read_switch().enabled


#: True while :func:`dry_run` activates: the caller reports the outcome, the start line is the scheduler's.
_quiet = False


def _say(level: int, message: str) -> None:
    if not _quiet:
        fix_logger().log(level, message)  # no arguments: the line is not %-formatted


def one_line(exc: BaseException) -> str:
    """An exception as one line (configparser's messages span three)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


@functools.cache
def _originals() -> dict[str, Any]:
    """Airflow's own classes, captured before anything here replaces them."""
    from airflow.jobs import scheduler_job_runner

    from airflow_heartbeat_fix._compat import database_callback_sink_module

    # A future Airflow without the sink: the fixes are not applicable (decide() says so).
    sink_module = database_callback_sink_module()
    sink = sink_module.DatabaseCallbackSink if sink_module is not None else None
    return {"sink": sink, "runner": scheduler_job_runner.SchedulerJobRunner}


def _session_code() -> SessionCode:
    """What detection reads about Airflow's sessions and the code that runs nested in the loop's."""
    from airflow.models.taskinstance import TaskInstance

    from airflow_heartbeat_fix._compat import metastore_backend_class
    from airflow_heartbeat_fix.nested_sessions import airflows_create_session, create_session_reached

    return SessionCode(
        airflows_create_session(), metastore_backend_class(), TaskInstance, create_session_reached()
    )


@functools.cache
def _dag_processor_originals() -> dict[str, Any]:
    """The Dag processor's own code, captured before anything here replaces it."""
    from airflow_heartbeat_fix import _compat

    processor = _compat.file_processor_module()
    return {
        "manager": _compat.dag_processor_manager_class(),
        "execute_callbacks": processor._execute_callbacks,
        "parse_file": processor._parse_file,
    }


def _dag_processor_code() -> DagProcessorCode:
    from airflow_heartbeat_fix import _compat

    originals = _dag_processor_originals()
    return DagProcessorCode(
        manager_cls=originals["manager"],
        callback_columns=tuple(_compat.callback_request_model().__table__.columns.keys()),
        file_processor_start=_compat.file_processor_module().DagFileProcessorProcess.start,
        should_use_exec=_compat.file_processors_use_exec,
        execute_callbacks=originals["execute_callbacks"],
        parse_file=originals["parse_file"],
        hooks=hooks_of(DAG_PROCESSOR),
    )


def facts(targets: tuple[str, ...] = TARGETS) -> AirflowFacts:
    """
    What Airflow's code says, for the fixes of ``targets``: a Dag processor reads nothing of the scheduler
    (its facts then stand in, never decided), a scheduler nothing of the Dag processor.
    """
    from airflow import __version__ as airflow_version

    from airflow_heartbeat_fix._compat import dag_processor_execute_callbacks

    processor_code = _dag_processor_code() if DAG_PROCESSOR in targets else None
    if SCHEDULER not in targets:
        assert processor_code is not None
        return AirflowFacts(
            airflow_version,
            None,
            None,
            processor_runs_task_callbacks=processor_runs_task_callbacks(processor_code.execute_callbacks),
            dag_processor=read_dag_processor_facts(processor_code),
        )
    originals = _originals()
    return read_facts(
        version=airflow_version,
        sink_cls=originals["sink"],
        runner_cls=originals["runner"],
        session_code=_session_code(),
        hooks=hooks_of(SCHEDULER),
        execute_callbacks=dag_processor_execute_callbacks(),
        dag_processor=processor_code,
    )


#: How the start line and ``status`` say the operator switched the fixes off.
OFF_BY_CONFIGURATION = f"off by configuration ([{CONFIG_SECTION}] enabled = False)"


def stock_classes(target: str = SCHEDULER) -> str:
    return f"the {TARGET_LABELS[target]} runs Airflow's own classes"


STOCK_CLASSES = stock_classes()


def summary(
    decided: dict[str, FixDecision],
    version: str,
    problem: str | None = None,
    *,
    switched_off: bool = False,
    target: str = SCHEDULER,
) -> str:
    """
    The one line a process of ``target`` logs at start: each of its fixes' state (an unsupported one with
    its reason), or the single reason nothing is patched, after "off by configuration" if the operator said
    so; then the configuration problem, if any. The scheduler's line names no target (it came first).
    """
    own = {fix: decided[fix] for fix in TARGET_FIXES[target] if fix in decided}
    states = {d.state for d in own.values()}
    reasons = {d.reason for d in own.values()}
    if states == {FixState.UNSUPPORTED} and len(reasons) == 1:
        body = f"{reasons.pop()}; {stock_classes(target)}"
    else:
        body = "; ".join(
            f"{fix}: {d.state.value}" + (f" ({d.reason})" if d.state is FixState.UNSUPPORTED else "")
            for fix, d in own.items()
        )
        if switched_off:
            body = f"{OFF_BY_CONFIGURATION}; {stock_classes(target)} ({body})"
    where = "" if target == SCHEDULER else f" ({TARGET_LABELS[target]})"
    line = f"airflow-heartbeat-fix on Airflow {version}{where}: {body}"
    return f"{line} ({problem})" if problem else line


def not_applied(decided: dict[str, FixDecision]) -> list[FixDecision]:
    """
    Fixes this Airflow needs (or may need) that cannot be applied. A fix the operator switched off is
    not one of them: that is a choice, and the scheduler starts as Airflow ships it (callers also let a
    switched-off installation pass whatever else was found, so the switch never stops a scheduler).
    """
    return [d for d in decided.values() if d.state is FixState.UNSUPPORTED]


def outside_range(reason: str, fixes: tuple[str, ...] = FIXES) -> dict[str, FixDecision]:
    """Every fix unsupported with the one out-of-range reason: decided without reading Airflow's code."""
    return {fix: FixDecision(fix, FixState.UNSUPPORTED, reason) for fix in fixes}


def _failed(
    decided: dict[str, FixDecision], exc: BaseException, fixes: tuple[str, ...] = FIXES
) -> dict[str, FixDecision]:
    """Every fix that was to be applied, reported unsupported with the error that stopped it."""
    why = f"could not be applied ({one_line(exc)}); left unpatched"
    failed = {fix: FixDecision(fix, FixState.UNSUPPORTED, why) for fix in fixes}
    return {
        **failed,
        **{fix: d for fix, d in decided.items() if d.state is not FixState.ACTIVE and fix in failed},
    }


@dataclass
class _Installed:
    """What :func:`install` did for one target: its decisions, and every patch with what it replaced."""

    target: str = SCHEDULER
    decided: dict[str, FixDecision] = field(default_factory=dict)
    patched: list[tuple[object, str, Any]] = field(default_factory=list)


#: One entry per target installed in this process (a process normally runs one command).
_installed: dict[str, _Installed] = {}


def _patch(target: object, name: str, value: Any, into: _Installed) -> None:
    """Set ``target.name`` (a module's, a class's, a closure cell's), recording what to put back."""
    into.patched.append((target, name, getattr(target, name)))
    setattr(target, name, value)


def install(*, target: str = SCHEDULER, raise_errors: bool = False) -> dict[str, FixDecision]:
    """
    Activate the fixes of ``target`` this installation needs; idempotent; returns what was decided (for
    ``target``'s fixes) and applied.

    ``raise_errors=False`` (automatic activation) logs a failure and leaves Airflow unpatched;
    ``raise_errors=True`` (explicit activation) raises :class:`ActivationError` instead.
    """
    if target in _installed:
        return _installed[target].decided
    # Claimed before patching: importing the command below re-enters through the import hook.
    _installed[target] = state = _Installed(target)
    own = TARGET_FIXES[target]
    in_range = support.check()
    if refusal := in_range.refusal:
        state.decided = outside_range(refusal, own)
        _say(logging.WARNING, summary(state.decided, str(in_range.airflow_version), target=target))
        return state.decided
    decided: dict[str, FixDecision] = {}
    version, problem, switched_off = in_range.airflow_version or "?", None, False
    try:
        switch = read_switch()
        problem, switched_off = switch.problem, not switch.enabled
        found = facts((target,))
        version = found.version
        decided = {fix: d for fix, d in decide(found, enabled=switch.enabled).items() if fix in own}
        active = tuple(fix for fix, decision in decided.items() if decision.state is FixState.ACTIVE)
        if active:
            (_apply if target == SCHEDULER else _apply_dag_processor)(active, state)
    except Exception as exc:
        uninstall(target)
        if raise_errors:
            raise ActivationError(f"airflow-heartbeat-fix could not be activated: {one_line(exc)}") from exc
        fix_logger().debug("airflow-heartbeat-fix could not be activated", exc_info=True)
        decided = _failed(decided, exc, own)
        _say(logging.WARNING, summary(decided, version, problem, target=target))
        return decided
    state.decided = decided
    worst = logging.WARNING if problem or (not_applied(decided) and not switched_off) else logging.INFO
    _say(worst, summary(decided, version, problem, switched_off=switched_off, target=target))
    for warning in config_warnings():
        _say(logging.WARNING, f"airflow-heartbeat-fix: {warning}")
    return decided


def _apply_dag_processor(active: tuple[str, ...], state: _Installed) -> None:
    from airflow_heartbeat_fix import _compat
    from airflow_heartbeat_fix.dag_processor import build_manager_class, file_processor_patches

    originals = _dag_processor_originals()
    manager = build_manager_class(active, base=originals["manager"])
    _patch(_compat.dag_processor_command(), "DagFileProcessorManager", manager, state)
    for target, name, value in file_processor_patches(active, originals):
        _patch(target, name, value, state)


def _apply(active: tuple[str, ...], state: _Installed) -> None:
    from airflow_heartbeat_fix._compat import database_callback_sink_module, scheduler_command_module
    from airflow_heartbeat_fix.scheduler import build_runner_class

    runner = build_runner_class(active, base=_originals()["runner"])
    _patch(scheduler_command_module(), "SchedulerJobRunner", runner, state)
    if NESTED_FIX in active:
        from airflow_heartbeat_fix import listener_delivery, nested_sessions

        for target, name, value in (*nested_sessions.patches(), *listener_delivery.patches()):
            _patch(target, name, value, state)
    if SINK_FIX in active:
        from airflow_heartbeat_fix.callback_sink import SessionPreservingCallbackSink

        _patch(database_callback_sink_module(), "DatabaseCallbackSink", SessionPreservingCallbackSink, state)


def uninstall(target: str | None = None) -> None:
    """Restore Airflow's own code, of ``target`` (default: every target installed); idempotent."""
    for installed in [_installed.pop(t) for t in list(_installed) if target in (None, t)][::-1]:
        for module, name, original in reversed(installed.patched):
            setattr(module, name, original)


def dry_run() -> dict[str, FixDecision]:
    """
    What a scheduler and a Dag processor started now would run: the same activations, then undone.

    Import and compatibility failures surface here as ``unsupported`` with the error, exactly as the
    processes would meet them. A target this process already runs the fixes of is reported as it is.
    """
    global _quiet
    decided: dict[str, FixDecision] = {}
    _quiet = True
    try:
        _load_plugins()  # as the processes do when they start: a plugin may replace what the fixes patch
        for target in TARGETS:
            if target in _installed:
                decided.update(_installed[target].decided)
                continue
            try:
                decided.update(install(target=target))
            finally:
                uninstall(target)
    finally:
        _quiet = False
    return {fix: decided[fix] for fix in FIXES if fix in decided}


def _load_plugins() -> None:
    from airflow_heartbeat_fix._compat import ensure_plugins_loaded

    try:
        ensure_plugins_loaded()
    except Exception:  # the scheduler would meet the same error; status reports what it can
        fix_logger().debug("loading the plugins failed", exc_info=True)


def target_of(fix: str) -> str:
    return next(target for target, fixes in TARGET_FIXES.items() if fix in fixes)


def describe(decided: dict[str, FixDecision]) -> list[dict[str, str]]:
    """One row per fix, for ``airflow-heartbeat-fix status``."""
    rows = [decided[fix] for fix in FIXES if fix in decided]
    return [
        {
            "fix": d.fix,
            "process": TARGET_LABELS[target_of(d.fix)],
            "state": d.state.value,
            "reason": d.reason,
            "title": FIX_TITLES[d.fix],
        }
        for d in rows
    ]
