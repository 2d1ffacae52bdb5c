"""The Dagster shell: one folder per domain, merged in runstate/definitions.py."""
