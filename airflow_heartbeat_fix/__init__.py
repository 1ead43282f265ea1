"""
Drop-in fixes for how the Apache Airflow 3.x scheduler recovers when a worker or a scheduler stops
heartbeating; :data:`airflow_heartbeat_fix.detection.FIXES` names them.

Importing this package does nothing heavy: the ``airflow.policy`` entry point only registers a lazy
import hook (see :mod:`airflow_heartbeat_fix.policy`), and the fixed classes are built when the
scheduler command is imported.
"""

from __future__ import annotations

try:  # written by setuptools-scm from the repository when the package is built or installed
    from airflow_heartbeat_fix._version import __version__
except ImportError:  # a source tree on sys.path that was never built or installed
    __version__ = "0+unknown"


def summary() -> str:
    """What the package fixes, in one line: ``description`` in pyproject.toml, read from its metadata."""
    from importlib import metadata

    try:
        return str(metadata.metadata("airflow-heartbeat-fix")["Summary"])
    except (metadata.PackageNotFoundError, KeyError):  # a source tree that was never installed
        return "Drop-in fixes for the Airflow 3.x scheduler's recovery from stopped heartbeats."
