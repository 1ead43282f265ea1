"""
A small stand-in for Apache Airflow's ``tests_common`` (``devel-common/src/tests_common`` upstream).

Test modules written for Airflow's own suite import ``tests_common.pytest_plugin`` fixtures and the
``tests_common.test_utils.db`` helpers. ``tests/conftest.py`` puts this package on ``sys.path`` only
when the real one is not importable, so the same module runs here and, unchanged, inside Breeze.
It offers only what this repository's tests use, with upstream's names and contracts.
"""
