"""
pytest plugin loaded by ``scripts/parity.sh`` (``-p parity.snapshot_plugin``): keeps a copy of each
cell's junit XML where the parity run can read it after ``scripts/test.sh`` has exited.

``scripts/test.sh`` always writes ``test-results/`` and the next run in the same checkout (queued on
the run lock) wipes it the moment the lock is free, before the parity report could read it. With
``HEARTBEAT_FIX_PARITY_SNAPSHOT`` set, every cell also leaves ``<snapshot>/<cell>.xml``. Without it,
this plugin does nothing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest


def pytest_unconfigure(config: pytest.Config) -> None:
    # junitxml writes its file in pytest_sessionfinish, which has run by now.
    target = os.environ.get("HEARTBEAT_FIX_PARITY_SNAPSHOT")
    cell = os.environ.get("HEARTBEAT_FIX_CELL")
    xmlpath = getattr(config.option, "xmlpath", None)
    if not (target and cell and xmlpath and os.path.isfile(xmlpath)):
        return
    partial = Path(target) / f".{cell}.xml.partial"
    shutil.copyfile(xmlpath, partial)
    partial.replace(Path(target) / f"{cell}.xml")
