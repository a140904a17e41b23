"""A local OTLP/HTTP endpoint for the tests and the benchmark: it answers every export 200 and
keeps the bodies posted to /v1/traces (protobuf ExportTraceServiceRequest), undecoded."""

from __future__ import annotations

import http.server
import threading
from typing import Any


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            self.server.received(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def __init__(self, keep: bool) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.keep = keep
        self.bodies: list[bytes] = []
        self.requests = 0
        self._lock = threading.Lock()

    def received(self, body: bytes) -> None:
        with self._lock:
            self.requests += 1
            if self.keep:
                self.bodies.append(body)


class OtlpReceiver:
    """``with OtlpReceiver() as receiver:`` serves on ``receiver.endpoint``; ``bodies`` holds the
    trace exports in order (``keep=False``: only counted, in ``requests``)."""

    def __init__(self, *, keep: bool = True) -> None:
        self._server = _Server(keep)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL, as OTEL_EXPORTER_OTLP_ENDPOINT takes it."""
        return f"http://127.0.0.1:{self._server.server_port}"

    @property
    def bodies(self) -> list[bytes]:
        return self._server.bodies

    @property
    def requests(self) -> int:
        return self._server.requests

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
