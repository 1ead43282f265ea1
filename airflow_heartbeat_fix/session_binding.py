"""
Bind ``TaskInstance.set_state`` calls that pass no session to the scheduler batch's session.

Backports the ``session=session`` part of upstream's sink fix for the 3.4.0b1/b2 UniqueViolation
crash (its PR number is not recorded here; backported to v3-4-test; the same call site is
apache/airflow#73213). Delete once every supported Airflow passes the batch session in
``process_executor_events`` (detection then reports the sink fix "not needed").

``process_executor_events`` calls ``ti.set_state(state)`` without a session when it cannot load a
task instance's Dag. ``@provide_session`` then commits and closes the scheduler's scoped session,
detaching the rest of the batch, exactly as the stock callback sink does. Upstream fixed the call site
(``session=session``); the call sits in the middle of a several-hundred-line classmethod, so instead of
copying it we bind the batch session while :meth:`bound_to` is active. Outside that block the wrapper
passes every call through unchanged.
"""

from __future__ import annotations

import contextlib
import functools
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from airflow.models.taskinstance import TaskInstance

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sqlalchemy.orm import Session

_batch_session: ContextVar[Session | None] = ContextVar("heartbeat_fix_batch_session", default=None)
_original_set_state: Callable[..., bool] | None = None


def _set_state_in_batch(original: Callable[..., bool]) -> Callable[..., bool]:
    @functools.wraps(original)
    def set_state(self: TaskInstance, *args: Any, **kwargs: Any) -> bool:
        session = _batch_session.get()
        if session is not None and "session" not in kwargs and len(args) < 2:
            kwargs["session"] = session
        return original(self, *args, **kwargs)

    return set_state


def install() -> None:
    """Wrap ``TaskInstance.set_state`` once; idempotent."""
    global _original_set_state
    if _original_set_state is None:
        _original_set_state = TaskInstance.set_state
        TaskInstance.set_state = _set_state_in_batch(_original_set_state)  # type: ignore[method-assign]


def uninstall() -> None:
    global _original_set_state
    if _original_set_state is not None:
        TaskInstance.set_state = _original_set_state  # type: ignore[method-assign]
        _original_set_state = None


@contextlib.contextmanager
def bound_to(session: Session) -> Iterator[None]:
    """Inside this block, ``ti.set_state(state)`` without a session uses ``session``."""
    token = _batch_session.set(session)
    try:
        yield
    finally:
        _batch_session.reset(token)
