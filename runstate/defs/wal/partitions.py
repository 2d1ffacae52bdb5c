"""The dynamic partition set of the WAL domain: one partition per dataset id."""

import dagster as dg

DATASETS = "datasets"

datasets_partitions = dg.DynamicPartitionsDefinition(name=DATASETS)

# Run tags. dagster.yaml limits `runstate/wal_shard` to one in-progress run per value: a dataset always
# maps to the same shard, so it never has two flushes (or a flush and a compaction) running at once.
SHARD_TAG = "runstate/wal_shard"
BATCH_TAG = "runstate/wal_batch"  # the shard plan's key: every run (and retry) of one plan carries it
DATASET_TAG = "runstate/dataset"
MAX_RUNTIME_TAG = "dagster/max_runtime"
