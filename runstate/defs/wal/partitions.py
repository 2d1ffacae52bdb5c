"""The dynamic partition set of the WAL domain: one partition per dataset id."""

import dagster as dg

DATASETS = "datasets"

datasets_partitions = dg.DynamicPartitionsDefinition(name=DATASETS)
