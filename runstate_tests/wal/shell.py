"""Fixtures and helpers of the WAL shell tests (Dagster layer and CLI): a WAL table + bucket of the test's
own on moto's server, a Dagster instance on disk (so a child process can share it), and Definitions
bound to both. Test modules import the fixtures from here (`from runstate_tests.wal.shell import ...`).

Run as a module (`python -m runstate_tests.wal.shell SPEC`) it is the child process of the crash tests:
it ticks wal_sensor against the shared instance with a client that blocks inside the flush at a chosen
point, after printing READY, so the parent can SIGKILL it mid-flush.
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from botocore.exceptions import ClientError

from runstate.defs.wal import build_defs
from runstate.defs.wal.jobs import build_flush_job
from runstate.defs.wal.resources import WalResource
from runstate.wal import BlobStore, Change, WalProducer, ensure_blob_bucket, ensure_wal_table
from runstate.wal import layout as t
from runstate.wal.table import WalTable

# Fast retries so a fault-then-recover run takes milliseconds; the production policy is tested on its own.
FAST_RETRY_POLICY = dg.RetryPolicy(max_retries=3, delay=0.01, backoff=dg.Backoff.EXPONENTIAL)
# The resource settings of the tests: ticks are driven back to back (no run interval, no linger: a run
# flushes its plan and ends), the flush of a dataset is tried 3 times with millisecond waits, and 2 shards
# so multi-dataset tests span both. On-demand runs (the sensor plans each run's batches): the shell's
# model checks drive the plan tick by tick; always-on runs have tests of their own (test_wal_always_on).
TEST_RESOURCE = dict(
    min_run_interval_s=0, flush_linger_s=0, flush_retry_delay_s=0.01, flush_shards=2, flush_always_on=False
)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class WalWorld:
    endpoint: str
    table: str
    bucket: str
    prefix: str
    home: Path
    dynamodb: Any
    s3: Any

    def resource(self, resource_class: type[WalResource] = WalResource, **overrides: Any) -> WalResource:
        config: dict[str, Any] = dict(
            endpoint_url=self.endpoint,
            region="us-east-1",
            table=self.table,
            bucket=self.bucket,
            prefix=self.prefix,
            **TEST_RESOURCE,
        )
        config.update(overrides)
        return resource_class(**config)

    def defs(self, resource: WalResource | None = None) -> dg.Definitions:
        return build_defs(wal=resource or self.resource(), flush_job=build_flush_job(FAST_RETRY_POLICY))

    def producer(self) -> WalProducer:
        return WalProducer(self.dynamodb, self.table)

    def append(self, dataset_id: str, key: str, value: Any, client_token: str | None = None) -> int:
        return self.producer().append(dataset_id, [Change.upsert(key, value)], client_token=client_token)

    def rows(self, dataset_id: str) -> list[dict[str, Any]]:
        """Every WAL row (seq >= 1) of a dataset, strongly consistent."""
        return WalTable(self.dynamodb, self.table).query_rows(dataset_id)

    def statuses(self, dataset_id: str) -> dict[int, str]:
        return {int(item[t.SEQ_NO]["N"]): item[t.STATUS_IDX]["S"] for item in self.rows(dataset_id)}

    def blob_keys(self, dataset_id: str, kind: str = "delta") -> list[str]:
        return BlobStore(self.s3, self.bucket, self.prefix).keys(dataset_id, kind)


@pytest.fixture
def world(moto_endpoint: str, dynamodb: Any, s3: Any, tmp_path: Path) -> Iterator[WalWorld]:
    table = unique_name("wal")
    bucket = unique_name("blobs")
    ensure_wal_table(dynamodb, table)
    ensure_blob_bucket(s3, bucket)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    yield WalWorld(moto_endpoint, table, bucket, "datasets/", home, dynamodb, s3)
    dynamodb.delete_table(TableName=table)


@pytest.fixture
def instance(world: WalWorld) -> Iterator[dg.DagsterInstance]:
    """A real on-disk instance (sqlite storage under the test's tmp dir): a child process can open it too."""
    with dg.DagsterInstance.from_config(str(world.home)) as inst:
        yield inst


# --- faults on the real clients -------------------------------------------------------------------

# fault key -> how many more delta-blob PutObject calls must fail (shared by every copy of the resource).
PUT_FAILURES: dict[str, int] = {}


def _fail_delta_put(fault_key: str, params: dict[str, Any], **_: Any) -> None:
    if "/delta/" in params.get("Key", "") and PUT_FAILURES.get(fault_key, 0) > 0:
        PUT_FAILURES[fault_key] -= 1
        raise ClientError(
            {"Error": {"Code": "ServiceUnavailable", "Message": "injected: S3 is down"}}, "PutObject"
        )


class FlakyS3WalResource(WalResource):
    """The real resource whose real S3 client refuses the next PUT_FAILURES[fault_key] delta puts."""

    fault_key: str

    def s3_client(self):
        client = super().s3_client()
        if not getattr(client, "_runstate_fault_hook", False):
            client.meta.events.register(
                "before-parameter-build.s3.PutObject", lambda **kw: _fail_delta_put(self.fault_key, **kw)
            )
            client._runstate_fault_hook = True
        return client


_READY_LOCK = threading.Lock()
_READY_SAID: list[bool] = []


class HangingWalResource(WalResource):
    """For the crash child: blocks forever at `hang_at`, after printing READY, so it can be killed there.

    hang_at = "after_delta_put": the delta blob is stored, the manifest not yet switched.
    hang_at = "mid_marks": the manifest is switched and 3 rows are marked Applied, the rest not.
    """

    hang_at: str

    def _hang(self) -> None:
        with _READY_LOCK:  # several flush threads may arrive here: announce once
            if not _READY_SAID:
                _READY_SAID.append(True)
                sys.__stdout__.write("READY\n")
                sys.__stdout__.flush()
        threading.Event().wait()  # until SIGKILL

    def s3_client(self):
        client = super().s3_client()
        if self.hang_at == "after_delta_put" and not getattr(client, "_runstate_hook", False):
            # before-parameter-build sees the params, after-call only the request context: pass the key through it.
            def remember_key(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
                context["runstate_key"] = params.get("Key", "")

            def after_put(context: dict[str, Any], **_: Any) -> None:
                if "/delta/" in context.get("runstate_key", ""):
                    self._hang()

            client.meta.events.register("before-parameter-build.s3.PutObject", remember_key)
            client.meta.events.register("after-call.s3.PutObject", after_put)
            client._runstate_hook = True
        return client

    def dynamodb_client(self):
        client = super().dynamodb_client()
        if self.hang_at == "mid_marks" and not getattr(client, "_runstate_hook", False):
            lock, marks = threading.Lock(), [0]

            def before_update(params: dict[str, Any], **_: Any) -> None:
                if params["Key"][t.SEQ_NO]["N"] == "0":
                    return
                with lock:
                    marks[0] += 1
                    mine = marks[0]
                if mine > 3:
                    self._hang()

            client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", before_update)
            client._runstate_hook = True
        return client


def crash_child_main(argv: list[str]) -> None:
    """Child process: open the shared instance and tick wal_sensor with a hanging client."""
    from runstate.commands.ticking import tick_sensor

    spec = json.loads(argv[0])
    resource = HangingWalResource(**spec["resource"], **TEST_RESOURCE)
    defs = build_defs(wal=resource, flush_job=build_flush_job(FAST_RETRY_POLICY))
    with dg.DagsterInstance.from_config(spec["home"]) as inst:
        tick_sensor("wal_sensor", defs=defs, instance=inst)
    print("FINISHED", flush=True)


if __name__ == "__main__":
    crash_child_main(sys.argv[1:])
