"""
Upstream parity: every declared test, in every cell of the matrix (release x database x fixed/stock),
checked against ``expectations.toml``. Run it as ``python -m parity --results DIR``.
"""
