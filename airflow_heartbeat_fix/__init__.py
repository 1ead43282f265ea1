"""
Drop-in fixes for two Apache Airflow 3.x scheduler bugs.

Importing this package does nothing heavy: the ``airflow.policy`` entry point only registers a lazy
import hook (see :mod:`airflow_heartbeat_fix.policy`), and the fixed classes are built when the
scheduler command is imported.
"""

from __future__ import annotations

__version__ = "0.3.0"
