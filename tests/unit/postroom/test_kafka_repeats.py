"""A client's repeated errors said once and then counted, and what a failed wait says it tried.
Pure: a clock is given, no client is created."""

from __future__ import annotations

import logging

import pytest

from postroom.kafka import ClientLog, RepeatedLines, describe_attempts

REFUSED = ("127.0.0.1:{port}/bootstrap: Connect to ipv4#127.0.0.1:{port} failed: Connection "
           "refused (after {ms}ms in state CONNECT)")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_line_is_said_once_then_counted_when_it_comes_back() -> None:
    clock = Clock()
    repeats = RepeatedLines(interval_s=60.0, clock=clock)
    said = []
    for n in range(1201):  # a minute of a closed port: 20 tries a second
        clock.now = 1000.0 + n * 0.05
        said.append(repeats.admit(REFUSED.format(port=1, ms=n % 3)))
    shown = [line for line in said if line is not None]
    assert shown == [REFUSED.format(port=1, ms=0),
                     REFUSED.format(port=1, ms=0) + " (and 1199 more like it in the last 60s)"]


def test_lines_of_different_kinds_are_each_said() -> None:
    repeats = RepeatedLines(interval_s=60.0, clock=Clock())
    first = repeats.admit("kafka client error code=_TRANSPORT: down")
    other = repeats.admit("kafka client error code=_SSL: handshake failed")
    assert (first, other) == ("kafka client error code=_TRANSPORT: down",
                              "kafka client error code=_SSL: handshake failed")
    assert repeats.admit("kafka client error code=_TRANSPORT: down") is None


def test_the_kinds_remembered_are_bounded() -> None:
    repeats = RepeatedLines(interval_s=60.0, clock=Clock())
    for n in range(10_000):
        repeats.admit(f"kind {chr(0x4E00 + n)}")  # no digits: each its own kind
    assert len(repeats._kinds) <= 256


def test_librdkafka_lines_reach_python_logging_informational_ones_at_debug(
        caplog: pytest.LogCaptureFixture) -> None:
    client_log = ClientLog(RepeatedLines(clock=Clock()))
    with caplog.at_level(logging.DEBUG, logger="postroom.librdkafka"):
        client_log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", "refused")
        client_log.log(logging.INFO, "%s [%s] %s", "BGQUEUE", "rdkafka#producer-1",
                       "Purging 1 unserved events from background queue")
        client_log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-2", "refused")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("postroom.librdkafka", logging.ERROR, "FAIL [rdkafka#producer-1] refused"),
        ("postroom.librdkafka", logging.DEBUG,
         "BGQUEUE [rdkafka#producer-1] Purging 1 unserved events from background queue")]


@pytest.mark.parametrize(("errors", "said"), [
    ([REFUSED.format(port=2, ms=0), REFUSED.format(port=1, ms=0), REFUSED.format(port=2, ms=1)],
     "127.0.0.1:1 (Connection refused), 127.0.0.1:2 (Connection refused)"),
    (["kafka.example:9092/bootstrap: Failed to resolve 'kafka.example:9092': Name or service "
      "not known (after 2ms in state CONNECT)", "1/1 brokers are down"],
     "kafka.example:9092 (Failed to resolve 'kafka.example:9092': Name or service not known)"),
    (["sasl_ssl://k:9093/bootstrap: Disconnected while requesting ApiVersion: might be caused "
      "by incorrect security.protocol configuration (after 5ms in state APIVERSION_QUERY, "
      "4 identical error(s) suppressed)"],
     "sasl_ssl://k:9093 (Disconnected while requesting ApiVersion: might be caused by "
     "incorrect security.protocol configuration)"),
    (["1/1 brokers are down"], "1/1 brokers are down"),
    ([], "no answer"),
])
def test_what_the_wait_says_it_tried(errors: list[str], said: str) -> None:
    assert describe_attempts(errors) == said


def test_the_addresses_tried_are_said_in_the_order_of_the_bootstrap_list() -> None:
    errors = [REFUSED.format(port=1, ms=0), REFUSED.format(port=3, ms=0),
              "other:9092/bootstrap: Connection refused"]
    assert describe_attempts(errors, ["127.0.0.1:3", " 127.0.0.1:1"]) == (
        "127.0.0.1:3 (Connection refused), 127.0.0.1:1 (Connection refused), "
        "other:9092 (Connection refused)")


def test_a_line_whose_format_holds_a_percent_sign_is_still_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    client_log = ClientLog(RepeatedLines(clock=Clock()))
    with caplog.at_level(logging.DEBUG, logger="postroom.librdkafka"):
        client_log.log(logging.WARNING, "100% of %s", "brokers", "down")
    assert [r.getMessage() for r in caplog.records] == ["100% of %s brokers down"]
