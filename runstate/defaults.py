"""Defaults that several layers share, each written once.

A plain module that imports nothing: the core domains (eventstore, wal, maintenance), the datastores,
the settings and the dev services all read these, and none of them may import the others for it. A
default only one domain uses lives in that domain (the snapshot interval in eventstore/snapshots.py,
the maintenance lease in maintenance/models.py); the settings (`runstate.config.Settings`) and the
domains' configs read theirs from here or from there.
"""

# The schema of every domain's Postgres tables (RUNSTATE_SCHEMA), and the run history's lake namespace
# when RUNSTATE_HISTORY_NAMESPACE is unset (the schema lower-cased).
SCHEMA = "runstate"
# The Snowflake event store's schema (SNOWFLAKE_SCHEMA): Snowflake folds unquoted names to upper case.
SNOWFLAKE_SCHEMA = SCHEMA.upper()
# Connections a datastore holds at most (Postgres's pool, Snowflake's slots), unless told otherwise.
POOL_SIZE = 8
# The AWS region of the WAL's table and bucket (AWS_DEFAULT_REGION), and of the Spark tasks' S3 clients.
AWS_REGION = "us-east-1"
