"""
Plug-ins loaded the way a deployment loads them: listener plugins from a plugins folder and the
``airflow.plugins`` entry points, cluster policies from an ``airflow_local_settings.py``.

Airflow loads both once per process; these load them anew for one block, the process's own again after,
on every Airflow 3 release (the plugin manager's and the policy manager's state moved in 3.2).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

from airflow_heartbeat_fix.demo.config import LISTENER_PLUGIN_FILE

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

#: The plug-ins the tests install: the demo's listener plugin file, an ``airflow_local_settings.py``, an
#: alerting listener that waits for its own worker thread, a listener pair writing shared rows, and a
#: plugin that replaces create_session.
LISTENER_PLUGIN = LISTENER_PLUGIN_FILE
PLUGIN_FILES = Path(__file__).with_name("plugin_files")
LOCAL_SETTINGS = PLUGIN_FILES / "airflow_local_settings.py"
ACKNOWLEDGING_LISTENER = PLUGIN_FILES / "heartbeat_fix_acknowledging_listener.py"
PAIR_LISTENER = PLUGIN_FILES / "heartbeat_fix_pair_listener.py"
#: A tracing plugin that wraps (or, with HEARTBEAT_FIX_TRACING=replace, re-implements) create_session.
SESSION_TRACING_PLUGIN = PLUGIN_FILES / "heartbeat_fix_session_tracing_plugin.py"


def install_plugin_folder(folder: Path, *plugin_files: Path) -> Path:
    """``folder`` as a plugins folder holding copies of ``plugin_files`` (what an operator deploys)."""
    folder.mkdir(parents=True, exist_ok=True)
    for plugin_file in plugin_files:
        shutil.copy(plugin_file, folder / plugin_file.name)
    return folder


def _forget_modules(names: Iterable[str]) -> None:
    for name in names:
        sys.modules.pop(name, None)


def _reset_plugin_state(stack: contextlib.ExitStack) -> None:
    """Make the next use load plugins and build the listener manager from scratch (now and on exit)."""
    from airflow import plugins_manager
    from airflow.listeners import listener

    if hasattr(plugins_manager, "_get_plugins"):  # 3.2+: functools.cache (3.2 and 3.3 on both)
        functions = (plugins_manager._get_plugins, plugins_manager.integrate_listener_plugins)
        for function in (*functions, listener.get_listener_manager):
            if cache_clear := getattr(function, "cache_clear", None):
                cache_clear()
                stack.callback(cache_clear)
        return
    # 3.0/3.1: module globals
    stack.enter_context(mock.patch.object(plugins_manager, "plugins", None))
    stack.enter_context(mock.patch.object(plugins_manager, "loaded_plugins", set()))
    stack.enter_context(mock.patch.object(plugins_manager, "import_errors", {}))
    stack.enter_context(mock.patch.object(listener, "_listener_manager", None))


@contextlib.contextmanager
def plugins_loaded(folder: Path, *, entry_point_modules: Iterable[str] = ()) -> Iterator[Any]:
    """
    While the block runs, Airflow's plugins are those of ``folder`` and of the ``airflow.plugins``
    entry points, imported afresh (``entry_point_modules``: modules of entry-point plugins that read
    their configuration at import, forgotten before and after); yields the listener manager built from
    them.
    """
    from airflow import settings
    from airflow.listeners.listener import get_listener_manager

    plugin_modules = [path.stem for path in folder.glob("*.py")]
    forgotten = [*plugin_modules, *entry_point_modules]
    with contextlib.ExitStack() as stack:
        stack.callback(_forget_modules, forgotten)
        _forget_modules(forgotten)
        stack.enter_context(mock.patch.object(settings, "PLUGINS_FOLDER", str(folder)))
        _reset_plugin_state(stack)
        yield get_listener_manager()


def _policy_manager() -> Any:
    from airflow import settings

    getter = getattr(settings, "get_policy_plugin_manager", None)  # 3.2+
    return getter() if getter is not None else settings.POLICY_PLUGIN_MANAGER


@contextlib.contextmanager
def local_settings_loaded(config_folder: Path) -> Iterator[Any]:
    """
    While the block runs, the cluster policies are those of ``config_folder/airflow_local_settings.py``
    as well (imported the way ``settings.initialize()`` imports it, from a folder on ``sys.path``);
    yields the module. Its policies are unregistered afterwards.
    """
    from airflow import settings

    manager = _policy_manager()
    before = list(manager.get_plugins())
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(sys, "path", [str(config_folder), *sys.path]))
        hook = settings.task_instance_mutation_hook
        stack.enter_context(mock.patch.object(hook, "is_noop", getattr(hook, "is_noop", True)))
        stack.callback(_forget_modules, ["airflow_local_settings"])
        _forget_modules(["airflow_local_settings"])
        settings.import_local_settings()
        for plugin in manager.get_plugins():
            if plugin not in before:
                stack.callback(manager.unregister, plugin)
        yield sys.modules["airflow_local_settings"]


def wrap_create_session() -> None:
    """
    Replace ``airflow.utils.session.create_session`` with a tracing wrapper that calls it, as an
    instrumentation library does (for the rest of the process): what the ``wrapped-*`` cells install
    right after activation, to run the nested-session tests through it.
    """
    import functools

    from airflow.utils import session as session_module

    airflows = session_module.create_session

    @functools.wraps(airflows)
    @contextlib.contextmanager
    def traced_create_session(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with airflows(*args, **kwargs) as session:
            yield session

    session_module.create_session = traced_create_session
