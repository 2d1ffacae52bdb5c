"""moto's HTTP server for DynamoDB and S3, on a free loopback port, detached from the CLI.

It is our `runstate.services.moto_server`, not plain `moto_server`: that one lets two conditional writes
on one item both succeed under load, which DynamoDB never does (see that module).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from runstate import defaults
from runstate.services.http import http_answers
from runstate.services.state import (
    LOOPBACK,
    ServiceRecord,
    embedded_service,
    external_record,
    is_running,
    require_module,
)

SERVER_MODULE = "runstate.services.moto_server"

TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": defaults.AWS_REGION,
}


def healthy(url: str) -> bool:
    return http_answers(f"{url.rstrip('/')}/moto-api/")


def moto_argv(port: int) -> list[str]:
    return [sys.executable, "-m", SERVER_MODULE, "-H", LOOPBACK, "-p", str(port)]


def is_serialized(record: ServiceRecord) -> bool:
    """Whether a recorded moto is our serialised server (an older `up` started plain moto_server)."""
    try:
        cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return is_running(record) and SERVER_MODULE.encode() in cmdline


def ensure_moto(
    caller_env: Mapping[str, str], previous: ServiceRecord | None, *, port: int | None = None
) -> ServiceRecord:
    if url := caller_env.get("RUNSTATE_AWS_ENDPOINT_URL"):
        return external_record(
            "moto",
            url,
            answers=http_answers(url),
            fix=f"RUNSTATE_AWS_ENDPOINT_URL={url} does not answer. Start it, fix the URL, "
            "or unset it to let `runstate services up` start moto.",
        )
    require_module("moto", ("moto", "flask", "flask_cors"), "moto[server]")
    if previous is not None and previous.started_by_us and not is_serialized(previous):
        previous = None  # replaced by a serialised server; `up` stops the old one once the new one answers
    return embedded_service(
        "moto", previous, port=port, port_option="--moto-port", argv=moto_argv, healthy=healthy
    )


def create_wal_resources(url: str, table: str, bucket: str, region: str) -> str:
    """The WAL table and blob bucket, through the WAL package when it exists (it is another domain's).

    In the region runstate will look in (moto keeps one set of tables per region)."""
    try:
        from runstate.wal import ensure_blob_bucket, ensure_wal_table
    except ImportError:
        return "skipped the WAL table and blob bucket: runstate.wal is not there yet"
    import boto3

    client_args = dict(
        endpoint_url=url,
        region_name=region,
        aws_access_key_id=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    ensure_wal_table(boto3.client("dynamodb", **client_args), table)
    ensure_blob_bucket(boto3.client("s3", **client_args), bucket)
    return f"WAL table {table!r} and blob bucket {bucket!r} are ready"
