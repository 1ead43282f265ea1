"""
PHASE-1 PROTOTYPE (issue 32), not wired into activation: a terminal executor event for a try whose worker
still heartbeats is set aside and re-judged by the heartbeat on every later pass.

``process_executor_events`` fails a RUNNING task instance on any FAILED or SUCCESS event for its key (its
own comment leaves running ones to heartbeat detection, yet its check includes RUNNING). A duplicate
delivery that lost the race and died (a Celery redelivery refused by the Execution API, apache/airflow
#58441; a duplicate dispatch, #57041 / #69336), or the old worker's exit after the try resumed elsewhere
(#71580), reports that state while the live worker runs and heartbeats: the live try is failed and its
worker SIGKILLed at its next heartbeat.

Here, before the stock pass drains the executor's event buffer, each FAILED or SUCCESS task event whose
try is RUNNING, queued by this scheduler, with a heartbeat younger than ``LIVE_INTERVALS`` x
``[workers] min_heartbeat_interval``, is taken out of the buffer and kept; each later pass hands a kept
event back to the buffer (and so to the stock path, unchanged) once its try has left RUNNING or its
heartbeat is older than that. A worker that really died (SIGKILL: its heartbeat stops) is failed by the
stock path at most ``LIVE_INTERVALS`` heartbeat intervals after its last heartbeat; one that lives
finishes its try itself. A scheduler restart forgets kept events: the heartbeat-timeout purge then judges
the try alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from airflow.models.log import Log
from airflow.models.taskinstance import TaskInstance as TI
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState
from sqlalchemy import and_, or_, select

from airflow_heartbeat_fix._compat import Stats

try:  # 3.4: executors that track tries by their row id report events under it.
    from airflow.executors.workloads.types import TaskInstanceUuid
except ImportError:  # 3.0 to 3.3: every event is keyed by TaskInstanceKey.
    TaskInstanceUuid = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from airflow.executors.base_executor import BaseExecutor
    from sqlalchemy.orm import Session

#: A live worker heartbeats every min_heartbeat_interval; one that has not for this many is taken for dead.
LIVE_INTERVALS = 2
#: The executor states ``process_executor_events`` fails a RUNNING try on.
TERMINAL = (TaskInstanceState.FAILED, TaskInstanceState.SUCCESS)


@dataclass
class _Kept:
    state: Any
    info: Any
    first_seen: datetime


def _is_task_key(key: Any) -> bool:
    return isinstance(key, TaskInstanceKey) or (
        TaskInstanceUuid is not None and isinstance(key, TaskInstanceUuid)
    )


def _rows_for(keys: list[Any], session: Session) -> dict[Any, Any]:
    """key -> the try's row (state, try_number, queued_by_job_id, last heartbeat, hostname, pid), if any."""
    columns = (
        TI.id,
        TI.dag_id,
        TI.task_id,
        TI.run_id,
        TI.map_index,
        TI.try_number,
        TI.state,
        TI.queued_by_job_id,
        TI.last_heartbeat_at,
        TI.hostname,
        TI.pid,
    )
    by_id = [key.id for key in keys if TaskInstanceUuid is not None and isinstance(key, TaskInstanceUuid)]
    by_key = [key for key in keys if isinstance(key, TaskInstanceKey)]
    clauses = []
    if by_id:
        clauses.append(TI.id.in_(by_id))
    if by_key:
        clauses.append(
            or_(
                *(
                    and_(
                        TI.dag_id == k.dag_id,
                        TI.task_id == k.task_id,
                        TI.run_id == k.run_id,
                        TI.map_index == k.map_index,
                    )
                    for k in by_key
                )
            )
        )
    if not clauses:
        return {}
    query = select(*columns).where(or_(*clauses))
    if hasattr(TI, "working_set"):
        query = (
            query.where(or_(TI.id.in_(by_id), TI.working_set.is_(True)))
            if by_id
            else query.where(TI.working_set.is_(True))
        )
    rows = session.execute(query).all()
    found: dict[Any, Any] = {}
    for row in rows:
        for key in keys:
            if isinstance(key, TaskInstanceKey):
                if (row.dag_id, row.task_id, row.run_id, row.map_index) == (
                    key.dag_id,
                    key.task_id,
                    key.run_id,
                    key.map_index,
                ):
                    found[key] = row
            elif str(key.id) == str(row.id):
                found[key] = row
    return found


class StaleExecutorEventsPrototypeMixin(SchedulerJobRunner):
    """Prototype: keep a terminal event of a live try out of the stock pass until its heartbeat stops."""

    _kept_events: dict[int, dict[Any, _Kept]] | None = None

    def _process_executor_events(self, executor: BaseExecutor, session: Session) -> int:
        self._judge_task_events_by_heartbeat(executor, session)
        return super()._process_executor_events(executor, session)

    def _live_for(self) -> timedelta:
        return timedelta(seconds=LIVE_INTERVALS * conf.getint("workers", "min_heartbeat_interval"))

    def _judge_task_events_by_heartbeat(self, executor: BaseExecutor, session: Session) -> None:
        if self._kept_events is None:
            self._kept_events = {}
        kept = self._kept_events.setdefault(id(executor), {})
        fresh = {
            key: value
            for key, value in executor.event_buffer.items()
            if _is_task_key(key) and value[0] in TERMINAL and key not in kept
        }
        if not fresh and not kept:
            return
        rows = _rows_for([*fresh, *kept], session)
        now = datetime.now(timezone.utc)
        live_for = self._live_for()

        def alive(key: Any) -> Any:
            row = rows.get(key)
            if row is None or row.state != TaskInstanceState.RUNNING or row.queued_by_job_id != self.job.id:
                return None
            if isinstance(key, TaskInstanceKey) and row.try_number != key.try_number:
                return None
            if row.last_heartbeat_at is None or now - row.last_heartbeat_at >= live_for:
                return None
            return row

        for key, held in list(kept.items()):
            if alive(key) is None:
                del kept[key]
                executor.event_buffer.setdefault(key, (held.state, held.info))
                row = rows.get(key)
                age = (
                    None
                    if row is None or row.last_heartbeat_at is None
                    else (now - row.last_heartbeat_at).total_seconds()
                )
                self.log.warning(
                    "Handing back the executor event %s for %s, set aside %.1fs ago: the try is %s, last "
                    "heartbeat %s s ago",
                    held.state,
                    key,
                    (now - held.first_seen).total_seconds(),
                    None if row is None else row.state,
                    None if age is None else round(age, 1),
                )
                Stats.incr("heartbeat_fix.executor_event.handed_back")
        for key, (state, info) in fresh.items():
            row = alive(key)
            if row is None:
                continue
            del executor.event_buffer[key]
            kept[key] = _Kept(state, info, now)
            age = (now - row.last_heartbeat_at).total_seconds()
            msg = (
                f"Executor {executor} reported {state} for task instance {key}, but its try is running on "
                f"{row.hostname} (pid {row.pid}) and heartbeated {age:.1f}s ago: the event is set aside "
                f"until the try leaves running or its heartbeat stops for {live_for.total_seconds():.0f}s"
            )
            if info is not None:
                msg += f". Extra info: {info}"
            self.log.warning(msg)
            # Log reads dag_id, task_id, run_id, try_number, map_index (and, on 3.4, id) off what it is given.
            session.add(Log(event="stale executor event", task_instance=row, extra=msg))
            Stats.incr(
                "heartbeat_fix.executor_event.set_aside", tags={"dag_id": row.dag_id, "task_id": row.task_id}
            )
