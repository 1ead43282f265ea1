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
import logging
from typing import TYPE_CHECKING, Any
from unittest import mock

from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from airflow.utils.session import NEW_SESSION, provide_session
from sqlalchemy import inspect

from airflow_heartbeat_fix._compat import scheduler_executors

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from airflow.executors.base_executor import BaseExecutor
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)


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

    The guard, for the duration of one executor's call only (:func:`_held`): a SAVEPOINT, and the
    adoption session's ``commit`` flushes, its ``close`` does nothing and its ``rollback`` rolls back to
    the savepoint. A nested scoped ``create_session()`` therefore joins the adoption's transaction (its
    writes commit with the adoption's own commit) instead of ending it, and the orphans' row locks, taken
    before the savepoint, are held to that commit. Upstream's re-select (#71348) fixes the detached reads
    but not the early commit: between the executor's commit and the re-select another scheduler can
    lock and adopt or reset the same orphans.

    Why one rule, scoped to this call, is safe: inside ``try_adopt_task_instances`` the only commits are
    the executor's own (the scheduler issues none there), so turning them into flushes changes nothing
    the scheduler relies on. It is the rule the session-preserving sink already applies to callbacks (a
    sink called without a session joins the scheduler's transaction); that fix is left as it is. Applied
    to the whole scheduler loop instead, the rule would also turn the scheduler's own commits into
    flushes (``handle_failure`` commits per task instance, which the purge's transaction shape relies on).

    An executor that misbehaves never ends the loop: if it raises (a database error inside its own
    session included: rolled back to the savepoint), the orphans it was handed are reset, because a
    reset orphan is scheduled again while an adopted one nobody runs would never finish; task instances
    it returns that it was not handed, or detached copies, are matched to the batch by id; instances it
    expunged are added back (the transaction and its locks are intact).

    Statements: two per executor and pass (SAVEPOINT, RELEASE SAVEPOINT), whatever the number of orphans;
    the executor's own COMMIT is no longer issued.
    """

    @provide_session
    def adopt_or_reset_orphaned_tasks(self, session: Session = NEW_SESSION) -> int:
        with contextlib.ExitStack() as stack:
            for executor in scheduler_executors(self):
                stack.enter_context(_adoption_in_transaction(executor, session))
            return super().adopt_or_reset_orphaned_tasks(session=session)


@contextlib.contextmanager
def _adoption_in_transaction(executor: BaseExecutor, session: Session) -> Iterator[None]:
    """While the block runs, ``executor.try_adopt_task_instances`` runs under :func:`_held` (an instance
    attribute, removed again by ``mock.patch.object``; an executor's own instance attribute comes back)."""
    try_adopt: Callable[[Sequence[TaskInstance]], Sequence[TaskInstance]] = executor.try_adopt_task_instances
    name = type(executor).__name__

    def held_try_adopt(tis: Sequence[TaskInstance]) -> Sequence[TaskInstance]:
        batch = list(tis)
        with _held(session):
            try:
                returned = try_adopt(batch)
            except Exception:
                log.exception(
                    "%s.try_adopt_task_instances raised; resetting the %d orphaned task instances it was "
                    "handed",
                    name,
                    len(batch),
                )
                returned = batch
        for ti in batch:
            if inspect(ti).detached:  # expunged by the executor: the transaction and its locks are intact
                session.add(ti)
        return _in_batch(batch, returned, name)

    with mock.patch.object(executor, "try_adopt_task_instances", held_try_adopt):
        yield


@contextlib.contextmanager
def _held(session: Session) -> Iterator[None]:
    """
    Inside a SAVEPOINT: ``session.commit()`` flushes, ``session.close()`` does nothing and
    ``session.rollback()`` rolls back to the savepoint, while the block runs.

    What a nested ``create_session()`` does on exit therefore never ends the adoption's transaction:
    its writes are released with the savepoint and committed with the adoption, and its rollback (an
    error inside it, a database error included: PostgreSQL's aborted transaction recovers at the
    savepoint) undoes only its own work. The row locks were taken before the savepoint and stay. The
    attributes are set on this session instance only: the thread's scoped session, which is what a
    nested ``create_session()`` in the same thread gets; other threads' sessions are other instances.
    """
    savepoint = session.begin_nested()

    def rollback_to_savepoint() -> None:
        if savepoint.is_active:
            savepoint.rollback()

    with (
        mock.patch.object(session, "commit", session.flush),
        mock.patch.object(session, "close", _leave_open),
        mock.patch.object(session, "rollback", rollback_to_savepoint),
    ):
        try:
            yield
        finally:
            if savepoint.is_active:
                savepoint.commit()


def _leave_open() -> None:
    """``close()`` of the adoption's session while an executor adopts: the adoption closes it, later."""


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
