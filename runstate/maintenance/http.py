"""The live health read: `GET /tables/{database}/{table}/health` on a small stdlib HTTP server.

The JSON is the same as `runstate health` prints. Identifiers are validated before anything runs
(400); a table the catalog does not have is a 404. `?cached=true` answers from the newest stored
health row instead of analyzing the table now.

Bounded everywhere, so one slow table or client cannot take the server down:
- one analysis at a time runs (they share one Spark session) on a thread of its own; a request waits
  for it at most `analysis_timeout` seconds, then gets 504 (the analysis carries on, and its stored
  result answers `?cached=true`) or, while another analysis still runs, 503;
- at most `max_threads` requests are handled at once (the others wait in the listen queue); a
  request's line and headers must all arrive within `header_timeout` seconds (a client that trickles
  a header line every few seconds is dropped then, not when it stops), and a client that stops
  sending or reading is dropped after `client_timeout` seconds;
- a client that goes away before its answer is one log line, not a traceback; so is a request whose
  thread a stop (SIGTERM, Ctrl-C) interrupted as it started.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
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


DEFAULT_ANALYSIS_TIMEOUT_S = 30.0
DEFAULT_MAX_THREADS = 8
DEFAULT_CLIENT_TIMEOUT_S = 10.0
DEFAULT_HEADER_TIMEOUT_S = 10.0


class AnalysisBusy(Exception):
    """The one analysis slot stayed taken for the whole wait (503)."""


class AnalysisTimeout(Exception):
    """The analysis did not end within the request's budget (504); it goes on in the background."""


class HealthServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        analyze: Analyze,
        latest: Latest,
        *,
        analysis_timeout: float = DEFAULT_ANALYSIS_TIMEOUT_S,
        max_threads: int = DEFAULT_MAX_THREADS,
        client_timeout: float = DEFAULT_CLIENT_TIMEOUT_S,
        header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
    ) -> None:
        self.analyze, self.latest = analyze, latest
        self.analysis_timeout, self.client_timeout = analysis_timeout, client_timeout
        self.header_timeout = header_timeout
        # One analysis at a time on the shared Spark session, on a thread a request can stop waiting for.
        self.analysis_slot = threading.Semaphore(1)
        self.analysis_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="health-analysis")
        self.request_slots = threading.BoundedSemaphore(max_threads)
        # Set once a stop has landed while a request's thread started (process_request).
        self.stopping = False
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Accept no more connections than threads may serve; the rest wait in the listen backlog.
        self.request_slots.acquire()
        try:
            super().process_request(request, client_address)
        except Exception:
            # The thread did not start ("can't start new thread"), so nothing else frees its slot. Not on
            # a KeyboardInterrupt: a stop lands while `Thread.start` waits for a thread that has started
            # and frees the slot itself; freeing it here too raised "released too many times", which
            # replaced the interrupt, and the server served on.
            self.request_slots.release()
            raise
        except BaseException:
            # The stop itself: the stdlib's caller now closes this request's socket, under the thread that
            # has started with it, which fails on it. That failure is the stop's, not a fault (handle_error).
            self.stopping = True
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.request_slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):  # a broken pipe, a reset: the client left, nothing to fix here
            log.warning("client %s:%s left before its answer was sent (%s)", *client_address[:2], error)
            return
        if self.stopping and isinstance(error, OSError):
            log.info("request from %s:%s dropped: the server is stopping (%s)", *client_address[:2], error)
            return
        super().handle_error(request, client_address)

    def analyze_within(self, ref: TableRef) -> HealthSnapshot:
        """The table's analysis, or AnalysisBusy / AnalysisTimeout once `analysis_timeout` has passed."""
        deadline = time.monotonic() + self.analysis_timeout
        if not self.analysis_slot.acquire(timeout=self.analysis_timeout):
            raise AnalysisBusy(
                f"another table's analysis has held the Spark session for over {self.analysis_timeout:g} s;"
                f" ask again later, or with ?cached=true"
            )
        future = self.analysis_thread.submit(self._analyze_and_free_the_slot, ref)
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            raise AnalysisTimeout(
                f"the analysis of {ref.key} did not finish within {self.analysis_timeout:g} s; it goes on,"
                f" and its result will answer ?cached=true"
            ) from None

    def _analyze_and_free_the_slot(self, ref: TableRef) -> HealthSnapshot:
        try:
            return self.analyze(ref)
        finally:
            self.analysis_slot.release()

    def server_close(self) -> None:
        super().server_close()
        self.analysis_thread.shutdown(wait=False, cancel_futures=True)


class _Handler(BaseHTTPRequestHandler):
    server: HealthServer

    def setup(self) -> None:
        # A client that stops sending its request or reading the answer is dropped after this long.
        self.timeout = self.server.client_timeout
        super().setup()
        deadline = time.monotonic() + self.server.header_timeout
        self.rfile = _ReadsBy(self.rfile, self.connection, deadline, self.server.client_timeout)

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.connection.settimeout(self.server.client_timeout)  # the answer's writes: each may take this long
        return parsed

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
        except AnalysisBusy as exc:
            return self._reply(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)})
        except AnalysisTimeout as exc:
            return self._reply(HTTPStatus.GATEWAY_TIMEOUT, {"error": str(exc)})
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
        return self.server.analyze_within(ref)

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


class _ReadsBy:
    """A request's input whose line reads must all end by one deadline: with a timeout per read only,
    four clients sending a header line every 3 s held all four threads of `--max-threads 4` for as
    long as they liked. A late read raises TimeoutError, which the stdlib handler logs and closes on."""

    def __init__(self, rfile: Any, connection: Any, deadline: float, per_read: float) -> None:
        self._rfile, self._connection = rfile, connection
        self._deadline, self._per_read = deadline, per_read

    def readline(self, limit: int = -1) -> bytes:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request line and headers did not all arrive in time")
        self._connection.settimeout(min(left, self._per_read))
        return self._rfile.readline(limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rfile, name)


def make_server(host: str, port: int, analyze: Analyze, latest: Latest, **limits: Any) -> HealthServer:
    """Bound and listening; call serve_forever() (port 0 picks a free port: see server_address).
    `limits`: analysis_timeout, max_threads, client_timeout, header_timeout (see HealthServer)."""
    return HealthServer((host, port), analyze, latest, **limits)
