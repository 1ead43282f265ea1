"""
The heartbeat-timeout purge, converged (:class:`ConvergedHeartbeatPurgeMixin`) and holding each task
instance's row lock through its failure (:class:`LockedPurgeRevalidationMixin`).
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from unittest import mock

from airflow.callbacks.callback_requests import TaskCallbackRequest
from airflow.exceptions import DagNotFound
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from airflow.models.taskinstance import TaskInstance as TI
from airflow.utils.state import TaskInstanceState
from sqlalchemy import inspect, select
from sqlalchemy.orm.attributes import set_committed_value

from airflow_heartbeat_fix._compat import EmailRequest, Stats, dag_for_run, default_executor, with_row_locks

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from airflow.callbacks.callback_requests import CallbackRequest
    from airflow.callbacks.callback_requests import EmailRequest as EmailRequestType
    from airflow.executors.base_executor import BaseExecutor
    from sqlalchemy.orm import Session


#: Which task callback the Dag processor runs for a try failed into each state.
CALLBACK_KINDS = {
    TaskInstanceState.UP_FOR_RETRY: "on_retry_callback",
    TaskInstanceState.FAILED: "on_failure_callback",
}
#: States the heartbeat-timeout scan selects; anything else was finished by someone else meanwhile.
HEARTBEAT_TIMEOUT_STATES = (TaskInstanceState.RUNNING, TaskInstanceState.RESTARTING)


class ConvergedHeartbeatPurgeMixin(SchedulerJobRunner):
    """
    Backport of the converged heartbeat-timeout purge to schedulers that only send the callback.

    Backports apache/airflow#68008 (closes #42553; shipped in 3.4.0b1) and the callback type of
    #66767 (closes #65400; 3.3.1+) to 3.2/3.3. Delete once the oldest supported Airflow ships the
    converged purge (detection reports it "not needed").

    The stock purge sends a ``TaskCallbackRequest`` and leaves the task instance RUNNING, so the next
    scan sends another one for the same try. Here the scan locks its rows, the purge re-validates them,
    loads ``ti.task`` (for ``fail_fast``, retries and email settings), types the callback by retry
    eligibility, sends the email request the executor-event path would have sent, and calls
    ``handle_failure`` in the same pass. The stock purge still runs for each task instance: it writes
    the audit ``Log`` row and the error line, builds and sends the callback, tells the executor, and
    emits ``task_instances_without_heartbeats_killed``. ``_find_and_purge_task_instances_without_heartbeats``
    runs both in one ``create_session()``, so the locks and the task instances share one transaction.
    """

    #: Dags already looked up in the current pass, keyed by what ``get_dag_for_run`` reads of a run.
    _dags_this_pass: dict[tuple[Any, ...], Any] | None = None

    def _find_and_purge_task_instances_without_heartbeats(self) -> None:
        # The memo lives for this pass: on leaving, patch.object removes the instance attribute (an
        # error too), so the class's None says "outside a pass" again.
        with mock.patch.object(self, "_dags_this_pass", {}):
            super()._find_and_purge_task_instances_without_heartbeats()

    def _find_task_instances_without_heartbeats(self, *, session: Session) -> list[TI]:
        found = super()._find_task_instances_without_heartbeats(session=session)
        if not found:
            return found
        # Lock the rows (of=TI) so no worker commits a terminal state between this scan and the purge,
        # and skip rows another scheduler holds so HA schedulers neither wait nor double-handle them.
        # The state filter drops rows that left RUNNING since the stock scan read them.
        # Primary-key order, so two schedulers never take the same rows' locks in opposite orders.
        locked = with_row_locks(
            select(TI.id)
            .where(TI.id.in_([ti.id for ti in found]), TI.state.in_(HEARTBEAT_TIMEOUT_STATES))
            .order_by(TI.id),
            of=TI,
            session=session,
            skip_locked=True,
        )
        by_id = {ti.id: ti for ti in found}
        return [by_id[ti_id] for ti_id in session.scalars(locked)]

    def _purge_task_instances_without_heartbeats(
        self, task_instances_without_heartbeats: list[TI], *, session: Session
    ) -> None:
        for ti in task_instances_without_heartbeats:
            if not self._still_running_before_purge(ti, session=session):
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
            executor = default_executor(self)
            with _typed_task_callbacks(executor, ti.id, callback_type) as sent:
                super()._purge_task_instances_without_heartbeats([ti], session=session)
            if not sent and ti.state != TaskInstanceState.RESTARTING:
                # The stock purge skipped it (no Dag version to build a callback from); so does upstream.
                continue
            # Once the task instance leaves RUNNING, the executor-event path no longer sends the email.
            # Without an email request (3.0), handle_failure() below sends it itself, ti.task loaded.
            if sent and EmailRequest is not None and _has_email_alerts(ti.task):
                executor.send_callback(_email_request_for(EmailRequest, sent[0], callback_type))
            msg = str(self._generate_task_instance_heartbeat_timeout_message_details(ti))
            try_number = ti.try_number  # handle_failure may move the task instance on to its next try
            ti.handle_failure(error=msg, session=session)
            Stats.incr(
                "heartbeat_fix.heartbeat_timeout.converged", tags={"dag_id": ti.dag_id, "task_id": ti.task_id}
            )
            self.log.info(
                "airflow-heartbeat-fix (converged_heartbeat_purge): failed heartbeat-timed-out %s try %s in "
                "the same pass: %s, %s",
                ti,
                try_number,
                callback_type.value,
                f"one {CALLBACK_KINDS[callback_type]} request sent"
                if sent
                else "no callback (restarting try)",
            )

    def _still_running_before_purge(self, ti: TI, *, session: Session) -> bool:
        """
        Re-read ``ti`` right before its side effects, as upstream does, and say whether it still runs.

        Per task instance: handle_failure() commits (TaskInstance.save_to_db), which releases the scan's
        row locks for the rest of the batch, and SQLite has no row locks at all. This read takes no lock;
        :class:`LockedPurgeRevalidationMixin` replaces it with a locked one when that fix is active.
        """
        ti.refresh_from_db(session=session)
        return ti.state in HEARTBEAT_TIMEOUT_STATES

    def _load_task(self, ti: TI, *, session: Session) -> Any:
        """The serialized task, or ``None`` (the task instance is still failed, without task context)."""
        try:
            dag = self._dag_for_run(ti.dag_run, session=session)
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

    def _dag_for_run(self, dag_run: Any, *, session: Session) -> Any:
        """
        The run's Dag, looked up once per Dag version in a purge pass instead of once per task instance
        (each lookup of a run without a bundle version queries the latest ``dag_version``).

        The key is what the Dag bag reads of the run (3.0 to 3.4); the memo lives for one
        ``_find_and_purge_task_instances_without_heartbeats`` call, as a scheduler loop resolves a
        version once per pass. Outside a pass (a direct purge call) every lookup goes to the Dag bag.
        """
        if self._dags_this_pass is None:
            return dag_for_run(self.scheduler_dag_bag, dag_run=dag_run, session=session)
        key = (dag_run.dag_id, dag_run.bundle_version, dag_run.created_dag_version_id)
        if key not in self._dags_this_pass:
            self._dags_this_pass[key] = dag_for_run(self.scheduler_dag_bag, dag_run=dag_run, session=session)
        return self._dags_this_pass[key]


def _has_email_alerts(task: Any) -> bool:
    return bool(task is not None and task.email and (task.email_on_failure or task.email_on_retry))


def _email_request_for(
    email_request: type[EmailRequestType], request: TaskCallbackRequest, callback_type: TaskInstanceState
) -> EmailRequestType:
    """The email request for the same try, built from the callback request the stock purge sent."""
    shared = request.model_dump(include=set(email_request.model_fields) - {"type", "email_type"})
    return email_request.model_validate(
        {**shared, "email_type": "retry" if callback_type == TaskInstanceState.UP_FOR_RETRY else "failure"}
    )


@contextlib.contextmanager
def each_task_callback(
    executor: BaseExecutor, stamp: Callable[[TaskCallbackRequest], None]
) -> Iterator[None]:
    """
    While the block runs, hand each ``TaskCallbackRequest`` the executor is asked to send to ``stamp``
    before it is sent.

    The scheduler's paths call the executor's ``send_callback``; the interception is an instance
    attribute on it, which ``mock.patch.object`` removes again (or puts back the executor's or another
    plugin's own instance attribute), so nested blocks unwind in order.
    """
    send_callback: Callable[[CallbackRequest], None] = executor.send_callback

    def stamping_send_callback(request: CallbackRequest) -> None:
        if isinstance(request, TaskCallbackRequest):
            stamp(request)
        send_callback(request)

    with mock.patch.object(executor, "send_callback", stamping_send_callback):
        yield


@contextlib.contextmanager
def _typed_task_callbacks(
    executor: BaseExecutor, ti_id: Any, callback_type: TaskInstanceState
) -> Iterator[list[TaskCallbackRequest]]:
    """
    While the stock purge runs, stamp the task instance's callback with ``callback_type`` and collect it.

    3.0, 3.1, 3.2 and 3.3.0 send heartbeat-timeout callbacks untyped (so a retryable task gets
    ``on_failure_callback``); 3.3.1+ type them without the task loaded.
    """
    sent: list[TaskCallbackRequest] = []

    def stamp(request: TaskCallbackRequest) -> None:
        # Compared as text: up to 3.1 the model's id is a string column, the request's a UUID.
        if str(request.ti.id) == str(ti_id):
            request.task_callback_type = callback_type
            sent.append(request)

    with each_task_callback(executor, stamp):
        yield sent


class LockedPurgeRevalidationMixin(SchedulerJobRunner):
    """
    Hold each task instance's row lock from its re-validation through its own commit.

    Closes the gap upstream names as a known issue of its sink fix for the 3.4.0b1/b2 crash ("Known issues";
    still in 3.4.0b2), which the 3.2/3.3 backport shares: the scan locks the batch, but
    ``handle_failure`` commits per task instance (``TaskInstance.save_to_db``), releasing every other
    row's lock, and the re-check before each task instance's side effects reads without a lock. A
    worker's SUCCESS committed in between is overwritten and a failure callback is sent for a task that
    succeeded. Here each task instance is handed to the purge alone, right after one statement that
    locks its row (``FOR UPDATE ... SKIP LOCKED``: a row a worker or another scheduler holds is being
    changed by them, and nobody ever waits) and re-validates it against the scan's criteria; the lock
    is held until that task instance's own commit. Delete once an Airflow release's purge re-reads each
    task instance under its row lock (detection then reports this fix "not needed").

    SQLite has no row locks, and MariaDB and MySQL < 8 ignore them (``with_row_locks`` renders nothing,
    as for the scan): there the re-validation still happens, but nothing stops a worker committing
    between it and the side effects.

    Transaction shape: one per task instance, upstream's (``handle_failure`` commits). A row lock is
    held for one task instance's side effects only, and a failure rolls back that task instance alone
    (the next scan redoes it). One transaction per pass would save a commit per task instance but hold
    every lock of the batch until the pass ends and roll the whole pass back on any error; it would also
    mean suppressing ``handle_failure``'s commit. Where the lock really locks, it is the task instance's
    only read: the purge's own re-reads are skipped (:func:`_refresh_served_by_row_lock`); the statements
    per task instance are measured by ``python -m benchmarks.purge_cost``.
    """

    #: The task instance whose re-validation under its row lock is in force (one at a time).
    _ti_revalidated_under_lock: Any = None

    def _purge_task_instances_without_heartbeats(
        self, task_instances_without_heartbeats: list[TI], *, session: Session
    ) -> None:
        locks_rows = _locks_rows(session)
        for ti in task_instances_without_heartbeats:
            if not self._lock_if_still_without_heartbeat(ti, session=session):
                continue
            with (
                mock.patch.object(self, "_ti_revalidated_under_lock", ti.id),
                _refresh_served_by_row_lock(ti) if locks_rows else contextlib.nullcontext(),
            ):
                super()._purge_task_instances_without_heartbeats([ti], session=session)

    def _still_running_before_purge(self, ti: TI, *, session: Session) -> bool:
        """The backport's own re-read: already done under the row lock for this task instance."""
        if ti.id == self._ti_revalidated_under_lock:
            return True
        return self._lock_if_still_without_heartbeat(ti, session=session)

    def _lock_if_still_without_heartbeat(self, ti: TI, *, session: Session) -> bool:
        """Lock ``ti``'s row, reload it, and say whether the scan would still select it; log a skip."""
        locked_row = with_row_locks(
            select(*TI.__table__.columns).where(TI.id == ti.id), of=TI, session=session, skip_locked=True
        )
        row = session.execute(locked_row).mappings().one_or_none()
        timeout = timedelta(seconds=self._task_instance_heartbeat_timeout_secs)
        stale_before = datetime.now(tz=timezone.utc) - timeout
        if row is None:
            changed: str | None = "is held by another transaction (or gone)"
        else:
            changed = changed_since_scan(row, job_id=self.job.id, stale_before=stale_before)
        if changed is not None or row is None:
            self.log.info("Task instance %s %s; skipping its heartbeat-timeout purge", ti, changed)
            Stats.incr("heartbeat_fix.heartbeat_timeout.skipped_changed", tags={"dag_id": ti.dag_id})
            return False
        _load_row_into(ti, row)
        return True


def _locks_rows(session: Session) -> bool:
    """Whether ``with_row_locks`` really locks on this database (not SQLite, MariaDB, MySQL < 8, or off)."""
    query = select(TI.id)
    return with_row_locks(query, of=TI, session=session) is not query


def _refresh_served_by_row_lock(ti: TI) -> contextlib.AbstractContextManager[Any]:
    """
    While ``ti``'s row is locked by this transaction and was just read under that lock, make its
    ``refresh_from_db`` a no-op: no other transaction can change the row before this one commits, so a
    re-read returns what was read. The purge re-reads twice per task instance (upstream's or the
    backport's re-check, then ``handle_failure``'s own refresh); each is a statement per task instance.
    Only the instance's own attribute is set; ``patch.object`` removes it afterwards (or puts back one
    the instance already had), so the class's method comes back.
    """
    return mock.patch.object(ti, "refresh_from_db", _already_fresh)


def _already_fresh(*args: Any, **kwargs: Any) -> None:
    """``refresh_from_db`` of a task instance whose row this transaction read under its lock."""


def changed_since_scan(row: Mapping[Any, Any], *, job_id: int | None, stale_before: datetime) -> str | None:
    """
    How a task instance's locked row no longer matches the heartbeat-timeout scan, or ``None``.

    The scan's criteria are the same on 3.2 to 3.4: RUNNING or RESTARTING, last heartbeat older than
    ``[scheduler] task_instance_heartbeat_timeout``, queued by this scheduler's job; on 3.4 the scan
    sees only the live try of each task (``working_set``), so an archived try no longer matches.
    """
    if row["state"] not in HEARTBEAT_TIMEOUT_STATES:
        return f"is no longer running (state={row['state']})"
    if row["last_heartbeat_at"] is None or row["last_heartbeat_at"] >= stale_before:
        return "heartbeated since the scan"
    if row["queued_by_job_id"] != job_id:
        return f"was adopted by scheduler job {row['queued_by_job_id']}"
    if "working_set" in row and row["working_set"] is None:
        return "is an archived try"
    return None


def _load_row_into(ti: TI, row: Mapping[Any, Any]) -> None:
    """Set ``ti``'s column attributes to the freshly locked row, as committed values (nothing to flush)."""
    for column_attr in inspect(TI).column_attrs:
        name = column_attr.columns[0].name
        if name in row:
            set_committed_value(ti, column_attr.key, row[name])
