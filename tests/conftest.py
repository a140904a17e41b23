"""Fixtures for tests that need the local stack: a schema, a topic prefix and consumer groups of
their own per test (postroom.devkit.scratch, which the benchmarks and the demo use too).

The stack is the one `scripts/services.sh up` starts (`make test` does it and sources `.dev/env`).
A test that needs it and cannot reach it fails; nothing here skips.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
from collections.abc import Callable, Generator, Iterator

import hypothesis
import pytest
import sqlalchemy as sa

import support.schema_replay
from postroom.devkit.scratch import (
    delete_kafka_state,
    drop_schema,
    scratch_settings,
    unique_name,
    wait_for_topics,
)
from postroom.kafka import create_topics
from postroom.settings import Settings

# `make fuzz` sets POSTROOM_FUZZ_EXAMPLES=<n>: every property test without a max_examples of its
# own runs n examples; one that pins max_examples reads the variable itself for its count.
FUZZ_EXAMPLES = os.environ.get("POSTROOM_FUZZ_EXAMPLES")
if FUZZ_EXAMPLES:
    hypothesis.settings.register_profile("fuzz", max_examples=int(FUZZ_EXAMPLES), deadline=None,
                                         database=None)
    hypothesis.settings.load_profile("fuzz")
# `make test-unit` sets POSTROOM_QUICK_EXAMPLES=<n>: every property test runs at most n examples
# (their full counts are make test's).
QUICK_EXAMPLES = os.environ.get("POSTROOM_QUICK_EXAMPLES")
if QUICK_EXAMPLES:
    hypothesis.settings.register_profile("quick", max_examples=int(QUICK_EXAMPLES))
    hypothesis.settings.load_profile("quick")


@pytest.fixture(scope="session")
def stack_settings() -> Settings:
    """Settings of the local stack; fails (never skips) when the stack is not configured."""
    settings = Settings.from_env()
    if not settings.database_url or not settings.kafka_bootstrap_servers:
        pytest.fail("POSTROOM_DATABASE_URL and POSTROOM_KAFKA_BOOTSTRAP_SERVERS are not set: "
                    "run the tests with `make test` (it starts the stack and sources .dev/env)")
    return settings


class Cleaner:
    """Removes what finished tests left (their schema, topics and groups) on a thread of its own,
    while the next test runs; closed at the end of the session, it has removed everything."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[Callable[[], list[str]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="scratch-cleaner", daemon=True)
        self._thread.start()
        self.problems: list[str] = []

    def put(self, job: Callable[[], list[str]]) -> None:
        self._jobs.put(job)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self.problems += job()
            except Exception as exc:  # noqa: BLE001 - reported at the session's end
                self.problems.append(f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


@pytest.fixture(scope="session")
def cleaner() -> Iterator[Cleaner]:
    done = Cleaner()
    yield done
    done.close()
    for problem in done.problems:
        print(f"scratch clean-up: {problem}")


@pytest.fixture(scope="session")
def recorded_upgrade(stack_settings: Settings) -> support.schema_replay.Recorded:
    """The statements of one real upgrade, which db_settings sends again for each schema."""
    return support.schema_replay.record(stack_settings)


@pytest.fixture
def db_settings(stack_settings: Settings, cleaner: Cleaner,
                recorded_upgrade: support.schema_replay.Recorded) -> Iterator[Settings]:
    """Settings whose connections use a fresh schema, migrated to head (the recorded upgrade's
    statements) and dropped afterwards."""
    settings = scratch_settings(stack_settings, "t")
    schema = settings.database_schema or ""
    try:
        support.schema_replay.replay(recorded_upgrade, settings)
        yield settings
    finally:
        cleaner.put(lambda: drop_schema(stack_settings, schema) or [])


@pytest.fixture
def engine(db_settings: Settings) -> Iterator[sa.Engine]:
    from postroom.relay.db import make_engine

    eng = make_engine(db_settings)
    yield eng
    eng.dispose()


# The topics of a test's own prefix have one partition each, unless the test asks for more with
# @pytest.mark.partitions(n): the broker creates, loads and deletes every partition, and the
# suite's 9 topics of 3 partitions per test were most of the broker's CPU in a `make test`.
# A test whose check needs several partitions (members of one group sharing a topic, records
# spread over partitions) asks for them.
SUITE_PARTITIONS = 1


@pytest.fixture
def topic_partitions(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The partitions of each topic this test makes; POSTROOM_TOPIC_PARTITIONS says the same to
    the settings and the `postroom` processes the test reads or starts."""
    marker = request.node.get_closest_marker("partitions")
    if marker is None:
        count = SUITE_PARTITIONS
    elif len(marker.args) == 1 and isinstance(marker.args[0], int) and marker.args[0] >= 1:
        count = marker.args[0]
    else:
        pytest.fail(f"@pytest.mark.partitions takes one whole number above 0, not {marker.args}")
    monkeypatch.setenv("POSTROOM_TOPIC_PARTITIONS", str(count))
    return count


@pytest.fixture
def kafka_settings(stack_settings: Settings, cleaner: Cleaner,
                   topic_partitions: int) -> Iterator[Settings]:
    """Settings with a topic prefix and consumer groups of this test's own, every topic created
    with ``topic_partitions`` partitions (and served by the broker); topics and groups deleted
    afterwards."""
    base = dataclasses.replace(stack_settings, retry_delays_s=(1.0, 2.0, 4.0, 8.0),
                               topic_partitions=topic_partitions)
    settings = scratch_settings(base, "t")
    try:
        wait_for_topics(settings, list(create_topics(settings)))
        yield settings
    finally:
        cleaner.put(lambda: delete_kafka_state(settings))


@pytest.fixture
def settings(db_settings: Settings, kafka_settings: Settings) -> Settings:
    """Both: an own schema, an own topic prefix and own consumer groups."""
    return dataclasses.replace(db_settings, topic_prefix=kafka_settings.topic_prefix,
                               topic_partitions=kafka_settings.topic_partitions,
                               retry_delays_s=kafka_settings.retry_delays_s,
                               sender_group=kafka_settings.sender_group,
                               recorder_group=kafka_settings.recorder_group)


@dataclasses.dataclass(frozen=True)
class Consumed:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def consume_records(settings: Settings, topics: list[str], expected: int,
                    timeout_s: float = 30.0) -> list[Consumed]:
    """Read ``topics`` from the beginning until ``expected`` records (or the timeout) and a
    short quiet period after, so a test also sees records beyond the ones it expected."""
    import time

    from confluent_kafka import Consumer

    consumer = Consumer({**settings.kafka_client_config(), "group.id": unique_name("test"),
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(topics)
    records: list[Consumed] = []
    deadline = time.monotonic() + timeout_s
    quiet_until: float | None = None
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                if quiet_until is not None and time.monotonic() > quiet_until:
                    break
                continue
            if msg.error():
                raise AssertionError(f"consumer error: {msg.error()}")
            records.append(Consumed(msg.topic(), msg.partition(), msg.offset(), msg.key(),
                                    msg.value(), list(msg.headers() or [])))
            if len(records) >= expected and quiet_until is None:
                quiet_until = time.monotonic() + 1.0
    finally:
        consumer.close()
    return records


@pytest.fixture
def consume() -> Callable[..., list[Consumed]]:
    """``consume(settings, topics, expected, timeout_s=30)`` -> list of records."""
    return consume_records


# A parameter's text or bytes longer than this is named by its start and its length: a few tests
# take megabytes (a 4 MiB bounce), whose whole escaped text made test ids of 22 MB in all, escaped
# (2.3 CPU-s) and sent to the controller by every worker at each start.
ID_TEXT_LIMIT = 80


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    if not isinstance(val, str | bytes) or len(val) <= ID_TEXT_LIMIT:
        return None  # pytest's own id
    start = val[:ID_TEXT_LIMIT // 2]
    text = start if isinstance(start, str) else start.decode("latin-1")  # each byte as \xNN
    shown = text.encode("unicode_escape").decode("ascii")
    return f"{shown}...({len(val):,} {'characters' if isinstance(val, str) else 'bytes'})"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
        item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that used the registry reports what the registry process was doing; the
    output a test captured is made valid UTF-8."""
    report = yield
    if report.failed and "registry_url" in getattr(item, "fixturenames", ()):
        import support.registry

        report.sections.append(("the schema registry when the test failed",
                                support.registry.diagnosis()))
    # A pytest-xdist worker sends its reports as UTF-8: a lone surrogate in captured output (a
    # hostile reply, logged as read) crashed the worker and ended the run.
    report.sections = [(title, utf8_safe(text)) for title, text in report.sections]
    if isinstance(report.longrepr, str):
        report.longrepr = utf8_safe(report.longrepr)
    return report


def utf8_safe(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates) written as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
