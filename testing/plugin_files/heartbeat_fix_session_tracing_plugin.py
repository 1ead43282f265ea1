"""
A tracing plugin of the kind an instrumentation library installs at scheduler start (after this package's
activation): it replaces ``airflow.utils.session.create_session`` with a context manager that counts the
sessions opened, either by wrapping Airflow's (``HEARTBEAT_FIX_TRACING=wrap``, calling it) or by a
re-implementation of its own that never calls Airflow's (``HEARTBEAT_FIX_TRACING=replace``).

Copied into a plugins folder by the tests (``testing.plugins``); Airflow imports it by its file name.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections import Counter
from typing import Any

from airflow import settings
from airflow.plugins_manager import AirflowPlugin
from airflow.utils import session as session_module

OPENED: Counter[str] = Counter()
_airflows = session_module.create_session


@functools.wraps(_airflows)
@contextlib.contextmanager
def traced_create_session(*args: Any, **kwargs: Any) -> Any:
    OPENED["wrapped"] += 1
    with _airflows(*args, **kwargs) as session:
        yield session


@contextlib.contextmanager
def reimplemented_create_session(scoped: bool = True) -> Any:
    OPENED["reimplemented"] += 1
    factory: Any = settings.Session if scoped else settings.NonScopedSession
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


session_module.create_session = (
    reimplemented_create_session
    if os.environ.get("HEARTBEAT_FIX_TRACING") == "replace"
    else traced_create_session
)


class HeartbeatFixSessionTracingPlugin(AirflowPlugin):
    name = "heartbeat_fix_session_tracing"
