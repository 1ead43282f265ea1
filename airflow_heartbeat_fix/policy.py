"""
``airflow.policy`` entry point: Airflow imports this module in every process, at ``import airflow``.

That happens before Airflow configures logging, so this module only registers an import hook and
imports nothing but the standard library. When a command module named in :data:`TRIGGER_MODULES` is
imported (``airflow scheduler``, ``airflow dag-processor``),
:func:`airflow_heartbeat_fix.activation.install` runs for that command's process. No other command is
touched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType

TRIGGER_MODULE = "airflow.cli.commands.scheduler_command"
#: Command module -> the target whose fixes its import activates (names as in ``detection``, which this
#: module cannot import: it would load more than the standard library at ``import airflow``).
TRIGGER_MODULES = {
    TRIGGER_MODULE: "scheduler",
    "airflow.cli.commands.dag_processor_command": "dag_processor",
}


def _activate(target: str = "scheduler") -> None:
    from airflow_heartbeat_fix.activation import install

    install(target=target)


class _ActivateAfterExec(importlib.abc.Loader):
    """Delegates to the real loader, then activates the fixes of ``target`` once the module has run."""

    def __init__(self, loader: importlib.abc.Loader, target: str = "scheduler") -> None:
        self._loader = loader
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _activate(self._target)


class SchedulerCommandHook(importlib.abc.MetaPathFinder):
    """
    Finds nothing itself; wraps the loader that the rest of the import system finds for the trigger.

    Like wrapt's post-import hooks, it asks the *whole* import system (``importlib.util.find_spec``, so
    every other meta-path finder still applies) while a re-entry guard keeps it out of its own way.
    """

    def __init__(self) -> None:
        self._resolving = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in TRIGGER_MODULES or getattr(self._resolving, "active", False):
            return None
        self._resolving.active = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._resolving.active = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            # Logging is configured by now: Airflow imports its commands after settings.initialize().
            logging.getLogger("airflow_heartbeat_fix").warning(
                "airflow-heartbeat-fix cannot hook %s (loader %r); the command runs unpatched. "
                "Run `airflow-heartbeat-fix %s` to install the fixes explicitly.",
                fullname,
                getattr(spec, "loader", None),
                TRIGGER_MODULES[fullname].replace("_", "-"),
            )
            return None
        spec.loader = _ActivateAfterExec(spec.loader, TRIGGER_MODULES[fullname])
        return spec


def register() -> None:
    """Idempotent: one hook per process; activate now for each command already imported."""
    for module, target in TRIGGER_MODULES.items():
        if module in sys.modules:
            _activate(target)
    if not all(module in sys.modules for module in TRIGGER_MODULES) and not any(
        isinstance(finder, SchedulerCommandHook) for finder in sys.meta_path
    ):
        sys.meta_path.insert(0, SchedulerCommandHook())


register()
