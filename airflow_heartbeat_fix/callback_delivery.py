"""
The file processor's side of the Dag processor fixes: each callback request claimed, run through Airflow's
own ``_execute_callbacks`` alone, and deleted (``claimed_callback_delivery``); one request's exception never
reaching the next (``isolated_callback_requests``); a file's callbacks run past a refusing Dag version
inflation check (``callbacks_past_inflation_check``).

The manager names the stored row of each request of a batch in :data:`_handover` right before it forks the
file processor (:mod:`~airflow_heartbeat_fix.dag_processor`); the forked child reads it. No message is added
to the manager's protocol with its file processors (JSON lines up to 3.0.2, msgpack frames from 3.0.3).

The child claims on a connection of its own (:class:`~airflow_heartbeat_fix.callback_claims.Claims`) although
Airflow hides the metadata database from the file processor (``block_orm_access``): the connection is opened
by this module only, never handed to Dag code, and closed with the batch. A claim held by the manager instead
would need a new message each way on both protocols, and a manager that dies would leave an orphaned child
running a request that the restarted manager hands out again; the child's own row lock lives exactly as long
as the process running the callback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from unittest import mock

from airflow_heartbeat_fix._compat import Stats, callback_request_model, file_processor_module
from airflow_heartbeat_fix.callback_claims import ClaimLost, Claims
from airflow_heartbeat_fix.detection import CLAIMED_FIX, INFLATION_FIX, ISOLATED_FIX
from airflow_heartbeat_fix.logs import fix_logger

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import Engine

#: Counters (``Stats.incr``) of what the fixes did that stock does not.
RERUNS = "heartbeat_fix.callback.reruns"
ABANDONED = "heartbeat_fix.callback.abandoned"
FAILED = "heartbeat_fix.callback.failed"
CLAIM_LOST = "heartbeat_fix.callback.claim_lost"
INFLATION_BYPASSED = "heartbeat_fix.callback.inflation_check_bypassed"


@dataclass(frozen=True)
class Handover:
    """What a forked file processor learns from its manager about the batch it is handed."""

    #: The stored row of each request, in the order of the batch.
    rows: tuple[Any, ...]
    engine: Engine
    manager_pid: int
    max_attempts: int


#: Set in the manager right before it forks a file processor (the forked child reads it), else ``None``.
_handover: Handover | None = None


def set_handover(handover: Handover | None) -> None:
    global _handover
    _handover = handover


def describe(request: Any) -> str:
    """A request as a log line names it: its class and dag/task/run/try (or dag/run)."""
    ti = getattr(request, "ti", None)
    if ti is not None:
        return f"{type(request).__name__} for {ti.dag_id}/{ti.task_id}/{ti.run_id}/try {ti.try_number}"
    return f"{type(request).__name__} for {getattr(request, 'dag_id', '?')}/{getattr(request, 'run_id', '?')}"


def past_limit(attempt: int, max_attempts: int) -> bool:
    """Whether attempt ``attempt`` (1 = the first) would exceed ``[heartbeat_fix] callback_max_attempts``."""
    return attempt > max_attempts


def orphaned(handover: Handover) -> bool:
    """Whether the manager that forked this file processor is gone (the child was re-parented)."""
    return os.getppid() != handover.manager_pid


def _run_one(original: Callable[..., Any], dagbag: Any, request: Any, log: Any, *, isolate: bool) -> bool:
    """Airflow's ``_execute_callbacks`` for one request; False if it raised (logged, when isolated)."""
    try:
        original(dagbag, [request], log)
    except Exception:
        if not isolate:
            raise
        fix_logger(__name__).exception(
            "airflow-heartbeat-fix (%s): %s failed; the rest of the batch runs all the same",
            ISOLATED_FIX,
            describe(request),
        )
        Stats.incr(FAILED)
        return False
    return True


def make_execute_callbacks(original: Callable[..., Any], active: frozenset[str]) -> Callable[..., None]:
    """
    ``_execute_callbacks`` for the file processor: one request per call of Airflow's own (so that with
    ``isolated_callback_requests`` one request's exception never reaches the next: apache/airflow#70990,
    in 3.3.2, backported to 3.0.0-3.3.1), claimed and deleted in turn where the manager handed the batch
    over (``claimed_callback_delivery``).
    """
    isolate = ISOLATED_FIX in active

    def _execute_callbacks(dagbag: Any, callback_requests: list[Any], log: Any) -> None:
        handover = _handover
        if CLAIMED_FIX in active and handover is not None and len(handover.rows) == len(callback_requests):
            run_claimed(original, dagbag, callback_requests, log, handover, isolate=isolate)
            return
        # Not handed over by a fixed manager (a batch it did not fetch), or only isolation is active.
        for request in callback_requests:
            _run_one(original, dagbag, request, log, isolate=isolate)

    _execute_callbacks.__wrapped__ = original  # type: ignore[attr-defined]
    return _execute_callbacks


def run_claimed(
    original: Callable[..., Any],
    dagbag: Any,
    requests: list[Any],
    log: Any,
    handover: Handover,
    *,
    isolate: bool,
) -> None:
    """Claim, run and delete each request of the batch in turn (see :mod:`.callback_claims`)."""
    logger = fix_logger(__name__)
    claims = Claims(handover.engine, callback_request_model().__table__)
    claims.open()
    try:
        for position, (request, row_id) in enumerate(zip(requests, handover.rows, strict=True)):
            if orphaned(handover):
                logger.warning(
                    "airflow-heartbeat-fix (%s): the Dag processor that started this file processor is gone; "
                    "%d callback request(s) left stored for the next one",
                    CLAIMED_FIX,
                    len(requests) - position,
                )
                return
            claimed = claims.claim(row_id)
            if claimed is None:
                logger.info(
                    "airflow-heartbeat-fix (%s): %s is done or run by another Dag processor; skipped",
                    CLAIMED_FIX,
                    describe(request),
                )
                continue
            if past_limit(claimed.attempt, handover.max_attempts):
                claims.release(claimed)
                abandon(claims, row_id, request, claimed.attempt - 1, handover.max_attempts)
                continue
            if claimed.attempt > 1:
                logger.warning(
                    "airflow-heartbeat-fix (%s): re-running %s (attempt %d: the file processor running it "
                    "before died)",
                    CLAIMED_FIX,
                    describe(request),
                    claimed.attempt,
                )
                Stats.incr(RERUNS)
            try:
                ran = _run_one(original, dagbag, request, log, isolate=isolate)
            except BaseException:
                # Not isolated here, or an exit or an interrupt: the request stays stored for the next.
                claims.release(claimed)
                raise
            if not ran and orphaned(handover):
                # Its manager died meanwhile: the error may be the broken log channel, not the callback.
                claims.release(claimed)
                continue
            try:
                claims.done(claimed)
            except ClaimLost as lost:
                logger.warning(
                    "airflow-heartbeat-fix (%s): %s ran, but the connection holding it broke before it was "
                    "deleted (%s); it may run again",
                    CLAIMED_FIX,
                    describe(request),
                    lost,
                )
                Stats.incr(CLAIM_LOST)
                return
    finally:
        claims.close()


def abandon(claims: Claims, row_id: Any, request: Any, attempts: int, max_attempts: int) -> None:
    """A request its file processors died in ``max_attempts`` times: deleted unrun, logged, counted."""
    if claims.abandon(row_id):
        fix_logger(__name__).error(
            "airflow-heartbeat-fix (%s): %s deleted without running it: %d file processors died running it "
            "([heartbeat_fix] callback_max_attempts = %d)",
            CLAIMED_FIX,
            describe(request),
            attempts,
            max_attempts,
        )
        Stats.incr(ABANDONED)


def make_parse_file(original: Callable[..., Any]) -> Callable[..., Any]:
    """
    ``_parse_file`` whose Dag version inflation check never refuses a message with callback requests.

    Backports apache/airflow#70987 (3.3.2) to 3.2.0-3.3.1, which return the check's error before they look
    at the callbacks, so the batch is dropped without a log line. The check runs as stock runs it and
    answers at ``warning`` level for that one call (the child is single-threaded). Delete when 3.2.x and
    3.3.1 are no longer supported (detection then says "not needed" everywhere).
    """
    processor = file_processor_module()

    def _parse_file(msg: Any, log: Any) -> Any:
        check = processor.check_dag_file_stability
        if not msg.callback_requests:
            return original(msg, log)

        def not_refusing(path: Any) -> Any:
            result = check(path)
            if result.get_error_format_dict(msg.file, msg.bundle_path):
                fix_logger(__name__).warning(
                    "airflow-heartbeat-fix (%s): the Dag version inflation check refuses %s; its %d callback "
                    "request(s) run all the same",
                    INFLATION_FIX,
                    msg.file,
                    len(msg.callback_requests),
                )
                Stats.incr(INFLATION_BYPASSED)
                result.check_level = type(result.check_level).warning
            return result

        with mock.patch.object(processor, "check_dag_file_stability", not_refusing):
            return original(msg, log)

    _parse_file.__wrapped__ = original  # type: ignore[attr-defined]
    return _parse_file
