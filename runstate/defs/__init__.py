"""The Dagster shell: one folder per domain, merged by build_definitions in runstate/defs/location.py."""
