"""Parity between this package's tests and upstream Airflow's: expectations and the report built on them."""
