"""The live health read: `GET /tables/{database}/{table}/health` on a small stdlib HTTP server.

The JSON is the same as `runstate health` prints. Identifiers are validated before anything runs
(400); a table the catalog does not have is a 404. `?cached=true` answers from the newest stored
health row instead of analyzing the table now.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
from collections.abc import Callable
from datetime import datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from runstate.maintenance.errors import InvalidIdentifier, MaintenanceError, TableNotFound
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.models import HealthSnapshot

log = logging.getLogger(__name__)

_ROUTE = re.compile(r"/tables/([^/]+)/([^/]+)/health")
Analyze = Callable[[TableRef], HealthSnapshot]
Latest = Callable[[TableRef], "HealthSnapshot | None"]


def jsonable(value: Any) -> Any:
    """Dataclasses, tuples and datetimes as plain JSON values (the CLI prints the same)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def health_json(snapshot: HealthSnapshot) -> str:
    return json.dumps(jsonable(snapshot), indent=2, sort_keys=True)


class HealthServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], analyze: Analyze, latest: Latest) -> None:
        super().__init__(address, _Handler)
        self.analyze, self.latest = analyze, latest
        self.analyze_lock = threading.Lock()  # one analysis at a time on the shared Spark session


class _Handler(BaseHTTPRequestHandler):
    server: HealthServer

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        url = urlsplit(self.path)
        match = _ROUTE.fullmatch(url.path)
        if match is None:
            return self._reply(
                HTTPStatus.NOT_FOUND, {"error": "not found; use /tables/{database}/{table}/health"}
            )
        try:
            ref = TableRef(unquote(match.group(1)), unquote(match.group(2)))
        except InvalidIdentifier as exc:
            return self._reply(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        cached = parse_qs(url.query).get("cached", ["false"])[-1].lower() in ("1", "true", "yes")
        try:
            snapshot = self._read(ref, cached)
        except TableNotFound as exc:
            return self._reply(HTTPStatus.NOT_FOUND, {"error": str(exc)})
        except MaintenanceError as exc:
            return self._reply(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)})
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the server
            log.exception("health of %s failed", ref.key)
            return self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})
        if snapshot is None:
            return self._reply(HTTPStatus.NOT_FOUND, {"error": f"no stored health for {ref.key}"})
        self._send(HTTPStatus.OK, health_json(snapshot))

    def _read(self, ref: TableRef, cached: bool) -> HealthSnapshot | None:
        if cached:
            return self.server.latest(ref)
        with self.server.analyze_lock:
            return self.server.analyze(ref)

    def _reply(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        self._send(status, json.dumps(body, sort_keys=True))

    def _send(self, status: HTTPStatus, text: str) -> None:
        payload = (text + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        log.info("%s %s", self.address_string(), format % args)


def make_server(host: str, port: int, analyze: Analyze, latest: Latest) -> HealthServer:
    """Bound and listening; call serve_forever() (port 0 picks a free port: see server_address)."""
    return HealthServer((host, port), analyze, latest)
