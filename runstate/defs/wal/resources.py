"""`WalResource` (resource key `wal`): where the WAL table and the blob bucket live, plus lazy boto3 clients."""

from __future__ import annotations

import threading
from typing import Any

from pydantic import PrivateAttr, model_validator

from runstate import wiring
from runstate.defs.config_fields import config_of, config_resource
from runstate.wal import BlobStore, WalTable
from runstate.wal.config import WalConfig


class WalResource(config_resource(WalConfig)):
    """The dataset WAL's AWS side: a DynamoDB table with a stream, and an S3 bucket for blobs.

    Configuration only: the fields of `WalConfig` (derived from it); the deployment's values come
    from `runstate.defs.resources.wal_resource()`. Clients are created on first use, through
    `runstate.wiring`, never at import or definition time.
    """

    @model_validator(mode="after")
    def _a_valid_config(self) -> WalResource:
        self.config()  # WalConfig's rules (a ValueError names the fields)
        return self

    _clients: dict = PrivateAttr(default_factory=dict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def config(self) -> WalConfig:
        return config_of(self, WalConfig)

    def _client(self, service: str) -> Any:
        with self._lock:
            if service not in self._clients:
                self._clients[service] = wiring.aws_client(service, self.config())
            return self._clients[service]

    def dynamodb_client(self):
        return self._client("dynamodb")

    def streams_client(self):
        return self._client("dynamodbstreams")

    def s3_client(self):
        return self._client("s3")

    def wal_table(self) -> WalTable:
        return wiring.wal_table(self.config(), self.dynamodb_client())

    def blob_store(self) -> BlobStore:
        return wiring.blob_store(self.config(), self.s3_client())
