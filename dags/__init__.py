"""
The demo's reproduction Dags. This folder ships in the wheel as ``airflow_heartbeat_fix.demo.dags``
(``package-dir`` in pyproject.toml), so an installed demo reads them with ``importlib.resources``.
"""
