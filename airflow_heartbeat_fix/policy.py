"""
``airflow.policy`` entry point: Airflow imports this module in every process, at ``import airflow``.

It must stay cheap, so it only registers an import hook: when the scheduler command module is
imported (``airflow scheduler``), :func:`airflow_heartbeat_fix.activation.install` runs. Nothing else
in any other Airflow process is touched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType

TRIGGER_MODULE = "airflow.cli.commands.scheduler_command"


def _activate() -> None:
    from airflow_heartbeat_fix.activation import install

    install()


class _ActivateAfterExec(importlib.abc.Loader):
    """Delegates to the real loader, then activates the fixes once the module has run."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _activate()


class SchedulerCommandHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of :data:`TRIGGER_MODULE`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TRIGGER_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ActivateAfterExec(spec.loader)
        return spec


def register() -> None:
    """Idempotent: one hook per process; activate now if the scheduler command is already imported."""
    if TRIGGER_MODULE in sys.modules:
        _activate()
    elif not any(isinstance(finder, SchedulerCommandHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, SchedulerCommandHook())


def unregister() -> None:
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, SchedulerCommandHook)]


register()
