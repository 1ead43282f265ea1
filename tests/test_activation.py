"""Activation: a plain ``airflow scheduler`` runs the fixed classes; the off switch leaves Airflow as is."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import airflow_heartbeat_fix
from airflow_heartbeat_fix import activation, provider_info
from airflow_heartbeat_fix.detection import SCHEDULER_FIXES, FixState
from testing.processes import run_in_group

if TYPE_CHECKING:
    import subprocess

# Every test here runs its Airflow processes with the switch it needs, whatever the cell's mode.
#: What activation does (the switch, the start line, the wrapper, status) does not depend on the metadata
#: database: each release runs these in its SQLite cell (its PostgreSQL cells would repeat them).
pytestmark = [pytest.mark.mode_independent, pytest.mark.backend("sqlite")]

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
STATUS = str(Path(sys.executable).with_name("airflow-heartbeat-fix"))


def _run(
    argv: list[str], *, enabled: bool | str, timeout: int = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """
    Run an Airflow command in a process group of its own and wait for *it* to exit, not for every
    process it forked. A hang fails the test with every thread's stack (``PYTHONFAULTHANDLER``).
    """
    env = {
        **os.environ,
        **(env or {}),
        "AIRFLOW__HEARTBEAT_FIX__ENABLED": str(enabled),
        "PYTHONFAULTHANDLER": "1",
        # One LocalExecutor worker. Stock LocalExecutor.end() (3.2.2 to 3.4.0b2) puts one shutdown message
        # per worker it sees alive, checking each worker while earlier messages are already being taken:
        # a worker that took one and exited before the loop reaches it is skipped, so one message too few
        # is sent and end() joins the last idle worker forever (an intermittent hang on a busy machine).
        # Executor shutdown is not what these tests check; with one worker the race cannot happen.
        "AIRFLOW__CORE__PARALLELISM": "1",
    }
    result, hung = run_in_group(argv, env, timeout)
    if hung:
        output = f"--- stdout ---\n{result.stdout[-3000:]}\n--- stderr ---\n{result.stderr}"
        pytest.fail(f"{argv} hung for {timeout}s\n{output}")
    return result


def _needed_fixes() -> list[str]:
    decided = activation.decide(activation.facts(), enabled=True)
    return [fix for fix, decision in decided.items() if decision.state is FixState.ACTIVE]


def _start_lines(output: str) -> list[str]:
    """Every line the package logged or printed (its logger, its CLI's one-line messages)."""
    ours = ("airflow-heartbeat-fix", "[airflow_heartbeat_fix]")
    return [line for line in output.splitlines() if any(mark in line for mark in ours)]


def _summary(enabled: bool) -> str:
    """The start line's message for this Airflow: each fix's state, after "off by configuration"."""
    decided = activation.decide(activation.facts(), enabled=enabled)
    return activation.summary(decided, activation.facts().version, switched_off=not enabled)


@pytest.mark.usefixtures("scheduler_rows_cleared")
@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "off-switch"])
def test_plain_airflow_scheduler_logs_one_start_line(enabled: bool) -> None:
    result = _run([AIRFLOW, "scheduler", "--num-runs", "1", "--skip-serve-logs"], enabled=enabled)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    lines = _start_lines(output)
    assert len(lines) == 1, output[-4000:]
    assert _summary(enabled) in lines[0]
    if not enabled:
        assert activation.OFF_BY_CONFIGURATION in lines[0]


@pytest.mark.usefixtures("scheduler_rows_cleared")
@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "off-switch"])
def test_plain_airflow_dag_processor_logs_one_start_line(enabled: bool, tmp_path: Path) -> None:
    """The second target: ``airflow dag-processor`` logs its own fixes' line, and only that one."""
    from airflow_heartbeat_fix.detection import DAG_PROCESSOR

    result = _run(
        [AIRFLOW, "dag-processor", "--num-runs", "1"],
        enabled=enabled,
        env={"AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path)},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    lines = _start_lines(output)
    assert len(lines) == 1, output[-4000:]
    decided = activation.decide(activation.facts(), enabled=enabled)
    expected = activation.summary(
        decided, activation.facts().version, switched_off=not enabled, target=DAG_PROCESSOR
    )
    assert expected in lines[0]
    assert "(Dag processor)" in lines[0]


def _reads_namespace_levels() -> bool:
    """Whether Airflow's logging setup reads ``[logging] namespace_levels`` (3.2+; 3.0/3.1 have none)."""
    import airflow

    return "namespace_levels" in Path(airflow.__file__).with_name("logging_config.py").read_text()


@pytest.mark.skipif(not _reads_namespace_levels(), reason="this Airflow has no [logging] namespace_levels")
@pytest.mark.usefixtures("scheduler_rows_cleared")
def test_namespace_levels_silence_the_start_line() -> None:
    """``[logging] namespace_levels`` filters Airflow's structlog loggers: the start line is one of them."""
    result = _run(
        [AIRFLOW, "scheduler", "--num-runs", "1", "--skip-serve-logs"],
        enabled=True,
        env={"AIRFLOW__LOGGING__NAMESPACE_LEVELS": "airflow_heartbeat_fix=WARNING"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Starting the scheduler" in output, output[-4000:]
    assert _start_lines(output) == [], output[-4000:]


@pytest.mark.usefixtures("scheduler_rows_cleared")
def test_plain_airflow_scheduler_with_an_invalid_switch_stays_fixed_and_says_so() -> None:
    """The documented fail-safe: a value that is not a boolean keeps the fixes on, with one log line."""
    result = _run([AIRFLOW, "scheduler", "--num-runs", "1", "--skip-serve-logs"], enabled="on")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    problem = "[heartbeat_fix] enabled = 'on' is not a boolean (accepted: True/False, t/f, 1/0)"
    lines = _start_lines(output)
    assert len(lines) == 1, output[-4000:]
    assert _summary(True) in lines[0]
    assert problem in lines[0]
    assert "Traceback" not in output, output[-4000:]


def test_status_reads_the_policy_entry_point_from_package_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing the package registers the hook in this process: only the metadata says a scheduler will."""
    from importlib import metadata

    from airflow_heartbeat_fix import cli

    monkeypatch.setattr(metadata, "entry_points", lambda **kwargs: metadata.EntryPoints(()))
    monkeypatch.setenv("AIRFLOW__HEARTBEAT_FIX__ENABLED", "True")
    document = cli.status_document()
    assert document["policy_entry_point_registered"] is False
    needed = _needed_fixes()
    if needed:
        assert document["ok"] is False
        assert document["not_applied"] == needed
        assert "NOT registered" in document["activation"]
    # The rows say what a plain scheduler runs without the hook: none of the fixes.
    assert [row["state"] for row in document["fixes"] if row["fix"] in needed] == ["unsupported"] * len(
        needed
    )
    assert all(row["reason"] == cli.UNHOOKED for row in document["fixes"] if row["fix"] in needed)


@pytest.mark.usefixtures("scheduler_rows_cleared")
def test_explicit_scheduler_wrapper_activates_once() -> None:
    result = _run([STATUS, "scheduler", "--num-runs", "1", "--skip-serve-logs"], enabled=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    lines = _start_lines(output)
    assert len(lines) == 1, output[-4000:]
    assert _summary(True) in lines[0]


def _status_json(enabled: bool | str) -> tuple[int, dict[str, Any], str]:
    result = _run([STATUS, "status", "-o", "json"], enabled=enabled, timeout=120)
    return result.returncode, json.loads(result.stdout), _without_airflow_noise(result.stderr)


#: What Airflow itself prints on import, not the CLI: its INFO log lines (3.1 logs alembic's plugin
#: setup) and Python warnings (3.1's providers warn about deprecated import paths).
_AIRFLOW_NOISE = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+Z \[info\s*\] |\S+\.py:\d+ \w*Warning: )")


def _without_airflow_noise(stderr: str) -> str:
    """The CLI's own stderr: Airflow's INFO log lines and Python warnings dropped (errors are kept)."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not _AIRFLOW_NOISE.match(line))


def test_status_json_reports_each_fix() -> None:
    rc, document, stderr = _status_json(True)
    assert rc == 0, stderr
    assert set(document) == {
        "package_version",
        "airflow_version",
        "python_version",
        "supported_airflow",
        "refusal",
        "enabled",
        "config_problem",
        "config_warnings",
        "policy_entry_point_registered",
        "activation",
        "ok",
        "not_applied",
        "fixes",
    }
    assert document["ok"] is True
    assert document["refusal"] is None
    assert document["enabled"] is True
    from airflow_heartbeat_fix import support

    assert document["supported_airflow"] == f"apache-airflow-core{support.supported_range()}"
    assert document["policy_entry_point_registered"] is True
    decided = activation.decide(activation.facts(), enabled=True)
    assert [(row["fix"], row["state"], row["reason"]) for row in document["fixes"]] == [
        (fix, d.state.value, d.reason) for fix, d in decided.items()
    ]


def test_status_with_off_switch_says_off_by_configuration_and_passes() -> None:
    """The off switch is the operator's choice: readiness stays green, and the activation line says why."""
    rc, document, stderr = _status_json(False)
    assert rc == 0, stderr
    assert document["ok"] is True
    assert document["enabled"] is False
    assert document["not_applied"] == []
    assert all(row["state"] != FixState.ACTIVE.value for row in document["fixes"])
    assert document["activation"] == (
        "off by configuration ([heartbeat_fix] enabled = False): "
        "a plain `airflow scheduler` runs Airflow's own classes"
    )
    assert stderr.strip() == ""


def _invalid_switch(value: str) -> str:
    return (
        f"[heartbeat_fix] enabled = {value!r} is not a boolean (accepted: True/False, t/f, 1/0); "
        "the fixes stay on"
    )


@pytest.mark.parametrize("value", ["maybe", "on", "yes", "off", "no"])
def test_invalid_off_switch_fails_safe(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Words Airflow's ``getboolean`` rejects, "off" and "no" included, keep the fixes on."""
    monkeypatch.setenv("AIRFLOW__HEARTBEAT_FIX__ENABLED", value)
    assert activation.read_switch() == activation.Switch(True, value, _invalid_switch(value))


def test_status_invalid_off_switch_is_one_line_and_fails_safe() -> None:
    rc, document, stderr = _status_json("off")
    assert rc == 0, stderr
    assert document["enabled"] is True
    assert document["not_applied"] == []
    assert document["config_problem"] == _invalid_switch("off")
    assert stderr.strip().splitlines() == [f"airflow-heartbeat-fix: {document['config_problem']}"]


def test_status_table_and_usage_errors() -> None:
    table = _run([STATUS, "status"], enabled=False, timeout=120)
    assert "[heartbeat_fix] enabled = False" in table.stdout
    for fix in activation.decide(activation.facts(), enabled=False):
        assert fix in table.stdout
    bad = _run([STATUS, "status", "-o", "xml"], enabled=True, timeout=120)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    unknown = _run([STATUS, "status", "--bogus"], enabled=True, timeout=120)
    assert (unknown.returncode, unknown.stderr.splitlines()[-1]) == (
        2,
        "airflow-heartbeat-fix: error: unrecognized arguments: --bogus",
    )
    version = _run([STATUS, "--version"], enabled=True, timeout=120)
    assert version.stdout.strip() == f"airflow-heartbeat-fix {airflow_heartbeat_fix.__version__}"


def test_status_plain_prints_reasons_as_they_are() -> None:
    """``-o plain`` is for pipes: no rich markup escapes (a reason once read ``\\[heartbeat_fix] ...``)."""
    plain = _run([STATUS, "status", "-o", "plain"], enabled=False, timeout=120)
    disabled = activation.decide(activation.facts(), enabled=False)
    rows = {line.split(" ", 1)[0]: line.rstrip() for line in plain.stdout.splitlines()}
    for fix, decision in disabled.items():
        assert rows[fix].endswith(decision.reason), plain.stdout
    assert "\\" not in plain.stdout


@pytest.mark.usefixtures("scheduler_rows_cleared")
def test_explicit_scheduler_wrapper_with_the_off_switch_starts_the_stock_scheduler() -> None:
    """The incident switch never stops a scheduler: the wrapper starts Airflow's own, with one line."""
    result = _run([STATUS, "scheduler", "--num-runs", "1", "--skip-serve-logs"], enabled=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Starting the scheduler" in output, output[-4000:]
    lines = _start_lines(output)
    assert len(lines) == 1, output[-4000:]
    assert f"{activation.OFF_BY_CONFIGURATION}; the scheduler runs Airflow's own classes" in lines[0]
    assert "Traceback" not in output


def test_dry_run_reports_an_activation_failure_as_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Airflow 3.0/3.1 did to the old status: an import that fails only when the fix is applied."""
    activation.uninstall()
    try:

        def broken_apply(*args: Any) -> None:
            raise ImportError("No module named 'airflow._shared.observability'")

        monkeypatch.setattr(activation, "_apply", broken_apply)
        monkeypatch.setattr(activation, "_apply_dag_processor", broken_apply)
        # Switched on whatever the cell's mode: in stock mode nothing would be applied, so nothing would fail.
        monkeypatch.setenv("AIRFLOW__HEARTBEAT_FIX__ENABLED", "True")
        decided = activation.dry_run()
        needed = _needed_fixes()
        assert [d.fix for d in activation.not_applied(decided)] == needed
        for fix in needed:
            assert decided[fix].state is FixState.UNSUPPORTED
            assert "No module named 'airflow._shared.observability'" in decided[fix].reason
        with pytest.raises(activation.ActivationError, match="could not be activated"):
            activation.install(raise_errors=True)
    finally:
        monkeypatch.undo()
        if activation.is_enabled():
            activation.install()


def test_airflow_without_the_callback_sink_is_not_applicable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sink module gone: every scheduler fix "not applicable", nothing patched, nothing missing."""
    from airflow.cli.commands import scheduler_command

    activation.uninstall()
    activation._originals.cache_clear()
    stock_runner = scheduler_command.SchedulerJobRunner
    monkeypatch.setitem(sys.modules, "airflow.callbacks.database_callback_sink", None)  # import fails
    try:
        decided = {fix: d for fix, d in activation.dry_run().items() if fix in SCHEDULER_FIXES}
        assert {d.state for d in decided.values()} == {FixState.NOT_APPLICABLE}
        assert activation.not_applied(decided) == []
        assert activation.install(raise_errors=True) == decided
        assert scheduler_command.SchedulerJobRunner is stock_runner
    finally:
        activation.uninstall()
        monkeypatch.undo()
        activation._originals.cache_clear()
        if activation.is_enabled():
            activation.install()


def test_fixed_scheduler_logs_under_the_stock_logger_name() -> None:
    from airflow.jobs.job import Job

    from airflow_heartbeat_fix.scheduler import build_runner_class

    stock = activation._originals()["runner"]
    fixed = build_runner_class(tuple(_needed_fixes()) or ("session_preserving_sink",), base=stock)
    assert fixed is not stock
    assert fixed(job=Job(), num_runs=1).log.name == stock(job=Job(), num_runs=1).log.name


def test_airflow_config_list_shows_the_section() -> None:
    result = _run(
        [AIRFLOW, "config", "list", "--section", "heartbeat_fix", "--include-descriptions"],
        enabled=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "[heartbeat_fix]" in result.stdout
    assert provider_info.ENABLED_DESCRIPTION in result.stdout


def test_import_hook_asks_the_whole_import_system(caplog: pytest.LogCaptureFixture) -> None:
    """Another meta-path finder's spec is the one wrapped; a spec it cannot wrap is logged, not hidden."""
    import importlib.machinery

    from airflow_heartbeat_fix import policy

    commands_path = sys.modules["airflow.cli.commands"].__path__
    real = importlib.machinery.PathFinder.find_spec(policy.TRIGGER_MODULE, commands_path)
    assert real is not None

    class OtherFinder:
        def __init__(self, loader: Any) -> None:
            self.loader = loader

        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != policy.TRIGGER_MODULE:
                return None
            return importlib.machinery.ModuleSpec(fullname, self.loader, origin=real.origin)

    hook = policy.SchedulerCommandHook()
    other = OtherFinder(real.loader)
    saved = sys.modules.pop(policy.TRIGGER_MODULE)
    sys.meta_path.insert(0, other)
    try:
        spec = hook.find_spec(policy.TRIGGER_MODULE, None)
        assert spec is not None
        assert spec.loader._loader is real.loader  # type: ignore[union-attr]
        other.loader = None
        with caplog.at_level("WARNING", logger="airflow_heartbeat_fix"):
            assert hook.find_spec(policy.TRIGGER_MODULE, None) is None
        assert "cannot hook airflow.cli.commands.scheduler_command" in caplog.text
    finally:
        sys.meta_path.remove(other)
        sys.modules[policy.TRIGGER_MODULE] = saved


def test_install_is_idempotent_and_uninstall_restores() -> None:
    from airflow.callbacks import database_callback_sink
    from airflow.cli.commands import scheduler_command

    before = (scheduler_command.SchedulerJobRunner, database_callback_sink.DatabaseCallbackSink)
    activation.install()
    assert (scheduler_command.SchedulerJobRunner, database_callback_sink.DatabaseCallbackSink) == before
    activation.uninstall()
    try:
        originals = activation._originals()
        assert scheduler_command.SchedulerJobRunner is originals["runner"]
        assert database_callback_sink.DatabaseCallbackSink is originals["sink"]
    finally:
        if activation.is_enabled():
            activation.install()
    assert (scheduler_command.SchedulerJobRunner, database_callback_sink.DatabaseCallbackSink) == before


def test_airflow_plugins_lists_heartbeat_fix() -> None:
    import json

    result = _run([AIRFLOW, "plugins", "--output", "json"], enabled=True, timeout=120)
    assert result.returncode == 0, result.stderr
    names = [plugin["name"] for plugin in json.loads(result.stdout[result.stdout.index("[") :])]
    assert names.count("heartbeat_fix") == 1


#: A scheduled Dag for the deployment-policies test: its runs are due, so the scheduler creates one.
POLICY_DAG = """
from datetime import datetime, timedelta, timezone

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG(
    "heartbeat_fix_deployment_policies",
    schedule=timedelta(days=1),
    start_date=datetime.now(tz=timezone.utc) - timedelta(days=3),
    catchup=False,
):
    EmptyOperator(task_id="work")
"""


@pytest.fixture
def policy_dag_rows_cleared() -> Any:
    """The deployment-policies test's Dag, runs and Variable: none left behind."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.variable import Variable
    from airflow.utils.session import create_session
    from sqlalchemy import delete
    from tests_common.test_utils.db import clear_db_dags, clear_db_runs, clear_db_serialized_dags

    def clear() -> None:
        clear_db_runs()
        clear_db_serialized_dags()
        clear_db_dags()
        with create_session(scoped=False) as cleaner:
            for model in (TaskInstance, DagRun):
                cleaner.execute(delete(model).where(model.dag_id == "heartbeat_fix_deployment_policies"))
            cleaner.execute(delete(DagModel).where(DagModel.dag_id == "heartbeat_fix_deployment_policies"))
            cleaner.execute(delete(Variable).where(Variable.key == "heartbeat_fix_policy_queue"))

    clear()
    yield
    clear()


@pytest.mark.usefixtures("scheduler_rows_cleared", "policy_dag_rows_cleared")
def test_deployment_local_settings_apply_next_to_the_fixes(tmp_path: Path) -> None:
    """
    A deployment's ``$AIRFLOW_HOME/config/airflow_local_settings.py`` (``dag_policy``, ``task_policy``,
    ``task_instance_mutation_hook``) and the package's ``airflow.policy`` entry point in the same
    processes: Airflow applies the deployment's policies (at parse time, and at task instance creation in
    the scheduler, where the hook's Variable lookup is a nested session), the scheduler runs the fixes,
    and ``status`` says so. The package defines no policy, so nothing of the deployment's is overridden.
    """
    from airflow.models.dag import DagModel, DagTag
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.variable import Variable
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from testing.plugins import LOCAL_SETTINGS, install_plugin_folder

    home = tmp_path / "home"
    install_plugin_folder(home / "config", LOCAL_SETTINGS)
    (home / "dags").mkdir(parents=True)
    (home / "dags" / "deployment_policies.py").write_text(POLICY_DAG, encoding="utf-8")
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    with create_session(scoped=False) as writer:
        writer.add(Variable(key="heartbeat_fix_policy_queue", val="deployment-queue"))

    parsed = _run([AIRFLOW, "dags", "reserialize"], enabled=True, env=env)
    assert parsed.returncode == 0, (parsed.stdout + parsed.stderr)[-4000:]
    scheduler = _run([AIRFLOW, "scheduler", "--num-runs", "3", "--skip-serve-logs"], enabled=True, env=env)
    output = scheduler.stdout + scheduler.stderr
    assert scheduler.returncode == 0, output[-4000:]
    assert [_summary(True) in line for line in _start_lines(output)] == [True], output[-4000:]
    status = _run([STATUS, "status", "-o", "json"], enabled=True, env=env)
    document = json.loads(status.stdout)
    assert status.returncode == 0 and document["ok"], status.stderr[-2000:]
    states = {row["fix"]: row["state"] for row in document["fixes"]}
    assert {fix for fix, state in states.items() if state == FixState.ACTIVE.value} == set(_needed_fixes())

    dag_id = "heartbeat_fix_deployment_policies"
    with create_session(scoped=False) as reader:
        tags = set(reader.scalars(select(DagTag.name).where(DagTag.dag_id == dag_id)))
        owners = reader.scalar(select(DagModel.owners).where(DagModel.dag_id == dag_id))
        queues = set(reader.scalars(select(TaskInstance.queue).where(TaskInstance.dag_id == dag_id)))
    assert "deployment-dag-policy" in tags, "dag_policy did not apply"
    assert owners == "deployment-task-policy", "task_policy did not apply"
    assert queues == {"deployment-queue"}, "the scheduler created no run, or the mutation hook did not apply"


#: In a fresh interpreter: activate as ``airflow scheduler`` does, run ``status -o json``, then list the
#: demo's modules that were loaded (the fix never needs the demo: it is 59% of the wheel, psutil included).
ACTIVATE_THEN_LIST_DEMO_MODULES = """
import contextlib, io, json, sys
import airflow.cli.commands.scheduler_command as command  # the import hook activates the fixes here
from airflow_heartbeat_fix import cli
with contextlib.redirect_stdout(io.StringIO()):
    cli.main(["status", "-o", "json"])
demo = sorted(name for name in sys.modules if name.startswith("airflow_heartbeat_fix.demo"))
fixes = getattr(command.SchedulerJobRunner, "heartbeat_fixes", ())
print(json.dumps({"activated": bool(fixes), "demo": demo}))
"""


def test_activation_and_status_load_nothing_of_the_demo() -> None:
    done = _run([sys.executable, "-c", ACTIVATE_THEN_LIST_DEMO_MODULES], enabled=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"activated": True, "demo": []}
