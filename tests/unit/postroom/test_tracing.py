"""W3C trace context parsing (strict: anything malformed is no context), and spans made through a
real OpenTelemetry SDK provider with its in-memory exporter."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from postroom import tracing
from postroom.errors import ConfigError
from postroom.tracing import OFF, TraceContext, Tracing
from support.tracing import memory_provider


def python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by this interpreter in a process of its own (no module imported yet)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=60)


TID = "4bf92f3577b34da6a3ce929d0e0e4736"
SID = "00f067aa0ba902b7"
GOOD = f"00-{TID}-{SID}-01"


def test_a_valid_traceparent() -> None:
    ctx = tracing.parse_traceparent(GOOD)
    assert ctx == TraceContext(TID, SID, 1)
    assert ctx.traceparent == GOOD
    assert tracing.parse_traceparent(GOOD.encode()) == ctx
    assert ctx.headers() == (("traceparent", GOOD.encode()),)


@pytest.mark.parametrize("value", [
    "", GOOD.upper(), GOOD[:-1], GOOD + "-", GOOD + "-extra",  # 00 takes no more fields
    f"ff-{TID}-{SID}-01", f"00-{'0' * 32}-{SID}-01", f"00-{TID}-{'0' * 16}-01",
    f"00-{TID}-{SID}-1", f"0-{TID}-{SID}-01", f"00_{TID}_{SID}_01", f"00-{TID}-{SID}-0g",
    f" {GOOD}", f"{GOOD}\n", f"00-{TID[:-1]}\u0660-{SID}-01", "x" * 10_000,
    b"\xff" * 55, None, 55, ["00"],
])
def test_malformed_traceparents_are_no_context(value: object) -> None:
    assert tracing.parse_traceparent(value) is None


def test_a_later_version_may_add_fields() -> None:
    assert tracing.parse_traceparent(f"01-{TID}-{SID}-00-more") == TraceContext(TID, SID, 0)


@pytest.mark.parametrize(("value", "expected"), [
    ("congo=t61rcWkgMzE", "congo=t61rcWkgMzE"),
    ("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
    ("a=1,,b=2 ", "a=1,b=2"),
    ("tenant@vendor=x", "tenant@vendor=x"),
    ("", None), ("Upper=1", None), ("a=1,a=2", None), ("a=", None), ("a=b,c", None),
    ("a=b=c=\u00e9", None), (",".join(f"k{n}=v" for n in range(33)), None),
    ("a=" + "v" * 600, None), (b"a=\xff", None), (None, None),
])
def test_tracestate(value: object, expected: str | None) -> None:
    assert tracing.parse_tracestate(value) == expected


def test_a_bad_tracestate_is_dropped_alone() -> None:
    assert tracing.parse_traceparent(GOOD, "not valid") == TraceContext(TID, SID, 1)
    assert tracing.parse_traceparent(GOOD, "a=1").headers() == (
        ("traceparent", GOOD.encode()), ("tracestate", b"a=1"))


def test_from_headers() -> None:
    assert tracing.from_headers([("traceparent", GOOD.encode()), ("tracestate", b"a=1"),
                                 ("tracestate", b"b=2")]) == TraceContext(TID, SID, 1, "a=1,b=2")
    assert tracing.from_headers([("traceparent", GOOD), ("traceparent", GOOD)]) is None
    assert tracing.from_headers([("traceparent", None)]) is None
    assert tracing.from_headers([("tracestate", b"a=1")]) is None
    assert tracing.from_headers(None) is None


@given(st.lists(st.tuples(st.sampled_from(["traceparent", "tracestate", "other"]),
                          st.one_of(st.none(), st.binary(max_size=80),
                                    st.text(max_size=80)))))
def test_any_headers_give_a_context_or_none(headers: list[tuple[str, object]]) -> None:
    found = tracing.from_headers(headers)  # type: ignore[arg-type]
    if found is not None:
        # What is passed on parses back to itself: postroom never forwards what it refused.
        again = tracing.from_headers(list(found.headers()))
        assert again == found


CONTEXTS = st.builds(TraceContext, st.from_regex(r"[0-9a-f]{32}", fullmatch=True),
                     st.from_regex(r"[0-9a-f]{16}", fullmatch=True), st.integers(0, 255),
                     st.one_of(st.none(), st.from_regex(r"[a-z][a-z0-9_]{0,8}=[!-+\--<>-~]{1,8}"
                                                         r"(,[a-z][a-z0-9_]{0,8}=[!-+\--<>-~]{1,8})"
                                                         r"{0,3}", fullmatch=True)))


@given(CONTEXTS, st.lists(st.tuples(st.sampled_from(["other", "postroom.row_id"]),
                                    st.binary(max_size=20)), max_size=3))
def test_a_valid_context_reads_back_from_its_headers_among_others(
        context: TraceContext, others: list[tuple[str, bytes]]) -> None:
    assume(context.trace_id != "0" * 32 and context.span_id != "0" * 16)
    keys = [m.partition("=")[0] for m in (context.tracestate or "").split(",") if m]
    assume(len(set(keys)) == len(keys))
    assert tracing.from_headers([*others, *context.headers()]) == context


@given(st.from_regex(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", fullmatch=True))
def test_well_formed_traceparents_round_trip_unless_w3c_says_ignore(value: str) -> None:
    ctx = tracing.parse_traceparent(value)
    version, trace_id, span_id, _ = value.split("-")
    invalid = version == "ff" or set(trace_id) == {"0"} or set(span_id) == {"0"}
    assert (ctx is None) is invalid
    if ctx is not None and version == "00":
        assert ctx.traceparent == value


@pytest.fixture
def exporter() -> Iterator[tuple[Tracing, InMemorySpanExporter]]:
    provider, memory = memory_provider()
    yield Tracing.from_provider(provider), memory
    provider.shutdown()


def test_off_makes_no_span_and_passes_the_parent_on() -> None:
    parent = TraceContext(TID, SID, 1)
    with OFF.span("publish x", parent, kind="producer",
                  attributes=lambda: pytest.fail("attributes made with tracing off")) as span:
        span.set(lambda: pytest.fail("attributes made for a span nobody sees"))
        span.error("no-op")
        assert span.context is parent
        assert span.headers() == parent.headers()
    with OFF.span("publish x", None) as span:
        assert span.context is None and span.headers() == ()
    assert not OFF.enabled


def test_a_span_is_the_child_of_its_remote_parent(
        exporter: tuple[Tracing, InMemorySpanExporter]) -> None:
    tracer, memory = exporter
    parent = TraceContext(TID, SID, 1, "a=1")
    with tracer.span("process t", parent, kind="consumer",
                     attributes=lambda: {"messaging.system": "kafka", "skipped": None}) as span:
        span.set(lambda: {"postroom.attempt": 2})
        child_ctx = span.context
    [finished] = memory.get_finished_spans()
    assert finished.name == "process t" and finished.kind is trace.SpanKind.CONSUMER
    assert f"{finished.parent.span_id:016x}" == SID and finished.parent.is_remote
    assert f"{finished.context.trace_id:032x}" == TID
    assert dict(finished.attributes) == {"messaging.system": "kafka", "postroom.attempt": 2}
    assert child_ctx == TraceContext(TID, f"{finished.context.span_id:016x}", 1, "a=1")


def test_no_parent_starts_a_trace_and_an_exception_marks_the_span(
        exporter: tuple[Tracing, InMemorySpanExporter]) -> None:
    tracer, memory = exporter
    with pytest.raises(KeyError), tracer.span("publish t", None, kind="producer"):
        raise KeyError("x")
    [finished] = memory.get_finished_spans()
    assert finished.parent is None
    assert finished.status.status_code is trace.StatusCode.ERROR


def test_current_follows_the_callers_span(
        exporter: tuple[Tracing, InMemorySpanExporter]) -> None:
    tracer_tracing, _memory = exporter
    job = tracer_tracing._provider.get_tracer("job")
    assert tracing.current() is None  # no span is current
    with job.start_as_current_span("nightly report") as outer:
        mine = tracing.current()
        assert mine is not None and int(mine.span_id, 16) == outer.get_span_context().span_id
    assert tracing.current() is None


def test_the_enqueue_span_is_a_child_of_the_callers_span_from_the_global_provider() -> None:
    from support.tracing import memory_tracing

    _roles, provider, memory = memory_tracing()  # the process's global provider, in memory
    memory.clear()
    with provider.get_tracer("job").start_as_current_span("nightly report") as outer, \
            tracing.enqueue_span("k") as kept:
        pass
    spans = {s.name: s for s in memory.get_finished_spans()}
    enqueued = spans["enqueue outbox"]
    assert enqueued.parent.span_id == outer.get_span_context().span_id
    assert enqueued.attributes["postroom.message_key"] == "k"
    assert kept == TraceContext(f"{outer.get_span_context().trace_id:032x}",
                                f"{enqueued.context.span_id:016x}",
                                int(enqueued.context.trace_flags))
    with tracing.enqueue_span("k") as outside:  # no span is current: no trace is started
        assert outside is None


def test_a_global_provider_that_makes_no_spans_keeps_the_callers_context() -> None:
    """In a process of its own: the global provider is then OpenTelemetry's default, which
    makes no spans, while the caller's span comes from a provider of its own."""
    code = ("from opentelemetry.sdk.trace import TracerProvider\n"
            "from postroom import tracing\n"
            "job = TracerProvider().get_tracer('job')\n"
            "with job.start_as_current_span('report') as outer, tracing.enqueue_span('k') as kept:\n"
            "    assert int(kept.span_id, 16) == outer.get_span_context().span_id, kept\n"
            "print('kept')\n")
    done = python(code)
    assert (done.returncode, done.stdout.strip()) == (0, "kept"), done.stderr


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, True),  # the spec's list, both used
    # Issue 45 item 9: console was refused ("OTLP only"); a trace needed a collector.
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, False),
])
def test_configured(environ: dict[str, str], expected: bool) -> None:
    assert bool(tracing.exporters(environ)) is expected


@pytest.mark.parametrize(("listed", "chosen"), [
    ("console", ("console",)), ("otlp,console", ("otlp", "console")), (" Console ", ("console",)),
    ("none", ()), ("console,none", ()), ("zipkin,console", ("console",)),
])
def test_the_exporters_the_convention_names(listed: str, chosen: tuple[str, ...]) -> None:
    assert tracing.exporters({"OTEL_TRACES_EXPORTER": listed}) == chosen


def test_setup_refuses_what_it_cannot_export(caplog: pytest.LogCaptureFixture) -> None:
    assert tracing.setup("relay", {}) is OFF
    assert tracing.setup("relay", {"OTEL_TRACES_EXPORTER": "zipkin"}) is OFF
    assert "OTLP or to the console only; ignoring zipkin" in caplog.text  # said; it starts
    with pytest.raises(ConfigError, match="http/protobuf"):
        tracing.setup("relay", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x",
                                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


def test_a_service_name_in_the_resource_attributes_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=billing-mailer,team=ops")
    made = tracing.setup("relay", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    try:
        attributes = made._provider.resource.attributes
        assert (attributes["service.name"], attributes["team"]) == ("billing-mailer", "ops")
    finally:
        made._provider.shutdown()


def test_shutdown_waits_at_most_its_timeout_for_a_collector_that_does_not_answer(
        caplog: pytest.LogCaptureFixture) -> None:
    import threading
    import time

    release = threading.Event()

    class Stuck:
        def get_tracer(self, name: str) -> object:
            return object()

        def shutdown(self) -> None:
            release.wait(30)

    started = time.monotonic()
    Tracing.from_provider(Stuck()).shutdown(timeout_s=0.2)
    waited = time.monotonic() - started
    release.set()
    assert waited < 5  # not the 30 s the stuck export would take
    assert "not exported within 0s; dropped" in caplog.text


def test_setup_makes_a_provider_of_the_roles_own() -> None:
    made = tracing.setup("sender", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    try:
        assert made.enabled
        assert made._provider.resource.attributes["service.name"] == "postroom-sender"
    finally:
        made._provider.shutdown()  # nothing was exported: no connection is tried


def test_without_otel_variables_no_role_imports_opentelemetry() -> None:
    code = ("import sys\n"
            "from postroom import tracing\n"
            "import relay.publisher, relay.recorder, relay.outbox, sender.service\n"
            "assert tracing.setup('relay', {}) is tracing.OFF\n"
            "assert tracing.current() is None\n"
            "with tracing.enqueue_span('k') as ctx: assert ctx is None\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    done = python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_setup_without_the_extra_says_how_to_install_it() -> None:
    code = ("import sys\n"
            "sys.modules['opentelemetry.exporter.otlp.proto.http.trace_exporter'] = None\n"
            "from postroom import tracing\n"
            "tracing.setup('relay', {'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://x'})\n")
    done = python(code)
    assert done.returncode == 1
    assert "pip install 'postroom[otel]'" in done.stderr, done.stderr
