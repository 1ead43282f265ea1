"""
What importing a demo module loads, in a fresh interpreter: ``records`` is imported by the shipped Dags
inside the Dag processor, ``topology`` by ``noxfile.py`` in an environment without the project's
dependencies.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The modules that importing ``sys.argv[1]`` adds (not those the interpreter's start-up loaded).
LIST_MODULES = """
import importlib, json, sys
before = set(sys.modules)
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def _loaded_by(module: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", LIST_MODULES, module], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(json.loads(done.stdout))


def test_records_loads_neither_psutil_nor_the_rest_of_the_demo() -> None:
    loaded = _loaded_by("airflow_heartbeat_fix.demo.records")
    demo = {name for name in loaded if name.startswith("airflow_heartbeat_fix.demo.")}
    assert "psutil" not in loaded
    assert demo == {"airflow_heartbeat_fix.demo.records"}


def test_topology_needs_only_the_standard_library() -> None:
    top_level = {name.split(".", 1)[0] for name in _loaded_by("airflow_heartbeat_fix.demo.topology")}
    assert "airflow_heartbeat_fix" in top_level
    assert top_level - sys.stdlib_module_names == {"airflow_heartbeat_fix"}
