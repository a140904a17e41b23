"""A role's HTTP endpoint: ``/metrics`` (its postroom.metrics registry), ``/healthz`` while the
process runs, and ``/readyz``, which runs the role's readiness checks (cached, bounded in time)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from postroom.metrics import READY, Metrics

log = logging.getLogger(__name__)

READY_CACHE_S = 5.0  # a probe every second must not mean a database round trip every second
# How long /readyz waits for the checks' answer before it says "not ready" (a Kubernetes probe's
# default timeout is 1 s; its failureThreshold rides out a slow answer).
READY_WAIT_S = 0.8
HTTP_TIMEOUT_S = 10.0  # a connection that sends no request within this is closed
HTTP_MAX_CONNECTIONS = 16  # served at once (scrapers and probes: a handful)


@dataclasses.dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str


Check = tuple[str, Callable[[], str]]  # name, and a call that returns a detail or raises


class Readiness:
    """Runs a role's checks (database, broker, SMTP) at most every READY_CACHE_S seconds, on a
    thread of their own: no scrape or probe ever waits on a check. /readyz waits up to
    ``wait_s`` for a run it asked for; a check that has not answered by then is "not ready"
    (its ``postroom_ready`` 0) while it runs on. One run at a time, so a hung check ties up one
    thread, not one per probe. ``live`` checks answer at once from the process's own state (a
    Kafka client in its fatal state): run at every call, never cached, listed last."""

    def __init__(self, checks: Sequence[Check], metrics: Metrics,
                 clock: Callable[[], float] = time.monotonic, wait_s: float = READY_WAIT_S,
                 live: Sequence[Check] = ()) -> None:
        self._checks = list(checks)
        self._live = list(live)
        self._metrics = metrics
        self._clock = clock
        self._wait_s = wait_s
        self._lock = threading.Condition()  # held for the state below, never while a check runs
        self._last: tuple[float, list[CheckResult]] | None = None
        self._run: list[CheckResult] | None = None  # the running run's results so far
        self._running_since = 0.0

    def refresh(self) -> None:
        """Start a run of the checks, unless one runs or the last is fresh; returns at once. A
        check running longer than ``wait_s`` has its ``postroom_ready`` set to 0 meanwhile, so a
        scrape alone shows it."""
        self._live_results()
        self._start_run()

    def _start_run(self) -> None:
        with self._lock:
            if self._run is not None:
                running = len(self._run)
                if (time.monotonic() - self._running_since > self._wait_s
                        and running < len(self._checks)):
                    self._metrics.set(READY, 0.0, check=self._checks[running][0])
                return
            if self._last is not None and self._clock() - self._last[0] < READY_CACHE_S:
                return
            self._run = []
            self._running_since = time.monotonic()
        threading.Thread(target=self._run_checks, name="readiness", daemon=True).start()

    def _run_checks(self) -> None:
        results: list[CheckResult] = []
        for name, check in self._checks:
            results.append(self._run_check(name, check))
            with self._lock:
                self._run = list(results)
        with self._lock:
            self._last = (self._clock(), results)
            self._run = None
            self._lock.notify_all()

    def _run_check(self, name: str, check: Callable[[], str]) -> CheckResult:
        try:
            result = CheckResult(name, True, check())
        except Exception as exc:  # noqa: BLE001 - any failure means not ready; said why
            result = CheckResult(name, False, str(exc).splitlines()[0] if str(exc).strip()
                                 else type(exc).__name__)
        self._metrics.set(READY, 1.0 if result.ok else 0.0, check=name)
        return result

    def _live_results(self) -> list[CheckResult]:
        return [self._run_check(name, check) for name, check in self._live]

    def results(self) -> list[CheckResult]:
        """The checks' results, fresh within READY_CACHE_S (within ``wait_s`` at most, a check
        still running counts as failed), then the live checks'."""
        return [*self._cached_results(), *self._live_results()]

    def _cached_results(self) -> list[CheckResult]:
        self._start_run()
        deadline = time.monotonic() + self._wait_s
        with self._lock:
            while self._run is not None and time.monotonic() < deadline:
                self._lock.wait(max(0.0, deadline - time.monotonic()))
            if self._run is None and self._last is not None:
                return self._last[1]
            done = list(self._run or [])
            waited_s = time.monotonic() - self._running_since
        if len(done) >= len(self._checks):
            return done  # the run ended as we looked
        pending = self._checks[len(done)]
        self._metrics.set(READY, 0.0, check=pending[0])
        return [*done, CheckResult(pending[0], False, f"no answer after {waited_s:.1f}s"),
                *(CheckResult(name, False, "not checked yet")
                  for name, _ in self._checks[len(done) + 1:])]


class _BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most ``max_connections`` served at once: a connection beyond
    them is closed at once, without a thread (the stdlib server starts one per connection)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def serve(metrics: Metrics, port: int, host: str = "127.0.0.1",
          readiness: Readiness | None = None, *, timeout_s: float = HTTP_TIMEOUT_S,
          max_connections: int = HTTP_MAX_CONNECTIONS) -> ThreadingHTTPServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on a daemon thread; ``shutdown()`` stops.

    A connection that sends nothing for ``timeout_s`` is closed; at most ``max_connections``
    are served at once."""

    class Handler(BaseHTTPRequestHandler):
        timeout = timeout_s  # the socket's, for the request and the reply

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if path in ("/metrics", ""):
                if readiness is not None:
                    readiness.refresh()  # keeps postroom_ready current for alerts; never waits
                self._reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._reply(200, b"ok\n")
            elif path == "/readyz":
                results = readiness.results() if readiness is not None else []
                text = "".join(f"{'ok' if r.ok else 'FAIL'} {r.name}: {r.detail}\n"
                               for r in results) or "ok\n"
                self._reply(200 if all(r.ok for r in results) else 503, text.encode())
            else:
                self.send_error(404)

        def _reply(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("metrics: " + format, *args)

    server = _BoundedHTTPServer((host, port), Handler, max_connections)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    # The port bound, which port 0 leaves to the system.
    log.info("metrics, /healthz and /readyz on http://%s:%d", host, server.server_address[1])
    return server
