"""
A terminal executor event for a try whose worker still heartbeats is set aside, and the try is judged by
its heartbeat.

``process_executor_events`` fails a RUNNING try, queued by this scheduler, on any FAILED or SUCCESS event
for its key, without reading its heartbeat. The event cannot tell a dead worker from a stale duplicate:
a Celery redelivery whose copy the Execution API refused (expired token: 403), a duplicate dispatch that
lost the race to ``/run``, the old worker's exit after the try resumed elsewhere all report the same
key and state, with no host. The heartbeat can: ``/run`` sets ``last_heartbeat_at`` with the winner's
hostname and pid, and only that worker's heartbeats refresh it (a duplicate's are refused with 409). A
fresh heartbeat proves the worker that owns the try is alive.

The pure decisions (:func:`live_threshold`, :func:`why_not_alive`) are here; the mixin is the glue.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from airflow.models.log import Log
from airflow.models.taskinstance import TaskInstance as TI
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState
from sqlalchemy import select

from airflow_heartbeat_fix._compat import Stats, task_instance_uuid_class
from airflow_heartbeat_fix.detection import HEARTBEAT_EVENTS_FIX
from airflow_heartbeat_fix.logs import fix_logger

if TYPE_CHECKING:
    from collections.abc import Iterable

    from airflow.executors.base_executor import BaseExecutor
    from sqlalchemy.orm import Session

#: The executor states on which ``process_executor_events`` fails a running try.
TERMINAL = (TaskInstanceState.FAILED, TaskInstanceState.SUCCESS)
SET_ASIDE_METRIC = "heartbeat_fix.executor_event.set_aside"
HANDED_BACK_METRIC = "heartbeat_fix.executor_event.handed_back"
#: The audit ``Log`` row's event, next to the stock path's "state mismatch" rows; its ``extra`` is the line.
LOG_EVENT = "stale executor event"
#: How every line of a fix acting starts (the demo counts them per fix).
LINE_PREFIX = f"airflow-heartbeat-fix ({HEARTBEAT_EVENTS_FIX}): "
SET_ASIDE_LINE = (
    f"{LINE_PREFIX}executor %s reported %s for %s, but the try is running on %s (pid %s) and heartbeated "
    "%.1f s ago: the event is set aside until the try leaves running or its heartbeat is %.0f s old%s"
)
HAND_BACK_LINE = (
    f"{LINE_PREFIX}%s the %s event of %s, set aside %.1f s ago: %s (state %s, heartbeat %s s old)"
)

log = fix_logger(__name__)


class HandBack(str, enum.Enum):
    """Why an event set aside goes back to the stock path (the ``reason`` tag of the metric)."""

    LEFT_RUNNING = "left_running"
    OTHER_SCHEDULER = "queued_by_another_scheduler"
    HEARTBEAT_STOPPED = "heartbeat_stopped"


def live_threshold(*, min_heartbeat_interval: float, loop_seconds: float, heartbeat_timeout: float) -> float:
    """
    How old a try's heartbeat may be for its worker to count as alive: ``2 x min_heartbeat_interval``
    minus one scheduler loop, never above the heartbeat timeout (nor below 0: then nothing is set aside).

    A live worker heartbeats every ``min_heartbeat_interval`` plus one API round trip (measured up to about
    1.9 intervals when its output keeps waking the supervisor just before a heartbeat is due). A dead one's
    heartbeat stops at its death, which comes before its event: its event is handed back when the heartbeat
    is this old and the stock path fails the try at the next loop, so a real death is judged no later than
    ``2 x min_heartbeat_interval`` after it, whenever its event arrives.
    """
    return max(0.0, min(2 * min_heartbeat_interval - loop_seconds, heartbeat_timeout))


def why_not_alive(
    row: Any, *, job_id: int | None, try_number: int | None, now: datetime, threshold: float
) -> HandBack | None:
    """
    ``None`` if ``row`` (a try's columns, or ``None`` if it is gone) is the running try of the event,
    queued by this scheduler, with a heartbeat younger than ``threshold`` seconds; else why the event
    belongs to the stock path. ``try_number``: the event's try, where its key carries one (3.0 to 3.3).
    """
    if row is None or row.state != TaskInstanceState.RUNNING:
        return HandBack.LEFT_RUNNING
    if try_number is not None and row.try_number != try_number:
        return HandBack.LEFT_RUNNING
    if row.queued_by_job_id != job_id:
        return HandBack.OTHER_SCHEDULER
    age = heartbeat_age(row, now)
    # No heartbeat known (never written, as on a try started before /run set it): nothing says the
    # worker is alive, so the stock path judges it.
    if age is None or age >= threshold:
        return HandBack.HEARTBEAT_STOPPED
    return None


def heartbeat_age(row: Any, now: datetime) -> float | None:
    """Seconds since ``row``'s last heartbeat (database time, as the heartbeat-timeout scan compares it)."""
    if row is None or row.last_heartbeat_at is None:
        return None
    return (now - row.last_heartbeat_at).total_seconds()


@dataclass(frozen=True)
class SetAside:
    """An executor event kept out of the stock path, with the try's row id when it was set aside."""

    state: Any
    info: Any
    ti_id: Any
    since: datetime


class HeartbeatJudgedExecutorEventsMixin(SchedulerJobRunner):
    """
    Set a FAILED or SUCCESS executor event aside while its try runs with a fresh heartbeat; judge the try
    by its heartbeat.

    The scheduler side of apache/airflow#69336 (open; for the duplicate dispatch of #57041, the Celery
    redelivery of #58441 and #63774, the old worker's SUCCESS of #71580). Delete once the installed
    ``process_executor_events`` reads the try's heartbeat before failing it (detection then reports
    ``heartbeat_judged_executor_events`` "not needed"). #69336 as reviewed keeps a try alive for the whole
    heartbeat timeout (300 s by default); that would also delay every real death that has an event
    (a SIGKILLed Celery pool process, 3.4's LocalExecutor worker) to the timeout, which this fix does not.

    Before each stock pass: a terminal event for a try that is RUNNING, queued by this scheduler, with a
    heartbeat younger than :func:`live_threshold` (``2 x [workers] min_heartbeat_interval`` minus
    ``[scheduler] scheduler_idle_sleep_time``: 9 s at the defaults) is taken out of the executor's event
    buffer and kept. Every pass re-reads the kept events' tries and hands an event back to the buffer,
    unchanged, once its try has left RUNNING (the live worker finished it: the stock path ignores the event),
    another scheduler queued it, or its heartbeat is that old (the worker died: the stock path fails the try
    once, as it would have, with its callback). The threshold is what keeps a real death's retry within
    ``stock + 2 x min_heartbeat_interval``; its one limitation: a live worker whose heartbeats are further
    apart than the threshold (an overloaded worker or API server) is failed on a stale event as stock fails
    it today, never sooner. A restarted scheduler has forgotten the events it kept: a worker that dies then
    is failed by the heartbeat-timeout purge.

    One read of the events' tries per pass that has terminal task events (columns only, no lock, nothing
    loaded into the session); a set-aside event also writes one ``Log`` row (``stale executor event``) in
    the pass's session, a WARNING line and ``heartbeat_fix.executor_event.set_aside``; a hand-back an INFO
    line and ``heartbeat_fix.executor_event.handed_back`` (tag ``reason``).
    """

    #: ``id(executor)`` -> event key -> the event set aside (the runner's executors live as long as it
    #: does); the class's ``None``: nothing set aside yet.
    _events_set_aside: dict[int, dict[Any, SetAside]] | None = None

    def _process_executor_events(self, executor: BaseExecutor, session: Session) -> int:
        self._judge_terminal_events_by_heartbeat(executor, session)
        return super()._process_executor_events(executor, session)

    @functools.cached_property
    def _live_threshold(self) -> float:
        return live_threshold(
            min_heartbeat_interval=conf.getfloat("workers", "min_heartbeat_interval"),
            loop_seconds=self._scheduler_idle_sleep_time,
            heartbeat_timeout=self._task_instance_heartbeat_timeout_secs,
        )

    def _judge_terminal_events_by_heartbeat(self, executor: BaseExecutor, session: Session) -> None:
        if self._events_set_aside is None:
            self._events_set_aside = {}
        kept = self._events_set_aside.setdefault(id(executor), {})
        new = {
            key: event
            for key, event in executor.event_buffer.items()
            if _is_task_key(key) and event[0] in TERMINAL
        }
        if not new and not kept:
            return
        rows = _read_tries([*new, *kept], session)
        now = datetime.now(timezone.utc)
        for key in [key for key in kept if key not in new]:
            reason = self._why_not_alive(key, rows.get(key), now)
            if reason is not None:
                self._hand_back(executor, key, kept.pop(key), rows.get(key), reason, now)
        for key, (state, info) in new.items():
            row: Any = rows.get(key)  # None: no such try (why_not_alive then says LEFT_RUNNING)
            reason = self._why_not_alive(key, row, now)
            if reason is None:
                del executor.event_buffer[key]
                kept[key] = SetAside(state, info, row.id, now)
                self._announce_set_aside(executor, key, kept[key], row, now, session)
            elif (superseded := kept.pop(key, None)) is not None:
                # A newer event for the same key is in the buffer: the stock path takes that one instead.
                self._hand_back(executor, key, superseded, row, reason, now, put_back=False)

    def _why_not_alive(self, key: Any, row: Any, now: datetime) -> HandBack | None:
        try_number = key.try_number if isinstance(key, TaskInstanceKey) else None
        return why_not_alive(
            row, job_id=self.job.id, try_number=try_number, now=now, threshold=self._live_threshold
        )

    def _announce_set_aside(
        self, executor: BaseExecutor, key: Any, event: SetAside, row: Any, now: datetime, session: Session
    ) -> None:
        args = (
            executor,
            event.state,
            _describe(row),
            row.hostname,
            row.pid,
            heartbeat_age(row, now),
            self._live_threshold,
            "" if event.info is None else f". Extra info: {event.info}",
        )
        log.warning(SET_ASIDE_LINE, *args)
        # Log reads dag_id, task_id, run_id, map_index and try_number (3.4: id) off what it is given.
        session.add(Log(event=LOG_EVENT, task_instance=row, extra=SET_ASIDE_LINE % args))
        tags = {"dag_id": row.dag_id, "task_id": row.task_id, "executor_state": str(event.state)}
        Stats.incr(SET_ASIDE_METRIC, tags=tags)

    def _hand_back(
        self,
        executor: BaseExecutor,
        key: Any,
        event: SetAside,
        row: Any,
        reason: HandBack,
        now: datetime,
        *,
        put_back: bool = True,
    ) -> None:
        # 3.4 drains an event keyed by TaskInstanceKey through the coordinates the executor captured when it
        # queued the try, and forgets them once the try is out of its running set: the try's own row id
        # (the one set aside) still names it.
        uuid_class = task_instance_uuid_class()
        target = uuid_class(event.ti_id) if uuid_class and isinstance(key, TaskInstanceKey) else key
        if put_back:
            executor.event_buffer.setdefault(target, (event.state, event.info))
        age = heartbeat_age(row, now)
        log.info(
            HAND_BACK_LINE,
            "handing back to the scheduler" if put_back else "superseded by a newer event, dropping",
            event.state,
            _describe(row) if row is not None else key,
            (now - event.since).total_seconds(),
            reason.value,
            None if row is None else row.state,
            "unknown" if age is None else f"{age:.1f}",
        )
        tags = {"dag_id": getattr(row, "dag_id", None) or getattr(key, "dag_id", ""), "reason": reason.value}
        Stats.incr(HANDED_BACK_METRIC, tags=tags)


def _is_task_key(key: Any) -> bool:
    uuid_class = task_instance_uuid_class()
    return isinstance(key, TaskInstanceKey) or (uuid_class is not None and isinstance(key, uuid_class))


def _describe(row: Any) -> str:
    """A try as the log lines name it: ``dag.task run_id`` (``[map_index]``), ``try N``."""
    mapped = f"[{row.map_index}]" if row.map_index is not None and row.map_index >= 0 else ""
    return f"task instance {row.dag_id}.{row.task_id}{mapped} of run {row.run_id}, try {row.try_number}"


_COLUMNS = (
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


def _read_tries(keys: Iterable[Any], session: Session) -> dict[Any, Any]:
    """
    Event key -> the columns of its try's row (absent: no such row). Columns only: nothing enters the
    session's identity map, so the stock pass's own locked read is not served stale objects.
    """
    keys = list(keys)
    found: dict[Any, Any] = {}
    by_id = {str(key.id): key for key in keys if not isinstance(key, TaskInstanceKey)}
    if by_id:
        for row in session.execute(select(*_COLUMNS).where(TI.id.in_([key.id for key in by_id.values()]))):
            found[by_id[str(row.id)]] = row
    coordinates = [key for key in keys if isinstance(key, TaskInstanceKey)]
    if coordinates and (where := TI.filter_for_tis(coordinates)) is not None:
        query = select(*_COLUMNS).where(where)
        if hasattr(TI, "working_set"):  # 3.4 keeps every try as a row: the current one is the working set
            query = query.where(TI.working_set.is_(True))
        rows = session.execute(query)
        current = {(row.dag_id, row.task_id, row.run_id, row.map_index): row for row in rows}
        for key in coordinates:
            if (current_row := current.get(key.primary)) is not None:
                found[key] = current_row
    return found
