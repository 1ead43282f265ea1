"""An Airflow plugin entry so ``airflow plugins`` shows that this package is installed."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class HeartbeatFixPlugin(AirflowPlugin):
    """Carries nothing; activation happens through the ``airflow.policy`` entry point."""

    name = "heartbeat_fix"
