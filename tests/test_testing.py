"""The shared test support's Airflow home: a temporary one goes with its process, a caller's one stays."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRINT_HOME = "from testing.environment import airflow_home; print(airflow_home('hbfix-test-home-'))"


def _home_of_a_process(env: dict[str, str]) -> Path:
    done = subprocess.run(
        [sys.executable, "-c", PRINT_HOME], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    return Path(done.stdout.strip())


def _env_without_home() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "AIRFLOW_HOME"} | {
        "PYTHONPATH": str(ROOT)
    }


def test_a_temporary_home_is_removed_when_its_process_exits() -> None:
    home = _home_of_a_process(_env_without_home())
    assert home.name.startswith("hbfix-test-home-")
    assert not home.exists()


def test_the_callers_home_is_kept(tmp_path: Path) -> None:
    (tmp_path / "airflow.cfg").write_text("[core]\n", encoding="utf-8")
    home = _home_of_a_process(_env_without_home() | {"AIRFLOW_HOME": str(tmp_path)})
    assert home == tmp_path
    assert (tmp_path / "airflow.cfg").read_text(encoding="utf-8") == "[core]\n"
