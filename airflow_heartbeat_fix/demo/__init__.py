"""
The demo: the operator's self-check, ``airflow-heartbeat-fix demo`` (:mod:`.cli`).

This module imports nothing: the demo Dags import :mod:`.records` inside the Dag processor, and that
import must not load the demo's command line, its process handling (psutil) or its reports.
"""
