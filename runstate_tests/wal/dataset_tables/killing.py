"""Killing a merge in the middle of its MERGE: a stalling S3 proxy, and the child process it stalls.

The proxy forwards every request to moto's server; once armed, it holds the first GET of a delta blob
(a Spark task reading its changes, so the MERGE statement is executing) and reports it, so the test
can SIGKILL the child's whole process group (Python driver and JVM) at that moment.

Run as a script it is that child: it builds its own Spark session on the test's catalog and warehouse,
prints MERGING, and merges one dataset through the proxy.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[3]


class StallingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.armed = threading.Event()
        self.stalled = threading.Event()
        self.release = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                if self.command == "GET" and "/delta/" in self.path and proxy.armed.is_set():
                    proxy.stalled.set()
                    proxy.release.wait(600)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = proxy.upstream.netloc
                conn.request(self.command, self.path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class MergeChild:
    """A child process merging one dataset; killed with its JVM by SIGKILL to its process group."""

    def __init__(self, args: dict[str, Any]) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runstate_tests.wal.dataset_tables.killing", json.dumps(args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )

    def wait_for(self, line: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            got = self.process.stdout.readline()
            if got.strip() == line:
                return
            if not got and self.process.poll() is not None:
                raise AssertionError(f"the merge child exited ({self.process.returncode}) before {line}")
        raise AssertionError(f"the merge child never printed {line}")

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(60)


def _child(args: dict[str, Any]) -> None:
    from runstate.spark import SparkSettings, build_session
    from runstate.wal.dataset_tables import BlobLocation, merge_dataset

    spark = build_session(
        SparkSettings(
            pg_url=args["pg_url"], warehouse_dir=Path(args["warehouse"]), app_name="runstate-merge-child"
        )
    )
    spark.sparkContext.setLogLevel("OFF")
    location = BlobLocation(bucket=args["bucket"], prefix=args["prefix"], endpoint_url=args["endpoint"])
    print("MERGING", flush=True)
    merge_dataset(spark, location, args["dataset_id"])
    print("DONE", flush=True)
    time.sleep(600)  # wait to be killed: the test decides when this process ends


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
