"""The side-by-side text table on stdout."""

from __future__ import annotations

import dataclasses

from airflow_heartbeat_fix.demo import text_report, topology
from airflow_heartbeat_fix.demo.result import RunResult, SchedulerOutcome, TryRow
from tests.demo._results import CB, converged_result, redelivery_result


def test_render_table_side_by_side() -> None:
    stock = converged_result(
        label="stock",
        fix_enabled=False,
        scheduler=SchedulerOutcome(crashed=True, error="UniqueViolation: duplicate key"),
        converged=False,
        converge_seconds=None,
        reproduced=True,
    )
    stock.dags[CB].tries = [TryRow("stall", 1, "running", "current")]
    stock.scheduler.fixes = {"sink": "disabled"}
    fixed = converged_result()
    fixed.scheduler.fixes = {"sink": "active"}
    table = text_report.render_table([stock, fixed])
    lines = table.splitlines()
    assert lines[0] == "Airflow 3.4.0b2, sqlite, LocalExecutor, 1 scheduler"
    assert "stock ([heartbeat_fix] enabled=False)" in lines[2]
    assert "fixed ([heartbeat_fix] enabled=True)" in lines[2]
    scheduler = next(line for line in lines if line.startswith("scheduler "))
    assert "CRASHED: UniqueViolation" in scheduler and scheduler.rstrip().endswith("alive")
    assert any("failed (archived: retry)" in line and "running (current)" in line for line in lines)
    assert any("retry x1 (expected 1 per try)" in line for line in lines)
    emails = [line for line in lines if line.startswith("    emails")]
    assert emails and all("(expected 1 per try)" in line for line in emails)
    sink = next(line for line in lines if line.startswith("  sink"))
    assert "disabled" in sink and sink.rstrip().endswith("active")
    verdict = next(line for line in lines if line.startswith("verdict"))
    assert "bug reproduced (crash)" in verdict and "OK: converged as expected" in verdict
    assert "stock scheduler error: UniqueViolation: duplicate key" in table


def test_injected_row_only_for_kill_scenarios() -> None:
    hung = RunResult(
        label="fixed", fix_enabled=True, airflow_version="3.4.0b2", database="postgresql", home="h"
    )
    assert "injected" not in text_report.render_table([hung])
    killed = dataclasses.replace(
        hung, scenario=topology.KILL_WORKER, injected=["SIGKILL celery-worker-1 at 20 s"]
    )
    assert "SIGKILL celery-worker-1 at 20 s" in text_report.render_table([killed])


def test_render_table_of_a_recorded_run_keeps_its_indented_rows() -> None:
    """A run the demo recorded (3.3.2, SQLite), read back and drawn: tabulate 0.9 (the lowest dependency
    set) and 0.10 both keep the sub-rows' leading spaces."""
    import json

    from airflow_heartbeat_fix.demo.result import run_from_json
    from tests.demo._results import RECORDED

    runs = [run_from_json(raw) for raw in json.loads(RECORDED.read_text(encoding="utf-8"))["runs"].values()]
    lines = text_report.render_table(runs).splitlines()
    assert lines[0].startswith("Airflow 3.3.2, sqlite")
    assert any(line.startswith("  try 1") for line in lines), lines


def test_redelivery_rows_show_its_dag_and_what_the_schedulers_did_with_the_event() -> None:
    table = text_report.render_table([redelivery_result(fixed=False), redelivery_result()])
    assert CB not in table and "retry_after_heartbeat_timeout" not in table
    assert "redelivered_task" in table
    assert "events set aside" in table and "running try failed by an event" in table
    assert "retry x1 (expected 1 per try)" in table  # stock's false retry callback
