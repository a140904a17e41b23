"""Process metrics: counters, gauges and a latency summary, served in Prometheus text format."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)


class Metrics:
    """Thread-safe named counters and gauges with optional labels, plus max/sum/count summaries."""

    def __init__(self, namespace: str = "postroom") -> None:
        self._namespace = namespace
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._summaries: dict[str, list[float]] = {}  # name -> [count, sum, max]

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._gauges[(name, tuple(sorted(labels.items())))] = value

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            count, total, peak = self._summaries.get(name, [0.0, 0.0, float("-inf")])
            self._summaries[name] = [count + 1, total + value, max(peak, value)]

    def counter(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters.get((name, tuple(sorted(labels.items()))), 0.0)

    def counters(self, name: str) -> Mapping[tuple[tuple[str, str], ...], float]:
        """Every labelled value of counter ``name``."""
        with self._lock:
            return {labels: v for (n, labels), v in self._counters.items() if n == name}

    def summary(self, name: str) -> tuple[int, float, float] | None:
        """(count, sum, max) of an observed value, or None before the first observation."""
        with self._lock:
            found = self._summaries.get(name)
            return None if found is None else (int(found[0]), found[1], found[2])

    def render(self) -> str:
        """Prometheus text exposition of everything recorded."""
        lines: list[str] = []
        with self._lock:
            for kind, table in (("counter", self._counters), ("gauge", self._gauges)):
                for name in sorted({n for n, _ in table}):
                    full = f"{self._namespace}_{name}"
                    lines.append(f"# TYPE {full} {kind}")
                    lines.extend(f"{full}{_labels(labels)} {value:g}"
                                 for (n, labels), value in sorted(table.items()) if n == name)
            for name, (count, total, peak) in sorted(self._summaries.items()):
                full = f"{self._namespace}_{name}"
                lines += [f"# TYPE {full} summary", f"{full}_count {count:g}",
                          f"{full}_sum {total:g}", f"{self._namespace}_{name}_max {peak:g}"]
        return "\n".join(lines) + "\n"


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def serve(metrics: Metrics, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve ``/metrics`` on a daemon thread; call ``shutdown()`` on the result to stop."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.rstrip("/") not in ("/metrics", ""):
                self.send_error(404)
                return
            body = metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("metrics: " + format, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    log.info("metrics on http://%s:%d/metrics", host, port)
    return server


