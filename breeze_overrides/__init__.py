"""Overrides for Apache Airflow's Breeze dev tool (``dev/breeze``); see README.md.

Not part of the ``airflow-heartbeat-fix`` distribution.
"""
