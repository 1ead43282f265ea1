"""What the demo reads from its components' logs and the records' JSON lines."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from airflow_heartbeat_fix.demo import logs, result
from tests.demo._results import CB, RETRY, SCHEDULER_LOGS

SQLITE_CRASH_LOG = """\
2026-11-30T06:07:18.253998Z [error    ] Detected a task instance without a heartbeat: <TaskInstance: x>
2026-11-30T06:07:18.279740Z [error    ] Exception when executing SchedulerJob._run_scheduler_loop [airflow]
Traceback (most recent call last):
  File ".../taskinstance.py", line 1741, in prepare_db_for_next_try
    session.execute(insert(TaskInstance.__table__).values(values))
sqlite3.IntegrityError: UNIQUE constraint failed: task_instance.dag_id, task_instance.working_set

The above exception was the direct cause of the following exception:

sqlalchemy.exc.IntegrityError: (sqlite3.IntegrityError) UNIQUE constraint failed: task_instance.dag_id
2026-11-30T06:07:18.290718Z [info     ] Shutting down LocalExecutor; waiting for running tasks to finish.
"""


POSTGRES_CRASH_LOG = """\
2026-11-30T06:13:54.603932Z [error    ] Exception when executing SchedulerJob._run_scheduler_loop [airflow]
Traceback (most recent call last):
psycopg.errors.UniqueViolation: duplicate key value violates unique constraint "task_instance_current_key"
DETAIL:  Key (dag_id, task_id, run_id, region_id, region_index, working_set)=(...) already exists.
"""


def test_parse_jsonl_skips_partial_lines() -> None:
    assert logs.parse_jsonl('{"a": 1}\n{"b": \n[1]\n{"c": 2}') == [{"a": 1}, {"c": 2}]


def test_count_callbacks_and_emails_per_try() -> None:
    callbacks = [
        {"dag_id": CB, "try_number": 1, "kind": "on_retry_callback"},
        {"dag_id": CB, "try_number": 1, "kind": "on_retry_callback"},
        {"dag_id": CB, "try_number": 2, "kind": "on_failure_callback"},
        {"dag_id": RETRY, "try_number": 1, "kind": "on_failure_callback"},
    ]
    assert logs.count_callbacks(callbacks, CB) == {
        1: {"on_retry_callback": 2},
        2: {"on_failure_callback": 1},
    }
    emails = [
        {"fields": {"dag_id": CB, "try_number": 1}},
        {"fields": {"dag_id": CB, "try_number": 2}},
        {"fields": None, "subject": "not ours"},
    ]
    assert logs.count_emails(emails, CB) == {1: 1, 2: 1}


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (SQLITE_CRASH_LOG, "IntegrityError: UNIQUE constraint failed: task_instance.dag_id, task_instance"),
        (POSTGRES_CRASH_LOG, 'UniqueViolation: duplicate key value violates unique constraint "task_inst'),
        ("Exception when executing SchedulerJob._run_scheduler_loop\nValueError: boom\n", "ValueError: boom"),
        ("[info] Detected a task instance without a heartbeat\n[info] Marking task as UP_FOR_RETRY\n", None),
    ],
)
def test_find_scheduler_crash(log: str, expected: str | None) -> None:
    found = logs.find_scheduler_crash(log)
    if expected is None:
        assert found is None
    else:
        assert found is not None and found.startswith(expected)


def test_find_crash_time_reads_the_logged_timestamp() -> None:
    expected = datetime(2026, 11, 30, 6, 7, 18, 279740, tzinfo=timezone.utc).timestamp()
    assert logs.find_crash_time(SQLITE_CRASH_LOG) == expected
    assert logs.find_crash_time("Exception when executing SchedulerJob._run_scheduler_loop\n") is None
    assert logs.find_crash_time("no crash\n") is None


def test_find_fix_summary() -> None:
    log = (
        "2026-11-30T06:41:40Z [info     ] airflow-heartbeat-fix on Airflow 3.4.0b2: session_preserving_sink: "
        "active; converged_heartbeat_purge: not needed (present upstream) [airflow_heartbeat_fix]\n"
    )
    assert logs.find_fix_summary(log) == {
        "session_preserving_sink": "active",
        "converged_heartbeat_purge": "not needed (present upstream)",
    }
    assert logs.find_fix_summary("no such line\n") == {}


def test_find_fix_summary_in_a_coloured_log() -> None:
    """Airflow 3.1.0 writes structlog's console colours into the scheduler's log file."""
    log = (
        "\x1b[2m2026-12-02T05:04:29Z\x1b[0m [\x1b[32m\x1b[1minfo     \x1b[0m] \x1b[1m"
        "airflow-heartbeat-fix on Airflow 3.1.0: session_preserving_sink: active; "
        "typed_executor_event_callbacks: active\x1b[0m "
        "[\x1b[0m\x1b[1m\x1b[34mairflow_heartbeat_fix\x1b[0m]\x1b[0m \x1b[36mloc\x1b[0m=activation.py:175\n"
    )
    assert logs.find_fix_summary(log) == {
        "session_preserving_sink": "active",
        "typed_executor_event_callbacks": "active",
    }


def test_celery_worker_ready() -> None:
    assert logs.celery_worker_ready("[INFO/MainProcess] worker1@hbfix-demo-stock-1 ready.\n")
    assert not logs.celery_worker_ready("[INFO/MainProcess] Connected to redis://127.0.0.1:6389/0\n")


def test_timeline_records_changes_and_marks_from_the_logs() -> None:
    before = {(CB, 1): "running"}
    now = {(CB, 1): "failed", (CB, 2): "up_for_retry", (RETRY, 1): "running"}
    assert result.state_changes(before, now, 16.0) == [
        result.StateChange(16.0, CB, 1, "failed"),
        result.StateChange(16.0, CB, 2, "up_for_retry"),
        result.StateChange(16.0, RETRY, 1, "running"),
    ]
    assert result.state_changes(now, now, 17.0) == []
    callbacks = [{"dag_id": CB, "try_number": 1, "kind": "on_retry_callback", "time": 1017.0}]
    emails = [{"fields": {"dag_id": CB, "try_number": 1}, "time": 1017.5}, {"fields": None, "time": 1}]
    assert logs.marks_from_logs(callbacks, emails, triggered_at=1000.0) == [
        result.Mark(17.0, CB, 1, "on_retry_callback"),
        result.Mark(17.5, CB, 1, result.EMAIL),
    ]


def test_owners_of_a_try_from_the_logs() -> None:
    assert logs.scheduler_owning(SCHEDULER_LOGS, "c-1") == "scheduler-1"
    assert logs.scheduler_owning(SCHEDULER_LOGS, "c-2") == "scheduler-2"
    assert logs.scheduler_owning(SCHEDULER_LOGS, "c-") is None  # a prefix is not the id
    assert logs.scheduler_owning(SCHEDULER_LOGS, "") is None
    assert logs.worker_owning(SCHEDULER_LOGS, "c-1") == "celery-worker-2"
    assert logs.worker_owning(SCHEDULER_LOGS, "") is None


def test_counts_of_executor_events_for_running_tries() -> None:
    fixed = (
        "2026-01-01T00:01:25Z [warning] airflow-heartbeat-fix (heartbeat_judged_executor_events): executor "
        "CeleryExecutor("
        "parallelism=32) reported failed for task instance redelivered_task.work of run manual, try 1, "
        "but the try is running on vm (pid 26273) and heartbeated 1.9 s ago: the event is set aside "
        "until the try leaves running or its heartbeat is 9 s old\n"
    )
    stock = (
        "Executor CeleryExecutor(parallelism=32) reported that the task instance <TaskInstance: "
        "redelivered_task.work manual [running]> finished with state failed, but the task instance's state "
        "attribute is running. Learn more: ...\n"
    )
    assert (logs.count_events_set_aside(fixed), logs.count_running_tries_failed_by_event(fixed)) == (1, 0)
    assert (logs.count_events_set_aside(stock * 2), logs.count_running_tries_failed_by_event(stock * 2)) == (
        0,
        2,
    )
