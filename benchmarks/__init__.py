"""Benchmark commands of airflow-heartbeat-fix (``python -m benchmarks.<name>``); not part of the package."""
