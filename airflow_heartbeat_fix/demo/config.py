"""
What one demo is given, resolved once by :mod:`.cli` from its options: :class:`DemoConfig`, and where its
pieces are found (the Dags, the ``airflow`` executable, the installed version, the per-user home).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_heartbeat_fix.demo.result import DAG_IDS
from airflow_heartbeat_fix.demo.topology import LOCAL, Topology, db_label

if TYPE_CHECKING:
    from collections.abc import Mapping
    from importlib.resources.abc import Traversable

#: The top-level ``dags/``, installed as this package (``package-dir`` in pyproject.toml).
DAGS_PACKAGE = "airflow_heartbeat_fix.demo.dags"
#: ``--listener``'s plugin: package data of the demo, copied into the run's plugins folder.
LISTENER_PLUGIN_FILE = Path(__file__).with_name("plugins") / "heartbeat_fix_audit_listener.py"
LABELS = ("stock", "fixed")


class DemoError(Exception):
    """A setup step failed; the message says which."""


class UsageError(DemoError):
    """The demo refuses to start: an option, path or database it must not or cannot use."""


@dataclass(frozen=True)
class DemoConfig:
    home: Path
    database: str | None
    dags_origin: str
    dag_sources: dict[str, str]
    airflow_bin: Path
    airflow_version: str
    heartbeat_timeout: int
    detection_interval: int
    timeout: float
    settle: float
    runs: tuple[str, ...]
    json_path: Path | None
    html_path: Path | None = None
    reset_database: bool = False
    topology: Topology = field(default_factory=Topology)
    #: the plugins folder's files (``--listener``): name -> source
    plugin_sources: dict[str, str] = field(default_factory=dict)

    @property
    def db_label(self) -> str:
        return db_label(self.database)


def cache_dir(environ: Mapping[str, str]) -> Path:
    """The per-user cache directory (XDG): demo homes (45-50 MB each) stay out of the working directory."""
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "airflow-heartbeat-fix"


def default_home(cache: Path, airflow_version: str, database: str | None, executor: str = LOCAL) -> Path:
    suffix = "" if executor == LOCAL else f"-{executor}"
    return cache / "demo" / f"{airflow_version}-{db_label(database)}{suffix}"


def find_dag_sources(explicit: Path | None, dag_ids: tuple[str, ...] = DAG_IDS) -> tuple[str, dict[str, str]]:
    """Where the demo Dags come from (``--dags``, else the installed package data), and their sources."""
    folder: Traversable | Path = explicit if explicit is not None else resources.files(DAGS_PACKAGE)
    names = [f"{dag_id}.py" for dag_id in dag_ids]
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise UsageError(f"--dags {folder} lacks {', '.join(missing)}")
    return str(folder), {name: (folder / name).read_text(encoding="utf-8") for name in names}


def listener_plugin_sources() -> dict[str, str]:
    """``--listener``: the plugins folder holding the demo's listener plugin."""
    return {LISTENER_PLUGIN_FILE.name: LISTENER_PLUGIN_FILE.read_text(encoding="utf-8")}


def airflow_executable() -> Path:
    path = Path(sys.executable).parent / "airflow"
    if not path.exists():
        raise DemoError(f"no airflow executable next to {sys.executable}")
    return path
