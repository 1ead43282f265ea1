"""
How the package logs: through loggers made the way Airflow makes its own classes' loggers, named
``airflow_heartbeat_fix`` (the start line) and ``airflow_heartbeat_fix.<module>`` (a fix acting), so
``[logging] namespace_levels`` and an operator's log filters apply to them as to Airflow's.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

LOGGER_NAME = "airflow_heartbeat_fix"


@functools.cache
def fix_logger(name: str = LOGGER_NAME) -> Any:
    """
    The logger ``name``, made as Airflow makes its classes' (Airflow 3's ``[logging] namespace_levels``
    filters the structlog loggers ``LoggingMixin`` hands out, not ``logging.getLogger()`` ones; on a
    release that logs through the standard library it is one).
    """
    try:
        from airflow.utils.log.logging_mixin import LoggingMixin
    except ImportError:
        return logging.getLogger(name)

    class _Logs(LoggingMixin):
        _logger_name = name

    return _Logs().log
