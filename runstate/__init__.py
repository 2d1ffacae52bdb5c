"""runstate: durable state for a data platform, on Dagster and Spark."""

__version__ = "0.1.0"
