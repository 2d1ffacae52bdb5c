"""A moto server for the deployment tests that can hold chosen requests: a flush caught mid-way.

The deployment uses it as its AWS endpoint (an external one, for `services up`). When armed with a
predicate, a matching request waits in the server until the test disarms the gate; it then fails with
503 (its client has usually been killed by then). Everything else goes through to moto at once.
The client of a held request is found by its TCP port, which names its process exactly.
It must stay the only moto inside the pytest process: moto keeps its tables in module globals, so a second
in-process server would share them (every other test's moto is a `MotoProcess`, runstate_tests/conftest.py,
but the moto serializer's test, which compares moto's two writers in its own process and drops its table).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runstate.services.moto_server import buffer_request_body, kept_alive_request_handler, serialized_moto_app

Predicate = Callable[[dict[str, Any], bytes], bool]


class Gate:
    """WSGI middleware in front of the serialised moto app (outside its lock, so nothing else waits)."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._changed = threading.Condition()
        self._predicate: Predicate | None = None
        self.held_client_ports: list[int] = []

    def arm(self, predicate: Predicate) -> None:
        with self._changed:
            self._predicate = predicate
            self.held_client_ports.clear()

    def disarm(self) -> None:
        with self._changed:
            self._predicate = None
            self._changed.notify_all()

    def wait_for_held(self, timeout: float) -> int:
        """The client port of the first held request."""
        with self._changed:
            if not self._changed.wait_for(lambda: self.held_client_ports, timeout=timeout):
                raise AssertionError(f"no request matched the gate within {timeout:.0f} s")
            return self.held_client_ports[0]

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        predicate = self._predicate
        if predicate is not None:
            buffer_request_body(environ)
            body = environ["wsgi.input"].getvalue()
            if predicate(environ, body):
                with self._changed:
                    self.held_client_ports.append(int(environ["REMOTE_PORT"]))
                    self._changed.notify_all()
                    self._changed.wait_for(lambda: self._predicate is None)
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"held by the test, then dropped"]
        return self._app(environ, start_response)


class GatedMotoServer:
    def __init__(self) -> None:
        from werkzeug.serving import make_server

        self.gate = Gate(serialized_moto_app())
        handler = kept_alive_request_handler()
        self._server = make_server("127.0.0.1", 0, self.gate, threaded=True, request_handler=handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="gated-moto", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def stop(self) -> None:
        self.gate.disarm()
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()


def process_of_client(client_port: int, server_port: int) -> int:
    """The pid holding the loopback TCP connection client_port -> server_port."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == client_port and int(remote.split(":")[1], 16) == server_port:
            inode = fields[9]
            break
    if inode is None:
        raise AssertionError(f"no TCP connection from port {client_port} to {server_port}")
    target = f"socket:[{inode}]"
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(str(fd.readlink()) == target for fd in fd_dir.iterdir()):
                return int(fd_dir.parent.name)
        except OSError:
            continue  # gone, or not ours to read
    raise AssertionError(f"no process holds {target}")
