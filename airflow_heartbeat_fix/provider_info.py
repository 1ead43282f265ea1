"""
``apache_airflow_provider`` entry point: declares ``[heartbeat_fix]`` to Airflow.

With it, ``airflow config list`` shows the section with its descriptions and defaults, and
``airflow providers list`` shows the package. Nothing else is registered.
"""

from __future__ import annotations

from typing import Any

from airflow_heartbeat_fix import __version__, summary

MAX_ATTEMPTS_DESCRIPTION = (
    "How many file processors may start one Dag processor callback request, or be handed it and exit "
    "without starting it, before the request is deleted without running (an ERROR line and the "
    "heartbeat_fix.callback.abandoned counter say so). A callback that kills its own file processor (out "
    "of memory, past dag_file_processor_timeout) would otherwise run forever. Read when the Dag processor "
    "starts."
)

ENABLED_DESCRIPTION = (
    "Run the scheduler with the fixes this Airflow needs (checked at scheduler start; see "
    "`airflow-heartbeat-fix status`). False runs Airflow's own classes. A value that is not a boolean "
    "is logged and treated as True, so a typo never silently removes a fix."
)


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-heartbeat-fix",
        "name": "Airflow heartbeat fix",
        "description": summary(),
        "versions": [__version__],
        "config": {
            "heartbeat_fix": {
                "description": "airflow-heartbeat-fix: scheduler and Dag processor fixes, installed by pip.",
                "options": {
                    "enabled": {
                        "description": ENABLED_DESCRIPTION,
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": "False",
                        "default": "True",
                    },
                    "callback_max_attempts": {
                        "description": MAX_ATTEMPTS_DESCRIPTION,
                        "version_added": "0.4.0",
                        "type": "integer",
                        "example": "5",
                        "default": "3",
                    },
                },
            },
        },
    }
