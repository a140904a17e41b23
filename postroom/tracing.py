"""W3C trace context for one email across processes, and spans when OpenTelemetry is configured.

The context travels as the ``traceparent`` and ``tracestate`` Kafka headers on every record
postroom writes for an email (and in the outbox row's columns of the same names, from enqueue to
the relay). Each role parses it strictly: a malformed, oversized or hostile header is no context,
never a failure. Spans are made only when a role's environment configures an exporter, OTLP or
the console (:func:`setup`, the standard ``OTEL_*`` variables, the ``postroom[otel]`` extra); otherwise
nothing of OpenTelemetry is imported and :class:`Tracing` hands the parent's context on as it came.

Attribute names follow OpenTelemetry's messaging conventions for Kafka (semantic conventions
1.27+, still "development" for messaging): ``messaging.system``, ``messaging.operation.type``,
``messaging.operation.name``, ``messaging.destination.name``,
``messaging.destination.partition.id``,
``messaging.consumer.group.name``, ``messaging.kafka.message.key``, ``messaging.kafka.offset``.
What postroom adds is under ``postroom.``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from postroom.errors import ConfigError
from postroom.settings_kafka import mask_url

log = logging.getLogger(__name__)

TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"
# W3C Trace Context level 1: version 00 is exactly 55 characters; a later version may add
# fields after a dash. tracestate: at most 32 list members, 512 characters is what a vendor must
# propagate (longer may be dropped, as here).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?",
                          re.ASCII | re.DOTALL)
TRACEPARENT_MAX_CHARS = 512
TRACESTATE_MAX_CHARS = 512
TRACESTATE_MAX_MEMBERS = 32
_TS_KEY = r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
_TS_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_TS_MEMBER = re.compile(rf"{_TS_KEY}={_TS_VALUE}", re.ASCII)
ZERO_TRACE_ID = "0" * 32
ZERO_SPAN_ID = "0" * 16
TRACER_NAME = "postroom"
SHUTDOWN_TIMEOUT_S = 5.0

Headers = Sequence[tuple[str, str | bytes | None]]
Attributes = Mapping[str, str | int | float | bool | None]
# Attributes are given as a function that makes them: with tracing off (or a span not recording)
# it is never called, so a role's hot path builds no dictionary for a span nobody sees.
AttributesOf = Callable[[], Attributes]


@dataclasses.dataclass(frozen=True, slots=True)
class TraceContext:
    """A span's identity as W3C's headers carry it."""

    trace_id: str  # 32 lower-case hex digits, not all zero
    span_id: str  # 16 lower-case hex digits, not all zero
    flags: int  # 0..255; bit 0: sampled
    tracestate: str | None = None

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    def headers(self) -> tuple[tuple[str, bytes], ...]:
        """The Kafka headers that carry this context."""
        if self.tracestate is None:
            return ((TRACEPARENT_HEADER, self.traceparent.encode()),)
        return ((TRACEPARENT_HEADER, self.traceparent.encode()),
                (TRACESTATE_HEADER, self.tracestate.encode()))


def _text(value: object, max_chars: int) -> str | None:
    if isinstance(value, bytes | bytearray | memoryview):
        if len(value) > max_chars:
            return None
        try:
            return bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return None
    if isinstance(value, str) and len(value) <= max_chars:
        return value
    return None


def parse_traceparent(value: object, tracestate: object = None) -> TraceContext | None:
    """The context a ``traceparent`` value names, or None for anything W3C says to ignore
    (a wrong length or case, version ff, an all-zero id, a version 00 with extra fields) and for
    anything that is not text. A ``tracestate`` that breaks its grammar is dropped alone."""
    text = _text(value, TRACEPARENT_MAX_CHARS)
    if text is None:
        return None
    found = _TRACEPARENT.fullmatch(text)
    if found is None:
        return None
    version, trace_id, span_id, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == ZERO_TRACE_ID or span_id == ZERO_SPAN_ID:
        return None
    return TraceContext(trace_id, span_id, int(flags, 16), parse_tracestate(tracestate))


def parse_tracestate(value: object) -> str | None:
    """``tracestate`` as it may be passed on (optional spaces and empty members removed), or
    None when it is absent, too long or breaks the grammar: then none is passed on."""
    text = _text(value, TRACESTATE_MAX_CHARS)
    if text is None:
        return None
    members = [m.strip(" \t") for m in text.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > TRACESTATE_MAX_MEMBERS:
        return None
    if not all(_TS_MEMBER.fullmatch(m) for m in members):
        return None
    keys = [m.partition("=")[0] for m in members]
    if len(set(keys)) != len(keys):
        return None
    return ",".join(members)


def from_headers(headers: Headers | None) -> TraceContext | None:
    """The context a record's headers carry; None when there is none, more than one
    ``traceparent``, or a malformed one. Several ``tracestate`` headers are joined, as W3C
    allows for HTTP fields."""
    parents: list[object] = []
    states: list[str] = []
    for name, value in headers or ():
        if name == TRACEPARENT_HEADER:
            parents.append(value)
        elif name == TRACESTATE_HEADER:
            state = _text(value, TRACESTATE_MAX_CHARS)
            if state is not None:
                states.append(state)
    if len(parents) != 1:
        return None
    return parse_traceparent(parents[0], ",".join(states) if states else None)


def current() -> TraceContext | None:
    """The caller's current span, when the caller uses OpenTelemetry (the module is imported
    already: postroom never imports it for this) and a valid span is current."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    return _of_span_context(trace.get_current_span().get_span_context())


def _of_span_context(context: Any) -> TraceContext | None:
    if not context.is_valid:
        return None
    state = context.trace_state.to_header() if context.trace_state else None
    return parse_traceparent(
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}",
        state or None)


@contextlib.contextmanager
def enqueue_span(message_key: str | None) -> Iterator[TraceContext | None]:
    """Around an enqueue in the caller's process: when the caller is in an OpenTelemetry span,
    a child span ``enqueue outbox`` from the caller's own (global) tracer provider, and the
    context the rows keep (that span's, or the caller's when its provider makes no spans). None
    outside a span: enqueue starts no trace of its own."""
    trace = sys.modules.get("opentelemetry.trace")
    caller = current() if trace is not None else None
    if trace is None or caller is None:
        yield None
        return
    tracer = trace.get_tracer(TRACER_NAME)
    attributes = {"messaging.system": "postgresql", "messaging.operation.type": "send",
                  "messaging.destination.name": "outbox"}
    if message_key is not None:
        attributes["postroom.message_key"] = message_key
    with tracer.start_as_current_span("enqueue outbox", kind=trace.SpanKind.PRODUCER,
                                      attributes=attributes):
        yield current() or caller


class Span:
    """What a role may do with the span it is in: set attributes, mark an error, and read the
    context its records should carry."""

    __slots__ = ("_context", "_span")

    def __init__(self, span: Any, context: TraceContext | None) -> None:
        self._span = span
        self._context = context

    @property
    def context(self) -> TraceContext | None:
        """This span's context, or without tracing the parent's, passed on as it came."""
        return self._context

    def headers(self) -> tuple[tuple[str, bytes], ...]:
        return () if self._context is None else self._context.headers()

    def set(self, attributes: AttributesOf) -> None:
        if self._span is not None:
            self._span.set_attributes(_present(attributes()))

    def error(self, description: str) -> None:
        if self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_status(Status(StatusCode.ERROR, description[:1000]))


class Tracing:
    """A role's tracer, or none. ``span()`` is cheap when off: no OpenTelemetry call at all."""

    def __init__(self, tracer: Any = None, provider: Any = None) -> None:
        self._tracer = tracer
        self._provider = provider

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @classmethod
    def from_provider(cls, provider: Any) -> Tracing:
        """Spans from an SDK TracerProvider the caller set up (tests, an embedding program)."""
        return cls(provider.get_tracer(TRACER_NAME), provider)

    @contextlib.contextmanager
    def span(self, name: str, parent: TraceContext | None, *, kind: str = "internal",
             attributes: AttributesOf | None = None) -> Iterator[Span]:
        """A span ``name`` under ``parent`` (a new trace without one); ``kind`` is
        OpenTelemetry's SpanKind by name (producer, consumer, client, internal); ``attributes``
        is called only when a span is made."""
        if self._tracer is None:
            yield Span(None, parent)
            return
        from opentelemetry import trace

        span = self._tracer.start_span(
            name, context=_parent_context(parent), kind=trace.SpanKind[kind.upper()],
            attributes=_present(attributes()) if attributes is not None else None)
        try:
            yield Span(span, _of_span_context(span.get_span_context()) or parent)
        except BaseException as exc:
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.end()

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Export what is buffered and stop (a role's exit), waiting at most ``timeout_s``: a
        collector that does not answer must not hold the exit past a platform's grace period."""
        if self._provider is None:
            return
        stopping = threading.Thread(target=self._provider.shutdown, name="tracing-shutdown",
                                    daemon=True)
        stopping.start()
        stopping.join(timeout_s)
        if stopping.is_alive():
            log.warning("tracing: the buffered spans were not exported within %.0fs; dropped",
                        timeout_s)


OFF = Tracing()


def _present(attributes: Attributes) -> dict[str, str | int | float | bool]:
    """The attributes that have a value (OpenTelemetry takes no None)."""
    return {k: v for k, v in attributes.items() if v is not None}


def _parent_context(parent: TraceContext | None) -> Any:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    if parent is None:
        # A new trace: not the role's ambient context (there is none in a role).
        return trace.set_span_in_context(trace.INVALID_SPAN)
    state = TraceState.from_header([parent.tracestate]) if parent.tracestate else TraceState()
    return trace.set_span_in_context(NonRecordingSpan(SpanContext(
        int(parent.trace_id, 16), int(parent.span_id, 16), is_remote=True,
        trace_flags=TraceFlags(parent.flags), trace_state=state)))


# The exporters of OTEL_TRACES_EXPORTER postroom has (the OpenTelemetry convention's names);
# "none" turns tracing off.
EXPORTERS = ("otlp", "console")


def exporters(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The traces exporters the ``OTEL_*`` variables ask for, of EXPORTERS: those
    OTEL_TRACES_EXPORTER lists (``otlp``, ``console``: spans printed on stdout, no collector
    needed), or ``otlp`` when it is unset and an OTLP endpoint is; none when the SDK is disabled
    or the list says ``none``. Others (zipkin, jaeger) are named in a warning, not used."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    listed = {e.strip() for e in environ.get("OTEL_TRACES_EXPORTER", "").lower().split(",")
              if e.strip()}
    if "none" in listed:
        return ()
    if listed - {*EXPORTERS}:
        # A shared environment's zipkin must not stop the role: said, not used.
        log.warning("OTEL_TRACES_EXPORTER: postroom exports traces over OTLP or to the console "
                    "only; ignoring %s", ", ".join(sorted(listed - {*EXPORTERS})))
    if listed:
        return tuple(e for e in EXPORTERS if e in listed)
    endpoint = any(environ.get(name, "").strip() for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    return ("otlp",) if endpoint else ()


def setup(role: str, environ: Mapping[str, str] | None = None) -> Tracing:
    """The role's tracing from the ``OTEL_*`` variables: OFF unless they ask for traces; then a
    TracerProvider of its own (service.name ``postroom-<role>`` unless OTEL_SERVICE_NAME says
    otherwise) exporting in batches to each exporter asked for: over OTLP/HTTP (protobuf) as the
    variables say, or as JSON on stdout (``console``). ConfigError when they ask for it and the
    ``postroom[otel]`` extra is not installed."""
    environ = os.environ if environ is None else environ
    chosen = exporters(environ)
    if not chosen:
        return OFF
    if "otlp" in chosen:
        protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                               environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")).strip()
        if protocol != "http/protobuf":
            raise ConfigError("OTEL_EXPORTER_OTLP_PROTOCOL", f"{protocol!r}: postroom exports "
                              "over http/protobuf (the OTLP/HTTP exporter of postroom[otel])")
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
        if "otlp" in chosen:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        variable = ("OTEL_EXPORTER_OTLP_ENDPOINT" if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                    else "OTEL_TRACES_EXPORTER")
        raise ConfigError(variable, "asks for traces, but OpenTelemetry "
                          f"is not installed ({exc.name}): pip install 'postroom[otel]', or "
                          "unset it") from None
    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME from os.environ; a
    # service.name given in either wins over postroom's.
    given = OTELResourceDetector().detect().attributes
    defaults = {} if SERVICE_NAME in given else {SERVICE_NAME: f"postroom-{role}"}
    # Not shut down at exit by the SDK: Tracing.shutdown bounds how long the exit waits.
    provider = TracerProvider(resource=Resource.create(defaults), shutdown_on_exit=False)
    if "otlp" in chosen:
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        log.info("tracing: %s spans exported over OTLP/HTTP to %s", role,
                 # Credentials may be written into the endpoint (https://user:token@collector).
                 mask_url(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                          or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "the default endpoint"))
    if "console" in chosen:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        log.info("tracing: %s spans printed on stdout as JSON (OTEL_TRACES_EXPORTER=console)",
                 role)
    return Tracing.from_provider(provider)


def kafka_attributes(operation: str, topic: str, *, partition: int | None = None,
                     key: str | None = None, offset: int | None = None,
                     group: str | None = None) -> dict[str, str | int | None]:
    """OpenTelemetry's messaging attributes for a Kafka record (operation: send, process,
    receive, settle)."""
    return {"messaging.system": "kafka", "messaging.operation.type": operation,
            "messaging.operation.name": operation, "messaging.destination.name": topic,
            "messaging.destination.partition.id": None if partition is None else str(partition),
            "messaging.kafka.message.key": key, "messaging.kafka.offset": offset,
            "messaging.consumer.group.name": group}
