"""The dynamic partition set of the WAL domain: one partition per dataset id."""

import dagster as dg

DATASETS = "datasets"

datasets_partitions = dg.DynamicPartitionsDefinition(name=DATASETS)

# Run tags. dagster.yaml limits `runstate/dataset` to one in-progress run per value, so one dataset
# never has two flushes (or a flush and a compaction) running at once.
DATASET_TAG = "runstate/dataset"
BATCH_TAG = "runstate/wal_batch"
MAX_RUNTIME_TAG = "dagster/max_runtime"
