"""The /metrics, /readyz server against real sockets: an SMTP server that accepts and never greets
holds up neither a scrape nor the probe; an idle connection is closed; connections are capped."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from postroom.devkit.wait import wait_until
from postroom.health import READY_WAIT_S, Readiness, serve
from postroom.metrics import READY, Metrics
from postroom.sender.smtp import check_smtp
from postroom.settings import Settings, TlsMode

pytestmark = pytest.mark.integration

# A scrape on loopback takes milliseconds; one that waited for the hung check would take the
# client's 30 s for a greeting. 0.5 s was short enough to fail on a machine kept busy by others.
PROMPT_S = 5.0


def get(url: str, timeout_s: float = 10.0) -> tuple[int, str, float]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - loopback
            return response.status, response.read().decode(), time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), time.monotonic() - started


@contextlib.contextmanager
def silent_smtp_server() -> Iterator[int]:
    """A port that accepts connections and never says a word (no 220 greeting)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_a_server_that_never_greets_holds_up_no_scrape_and_readiness_says_not_ready() -> None:
    with silent_smtp_server() as port:
        settings = Settings(smtp_host="127.0.0.1", smtp_port=port, smtp_tls=TlsMode.NONE)
        metrics = Metrics()
        readiness = Readiness([("database", lambda: "schema at head"),
                               ("smtp", lambda: check_smtp(settings))], metrics)
        server = serve(metrics, 0, readiness=readiness)
        base = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            status, text, seconds = get(f"{base}/readyz")
            assert status == 503, text
            assert seconds < READY_WAIT_S + PROMPT_S
            assert text.startswith("ok database: schema at head\nFAIL smtp: no answer after ")
            for _ in range(5):  # the check still hangs (the client waits 30 s for a greeting)
                status, text, seconds = get(f"{base}/metrics")
                assert (status, seconds < PROMPT_S) == (200, True), seconds
                assert 'postroom_ready{check="smtp"} 0.0' in text
                assert 'postroom_ready{check="database"} 1.0' in text
                status, _, seconds = get(f"{base}/readyz")
                assert (status, seconds < READY_WAIT_S + PROMPT_S) == (503, True), seconds
            # One run at a time: the probes and scrapes above started no second hung check.
            assert [t.name for t in threading.enumerate()].count("readiness") == 1
        finally:
            server.shutdown()
            server.server_close()


def test_a_scrape_alone_shows_a_check_that_hangs_as_not_ready() -> None:
    with silent_smtp_server() as port:
        settings = Settings(smtp_host="127.0.0.1", smtp_port=port, smtp_tls=TlsMode.NONE)
        metrics = Metrics()
        # It passed before: the gauge says 1 until the hang is seen.
        metrics.set(READY, 1.0, check="smtp")
        server = serve(metrics, 0, readiness=Readiness(
            [("smtp", lambda: check_smtp(settings))], metrics))
        base = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            get(f"{base}/metrics")  # starts the run

            def hang_seen() -> bool:
                status, text, seconds = get(f"{base}/metrics")
                assert (status, seconds < PROMPT_S) == (200, True), seconds
                return 'postroom_ready{check="smtp"} 0.0' in text

            # Seen once the run has waited READY_WAIT_S, whenever this scrape comes after.
            wait_until(hang_seen, 30, "a scrape to show the hung check as not ready",
                       poll_interval_s=0.1)
        finally:
            server.shutdown()
            server.server_close()


def serving_threads() -> int:
    """The connections the stdlib server is serving: one thread each."""
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def test_a_connection_that_sends_nothing_is_closed_and_connections_are_capped() -> None:
    metrics = Metrics()
    # Idle connections are held 2 s: long enough to still hold both slots when the third comes
    # on a busy machine (0.5 s was not always), far below the client's 10 s wait below.
    server = serve(metrics, 0, timeout_s=2.0, max_connections=2)
    address = ("127.0.0.1", server.server_address[1])
    base = f"http://127.0.0.1:{address[1]}"
    try:
        idle = [socket.create_connection(address) for _ in range(2)]
        wait_until(lambda: serving_threads() == 2, 30, "the server to take both connections")
        with socket.create_connection(address) as third:
            third.settimeout(2.0)
            third.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert third.recv(100) == b""  # every slot busy: closed at once, not served
        for conn in idle:
            conn.settimeout(10.0)
            started = time.monotonic()
            assert conn.recv(100) == b""  # closed by the server's socket timeout
            assert time.monotonic() - started < 2.0 + PROMPT_S
            conn.close()
        # A slot is free once its thread has ended, a moment after the client saw the close.
        wait_until(lambda: serving_threads() == 0, 30, "the server to free both slots")
        status, _, seconds = get(f"{base}/metrics")
        assert status == 200 and seconds < PROMPT_S
    finally:
        server.shutdown()
        server.server_close()
