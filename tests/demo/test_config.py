"""Where the demo finds its home and its Dags."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from airflow_heartbeat_fix.demo import config, result, topology
from tests.demo._results import CB, RETRY, ROOT

if TYPE_CHECKING:
    from pathlib import Path


def test_default_home_and_db_label(tmp_path: Path) -> None:
    assert topology.db_label(None) == "sqlite"
    assert topology.db_label("postgresql+psycopg://u:p@h/db") == "postgresql"
    assert config.default_home(tmp_path, "3.4.0b2", None) == tmp_path / "demo" / "3.4.0b2-sqlite"
    pg = "postgresql://h/db"
    assert (
        config.default_home(tmp_path, "3.3.2", pg, topology.CELERY)
        == tmp_path / "demo" / "3.3.2-postgresql-celery"
    )


def test_dag_sources_default_to_the_installed_package_data() -> None:
    origin, sources = config.find_dag_sources(None)
    assert origin.endswith("dags")
    assert set(sources) == {f"{d}.py" for d in result.DAG_IDS}
    repo_dags = ROOT / "dags"
    assert sources == {name: (repo_dags / name).read_text(encoding="utf-8") for name in sources}


def test_dag_sources_from_a_directory_missing_a_dag(tmp_path: Path) -> None:
    (tmp_path / f"{RETRY}.py").write_text("# nothing\n")
    with pytest.raises(config.DemoError, match=f"lacks {CB}.py"):
        config.find_dag_sources(tmp_path)


def test_listener_option_deploys_the_installed_listener_plugin(tmp_path: Path) -> None:
    """``--listener``: the plugins folder holds the listener plugin shipped with the package, as is."""
    from airflow_heartbeat_fix.demo import cli

    with_listener = cli.build_config(cli.parse_args(["--home", str(tmp_path), "--listener"]))
    without = cli.build_config(cli.parse_args(["--home", str(tmp_path)]))

    source = config.LISTENER_PLUGIN_FILE.read_text(encoding="utf-8")
    assert with_listener.plugin_sources == {"heartbeat_fix_audit_listener.py": source}
    assert "def on_task_instance_failed" in source and "create_session()" in source
    assert without.plugin_sources == {}
