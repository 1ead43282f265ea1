"""
What the installed Airflow needs and does, read off its code by the package's own detection.

:func:`probe_features` runs this module as ``python -m airflow_heartbeat_fix.demo.features OUT.json``
in an isolated environment: the demo process itself never imports Airflow, so the caller's Airflow
configuration and home stay out of it, and no version number is written down here. The child imports
only what :func:`read` needs.
"""

from __future__ import annotations

import json
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_heartbeat_fix.demo.config import DemoConfig

# Airflow's task runner hands alert emails to a non-default ``[email] email_backend`` through this module.
EMAIL_BACKEND_MODULE = "airflow.sdk.execution_time.email_backend"


def read() -> dict[str, Any]:
    """``needed_fixes`` (fix -> state with the fixes enabled) and ``emails_via_backend``."""
    from airflow_heartbeat_fix import activation, detection

    decided = detection.decide(activation.facts(), enabled=True)
    return {
        "needed_fixes": {fix: decision.state.value for fix, decision in decided.items()},
        "emails_via_backend": find_spec(EMAIL_BACKEND_MODULE) is not None,
    }


def probe_features(config: DemoConfig) -> dict[str, Any]:
    """
    What this Airflow needs and does (:mod:`.features`), read in a child process with an isolated home.

    Runs once per demo, before the runs: the stock verdict and the email counts depend on it.
    """
    import uuid

    from airflow_heartbeat_fix.demo.config import DemoError
    from airflow_heartbeat_fix.demo.database import sqlite_url
    from airflow_heartbeat_fix.demo.environment import isolated_env
    from airflow_heartbeat_fix.demo.processes import Processes

    home = config.home / "probe"
    home.mkdir(parents=True, exist_ok=True)
    out = home / "features.json"
    out.unlink(missing_ok=True)
    env = isolated_env(config, home, fix_enabled=False, database_url=sqlite_url(home / "airflow.db"), port=0)
    procs = Processes(marker=f"probe-{uuid.uuid4()}")
    log = home / "features.log"
    argv = [sys.executable, "-m", "airflow_heartbeat_fix.demo.features", str(out)]
    try:
        codes = procs.run([argv], env, log, home, timeout=300)
    finally:
        procs.stop_all()
    if codes != [0] or not out.exists():
        raise DemoError(f"could not read what this Airflow needs; see {log}")
    features: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return features


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(read()), encoding="utf-8")
