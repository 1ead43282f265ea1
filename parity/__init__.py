"""
Parity between this package's tests and upstream Airflow's: ``expectations.toml`` declares which release
carries which bug and which test catches it; ``python -m parity --results DIR`` checks every declared
test in every cell (release x database x fixed/stock) of a test run against it.
"""
