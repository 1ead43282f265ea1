"""
``SchedulerJobRunner`` subclasses: each fix is one mixin; :func:`build_runner_class` stacks the active ones.

Every override calls ``super()`` and adds the step upstream added; nothing of the upstream method
bodies is copied. Only the mixins of active fixes are in the MRO, so a fix that is "not needed" or
"disabled" leaves the stock method in charge.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

from airflow.callbacks.callback_requests import EmailRequest, TaskCallbackRequest
from airflow.exceptions import DagNotFound
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from airflow.models.taskinstance import TaskInstance as TI
from airflow.utils.state import TaskInstanceState
from sqlalchemy import select

from airflow_heartbeat_fix import session_binding
from airflow_heartbeat_fix._compat import Stats, scoped_session, with_row_locks
from airflow_heartbeat_fix.detection import PURGE_FIX, SINK_FIX

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from airflow.callbacks.callback_requests import CallbackRequest, DagCallbackRequest
    from airflow.executors.base_executor import BaseExecutor
    from sqlalchemy.orm import Session


#: States the heartbeat-timeout scan selects; anything else was finished by someone else meanwhile.
HEARTBEAT_TIMEOUT_STATES = (TaskInstanceState.RUNNING, TaskInstanceState.RESTARTING)


class CommitDagCallbacksMixin(SchedulerJobRunner):
    """
    Session-preserving sink, scheduler side: commit where the stock sink used to, and nowhere else.

    ``_do_scheduling`` sends Dag-level callbacks and then runs the critical section, which expunges the
    session and can roll it back: it relied on the stock sink's commit, so it now commits after each
    Dag callback. Executor-event processing binds ``ti.set_state`` to its batch session (upstream passes
    ``session=session`` in the Dag-lookup-failure branch).
    """

    def _send_dag_callbacks_to_processor(self, dag: Any, callback: DagCallbackRequest | None = None) -> None:
        super()._send_dag_callbacks_to_processor(dag, callback)
        if callback:
            # The sink added the request to the thread's scoped session, which is the session of
            # _do_scheduling and of _update_dag_run_state_for_paused_dags (@provide_session).
            scoped_session().commit()

    def _process_executor_events(self, executor: BaseExecutor, session: Session) -> int:
        with session_binding.bound_to(session):
            return super()._process_executor_events(executor, session)


class ConvergedHeartbeatPurgeMixin(SchedulerJobRunner):
    """
    Backport of the converged heartbeat-timeout purge to schedulers that only send the callback.

    The stock purge sends a ``TaskCallbackRequest`` and leaves the task instance RUNNING, so the next
    scan sends another one for the same try. Here the scan locks its rows, the purge re-validates them,
    loads ``ti.task`` (for ``fail_fast``, retries and email settings), types the callback by retry
    eligibility, sends the email request the executor-event path would have sent, and calls
    ``handle_failure`` in the same pass. The stock purge still runs for each task instance: it writes
    the audit ``Log`` row and the error line, builds and sends the callback, tells the executor, and
    emits ``task_instances_without_heartbeats_killed``. ``_find_and_purge_task_instances_without_heartbeats``
    runs both in one ``create_session()``, so the locks and the task instances share one transaction.
    """

    def _find_task_instances_without_heartbeats(self, *, session: Session) -> list[TI]:
        found = super()._find_task_instances_without_heartbeats(session=session)
        if not found:
            return found
        # Lock the rows (of=TI) so no worker commits a terminal state between this scan and the purge,
        # and skip rows another scheduler holds so HA schedulers neither wait nor double-handle them.
        # The state filter drops rows that left RUNNING since the stock scan read them.
        locked = with_row_locks(
            select(TI.id).where(TI.id.in_([ti.id for ti in found]), TI.state.in_(HEARTBEAT_TIMEOUT_STATES)),
            of=TI,
            session=session,
            skip_locked=True,
        )
        locked_ids = set(session.scalars(locked))
        return [ti for ti in found if ti.id in locked_ids]

    def _purge_task_instances_without_heartbeats(
        self, task_instances_without_heartbeats: list[TI], *, session: Session
    ) -> None:
        for ti in task_instances_without_heartbeats:
            # Per task instance and right before its side effects, as upstream does: handle_failure()
            # commits (TaskInstance.save_to_db), which releases the scan's row locks for the rest of
            # the batch, and SQLite has no row locks at all.
            ti.refresh_from_db(session=session)
            if ti.state not in HEARTBEAT_TIMEOUT_STATES:
                self.log.info(
                    "Task instance %s is no longer running (state=%s); skipping heartbeat-timeout purge",
                    ti,
                    ti.state,
                )
                Stats.incr("heartbeat_fix.heartbeat_timeout.skipped_finished", tags={"dag_id": ti.dag_id})
                continue
            ti.task = self._load_task(ti, session=session)
            # Decided with the task loaded (retries, not the no-task guess) and before the state changes.
            callback_type = (
                TaskInstanceState.UP_FOR_RETRY if ti.is_eligible_to_retry() else TaskInstanceState.FAILED
            )
            with _typed_task_callbacks(self.executor, ti.id, callback_type) as sent:
                super()._purge_task_instances_without_heartbeats([ti], session=session)
            if not sent and ti.state != TaskInstanceState.RESTARTING:
                # The stock purge skipped it (no Dag version to build a callback from); so does upstream.
                continue
            # Once the task instance leaves RUNNING, the executor-event path no longer sends the email.
            if sent and _has_email_alerts(ti.task):
                self.executor.send_callback(_email_request_for(sent[0], callback_type))
            msg = str(self._generate_task_instance_heartbeat_timeout_message_details(ti))
            ti.handle_failure(error=msg, session=session)
            Stats.incr(
                "heartbeat_fix.heartbeat_timeout.converged", tags={"dag_id": ti.dag_id, "task_id": ti.task_id}
            )

    def _load_task(self, ti: TI, *, session: Session) -> Any:
        """The serialized task, or ``None`` (the task instance is still failed, without task context)."""
        try:
            dag = self.scheduler_dag_bag.get_dag_for_run(dag_run=ti.dag_run, session=session)
            if not dag:
                raise DagNotFound(f"DAG '{ti.dag_id}' not found in serialized_dag table")
            return dag.get_task(ti.task_id)
        except Exception:
            self.log.exception(
                "Could not load the task of heartbeat-timed-out task instance %s; "
                "failing it without fail_fast/retries/email context",
                ti,
            )
            return None


def _has_email_alerts(task: Any) -> bool:
    return bool(task is not None and task.email and (task.email_on_failure or task.email_on_retry))


def _email_request_for(request: TaskCallbackRequest, callback_type: TaskInstanceState) -> EmailRequest:
    """The email request for the same try, built from the callback request the stock purge sent."""
    shared = request.model_dump(include=set(EmailRequest.model_fields) - {"type", "email_type"})
    return EmailRequest.model_validate(
        {**shared, "email_type": "retry" if callback_type == TaskInstanceState.UP_FOR_RETRY else "failure"}
    )


@contextlib.contextmanager
def _typed_task_callbacks(
    executor: BaseExecutor, ti_id: Any, callback_type: TaskInstanceState
) -> Iterator[list[TaskCallbackRequest]]:
    """
    While the stock purge runs, stamp the task instance's callback with ``callback_type`` and collect it.

    3.2 sends heartbeat-timeout callbacks untyped (so a retryable task gets ``on_failure_callback``) and
    3.3 types them without the task loaded. The stock purge calls ``self.executor.send_callback``; the
    interception is an instance attribute on that executor, removed when the block ends.
    """
    sent: list[TaskCallbackRequest] = []
    send_callback: Callable[[CallbackRequest], None] = executor.send_callback

    def typed_send_callback(request: CallbackRequest) -> None:
        if isinstance(request, TaskCallbackRequest) and request.ti.id == ti_id:
            request.task_callback_type = callback_type
            sent.append(request)
        send_callback(request)

    executor.send_callback = typed_send_callback  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        del executor.send_callback


MIXINS: dict[str, type[SchedulerJobRunner]] = {
    SINK_FIX: CommitDagCallbacksMixin,
    PURGE_FIX: ConvergedHeartbeatPurgeMixin,
}


class AnnounceFixesMixin(SchedulerJobRunner):
    """Says once, at scheduler start, which fixes this runner carries."""

    heartbeat_fixes: tuple[str, ...] = ()

    def _execute(self) -> int | None:
        self.log.info("airflow-heartbeat-fix: scheduler running with %s", ", ".join(self.heartbeat_fixes))
        return super()._execute()


@functools.cache
def build_runner_class(
    active_fixes: tuple[str, ...], base: type[SchedulerJobRunner] = SchedulerJobRunner
) -> type[SchedulerJobRunner]:
    """The scheduler runner class with the mixins of ``active_fixes`` (purge before sink in the MRO)."""
    mixins = tuple(MIXINS[fix] for fix in (PURGE_FIX, SINK_FIX) if fix in active_fixes)
    if not mixins:
        return base
    return type(
        "HeartbeatFixSchedulerJobRunner",
        (AnnounceFixesMixin, *mixins, base),
        {
            "__module__": __name__,
            "heartbeat_fixes": active_fixes,
            # Log under the stock scheduler's logger name, so [logging] namespace_levels and log filters
            # written for it keep applying.
            "_logger_name": base._logger_name or f"{base.__module__}.{base.__name__}",
        },
    )
