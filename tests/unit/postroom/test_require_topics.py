"""A role starting while a broker of the cluster is down asks again for its topics when the
description times out, and gives up at once on a refusal (the chaos suite's broker-and-sender
kill found a restarted sender exiting on 'Failed while waiting for controller')."""

from __future__ import annotations

import pytest

from postroom import kafka
from postroom.acls import TopicAccess
from postroom.errors import KafkaClientError
from postroom.settings import Settings

TIMED_OUT = KafkaClientError("cannot describe topic postroom.email.high: Failed while waiting "
                             "for controller: Local: Timed out", code="_TIMED_OUT")


def answers(monkeypatch: pytest.MonkeyPatch, *outcomes: object) -> list[int]:
    calls: list[int] = []
    left = list(outcomes)

    def topic_access(settings: Settings, topics: list[str], timeout_s: float) -> list[TopicAccess]:
        calls.append(1)
        outcome = left.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return [TopicAccess(t, outcome, frozenset()) for t in topics]  # type: ignore[arg-type]

    monkeypatch.setattr(kafka.topics, "topic_access", topic_access)
    return calls


def test_a_timed_out_description_is_asked_again_until_answered(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    calls = answers(monkeypatch, TIMED_OUT, TIMED_OUT, True)
    kafka.require_topics(Settings(), pause_s=0)
    assert len(calls) == 3
    assert caplog.text.count("asking again") == 2


def test_it_gives_up_after_its_tries_and_at_once_on_a_refusal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = answers(monkeypatch, *[TIMED_OUT] * 3)
    with pytest.raises(KafkaClientError, match="_TIMED_OUT"):
        kafka.require_topics(Settings(), tries=3, pause_s=0)
    assert len(calls) == 3
    refused = KafkaClientError("cannot describe topic x: Broker: Cluster authorization failed",
                               code="CLUSTER_AUTHORIZATION_FAILED")
    calls = answers(monkeypatch, refused, True)
    with pytest.raises(KafkaClientError, match="CLUSTER_AUTHORIZATION_FAILED"):
        kafka.require_topics(Settings(), pause_s=0)
    assert len(calls) == 1


def test_missing_topics_are_still_named(monkeypatch: pytest.MonkeyPatch) -> None:
    answers(monkeypatch, TIMED_OUT, False)
    with pytest.raises(KafkaClientError, match="run `postroom topics create`"):
        kafka.require_topics(Settings(), pause_s=0)
