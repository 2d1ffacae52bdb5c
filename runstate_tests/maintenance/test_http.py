"""The health server's bounds: an analysis that hangs, a client that stalls, more clients than threads.

The analysis here blocks on an Event instead of Spark: it stands in for a catalog lock held elsewhere
(what made an uncached GET wait 43.7 s), which a test cannot hold on cue.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from runstate.maintenance.http import HealthServer, make_server
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.models import HealthSnapshot
from runstate_tests.support.devserver import poll


def get(server: HealthServer, path: str) -> tuple[int, dict]:
    url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def released() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # never leave an analysis thread blocked behind a failed test


def serving(analyze, **limits) -> HealthServer:
    server = make_server("127.0.0.1", 0, analyze, lambda ref: None, **limits)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop(server: HealthServer) -> None:
    server.shutdown()
    server.server_close()


def test_a_hung_analysis_answers_504_and_the_next_request_503_not_a_wait(released):
    def analyze(ref: TableRef) -> HealthSnapshot:
        released.wait()
        return HealthSnapshot(ref.database, ref.table, needs_maintenance=False)

    server = serving(analyze, analysis_timeout=0.5)
    try:
        hung = get(server, "/tables/db/locked/health")
        behind = get(server, "/tables/db/other/health")
        cached = get(server, "/tables/db/other/health?cached=true")
        released.set()
        after = poll(
            lambda: (r := get(server, "/tables/db/other/health"))[0] == 200 and r,
            timeout=60,
            every=0.2,
            what="an analysis once the slot is free",
        )
    finally:
        stop(server)

    assert hung[0] == 504 and "did not finish within 0.5 s" in hung[1]["error"]
    assert behind[0] == 503 and "?cached=true" in behind[1]["error"]
    assert cached[0] == 404  # cached reads never wait for the analysis
    assert after[1]["table"] == "other"


def test_a_stalled_client_is_dropped_and_holds_no_thread_for_ever():
    server = serving(lambda ref: None, max_threads=1, client_timeout=0.5)
    try:
        stalled = socket.create_connection(server.server_address, timeout=60)
        stalled.sendall(b"GET /tables/db/t/hea")  # and never the rest
        # The one thread serves the stalled client until it is dropped; then the next request is answered.
        answered = get(server, "/nowhere")
        dropped = stalled.recv(1024)
        stalled.close()
    finally:
        stop(server)

    assert answered[0] == 404
    assert dropped == b""  # closed by the server, no answer


def test_no_more_requests_are_handled_at_once_than_threads(released):
    started = threading.Semaphore(0)

    def analyze(ref: TableRef) -> HealthSnapshot:
        started.release()
        released.wait()
        return HealthSnapshot(ref.database, ref.table, needs_maintenance=False)

    server = serving(analyze, max_threads=2, analysis_timeout=60)
    try:
        waiting = [threading.Thread(target=get, args=(server, f"/tables/db/t{i}/health")) for i in range(4)]
        for thread in waiting:
            thread.start()
        assert started.acquire(timeout=60)
        poll(lambda: server.request_slots._value == 0, timeout=60, every=0.1, what="both slots taken")
        handlers = [t for t in threading.enumerate() if "process_request_thread" in t.name]
        released.set()
        for thread in waiting:
            thread.join(timeout=120)
    finally:
        stop(server)

    assert len(handlers) == 2  # the other two requests wait to be accepted
    assert not any(thread.is_alive() for thread in waiting)  # every request was answered in the end


def _trickle(server: HealthServer, stop_trickling: threading.Event) -> socket.socket:
    """A client that sends its request line, then one header line a second until told to stop: the
    stdlib's limit of 100 headers would end it after 100 s, longer than `get` waits."""
    client = socket.create_connection(server.server_address, timeout=60)
    client.sendall(b"GET /tables/db/t/health HTTP/1.1\r\n")

    def headers() -> None:
        line = 0
        while not stop_trickling.wait(1):
            line += 1
            try:
                client.sendall(b"X-Slow-%d: 1\r\n" % line)
            except OSError:  # dropped by the server
                return

    threading.Thread(target=headers, daemon=True).start()
    return client


def test_clients_trickling_headers_do_not_starve_a_normal_request():
    stop_trickling = threading.Event()
    # Each header line comes well within the per-read timeout: only a deadline for the whole request
    # (its line and headers) frees the threads they hold.
    server = serving(lambda ref: None, max_threads=4, client_timeout=10, header_timeout=3)
    try:
        # Connected first, so they are accepted first: the listen queue is first come, first served.
        tricklers = [_trickle(server, stop_trickling) for _ in range(4)]
        answered = get(server, "/nowhere")
        dropped = [_closed_without_an_answer(client) for client in tricklers]
    finally:
        stop_trickling.set()
        stop(server)

    assert answered[0] == 404
    assert dropped == [True] * 4


def _closed_without_an_answer(client: socket.socket) -> bool:
    try:
        return client.recv(1024) == b""
    except ConnectionResetError:  # closed with a header line it had not read yet
        return True


def test_a_client_gone_before_its_answer_is_one_log_line_not_a_traceback(released, capfd, caplog):
    started = threading.Event()

    def analyze(ref: TableRef) -> HealthSnapshot:
        started.set()
        released.wait()
        return HealthSnapshot(ref.database, ref.table, needs_maintenance=False)

    caplog.set_level(logging.WARNING, logger="runstate.maintenance.http")
    server = serving(analyze, analysis_timeout=60)
    try:
        client = socket.create_connection(server.server_address, timeout=60)
        client.sendall(b"GET /tables/db/t/health HTTP/1.0\r\n\r\n")
        assert started.wait(60)
        # Closed with a reset (linger 0), so the server's writes fail at once.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        released.set()
        left = poll(
            lambda: [r for r in caplog.records if "left before its answer" in r.getMessage()],
            timeout=60,
            every=0.1,
            what="the server to notice the client left",
        )
        answered = get(server, "/nowhere")  # and it goes on serving
    finally:
        stop(server)

    assert len(left) == 1 and "\n" not in left[0].getMessage()
    assert "Traceback" not in capfd.readouterr().err
    assert answered[0] == 404


def test_a_request_cut_off_by_a_stop_as_its_thread_starts_is_one_log_line_not_a_traceback(
    monkeypatch, capfd, caplog
):
    """The stop (SIGTERM's KeyboardInterrupt) lands in `Thread.start` of a request's thread; socketserver
    then closes the request's socket under that thread. Here the thread is held until the socket is
    closed: the order a loaded machine once gave cli/test_health_serve.py's stops, which then printed
    the thread's `OSError: [Errno 9] Bad file descriptor` with its traceback."""
    caplog.set_level(logging.INFO, logger="runstate.maintenance.http")
    server = make_server("127.0.0.1", 0, lambda ref: None, lambda ref: None)
    closed, handled = threading.Event(), threading.Event()
    serve_one = server.process_request_thread

    def held_until_closed(request, client_address):
        closed.wait(60)
        try:
            serve_one(request, client_address)
        finally:
            handled.set()

    def start_then_stopped(thread: threading.Thread) -> None:
        monkeypatch.setattr(threading.Thread, "start", original_start)  # this thread only
        original_start(thread)
        raise KeyboardInterrupt

    original_start = threading.Thread.start
    monkeypatch.setattr(server, "process_request_thread", held_until_closed)
    monkeypatch.setattr(threading.Thread, "start", start_then_stopped)
    client = socket.create_connection(server.server_address, timeout=60)
    try:
        with pytest.raises(KeyboardInterrupt):
            server.handle_request()
        closed.set()
        assert handled.wait(60)
    finally:
        client.close()
        server.server_close()

    dropped = [r.getMessage() for r in caplog.records if "the server is stopping" in r.getMessage()]
    assert len(dropped) == 1 and "\n" not in dropped[0]
    assert "Traceback" not in capfd.readouterr().err
