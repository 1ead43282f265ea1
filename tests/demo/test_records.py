"""The demo's fake email backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jinja2

from airflow_heartbeat_fix.demo import logs, records
from tests.demo._results import CB

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def test_email_backend_records_subject_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    ti = {"dag_id": CB, "task_id": "stall", "run_id": "manual__2026-11-30T06:13:39+00:00"}
    subject = jinja2.Template(records.SUBJECT_TEMPLATE).render(ti=ti, try_number=2)
    records.send_email(["alerts@example.com"], subject, "<b>body</b>", conn_id=None, from_email="a@b")
    (line,) = logs.parse_jsonl((tmp_path / records.EMAIL_LOG_NAME).read_text())
    assert line["fields"] == {**ti, "try_number": 2}
    assert logs.count_emails([line], CB) == {2: 1}


def test_email_subject_that_is_not_ours_is_kept_raw() -> None:
    assert records.parse_subject("Airflow alert: <TaskInstance ...>") is None
