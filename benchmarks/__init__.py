"""Benchmarks run from the repository root with an Airflow venv's Python (``python -m benchmarks.<name>``)."""
