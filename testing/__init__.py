"""
What the tests and the benchmarks share: Airflow's environment and metadata database, Dags
stored as the Dag processor stores them, a scheduler runner wired as ``airflow scheduler`` wires it,
hung workers' rows, statement counting, races against the purge and real scheduler processes.

Not in the wheel (``pyproject.toml`` lists the shipped packages); in the sdist beside ``tests/``. It
imports neither ``tests``, ``benchmarks`` nor the demo, and nothing of Airflow at module level:
:func:`testing.environment.configure_airflow` must run before Airflow is imported.
"""
