"""
The environment variables and the home of every Airflow command of one run: isolated from the caller's
Airflow configuration, with the demo's switch, ports, timeouts and email backend set.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_heartbeat_fix.demo.records import SUBJECT_TEMPLATE

if TYPE_CHECKING:
    from airflow_heartbeat_fix.demo.config import DemoConfig

EMAIL_BACKEND = "airflow_heartbeat_fix.demo.records.send_email"


def without_airflow_settings(base: dict[str, str]) -> dict[str, str]:
    """``base`` without the caller's Airflow configuration (``AIRFLOW*``, ``_AIRFLOW*``)."""
    return {k: v for k, v in base.items() if not k.startswith(("AIRFLOW", "_AIRFLOW"))}


def airflow_process_env(
    base: dict[str, str],
    *,
    home: Path,
    database_url: str,
    api_port: int,
    fix_enabled: bool,
    heartbeat_timeout: int,
    detection_interval: int,
    jwt_secret: str,
) -> dict[str, str]:
    """The environment of every Airflow command of one run: isolated from the caller's Airflow config."""
    env = without_airflow_settings(base)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            # Frozen tries keep their LocalExecutor worker busy for good: 4 tries in all, so 8 is plenty.
            "AIRFLOW__CORE__PARALLELISM": "8",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(api_port),
            "AIRFLOW__API_AUTH__JWT_SECRET": jwt_secret,
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(heartbeat_timeout),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": str(detection_interval),
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__EMAIL__EMAIL_BACKEND": EMAIL_BACKEND,
            "AIRFLOW__EMAIL__SUBJECT_TEMPLATE": str(home / "email_subject.j2"),
            "AIRFLOW__HEARTBEAT_FIX__ENABLED": str(fix_enabled),
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(home / "tmp"),  # whatever the components write to a temp dir stays in the home
        }
    )
    return env


def bytecode_env(env: dict[str, str], *, airflow_compiled: bool, cache_dir: Path) -> dict[str, str]:
    """
    Without compiled bytecode in the venv and with ``PYTHONDONTWRITEBYTECODE`` set, every Airflow command
    would compile all of Airflow again: then let them cache bytecode under ``cache_dir`` (in the demo home).
    """
    if airflow_compiled or not env.get("PYTHONDONTWRITEBYTECODE"):
        return env
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = str(cache_dir)
    return out


def airflow_is_compiled() -> bool:
    """Whether the installed Airflow has bytecode next to its sources for this interpreter."""
    from importlib.util import find_spec

    spec = find_spec("airflow")
    if spec is None or spec.origin is None:
        return False
    return (
        Path(spec.origin).parent / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    ).exists()


def isolated_env(
    config: DemoConfig, home: Path, *, fix_enabled: bool, database_url: str, port: int
) -> dict[str, str]:
    """:func:`airflow_process_env` for one home; bytecode cached in the demo home when Airflow has none."""
    env = airflow_process_env(
        dict(os.environ),
        home=home,
        database_url=database_url,
        api_port=port,
        fix_enabled=fix_enabled,
        heartbeat_timeout=config.heartbeat_timeout,
        detection_interval=config.detection_interval,
        jwt_secret=secrets.token_urlsafe(32),
    )
    return bytecode_env(env, airflow_compiled=airflow_is_compiled(), cache_dir=config.home / "pycache")


def prepare_home(
    home: Path, dag_sources: dict[str, str], plugin_sources: dict[str, str] | None = None
) -> None:
    """
    A fresh run home: logs, a temp dir, the Dags, the email subject template they render, and the
    plugins folder (``$AIRFLOW_HOME/plugins``, Airflow's default) with ``plugin_sources``.
    """
    if home.exists():
        shutil.rmtree(home)
    for sub in ("logs", "tmp", "dags", "plugins"):
        (home / sub).mkdir(parents=True)
    for folder, sources in (("dags", dag_sources), ("plugins", plugin_sources or {})):
        for name, text in sources.items():
            (home / folder / name).write_text(text, encoding="utf-8")
    (home / "email_subject.j2").write_text(SUBJECT_TEMPLATE, encoding="utf-8")
