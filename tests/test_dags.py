"""The reproduction Dags in ``dags/``: they import cleanly, say what they reproduce, and record callbacks."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from airflow_heartbeat_fix.demo import logs as demo_logs
from airflow_heartbeat_fix.demo import result as demo_result

if TYPE_CHECKING:
    from airflow.dag_processing.dagbag import DagBag

DAGS_DIR = Path(__file__).resolve().parent.parent / "dags"
RETRY_DAG = demo_result.RETRY_DAG_ID
CALLBACK_DAG = demo_result.CALLBACK_DAG_ID


@pytest.fixture(scope="module")
def dagbag() -> DagBag:
    try:  # 3.2+
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # 3.0/3.1
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef,attr-defined,unused-ignore]

    return DagBag(dag_folder=DAGS_DIR)


def test_dags_import_without_errors(dagbag: DagBag) -> None:
    """Also: the package marker ``__init__.py`` (for package data) adds no Dag and no import error."""
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == {RETRY_DAG, CALLBACK_DAG, *demo_result.EVERY_DAG_ID}


def test_dag_processor_killed_fails_every_run_with_one_slow_dag_failure_alert(dagbag: DagBag) -> None:
    """``--scenario kill-dag-processor``: a Dag failure callback (run by the Dag processor), no retry."""
    dag = dagbag.get_dag(demo_result.KILLED_DAG_ID)
    assert dag.on_failure_callback
    assert dag.get_task("incident").retries == 0
    assert dag.max_active_runs >= len(demo_result.KILLED_RUNS)


def test_many_hung_tasks_fails_each_mapped_task_instance_once(dagbag: DagBag) -> None:
    """``--scenario many``: its map length is ``MANY_TASKS`` itself (the Dag imports it), no retry."""
    task = dagbag.get_dag(demo_result.MANY_DAG_ID).get_task("stall")
    assert task.retries == 0
    assert task.on_failure_callback  # one callable, or a list of one, depending on the release


def test_redelivered_task_runs_past_the_redelivery_with_a_retry_and_both_callbacks(dagbag: DagBag) -> None:
    """``--scenario redelivery``: a live task (nothing frozen) with a retry and both callbacks recorded."""
    task = dagbag.get_dag(demo_result.REDELIVERY_DAG_ID).get_task("work")
    assert task.retries == 1
    assert task.on_failure_callback and task.on_retry_callback
    assert demo_result.REDELIVERY_TASK_SECONDS >= 150


@pytest.mark.parametrize("dag_id", [RETRY_DAG, CALLBACK_DAG])
def test_dags_are_tagged_and_stall_with_one_retry(dagbag: DagBag, dag_id: str) -> None:
    dag = dagbag.get_dag(dag_id)
    assert dag is not None
    assert "repro" in dag.tags
    assert dag.task_ids == ["stall"]
    task = dag.get_task("stall")
    assert task.retries == 1
    assert task.retry_delay.total_seconds() <= 5


def test_retry_dag_needs_no_callbacks(dagbag: DagBag) -> None:
    task = dagbag.get_dag(RETRY_DAG).get_task("stall")
    assert not task.on_failure_callback
    assert not task.on_retry_callback


def test_callback_dag_has_callbacks_and_email_alerts(dagbag: DagBag) -> None:
    task = dagbag.get_dag(CALLBACK_DAG).get_task("stall")
    assert len(task.on_failure_callback) == 1
    assert len(task.on_retry_callback) == 1
    assert task.email == ["alerts@example.com"]
    assert task.email_on_failure is True
    assert task.email_on_retry is True


@pytest.mark.parametrize(
    ("filename", "words"),
    [
        ("retry_after_heartbeat_timeout.py", ["UniqueViolation", "task_instance_current_key", "SIGSTOP"]),
        ("duplicate_heartbeat_callbacks.py", ["on_retry_callback", "on_failure_callback", "SIGSTOP"]),
    ],
)
def test_docstring_says_what_it_reproduces(filename: str, words: list[str]) -> None:
    doc = ast.get_docstring(ast.parse((DAGS_DIR / filename).read_text(encoding="utf-8")))
    assert doc is not None
    assert doc.startswith("Reproduce")
    for word in words:
        assert word in doc


def test_callbacks_append_one_json_line_each(
    dagbag: DagBag, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    task = dagbag.get_dag(CALLBACK_DAG).get_task("stall")
    ti = SimpleNamespace(dag_id=CALLBACK_DAG, task_id="stall", run_id="manual__1", map_index=-1, try_number=1)
    context: dict[str, Any] = {"ti": ti}
    task.on_retry_callback[0](context)
    ti.try_number = 2
    task.on_failure_callback[0](context)

    lines = [json.loads(line) for line in (tmp_path / "callback_log.jsonl").read_text().splitlines()]
    assert [(line["try_number"], line["kind"]) for line in lines] == [
        (1, "on_retry_callback"),
        (2, "on_failure_callback"),
    ]
    assert all(line["run_id"] == "manual__1" and line["time"] > 0 for line in lines)
    assert demo_logs.count_callbacks(lines, CALLBACK_DAG) == {
        1: {"on_retry_callback": 1},
        2: {"on_failure_callback": 1},
    }


def test_mapped_callbacks_record_their_map_index(
    dagbag: DagBag, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--scenario many`` counts callbacks per map index, from the same recorder as the other Dags."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    callback = dagbag.get_dag(demo_result.MANY_DAG_ID).get_task("stall").on_failure_callback
    record = callback[0] if isinstance(callback, list) else callback
    for map_index in (0, 1, 1):
        ti = SimpleNamespace(dag_id=demo_result.MANY_DAG_ID, task_id="stall", run_id="r", try_number=1)
        record({"ti": SimpleNamespace(**vars(ti), map_index=map_index)})

    lines = [json.loads(line) for line in (tmp_path / "callback_log.jsonl").read_text().splitlines()]
    assert demo_logs.count_per_map_index(lines, demo_result.MANY_DAG_ID) == {0: 1, 1: 2}
