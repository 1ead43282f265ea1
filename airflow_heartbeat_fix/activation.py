"""
Turn the fixes on in this process, and off again.

:func:`install` swaps the scheduler command's ``SchedulerJobRunner`` for a subclass with the active
fixes and, when the sink fix is active, Airflow's ``DatabaseCallbackSink`` for the session-preserving
subclass. :func:`uninstall` puts the originals back. What is active comes from
:func:`~airflow_heartbeat_fix.detection.decide` on the unpatched classes and ``[heartbeat_fix] enabled``.

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
    FIX_TITLES,
    FIXES,
    NESTED_FIX,
    SINK_FIX,
    FixDecision,
    FixState,
    decide,
)
from airflow_heartbeat_fix.facts import (
    AirflowFacts,
    SessionCode,
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


def facts() -> AirflowFacts:
    from airflow import __version__ as airflow_version

    from airflow_heartbeat_fix._compat import dag_processor_execute_callbacks

    originals = _originals()
    return read_facts(
        version=airflow_version,
        sink_cls=originals["sink"],
        runner_cls=originals["runner"],
        session_code=_session_code(),
        execute_callbacks=dag_processor_execute_callbacks(),
    )


#: How the start line and ``status`` say the operator switched the fixes off.
OFF_BY_CONFIGURATION = f"off by configuration ([{CONFIG_SECTION}] enabled = False)"
STOCK_CLASSES = "the scheduler runs Airflow's own classes"


def summary(
    decided: dict[str, FixDecision], version: str, problem: str | None = None, *, switched_off: bool = False
) -> str:
    """
    The one line the scheduler logs at start: each fix's state (an unsupported one with its reason), or
    the single reason nothing is patched, after "off by configuration" if the operator said so; then the
    configuration problem, if any.
    """
    states = {d.state for d in decided.values()}
    reasons = {d.reason for d in decided.values()}
    if states == {FixState.UNSUPPORTED} and len(reasons) == 1:
        body = f"{reasons.pop()}; {STOCK_CLASSES}"
    else:
        body = "; ".join(
            f"{fix}: {d.state.value}" + (f" ({d.reason})" if d.state is FixState.UNSUPPORTED else "")
            for fix, d in ((fix, decided[fix]) for fix in FIXES)
        )
        if switched_off:
            body = f"{OFF_BY_CONFIGURATION}; {STOCK_CLASSES} ({body})"
    line = f"airflow-heartbeat-fix on Airflow {version}: {body}"
    return f"{line} ({problem})" if problem else line


def not_applied(decided: dict[str, FixDecision]) -> list[FixDecision]:
    """
    Fixes this Airflow needs (or may need) that cannot be applied. A fix the operator switched off is
    not one of them: that is a choice, and the scheduler starts as Airflow ships it (callers also let a
    switched-off installation pass whatever else was found, so the switch never stops a scheduler).
    """
    return [d for d in decided.values() if d.state is FixState.UNSUPPORTED]


def outside_range(reason: str) -> dict[str, FixDecision]:
    """Every fix unsupported with the one out-of-range reason: decided without reading Airflow's code."""
    return {fix: FixDecision(fix, FixState.UNSUPPORTED, reason) for fix in FIXES}


def _failed(decided: dict[str, FixDecision], exc: BaseException) -> dict[str, FixDecision]:
    """Every fix that was to be applied, reported unsupported with the error that stopped it."""
    why = f"could not be applied ({one_line(exc)}); left unpatched"
    failed = {fix: FixDecision(fix, FixState.UNSUPPORTED, why) for fix in FIXES}
    return {**failed, **{fix: d for fix, d in decided.items() if d.state is not FixState.ACTIVE}}


@dataclass
class _Installed:
    decided: dict[str, FixDecision] = field(default_factory=dict)
    patched: list[tuple[object, str, Any]] = field(default_factory=list)


_installed: _Installed | None = None


def _patch(target: object, name: str, value: Any, into: _Installed) -> None:
    """Set ``target.name`` (a module's, a class's, a closure cell's), recording what to put back."""
    into.patched.append((target, name, getattr(target, name)))
    setattr(target, name, value)


def install(*, raise_errors: bool = False) -> dict[str, FixDecision]:
    """
    Activate the fixes this installation needs; idempotent; returns what was decided and applied.

    ``raise_errors=False`` (automatic activation) logs a failure and leaves Airflow unpatched;
    ``raise_errors=True`` (explicit activation) raises :class:`ActivationError` instead.
    """
    global _installed
    if _installed is not None:
        return _installed.decided
    # Claimed before patching: importing the scheduler command below re-enters through the import hook.
    _installed = state = _Installed()
    in_range = support.check()
    if refusal := in_range.refusal:
        state.decided = outside_range(refusal)
        _say(logging.WARNING, summary(state.decided, str(in_range.airflow_version)))
        return state.decided
    decided: dict[str, FixDecision] = {}
    version, problem, switched_off = in_range.airflow_version or "?", None, False
    try:
        switch = read_switch()
        problem, switched_off = switch.problem, not switch.enabled
        found = facts()
        version = found.version
        decided = decide(found, enabled=switch.enabled)
        active = tuple(fix for fix, decision in decided.items() if decision.state is FixState.ACTIVE)
        if active:
            _apply(active, state)
    except Exception as exc:
        uninstall()
        if raise_errors:
            raise ActivationError(f"airflow-heartbeat-fix could not be activated: {one_line(exc)}") from exc
        fix_logger().debug("airflow-heartbeat-fix could not be activated", exc_info=True)
        decided = _failed(decided, exc)
        _say(logging.WARNING, summary(decided, version, problem))
        return decided
    state.decided = decided
    worst = logging.WARNING if problem or (not_applied(decided) and not switched_off) else logging.INFO
    _say(worst, summary(decided, version, problem, switched_off=switched_off))
    for warning in config_warnings():
        _say(logging.WARNING, f"airflow-heartbeat-fix: {warning}")
    return decided


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


def uninstall() -> None:
    """Restore Airflow's own classes; idempotent."""
    global _installed
    if _installed is None:
        return
    for module, name, original in reversed(_installed.patched):
        setattr(module, name, original)
    _installed = None


def dry_run() -> dict[str, FixDecision]:
    """
    What a scheduler started now would run: the same activation, then undone.

    Import and compatibility failures surface here as ``unsupported`` with the error, exactly as the
    scheduler would meet them. If this process already runs the fixes, that state is reported as is.
    """
    global _quiet
    if _installed is not None:
        return _installed.decided
    _quiet = True
    try:
        _load_plugins()  # as the scheduler does when it starts: a plugin may replace what the fixes patch
        return install()
    finally:
        uninstall()
        _quiet = False


def _load_plugins() -> None:
    from airflow_heartbeat_fix._compat import ensure_plugins_loaded

    try:
        ensure_plugins_loaded()
    except Exception:  # the scheduler would meet the same error; status reports what it can
        fix_logger().debug("loading the plugins failed", exc_info=True)


def describe(decided: dict[str, FixDecision]) -> list[dict[str, str]]:
    """One row per fix, for ``airflow-heartbeat-fix status``."""
    rows = [decided[fix] for fix in FIXES if fix in decided]
    return [
        {"fix": d.fix, "state": d.state.value, "reason": d.reason, "title": FIX_TITLES[d.fix]} for d in rows
    ]
