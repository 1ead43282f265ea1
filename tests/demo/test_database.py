"""The demo's database reads: task instance rows as tries, the demo's mark, and data it did not write."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from airflow_heartbeat_fix.demo import cli, database, result
from airflow_heartbeat_fix.demo.result import TryRow
from tests.demo._results import CB, RETRY

if TYPE_CHECKING:
    from pathlib import Path


def test_tries_from_airflow_3_4_rows_archived_and_current() -> None:
    rows = [
        {"dag_id": CB, "task_id": "stall", "try_number": 1, "state": "failed", "working_set": None,
         "archived_reason": "retry"},
        {"dag_id": CB, "task_id": "stall", "try_number": 2, "state": "up_for_retry", "working_set": True,
         "archived_reason": None},
        {"dag_id": RETRY, "task_id": "stall", "try_number": 1, "state": "running", "working_set": True},
    ]  # fmt: skip
    assert database.tries_from_rows(rows, [], CB) == [
        TryRow("stall", 1, "failed", "archived", "retry"),
        TryRow("stall", 2, "up_for_retry", "current"),
    ]


def test_tries_from_airflow_3_3_rows_history_and_pending_retry() -> None:
    history = [{"dag_id": CB, "task_id": "stall", "try_number": 1, "state": "failed"}]
    waiting = [{"dag_id": CB, "task_id": "stall", "try_number": 1, "state": "up_for_retry"}]
    assert database.tries_from_rows(waiting, history, CB) == [
        TryRow("stall", 1, "failed", "history"),
        TryRow("stall", 2, "up_for_retry", "current"),
    ]
    running = [{"dag_id": CB, "task_id": "stall", "try_number": 2, "state": "running"}]
    assert [t.try_number for t in database.tries_from_rows(running, history, CB)] == [1, 2]


def test_try_zero_is_no_try_yet() -> None:
    rows = [{"dag_id": CB, "task_id": "stall", "try_number": 0, "state": None, "working_set": True}]
    assert database.tries_from_rows(rows, [], CB) == []


def test_foreign_data_ignores_the_demos_own_dags(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "demo.db"
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE dag (dag_id VARCHAR(250))")
        db.executemany("INSERT INTO dag VALUES (?)", [(d,) for d in (*result.DAG_IDS, result.MANY_DAG_ID)])
    url = f"sqlite:///{path}"
    assert database.foreign_data(url, database.database_tables(url)) == []
    assert cli.database_refusal(["dag", database.DEMO_TABLE], url, reset_allowed=False, foreign=[]) is None


def test_demo_database_mark_lets_the_demo_reset_it_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    database.mark_database_as_demo(url)
    database.mark_database_as_demo(url)  # again after the next reset: idempotent
    assert database.database_tables(url) == [database.DEMO_TABLE]


def test_mapped_rows_get_one_task_id_per_map_index() -> None:
    assert database.mapped_task_id({"task_id": "stall", "map_index": 7})["task_id"] == "stall[7]"
    assert database.mapped_task_id({"task_id": "stall", "map_index": -1})["task_id"] == "stall"
    assert database.mapped_task_id({"task_id": "stall", "region_index": 3})["task_id"] == "stall[3]"  # 3.4
    rows = [
        {"dag_id": result.MANY_DAG_ID, "task_id": "stall", "map_index": i, "try_number": 1, "state": "failed"}
        for i in (0, 1)
    ]
    tries = database.tries_from_rows([database.mapped_task_id(r) for r in rows], [], result.MANY_DAG_ID)
    assert tries == [TryRow("stall[0]", 1, "failed", "current"), TryRow("stall[1]", 1, "failed", "current")]
