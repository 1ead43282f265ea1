"""Airflow's environment: for this process before it imports Airflow, and for the commands it starts."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile


def airflow_home(prefix: str) -> str:
    """
    ``AIRFLOW_HOME``: the caller's, or a fresh temporary directory named ``prefix...`` that this process
    removes when it exits (it created it; a caller's home is never touched).
    """
    if home := os.environ.get("AIRFLOW_HOME"):
        return home
    home = os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


def airflow_settings(home: str, db_url: str) -> dict[str, str]:
    """Airflow on ``db_url``, without examples, on the LocalExecutor, with the Dags folder in ``home``."""
    return {
        "AIRFLOW_HOME": home,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(home, "dags"),
    }


def configure_airflow(db_url: str, *, home_prefix: str = "hbfix-home-") -> None:
    """
    :func:`airflow_settings` for this process, the database always, the rest unless the caller set it.
    Airflow reads its configuration once, at import: call this first.
    """
    for key, value in airflow_settings(airflow_home(home_prefix), db_url).items():
        os.environ.setdefault(key, value)
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = db_url
    os.makedirs(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], exist_ok=True)


def command_env(base: dict[str, str], home: str, db_url: str, **settings: str) -> dict[str, str]:
    """An Airflow command's environment: ``base`` without its Airflow settings, then ours and ``settings``."""
    from airflow_heartbeat_fix.demo.environment import without_airflow_settings

    return without_airflow_settings(base) | airflow_settings(home, db_url) | settings
