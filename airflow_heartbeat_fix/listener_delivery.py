"""
Listener hooks that the scheduler loop calls while its transaction holds row locks or uncommitted work run
right after that transaction commits, where a listener's own session is its own again.

A listener is a plug-in that writes (an audit row, a ``Variable.set`` that a worker thread of its own
acknowledges, a lineage event handed to a thread pool). In stock Airflow its ``create_session()`` commits
the loop's transaction mid-batch; joined to that transaction instead, its writes stay invisible and
locked until the loop commits, so a listener that waits for another connection to see them makes the
scheduler wait on itself, and two schedulers whose listeners write the same rows in opposite orders
deadlock. Called after the commit, the listener's sessions are their own: its commits publish and
unlock at once, as in stock.

What changes for the listener is only *when* it runs: right after the loop's next commit, in the same
loop path (the ``save_to_db`` commit of the task instance it announces, ``_do_scheduling``'s
``guard.commit()``). It sees its arguments as they were when Airflow called the hook: the column values
of the ORM objects it is handed are put back for the call (3.4 archives a failed try after notifying
listeners). A change the loop rolls back is not announced (stock announced it, then lost its own
writes with the rollback). A hook no listener implements, or one called when the loop's transaction holds
nothing, is called at once, as in stock.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect
from sqlalchemy.orm.attributes import set_committed_value

from airflow_heartbeat_fix import nested_blocks
from airflow_heartbeat_fix._compat import Stats, listener_manager_class
from airflow_heartbeat_fix.logs import fix_logger

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from sqlalchemy.orm import InstanceState

log = fix_logger(__name__)

#: ``{state: {column attribute: value}}``: what the ORM objects handed to a hook held when it was called.
Snapshot = dict["InstanceState[Any]", dict[str, Any]]


def snapshot(kwargs: Mapping[str, Any]) -> Snapshot:
    """The loaded column values of every ORM object among a hook call's arguments."""
    taken: Snapshot = {}
    for value in kwargs.values():
        state = inspect(value, raiseerr=False)
        mapper = getattr(state, "mapper", None)
        if mapper is None or not hasattr(state, "dict"):
            continue
        taken[state] = {
            attr.key: state.dict[attr.key] for attr in mapper.column_attrs if attr.key in state.dict
        }
    return taken


@contextlib.contextmanager
def as_called(taken: Snapshot) -> Iterator[None]:
    """
    While the block runs, the objects hold their snapshot's values (as committed values: nothing to
    flush); afterwards what they held before comes back, unless the block changed that attribute.
    """
    restore: list[tuple[Any, str, Any]] = []
    for state, values in taken.items():
        obj = state.obj()
        if obj is None:
            continue
        for key, then in values.items():
            now = state.dict.get(key)
            if now is not then and now != then:
                restore.append((obj, key, now))
                set_committed_value(obj, key, then)
    try:
        yield
    finally:
        for obj, key, now in restore:
            if not inspect(obj).attrs[key].history.has_changes():
                set_committed_value(obj, key, now)


def _deliver(name: str, caller: Any, kwargs: dict[str, Any], taken: Snapshot) -> None:
    try:
        with as_called(taken):
            caller(**kwargs)
    except Exception:
        # As Airflow's own call sites do: a listener's error is logged, never raised into the scheduler.
        log.exception("error calling listener %s (delivered after the scheduler loop's commit)", name)


class _DeferringCaller:
    """A listener hook's caller that waits for the loop's commit when the loop's transaction is at stake."""

    def __init__(self, name: str, caller: Any) -> None:
        self._name, self._caller = name, caller

    def __call__(self, **kwargs: Any) -> Any:
        caller, name = self._caller, self._name
        spec = getattr(caller, "spec", None)
        first_result = bool(spec is not None and spec.opts.get("firstresult"))
        if first_result or not caller.get_hookimpls() or not nested_blocks.loop_transaction_at_stake():
            return caller(**kwargs)
        nested_blocks.after_loop_commit(functools.partial(_deliver, name, caller, kwargs, snapshot(kwargs)))
        Stats.incr("heartbeat_fix.nested_blocks.listener_calls_deferred", tags={"hook": name})
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._caller, name)


class _DeferringRelay:
    """``ListenerManager.hook`` in a loop path: each hook's caller, deferring (:class:`_DeferringCaller`)."""

    def __init__(self, relay: Any) -> None:
        self._relay = relay

    def __getattr__(self, name: str) -> Any:
        caller = getattr(self._relay, name)
        return _DeferringCaller(name, caller) if callable(caller) else caller


def patches() -> list[tuple[Any, str, Any]]:
    """What activation installs: ``ListenerManager.hook``, deferring in a scheduler loop path only."""
    manager_cls = listener_manager_class()
    hook_property = manager_cls.__dict__["hook"]

    def hook(manager: Any) -> Any:
        relay = hook_property.__get__(manager, manager_cls)
        return _DeferringRelay(relay) if nested_blocks.in_loop_path() else relay

    return [(manager_cls, "hook", property(hook, doc=hook_property.__doc__))]
