"""
Turn the fixes on in this process, and off again.

:func:`install` swaps the scheduler command's ``SchedulerJobRunner`` for a subclass with the active
fixes and, when the sink fix is active, Airflow's ``DatabaseCallbackSink`` for the session-preserving
subclass. :func:`uninstall` puts the originals back. What is active comes from
:func:`~airflow_heartbeat_fix.detection.decide` on the unpatched classes and ``[heartbeat_fix] enabled``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_heartbeat_fix.detection import (
    FIX_TITLES,
    FIXES,
    SINK_FIX,
    AirflowFacts,
    FixDecision,
    FixState,
    decide,
    read_facts,
)

if TYPE_CHECKING:
    from types import ModuleType

log = logging.getLogger("airflow_heartbeat_fix")

CONFIG_SECTION = "heartbeat_fix"


def is_enabled() -> bool:
    """``[heartbeat_fix] enabled`` (``AIRFLOW__HEARTBEAT_FIX__ENABLED``); on unless set to False."""
    from airflow.configuration import conf

    return conf.getboolean(CONFIG_SECTION, "enabled", fallback=True)


@functools.cache
def _originals() -> dict[str, Any]:
    """Airflow's own classes, captured before anything here replaces them."""
    from airflow.callbacks import database_callback_sink
    from airflow.jobs import scheduler_job_runner

    return {
        "sink": database_callback_sink.DatabaseCallbackSink,
        "runner": scheduler_job_runner.SchedulerJobRunner,
    }


def facts() -> AirflowFacts:
    from airflow import __version__ as airflow_version

    originals = _originals()
    return read_facts(version=airflow_version, sink_cls=originals["sink"], runner_cls=originals["runner"])


def decisions() -> dict[str, FixDecision]:
    return decide(facts(), enabled=is_enabled())


def summary(decided: dict[str, FixDecision], version: str) -> str:
    """The one line the scheduler logs at start."""
    parts = [f"{fix}: {decided[fix].state.value}" for fix in FIXES]
    return f"airflow-heartbeat-fix on Airflow {version}: " + "; ".join(parts)


@dataclass
class _Installed:
    runner: type | None = None
    patched: list[tuple[ModuleType, str, Any]] = field(default_factory=list)


_installed: _Installed | None = None


def _patch(module: ModuleType, name: str, value: Any, into: _Installed) -> None:
    into.patched.append((module, name, getattr(module, name)))
    setattr(module, name, value)


def install() -> dict[str, FixDecision]:
    """Activate the fixes this installation needs; idempotent. Never raises into Airflow."""
    global _installed
    if _installed is not None:
        return decisions()
    # Claimed before patching: importing the scheduler command below re-enters through the import hook.
    _installed = state = _Installed()
    try:
        found = facts()
        decided = decide(found, enabled=is_enabled())
        active = tuple(fix for fix, decision in decided.items() if decision.state is FixState.ACTIVE)
        if active:
            _apply(active, state)
    except Exception:
        log.exception("airflow-heartbeat-fix could not be activated; Airflow is left unpatched")
        uninstall()
        return {}
    for fix in FIXES:
        if decided[fix].state is FixState.UNSUPPORTED:
            log.warning("airflow-heartbeat-fix: %s not applied: %s", fix, decided[fix].reason)
    log.info(summary(decided, found.version))
    return decided


def _apply(active: tuple[str, ...], state: _Installed) -> None:
    from airflow.callbacks import database_callback_sink
    from airflow.cli.commands import scheduler_command

    from airflow_heartbeat_fix import session_binding
    from airflow_heartbeat_fix.scheduler import build_runner_class

    state.runner = build_runner_class(active, base=_originals()["runner"])
    _patch(scheduler_command, "SchedulerJobRunner", state.runner, state)
    if SINK_FIX in active:
        from airflow_heartbeat_fix.callback_sink import SessionPreservingCallbackSink

        _patch(database_callback_sink, "DatabaseCallbackSink", SessionPreservingCallbackSink, state)
        session_binding.install()


def uninstall() -> None:
    """Restore Airflow's own classes; idempotent."""
    global _installed
    if _installed is None:
        return
    from airflow_heartbeat_fix import session_binding

    for module, name, original in reversed(_installed.patched):
        setattr(module, name, original)
    session_binding.uninstall()
    _installed = None


def installed_runner() -> type | None:
    """The fixed runner class in use, or ``None`` when nothing is patched."""
    return _installed.runner if _installed is not None else None


def describe() -> list[tuple[str, str, str, str]]:
    """Rows of ``(fix, title, state, reason)`` for ``airflow-heartbeat-fix status``."""
    decided = decisions()
    return [(fix, FIX_TITLES[fix], decided[fix].state.value, decided[fix].reason) for fix in FIXES]
