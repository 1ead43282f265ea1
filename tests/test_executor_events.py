"""The decisions of ``heartbeat_judged_executor_events``: how old a live worker's heartbeat may be, and
whether an executor event's try is the running, heartbeating try it names."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from airflow_heartbeat_fix.executor_events import HandBack, live_threshold, why_not_alive

pytestmark = pytest.mark.mode_independent

NOW = datetime(2026, 1, 1, 12, tzinfo=timezone.utc)
JOB = 7


@pytest.mark.parametrize(
    ("interval", "loop", "timeout", "expected"),
    [
        pytest.param(5, 1, 300, 9, id="defaults: 2 intervals minus a loop"),
        pytest.param(10, 1, 300, 19, id="a longer heartbeat interval"),
        pytest.param(5, 0, 300, 10, id="a loop that never sleeps"),
        pytest.param(30, 1, 40, 40, id="never past the heartbeat timeout"),
        pytest.param(1, 5, 300, 0, id="a loop slower than two intervals: nothing is set aside"),
    ],
)
def test_live_threshold(interval, loop, timeout, expected):
    got = live_threshold(min_heartbeat_interval=interval, loop_seconds=loop, heartbeat_timeout=timeout)
    assert got == expected


def _row(**changes):
    row = {"state": "running", "try_number": 1, "queued_by_job_id": JOB, "last_heartbeat_at": NOW}
    return SimpleNamespace(**{**row, **changes})


@pytest.mark.parametrize(
    ("row", "try_number", "expected"),
    [
        pytest.param(_row(last_heartbeat_at=NOW - timedelta(seconds=4)), 1, None, id="alive"),
        pytest.param(
            _row(last_heartbeat_at=NOW - timedelta(seconds=4)), None, None, id="alive, keyed by row"
        ),
        pytest.param(_row(last_heartbeat_at=NOW - timedelta(seconds=8.9)), 1, None, id="just under"),
        pytest.param(
            _row(last_heartbeat_at=NOW - timedelta(seconds=9)),
            1,
            HandBack.HEARTBEAT_STOPPED,
            id="at threshold",
        ),
        pytest.param(_row(last_heartbeat_at=None), 1, HandBack.HEARTBEAT_STOPPED, id="no heartbeat known"),
        pytest.param(_row(state="success"), 1, HandBack.LEFT_RUNNING, id="finished"),
        pytest.param(_row(state="restarting"), 1, HandBack.LEFT_RUNNING, id="cleared while running"),
        pytest.param(None, 1, HandBack.LEFT_RUNNING, id="row gone"),
        pytest.param(_row(try_number=2), 1, HandBack.LEFT_RUNNING, id="the next try runs"),
        pytest.param(
            _row(queued_by_job_id=8), 1, HandBack.OTHER_SCHEDULER, id="adopted by another scheduler"
        ),
    ],
)
def test_why_not_alive(row, try_number, expected):
    assert why_not_alive(row, job_id=JOB, try_number=try_number, now=NOW, threshold=9) is expected
