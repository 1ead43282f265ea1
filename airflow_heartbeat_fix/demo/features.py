"""
What the installed Airflow needs and does, read off its code by the package's own detection.

The demo runs this as ``python -m airflow_heartbeat_fix.demo.features OUT.json`` in a run's isolated
environment: the demo process itself never imports Airflow, so the caller's Airflow configuration and
home stay out of it, and no version number is written down here.
"""

from __future__ import annotations

import json
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

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


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(read()), encoding="utf-8")
