"""
Orphan adoption that keeps the scheduler's session, transaction and row locks through the executor's call.

``adopt_or_reset_orphaned_tasks`` selects the orphans of dead scheduler jobs ``FOR UPDATE SKIP LOCKED``
(with ``load_only``: most columns deferred) and, in the same transaction, hands them to each executor's
``try_adopt_task_instances``. An executor (or a plugin it calls) that opens a scoped ``create_session()``
there gets the scheduler's own thread-local session, and the context manager's exit commits it (the
orphans' row locks are released: another scheduler may adopt or reset them too) and closes it (every
orphan is detached). The reset and adopt branches then read deferred columns of detached instances:
``DetachedInstanceError``, the scheduler exits, and since the orphans stay, every restart crashes again.
Where the attributes happen to be loaded, the writes go to detached instances and are lost.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any
from unittest import mock

from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from airflow.utils.session import NEW_SESSION, provide_session
from sqlalchemy import inspect

from airflow_heartbeat_fix._compat import scheduler_executors
from airflow_heartbeat_fix.logs import fix_logger
from airflow_heartbeat_fix.nested_blocks import loop_thread

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from airflow.executors.base_executor import BaseExecutor
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy.orm import Session

log = fix_logger(__name__)


class HeldOrphanAdoptionMixin(SchedulerJobRunner):
    """
    Run each executor's ``try_adopt_task_instances`` inside the adoption's transaction, whatever it does.

    Backports the intent of apache/airflow#71348 (open; closes #71272, which is still open on main) and
    completes #67822 (3.2.x: only the ``repr`` read), for the crash loops of #67813 and #67891 on every
    Airflow 3 release; the KubernetesExecutor side was fixed in cncf-kubernetes 10.18.0 (#67850), but any
    executor or plugin that opens a scoped session during adoption still hits it. Delete once the
    installed ``adopt_or_reset_orphaned_tasks`` re-reads the orphans through its session after the
    executors' adoption (detection then reports ``held_orphan_adoption`` "not needed") *and* keeps their
    row locks to its own commit, which #71348's re-select alone does not.

    The executor's own scoped ``create_session()`` is a session nested in the adoption's
    (:mod:`~airflow_heartbeat_fix.nested_sessions`): where the orphans' rows are locked (PostgreSQL) it
    joins the adoption's transaction in a SAVEPOINT, so its writes commit with the adoption's own commit
    and the locks, taken before it, are held to that commit; where nothing is locked (SQLite) its commit
    is its own. Either way its close detaches only what it loaded. Upstream's re-select (#71348) fixes the
    detached reads but not the early commit: between the executor's commit and the re-select another
    scheduler can lock and adopt or reset the same orphans.

    An executor that misbehaves never ends the loop: if it raises (a database error inside its own
    session included: that session is rolled back to its savepoint), the orphans it was handed are
    reset, because a reset orphan is scheduled again while an adopted one nobody runs would never finish;
    task instances it returns that it was not handed, or detached copies, are matched to the batch by
    id; instances it expunged are added back (the transaction and its locks are intact).

    Statements: none of its own; an executor's nested session that reads or writes costs a SAVEPOINT and
    its RELEASE (and on PostgreSQL one read of the transaction id) instead of its COMMIT.
    """

    @provide_session
    def adopt_or_reset_orphaned_tasks(self, session: Session = NEW_SESSION) -> int:
        with contextlib.ExitStack() as stack:
            for executor in scheduler_executors(self):
                stack.enter_context(_adoption_in_transaction(executor, session))
            return super().adopt_or_reset_orphaned_tasks(session=session)


@contextlib.contextmanager
def _adoption_in_transaction(executor: BaseExecutor, session: Session) -> Iterator[None]:
    """While the block runs, ``executor.try_adopt_task_instances`` survives the executor's errors and
    expunges (an instance attribute, removed again by ``mock.patch.object``; an executor's own instance
    attribute comes back)."""
    try_adopt: Callable[[Sequence[TaskInstance]], Sequence[TaskInstance]] = executor.try_adopt_task_instances
    name = type(executor).__name__

    def held_try_adopt(tis: Sequence[TaskInstance]) -> Sequence[TaskInstance]:
        batch = list(tis)
        held: list[str] = []
        opened_before = loop_thread.opened
        try:
            returned = try_adopt(batch)
        except Exception:
            log.exception(
                "%s.try_adopt_task_instances raised; resetting the %d orphaned task instances it was handed",
                name,
                len(batch),
            )
            returned, held = batch, ["it raised"]
        if loop_thread.opened > opened_before:
            held.append("its session was held in the adoption's transaction")
        expunged = [ti for ti in batch if inspect(ti).detached]
        for ti in expunged:  # expunged by the executor: the transaction and its locks are intact
            session.add(ti)
        if expunged:
            held.append(f"it expunged {len(expunged)} of them")
        to_reset = _in_batch(batch, returned, name)
        if held:
            _log_what_was_held(batch, to_reset, name, "; ".join(held))
        return to_reset

    with mock.patch.object(executor, "try_adopt_task_instances", held_try_adopt):
        yield


def _log_what_was_held(batch: list[TaskInstance], to_reset: list[TaskInstance], name: str, held: str) -> None:
    """One line per orphan whose adoption stock Airflow would have ended in a crash or lost."""
    reset = {id(ti) for ti in to_reset}
    for ti in batch:
        log.info(
            "airflow-heartbeat-fix (held_orphan_adoption): orphaned %s %s by %s (%s)",
            ti,
            "handed back to be reset" if id(ti) in reset else "adopted",
            name,
            held,
        )


def _in_batch(batch: list[TaskInstance], returned: Any, name: str) -> list[TaskInstance]:
    """The batch's own instances among what the executor returned to reset (by identity, else by id)."""
    try:
        items = list(returned)
    except TypeError:
        log.warning("%s.try_adopt_task_instances returned %r; resetting every task instance", name, returned)
        return batch
    by_id = {_ti_id(ti): ti for ti in batch}
    batch_ids = {id(ti) for ti in batch}
    to_reset: dict[int, TaskInstance] = {}
    for item in items:
        ti = item if id(item) in batch_ids else by_id.get(_ti_id(item))
        if ti is None:
            log.warning("%s asked to reset %r, which it was not handed; ignored", name, item)
            continue
        to_reset[id(ti)] = ti
    return list(to_reset.values())


def _ti_id(ti: Any) -> Any:
    """The primary key of a task instance, attached or not, without loading anything."""
    try:
        identity = inspect(ti).identity
    except Exception:
        return None
    return identity[0] if identity else None
