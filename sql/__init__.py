"""The SQL of runstate, shipped in the wheel as the package `runstate._sql`.

pyproject.toml / setup.py map this folder onto `runstate._sql`, so an installed runstate reads the same
files as a checkout, through importlib.resources (`runstate.sqlfiles`), never by a path. There is no
Python here beyond this marker: the layout is `<backend>/<domain>/NNN_name.sql` (versioned DDL, one
ledger per domain) and `<backend>/<domain>/<name>.sql` (named queries).
"""
