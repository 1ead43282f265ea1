"""
``SchedulerJobRunner`` subclasses: each fix is one mixin; :func:`build_runner_class` stacks the active ones.

Every override calls ``super()`` and adds the step upstream added; nothing of the upstream method
bodies is copied. Only the mixins of active fixes are in the MRO, so a fix that is "not needed" or
"disabled" leaves the stock method in charge.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from airflow.models.taskinstance import TaskInstance as TI
from airflow.utils.state import TaskInstanceState

from airflow_heartbeat_fix._compat import (
    scoped_session,
)
from airflow_heartbeat_fix.adoption import HeldOrphanAdoptionMixin
from airflow_heartbeat_fix.detection import (
    ADOPTION_FIX,
    EVENT_TYPE_FIX,
    HEARTBEAT_EVENTS_FIX,
    LOCK_FIX,
    NESTED_FIX,
    PURGE_FIX,
    SINK_FIX,
)
from airflow_heartbeat_fix.executor_events import HeartbeatJudgedExecutorEventsMixin
from airflow_heartbeat_fix.metrics import FixGaugesMixin
from airflow_heartbeat_fix.nested_sessions import NestedSessionsJoinLoopMixin
from airflow_heartbeat_fix.purge import (
    ConvergedHeartbeatPurgeMixin,
    LockedPurgeRevalidationMixin,
    each_task_callback,
)

if TYPE_CHECKING:
    from airflow.callbacks.callback_requests import DagCallbackRequest, TaskCallbackRequest
    from airflow.executors.base_executor import BaseExecutor
    from sqlalchemy.orm import Session


class SessionPreservingSinkMixin(SchedulerJobRunner):
    """
    Session-preserving sink, scheduler side: commit where the stock sink used to, and nowhere else.

    Backports the scheduler half of upstream's sink fix for the 3.4.0b1/b2 crash
    (``DatabaseCallbackSink.send`` stops committing the caller's session, crash since
    apache/airflow#74222, backported to v3-4-test). Delete once the installed sink takes the caller's
    session (detection reports ``session_preserving_sink`` "not needed").

    ``_do_scheduling`` sends Dag-level callbacks and then runs the critical section, which expunges the
    session and can roll it back: it relied on the stock sink's commit, so it now commits after each
    Dag callback. Upstream's PR also passes ``session=session`` to the ``ti.set_state`` of
    executor-event processing's Dag-lookup-failure branch: a nested session, which
    :class:`~airflow_heartbeat_fix.nested_sessions.NestedSessionsJoinLoopMixin` holds.
    """

    def _send_dag_callbacks_to_processor(self, dag: Any, callback: DagCallbackRequest | None = None) -> None:
        super()._send_dag_callbacks_to_processor(dag, callback)
        if callback:
            # The sink added the request to the thread's scoped session, which is the session of
            # _do_scheduling and of _update_dag_run_state_for_paused_dags (@provide_session).
            scoped_session().commit()


class TypedExecutorEventCallbacksMixin(SchedulerJobRunner):
    """
    Type the callback that executor-event processing sends for a worker its executor reports failed.

    Backports the callback type of apache/airflow#56607 (shipped in 3.1.1) to 3.0.x and 3.1.0, whose
    ``process_executor_events`` sends the ``TaskCallbackRequest`` of a RUNNING task instance reported
    FAILED (a killed or lost worker) untyped, so the Dag processor runs ``on_failure_callback`` even
    when the try will be retried. Delete once the oldest supported Airflow types it (detection then
    reports ``typed_executor_event_callbacks`` "not needed").

    The stock path loads the batch's task instances into its session and sets ``ti.task`` before it
    sends the request; the type comes from that same task instance, before ``handle_failure`` changes it.
    """

    def _process_executor_events(self, executor: BaseExecutor, session: Session) -> int:
        with each_task_callback(executor, functools.partial(_type_by_retry_eligibility, session=session)):
            return super()._process_executor_events(executor, session)


def _type_by_retry_eligibility(request: TaskCallbackRequest, *, session: Session) -> None:
    """Give an untyped request the state its try will go to, from the batch's own task instance."""
    if request.task_callback_type is not None:
        return
    ti_id = str(request.ti.id)
    # The batch's task instances are in the session: look in its identity map instead of querying.
    loaded = (obj for obj in session.identity_map.values() if isinstance(obj, TI) and str(obj.id) == ti_id)
    if (ti := next(loaded, None)) is not None:
        eligible = ti.is_eligible_to_retry()
        request.task_callback_type = TaskInstanceState.UP_FOR_RETRY if eligible else TaskInstanceState.FAILED


MIXINS: dict[str, type[SchedulerJobRunner]] = {
    NESTED_FIX: NestedSessionsJoinLoopMixin,
    SINK_FIX: SessionPreservingSinkMixin,
    PURGE_FIX: ConvergedHeartbeatPurgeMixin,
    LOCK_FIX: LockedPurgeRevalidationMixin,
    EVENT_TYPE_FIX: TypedExecutorEventCallbacksMixin,
    ADOPTION_FIX: HeldOrphanAdoptionMixin,
    HEARTBEAT_EVENTS_FIX: HeartbeatJudgedExecutorEventsMixin,
}
#: MRO order: the nested-session hold wraps every loop path (it owns the loop's session before the others
#: run); the lock hands single task instances to the purge (backport or stock), which sends callbacks
#: through the sink's session; stale executor events are set aside before the typed callbacks see the pass.
#: The orphan adoption shares no method with the others.
MIXIN_ORDER = (NESTED_FIX, LOCK_FIX, PURGE_FIX, HEARTBEAT_EVENTS_FIX, EVENT_TYPE_FIX, SINK_FIX, ADOPTION_FIX)


@functools.cache
def build_runner_class(
    active_fixes: tuple[str, ...], base: type[SchedulerJobRunner] = SchedulerJobRunner
) -> type[SchedulerJobRunner]:
    """The scheduler runner class with the mixins of ``active_fixes``, in :data:`MIXIN_ORDER`."""
    mixins = tuple(MIXINS[fix] for fix in MIXIN_ORDER if fix in active_fixes)
    if not mixins:
        return base
    return type(
        "HeartbeatFixSchedulerJobRunner",
        (FixGaugesMixin, *mixins, base),
        {
            "__module__": __name__,
            "heartbeat_fixes": active_fixes,
            # Log under the stock scheduler's logger name, so [logging] namespace_levels and log filters
            # written for it keep applying.
            "_logger_name": base._logger_name or f"{base.__module__}.{base.__name__}",
        },
    )
