"""Pytest configuration for ``breeze_overrides``.

``tests_upstream_style/`` holds modules meant to be copied into an Airflow checkout and run with Breeze
(they use Airflow's own fixtures such as ``dag_maker``); never collect them here.
"""

from __future__ import annotations

collect_ignore = ["tests_upstream_style"]
