"""
What the demo reads out of text its Airflow processes wrote: the JSON lines of :mod:`.records` (one per
callback, one per email), and the scheduler's and Celery workers' logs (the crash, the fixes' start line,
who owns a try). Text in, counts and findings out; only :func:`read_jsonl` opens a file.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_heartbeat_fix.demo.result import DAG_IDS, EMAIL, REDELIVERY_DAG_ID, Mark
from airflow_heartbeat_fix.detection import FIXES, HEARTBEAT_EVENTS_FIX, SCHEDULER_LOOP_CRASH, FixState

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path

_FIX_SUMMARY = re.compile(
    r"airflow-heartbeat-fix on Airflow \S+: (.*?)(?: \[airflow_heartbeat_fix\]|$)", re.MULTILINE
)
#: ``fix: state`` pairs of that line (an unsupported fix's reason follows in parentheses).
_STATES = sorted((re.escape(state.value) for state in FixState), key=len, reverse=True)  # longest first
_FIX_STATE = re.compile(rf"\b({'|'.join(FIXES)}): ({'|'.join(_STATES)})")
#: The colours structlog's console renderer writes into a log file on some releases (3.1.0).
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_DB_ERROR = re.compile(r"(UniqueViolation|UNIQUE constraint failed|IntegrityError)[^\n]*")
#: What a fixed scheduler logs when it sets an executor event aside (executor_events.SET_ASIDE_LINE).
_SET_ASIDE = re.compile(
    rf"airflow-heartbeat-fix \({HEARTBEAT_EVENTS_FIX}\): executor .* the event is set aside"
)
#: What every release's executor-event processing logs before it fails a running try on an event.
_RUNNING_TRY_FAILED = re.compile(
    r"finished with state \w+, but the task instance's state attribute is running"
)
#: The Dags whose callbacks and emails are marks on the timeline.
_MARKED_DAG_IDS = (*DAG_IDS, REDELIVERY_DAG_ID)
_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Violation))(?::[^\n]*)?$", re.MULTILINE)


# --- the records' JSON lines ----------------------------------------------------------------------


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines text; partial or broken lines are skipped."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """:func:`parse_jsonl` of a file the components may not have written yet (then empty)."""
    try:
        return parse_jsonl(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return []


def count_callbacks(lines: Iterable[Mapping[str, Any]], dag_id: str) -> dict[int, dict[str, int]]:
    """Callback invocations of ``dag_id`` per try number and kind."""
    counts = Counter(
        (int(line["try_number"]), str(line.get("kind")))
        for line in lines
        if line.get("dag_id") == dag_id and line.get("try_number") is not None
    )
    per_try: dict[int, dict[str, int]] = {}
    for (try_number, kind), count in counts.items():
        per_try.setdefault(try_number, {})[kind] = count
    return dict(sorted(per_try.items()))


def count_per_map_index(lines: Iterable[Mapping[str, Any]], dag_id: str) -> dict[int, int]:
    """Callback invocations of the mapped Dag ``dag_id`` per map index (every try, every kind)."""
    counts = Counter(
        int(line["map_index"])
        for line in lines
        if line.get("dag_id") == dag_id and line.get("map_index") is not None
    )
    return dict(sorted(counts.items()))


def count_emails(lines: Iterable[Mapping[str, Any]], dag_id: str) -> dict[int, int]:
    """Emails (from the demo's fake email backend) about ``dag_id`` per try number."""
    subjects = (line.get("fields") or {} for line in lines)
    counts = Counter(
        int(fields["try_number"])
        for fields in subjects
        if fields.get("dag_id") == dag_id and fields.get("try_number") is not None
    )
    return dict(sorted(counts.items()))


def marks_from_logs(
    callback_lines: Iterable[Mapping[str, Any]], email_lines: Iterable[Mapping[str, Any]], triggered_at: float
) -> list[Mark]:
    """Callbacks and emails of the demo Dags as marks, timed from ``triggered_at`` (epoch seconds)."""
    marks = []
    for line in callback_lines:
        if line.get("dag_id") in _MARKED_DAG_IDS and line.get("try_number") is not None and line.get("time"):
            seconds = float(line["time"]) - triggered_at
            marks.append(Mark(seconds, str(line["dag_id"]), int(line["try_number"]), str(line.get("kind"))))
    for line in email_lines:
        fields = line.get("fields") or {}
        if (
            fields.get("dag_id") in _MARKED_DAG_IDS
            and fields.get("try_number") is not None
            and line.get("time")
        ):
            seconds = float(line["time"]) - triggered_at
            marks.append(Mark(seconds, str(fields["dag_id"]), int(fields["try_number"]), EMAIL))
    return sorted(marks, key=lambda m: (m.seconds, m.dag_id, m.try_number, m.kind))


# --- the components' logs -------------------------------------------------------------------------


def find_scheduler_crash(log_text: str) -> str | None:
    """The error that ended the scheduler loop, or None when the loop did not crash."""
    at = log_text.find(SCHEDULER_LOOP_CRASH)
    if at < 0:
        return None
    tail = log_text[at:]
    if match := _DB_ERROR.search(tail):
        return match.group(0).strip()
    if match := _EXCEPTION_LINE.search(tail):
        return match.group(0).strip()
    return SCHEDULER_LOOP_CRASH


def find_crash_time(log_text: str) -> float | None:
    """When the scheduler logged its loop's crash (epoch seconds), from the line's ISO timestamp."""
    at = log_text.find(SCHEDULER_LOOP_CRASH)
    if at < 0:
        return None
    line = log_text[log_text.rfind("\n", 0, at) + 1 : at]
    stamp = line.split(" ", 1)[0].replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def count_events_set_aside(log_text: str) -> int:
    """How many executor events a fixed scheduler set aside because their try's worker still heartbeats."""
    return len(_SET_ASIDE.findall(log_text))


def count_running_tries_failed_by_event(log_text: str) -> int:
    """How many times the scheduler failed a running try on an executor event (the stock path's error)."""
    return len(_RUNNING_TRY_FAILED.findall(log_text))


def find_fix_summary(log_text: str) -> dict[str, str]:
    """What the scheduler logged at start about each fix (``fix: state; ...``); empty when not loaded."""
    match = _FIX_SUMMARY.search(_ANSI_ESCAPE.sub("", log_text))
    if match is None:
        return {}
    return dict(_FIX_STATE.findall(match.group(1)))


#: The line a fix logs each time it acts (``airflow-heartbeat-fix (converged_heartbeat_purge): ...``).
_FIX_ACTED = re.compile(rf"airflow-heartbeat-fix \(({'|'.join(FIXES)})\): ")


def count_fix_actions(log_texts: Iterable[str]) -> dict[str, int]:
    """How many lines each fix logged when it acted, over the schedulers' logs."""
    counts = Counter(fix for text in log_texts for fix in _FIX_ACTED.findall(_ANSI_ESCAPE.sub("", text)))
    return dict(sorted(counts.items()))


def celery_worker_ready(log_text: str) -> bool:
    """Whether a Celery worker's log says it consumes its queue (Celery logs ``<name>@<host> ready.``)."""
    return re.search(r"@\S+ ready\.", log_text) is not None


def scheduler_owning(logs: Mapping[str, str], celery_task_id: str) -> str | None:
    """
    The scheduler whose executor sent the Celery task ``celery_task_id``: it logged setting that id as
    the try's external executor id (matched on the id, since the task instance's repr differs by release).
    """
    if not celery_task_id:
        return None
    pattern = re.compile(rf"Setting external_executor_id for [^\n]* to {re.escape(celery_task_id)}(?!\S)")
    return next(
        (name for name, text in logs.items() if name.startswith("scheduler") and pattern.search(text)), None
    )


def worker_owning(logs: Mapping[str, str], celery_task_id: str) -> str | None:
    """The Celery worker that received the Celery task ``celery_task_id``."""
    if not celery_task_id:
        return None
    pattern = re.compile(rf"\[{re.escape(celery_task_id)}\] received")
    return next(
        (name for name, text in logs.items() if name.startswith("celery-worker") and pattern.search(text)),
        None,
    )
