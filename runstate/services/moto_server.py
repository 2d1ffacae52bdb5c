"""moto's HTTP server with DynamoDB's single-item atomicity: one request at a time inside moto.

moto's `moto_server` runs werkzeug threaded, and its DynamoDB backend has no lock: `put_item` reads
the current item, evaluates the condition expression and only then writes. Two conditional PutItems
on one key can therefore both succeed on a busy server (two WAL appends were seen to get the same
seq), which DynamoDB never allows. S3 conditional puts (`IfNoneMatch`, `IfMatch`) have the same
read-check-write shape.

`SerializedApp` keeps moto's threaded server (slow clients and keep-alive connections don't block
each other) but runs moto itself under one lock: the request body is read before the lock is
taken, and the response is produced in full before it is released, so one stalled or killed client
never holds up the others. moto is CPU-bound under the GIL, so the lock costs little throughput.

Why werkzeug's threaded server, speaking HTTP/1.1: each client connection keeps one thread for all its
requests (botocore keeps its connections alive). Out of the box it closes every connection after one
response, so every request paid a TCP connection and a thread, on both sides; kept alive, the WAL tests
(`runstate_tests/wal` and the WAL scenarios, -n 3) took 205 CPU-s of the host instead of 274 and their
moto servers 31.7 instead of 44.2. waitress (keep-alive, a thread pool) was a third faster per request
on a quiet machine and two to three times slower on a loaded one (the WAL scenarios' model check: 159 s
against 60 s beside three busy processes), since each request crosses from its event loop to a worker
thread and back, and each crossing waits for a CPU.

Run it as `python -m runstate.services.moto_server -H 127.0.0.1 -p PORT` (the tests do, one process per
pytest worker); the benches start it in-process with `SerializedMotoServer`, which has the interface of
moto's `ThreadedMotoServer`. moto keeps its tables in module globals: two servers in one process share them.

Where moto is still kinder than AWS, and why the code does not lean on it:
- Global secondary indexes are updated with the write here; on DynamoDB they lag (usually under a
  second). The Pending and Kind indexes are read by wal_sensor's sweep (a backstop: new rows come from
  the stream), a lingering flush run's poll (a new row is taken on a later poll; a row already applied
  but still listed is skipped by the flush and does not count as work), the merge sensor and the
  compaction schedule (a stale LastAppliedSeq only delays them a tick) and the status and lag reports.
  Every flush decision reads the table itself with ConsistentRead. Tests that tick right after an
  append (and the status tests) count on the prompt index here; against AWS they would need to poll.
- Stream records are readable as soon as the write returns, and a table has one stream shard that never
  closes; on DynamoDB records arrive within about a second and shards roll over every few hours. The
  stream reader follows new and closed shards, and the Pending sweep finds anything it misses.
- Nothing is throttled here. Throttles and lost responses are injected in the tests on real boto3
  clients (`runstate_tests/wal/faults.py`), and every flush step is idempotent.
"""

from __future__ import annotations

import argparse
import functools
import io
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class SerializedApp:
    """A WSGI middleware that lets one request at a time into the wrapped application."""

    def __init__(self, app: WsgiApp) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        buffer_request_body(environ)
        with self._lock:
            result = self._app(environ, start_response)
            try:
                body = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        return [body]


def buffer_request_body(environ: dict[str, Any]) -> None:
    """Read the whole body off the socket before the lock, so a slow upload never holds it."""
    from werkzeug.wsgi import get_input_stream

    body = get_input_stream(environ, safe_fallback=True).read()
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    # The buffer ends where the body ends, so readers may read to EOF whatever the framing was (a chunked
    # upload has no Content-Length, and werkzeug then reads nothing unless the input is marked terminated).
    environ["wsgi.input_terminated"] = True


def serialized_moto_app() -> SerializedApp:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    cache_moto_lookups()
    serialize_attribute_values_directly()
    return SerializedApp(DomainDispatcherApplication(create_backend_app))


def cache_moto_lookups() -> None:
    """Cache two answers moto recomputes per request and that cannot change while it runs: the list of its
    backend folders (an os.listdir and a stat per folder, to see whether the Host names a service) and the
    method names of a response class (inspect.getmembers, to find the action's handler). A GetItem on a
    quiet machine: the server's CPU a sixth less, 9.0 ms per request down to 7.5."""
    import moto.backends
    import moto.core.responses

    if not hasattr(moto.backends.list_of_moto_modules, "cache_info"):
        modules = moto.backends.list_of_moto_modules
        moto.backends.list_of_moto_modules = functools.cache(lambda: tuple(modules()))
    if not hasattr(moto.core.responses.method_names_from_class, "cache_info"):
        moto.core.responses.method_names_from_class = functools.cache(
            moto.core.responses.method_names_from_class
        )


def serialize_attribute_values_directly() -> None:
    """Write a DynamoDB AttributeValue (a dict such as {"S": "x"}) through its members that are present.

    moto's JSON serializer walks every member of a structure's model, and for each builds a lookup context
    and tries five aliases; an AttributeValue has ten members, of which one is set. A stream page of the
    WAL (GetRecords, 25 KB) took 19 ms of the server's CPU, over half of a WAL test's moto time. A dict
    whose keys are all AttributeValue members, with no response transformer set, is written member by
    member as that walk writes it (runstate_tests/services/test_moto_serializer.py compares the two);
    anything else takes moto's walk."""
    from moto.core.serialize import BaseJSONSerializer

    walk = BaseJSONSerializer._serialize_type_structure
    if hasattr(walk, "moto_walk"):  # done already in this process
        return

    def serialize_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        members = shape.members
        direct = (
            shape.name == "AttributeValue" and key and type(value) is dict and value.keys() <= members.keys()
        )
        if not direct or getattr(self._value_picker, "response_transformers", None):
            walk(self, serialized, value, shape, key)
            return
        wrapper: dict[str, Any] = {}
        for member_key, member_shape in members.items():
            member_value = value.get(member_key)
            if member_value is not None:
                member_shape.parent = shape
                self._serialize(wrapper, member_value, member_shape, member_key)
        self._default_serialize(serialized, wrapper, shape, key)

    serialize_structure.moto_walk = walk  # type: ignore[attr-defined]
    BaseJSONSerializer._serialize_type_structure = serialize_structure  # type: ignore[method-assign]


def kept_alive_request_handler() -> type:
    """moto's request handler, serving each connection's requests until it closes (see the module)."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler

    class KeptAliveHandler(MotoRequestHandler):
        protocol_version = "HTTP/1.1"  # werkzeug then keeps the connection after a response
        timeout = 60  # s idle: the connection is closed and its thread ends (a client then reconnects)

    return KeptAliveHandler


def make_moto_server(host: str, port: int) -> Any:
    """A threaded werkzeug server (moto's request handler) around the serialised moto application."""
    from werkzeug.serving import make_server

    handler = kept_alive_request_handler()
    return make_server(host, port, serialized_moto_app(), threaded=True, request_handler=handler)


class SerializedMotoServer:
    """In-process, on a thread: the start/get_host_and_port/stop interface of moto's ThreadedMotoServer."""

    def __init__(self, ip_address: str = "127.0.0.1", port: int = 0) -> None:
        self._server = make_moto_server(ip_address, port)
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def get_host_and_port(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="moto's server, one request at a time inside moto.")
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=5000)
    args = parser.parse_args(argv)
    server = make_moto_server(args.host, args.port)
    # serve_forever returns on shutdown(); SIGTERM/SIGINT end the process the way moto_server does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    server.serve_forever()


if __name__ == "__main__":
    main()
