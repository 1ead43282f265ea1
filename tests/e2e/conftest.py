"""
``tests/e2e`` runs only when asked for by path (``pytest tests/e2e``): the full demo takes minutes, so the
main test matrix (``pytest tests``) does not collect it. Nothing here is skipped; it is not collected.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

E2E_DIR = Path(__file__).resolve().parent


def _requested(config: pytest.Config) -> bool:
    """Whether a command-line path points at this directory or into it."""
    base = config.invocation_params.dir
    for arg in config.args:
        path = (base / arg.split("::", 1)[0]).resolve()
        if path == E2E_DIR or E2E_DIR in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if E2E_DIR in collection_path.resolve().parents and not _requested(config):
        return True
    return None
