"""
The demo's decisions (rows and logs in, results and tables out) and its process cleanup.

The full demo (real scheduler, Dag processor and API server, about two minutes per Airflow version) is
``tests/e2e/test_demo.py``, marked ``e2e``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import psutil
import pytest

from airflow_heartbeat_fix import demo
from airflow_heartbeat_fix.demo import html_report, processes, records, report, run, topology
from airflow_heartbeat_fix.demo.report import DagOutcome, RunResult, SchedulerOutcome, TryRow
from airflow_heartbeat_fix.detection import PURGE_FIX, SINK_FIX, FixState

CB = report.CALLBACK_DAG_ID
RETRY = report.RETRY_DAG_ID

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


# --- rows -----------------------------------------------------------------------------------------


def test_tries_from_airflow_3_4_rows_archived_and_current() -> None:
    rows = [
        {"dag_id": CB, "task_id": "stall", "try_number": 1, "state": "failed", "working_set": None,
         "archived_reason": "retry"},
        {"dag_id": CB, "task_id": "stall", "try_number": 2, "state": "up_for_retry", "working_set": True,
         "archived_reason": None},
        {"dag_id": RETRY, "task_id": "stall", "try_number": 1, "state": "running", "working_set": True},
    ]  # fmt: skip
    assert report.tries_from_rows(rows, [], CB) == [
        TryRow("stall", 1, "failed", "archived", "retry"),
        TryRow("stall", 2, "up_for_retry", "current"),
    ]


def test_tries_from_airflow_3_3_rows_history_and_pending_retry() -> None:
    history = [{"dag_id": CB, "task_id": "stall", "try_number": 1, "state": "failed"}]
    waiting = [{"dag_id": CB, "task_id": "stall", "try_number": 1, "state": "up_for_retry"}]
    assert report.tries_from_rows(waiting, history, CB) == [
        TryRow("stall", 1, "failed", "history"),
        TryRow("stall", 2, "up_for_retry", "current"),
    ]
    running = [{"dag_id": CB, "task_id": "stall", "try_number": 2, "state": "running"}]
    assert [t.try_number for t in report.tries_from_rows(running, history, CB)] == [1, 2]


def test_try_zero_is_no_try_yet() -> None:
    rows = [{"dag_id": CB, "task_id": "stall", "try_number": 0, "state": None, "working_set": True}]
    assert report.tries_from_rows(rows, [], CB) == []


def test_parse_jsonl_skips_partial_lines() -> None:
    assert report.parse_jsonl('{"a": 1}\n{"b": \n[1]\n{"c": 2}') == [{"a": 1}, {"c": 2}]


def test_count_callbacks_and_emails_per_try() -> None:
    callbacks = [
        {"dag_id": CB, "try_number": 1, "kind": "on_retry_callback"},
        {"dag_id": CB, "try_number": 1, "kind": "on_retry_callback"},
        {"dag_id": CB, "try_number": 2, "kind": "on_failure_callback"},
        {"dag_id": RETRY, "try_number": 1, "kind": "on_failure_callback"},
    ]
    assert report.count_callbacks(callbacks, CB) == {
        1: {"on_retry_callback": 2},
        2: {"on_failure_callback": 1},
    }
    emails = [
        {"fields": {"dag_id": CB, "try_number": 1}},
        {"fields": {"dag_id": CB, "try_number": 2}},
        {"fields": None, "subject": "not ours"},
    ]
    assert report.count_emails(emails, CB) == {1: 1, 2: 1}


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
    found = report.find_scheduler_crash(log)
    if expected is None:
        assert found is None
    else:
        assert found is not None and found.startswith(expected)


def test_find_crash_time_reads_the_logged_timestamp() -> None:
    expected = datetime(2026, 11, 30, 6, 7, 18, 279740, tzinfo=timezone.utc).timestamp()
    assert report.find_crash_time(SQLITE_CRASH_LOG) == expected
    assert report.find_crash_time("Exception when executing SchedulerJob._run_scheduler_loop\n") is None
    assert report.find_crash_time("no crash\n") is None


def test_find_fix_summary() -> None:
    log = (
        "2026-11-30T06:41:40Z [info     ] airflow-heartbeat-fix on Airflow 3.4.0b2: session_preserving_sink: "
        "active; converged_heartbeat_purge: not needed (present upstream) [airflow_heartbeat_fix]\n"
    )
    assert report.find_fix_summary(log) == {
        "session_preserving_sink": "active",
        "converged_heartbeat_purge": "not needed (present upstream)",
    }
    assert report.find_fix_summary("no such line\n") == {}


def test_find_fix_summary_in_a_coloured_log() -> None:
    """Airflow 3.1.0 writes structlog's console colours into the scheduler's log file."""
    log = (
        "\x1b[2m2026-12-02T05:04:29Z\x1b[0m [\x1b[32m\x1b[1minfo     \x1b[0m] \x1b[1m"
        "airflow-heartbeat-fix on Airflow 3.1.0: session_preserving_sink: active; "
        "typed_executor_event_callbacks: active\x1b[0m "
        "[\x1b[0m\x1b[1m\x1b[34mairflow_heartbeat_fix\x1b[0m]\x1b[0m \x1b[36mloc\x1b[0m=activation.py:175\n"
    )
    assert report.find_fix_summary(log) == {
        "session_preserving_sink": "active",
        "typed_executor_event_callbacks": "active",
    }


ACTIVE, NOT_NEEDED = FixState.ACTIVE.value, FixState.NOT_NEEDED.value
UNSUPPORTED = FixState.UNSUPPORTED.value


@pytest.mark.parametrize(
    ("needed", "bug"),
    [
        pytest.param({SINK_FIX: ACTIVE, PURGE_FIX: NOT_NEEDED}, report.CRASH, id="converged-purge-old-sink"),
        pytest.param({SINK_FIX: ACTIVE, PURGE_FIX: ACTIVE}, report.DUPLICATES, id="unconverged-purge"),
        pytest.param({SINK_FIX: NOT_NEEDED, PURGE_FIX: NOT_NEEDED}, None, id="both-upstream"),
        pytest.param({SINK_FIX: UNSUPPORTED, PURGE_FIX: UNSUPPORTED}, None, id="unrecognised"),
        pytest.param({}, None, id="not-probed"),
    ],
)
def test_expected_stock_bug_follows_detection(needed: dict[str, str], bug: str | None) -> None:
    assert report.expected_stock_bug(needed) == bug


def test_features_probe_reads_this_airflow() -> None:
    """The demo's only source for "which bug": the package's detection on the installed Airflow."""
    from airflow_heartbeat_fix import activation, detection
    from airflow_heartbeat_fix.demo import features

    found = features.read()
    decided = detection.decide(activation.facts(), enabled=True)
    assert found["needed_fixes"] == {fix: d.state.value for fix, d in decided.items()}
    assert isinstance(found["emails_via_backend"], bool)


# --- verdicts -------------------------------------------------------------------------------------


CRASH_NEEDS = {SINK_FIX: ACTIVE, PURGE_FIX: NOT_NEEDED}
DUPLICATES_NEEDS = {SINK_FIX: ACTIVE, PURGE_FIX: ACTIVE}


def _converged(version: str = "3.4.0b2", **changes: object) -> RunResult:
    tries = [TryRow("stall", 1, "failed", "archived", "retry"), TryRow("stall", 2, "failed", "current")]
    result = RunResult(
        label="fixed",
        fix_enabled=True,
        airflow_version=version,
        database="sqlite",
        home="/demo/fixed",
        dags={
            RETRY: DagOutcome(RETRY, "failed", list(tries)),
            CB: DagOutcome(
                CB,
                "failed",
                list(tries),
                callbacks={1: {"on_retry_callback": 1}, 2: {"on_failure_callback": 1}},
                emails={1: 1, 2: 1},
            ),
        },
        converged=True,
        converge_seconds=27.0,
        elapsed_seconds=70.0,
        stop_reason="Dag runs finished, callbacks settled",
        needed_fixes=dict(CRASH_NEEDS),
    )
    for name, value in changes.items():
        setattr(result, name, value)
    return result


def test_fixed_run_that_converged_has_no_problems() -> None:
    assert report.fixed_problems(_converged()) == []


def test_fixed_problems_duplicates_crash_missing_retry_and_leftovers() -> None:
    result = _converged(
        scheduler=SchedulerOutcome(alive=False, crashed=True, error="UniqueViolation: ..."),
        converged=False,
        stop_reason="scheduler crashed",
        leftover_pids=[123],
    )
    result.dags[CB].callbacks[1]["on_retry_callback"] = 2
    result.dags[RETRY].tries = [TryRow("stall", 1, "running", "current")]
    problems = "\n".join(report.fixed_problems(result))
    assert "scheduler did not survive: UniqueViolation" in problems
    assert f"{CB}: duplicate callbacks/emails for try 1" in problems
    assert f"{CB}: try 1 did not get exactly one on_retry_callback" in problems
    assert f"{RETRY}: try 1 is running, expected failed" in problems
    assert f"{RETRY}: try 2 was not created" in problems
    assert "did not converge: scheduler crashed" in problems
    assert "processes left running: [123]" in problems


def test_fixed_problems_email_only_counted_where_the_backend_is_used() -> None:
    result = _converged(version="3.2.2", emails_via_backend=False)
    result.dags[CB].emails = {}
    assert report.fixed_problems(result) == []
    result.emails_via_backend = True
    assert report.fixed_problems(result) == [f"{CB}: try 1 did not get exactly one email"]


def test_callbacks_complete_waits_for_each_failed_try() -> None:
    result = _converged()
    assert report.callbacks_complete(result.dags, emails_via_backend=True)
    del result.dags[CB].emails[2]
    assert not report.callbacks_complete(result.dags, emails_via_backend=True)
    assert report.callbacks_complete(result.dags, emails_via_backend=False)  # no emails counted there
    del result.dags[CB].callbacks[2]
    assert not report.callbacks_complete(result.dags, emails_via_backend=False)
    result.dags[CB].tries[1] = TryRow("stall", 2, "running", "current")
    assert report.callbacks_complete(result.dags, emails_via_backend=False)


def test_stock_reproduced_crash_and_duplicates() -> None:
    crashed = _converged(fix_enabled=False, scheduler=SchedulerOutcome(alive=False, crashed=True))
    assert report.stock_reproduced(crashed) is True
    assert report.stock_reproduced(_converged(fix_enabled=False)) is False
    duplicated = _converged(version="3.3.2", fix_enabled=False, needed_fixes=DUPLICATES_NEEDS)
    assert report.stock_reproduced(duplicated) is False
    duplicated.dags[CB].callbacks[2]["on_failure_callback"] = 2
    assert report.stock_reproduced(duplicated) is True
    upstream = {SINK_FIX: NOT_NEEDED, PURGE_FIX: NOT_NEEDED}
    assert report.stock_reproduced(_converged(fix_enabled=False, needed_fixes=upstream)) is None


def test_render_table_side_by_side() -> None:
    stock = _converged(
        label="stock",
        fix_enabled=False,
        scheduler=SchedulerOutcome(alive=False, crashed=True, error="UniqueViolation: duplicate key"),
        converged=False,
        converge_seconds=None,
        reproduced=True,
    )
    stock.dags[CB].tries = [TryRow("stall", 1, "running", "current")]
    stock.scheduler.fixes = {"sink": "disabled"}
    fixed = _converged()
    fixed.scheduler.fixes = {"sink": "active"}
    table = report.render_table([stock, fixed])
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


def test_progress_line_and_phase() -> None:
    dags = {CB: DagOutcome(CB, "running", [TryRow("stall", 1, "running", "current")])}
    assert run.run_phase(dags) == "task frozen; waiting for heartbeat timeout"
    assert report.progress_line(dags) == (f"{RETRY}: no run yet; {CB}: try 1 running; callbacks 0, emails 0")
    assert run.run_phase({}) == "waiting for Dag runs"


# --- demo glue decisions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"crashed_for": 5.0}, "scheduler crashed"),
        ({"crashed_for": 1.0}, None),
        ({"exited": True}, "scheduler exited"),
        ({"terminal_for": 8.0, "quiet_for": 4.0}, "Dag runs finished, callbacks settled"),
        ({"terminal_for": 8.0, "quiet_for": 1.0}, None),
        ({"terminal_for": 2.0, "quiet_for": 2.0}, None),
        ({"terminal_for": 8.0, "quiet_for": 4.0, "callbacks_complete": False}, None),
        (
            {"terminal_for": 32.0, "quiet_for": 4.0, "callbacks_complete": False},
            "Dag runs finished, callbacks missing",
        ),
        ({"since_trigger": 120.0}, "timed out after 120 s"),
        ({}, None),
    ],
)
def test_should_stop(kwargs: dict[str, object], reason: str | None) -> None:
    args: dict[str, object] = {
        "since_trigger": 30.0,
        "crashed_for": None,
        "exited": False,
        "terminal_for": None,
        "quiet_for": 0.0,
        "callbacks_complete": True,
        "timeout": 120.0,
        "settle": 8.0,
        **kwargs,
    }
    assert run.should_stop(**args) == reason  # type: ignore[arg-type]


def test_airflow_env_is_isolated_and_sets_the_switch(tmp_path: Path) -> None:
    base = {"PATH": "/bin", "AIRFLOW_HOME": "/elsewhere", "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor"}
    env = run.airflow_env(
        base,
        home=tmp_path,
        database_url="sqlite:///x.db",
        api_port=8765,
        fix_enabled=False,
        heartbeat_timeout=10,
        detection_interval=2,
        jwt_secret="s",
    )
    assert env["PATH"] == "/bin"
    assert env["AIRFLOW_HOME"] == str(tmp_path)
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__HEARTBEAT_FIX__ENABLED"] == "False"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8765/execution/"
    assert env["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"] == "10"
    assert env["AIRFLOW__EMAIL__EMAIL_BACKEND"] == "airflow_heartbeat_fix.demo.records.send_email"
    assert env["TMPDIR"] == str(tmp_path / "tmp")


def test_bytecode_env_caches_in_the_home_only_when_needed(tmp_path: Path) -> None:
    env = {"PATH": "/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    assert run.bytecode_env(env, airflow_compiled=True, cache_dir=tmp_path) == env
    assert run.bytecode_env({"PATH": "/bin"}, airflow_compiled=False, cache_dir=tmp_path) == {"PATH": "/bin"}
    assert run.bytecode_env(env, airflow_compiled=False, cache_dir=tmp_path) == {
        "PATH": "/bin",
        "PYTHONPYCACHEPREFIX": str(tmp_path),
    }


def test_default_home_and_db_label(tmp_path: Path) -> None:
    assert topology.db_label(None) == "sqlite"
    assert topology.db_label("postgresql+psycopg://u:p@h/db") == "postgresql"
    assert run.default_home(tmp_path, "3.4.0b2", None) == tmp_path / "demo" / "3.4.0b2-sqlite"
    pg = "postgresql://h/db"
    assert (
        run.default_home(tmp_path, "3.3.2", pg, topology.CELERY)
        == tmp_path / "demo" / "3.3.2-postgresql-celery"
    )


PG = "postgresql+psycopg://u:p@h/db"
CELERY = topology.Topology(executor=topology.CELERY, schedulers=2, broker_url="redis://127.0.0.1:6389/0")


@pytest.mark.parametrize(
    ("shape", "database", "refusal"),
    [
        (topology.Topology(), None, None),
        (CELERY, PG, None),
        (topology.Topology(schedulers=2), PG, None),
        (CELERY, None, "Airflow's CeleryExecutor cannot use SQLite"),
        (topology.Topology(schedulers=2), None, "SQLite allows only one scheduler"),
        (topology.Topology(executor=topology.CELERY), PG, "needs --broker-url"),
        (topology.Topology(schedulers=0), PG, "--schedulers takes 1 or more"),
    ],
)
def test_topology_refusal(shape: topology.Topology, database: str | None, refusal: str | None) -> None:
    found = topology.topology_refusal(shape, database)
    assert found == refusal if refusal is None else refusal in (found or "")


def test_executor_env_celery_uses_the_runs_queue_and_database_for_results() -> None:
    assert topology.executor_env(topology.Topology(), database_url=PG, queue="q") == {
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor"
    }
    env = topology.executor_env(CELERY, database_url=PG, queue="hbfix-demo-stock-1")
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://127.0.0.1:6389/0"
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == f"db+{PG}"
    assert env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"] == "hbfix-demo-stock-1"


def test_component_commands_per_topology(tmp_path: Path) -> None:
    local = topology.component_commands(topology.Topology(), "airflow", port=1, home=tmp_path, queue="q")
    assert [name for name, _ in local] == ["api-server", "dag-processor", "scheduler"]
    celery = topology.component_commands(CELERY, "airflow", port=1, home=tmp_path, queue="q")
    names = [name for name, _ in celery]
    assert names == [
        "api-server",
        "dag-processor",
        "scheduler-1",
        "scheduler-2",
        "celery-worker-1",
        "celery-worker-2",
    ]
    assert [n for n in names if topology.is_scheduler(n)] == ["scheduler-1", "scheduler-2"]
    workers = [argv for name, argv in celery if name.startswith("celery-worker")]
    hostnames = {argv[argv.index("--celery-hostname") + 1] for argv in workers}
    pid_files = {argv[argv.index("--pid") + 1] for argv in workers}
    assert len(hostnames) == len(pid_files) == 2
    assert all(argv[argv.index("--queues") + 1] == "q" and "--skip-serve-logs" in argv for argv in workers)
    assert CELERY.label == "CeleryExecutor, 2 schedulers, 2 Celery workers"
    assert topology.Topology().label == "LocalExecutor, 1 scheduler"


def test_celery_worker_ready() -> None:
    assert report.celery_worker_ready("[INFO/MainProcess] worker1@hbfix-demo-stock-1 ready.\n")
    assert not report.celery_worker_ready("[INFO/MainProcess] Connected to redis://127.0.0.1:6389/0\n")


def test_dag_sources_default_to_the_installed_package_data() -> None:
    origin, sources = run.find_dag_sources(None)
    assert origin.endswith("dags")
    assert set(sources) == {f"{d}.py" for d in report.DAG_IDS}
    repo_dags = Path(__file__).resolve().parent.parent / "dags"
    assert sources == {name: (repo_dags / name).read_text(encoding="utf-8") for name in sources}


def test_dag_sources_from_a_directory_missing_a_dag(tmp_path: Path) -> None:
    (tmp_path / f"{RETRY}.py").write_text("# nothing\n")
    with pytest.raises(run.DemoError, match=f"lacks {CB}.py"):
        run.find_dag_sources(tmp_path)


def test_setup_failure_exits_3_and_stops_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "airflow"
    fake.write_text("#!/bin/sh\necho migrate failed on purpose\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(demo, "airflow_executable", lambda: fake)
    monkeypatch.setattr(demo, "probe_features", lambda config: {})
    home = tmp_path / "home"
    assert demo.main(["--home", str(home), "--runs", "stock"]) == demo.EXIT_ENVIRONMENT
    err = capsys.readouterr().err
    assert "airflow db migrate failed" in err
    assert "migrate failed on purpose" in (home / "stock" / "logs" / "db-migrate.log").read_text()
    assert list((home / "template").iterdir()) == []  # no half-migrated template is kept


def test_prepare_home_writes_dags_and_subject_template(tmp_path: Path) -> None:
    home = tmp_path / "stock"
    (home / "old").mkdir(parents=True)
    run.prepare_home(home, {"a.py": "x = 1\n"})
    assert not (home / "old").exists()
    assert (home / "dags" / "a.py").read_text() == "x = 1\n"
    assert (home / "logs").is_dir() and (home / "tmp").is_dir()
    assert (home / "email_subject.j2").read_text() == records.SUBJECT_TEMPLATE


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runs", "stock,broken"], "--runs takes"),
        (["--reset-database"], "--reset-database needs --database"),
        (["--dags", "/nonexistent"], "--dags /nonexistent lacks"),
        (["--executor", "celery", "--broker-url", "redis://h/0"], "CeleryExecutor cannot use SQLite"),
        (["--schedulers", "2"], "SQLite allows only one scheduler"),
        (["--broker-url", "redis://h/0"], "--broker-url is for --executor celery"),
    ],
)
def test_bad_arguments_exit_2_before_starting_anything(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(argv) == demo.EXIT_USAGE
    assert message in capsys.readouterr().err


# --- fake email backend ---------------------------------------------------------------------------


def test_email_backend_records_subject_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    ti = {"dag_id": CB, "task_id": "stall", "run_id": "manual__2026-11-30T06:13:39+00:00"}
    subject = jinja2.Template(records.SUBJECT_TEMPLATE).render(ti=ti, try_number=2)
    records.send_email(["alerts@example.com"], subject, "<b>body</b>", conn_id=None, from_email="a@b")
    (line,) = report.parse_jsonl((tmp_path / records.EMAIL_LOG_NAME).read_text())
    assert line["fields"] == {**ti, "try_number": 2}
    assert report.count_emails([line], CB) == {2: 1}


def test_email_subject_that_is_not_ours_is_kept_raw() -> None:
    assert records.parse_subject("Airflow alert: <TaskInstance ...>") is None


# --- processes ------------------------------------------------------------------------------------

FREEZER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    # Like a task: a child in its own session that stops its parent (the "supervisor").
    task = "import os, signal, time; os.kill(os.getppid(), signal.SIGSTOP); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", task], start_new_session=True)
    time.sleep(600)
    """
)


def test_stop_all_ends_frozen_supervisors_and_their_children(tmp_path: Path) -> None:
    procs = processes.Processes(marker=f"test-{os.getpid()}-{time.time()}")
    component = procs.start(
        "freezer", [sys.executable, "-c", FREEZER], dict(os.environ), tmp_path / "freezer.log", tmp_path
    )
    parent = psutil.Process(component.popen.pid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and parent.status() != psutil.STATUS_STOPPED:
        time.sleep(0.1)
    assert parent.status() == psutil.STATUS_STOPPED
    procs.track()
    (child,) = parent.children()
    assert child.environ()[processes.MARKER_ENV] == procs.marker

    procs.stop_all(grace=1.0)

    assert procs.leftovers() == []
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert component.exit_code() is not None


def test_run_returns_exit_codes_and_logs(tmp_path: Path) -> None:
    procs = processes.Processes(marker=f"test-run-{uuid.uuid4()}")
    log = tmp_path / "run.log"
    argvs = [[sys.executable, "-c", "print('hi')"], [sys.executable, "-c", "raise SystemExit(3)"]]
    assert procs.run(argvs, dict(os.environ), log, tmp_path, timeout=60) == [0, 3]
    assert "hi" in log.read_text()


def test_run_kills_a_command_that_times_out(tmp_path: Path) -> None:
    procs = processes.Processes(marker=f"test-timeout-{uuid.uuid4()}")
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    started = time.monotonic()
    codes = procs.run([argv], dict(os.environ), tmp_path / "t.log", tmp_path, timeout=0.5)
    assert codes == [-signal.SIGKILL]
    assert time.monotonic() - started < 10
    assert procs.leftovers() == []


def test_to_json_round_trips(tmp_path: Path) -> None:
    config = run.DemoConfig(
        home=tmp_path,
        database=None,
        dags_origin="dags",
        dag_sources={},
        airflow_bin=Path("airflow"),
        airflow_version="3.4.0b2",
        heartbeat_timeout=10,
        detection_interval=2,
        timeout=120,
        settle=8,
        runs=("fixed",),
        json_path=None,
    )
    data = json.loads(json.dumps(demo.to_json(config, [_converged()], ok=True)))
    assert report.result_from_json(data["runs"]["fixed"]) == _converged()
    fixed = data["runs"]["fixed"]
    assert data["ok"] is True and data["database"] == "sqlite"
    assert fixed["dags"][CB]["callbacks"] == {"1": {"on_retry_callback": 1}, "2": {"on_failure_callback": 1}}
    assert fixed["dags"][CB]["tries"][0]["archived_reason"] == "retry"


# --- refusing before starting anything ------------------------------------------------------------


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a check let the demo through, fail at once instead of starting Airflow for minutes."""

    def refuse(config: run.DemoConfig) -> dict[str, object]:
        raise AssertionError("the demo got past its checks and was about to start Airflow")

    monkeypatch.setattr(demo, "probe_features", refuse)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    return lines[0]


def test_demo_refuses_a_database_with_tables_it_did_not_create(
    tmp_path: Path, nothing_starts: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The suite's own metadata database (migrated at session start) must come out of it untouched."""
    from airflow.configuration import conf

    url = conf.get("database", "sql_alchemy_conn")
    before = run.database_tables(url)
    assert "alembic_version" in before

    code = demo.main(["--home", str(tmp_path / "home"), "--database", url])

    line = _one_line(capsys)
    assert code == demo.EXIT_USAGE
    assert f"already has {len(before)} tables" in line
    assert "airflow db reset" in line and "--reset-database" in line
    assert run.database_tables(url) == before


def test_reset_database_says_what_it_will_drop_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow.configuration import conf

    class Started(Exception):
        pass

    def started(config: run.DemoConfig) -> dict[str, object]:
        raise Started

    monkeypatch.setattr(demo, "probe_features", started)
    url = conf.get("database", "sql_alchemy_conn")
    tables = run.database_tables(url)

    with pytest.raises(Started):
        demo.main(["--home", str(tmp_path / "home"), "--database", url, "--reset-database"])

    assert capsys.readouterr().err.splitlines()[0] == (
        "demo: --reset-database: airflow db reset drops the Airflow tables of "
        f"{run.display_url(url)} ({len(tables)} tables)"
    )
    assert run.database_tables(url) == tables


@pytest.mark.parametrize(
    ("database", "code", "message"),
    [
        pytest.param("not a url", demo.EXIT_USAGE, "--database 'not a url': Could not parse", id="not-a-url"),
        pytest.param("nosuch://h/x", demo.EXIT_USAGE, "--database 'nosuch://h/x': Can't load", id="dialect"),
        pytest.param("sqlite:////nonexistent/x.db", demo.EXIT_ENVIRONMENT,
                     "cannot connect to sqlite:////nonexistent/x.db: (sqlite3.OperationalError) unable",
                     id="unreachable"),
    ],
)  # fmt: skip
def test_unusable_database_url_is_one_line(
    database: str,
    code: int,
    message: str,
    tmp_path: Path,
    nothing_starts: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert demo.main(["--home", str(tmp_path / "home"), "--database", database]) == code
    assert _one_line(capsys).startswith(f"demo: {message}")


def test_database_refusal_allows_empty_own_or_explicitly_reset_databases() -> None:
    url = "postgresql://h/db"
    assert run.database_refusal([], url, reset_allowed=False) is None
    assert run.database_refusal(["dag", run.DEMO_TABLE], url, reset_allowed=False) is None
    assert run.database_refusal(["dag"], url, reset_allowed=True) is None
    refusal = run.database_refusal(
        [f"t{i}" for i in range(7)], "postgresql://u:secret@h/db", reset_allowed=False
    )
    assert refusal is not None and "7 tables (t0, t1, t2, t3, t4, ...)" in refusal
    assert "secret" not in refusal and refusal.startswith("postgresql://u:***@h/db already has")


def test_demo_refuses_its_own_database_once_it_holds_someone_elses_data(
    tmp_path: Path, nothing_starts: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database the demo once marked, then used for real work: the demo must not reset it silently."""
    import sqlite3

    path = tmp_path / "was-demo.db"
    url = f"sqlite:///{path}"
    run.mark_database_as_demo(url)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE dag (dag_id VARCHAR(250))")
        db.execute("CREATE TABLE variable (key VARCHAR(250))")
        db.executemany("INSERT INTO dag VALUES (?)", [(report.CALLBACK_DAG_ID,), ("payroll",)])
        db.execute("INSERT INTO variable VALUES ('api_key')")
    assert run.foreign_data(url, run.database_tables(url)) == ["Dags payroll", "1 variables"]

    code = demo.main(["--home", str(tmp_path / "home"), "--database", url])

    line = _one_line(capsys)
    assert code == demo.EXIT_USAGE
    assert "was a demo database but now holds data the demo did not write (Dags payroll; 1 variables)" in line
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT key FROM variable").fetchall() == [("api_key",)]


def test_foreign_data_ignores_the_demos_own_dags(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "demo.db"
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE dag (dag_id VARCHAR(250))")
        db.executemany("INSERT INTO dag VALUES (?)", [(d,) for d in (*report.DAG_IDS, report.MANY_DAG_ID)])
    url = f"sqlite:///{path}"
    assert run.foreign_data(url, run.database_tables(url)) == []
    assert run.database_refusal(["dag", run.DEMO_TABLE], url, reset_allowed=False, foreign=[]) is None


def test_demo_database_mark_lets_the_demo_reset_it_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    run.mark_database_as_demo(url)
    run.mark_database_as_demo(url)  # again after the next reset: idempotent
    assert run.database_tables(url) == [run.DEMO_TABLE]


def test_second_demo_in_the_same_home_is_refused(
    tmp_path: Path, nothing_starts: None, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    holder = textwrap.dedent(
        f"""
        import fcntl, sys, time
        lock = open({str(home / demo.LOCK_NAME)!r}, "a+")
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("4242\\n"); lock.flush()
        print("locked", flush=True)
        time.sleep(60)
        """
    )
    other = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "locked"
        code = demo.main(["--home", str(home)])
    finally:
        other.kill()
        other.wait()
    line = _one_line(capsys)
    assert code == demo.EXIT_USAGE
    assert line == f"demo: another demo is running in {home} (pid 4242); wait for it or pass another --home"


def test_home_lock_is_released_when_the_demo_ends(tmp_path: Path) -> None:
    with (
        demo.home_lock(tmp_path),
        pytest.raises(run.UsageError, match="another demo is running"),
        demo.home_lock(tmp_path),
    ):
        pass
    with demo.home_lock(tmp_path):
        pass


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--home", "{file}/h"], "cannot use --home {file}/h: Not a dir", id="home-in-file"),
        pytest.param(["--home", "{foreign}"], "--home {foreign} holds files", id="foreign-home"),
        pytest.param(["--json", "{file}/o.json"], "cannot write --json {file}/o.json", id="json-in-file"),
        pytest.param(["--json", "{tmp}"], "--json {tmp} is a directory", id="json-is-dir"),
        pytest.param(["--html", "{file}/r.html"], "cannot write --html {file}/r.html", id="html-in-file"),
    ],
)  # fmt: skip
def test_unusable_paths_exit_2_with_one_line(
    argv: list[str], message: str, tmp_path: Path, nothing_starts: None, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("not a directory\n")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine\n")
    names = {"file": tmp_path / "file", "foreign": tmp_path / "foreign", "tmp": tmp_path}
    argv = [a.format(**names) for a in argv]
    if "--home" not in argv:
        argv += ["--home", str(tmp_path / "home")]

    code = demo.main(argv)

    line = _one_line(capsys)
    assert code == demo.EXIT_USAGE
    assert line.startswith("demo: " + message.format(**names)), line
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "mine\n"


def test_demo_script_help_builds_nothing_and_names_airflow(tmp_path: Path) -> None:
    """``bash scripts/demo.sh --help`` in a fresh clone: the help at once, no environment built first."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "demo.sh"
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    (clone / "scripts" / "demo.sh").write_text(script.read_text())

    result = subprocess.run(
        ["bash", str(clone / "scripts" / "demo.sh"), "--help"], capture_output=True, text=True, timeout=20
    )

    assert result.returncode == 0, result.stderr
    assert "--airflow V" in result.stdout
    assert list(clone.iterdir()) == [clone / "scripts"]  # no .venvs: nothing was installed


def test_help_lists_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        demo.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for code, text in demo.EXIT_CODES.items():
        assert f"  {code:<4}{text[:20]}" in out


# --- the HTML report ------------------------------------------------------------------------------


def _recorded_results() -> list[RunResult]:
    """A stock 3.4.0b2 run that crashed and a fixed one that converged, as the demo records them."""
    stock = _converged(
        label="stock",
        fix_enabled=False,
        scheduler=SchedulerOutcome(
            alive=False, crashed=True, error="IntegrityError: UNIQUE constraint failed"
        ),
        converged=False,
        converge_seconds=None,
        reproduced=True,
        crashed_after=21.0,
        watched_seconds=27.0,
    )
    for dag_id in (RETRY, CB):
        stock.dags[dag_id].tries = [TryRow("stall", 1, "running", "current")]
        stock.dags[dag_id].run_state = "running"
        stock.timeline += [
            report.StateChange(0.5, dag_id, 1, "queued"),
            report.StateChange(2.0, dag_id, 1, "running"),
        ]
    stock.dags[CB].callbacks = {1: {"on_retry_callback": 1}}
    stock.dags[CB].emails = {1: 1}
    stock.marks = [report.Mark(22.0, CB, 1, "on_retry_callback"), report.Mark(22.5, CB, 1, report.EMAIL)]
    fixed = _converged(watched_seconds=40.0)
    for dag_id in (RETRY, CB):
        fixed.timeline += [
            report.StateChange(1.0, dag_id, 1, "running"),
            report.StateChange(16.0, dag_id, 1, "failed"),
            report.StateChange(16.0, dag_id, 2, "up_for_retry"),
            report.StateChange(18.0, dag_id, 2, "running"),
            report.StateChange(29.0, dag_id, 2, "failed"),
        ]
    fixed.marks = [
        report.Mark(17.0, CB, 1, "on_retry_callback"),
        report.Mark(17.2, CB, 1, report.EMAIL),
        report.Mark(30.0, CB, 2, "on_failure_callback"),
        report.Mark(30.1, CB, 2, report.EMAIL),
    ]
    return [stock, fixed]


def test_html_report_is_self_contained_with_a_timeline_per_run() -> None:
    page = html_report.render_html(_recorded_results())

    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert page.count("<svg xmlns=") == 2  # one timeline per run
    for fetch in ("src=", "href=", "url(", "@import", "<script"):
        assert fetch not in page  # nothing to load: it opens offline, from a CI artefact or an email
    assert "scheduler crashed at 21 s" in page
    assert "IntegrityError: UNIQUE constraint failed" in page
    assert "Expected: 1 callback per try and 1 email per try." in page
    assert page.count("(expected 1 per try)") == 2 * 2 * 2  # 2 runs x tries 1-2 x (callbacks, emails)
    assert "bug reproduced (crash)" in page and "OK: converged as expected" in page
    # every callback and email is one mark with its time; every state a coloured span of its lane
    assert page.count("on_retry_callback for try 1 at") == 2
    assert page.count("email for try") == 3
    assert "on_failure_callback for try 2 at 30.0 s" in page
    assert "try 2: up_for_retry from 16 s to 18 s" in page


def test_html_report_shows_each_duplicate_mark_and_flags_the_count() -> None:
    stock = _recorded_results()[1]
    stock.label, stock.fix_enabled = "stock", False
    stock.needed_fixes, stock.reproduced = dict(DUPLICATES_NEEDS), True
    stock.dags[CB].callbacks[1]["on_retry_callback"] = 2
    stock.marks.append(report.Mark(19.0, CB, 1, "on_retry_callback"))

    page = html_report.render_html([stock])

    assert page.count("on_retry_callback for try 1 at") == 2
    assert '<td class="off">retry x2 (expected 1 per try)</td>' in page
    assert "bug reproduced (duplicates)" in page


def test_timeline_records_changes_and_marks_from_the_logs() -> None:
    before = {(CB, 1): "running"}
    now = {(CB, 1): "failed", (CB, 2): "up_for_retry", (RETRY, 1): "running"}
    assert report.state_changes(before, now, 16.0) == [
        report.StateChange(16.0, CB, 1, "failed"),
        report.StateChange(16.0, CB, 2, "up_for_retry"),
        report.StateChange(16.0, RETRY, 1, "running"),
    ]
    assert report.state_changes(now, now, 17.0) == []
    callbacks = [{"dag_id": CB, "try_number": 1, "kind": "on_retry_callback", "time": 1017.0}]
    emails = [{"fields": {"dag_id": CB, "try_number": 1}, "time": 1017.5}, {"fields": None, "time": 1}]
    assert report.marks_from_logs(callbacks, emails, triggered_at=1000.0) == [
        report.Mark(17.0, CB, 1, "on_retry_callback"),
        report.Mark(17.5, CB, 1, report.EMAIL),
    ]


def test_demo_writes_the_html_report_and_prints_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = iter(_recorded_results())

    class RecordedRun:
        def __init__(self, config: run.DemoConfig, label: str, features: dict[str, object]) -> None:
            self.label = label

        def execute(self) -> RunResult:
            result = next(recorded)
            assert result.label == self.label
            return result

    monkeypatch.setattr(demo, "probe_features", lambda config: {})
    monkeypatch.setattr(demo, "DemoRun", RecordedRun)
    home = tmp_path / "home"

    assert demo.main(["--home", str(home), "--json", str(tmp_path / "r.json")]) == demo.EXIT_OK

    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"report: {home / 'report.html'}"
    assert "<svg" in (home / "report.html").read_text()
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["runs"]["stock"]["crashed_after"] == 21.0
    assert data["runs"]["fixed"]["marks"][0] == {
        "seconds": 17.0, "dag_id": CB, "try_number": 1, "kind": "on_retry_callback"
    }  # fmt: skip


RECORDED = Path(__file__).resolve().parent / "data" / "demo-3.3.2-sqlite.json"


def test_html_report_of_a_recorded_3_3_run_shows_the_duplicates() -> None:
    """``--json`` of ``bash scripts/demo.sh --airflow 3.3.2``: stock called each try back twice."""
    data = json.loads(RECORDED.read_text(encoding="utf-8"))
    results = [report.result_from_json(r) for r in data["runs"].values()]
    stock, fixed = results

    page = html_report.render_html(results)

    assert page.count("<svg xmlns=") == 2
    assert page.count('<td class="off">') == 2  # stock: retry x2 for try 1, failure x2 for try 2
    assert '<td class="off">retry x2 (expected 1 per try)</td>' in page
    assert '<td class="off">failure x2 (expected 1 per try)</td>' in page
    for run_result in results:
        for mark in run_result.marks:
            assert f"for try {mark.try_number} at {mark.seconds:.1f} s" in page
    assert len([m for m in stock.marks if m.kind != report.EMAIL]) == 4
    assert len([m for m in fixed.marks if m.kind != report.EMAIL]) == 2
    assert "scheduler crashed" not in page


SCHEDULER_LOGS = {
    # 3.1 logs the task instance without its id; later releases add it: both end with the Celery task id.
    "scheduler-1": "Setting external_executor_id for <TaskInstance: x.stall run [queued]> to c-1 [airflow]\n",
    "scheduler-2": "Setting external_executor_id for TaskInstance(id=ti-b, dag_id=y) to c-2\n",
    "celery-worker-1": "Task execute_workload[c-2] received\n",
    "celery-worker-2": "Task execute_workload[c-1] received\n",
}


def test_owners_of_a_try_from_the_logs() -> None:
    assert report.scheduler_owning(SCHEDULER_LOGS, "c-1") == "scheduler-1"
    assert report.scheduler_owning(SCHEDULER_LOGS, "c-2") == "scheduler-2"
    assert report.scheduler_owning(SCHEDULER_LOGS, "c-") is None  # a prefix is not the id
    assert report.scheduler_owning(SCHEDULER_LOGS, "") is None
    assert report.worker_owning(SCHEDULER_LOGS, "c-1") == "celery-worker-2"
    assert report.worker_owning(SCHEDULER_LOGS, "") is None


def test_kill_target_waits_until_both_first_tries_run() -> None:
    tis = [
        {"dag_id": CB, "try_number": 1, "state": "running", "id": "ti-a", "external_executor_id": "c-1"},
        {"dag_id": RETRY, "try_number": 1, "state": "queued", "id": "ti-b", "external_executor_id": "c-2"},
    ]
    assert topology.kill_target(topology.KILL_SCHEDULER, tis, SCHEDULER_LOGS) is None
    tis[1]["state"] = "running"
    assert topology.kill_target(topology.HUNG, tis, SCHEDULER_LOGS) is None
    assert topology.kill_target(topology.KILL_SCHEDULER, tis, SCHEDULER_LOGS) == "scheduler-1"
    assert topology.kill_target(topology.KILL_WORKER, tis, SCHEDULER_LOGS) == "celery-worker-2"


@pytest.mark.parametrize(
    ("shape", "refusal"),
    [
        (topology.Topology(scenario=topology.KILL_WORKER), "--scenario kill-worker needs --executor celery"),
        (dataclasses.replace(CELERY, schedulers=1, scenario=topology.KILL_SCHEDULER), "needs --schedulers 2"),
        (dataclasses.replace(CELERY, scenario=topology.KILL_SCHEDULER), None),
    ],
)
def test_scenario_refusal(shape: topology.Topology, refusal: str | None) -> None:
    found = topology.topology_refusal(shape, PG)
    assert found == refusal if refusal is None else refusal in (found or "")


def test_nox_celery_scenarios_are_the_demos() -> None:
    """``noxfile.py`` cannot import the demo (no psutil in the runner's environment): its list must match."""
    noxfile = ast.parse((Path(__file__).resolve().parent.parent / "noxfile.py").read_text(encoding="utf-8"))
    (listed,) = [
        ast.literal_eval(node.value)
        for node in noxfile.body
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["CELERY_SCENARIOS"]
    ]
    assert listed == list(topology.SCENARIOS)


def test_injected_row_only_for_kill_scenarios() -> None:
    hung = RunResult(
        label="fixed", fix_enabled=True, airflow_version="3.4.0b2", database="postgresql", home="h"
    )
    assert "injected" not in report.render_table([hung])
    killed = dataclasses.replace(
        hung, scenario=topology.KILL_WORKER, injected=["SIGKILL celery-worker-1 at 20 s"]
    )
    assert "SIGKILL celery-worker-1 at 20 s" in report.render_table([killed])


def test_many_scenario_counts_one_callback_per_map_index() -> None:
    lines = [{"dag_id": report.MANY_DAG_ID, "map_index": i, "try_number": 1} for i in (0, 1, 1)]
    per_index = report.count_per_map_index([*lines, {"dag_id": CB, "try_number": 1}], report.MANY_DAG_ID)
    assert per_index == {0: 1, 1: 2}
    tries = [TryRow(f"stall[{i}]", 1, "failed", "current") for i in range(3)]
    outcome = DagOutcome(report.MANY_DAG_ID, "failed", tries, per_map_index=per_index)
    assert (
        report.many_summary(outcome, 3) == "3/3 failed; callbacks: 1 x1, 1 x2+, 1 none (expected 1 per try)"
    )
    assert report.many_problems(outcome, 3) == [
        f"{report.MANY_DAG_ID}: 2 task instances without exactly one callback"
    ]
    outcome.per_map_index = {0: 1, 1: 1, 2: 1}
    assert report.many_problems(outcome, 3) == []
    assert report.many_problems(None, 3) == [f"{report.MANY_DAG_ID}: no Dag run"]


def test_mapped_rows_get_one_task_id_per_map_index() -> None:
    assert run._mapped_task_id({"task_id": "stall", "map_index": 7})["task_id"] == "stall[7]"
    assert run._mapped_task_id({"task_id": "stall", "map_index": -1})["task_id"] == "stall"
    assert run._mapped_task_id({"task_id": "stall", "region_index": 3})["task_id"] == "stall[3]"  # 3.4
    many = dataclasses.replace(CELERY, scenario=topology.MANY)
    assert report.scenario_dag_ids(many.scenario) == (*report.DAG_IDS, report.MANY_DAG_ID)
    env = topology.executor_env(many, database_url=PG, queue="q")
    assert int(env["AIRFLOW__CELERY__WORKER_CONCURRENCY"]) * many.workers >= report.MANY_TASKS + 4
    assert topology.kill_target(topology.MANY, [], {}) is None
