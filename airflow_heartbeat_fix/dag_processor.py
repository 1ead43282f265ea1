"""
``DagFileProcessorManager`` subclasses: the manager's side of the Dag processor fixes;
:func:`build_manager_class` stacks the active ones, :func:`file_processor_patches` names the file
processor's (:mod:`~airflow_heartbeat_fix.callback_delivery`).

``claimed_callback_delivery`` in the manager: the fetch reads callback requests and leaves them stored (the
file processor that runs one deletes it, :mod:`~airflow_heartbeat_fix.callback_claims`); each forked file
processor learns which rows its batch is; a file with requests waiting is queued again as soon as its
processor finishes; a request its file processors keep dying in, or never claim, is deleted after
``[heartbeat_fix] callback_max_attempts`` hand-outs. Every override but the fetch calls ``super()`` and
adds one step. Decisions are the small pure functions at the top.
"""

from __future__ import annotations

import enum
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow.utils.session import create_session
from sqlalchemy import select

from airflow_heartbeat_fix import callback_delivery
from airflow_heartbeat_fix._compat import (
    Stats,
    callback_request_model,
    dag_processor_manager_class,
    file_processor_module,
    metadata_engine,
    with_row_locks,
)
from airflow_heartbeat_fix.callback_claims import Payload, held_elsewhere, lock_file_of
from airflow_heartbeat_fix.detection import (
    CLAIMED_FIX,
    DAG_PROCESSOR_FIXES,
    INFLATION_FIX,
    ISOLATED_FIX,
)
from airflow_heartbeat_fix.facts import names_used, queue_front, stock_callback_fetch
from airflow_heartbeat_fix.logs import fix_logger
from airflow_heartbeat_fix.metrics import emit_fix_gauges

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from airflow.dag_processing.manager import DagFileProcessorManager
else:
    DagFileProcessorManager = dag_processor_manager_class()

#: What the manager logs after a fetch that found requests (the tests kill it the moment it appears).
FETCHED = "left stored until they have run"
#: ``[heartbeat_fix] callback_max_attempts`` when unset or not a positive integer.
DEFAULT_MAX_ATTEMPTS = 3
#: A request deleted at the fetch because it cannot be read back (stock 3.1.2+ raise out of the fetch).
UNREADABLE = "heartbeat_fix.callback.unreadable"


class Verdict(enum.Enum):
    RUN = "run"
    #: ``callback_max_attempts`` file processors started it and died.
    ABANDON_STARTED = "abandon: started too often"
    #: ``callback_max_attempts`` file processors were handed it and exited without starting it.
    ABANDON_UNCLAIMED = "abandon: never claimed"


def judge(attempts: int, handed_at: int | None, unclaimed: int, max_attempts: int) -> tuple[Verdict, int]:
    """
    A fetched request: run it, or abandon it; and its new count of hand-outs never claimed.

    ``attempts``: file processors that started it (the count in its payload); ``handed_at``: that count
    when this manager last handed it out (``None``: never). Unchanged since, that file processor exited
    without claiming it (refused the file, crashed on import): the attempt count alone would hand it out
    forever.
    """
    if handed_at is not None:
        unclaimed = unclaimed + 1 if attempts == handed_at else 0
    if attempts >= max_attempts:
        return Verdict.ABANDON_STARTED, unclaimed
    if unclaimed >= max_attempts:
        return Verdict.ABANDON_UNCLAIMED, unclaimed
    return Verdict.RUN, unclaimed


def interrupted_first(requests: list[Any], attempts: Callable[[Any], int]) -> list[Any]:
    """
    A batch with the requests a dead file processor had started first (stable otherwise): a rerun then
    starts at the beginning of a file processor's ``dag_file_processor_timeout`` instead of behind others.
    """
    return sorted(requests, key=lambda request: attempts(request) == 0)


def files_to_requeue(
    waiting: dict[Any, list[Any]], processing: Iterable[Any], queued: Iterable[Any]
) -> list[Any]:
    """Files with requests waiting that neither run nor are queued (their processor just finished)."""
    busy = set(processing) | set(queued)
    return [file for file, requests in waiting.items() if requests and file not in busy]


def queue_first(manager: Any, files: list[Any]) -> None:
    """Put ``files`` at the front of ``manager``'s file queue, with the keyword this release takes."""
    front = queue_front(DagFileProcessorManager)
    assert front is not None, "detection leaves the fix unpatched where the queue takes neither keyword"
    keyword, value = front
    manager._add_files_to_queue(files, **{keyword: value})


@dataclass(frozen=True)
class FetchShape:
    """How the stock fetch of this release selects: its order, and which bundles' requests it takes."""

    ascending: bool
    by_bundle: bool
    ready_bundles_only: bool

    @classmethod
    def of(cls, stock_fetch: Any) -> FetchShape:
        """Read off the stock fetch's code (3.0 orders ascending; 3.1.2+ filter by bundle; 3.4 ready ones)."""
        names = names_used(stock_fetch) or frozenset()
        return cls("asc" in names, "_dag_bundles" in names, "is_initialized" in names)


def max_attempts() -> int:
    """``[heartbeat_fix] callback_max_attempts``; not a positive integer: the default, with a warning."""
    from airflow.configuration import conf

    raw = conf.get("heartbeat_fix", "callback_max_attempts", fallback=str(DEFAULT_MAX_ATTEMPTS))
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value < 1:
        fix_logger(__name__).warning(
            "airflow-heartbeat-fix: [heartbeat_fix] callback_max_attempts = %r is not a positive integer; "
            "using %d",
            raw,
            DEFAULT_MAX_ATTEMPTS,
        )
        return DEFAULT_MAX_ATTEMPTS
    return value


@dataclass
class Delivery:
    """The manager's bookkeeping of the requests it fetched (memory only: a restart starts afresh)."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: id(request) -> (row id, attempts at the fetch): fetched, not handed out yet.
    fetched: dict[int, tuple[Any, int]] = field(default_factory=dict)
    #: id(file processor) -> (the file processor, its batch's row ids).
    in_flight: dict[int, tuple[Any, tuple[Any, ...]]] = field(default_factory=dict)
    #: row id -> its attempt count when last handed out.
    handed: dict[Any, int] = field(default_factory=dict)
    unclaimed: Counter[Any] = field(default_factory=Counter)

    def held(self, live: Iterable[Any]) -> set[Any]:
        """Rows queued or in a live file processor: never fetched twice. Forgets finished processors."""
        alive = {id(proc) for proc in live}
        self.in_flight = {key: entry for key, entry in self.in_flight.items() if key in alive}
        rows = {row for _, rows in self.in_flight.values() for row in rows}
        return rows | {row for row, _ in self.fetched.values()}

    def forget_missing(self, seen: set[Any], held: set[Any]) -> None:
        """After a fetch that took every eligible row: the rows not seen are done (or held elsewhere)."""
        for row in [row for row in self.handed if row not in seen and row not in held]:
            self.handed.pop(row)
            self.unclaimed.pop(row, None)


class ClaimedDeliveryMixin(DagFileProcessorManager):
    """
    The manager of ``claimed_callback_delivery``: requests stay stored until a file processor ran them.
    Backports nothing: no Airflow release keeps a fetched request (up to 3.4.0b2; apache/airflow#44354
    discusses retries). Delete when detection reports the fetch no longer deletes ("not needed").
    """

    @property
    def _delivery(self) -> Delivery:
        state = self.__dict__.get("_heartbeat_fix_delivery")
        if state is None:
            state = self.__dict__["_heartbeat_fix_delivery"] = Delivery(max_attempts())
        return state

    def _fetch_without_delete(self) -> list[Any]:
        """
        Select as the stock fetch selects (its order, its bundles, ``SKIP LOCKED``) minus the rows this
        manager holds, and delete only what cannot run: rows that do not parse, rows past their attempts.

        Replaces the stock fetch rather than calling it: deleting each row is all the stock fetch adds to
        the select. Delete with this fix (see the class). A database error (stock retries the fetch three
        times) leaves everything stored for the next loop instead of ending the Dag processor.
        """
        from sqlalchemy.exc import OperationalError

        try:
            return self._fetch_stored()
        except OperationalError as error:
            fix_logger(__name__).warning(
                "airflow-heartbeat-fix (%s): fetching callback requests failed (%s); next loop",
                CLAIMED_FIX,
                str(error).splitlines()[0],
            )
            return []

    def _fetch_stored(self) -> list[Any]:
        delivery, log = self._delivery, fix_logger(__name__)
        model = callback_request_model()
        table = model.__table__
        payload = Payload.of(table)
        shape = FetchShape.of(stock_callback_fetch(DagFileProcessorManager))
        bundles = [
            bundle.name
            for bundle in self._dag_bundles
            if not (shape.ready_bundles_only and bundle.supports_versioning and not bundle.is_initialized)
        ]
        held = delivery.held(self._processors.values())
        query = select(model)
        if shape.by_bundle and "bundle_name" in table.c:
            query = query.where(model.bundle_name.in_(bundles))
        if held:
            query = query.where(model.id.not_in(held))
        order = model.priority_weight.asc() if shape.ascending else model.priority_weight.desc()
        query = query.order_by(order).limit(self.max_callbacks_per_loop)
        fetched, seen = [], set()
        with create_session() as session:
            rows = list(session.scalars(with_row_locks(query, of=model, session=session, skip_locked=True)))
            if lock_file := lock_file_of(metadata_engine()):
                running = held_elsewhere(lock_file, [row.id for row in rows])
                rows = [row for row in rows if row.id not in running]
            for row in rows:
                seen.add(row.id)
                try:
                    request = row.get_callback_request()
                except Exception:
                    log.exception(
                        "airflow-heartbeat-fix (%s): callback request %s cannot be read; deleted",
                        CLAIMED_FIX,
                        row.id,
                    )
                    Stats.incr(UNREADABLE)
                    session.delete(row)
                    continue
                if shape.by_bundle and request.bundle_name not in bundles:
                    continue
                attempts = payload.attempts(getattr(row, payload.column.key))
                verdict, unclaimed = judge(
                    attempts,
                    delivery.handed.pop(row.id, None),
                    delivery.unclaimed[row.id],
                    delivery.max_attempts,
                )
                if unclaimed:
                    delivery.unclaimed[row.id] = unclaimed
                else:
                    delivery.unclaimed.pop(row.id, None)
                if verdict is not Verdict.RUN:
                    self._abandon(session, row, request, verdict, attempts or unclaimed)
                    continue
                delivery.fetched[id(request)] = (row.id, attempts)
                fetched.append(request)
        if len(rows) < self.max_callbacks_per_loop:
            delivery.forget_missing(seen, held)
        if fetched:
            log.info(
                "airflow-heartbeat-fix (%s): fetched %d callback request(s), %s",
                CLAIMED_FIX,
                len(fetched),
                FETCHED,
            )
        return fetched

    def _abandon(self, session: Any, row: Any, request: Any, verdict: Verdict, count: int) -> None:
        how = "died running it" if verdict is Verdict.ABANDON_STARTED else "exited without starting it"
        fix_logger(__name__).error(
            "airflow-heartbeat-fix (%s): %s deleted without running it: %d file processors %s "
            "([heartbeat_fix] callback_max_attempts = %d)",
            CLAIMED_FIX,
            callback_delivery.describe(request),
            count,
            how,
            self._delivery.max_attempts,
        )
        Stats.incr(callback_delivery.ABANDONED)
        session.delete(row)
        self._delivery.unclaimed.pop(row.id, None)

    def _add_callback_to_queue(self, request: Any) -> None:
        super()._add_callback_to_queue(request)
        if any(queued is request for batch in self._callback_to_execute.values() for queued in batch):
            return
        # Stock skipped it (its bundle is gone, or 3.4's language-SDK file): what stock's fetch had done.
        row_id, _ = self._delivery.fetched.pop(id(request))
        model = callback_request_model()
        with create_session() as session:
            session.execute(model.__table__.delete().where(model.__table__.c.id == row_id))

    def _create_process(self, dag_file: Any) -> Any:
        delivery = self._delivery
        batch = self._callback_to_execute.get(dag_file) or []
        if not batch:
            return super()._create_process(dag_file)
        batch = interrupted_first(batch, lambda request: delivery.fetched[id(request)][1])
        self._callback_to_execute[dag_file] = batch
        rows = tuple(delivery.fetched[id(request)][0] for request in batch)
        handover = callback_delivery.Handover(rows, metadata_engine(), os.getpid(), delivery.max_attempts)
        callback_delivery.set_handover(handover)
        try:
            proc = super()._create_process(dag_file)
        except BaseException:
            # Not started (a failed fork): stock popped the batch; the next fetch takes the rows again.
            for request in batch:
                delivery.fetched.pop(id(request), None)
            raise
        finally:
            callback_delivery.set_handover(None)
        for request in batch:
            row_id, attempts = delivery.fetched.pop(id(request))
            delivery.handed[row_id] = attempts
        delivery.in_flight[id(proc)] = (proc, rows)
        return proc

    def _collect_results(self) -> None:
        super()._collect_results()
        requeue = files_to_requeue(self._callback_to_execute, self._processors, self._file_queue)
        if requeue:
            fix_logger(__name__).info(
                "airflow-heartbeat-fix (%s): %d file(s) queued again at once: callback requests wait",
                CLAIMED_FIX,
                len(requeue),
            )
            queue_first(self, requeue)


class FetchCallbacksMixin(ClaimedDeliveryMixin):
    """3.3+: ``fetch_callbacks`` is the manager's documented override point for its source of callbacks."""

    def fetch_callbacks(self) -> list[Any]:
        return self._fetch_without_delete()


class LegacyFetchCallbacksMixin(ClaimedDeliveryMixin):
    """3.0 to 3.2: the loop calls ``_fetch_callbacks`` (``@provide_session``; no session is passed)."""

    def _fetch_callbacks(self, *args: Any, **kwargs: Any) -> list[Any]:
        return self._fetch_without_delete()


#: Seconds between two emissions of the fix gauges (the heartbeat the manager is given is called each loop).
GAUGE_INTERVAL = 5.0


class DagProcessorGaugesMixin(DagFileProcessorManager):
    """
    Announces which fixes this Dag processor carries: at its loop's first heartbeat (the manager sets up
    its metrics backend in ``run()``, after which the loop calls the heartbeat the job runner gave it
    first thing) and about every :data:`GAUGE_INTERVAL` seconds after, as the job heartbeats.
    """

    heartbeat_fixes: tuple[str, ...] = ()

    def emit_fix_gauges(self) -> None:
        emit_fix_gauges(DAG_PROCESSOR_FIXES, self.heartbeat_fixes)

    def run(self) -> Any:
        heartbeat, emitted = self.heartbeat, [-GAUGE_INTERVAL]

        def heartbeat_and_gauges() -> None:
            heartbeat()
            if time.monotonic() - emitted[0] >= GAUGE_INTERVAL:
                emitted[0] = time.monotonic()
                self.emit_fix_gauges()

        self.heartbeat = heartbeat_and_gauges
        return super().run()


def build_manager_class(
    active_fixes: tuple[str, ...], base: type[DagFileProcessorManager] = DagFileProcessorManager
) -> type[DagFileProcessorManager]:
    """The Dag processor's manager class with the mixins of ``active_fixes`` (gauges outermost)."""
    mixins: tuple[type, ...] = ()
    if CLAIMED_FIX in active_fixes:
        mixins = (FetchCallbacksMixin if hasattr(base, "fetch_callbacks") else LegacyFetchCallbacksMixin,)
    return type(
        "HeartbeatFixDagFileProcessorManager",
        (DagProcessorGaugesMixin, *mixins, base),
        {
            "__module__": __name__,
            "heartbeat_fixes": active_fixes,
            # Log under the stock manager's logger name, so [logging] namespace_levels keep applying.
            "_logger_name": getattr(base, "_logger_name", None) or f"{base.__module__}.{base.__name__}",
        },
    )


def file_processor_patches(
    active_fixes: tuple[str, ...], originals: dict[str, Any]
) -> list[tuple[Any, str, Any]]:
    """The file processor module's functions the active fixes replace, as ``(module, name, value)``."""
    processor, patches = file_processor_module(), []
    if {CLAIMED_FIX, ISOLATED_FIX} & set(active_fixes):
        wrapped = callback_delivery.make_execute_callbacks(
            originals["execute_callbacks"], frozenset(active_fixes)
        )
        patches.append((processor, "_execute_callbacks", wrapped))
    if INFLATION_FIX in active_fixes:
        patches.append((processor, "_parse_file", callback_delivery.make_parse_file(originals["parse_file"])))
    return patches
