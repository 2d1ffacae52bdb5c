"""moto's server in a child process, as `runstate services up` runs it."""

from __future__ import annotations

import functools
import subprocess
import tempfile
import time
from typing import Any


class MotoProcess:
    """Our serialised moto server (`runstate.services.moto_server`) in a child process, on a free port.

    A process, not a thread: moto keeps its tables in module globals, so two moto servers in one pytest
    process share every table and bucket (the deployment tests' gated moto is one). Plain moto_server
    lets two conditional PutItems on one key both succeed under load, which DynamoDB never does;
    runstate_tests/services/test_moto_atomicity.py shows it."""

    def __init__(self) -> None:
        from runstate.services.moto import healthy, moto_argv
        from runstate.services.state import free_port

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()  # its output: a pipe nobody reads could fill and stall it
        self.process = subprocess.Popen(moto_argv(port), stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not healthy(self.url):
            if self.process.poll() is not None:
                self.log.seek(0)
                raise AssertionError(f"moto exited: {self.log.read().decode(errors='replace')[-2000:]}")
            assert time.monotonic() < deadline, "moto did not answer within 300 s"
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self.log.close()


@functools.cache
def moto_client(url: str, service: str) -> Any:
    """One boto3 client per moto server and service for a test's own reads and appends. Clients are
    thread-safe, and a new one costs about 10 ms of CPU: the deployment tests made one per dataset in
    every poll (100 datasets, every 2 s)."""
    import boto3

    return boto3.client(
        service,
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
