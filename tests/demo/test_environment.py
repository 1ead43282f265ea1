"""The environment and home of a run's Airflow commands."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_heartbeat_fix.demo import environment, records

if TYPE_CHECKING:
    from pathlib import Path


def test_airflow_env_is_isolated_and_sets_the_switch(tmp_path: Path) -> None:
    base = {"PATH": "/bin", "AIRFLOW_HOME": "/elsewhere", "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor"}
    env = environment.airflow_process_env(
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
    assert environment.bytecode_env(env, airflow_compiled=True, cache_dir=tmp_path) == env
    assert environment.bytecode_env({"PATH": "/bin"}, airflow_compiled=False, cache_dir=tmp_path) == {
        "PATH": "/bin"
    }
    assert environment.bytecode_env(env, airflow_compiled=False, cache_dir=tmp_path) == {
        "PATH": "/bin",
        "PYTHONPYCACHEPREFIX": str(tmp_path),
    }


def test_prepare_home_writes_dags_and_subject_template(tmp_path: Path) -> None:
    home = tmp_path / "stock"
    (home / "old").mkdir(parents=True)
    environment.prepare_home(home, {"a.py": "x = 1\n"})
    assert not (home / "old").exists()
    assert (home / "dags" / "a.py").read_text() == "x = 1\n"
    assert (home / "logs").is_dir() and (home / "tmp").is_dir()
    assert (home / "email_subject.j2").read_text() == records.SUBJECT_TEMPLATE
    assert list((home / "plugins").iterdir()) == []


def test_prepare_home_writes_the_plugins_folder(tmp_path: Path) -> None:
    environment.prepare_home(tmp_path / "fixed", {}, {"listener.py": "y = 2\n"})
    assert (tmp_path / "fixed" / "plugins" / "listener.py").read_text() == "y = 2\n"
